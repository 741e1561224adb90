"""The one registry of settings (``broker.config.CONFIGS``) and what is derived from it: a value is accepted or
refused alike as a topic override, a broker file setting and a dynamic broker default; every BrokerConfig
field is a setting; DescribeConfigs hides sensitive values; ``copyless configs`` and ``serve --help`` list what
the registry holds."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copyless.broker import config_sources
from copyless.broker.config import CONFIGS, NOT_SETTINGS, BrokerConfig, ConfigError, load_toml
from copyless.broker.config_def import AtLeast, ConfigDef, ConfigType, Scope
from copyless.broker.storage.config import LogConfig

COPYLESS = str(Path(sys.executable).parent / "copyless")
# The settings that are a topic config with a broker default, and integers: the ones the three tables of old
# disagreed on (segment.bytes >= 1024 for a topic, > 0 for the log; segment.index.bytes >= 4096 for a topic,
# anything in the broker's file).
SHARED_INTEGERS = [key for key in CONFIGS
                   if key.scope is Scope.BOTH and key.config_type in (ConfigType.INT, ConfigType.LONG)]
BOUNDARIES = [-2, -1, 0, 1, 11, 12, 13, 14, 63, 64, 1023, 1024, 4095, 4096, (1 << 31) - 1, 1 << 31, (1 << 63) - 1]


def _accepted(action) -> bool:
    try:
        action()
    except (ConfigError, config_sources.InvalidConfig):
        return False
    except Exception as exc:  # TopicError(INVALID_CONFIG) is a BrokerError: only that code counts as a refusal
        assert getattr(exc, "code", None) == config_sources.InvalidConfig.code, exc
        return False
    return True


def _from_file(name: str, value: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "broker.toml"
        path.write_text(f'"{name}" = {value}\n')
        load_toml(path)


def test_the_shared_settings_are_the_ones_that_disagreed():
    names = {key.name for key in SHARED_INTEGERS}
    assert {"segment.bytes", "segment.index.bytes", "retention.ms", "max.message.bytes", "flush.messages"} <= names


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(SHARED_INTEGERS),
       value=st.sampled_from(BOUNDARIES) | st.integers(-(1 << 40), 1 << 40))
def test_a_value_is_accepted_or_refused_alike_wherever_it_is_given(key, value):
    broker_name = key.broker_config_name
    # AlterConfigs' whole-set check (a replication factor no min.insync.replicas can exceed, so only the
    # value's own checks speak).
    as_topic = _accepted(lambda: config_sources.check_topic_configs({key.name: str(value)}, 1 << 40))
    in_file = _accepted(lambda: _from_file(broker_name, value))
    outcomes = {"topic override": as_topic, "broker file": in_file}
    if key.dynamic:
        outcomes["dynamic broker default"] = _accepted(lambda: config_sources.effective_config(
            BrokerConfig(), 0, {config_sources.DEFAULTS_KEY: {broker_name: str(value)}}))
    assert len(set(outcomes.values())) == 1, f"{key.name}={value}: {outcomes}"


def test_segment_bytes_follows_kafkas_validator_everywhere():
    # Kafka 3.9: at least LegacyRecord.RECORD_OVERHEAD_V0 = 14 bytes (a larger batch is refused at produce).
    for value, accepted in ((13, False), (14, True), (1 << 20, True)):
        topic = {"segment.bytes": str(value)}
        assert _accepted(lambda topic=topic: config_sources.check_topic_configs(topic, 1)) is accepted
        assert _accepted(lambda value=value: _from_file("log.segment.bytes", value)) is accepted
    with pytest.raises(ConfigError, match="Invalid value 13 for configuration log.segment.bytes: Value must be at "
                                          "least 14"):
        _from_file("log.segment.bytes", 13)


def test_every_broker_field_is_a_setting_and_every_setting_names_real_fields():
    fields = {f.name for f in dataclasses.fields(BrokerConfig)}
    log_fields = {f.name for f in dataclasses.fields(LogConfig)}
    covered = set(NOT_SETTINGS)
    for key in CONFIGS:
        if key.field is not None:
            assert key.field in fields, key.name
            covered.add(key.field)
        if key.log_field is not None:
            assert key.log_field in log_fields, key.name
        if key.apply is not None:
            covered.update(key.fields(key.default if key.default is not None else ("h", 1)))
        assert key.doc.endswith("."), key.name
    assert fields - covered == set(), "BrokerConfig fields no setting names"


def test_defaults_are_the_dataclass_defaults_and_pass_their_validators():
    config = BrokerConfig()
    for key in CONFIGS:
        if key.field is not None:
            assert key.default == getattr(config, key.field), key.name
        key.check_field(key.default)
    with pytest.raises(ValueError, match="at least 5"):
        ConfigDef().define("x.y", ConfigType.INT, "A setting.", default=1, validator=AtLeast(5))
    with pytest.raises(ValueError, match="defined twice"):
        ConfigDef().define("a", ConfigType.INT, "A.", default=1).define("a", ConfigType.INT, "B.", default=1)


def test_describe_hides_a_sensitive_value_in_every_layer():
    registry = ConfigDef(BrokerConfig())
    registry.define("ssl.keystore.password", ConfigType.PASSWORD, "The keystore's password.", default=None)
    registry.define("cluster.id", ConfigType.STRING, "The cluster.", field="cluster_id")
    static = BrokerConfig(cluster_id="abc")
    dynamic = {"": {"ssl.keystore.password": "hunter2"}}
    entries = {e.name: e for e in config_sources.describe_broker(static, 0, dynamic, registry=registry)}
    secret = entries["ssl.keystore.password"]
    assert secret.sensitive and secret.value is None and secret.config_type == ConfigType.PASSWORD
    assert "hunter2" not in repr(secret)
    [default] = config_sources.describe_broker(static, 0, dynamic, defaults_only=True, registry=registry)
    assert default.sensitive and default.value is None and "hunter2" not in repr(default)
    shown = entries["cluster.id"]
    assert not shown.sensitive and shown.value == "abc" and shown.source == config_sources.STATIC_BROKER_CONFIG


def test_describe_derives_types_sources_and_read_only_from_the_registry():
    static = BrokerConfig(segment_bytes=1 << 20, offsets_topic_num_partitions=4)
    broker = {e.name: e for e in config_sources.describe_broker(static, 0, {})}
    assert set(broker) == {key.broker_config_name for key in CONFIGS.broker_keys()}
    assert broker["log.segment.bytes"].source == config_sources.STATIC_BROKER_CONFIG
    assert not broker["log.segment.bytes"].read_only and broker["num.partitions"].read_only
    assert broker["log.retention.ms"].config_type == ConfigType.LONG
    # A value the mode computes is the default unless set; set, it is static.
    offsets = broker["offsets.topic.num.partitions"]
    assert (offsets.value, offsets.source) == ("4", config_sources.STATIC_BROKER_CONFIG)
    assert offsets.synonyms[-1] == ("offsets.topic.num.partitions", "1", config_sources.DEFAULT_CONFIG)
    topic = {e.name: e for e in config_sources.describe_topic({"retention.ms": "1000"}, static, 0, {})}
    assert set(topic) == {key.name for key in CONFIGS.topic_keys()}
    assert topic["retention.ms"].synonyms == (
        ("retention.ms", "1000", config_sources.DYNAMIC_TOPIC_CONFIG),
        ("log.retention.ms", "604800000", config_sources.DEFAULT_CONFIG))
    static_layer = ("log.segment.bytes", str(1 << 20), config_sources.STATIC_BROKER_CONFIG)
    assert topic["segment.bytes"].synonyms[0] == static_layer
    assert topic["cleanup.policy"].value == "delete" and topic["cleanup.policy"].documentation


def test_a_synonym_is_not_a_dynamic_name_of_its_own():
    with pytest.raises(config_sources.InvalidConfig, match="set log.retention.ms instead"):
        config_sources.check_broker_configs({"log.retention.hours": "2"})
    with pytest.raises(config_sources.InvalidConfig, match="num.partitions"):
        config_sources.check_broker_configs({"num.partitions": "2"})


# --- the TOML file ------------------------------------------------------------------------------------------------


def _load(tmp_path, text: str) -> BrokerConfig:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return load_toml(path)


def test_an_unquoted_dotted_key_gets_a_hint_to_quote_it(tmp_path):
    with pytest.raises(ConfigError) as failure:
        _load(tmp_path, "log.retention.hours = 1\n")
    message = str(failure.value)
    assert "'log.retention.hours'" in message and "unquoted dotted key" in message
    assert '"log.retention.hours" = 1' in message
    assert _load(tmp_path, '"log.retention.hours" = 1\n').retention_ms == 3600_000


def test_an_unknown_key_names_the_likely_meant_one(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown setting 'log\.retention\.hourz'.*did you mean "
                                          r"'log\.retention\.hours'"):
        _load(tmp_path, '"log.retention.hourz" = 1\n')


def test_kafkas_precedence_between_spellings_of_one_setting(tmp_path):
    for text in ('"log.retention.hours" = 1\n"log.retention.ms" = 5000\n',
                 '"log.retention.ms" = 5000\n"log.retention.hours" = 1\n'):
        assert _load(tmp_path, text).retention_ms == 5000
    assert _load(tmp_path, '"log.retention.minutes" = 2\n"log.retention.hours" = 1\n').retention_ms == 120_000
    assert _load(tmp_path, '"log.retention.hours" = -1\n').retention_ms is None


def test_values_are_read_as_their_type(tmp_path):
    assert _load(tmp_path, 'sendfile = "false"\n').sendfile is False
    assert _load(tmp_path, 'sendfile = false\n"num.partitions" = "3"\n').num_partitions == 3
    for text, name in (('"num.partitions" = true\n', "num.partitions"),
                       ('"num.partitions" = 1.5\n', "num.partitions"),
                       ('sendfile = "maybe"\n', "sendfile"),
                       ('"log.segment.bytes" = 2147483648\n', "log.segment.bytes"),
                       ('"metadata" = "zk://x:1"\n', "metadata"),
                       ('"group.max.size" = 0\n', "group.max.size")):
        with pytest.raises(ConfigError, match=name.replace(".", r"\.")):
            _load(tmp_path, text)


# --- what users read -------------------------------------------------------------------------------------------------


def test_copyless_configs_lists_every_setting():
    done = subprocess.run([COPYLESS, "configs", "--json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert [item["name"] for item in listed] == [key.name for key in CONFIGS]
    retention = next(item for item in listed if item["name"] == "retention.ms")
    assert retention == {"name": "retention.ms", "broker_name": "log.retention.ms", "scope": "topic, broker default",
                         "type": "LONG", "default": "604800000", "valid": "[-1,...]", "dynamic": True,
                         "sensitive": False, "per_listener": False,
                         "synonyms": ["log.retention.minutes", "log.retention.hours"],
                         "documentation": CONFIGS["retention.ms"].doc}
    text = subprocess.run([COPYLESS, "configs", "segment"], capture_output=True, text=True, timeout=60).stdout
    assert "segment.bytes (broker: log.segment.bytes)" in text and "valid [14,...]" in text
    assert "num.partitions" not in text


def test_serve_help_comes_from_the_registry():
    from copyless.broker.server.cli import add_parsers

    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers())
    serve = parser._subparsers._group_actions[0].choices["serve"]
    helps = {action.option_strings[0]: action.help for action in serve._actions if action.option_strings}
    for flag, name in (("--num-partitions", "num.partitions"), ("--flush-mode", "log.flush.mode"),
                       ("--data-dir", "log.dirs"), ("--node-id", "node.id"), ("--metadata", "metadata")):
        key = CONFIGS[name]
        assert key.doc.rstrip(".") in helps[flag] and f"({key.broker_config_name}" in helps[flag], flag


def test_the_security_settings_are_entries_of_the_registry():
    from copyless.broker.security.settings import SECURITY_CONFIGS, SecuritySettings

    assert all(CONFIGS.broker_key(key.name) is key for key in SECURITY_CONFIGS)
    static = BrokerConfig(security=SecuritySettings.from_mapping({"ssl.key.password": "k3y", "super.users": "User:a"}))
    entries = {e.name: e for e in config_sources.describe_broker(static, 0, {})}
    secret = entries["ssl.key.password"]
    assert secret.sensitive and secret.value is None and all(value is None for _n, value, _s in secret.synonyms)
    assert (entries["super.users"].value, entries["super.users"].source) == ("User:a",
                                                                            config_sources.STATIC_BROKER_CONFIG)
    assert entries["sasl.enabled.mechanisms"].value == "SCRAM-SHA-256,SCRAM-SHA-512"
    with pytest.raises(config_sources.InvalidConfig, match="ssl.client.auth"):
        config_sources.check_broker_configs({"ssl.client.auth": "required"})  # static: read at start-up
    listed = subprocess.run([COPYLESS, "configs", "ssl.client"], capture_output=True, text=True, timeout=60).stdout
    assert "for one listener: listener.name.<listener>.ssl.client.auth" in listed
