"""Reading a topic back with the project's own consumer and checking it against what was acknowledged: the
exactly-once check the client's failover tests share (through cut connections, through a leader kill)."""

from __future__ import annotations

import collections
import time

from copyless.client import Consumer, TopicPartition


async def read_back(bootstrap: str, topic: str, partitions: int, expected: int, **options) -> list:
    """Every record of ``topic`` from offset 0 until ``expected`` came back (90 s at most), plus whatever one
    more poll brings (so a duplicate past the expected count is seen too)."""
    consumer = Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", **options)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        out = []
        deadline = time.monotonic() + 90
        while len(out) < expected:
            assert time.monotonic() < deadline, f"only {len(out)} of {expected} records came back"
            for records in (await consumer.getmany(timeout_ms=500)).values():
                out.extend(records)
        for records in (await consumer.getmany(timeout_ms=500)).values():
            out.extend(records)
        return out
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
