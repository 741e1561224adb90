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

import pytest

from tests.support import batches, wire
from tests.support.topics import unique_topic

pytestmark = pytest.mark.timeout(120)


@pytest.mark.both_loops
def test_pipelined_requests_answered_in_order_and_acks0_silent(broker):
    topic = unique_topic("order")
    with wire.RawConnection(broker.host, broker.port) as conn:
        wire.ensure_topic(conn, topic)
        batch = batches.keyed_batch([b"one", b"two"])
        frames = [
            wire.api_versions_v0(1),
            wire.produce_v3(2, topic, 0, batch, acks=1),
            wire.produce_v3(3, topic, 0, batch, acks=0),  # no response
            wire.metadata_v1(4, [topic]),
            wire.produce_v3(5, topic, 0, batch, acks=-1),
            wire.fetch_v4(6, topic, 0, 0),
            wire.list_offsets_v1(7, topic, 0, -1),
            wire.api_versions_v0(8),
        ]
        conn.send(b"".join(frames))  # all in one write: the broker sees them pipelined
        answers = [conn.recv_frame() for _ in range(7)]
        assert [correlation_id for correlation_id, _ in answers] == [1, 2, 4, 5, 6, 7, 8]
        assert wire.parse_produce_v3(answers[1][1]) == (0, 0)
        assert wire.parse_produce_v3(answers[3][1]) == (0, 4)  # the acks=0 batch took offsets 2..3
        fetched = wire.parse_fetch_v4(answers[4][1])
        assert fetched.high_watermark == 6
        assert [h.base_offset for h in batches.batch_headers(fetched.records)] == [0, 2, 4]
        assert wire.parse_list_offsets_v1(answers[5][1])[::2] == (0, 6)
        # Nothing else is pending: the acks=0 produce really got no answer.
        assert not conn.wait_closed(0.3)


@pytest.mark.both_loops
def test_long_poll_fetch_is_woken_by_append(broker):
    topic = unique_topic("longpoll")
    with wire.RawConnection(broker.host, broker.port, timeout_s=60) as waiter, \
            wire.RawConnection(broker.host, broker.port) as producer:
        wire.ensure_topic(producer, topic)
        wire.wait_fetchable(waiter, topic)
        # max_wait 50 s: the only way this fetch comes back inside the 25 s receive deadline below, with
        # the record, is the append waking it.
        waiter.send(wire.fetch_v4(1, topic, 0, 0, max_wait_ms=50_000) + wire.api_versions_v0(2))
        time.sleep(0.3)  # the fetch is parked (nothing to return yet)
        assert wire.produce_one(producer, 3, topic, batches.keyed_batch([b"wake up"])) == (0, 0)
        correlation_id, body = waiter.recv_frame(timeout_s=25)
        assert correlation_id == 1
        fetched = wire.parse_fetch_v4(body)
        assert fetched.error_code == 0 and fetched.high_watermark == 1
        assert [h.records_count for h in batches.batch_headers(fetched.records)] == [1]
        assert waiter.recv_frame(timeout_s=10)[0] == 2  # answered after the fetch, never before


def _bad_batches() -> list:
    good = batches.keyed_batch([b"a", b"b", b"c"])
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF  # a payload byte: CRC no longer matches
    nonzero_base = batches.restamp_crc(bytearray(good))
    struct.pack_into(">q", nonzero_base, 0, 42)  # baseOffset is outside the CRC
    wrong_delta = bytearray(good)
    struct.pack_into(">i", wrong_delta, 23, 5)  # lastOffsetDelta 5 for 3 records
    batches.restamp_crc(wrong_delta)
    too_large = batches.keyed_batch([b"x" * (1100 * 1024)])  # over the default max.message.bytes 1048588
    return [
        pytest.param(bytes(corrupt), (2,), id="corrupt-crc"),
        pytest.param(bytes(nonzero_base), (87,), id="base-offset-not-0"),
        pytest.param(bytes(wrong_delta), (87,), id="last-offset-delta-vs-count"),
        pytest.param(too_large, (10,), id="over-max-message-bytes"),
    ]


@pytest.mark.parametrize("batch,expected_errors", _bad_batches())
def test_bad_batches_are_refused_and_never_stored(broker, batch, expected_errors):
    topic = unique_topic("refuse")
    with wire.RawConnection(broker.host, broker.port) as conn:
        wire.ensure_topic(conn, topic)
        assert wire.produce_one(conn, 1, topic, batches.keyed_batch([b"before"])) == (0, 0)
        error, _ = wire.produce_one(conn, 2, topic, batch)
        assert error in expected_errors
        assert wire.high_watermark(conn, topic) == 1
        assert wire.produce_one(conn, 3, topic, batches.keyed_batch([b"after"])) == (0, 1)
        fetched = wire.parse_fetch_v4(conn.roundtrip(wire.fetch_v4(4, topic, 0, 0)))
        assert [(h.base_offset, h.records_count) for h in batches.batch_headers(fetched.records)] == [(0, 1), (1, 1)]


def test_unknown_topic_and_out_of_range(broker):
    with wire.RawConnection(broker.host, broker.port) as conn:
        missing = unique_topic("missing")
        error, _ = wire.produce_one(conn, 1, missing, batches.keyed_batch([b"x"]))
        assert error == 3  # Produce never auto-creates
        topic = unique_topic("range")
        wire.ensure_topic(conn, topic)
        assert wire.produce_one(conn, 2, topic, batches.keyed_batch([b"x", b"y"])) == (0, 0)
        assert wire.parse_fetch_v4(conn.roundtrip(wire.fetch_v4(3, topic, 0, 5))).error_code == 1
        at_end = wire.parse_fetch_v4(conn.roundtrip(wire.fetch_v4(4, topic, 0, 2)))
        assert at_end.error_code == 0 and at_end.records == b"" and at_end.high_watermark == 2


@pytest.mark.both_loops
def test_idempotent_producer_duplicates_and_gaps(broker):
    """Per (producer id, partition): a resent batch gets its original offset back and is not appended again;
    a sequence gap is refused with OUT_OF_ORDER_SEQUENCE_NUMBER (45)."""
    topic = unique_topic("idempotent")
    with wire.RawConnection(broker.host, broker.port) as conn:
        wire.ensure_topic(conn, topic)
        producer_id, epoch = wire.init_producer_id(conn)
        assert producer_id >= 0 and epoch >= 0

        def batch(sequence, values):
            return batches.idempotent_batch(values, producer_id=producer_id, producer_epoch=epoch,
                                            base_sequence=sequence)

        assert wire.produce_one(conn, 1, topic, batch(0, [b"s0", b"s1"]), acks=-1) == (0, 0)
        assert wire.produce_one(conn, 2, topic, batch(2, [b"s2"]), acks=-1) == (0, 2)
        assert wire.produce_one(conn, 3, topic, batch(3, [b"s3", b"s4", b"s5"]), acks=-1) == (0, 3)
        # Retries of already-appended batches (as after a lost response): original offsets, no new data.
        assert wire.produce_one(conn, 4, topic, batch(3, [b"s3", b"s4", b"s5"]), acks=-1) == (0, 3)
        assert wire.produce_one(conn, 5, topic, batch(2, [b"s2"]), acks=-1) == (0, 2)
        assert wire.high_watermark(conn, topic) == 6
        # A gap: sequence 9 when 6 is next.
        error, _ = wire.produce_one(conn, 6, topic, batch(9, [b"gap"]), acks=-1)
        assert error == 45
        assert wire.high_watermark(conn, topic) == 6
        assert wire.produce_one(conn, 7, topic, batch(6, [b"s6"]), acks=-1) == (0, 6)
        # A plain (non-idempotent) producer on the same partition is unaffected.
        assert wire.produce_one(conn, 8, topic, batches.keyed_batch([b"plain"]), acks=1) == (0, 7)


@pytest.mark.parametrize("codec_attributes", [0, 1], ids=["plain", "gzip"])
def test_undecodable_records_never_break_time_lookups(broker, codec_attributes):
    """A batch whose header and CRC-32C are valid but whose records cannot be decoded (garbage varints, or
    a gzip payload that is not gzip). Kafka 3.9 refuses it at produce time (with UNKNOWN_SERVER_ERROR -1
    for these two; INVALID_RECORD 87 or CORRUPT_MESSAGE 2 would be the precise codes). A broker that stores batches
    without decoding them may accept it; either way, an acknowledged batch must not make later requests on the partition
    fail: ListOffsets by time still gets an answer, on the same connection, and a good batch after it is still found by
    time."""
    topic = unique_topic("undecodable")
    count = 3
    payload = b"\xff" * 40 if codec_attributes == 0 else b"\x1f\x8b" + b"\x00" * 30
    batch = batches.frame_batch(payload, records_count=count, attributes=codec_attributes, base_timestamp_ms=1000,
                                max_timestamp_ms=1000 + count - 1)
    with wire.RawConnection(broker.host, broker.port) as conn:
        wire.ensure_topic(conn, topic)
        error, _ = wire.produce_one(conn, 1, topic, batch)
        good_base = count if error == 0 else 0  # refused: nothing stored, so the good batch starts at 0
        good = batches.keyed_batch([b"ok1", b"ok2"], base_timestamp_ms=5000)
        assert wire.produce_one(conn, 2, topic, good) == (0, good_base)
        for correlation_id, timestamp in enumerate((0, 1001, 4000, 5001), start=3):
            try:
                body = conn.roundtrip(wire.list_offsets_v1(correlation_id, topic, 0, timestamp))
            except wire.ConnectionClosed:
                pytest.fail(f"ListOffsets for timestamp {timestamp} closed the connection: {broker.log_tail(1500)}")
            error, found_ts, offset = wire.parse_list_offsets_v1(body)
            if timestamp >= 4000:
                assert (error, found_ts, offset) == (0, timestamp if timestamp > 5000 else 5000,
                                                     good_base + (1 if timestamp > 5000 else 0))
            else:
                assert error != 0 or 0 <= offset <= good_base, (timestamp, error, offset)


def test_metadata_null_lists_all_topics_and_empty_lists_none(broker):
    """Trap T11: in Metadata v1+ a null topic array means every topic, an empty one means none (aiokafka
    bootstraps with the empty one and must not create or list anything)."""
    topic = unique_topic("listed")
    with wire.RawConnection(broker.host, broker.port) as conn:
        wire.ensure_topic(conn, topic)
        _, _, everything = wire.parse_metadata_v1(conn.roundtrip(wire.metadata_v1(1, None)))
        assert topic in everything and everything[topic].error_code == 0
        _, _, nothing = wire.parse_metadata_v1(conn.roundtrip(wire.metadata_v1(2, [])))
        assert nothing == {}


@pytest.mark.parametrize("name", ["bad name", "a" * 250, "..", "sla/sh"], ids=["space", "250-chars", "dotdot", "slash"])
def test_invalid_topic_names_are_refused_not_created(broker, name):
    with wire.RawConnection(broker.host, broker.port) as conn:
        _, _, topics = wire.parse_metadata_v1(conn.roundtrip(wire.metadata_v1(1, [name])))
        assert topics[name].error_code == 17  # INVALID_TOPIC_EXCEPTION
        _, _, everything = wire.parse_metadata_v1(conn.roundtrip(wire.metadata_v1(2, None)))
        assert name not in everything


def test_acks0_produce_error_closes_the_connection(broker):
    """acks=0 has no response to carry an error, so Kafka closes the connection: the producer notices."""
    topic = unique_topic("acks0-error")
    with wire.RawConnection(broker.host, broker.port) as conn:
        wire.ensure_topic(conn, topic)
        corrupt = bytearray(batches.keyed_batch([b"x"]))
        corrupt[-1] ^= 0xFF
        conn.send(wire.produce_v3(1, topic, 0, bytes(corrupt), acks=0))
        assert conn.wait_closed(10.0), "acks=0 produce with a bad batch left the connection open"
    with wire.RawConnection(broker.host, broker.port) as conn:
        assert wire.high_watermark(conn, topic) == 0


def test_one_bad_partition_does_not_fail_the_others(broker):
    topic = unique_topic("multi")
    with wire.RawConnection(broker.host, broker.port) as conn:
        conn.roundtrip(wire.create_topics_v2(1, topic, 3))
        wire.ensure_topic(conn, topic)
        corrupt = bytearray(batches.keyed_batch([b"bad"]))
        corrupt[-1] ^= 0xFF
        by_partition = {0: batches.keyed_batch([b"p0"]), 1: bytes(corrupt), 2: batches.keyed_batch([b"p2a", b"p2b"])}
        for partition in by_partition:
            wire.wait_fetchable(conn, topic, partition)
        results = wire.parse_produce_v3_partitions(conn.roundtrip(wire.produce_v3_partitions(2, topic, by_partition)))
        assert results == {0: (0, 0), 1: (2, results[1][1]), 2: (0, 0)}, results
        for partition, expected in ((0, 1), (1, 0), (2, 2)):
            fetched = wire.parse_fetch_v4(conn.roundtrip(wire.fetch_v4(100 + partition, topic, partition, 0)))
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
    with wire.RawConnection(broker.host, broker.port) as conn:
        conn.roundtrip(wire.create_topics_v2(1, topic, 2))
        wire.ensure_topic(conn, topic)
        for partition in (0, 1):
            wire.wait_fetchable(conn, topic, partition)
        big = batches.keyed_batch([b"x" * 2000])
        for correlation_id, (partition, batch) in enumerate(
            [(0, big), (1, batches.keyed_batch([b"x" * 1000])), (0, batches.keyed_batch([b"y" * 10]))], start=2
        ):
            request = wire.produce_v3_partitions(correlation_id, topic, {partition: batch})
            results = wire.parse_produce_v3_partitions(conn.roundtrip(request))
            assert results[partition][0] == 0
        body = conn.roundtrip(wire.fetch_v4_partitions(9, topic, [0, 1], max_bytes, partition_max_bytes))
        fetched = wire.parse_fetch_v4_partitions(body)
        assert fetched[0].error_code == 0 and fetched[0].high_watermark == 2
        small = batches.keyed_batch([b"y" * 10])
        expected = [(0, len(big))] + ([(1, len(small))] if first_partition_bytes == "both" else [])
        assert [(h.base_offset, h.size) for h in batches.batch_headers(fetched[0].records)] == expected
        assert len(fetched[0].records) == sum(size for _, size in expected)
        assert fetched[1].error_code == 0 and fetched[1].high_watermark == 1 and fetched[1].records == b""
