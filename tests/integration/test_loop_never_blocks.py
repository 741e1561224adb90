"""The event loop never blocks on storage: rolls of tiny segments under a real producer's load.

The broker runs with ``--check-loop-blocking`` (the suite's conftest turns it on for every broker): a
posix_fallocate, fdatasync, pre-fault, unlink or wait for a worker thread made on the event loop's thread
raises and logs "blocking storage call on the event loop's thread". 16 KiB segments rolled every dozen 1 KB
batches give each roll little time to find its next segment ready and each allocation step little time to
land, so the paths that used to fall back to doing the work on the loop thread (a roll waiting for, or
creating, its next segment; an append allocating the blocks it outran) are taken hundreds of times here.
Every record must still be acknowledged, and read back whole and in order.
"""

from __future__ import annotations

import os

import pytest

from tests.support.topics import unique_topic

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

RECORDS = 6000
VALUE_BYTES = 1000
SEGMENT_BYTES = 16 << 10


def test_tiny_segments_roll_under_load_without_blocking_the_loop(broker_factory):
    broker = broker_factory()
    topic = unique_topic("rolls")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics([NewTopic(
        topic, num_partitions=1, replication_factor=1,
        config={"segment.bytes": str(SEGMENT_BYTES), "index.interval.bytes": "1024"})])
    futures[topic].result(30)

    producer = confluent_kafka.Producer({
        "bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 2, "batch.size": 4096,
        "enable.idempotence": True, "message.timeout.ms": 30_000})
    errors: list = []
    acknowledged: list[int] = []

    def delivered(error, message) -> None:
        if error is not None:
            errors.append(error)
        else:
            acknowledged.append(message.offset())

    for number in range(RECORDS):
        value = f"{number:08d}".encode() + bytes([number % 251]) * (VALUE_BYTES - 8)
        while True:
            try:
                producer.produce(topic, value=value, partition=0, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(60) == 0, "records left undelivered"
    assert not errors, errors[:5]
    assert sorted(acknowledged) == list(range(RECORDS))

    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": broker.bootstrap, "group.id": unique_topic("g"), "enable.auto.commit": False,
        "auto.offset.reset": "earliest"})
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    seen = 0
    try:
        while seen < RECORDS:
            message = consumer.poll(30)
            assert message is not None, f"consumer stalled after {seen} records"
            assert message.error() is None, message.error()
            assert message.offset() == seen
            assert message.value()[:8] == f"{seen:08d}".encode() and len(message.value()) == VALUE_BYTES
            seen += 1
    finally:
        consumer.close()

    segments = [name for name in os.listdir(broker.data_dir / f"{topic}-0") if name.endswith(".log")]
    assert len(segments) > RECORDS * VALUE_BYTES // SEGMENT_BYTES // 2, f"only {len(segments)} segments"
    log = broker.log_text()
    assert "blocking storage call on the event loop's thread" not in log, log[-4000:]
