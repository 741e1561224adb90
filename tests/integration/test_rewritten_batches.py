"""The batches the broker rewrites before appending, with real clients: message format v0/v1 from kcat told
to talk to a pre-0.11 broker, and topics whose ``compression.type`` differs from the producer's codec.

- kcat (librdkafka 2.0.2) with ``broker.version.fallback=0.9.0`` and ``api.version.request=false``, and
  kafka-python with ``api_version=(0, 9)``, send Produce v1 with message format v0 (no timestamps);
  kafka-python with ``(0, 10, 1)`` sends Produce v2 with format v1. The broker converts them
  (``broker.record_conversion``): confluent-kafka reads the values back in order, a v0 message with no
  timestamp (-1) and a v1 message with the producer's, and every stored batch is a v2 batch (raw Fetch).
- A topic created or altered with ``compression.type`` stores each batch in that codec whatever the producer
  used; ``producer`` keeps the producer's; the broker's ``produce_rewritten_batches`` counts the rewrites and
  nothing else (a producer-codec topic adds none).
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from kafka import KafkaProducer

from tests.support import batches, wire
from tests.support.clients import KCAT
from tests.support.topics import unique_topic

pytestmark = pytest.mark.timeout(180)

COUNT = 20


def _consume(bootstrap: str, topic: str, count: int) -> list[tuple[bytes, int]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("g"), "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    out = []
    try:
        for _ in range(200):
            for message in consumer.consume(count, timeout=0.5):
                assert message.error() is None, message.error()
                out.append((message.value(), message.timestamp()[1]))
            if len(out) >= count:
                return out
    finally:
        consumer.close()
    raise AssertionError(f"read {len(out)} of {count} records")


def _stored_codecs(broker, topic: str) -> list[str]:
    fetched = wire.fetch_all(broker, topic)
    headers = batches.batch_headers(fetched.records)
    assert all(h.magic == 2 for h in headers)
    assert sum(h.records_count for h in headers) == fetched.high_watermark
    return [h.codec for h in headers]


def _kcat_v0(bootstrap: str, topic: str, codec: str, values: list[bytes]) -> None:
    """kcat told the broker is 0.9: Produce v1, message format v0 (the timestamps it cannot carry)."""
    if not shutil.which(KCAT):
        pytest.skip(f"kcat is not installed at {KCAT} (tests/run.sh installs Debian's package when root)")
    result = subprocess.run([KCAT, "-b", bootstrap, "-P", "-t", topic, "-p", "0", "-z", codec,
                             "-X", "broker.version.fallback=0.9.0", "-X", "api.version.request=false",
                             "-X", "linger.ms=50"], input=b"".join(v + b"\n" for v in values),
                            capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()[-2000:]


def _kafka_python(api_version):
    def produce(bootstrap: str, topic: str, codec: str, values: list[bytes], timestamps: list[int]) -> None:
        producer = KafkaProducer(bootstrap_servers=bootstrap, api_version=api_version, linger_ms=50,
                                 compression_type=None if codec == "none" else codec)
        try:
            futures = [producer.send(topic, value=value, partition=0, timestamp_ms=timestamp)
                       for value, timestamp in zip(values, timestamps, strict=True)]
            producer.flush(30)
            assert [future.get(30).offset for future in futures] == list(range(len(values)))
        finally:
            producer.close(10)
    return produce


# (client, format): kcat (librdkafka 2.0.2) and kafka-python 3.0 told the broker is 0.9 send format v0,
# kafka-python told 0.10.1 sends format v1 (librdkafka asks ApiVersions from 0.10 on and uses v2). kafka-python
# needs the xxhash package for format v0's LZ4 checksum, so that one is kcat's alone.
_OLD_PRODUCERS = [("kcat", 0, codec) for codec in ("none", "gzip", "snappy", "lz4")]
_OLD_PRODUCERS += [("kafka-python", 0, codec) for codec in ("none", "gzip", "snappy")]
_OLD_PRODUCERS += [("kafka-python", 1, codec) for codec in ("none", "gzip", "snappy", "lz4")]


@pytest.mark.parametrize("client,magic,codec", _OLD_PRODUCERS, ids=[f"{c}-v{m}-{z}" for c, m, z in _OLD_PRODUCERS])
def test_old_message_formats_are_converted(broker, client, magic, codec):
    topic = unique_topic(f"v{magic}-{codec}")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept: a collected client fails its futures
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    before = broker.stats_json()["produce_rewritten_batches"]
    values = [b"record-%d" % i for i in range(COUNT)]
    timestamps = [1_700_000_000_000 + 10 * i for i in range(COUNT)]
    if client == "kcat":
        _kcat_v0(broker.bootstrap, topic, codec, values)
    else:
        _kafka_python((0, 9) if magic == 0 else (0, 10, 1))(broker.bootstrap, topic, codec, values, timestamps)
    read = _consume(broker.bootstrap, topic, COUNT)
    assert [value for value, _ in read] == values
    # Format v0 has no timestamp (-1 after conversion, as in Kafka); v1 keeps the producer's.
    assert [timestamp for _, timestamp in read] == ([-1] * COUNT if magic == 0 else timestamps)
    codecs = _stored_codecs(broker, topic)
    assert set(codecs) <= {codec, "none"}  # librdkafka leaves a batch uncompressed when that is smaller
    assert broker.stats_json()["produce_rewritten_batches"] - before == len(codecs)


def _produce(bootstrap: str, topic: str, codec: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20})
    for value in values:
        producer.produce(topic, value=value, partition=0)
    assert producer.flush(30) == 0


@pytest.mark.parametrize("topic_codec,producer_codec", [
    ("gzip", "none"), ("snappy", "gzip"), ("lz4", "zstd"), ("zstd", "lz4"), ("uncompressed", "gzip"),
])
def test_compression_type_recompresses_on_append(broker, topic_codec, producer_codec):
    topic = unique_topic(f"ct-{topic_codec}")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"compression.type": topic_codec})])[topic].result(30)
    before = broker.stats_json()["produce_rewritten_batches"]
    values = [b"value %d " % i * 20 for i in range(COUNT)]
    _produce(broker.bootstrap, topic, producer_codec, values)
    assert [value for value, _ in _consume(broker.bootstrap, topic, COUNT)] == values
    codecs = _stored_codecs(broker, topic)
    assert set(codecs) == {"none" if topic_codec == "uncompressed" else topic_codec}, codecs
    assert broker.stats_json()["produce_rewritten_batches"] - before == len(codecs)


def test_compression_type_changes_live_and_producer_keeps_the_codec(broker):
    topic = unique_topic("ct-live")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    before = broker.stats_json()["produce_rewritten_batches"]
    _produce(broker.bootstrap, topic, "gzip", [b"a" * 100] * 5)
    assert _stored_codecs(broker, topic) == ["gzip"]
    assert broker.stats_json()["produce_rewritten_batches"] == before  # compression.type=producer: as sent
    resource = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("compression.type", "lz4", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(30)
    described = admin.describe_configs([ConfigResource("topic", topic)])
    entry = next(iter(described.values())).result(30)["compression.type"]
    assert entry.value == "lz4" and not entry.is_default
    _produce(broker.bootstrap, topic, "gzip", [b"b" * 100] * 5)
    assert _stored_codecs(broker, topic) == ["gzip", "lz4"]
    assert broker.stats_json()["produce_rewritten_batches"] == before + 1


def test_an_unknown_compression_type_is_refused(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = unique_topic("ct-bad")
    future = admin.create_topics([NewTopic(topic, 1, 1, config={"compression.type": "brotli"})])[topic]
    with pytest.raises(Exception) as raised:
        future.result(30)
    assert "INVALID_CONFIG" in str(raised.value) or "compression.type" in str(raised.value)
