"""Topic names, configs and the persisted registry."""

from __future__ import annotations

import json

import pytest
from kio.schema.errors import ErrorCode

from copyless.broker.topics import Topic, TopicError, TopicRegistry, parse_topic_configs, validate_topic_name


@pytest.mark.parametrize("name", ["orders", "a.b_c-D9", "x" * 249, "__consumer_offsets"])
def test_legal_names(name):
    validate_topic_name(name)


@pytest.mark.parametrize("name", ["", ".", "..", "x" * 250, "with space", "slash/name", "ünïcode", "a:b"])
def test_illegal_names(name):
    with pytest.raises(TopicError) as info:
        validate_topic_name(name)
    assert info.value.code == ErrorCode.invalid_topic_exception


def test_collisions_and_duplicates(tmp_path):
    registry = TopicRegistry(tmp_path)
    registry.add(Topic("metrics.cpu", 1))
    with pytest.raises(TopicError) as info:
        registry.check_new("metrics_cpu")
    assert info.value.code == ErrorCode.invalid_topic_exception and "collides" in info.value.message
    with pytest.raises(TopicError) as info:
        registry.check_new("metrics.cpu")
    assert info.value.code == ErrorCode.topic_already_exists
    with pytest.raises(TopicError):
        registry.check_new("__consumer_offsets")
    registry.check_new("__consumer_offsets", internal=True)


def test_configs_map_to_log_config_fields():
    overrides = parse_topic_configs(
        {"retention.ms": "-1", "segment.bytes": "1048576", "message.timestamp.type": "LogAppendTime",
         "cleanup.policy": "delete", "min.insync.replicas": "1", "max.message.bytes": "2000"}
    )
    assert overrides == {"retention_ms": None, "segment_bytes": 1048576, "message_timestamp_type": "LogAppendTime",
                         "max_message_bytes": 2000, "cleanup_policy": ("delete",)}


@pytest.mark.parametrize("configs", [{"no.such.config": "1"}, {"retention.ms": "soon"},
                                     {"cleanup.policy": "compact,shred"},
                                     {"segment.bytes": "10"}, {"message.timestamp.type": "Whenever"},
                                     {"retention.ms": None}])
def test_bad_configs_are_invalid_config(configs):
    with pytest.raises(TopicError) as info:
        parse_topic_configs(configs)
    assert info.value.code == ErrorCode.invalid_config


def test_registry_round_trip(tmp_path):
    registry = TopicRegistry(tmp_path)
    registry.load()
    assert not registry.loaded_from_disk
    registry.add(Topic("a", 3, {"retention.ms": "1000"}))
    registry.add(Topic("__consumer_offsets", 1, internal=True))
    registry.persist()
    assert not (tmp_path / "topics.json.tmp").exists()
    again = TopicRegistry(tmp_path)
    again.load()
    assert again.loaded_from_disk
    assert again.get("a") == registry.get("a")
    assert again.get("__consumer_offsets").internal
    assert again.names() == ["__consumer_offsets", "a"]
    assert json.loads((tmp_path / "topics.json").read_text())["version"] == 1


def test_corrupt_registry_is_not_silently_replaced(tmp_path):
    (tmp_path / "topics.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt"):
        TopicRegistry(tmp_path).load()
