"""Acknowledged data survives a broker restart, graceful (SIGTERM) or kill -9, for every real client.

Each test owns a broker subprocess: a client produces (acks=all through the idempotent path where the
client has one, then acks=1 with another codec), the partition is captured byte for byte on a raw socket and
decoded by the client, the broker is restarted on the same port, and then the same bytes, the same decoded
records, the same watermarks and time lookups come back; the topic keeps its partition count; and new
records continue at the old log end offset. kill -9 gives the broker no chance to flush or checkpoint: what
was acknowledged sits in the page cache (the mmap'd segment), and recovery must find all of it.
"""

from __future__ import annotations

import struct
import threading

import pytest

from tests.support import batches, wire
from tests.support.clients import DRIVERS, Rec, assert_same_records, make_records, now_ms
from tests.support.polling import wait_until
from tests.support.topics import unique_topic

pytestmark = pytest.mark.timeout(180)


def _cases():
    for client in DRIVERS:
        for mode in ("graceful", "kill"):
            # One client per loop besides uvloop keeps the asyncio run short while still restarting under it.
            marks = [pytest.mark.both_loops] if client in ("confluent-kafka", "kafka-python") and mode == "kill" else []
            yield pytest.param(client, mode, id=f"{client}-{mode}", marks=marks)


@pytest.mark.parametrize("client,mode", list(_cases()))
def test_acknowledged_data_survives_restart(broker_factory, broker_loop, client, mode):
    driver = DRIVERS[client]
    broker = broker_factory(loop=broker_loop)
    topic = unique_topic(f"{client}-restart")
    partitions = 1
    if driver.supports_admin:
        partitions = 2
        driver.create_topic(broker.bootstrap, topic, partitions)

    base_ts = now_ms() - 3_600_000
    records = make_records(24, base_ts_ms=base_ts, tag=topic, text_only=not driver.supports_headers)
    if not driver.supports_timestamps:
        records = [Rec(r.key, r.value, None, r.headers) for r in records]
    offsets = driver.produce(broker.bootstrap, topic, records[:12], acks="all", codec="zstd")
    offsets += driver.produce(broker.bootstrap, topic, records[12:], acks=1, codec="gzip")
    if driver.name != "kcat":
        assert offsets == list(range(24)), offsets

    before_raw = wire.fetch_all(broker, topic)
    before = driver.consume(broker.bootstrap, topic, 0, 0, 24)
    assert_same_records(driver, before, records, 0)
    assert before_raw.high_watermark == 24
    assert sum(h.records_count for h in batches.batch_headers(before_raw.records)) == 24

    broker.restart(mode)

    after_raw = wire.fetch_all(broker, topic)
    assert after_raw.error_code == 0
    assert after_raw.high_watermark == 24
    # Byte for byte: offsets, leader epochs, timestamps, CRCs and compressed payloads unchanged.
    assert after_raw.records == before_raw.records
    after = driver.consume(broker.bootstrap, topic, 0, 0, 24)
    assert after == before
    assert driver.watermarks(broker.bootstrap, topic, 0) == (0, 24)
    assert driver.topic_partitions(broker.bootstrap, topic) == partitions
    if driver.supports_timestamps:
        assert driver.offset_for_time(broker.bootstrap, topic, 0, base_ts + 14_500) == 15

    more = make_records(3, base_ts_ms=now_ms(), tag=f"{topic}-after", text_only=not driver.supports_headers)
    if not driver.supports_timestamps:
        more = [Rec(r.key, r.value, None, r.headers) for r in more]
    new_offsets = driver.produce(broker.bootstrap, topic, more, acks="all", codec="none")
    if driver.name != "kcat":
        assert new_offsets == [24, 25, 26], new_offsets
    assert_same_records(driver, driver.consume(broker.bootstrap, topic, 0, 24, 3), more, 24)


@pytest.mark.parametrize("mode", ["kill"])
def test_restart_twice_keeps_everything(broker_factory, broker_loop, mode):
    """Recovery after recovery: a second kill -9 (and appends in between) neither loses nor duplicates."""
    driver = DRIVERS["kafka-python"]
    broker = broker_factory(loop=broker_loop)
    topic = unique_topic("twice")
    first = make_records(6, base_ts_ms=now_ms() - 60_000, tag="first")
    second = make_records(6, base_ts_ms=now_ms() - 30_000, tag="second")
    assert driver.produce(broker.bootstrap, topic, first, acks="all", codec="lz4") == list(range(6))
    broker.restart(mode)
    assert driver.produce(broker.bootstrap, topic, second, acks=1, codec="snappy") == list(range(6, 12))
    broker.restart(mode)
    assert_same_records(driver, driver.consume(broker.bootstrap, topic, 0, 0, 12), first + second, 0)
    assert driver.watermarks(broker.bootstrap, topic, 0) == (0, 12)


@pytest.mark.parametrize("mode", ["graceful", "kill"])
def test_idempotent_producer_state_survives_restart(broker_factory, broker_loop, mode):
    """The last sequences per producer are rebuilt from the log after a restart: a retry of a batch
    appended before the restart gets its original offset and is not appended twice."""
    broker = broker_factory(loop=broker_loop)
    topic = unique_topic("pid-restart")
    with wire.RawConnection(broker.host, broker.port) as conn:
        wire.ensure_topic(conn, topic)
        producer_id, epoch = wire.init_producer_id(conn)

        def batch(sequence, values):
            return batches.idempotent_batch(values, producer_id=producer_id, producer_epoch=epoch,
                                            base_sequence=sequence)

        assert wire.produce_one(conn, 1, topic, batch(0, [b"a", b"b"]), acks=-1) == (0, 0)
        assert wire.produce_one(conn, 2, topic, batch(2, [b"c"]), acks=-1) == (0, 2)
    broker.restart(mode)
    with wire.RawConnection(broker.host, broker.port) as conn:
        wire.ensure_topic(conn, topic)
        wire.wait_fetchable(conn, topic)
        result = wire.produce_one(conn, 3, topic, batch(2, [b"c"]), acks=-1)
        assert result == (0, 2), result  # a duplicate: the original offset, not appended again
        assert wire.high_watermark(conn, topic) == 3
        assert wire.produce_one(conn, 4, topic, batch(3, [b"d"]), acks=-1) == (0, 3)
        error, _ = wire.produce_one(conn, 5, topic, batch(7, [b"gap"]), acks=-1)
        assert error == 45
        assert wire.high_watermark(conn, topic) == 4


def test_kill_during_concurrent_produce_loses_no_acknowledged_batch(broker_factory, broker_loop):
    """kill -9 while three connections are appending as fast as they can (pipelined, acks=1 and acks=all):
    after recovery every acknowledged batch is at its acknowledged offset with its bytes unchanged, the log
    is contiguous and CRC-clean, and whatever unacknowledged batches survived are whole batches that were
    really sent, each at most once."""
    broker = broker_factory(loop=broker_loop)
    topic = unique_topic("kill-hot")
    with wire.RawConnection(broker.host, broker.port) as conn:
        wire.ensure_topic(conn, topic)

    sent: dict[bytes, int] = {}  # CRC-covered bytes of every batch sent -> record count
    acknowledged: dict[int, bytes] = {}  # base offset -> CRC-covered bytes
    lock = threading.Lock()
    enough = threading.Event()
    stop = threading.Event()
    errors: list[str] = []

    def producer(worker: int) -> None:
        try:
            conn = wire.RawConnection(broker.host, broker.port)
        except OSError as exc:
            errors.append(f"connect: {exc}")
            return
        in_flight: list[tuple[int, bytes]] = []
        correlation_id = 0
        try:
            while not stop.is_set():
                # Keep 4 requests in flight: the kill lands while appends are in progress.
                while len(in_flight) < 4:
                    correlation_id += 1
                    values = [f"w{worker}-{correlation_id}-{i}".encode() * (1 + i)
                              for i in range(1 + correlation_id % 5)]
                    codec = batches.GZIP if correlation_id % 3 == 0 else batches.NONE
                    batch = batches.keyed_batch(values, codec=codec)
                    with lock:
                        sent[batch[21:]] = len(values)
                    conn.send(wire.produce_v3(correlation_id, topic, 0, batch, acks=-1 if worker == 0 else 1))
                    in_flight.append((correlation_id, batch[21:]))
                got_id, body = conn.recv_frame(timeout_s=20)
                expected_id, body_bytes = in_flight.pop(0)
                assert got_id == expected_id
                error, base_offset = wire.parse_produce_v3(body)
                assert error == 0, error
                with lock:
                    acknowledged[base_offset] = body_bytes
                    if len(acknowledged) >= 150:
                        enough.set()
        except (OSError, wire.ConnectionClosed, struct.error):
            pass  # the broker was killed under us
        finally:
            conn.close()

    threads = [threading.Thread(target=producer, args=(worker,), daemon=True) for worker in range(3)]
    for thread in threads:
        thread.start()
    assert enough.wait(60), f"producers stalled: {errors} {broker.log_tail(2000)}"
    broker.kill()
    stop.set()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    with lock:
        acked = dict(acknowledged)
        all_sent = dict(sent)

    broker.start(port=broker.port)
    stored: dict[int, bytes] = {}
    offset, high_watermark = 0, None
    with wire.RawConnection(broker.host, broker.port) as conn:
        while high_watermark is None or offset < high_watermark:
            request = wire.fetch_v4(offset + 1, topic, 0, offset, max_bytes=1 << 20)
            fetched = wire.parse_fetch_v4(conn.roundtrip(request))
            assert fetched.error_code == 0
            high_watermark = fetched.high_watermark
            if offset >= high_watermark:
                break
            position = 0
            headers = batches.batch_headers(fetched.records)  # CRC-checked
            assert headers, f"no complete batch at offset {offset} below the high watermark {high_watermark}"
            for header in headers:
                body = fetched.records[position + 21 : position + header.size]
                position += header.size
                if header.base_offset + header.records_count <= offset:
                    continue
                assert header.base_offset == offset, f"gap or overlap at {offset}: batch at {header.base_offset}"
                stored[header.base_offset] = body
                offset = header.base_offset + header.records_count
    assert offset == high_watermark
    for base_offset, body in acked.items():
        assert stored.get(base_offset) == body, f"acknowledged batch at offset {base_offset} lost or changed"
    bodies = list(stored.values())
    assert len(set(bodies)) == len(bodies), "a batch was stored twice"
    for base_offset, body in stored.items():
        assert body in all_sent, f"batch at {base_offset} was never sent"
    print(f"acknowledged {len(acked)} batches, {len(stored)} stored after kill -9 and recovery")


def test_deleted_topic_stays_deleted_after_kill(broker_factory, broker_loop):
    """A topic deleted just before a kill -9 (its files possibly not yet removed) is not resurrected by
    recovery, a kept topic comes back whole, and the deleted name can be created again, empty."""
    driver = DRIVERS["confluent-kafka"]
    broker = broker_factory(loop=broker_loop)
    kept, gone = unique_topic("kept"), unique_topic("gone")
    driver.create_topic(broker.bootstrap, kept, 2)
    driver.create_topic(broker.bootstrap, gone, 1)
    records = make_records(3, base_ts_ms=now_ms() - 1000, tag="deleted")
    assert driver.produce(broker.bootstrap, kept, records, acks="all", codec="none") == [0, 1, 2]
    assert driver.produce(broker.bootstrap, gone, records, acks="all", codec="none") == [0, 1, 2]
    driver.delete_topic(broker.bootstrap, gone)
    wait_until(lambda: driver.topic_partitions(broker.bootstrap, gone) is None,
               what=f"deleted {gone} to leave the list", timeout_s=15.0, interval_s=0.2)
    broker.restart("kill")
    assert driver.topic_partitions(broker.bootstrap, gone) is None
    assert driver.topic_partitions(broker.bootstrap, kept) == 2
    assert_same_records(driver, driver.consume(broker.bootstrap, kept, 0, 0, 3), records, 0)
    driver.create_topic(broker.bootstrap, gone, 1)
    wait_until(lambda: driver.topic_partitions(broker.bootstrap, gone) == 1, what=f"{gone} to list 1 partition",
               timeout_s=15.0, interval_s=0.2)
    assert driver.watermarks(broker.bootstrap, gone, 0) == (0, 0)
