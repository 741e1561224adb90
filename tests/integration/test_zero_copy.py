"""Zero copy is real: with sendfile on, every fetched record byte leaves through ``os.sendfile``; with
``--no-sendfile`` the same bytes are copied through Python instead.

The proof is the broker's own counters, read from outside through its periodic stats log line
(``stats ... fetch_sendfile_bytes=N fetch_copied_bytes=M ...``, period set with ``stats.interval.s``):
after three real clients and a raw fetch have each read the whole partition, the sendfile counter covers
at least four times the log's bytes and the copy counter is exactly zero (and the reverse without sendfile).
"""

from __future__ import annotations

import pytest

from tests.support import batches, wire
from tests.support.clients import DRIVERS, Rec, now_ms
from tests.support.polling import wait_until
from tests.support.topics import unique_topic

pytestmark = pytest.mark.timeout(180)

RECORD_COUNT = 600
VALUE_BYTES = 2000


def _log_bytes(broker, topic: str, high_watermark: int) -> int:
    """Total stored bytes of the partition, read with raw fetches (whole batches only)."""
    total, offset = 0, 0
    with wire.RawConnection(broker.host, broker.port) as conn:
        while offset < high_watermark:
            fetched = wire.parse_fetch_v4(conn.roundtrip(wire.fetch_v4(offset, topic, 0, offset, max_bytes=1 << 20)))
            assert fetched.error_code == 0
            headers = batches.batch_headers(fetched.records)
            assert headers, f"no complete batch at offset {offset}"
            for header in headers:
                if header.base_offset + header.records_count <= offset:
                    continue
                total += header.size
                offset = header.base_offset + header.records_count
    return total


def _wait_for_stats(broker, since: int, predicate, timeout_s: float = 15.0) -> dict:
    latest = {}

    def showing() -> dict | None:
        latest["stats"] = broker.stats(since)
        return latest["stats"] if latest["stats"] is not None and predicate(latest["stats"]) else None

    return wait_until(showing, what="a stats line showing the fetches", timeout_s=timeout_s, interval_s=0.2,
                      detail=lambda: f"latest: {latest.get('stats')}\n{broker.log_tail(3000)}")


@pytest.mark.parametrize(
    "sendfile", [pytest.param(True, id="sendfile", marks=pytest.mark.both_loops), pytest.param(False, id="copy")]
)
def test_fetched_record_bytes_counted_by_path(broker_factory, broker_loop, sendfile):
    broker = broker_factory(loop=broker_loop, sendfile=sendfile, config={"stats.interval.s": 0.5})
    topic = unique_topic("zero-copy")
    base_ts = now_ms() - 60_000
    records = [
        Rec(f"k{i}".encode(), (f"{i:08d}" * (VALUE_BYTES // 8)).encode(), base_ts + i) for i in range(RECORD_COUNT)
    ]
    offsets = DRIVERS["confluent-kafka"].produce(broker.bootstrap, topic, records, acks=1, codec="none")
    assert offsets == list(range(RECORD_COUNT))
    log_bytes = _log_bytes(broker, topic, RECORD_COUNT)
    assert log_bytes > RECORD_COUNT * VALUE_BYTES

    for name in ("confluent-kafka", "kafka-python", "aiokafka"):
        consumed = DRIVERS[name].consume(broker.bootstrap, topic, 0, 0, RECORD_COUNT)
        assert [c.rec.value for c in consumed] == [r.value for r in records], name
    expected = 4 * log_bytes  # the raw read above plus three clients, each over the whole log
    since = broker.log_size()
    stats = _wait_for_stats(
        broker, since, lambda s: s.get("fetch_sendfile_bytes", 0) + s.get("fetch_copied_bytes", 0) >= expected
    )
    if sendfile:
        assert stats["fetch_copied_bytes"] == 0, stats
        assert stats["fetch_sendfile_bytes"] >= expected, stats
    else:
        assert stats["fetch_sendfile_bytes"] == 0, stats
        assert stats["fetch_copied_bytes"] >= expected, stats


def test_the_log_is_pre_faulted_with_zeros_and_keeps_every_record(broker_factory):
    """The storage side of the same stats line: the pre-fault chases fill the page cache ahead of the appends
    by writing zeros (``prefault_zeroed_bytes``), and the records produced through them read back intact."""
    broker = broker_factory(config={"stats.interval.s": 0.5})
    topic = unique_topic("zeros-ahead")
    base_ts = now_ms() - 60_000
    records = [Rec(f"k{i}".encode(), (f"{i:08d}" * (VALUE_BYTES // 8)).encode(), base_ts + i)
               for i in range(RECORD_COUNT)]
    since = broker.log_size()
    offsets = DRIVERS["confluent-kafka"].produce(broker.bootstrap, topic, records, acks=1, codec="none")
    assert offsets == list(range(RECORD_COUNT))
    consumed = DRIVERS["confluent-kafka"].consume(broker.bootstrap, topic, 0, 0, RECORD_COUNT)
    assert [c.rec.value for c in consumed] == [r.value for r in records]
    # The active segment's window (16 MiB by default) is zeroed from 1 MiB past the appends on.
    stats = _wait_for_stats(broker, since, lambda s: s.get("prefault_zeroed_bytes", 0) >= 8 << 20)
    assert "prefault_append_waits" in stats
    # Appends past the pre-faulted pages (written with pwrite) are counted beside them, never more than what
    # was produced.
    assert 0 <= stats["prefault_outrun_bytes"] <= RECORD_COUNT * (VALUE_BYTES + 64)
