"""The real Kafka clients against one broker subprocess per loop: produce (acks 0/1/all, every codec the
client has), read back from chosen offsets with assign + seek, look offsets up by time, create and delete
topics with each admin client.

Besides what each client decodes, every produced partition is also fetched on a raw socket (``wire``) and
its batch headers are checked: CRC-32C intact, offsets contiguous from 0, and the codec the client was
asked for (batches are stored as sent, never recompressed). This is also how broker-side version choices
that make librdkafka quietly stop compressing show up: kcat's librdkafka 2.0.2 drops gzip/snappy/lz4 when
Produce is advertised with min version > 0, and every librdkafka enables LZ4 only when FindCoordinator v0
is advertised. (librdkafka may leave a batch uncompressed when compressing would not shrink it, so for its
clients uncompressed batches may sit beside compressed ones; at least one must carry the codec.)
"""

from __future__ import annotations

import time

import pytest

from tests.support import batches, wire
from tests.support.clients import DRIVERS, Driver, Rec, assert_same_records, make_records, now_ms
from tests.support.polling import wait_until
from tests.support.topics import unique_topic

pytestmark = pytest.mark.timeout(120)

RECORDS = 12


def _produce_matrix():
    """Every codec with acks=all, and acks 0 and 1 each over several codecs: 10 combinations per client
    rather than 15, so the suite stays within its time budget while each axis is covered."""
    combos = [(codec, "all") for codec in ("none", "gzip", "snappy", "lz4", "zstd")]
    combos += [("gzip", 1), ("lz4", 1), ("none", 0), ("snappy", 0), ("zstd", 0)]
    for client in DRIVERS:
        for codec, acks in combos:
            marks = [pytest.mark.both_loops] if (codec, acks) in {("zstd", "all"), ("gzip", 1)} else []
            yield pytest.param(client, codec, acks, id=f"{client}-{codec}-acks{acks}", marks=marks)


def _records_for(driver: Driver, tag: str, base_ts_ms: int, count: int = RECORDS) -> list[Rec]:
    records = make_records(count, base_ts_ms=base_ts_ms, tag=tag, text_only=not driver.supports_headers)
    if not driver.supports_timestamps:
        records = [Rec(r.key, r.value, None, r.headers) for r in records]
    return records


def assert_stored_batches(broker, topic: str, partition: int, count: int, codec: str, *,
                          may_skip_compression=False) -> None:
    fetched = wire.fetch_all(broker, topic, partition)
    assert fetched.error_code == 0
    assert fetched.high_watermark == count
    headers = batches.batch_headers(fetched.records)
    assert headers, "no complete batch fetched"
    next_offset = 0
    for header in headers:
        assert header.magic == 2
        assert header.base_offset == next_offset, (header, next_offset)
        assert header.last_offset_delta + 1 == header.records_count
        next_offset += header.records_count
        allowed = {codec, "none"} if may_skip_compression else {codec}
        assert header.codec in allowed, f"batch at {header.base_offset} stored as {header.codec}, produced as {codec}"
    assert next_offset == count
    codecs = [h.codec for h in headers]
    assert codec in codecs, f"no batch stored as {codec}: {codecs}"


@pytest.mark.parametrize("client,codec,acks", list(_produce_matrix()))
def test_produce_and_read_back_from_offsets(broker, client, codec, acks):
    driver = DRIVERS[client]
    topic = unique_topic(f"{client}-{codec}")
    records = _records_for(driver, topic, now_ms() - 3_600_000)
    produced_from = now_ms()
    offsets = driver.produce(broker.bootstrap, topic, records, acks=acks, codec=codec)
    produced_to = now_ms()
    if acks != 0 and any(o is not None for o in offsets):
        assert offsets == list(range(RECORDS)), offsets
    ts_range = (produced_from - 1000, produced_to + 1000)

    everything = driver.consume(broker.bootstrap, topic, 0, 0, RECORDS)
    assert_same_records(driver, everything, records, 0, ts_range=ts_range)
    # From a chosen offset in the middle of a batch: the broker serves from the batch holding offset 7,
    # the client skips 0..6, and nothing before 7 may surface.
    tail = driver.consume(broker.bootstrap, topic, 0, 7, RECORDS - 7)
    assert_same_records(driver, tail, records[7:], 7, ts_range=ts_range)
    assert_stored_batches(broker, topic, 0, RECORDS, codec, may_skip_compression=driver.may_skip_compression)
    if not driver.supports_admin:
        assert driver.topic_partitions(broker.bootstrap, topic) == 1  # auto-created with the default count


@pytest.mark.both_loops
@pytest.mark.parametrize("client", list(DRIVERS))
def test_offsets_by_time_and_watermarks(broker, client):
    driver = DRIVERS[client]
    topic = unique_topic(f"{client}-time")
    base_ts = now_ms() - 3_600_000
    records = _records_for(driver, topic, base_ts)
    first, second = records[:6], records[6:]
    driver.produce(broker.bootstrap, topic, first, acks=1, codec="gzip")
    if driver.supports_timestamps:
        middle_ts = base_ts + 6000
    else:
        time.sleep(0.05)  # wall-clock CreateTime: leave a gap between the two batches' timestamps
        middle_ts = now_ms()
        time.sleep(0.05)
    driver.produce(broker.bootstrap, topic, second, acks=1, codec="gzip")

    assert driver.watermarks(broker.bootstrap, topic, 0) == (0, RECORDS)
    assert driver.offset_for_time(broker.bootstrap, topic, 0, middle_ts) == 6
    assert driver.offset_for_time(broker.bootstrap, topic, 0, 0) == 0
    assert driver.offset_for_time(broker.bootstrap, topic, 0, now_ms() + 3_600_000) is None
    if driver.supports_timestamps:
        # Exact per record, inside one gzip batch: the first record with timestamp >= t.
        assert driver.offset_for_time(broker.bootstrap, topic, 0, base_ts + 2500) == 3
        assert driver.offset_for_time(broker.bootstrap, topic, 0, base_ts + 3000) == 3
        assert driver.offset_for_time(broker.bootstrap, topic, 0, base_ts + 11000) == 11
        assert driver.offset_for_time(broker.bootstrap, topic, 0, base_ts + 11001) is None


@pytest.mark.both_loops
@pytest.mark.parametrize("client", list(DRIVERS))
def test_create_and_delete_topics(broker, client):
    driver = DRIVERS[client]
    if not driver.supports_admin:
        pytest.skip(f"{client} sends no CreateTopics/DeleteTopics; its auto-created topics are checked above")
    topic = unique_topic(f"{client}-admin")
    bootstrap = broker.bootstrap

    driver.create_topic(bootstrap, topic, 3)
    wait_until(lambda: driver.topic_partitions(bootstrap, topic) == 3, what=f"{topic} to list 3 partitions",
               timeout_s=15.0, interval_s=0.2, detail=lambda: f"listed: {driver.topic_partitions(bootstrap, topic)}")
    error = driver.create_topic_error(bootstrap, topic, 3)
    assert error is not None and "exist" in error.lower(), error
    bad_name_error = driver.create_topic_error(bootstrap, "bad/name", 1)
    assert bad_name_error is not None

    records = _records_for(driver, topic, now_ms() - 60_000, count=4)
    offsets = driver.produce(bootstrap, topic, records, acks=1, codec="none", partition=2)
    assert offsets == [0, 1, 2, 3]
    assert_same_records(driver, driver.consume(bootstrap, topic, 2, 0, 4), records, 0)
    assert driver.watermarks(bootstrap, topic, 0) == (0, 0)

    driver.delete_topic(bootstrap, topic)
    wait_until(lambda: driver.topic_partitions(bootstrap, topic) is None, what=f"deleted {topic} to leave the list",
               timeout_s=15.0, interval_s=0.2)
    # Recreated under the same name it starts empty: deleted data never comes back.
    wait_until(lambda: driver.create_topic_error(bootstrap, topic, 1) is None, what=f"{topic} to be created again",
               timeout_s=15.0, interval_s=0.2)
    wait_until(lambda: driver.topic_partitions(bootstrap, topic) == 1, what=f"{topic} to list 1 partition",
               timeout_s=15.0, interval_s=0.2)
    assert driver.watermarks(bootstrap, topic, 0) == (0, 0)


@pytest.mark.parametrize("client", list(DRIVERS))
def test_large_record_round_trip(broker, client):
    """A record just under max.message.bytes (1048588) goes through every client's produce and fetch."""
    driver = DRIVERS[client]
    topic = unique_topic(f"{client}-large")
    # kcat reads one record per line: the value must be text without newlines.
    big = (b"0123456789abcdef" * 62_000)[:990_000]
    records = [Rec(b"small-before", b"x" * 10), Rec(b"big", big), Rec(b"small-after", b"y" * 10)]
    if driver.supports_timestamps:
        records = [Rec(r.key, r.value, now_ms() - 10_000 + i) for i, r in enumerate(records)]
    for record in records:  # one batch each: the big one alone is close to the limit
        driver.produce(broker.bootstrap, topic, [record], acks=1, codec="none")
    consumed = driver.consume(broker.bootstrap, topic, 0, 0, 3)
    assert [c.offset for c in consumed] == [0, 1, 2]
    assert [c.rec.value for c in consumed] == [r.value for r in records]
    assert [c.offset for c in driver.consume(broker.bootstrap, topic, 0, 1, 2)] == [1, 2]


@pytest.mark.parametrize("client", [name for name, d in DRIVERS.items() if d.supports_admin])
def test_log_append_time_topic(broker, client):
    """On a LogAppendTime topic the broker stamps each batch with its own clock (rewriting the batch and its
    CRC in place); consumers see that time, not the producer's."""
    driver = DRIVERS[client]
    topic = unique_topic(f"{client}-lat")
    driver.create_topic(broker.bootstrap, topic, 1, configs={"message.timestamp.type": "LogAppendTime"})
    wait_until(lambda: driver.topic_partitions(broker.bootstrap, topic) == 1, what=f"{topic} to list 1 partition",
               timeout_s=15.0, interval_s=0.2)
    old = now_ms() - 86_400_000
    records = [Rec(f"k{i}".encode(), f"v{i}".encode(), old + i) for i in range(4)]
    before = now_ms()
    assert driver.produce(broker.bootstrap, topic, records, acks=1, codec="lz4") == [0, 1, 2, 3]
    after = now_ms()
    consumed = driver.consume(broker.bootstrap, topic, 0, 0, 4)
    assert [c.rec.value for c in consumed] == [r.value for r in records]
    for c in consumed:
        assert before - 1000 <= c.rec.timestamp_ms <= after + 1000, (c.rec.timestamp_ms, before, after)
    fetched = wire.fetch_all(broker, topic)
    headers = batches.batch_headers(fetched.records)  # raises if a rewritten batch's CRC-32C is wrong
    assert all(h.attributes & 0x08 for h in headers), [h.attributes for h in headers]
