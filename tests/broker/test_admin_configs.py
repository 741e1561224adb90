"""Config admin APIs against a real broker process, with confluent-kafka's and kafka-python's admin clients:
DescribeConfigs (every config, its source, synonyms), IncrementalAlterConfigs and AlterConfigs on topics
and brokers, checked values refused with INVALID_CONFIG and a message, persisted across restarts, and
applied live (retention at the next check, segment.bytes for the next segment).
"""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, ResourceType
from kafka.admin import ConfigResource as KPConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kio.schema.errors import ErrorCode

from tests.support.clients import REQUEST_TIMEOUT_MS, ConfluentDriver, make_records, now_ms
from tests.support.kio_requests import KafkaWire
from tests.support.polling import wait_until
from tests.support.topics import unique_topic

OP_TIMEOUT_S = 30


def confluent_admin(bootstrap):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": REQUEST_TIMEOUT_MS})


def describe(admin, resource_type, name) -> dict:
    """librdkafka always asks for synonyms."""
    [future] = admin.describe_configs([ConfigResource(resource_type, name)]).values()
    return future.result(timeout=OP_TIMEOUT_S)


def alter_default_broker_configs(proc, *changes) -> tuple[int, str | None]:
    """IncrementalAlterConfigs on the broker resource "" (every broker's dynamic defaults), which neither
    client's admin API can name; returns (error code, message)."""
    from kio.schema.incremental_alter_configs.v0 import request as alter_v0

    wire = KafkaWire(proc.port)
    try:
        response = wire.request(alter_v0.IncrementalAlterConfigsRequest(validate_only=False, resources=(
            alter_v0.AlterConfigsResource(resource_type=4, resource_name="", configs=tuple(
                alter_v0.AlterableConfig(name=name, config_operation=operation, value=value)
                for name, operation, value in changes)),)))
    finally:
        wire.close()
    [result] = response.responses
    return result.error_code, result.error_message


def incremental(admin, resource_type, name, *changes):
    """``changes``: (config, operation, value). Returns the resource's future (raises on error)."""
    entries = [ConfigEntry(config, value, incremental_operation=operation) for config, operation, value in changes]
    [future] = admin.incremental_alter_configs([ConfigResource(resource_type, name,
                                                               incremental_configs=entries)]).values()
    return future.result(timeout=OP_TIMEOUT_S)


def refused(admin, resource_type, name, *changes) -> tuple[int, str]:
    with pytest.raises(Exception) as failure:
        incremental(admin, resource_type, name, *changes)
    error = failure.value.args[0]
    return error.code(), error.str()


def test_topic_configs_with_confluent_kafka(broker):
    topic = unique_topic("conf")
    ConfluentDriver().create_topic(broker.bootstrap, topic, 1, {"retention.ms": "3600000"})
    admin = confluent_admin(broker.bootstrap)
    configs = describe(admin, ResourceType.TOPIC, topic)
    retention = configs["retention.ms"]
    assert retention.value == "3600000" and retention.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert [(s.name, s.value, s.source) for s in retention.synonyms.values()] == [
        ("retention.ms", "3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value),
        ("log.retention.ms", str(7 * 24 * 3600 * 1000), ConfigSource.DEFAULT_CONFIG.value)]
    # The test broker's --config sets log.segment.bytes: the topic's segment.bytes comes from it.
    segment = configs["segment.bytes"]
    assert segment.value == str(8 * 1024 * 1024) and segment.source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert configs["cleanup.policy"].value == "delete" and configs["cleanup.policy"].is_default

    incremental(admin, ResourceType.TOPIC, topic, ("retention.ms", AlterConfigOpType.DELETE, None),
                ("max.message.bytes", AlterConfigOpType.SET, "2000000"),
                ("cleanup.policy", AlterConfigOpType.APPEND, "delete"))
    configs = describe(admin, ResourceType.TOPIC, topic)
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["max.message.bytes"].value == "2000000"
    assert configs["max.message.bytes"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value

    code, message = refused(admin, ResourceType.TOPIC, topic, ("retention.ms", AlterConfigOpType.SET, "soon"))
    assert code == ErrorCode.invalid_config and "retention.ms" in message
    code, message = refused(admin, ResourceType.TOPIC, topic, ("no.such.config", AlterConfigOpType.SET, "1"))
    assert code == ErrorCode.invalid_config and "no.such.config" in message
    # One replica: min.insync.replicas 2 could never be met.
    code, message = refused(admin, ResourceType.TOPIC, topic, ("min.insync.replicas", AlterConfigOpType.SET, "2"))
    assert code == ErrorCode.invalid_config and "replication factor" in message
    code, message = refused(admin, ResourceType.TOPIC, topic, ("segment.bytes", AlterConfigOpType.APPEND, "1"))
    assert code == ErrorCode.invalid_config
    code, _message = refused(admin, ResourceType.TOPIC, unique_topic("missing"),
                             ("retention.ms", AlterConfigOpType.SET, "1"))
    assert code == ErrorCode.unknown_topic_or_partition
    # Nothing refused changed anything.
    assert describe(admin, ResourceType.TOPIC, topic)["max.message.bytes"].value == "2000000"


def test_topic_configs_with_kafka_python(broker):
    topic = unique_topic("conf")
    ConfluentDriver().create_topic(broker.bootstrap, topic, 1, {"retention.bytes": "1000000"})
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)
    try:
        # IncrementalAlterConfigs (the client's choice when the broker offers it).
        result = admin.alter_configs([KPConfigResource(ConfigResourceType.TOPIC, topic,
                                                       configs={"retention.ms": "90000"})])
        assert result == {"topic": {topic: "OK"}}
        # AlterConfigs: the client fills in the other overrides (the request replaces the whole set).
        result = admin.alter_configs([KPConfigResource(ConfigResourceType.TOPIC, topic, configs={"flush.ms": "5000"})],
                                     incremental=False)
        assert result == {"topic": {topic: "OK"}}
        described = admin.describe_configs([KPConfigResource(ConfigResourceType.TOPIC, topic)],
                                           include_synonyms=True)["topic"][topic]
        assert {name: entry["value"] for name, entry in described.items()} == {
            "retention.ms": "90000", "retention.bytes": "1000000", "flush.ms": "5000"}
        assert described["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        result = admin.alter_configs([KPConfigResource(ConfigResourceType.TOPIC, topic,
                                                       configs={"message.timestamp.type": "Whenever"})])
        error = result["topic"][topic]
        assert "InvalidConfigurationError" in error and "message.timestamp.type" in error
        with pytest.raises(ValueError):  # the client checks names against the dynamic configs described
            admin.alter_configs([KPConfigResource(ConfigResourceType.TOPIC, topic, configs={"bogus": "1"})])
        everything = admin.describe_configs([KPConfigResource(ConfigResourceType.BROKER, "0")],
                                            config_filter="all")["broker"]["0"]
        assert everything["node.id"]["value"] == "0" and everything["node.id"]["read_only"]
        assert everything["log.segment.bytes"]["config_source"] == "STATIC_BROKER_CONFIG"
        assert everything["log.retention.ms"]["config_source"] == "DEFAULT_CONFIG"
    finally:
        admin.close()


def test_broker_configs_are_dynamic_persisted_and_refused_when_read_only(broker_factory):
    proc = broker_factory()
    topic = unique_topic("dyn")
    ConfluentDriver().create_topic(proc.bootstrap, topic, 1)
    admin = confluent_admin(proc.bootstrap)
    assert alter_default_broker_configs(proc, ("log.retention.ms", 0, "7200000")) == (ErrorCode.none, None)
    incremental(admin, ResourceType.BROKER, "0", ("log.retention.bytes", AlterConfigOpType.SET, "500000000"),
                ("min.insync.replicas", AlterConfigOpType.SET, "1"))
    configs = describe(admin, ResourceType.BROKER, "0")
    assert (configs["log.retention.ms"].value, configs["log.retention.ms"].source) == (
        "7200000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    assert (configs["log.retention.bytes"].value, configs["log.retention.bytes"].source) == (
        "500000000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    assert configs["num.partitions"].is_read_only and not configs["log.retention.ms"].is_read_only
    # Each layer under the value, strongest first (kafka-python keeps them as a list; librdkafka's dict
    # keeps one per name).
    client = KafkaAdminClient(bootstrap_servers=proc.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)
    try:
        layers = client.describe_configs([KPConfigResource(ConfigResourceType.BROKER, "0")], include_synonyms=True,
                                         config_filter="all")["broker"]["0"]["log.retention.ms"]["synonyms"]
    finally:
        client.close()
    assert [(s["value"], s["source"]) for s in layers] == [
        ("7200000", "DYNAMIC_DEFAULT_BROKER_CONFIG"), (str(7 * 24 * 3600 * 1000), "DEFAULT_CONFIG")]
    # A topic without its own retention takes the broker's new default.
    retention = describe(admin, ResourceType.TOPIC, topic)["retention.ms"]
    assert (retention.value, retention.source) == ("7200000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)

    code, message = refused(admin, ResourceType.BROKER, "0", ("num.partitions", AlterConfigOpType.SET, "3"))
    assert code == ErrorCode.invalid_config and "num.partitions" in message
    code, message = refused(admin, ResourceType.BROKER, "0", ("log.segment.bytes", AlterConfigOpType.SET, "12"))
    assert code == ErrorCode.invalid_config and "log.segment.bytes" in message
    code, _message = refused(admin, ResourceType.BROKER, "0", ("log.retention.ms", AlterConfigOpType.APPEND, "1"))
    assert code == ErrorCode.invalid_config

    proc.restart("kill")
    admin = confluent_admin(proc.bootstrap)
    retention = describe(admin, ResourceType.TOPIC, topic)["retention.ms"]
    assert (retention.value, retention.source) == ("7200000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    assert describe(admin, ResourceType.BROKER, "0")["log.retention.bytes"].value == "500000000"
    # Deleting the default brings the static / default value back.
    assert alter_default_broker_configs(proc, ("log.retention.ms", 1, None)) == (ErrorCode.none, None)
    retention = describe(admin, ResourceType.TOPIC, topic)["retention.ms"]
    assert (retention.value, retention.source) == (str(7 * 24 * 3600 * 1000), ConfigSource.DEFAULT_CONFIG.value)


def test_retention_and_segment_size_apply_live(broker_factory):
    proc = broker_factory(config={"log.retention.check.interval.ms": 300})
    topic = unique_topic("live")
    driver = ConfluentDriver()
    driver.create_topic(proc.bootstrap, topic, 1, {"segment.bytes": "16384"})
    admin = confluent_admin(proc.bootstrap)
    # Records an hour old, in ~2 KB batches: several 16 KiB segments.
    hour_ago = now_ms() - 3600_000
    for round_ in range(6):
        records = [r.__class__(r.key, b"x" * 2000, hour_ago + round_, ()) for r in
                   make_records(4, base_ts_ms=hour_ago, tag=f"r{round_}", text_only=True)]
        driver.produce(proc.bootstrap, topic, records, acks="all", codec="none")
    assert driver.watermarks(proc.bootstrap, topic, 0) == (0, 24)

    incremental(admin, ResourceType.TOPIC, topic, ("segment.bytes", AlterConfigOpType.SET, "65536"))
    # The next segments are allocated at the new size.
    partition_dir = proc.data_dir / f"{topic}-0"
    for _ in range(20):
        driver.produce(proc.bootstrap, topic, [r.__class__(r.key, b"y" * 2000, now_ms(), ()) for r in
                                               make_records(4, base_ts_ms=now_ms(), tag="n", text_only=True)],
                       acks="all", codec="none")
    newest = max(partition_dir.glob("0*.log"))
    wait_until(lambda: newest.stat().st_size == 65536, what="the active segment allocated at 64 KiB",
               timeout_s=10, detail=lambda: str(sorted((p.name, p.stat().st_size) for p in partition_dir.iterdir())))

    # retention.ms of a minute: the hour-old segments go at the next retention check.
    incremental(admin, ResourceType.TOPIC, topic, ("retention.ms", AlterConfigOpType.SET, "60000"))
    low = wait_until(lambda: driver.watermarks(proc.bootstrap, topic, 0)[0] or None,
                     what="retention to remove the hour-old segments", timeout_s=30)
    assert 0 < low <= 24


def test_alter_configs_validate_only_changes_nothing(broker):
    topic = unique_topic("conf")
    ConfluentDriver().create_topic(broker.bootstrap, topic, 1)
    admin = confluent_admin(broker.bootstrap)
    entry = ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)
    [future] = admin.incremental_alter_configs([ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])],
                                               validate_only=True).values()
    future.result(timeout=OP_TIMEOUT_S)
    assert describe(admin, ResourceType.TOPIC, topic)["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value


def test_describe_configs_v3_carries_types_and_the_registrys_documentation(broker):
    from kio.schema.describe_configs.v3 import request as describe_v3

    topic = unique_topic("doc")
    ConfluentDriver().create_topic(broker.bootstrap, topic, 1)
    wire = KafkaWire(broker.port)
    try:
        response = wire.request(describe_v3.DescribeConfigsRequest(resources=(
            describe_v3.DescribeConfigsResource(resource_type=2, resource_name=topic, configuration_keys=None),
            describe_v3.DescribeConfigsResource(resource_type=4, resource_name="0",
                                                configuration_keys=("log.segment.bytes", "node.id"))),
            include_synonyms=False, include_documentation=True))
    finally:
        wire.close()
    topic_result, broker_result = response.results
    configs = {c.name: c for c in topic_result.configs}
    # Kafka's ConfigType numbers: LONG 5, LIST 7; the documentation is the registry's.
    assert configs["retention.ms"].config_type == 5 and configs["cleanup.policy"].config_type == 7
    assert "Delete a segment once its newest record is this old" in configs["retention.ms"].documentation
    assert not any(c.is_sensitive for c in topic_result.configs)
    assert {c.name for c in broker_result.configs} == {"log.segment.bytes", "node.id"}
    assert all(c.documentation for c in broker_result.configs)
