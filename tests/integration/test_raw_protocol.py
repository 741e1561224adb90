"""Protocol rules the clients rely on, checked byte for byte on raw sockets against a live broker.

- Responses come back strictly in request order on a connection, and an acks=0 Produce gets no response
  (kafka-python and aiokafka match responses FIFO and drop the connection on a mismatch).
- A long-poll Fetch is woken by an append on another connection (no waiting out ``max_wait_ms``) and a
  request behind it on the same connection is answered after it.
- Bad batches are refused with the error code Kafka uses and nothing of them reaches the log: corrupt
  CRC-32C -> CORRUPT_MESSAGE (2), a client baseOffset other than 0 or a lastOffsetDelta that disagrees
  with the record count -> INVALID_RECORD (87), a batch over max.message.bytes -> MESSAGE_TOO_LARGE (10);
  produce to a topic that does not exist -> UNKNOWN_TOPIC_OR_PARTITION (3); fetch past the end ->
  OFFSET_OUT_OF_RANGE (1).
"""

from __future__ import annotations

import struct
import time

import crc32c
import pytest

from . import _wire
from ._clients import unique_topic

pytestmark = pytest.mark.timeout(120)


def _ensure_topic(conn: _wire.RawConnection, topic: str) -> None:
    """Create by auto-creation through Metadata (retrying until the partition has a leader)."""
    for attempt in range(100):
        _, _, topics = _wire.parse_metadata_v1(conn.roundtrip(_wire.metadata_v1(9000 + attempt, [topic])))
        entry = topics.get(topic)
        if entry is not None and entry.error_code == 0 and entry.partitions.get(0, (1, -1))[0] == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"topic {topic} never became available: {topics}")


def _wait_fetchable(conn: _wire.RawConnection, topic: str, partition: int = 0) -> None:
    """A zero-wait fetch until the partition answers without error (Kafka propagates leadership to its
    fetch path a moment after the topic appears in Metadata)."""
    for attempt in range(100):
        if _wire.parse_fetch_v4(conn.roundtrip(_wire.fetch_v4(8000 + attempt, topic, partition, 0))).error_code == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"topic {topic} never became fetchable")


def _produce(conn, correlation_id, topic, batch, acks=1) -> tuple[int, int]:
    return _wire.parse_produce_v3(conn.roundtrip(_wire.produce_v3(correlation_id, topic, 0, batch, acks=acks)))


def _high_watermark(conn, topic) -> int:
    return _wire.parse_fetch_v4(conn.roundtrip(_wire.fetch_v4(77, topic, 0, 0))).high_watermark


def _recrc(batch: bytearray) -> bytearray:
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return batch


@pytest.mark.both_loops
def test_pipelined_requests_answered_in_order_and_acks0_silent(broker):
    topic = unique_topic("order")
    with _wire.RawConnection(broker.host, broker.port) as conn:
        _ensure_topic(conn, topic)
        batch = _wire.record_batch([b"one", b"two"])
        frames = [
            _wire.api_versions_v0(1),
            _wire.produce_v3(2, topic, 0, batch, acks=1),
            _wire.produce_v3(3, topic, 0, batch, acks=0),  # no response
            _wire.metadata_v1(4, [topic]),
            _wire.produce_v3(5, topic, 0, batch, acks=-1),
            _wire.fetch_v4(6, topic, 0, 0),
            _wire.list_offsets_v1(7, topic, 0, -1),
            _wire.api_versions_v0(8),
        ]
        conn.send(b"".join(frames))  # all in one write: the broker sees them pipelined
        answers = [conn.recv_frame() for _ in range(7)]
        assert [correlation_id for correlation_id, _ in answers] == [1, 2, 4, 5, 6, 7, 8]
        assert _wire.parse_produce_v3(answers[1][1]) == (0, 0)
        assert _wire.parse_produce_v3(answers[3][1]) == (0, 4)  # the acks=0 batch took offsets 2..3
        fetched = _wire.parse_fetch_v4(answers[4][1])
        assert fetched.high_watermark == 6
        assert [h.base_offset for h in _wire.batch_headers(fetched.records)] == [0, 2, 4]
        assert _wire.parse_list_offsets_v1(answers[5][1])[::2] == (0, 6)
        # Nothing else is pending: the acks=0 produce really got no answer.
        assert not conn.wait_closed(0.3)


@pytest.mark.both_loops
def test_long_poll_fetch_is_woken_by_append(broker):
    topic = unique_topic("longpoll")
    with _wire.RawConnection(broker.host, broker.port, timeout_s=60) as waiter, \
            _wire.RawConnection(broker.host, broker.port) as producer:
        _ensure_topic(producer, topic)
        _wait_fetchable(waiter, topic)
        # max_wait 50 s: the only way this fetch comes back inside the 25 s receive deadline below, with
        # the record, is the append waking it.
        waiter.send(_wire.fetch_v4(1, topic, 0, 0, max_wait_ms=50_000) + _wire.api_versions_v0(2))
        time.sleep(0.3)  # the fetch is parked (nothing to return yet)
        assert _produce(producer, 3, topic, _wire.record_batch([b"wake up"])) == (0, 0)
        correlation_id, body = waiter.recv_frame(timeout_s=25)
        assert correlation_id == 1
        fetched = _wire.parse_fetch_v4(body)
        assert fetched.error_code == 0 and fetched.high_watermark == 1
        assert [h.records_count for h in _wire.batch_headers(fetched.records)] == [1]
        assert waiter.recv_frame(timeout_s=10)[0] == 2  # answered after the fetch, never before


def _bad_batches() -> list:
    good = _wire.record_batch([b"a", b"b", b"c"])
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF  # a payload byte: CRC no longer matches
    nonzero_base = _recrc(bytearray(good))
    struct.pack_into(">q", nonzero_base, 0, 42)  # baseOffset is outside the CRC
    wrong_delta = bytearray(good)
    struct.pack_into(">i", wrong_delta, 23, 5)  # lastOffsetDelta 5 for 3 records
    _recrc(wrong_delta)
    too_large = _wire.record_batch([b"x" * (1100 * 1024)])  # over the default max.message.bytes 1048588
    return [
        pytest.param(bytes(corrupt), (2,), id="corrupt-crc"),
        pytest.param(bytes(nonzero_base), (87,), id="base-offset-not-0"),
        pytest.param(bytes(wrong_delta), (87,), id="last-offset-delta-vs-count"),
        pytest.param(too_large, (10,), id="over-max-message-bytes"),
    ]


@pytest.mark.parametrize("batch,expected_errors", _bad_batches())
def test_bad_batches_are_refused_and_never_stored(broker, batch, expected_errors):
    topic = unique_topic("refuse")
    with _wire.RawConnection(broker.host, broker.port) as conn:
        _ensure_topic(conn, topic)
        assert _produce(conn, 1, topic, _wire.record_batch([b"before"])) == (0, 0)
        error, _ = _produce(conn, 2, topic, batch)
        assert error in expected_errors
        assert _high_watermark(conn, topic) == 1
        assert _produce(conn, 3, topic, _wire.record_batch([b"after"])) == (0, 1)
        fetched = _wire.parse_fetch_v4(conn.roundtrip(_wire.fetch_v4(4, topic, 0, 0)))
        assert [(h.base_offset, h.records_count) for h in _wire.batch_headers(fetched.records)] == [(0, 1), (1, 1)]


def test_unknown_topic_and_out_of_range(broker):
    with _wire.RawConnection(broker.host, broker.port) as conn:
        missing = unique_topic("missing")
        error, _ = _produce(conn, 1, missing, _wire.record_batch([b"x"]))
        assert error == 3  # Produce never auto-creates
        topic = unique_topic("range")
        _ensure_topic(conn, topic)
        assert _produce(conn, 2, topic, _wire.record_batch([b"x", b"y"])) == (0, 0)
        assert _wire.parse_fetch_v4(conn.roundtrip(_wire.fetch_v4(3, topic, 0, 5))).error_code == 1
        at_end = _wire.parse_fetch_v4(conn.roundtrip(_wire.fetch_v4(4, topic, 0, 2)))
        assert at_end.error_code == 0 and at_end.records == b"" and at_end.high_watermark == 2


@pytest.mark.both_loops
def test_idempotent_producer_duplicates_and_gaps(broker):
    """Per (producer id, partition): a resent batch gets its original offset back and is not appended again;
    a sequence gap is refused with OUT_OF_ORDER_SEQUENCE_NUMBER (45)."""
    topic = unique_topic("idempotent")
    with _wire.RawConnection(broker.host, broker.port) as conn:
        _ensure_topic(conn, topic)
        producer_id, epoch = _wire.init_producer_id(conn)
        assert producer_id >= 0 and epoch >= 0

        def batch(sequence, values):
            # Current timestamps: brokers expire idle producer ids by their batches' timestamps
            # (producer.id.expiration.ms), and Kafka drops expired ones when it reloads producer state.
            return _wire.record_batch(values, base_timestamp_ms=int(time.time() * 1000), producer_id=producer_id,
                                      producer_epoch=epoch, base_sequence=sequence)

        assert _produce(conn, 1, topic, batch(0, [b"s0", b"s1"]), acks=-1) == (0, 0)
        assert _produce(conn, 2, topic, batch(2, [b"s2"]), acks=-1) == (0, 2)
        assert _produce(conn, 3, topic, batch(3, [b"s3", b"s4", b"s5"]), acks=-1) == (0, 3)
        # Retries of already-appended batches (as after a lost response): original offsets, no new data.
        assert _produce(conn, 4, topic, batch(3, [b"s3", b"s4", b"s5"]), acks=-1) == (0, 3)
        assert _produce(conn, 5, topic, batch(2, [b"s2"]), acks=-1) == (0, 2)
        assert _high_watermark(conn, topic) == 6
        # A gap: sequence 9 when 6 is next.
        error, _ = _produce(conn, 6, topic, batch(9, [b"gap"]), acks=-1)
        assert error == 45
        assert _high_watermark(conn, topic) == 6
        assert _produce(conn, 7, topic, batch(6, [b"s6"]), acks=-1) == (0, 6)
        # A plain (non-idempotent) producer on the same partition is unaffected.
        assert _produce(conn, 8, topic, _wire.record_batch([b"plain"]), acks=1) == (0, 7)


@pytest.mark.parametrize("codec_attributes", [0, 1], ids=["plain", "gzip"])
def test_undecodable_records_never_break_time_lookups(broker, codec_attributes):
    """A batch whose header and CRC-32C are valid but whose records cannot be decoded (garbage varints, or
    a gzip payload that is not gzip). Kafka 3.9 refuses it at produce time (with UNKNOWN_SERVER_ERROR -1
    for these two; INVALID_RECORD 87 or CORRUPT_MESSAGE 2 would be the precise codes). A broker that stores batches without decoding them may accept it; either way, an acknowledged batch
    must not make later requests on the partition fail: ListOffsets by time still gets an answer, on the
    same connection, and a good batch after it is still found by time."""
    topic = unique_topic("undecodable")
    count = 3
    payload = b"\xff" * 40 if codec_attributes == 0 else b"\x1f\x8b" + b"\x00" * 30
    tail = struct.pack(">hiqqqhii", codec_attributes, count - 1, 1000, 1000 + count - 1, -1, -1, -1, count) + payload
    batch = struct.pack(">qiibI", 0, 9 + len(tail), -1, 2, crc32c.crc32c(tail)) + tail
    with _wire.RawConnection(broker.host, broker.port) as conn:
        _ensure_topic(conn, topic)
        error, _ = _produce(conn, 1, topic, batch)
        good_base = count if error == 0 else 0  # refused: nothing stored, so the good batch starts at 0
        good = _wire.record_batch([b"ok1", b"ok2"], base_timestamp_ms=5000)
        assert _produce(conn, 2, topic, good) == (0, good_base)
        for correlation_id, timestamp in enumerate((0, 1001, 4000, 5001), start=3):
            try:
                body = conn.roundtrip(_wire.list_offsets_v1(correlation_id, topic, 0, timestamp))
            except _wire.ConnectionClosed:
                pytest.fail(f"ListOffsets for timestamp {timestamp} closed the connection: {broker.log_tail(1500)}")
            error, found_ts, offset = _wire.parse_list_offsets_v1(body)
            if timestamp >= 4000:
                assert (error, found_ts, offset) == (0, timestamp if timestamp > 5000 else 5000,
                                                     good_base + (1 if timestamp > 5000 else 0))
            else:
                assert error != 0 or 0 <= offset <= good_base, (timestamp, error, offset)


def test_metadata_null_lists_all_topics_and_empty_lists_none(broker):
    """Trap T11: in Metadata v1+ a null topic array means every topic, an empty one means none (aiokafka
    bootstraps with the empty one and must not create or list anything)."""
    topic = unique_topic("listed")
    with _wire.RawConnection(broker.host, broker.port) as conn:
        _ensure_topic(conn, topic)
        _, _, everything = _wire.parse_metadata_v1(conn.roundtrip(_wire.metadata_v1(1, None)))
        assert topic in everything and everything[topic].error_code == 0
        _, _, nothing = _wire.parse_metadata_v1(conn.roundtrip(_wire.metadata_v1(2, [])))
        assert nothing == {}


@pytest.mark.parametrize("name", ["bad name", "a" * 250, "..", "sla/sh"], ids=["space", "250-chars", "dotdot", "slash"])
def test_invalid_topic_names_are_refused_not_created(broker, name):
    with _wire.RawConnection(broker.host, broker.port) as conn:
        _, _, topics = _wire.parse_metadata_v1(conn.roundtrip(_wire.metadata_v1(1, [name])))
        assert topics[name].error_code == 17  # INVALID_TOPIC_EXCEPTION
        _, _, everything = _wire.parse_metadata_v1(conn.roundtrip(_wire.metadata_v1(2, None)))
        assert name not in everything


def test_acks0_produce_error_closes_the_connection(broker):
    """acks=0 has no response to carry an error, so Kafka closes the connection: the producer notices."""
    topic = unique_topic("acks0-error")
    with _wire.RawConnection(broker.host, broker.port) as conn:
        _ensure_topic(conn, topic)
        corrupt = bytearray(_wire.record_batch([b"x"]))
        corrupt[-1] ^= 0xFF
        conn.send(_wire.produce_v3(1, topic, 0, bytes(corrupt), acks=0))
        assert conn.wait_closed(10.0), "acks=0 produce with a bad batch left the connection open"
    with _wire.RawConnection(broker.host, broker.port) as conn:
        assert _high_watermark(conn, topic) == 0


def test_one_bad_partition_does_not_fail_the_others(broker):
    topic = unique_topic("multi")
    with _wire.RawConnection(broker.host, broker.port) as conn:
        conn.roundtrip(_wire.create_topics_v2(1, topic, 3))
        _ensure_topic(conn, topic)
        corrupt = bytearray(_wire.record_batch([b"bad"]))
        corrupt[-1] ^= 0xFF
        batches = {0: _wire.record_batch([b"p0"]), 1: bytes(corrupt), 2: _wire.record_batch([b"p2a", b"p2b"])}
        for partition in batches:
            _wait_fetchable(conn, topic, partition)
        results = _wire.parse_produce_v3_partitions(conn.roundtrip(_wire.produce_v3_partitions(2, topic, batches)))
        assert results == {0: (0, 0), 1: (2, results[1][1]), 2: (0, 0)}, results
        for partition, expected in ((0, 1), (1, 0), (2, 2)):
            fetched = _wire.parse_fetch_v4(conn.roundtrip(_wire.fetch_v4(100 + partition, topic, partition, 0)))
            assert fetched.high_watermark == expected, (partition, fetched)


@pytest.mark.parametrize(
    "max_bytes,partition_max_bytes,first_partition_bytes",
    [(100, 100, "whole"), (100_000, 100, "whole"), (2100, 100_000, "whole"), (2200, 100_000, "both"),
     (1, 1, "whole")],
    ids=["both-small", "partition-small", "response-ends-before-2nd-batch", "response-fits-both", "one-byte"],
)
def test_fetch_byte_limits_follow_kip74(broker, max_bytes, partition_max_bytes, first_partition_bytes):
    """Partition 0 holds a ~2 KiB batch then a small one, partition 1 a ~1 KiB batch. The first non-empty
    partition returns its first batch whole even past both limits (KIP-74: a consumer always makes
    progress); after that the limits are hard, so partition 1 comes back empty; when the response limit
    falls inside partition 0's second batch, the records end before it (Kafka would cut it mid-batch and the
    client would drop the cut part), and when both fit, both come back and partition 1 gets nothing left."""
    topic = unique_topic("kip74")
    with _wire.RawConnection(broker.host, broker.port) as conn:
        conn.roundtrip(_wire.create_topics_v2(1, topic, 2))
        _ensure_topic(conn, topic)
        for partition in (0, 1):
            _wait_fetchable(conn, topic, partition)
        big = _wire.record_batch([b"x" * 2000])
        for correlation_id, (partition, batch) in enumerate(
            [(0, big), (1, _wire.record_batch([b"x" * 1000])), (0, _wire.record_batch([b"y" * 10]))], start=2
        ):
            results = _wire.parse_produce_v3_partitions(conn.roundtrip(_wire.produce_v3_partitions(correlation_id, topic, {partition: batch})))
            assert results[partition][0] == 0
        body = conn.roundtrip(_wire.fetch_v4_partitions(9, topic, [0, 1], max_bytes, partition_max_bytes))
        fetched = _wire.parse_fetch_v4_partitions(body)
        assert fetched[0].error_code == 0 and fetched[0].high_watermark == 2
        small = _wire.record_batch([b"y" * 10])
        expected = [(0, len(big))] + ([(1, len(small))] if first_partition_bytes == "both" else [])
        assert [(h.base_offset, h.size) for h in _wire.batch_headers(fetched[0].records)] == expected
        assert len(fetched[0].records) == sum(size for _, size in expected)
        assert fetched[1].error_code == 0 and fetched[1].high_watermark == 1 and fetched[1].records == b""
