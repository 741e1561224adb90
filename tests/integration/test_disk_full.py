"""Disk full: producers get KAFKA_STORAGE_ERROR (56) while fetches go on, the broker stays up, and every
acknowledged batch is still there after a kill -9 and recovery on the full disk.

The data dir lives on a private 256 MiB tmpfs (a real filesystem that really runs out: posix_fallocate
and segment creation fail with ENOSPC). Mounting needs root with CAP_SYS_ADMIN; elsewhere the test is
skipped with the mount error as the reason.
"""

from __future__ import annotations

import pytest

from tests.support import batches, wire
from tests.support.clients import DRIVERS
from tests.support.tmpfs import mounted_tmpfs

pytestmark = pytest.mark.timeout(240)

KAFKA_STORAGE_ERROR = 56
DISK_MIB = 256
BATCH_VALUE_BYTES = 100_000


@pytest.fixture
def small_disk(tmp_path):
    with mounted_tmpfs(tmp_path / "disk", size_mib=DISK_MIB) as mount_point:
        yield mount_point


def _fill(broker, topic: str) -> tuple[int, list[int]]:
    """Produce 100 KB batches (acks=1) until three refusals in a row; returns (acknowledged records, refusals).

    A refusal may be followed by a success: the broker gives back space it had reserved but not used (a
    partial preallocation) and appends resume by themselves. Every success must still take the next offset,
    so nothing acknowledged is lost or duplicated around the refusals.
    """
    acknowledged_records = 0
    errors: list[int] = []
    consecutive_refusals = 0
    with wire.RawConnection(broker.host, broker.port) as conn:
        wire.ensure_topic(conn, topic)
        for correlation_id in range(1, 4000):
            # Record k carries byte (k + 1) % 256, so the tail can be checked by offset below.
            batch = batches.keyed_batch([bytes([(acknowledged_records + 1) % 256]) * BATCH_VALUE_BYTES])
            request = wire.produce_v3(correlation_id, topic, 0, batch, acks=1)
            error, base_offset = wire.parse_produce_v3(conn.roundtrip(request))
            if error == 0:
                assert base_offset == acknowledged_records, (base_offset, acknowledged_records, errors)
                acknowledged_records += 1
                consecutive_refusals = 0
            else:
                errors.append(error)
                consecutive_refusals += 1
                if consecutive_refusals >= 3:
                    break
        else:
            pytest.fail(f"the disk never filled: {acknowledged_records} batches acknowledged, refusals {errors}")
    assert acknowledged_records * BATCH_VALUE_BYTES > (DISK_MIB // 4) << 20, acknowledged_records
    return acknowledged_records, errors


def _start(broker_factory, broker_loop, small_disk):
    # One group-offsets partition: its preallocated segments would otherwise take a good part of the disk.
    return broker_factory(loop=broker_loop, data_dir=small_disk / "data", config={"offsets.topic.num.partitions": 1})


def test_full_disk_refuses_produce_and_serves_fetch(small_disk, broker_factory, broker_loop):
    broker = _start(broker_factory, broker_loop, small_disk)
    topic = "fills-the-disk"
    acknowledged_records, errors = _fill(broker, topic)
    assert set(errors) == {KAFKA_STORAGE_ERROR}, errors
    with wire.RawConnection(broker.host, broker.port) as conn:
        # Fetches go on, from the start and from the end of the log.
        first = wire.parse_fetch_v4(conn.roundtrip(wire.fetch_v4(9001, topic, 0, 0)))
        assert first.error_code == 0 and first.high_watermark == acknowledged_records
        assert batches.batch_headers(first.records)[0].base_offset == 0
        last = wire.parse_fetch_v4(conn.roundtrip(wire.fetch_v4(9002, topic, 0, acknowledged_records - 1)))
        assert [h.base_offset for h in batches.batch_headers(last.records)] == [acknowledged_records - 1]
    wire.health_check(broker.host, broker.port)
    tail = DRIVERS["kafka-python"].consume(broker.bootstrap, topic, 0, acknowledged_records - 2, 2)
    assert [c.offset for c in tail] == [acknowledged_records - 2, acknowledged_records - 1]
    assert tail[-1].rec.value == bytes([acknowledged_records % 256]) * BATCH_VALUE_BYTES


def test_kill_on_full_disk_then_restart_serves_every_acknowledged_batch(small_disk, broker_factory, broker_loop):
    """Recovery needs no new space (it only truncates and rebuilds), so a broker killed on a full disk must
    come back and serve what it acknowledged, refusing new produce with KAFKA_STORAGE_ERROR as before."""
    broker = _start(broker_factory, broker_loop, small_disk)
    topic = "fills-the-disk"
    acknowledged_records, _ = _fill(broker, topic)
    broker.restart("kill")
    with wire.RawConnection(broker.host, broker.port) as conn:
        last = wire.parse_fetch_v4(conn.roundtrip(wire.fetch_v4(9003, topic, 0, acknowledged_records - 1)))
        assert last.error_code == 0 and last.high_watermark == acknowledged_records
        assert [h.base_offset for h in batches.batch_headers(last.records)] == [acknowledged_records - 1]
        batch = batches.keyed_batch([b"z" * BATCH_VALUE_BYTES])
        error, _ = wire.parse_produce_v3(conn.roundtrip(wire.produce_v3(9004, topic, 0, batch, acks=1)))
        assert error in (0, KAFKA_STORAGE_ERROR)
