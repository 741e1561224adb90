"""Reading a topic back and checking it against what was acknowledged: with the project's own consumer, the
exactly-once check the client's failover tests share (through cut connections, through a leader kill); with
confluent-kafka, one partition read whole to its end (the compacted-topic tests, which read through gaps) and
a topic's values read to the end of every partition at an isolation level (the transaction tests)."""

from __future__ import annotations

import collections
import time

from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import KafkaError
from confluent_kafka import TopicPartition as ConfluentTopicPartition

from copyless.client import Consumer, TopicPartition
from tests.support.polling import gather_async
from tests.support.topics import unique_topic


async def read_back(bootstrap: str, topic: str, partitions: int, expected: int, **options) -> list:
    """Every record of ``topic`` from offset 0 until ``expected`` came back (90 s at most), plus whatever one
    more poll brings (so a duplicate past the expected count is seen too)."""
    consumer = Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", **options)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])

        async def fetch():
            return [r for records in (await consumer.getmany(timeout_ms=500)).values() for r in records]

        out = await gather_async(fetch, count=expected, timeout_s=90)
        assert len(out) >= expected, f"only {len(out)} of {expected} records came back"
        return out + await fetch()
    finally:
        await consumer.close()


def assert_exactly_once(acknowledged: dict, records: list) -> None:
    """``acknowledged``: {(partition, offset): value}. Every one read back once at its offset, nothing read
    twice, and no value stored twice (the idempotent producer's retries were deduplicated by the broker)."""
    seen = collections.Counter((r.partition, r.offset) for r in records)
    assert not [k for k, n in seen.items() if n > 1], "a record was read twice"
    stored = {(r.partition, r.offset): r.value for r in records}
    missing = {k: v for k, v in acknowledged.items() if stored.get(k) != v}
    assert not missing, f"{len(missing)} acknowledged records missing or different, e.g. {list(missing.items())[:3]}"
    duplicated = [v for v, n in collections.Counter(stored.values()).items() if n > 1]
    assert not duplicated, f"values written twice: {duplicated[:5]}"


def read_partition_to_end(bootstrap: str, topic: str, partition: int = 0,
                          timeout_s: float = 60.0) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record of one partition, from its first offset until confluent-kafka
    reports the partition's end. Raises AssertionError on a consumer error or when the end never comes."""
    consumer = ConfluentConsumer({"bootstrap.servers": bootstrap, "group.id": f"read-back-{time.monotonic_ns()}",
                                  "enable.partition.eof": True, "enable.auto.commit": False})
    consumer.assign([ConfluentTopicPartition(topic, partition, 0)])
    out = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(message.error())
            out.append((message.offset(), message.key(), message.value()))
    finally:
        consumer.close()
    raise AssertionError(f"confluent-kafka never reached the end of {topic}-{partition}")


def read_topic_to_end(bootstrap: str, topic: str, isolation: str, partitions: int = 2, timeout_s: float = 20.0, *,
                      errors_retried: bool = False) -> list[str]:
    """The values (decoded, sorted) of every record a fresh confluent-kafka consumer at ``isolation``
    ("read_committed" or "read_uncommitted") sees from offset 0 until it reports the end of each of the
    ``partitions``. A consumer error fails the read, unless ``errors_retried`` (leaders that move or a broker
    that restarts: librdkafka retries); so does an end not reached on every partition within ``timeout_s``."""
    consumer = ConfluentConsumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("reader"),
                                  "isolation.level": isolation, "enable.partition.eof": True,
                                  "enable.auto.commit": False})
    try:
        consumer.assign([ConfluentTopicPartition(topic, p, 0) for p in range(partitions)])
        seen, at_end = [], set()
        deadline = time.monotonic() + timeout_s
        while len(at_end) < partitions and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                    continue
                if errors_retried:
                    continue
                raise AssertionError(f"consumer error: {message.error()}")
            seen.append(message.value().decode())
        assert len(at_end) == partitions, f"no EOF within {timeout_s} s on every partition (saw {sorted(seen)})"
        return sorted(seen)
    finally:
        consumer.close()
