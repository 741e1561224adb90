"""Lazy fetch parsing: truncated trailing batches (as Kafka's byte-sliced fetches produce), a partial first
batch, offsets inside a batch, control batches, CRC errors; and response framing into reusable buffers."""

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copyless.protocol import records
from copyless.protocol.batch_builder import BatchBuilder
from copyless.protocol.fetch_records import LOG_APPEND_TIME, PartitionRecords
from copyless.protocol.receive import LeasedFrame, ReceiveBuffer


def _log(batch_sizes, *, value=b"v", base_offset=0):
    """Contiguous batches as a broker stores them (base offsets assigned)."""
    data = bytearray()
    offset = base_offset
    for count in batch_sizes:
        builder = BatchBuilder(batch_size=1 << 30)
        for i in range(count):
            builder.append(1000 + offset + i, b"k%d" % (offset + i), value + b"%d" % (offset + i))
        batch = bytearray(builder.build().to_bytes())
        records.set_base_offset(batch, 0, offset)
        data += batch
        offset += count
    return bytes(data)


def _drain(region):
    out = []
    while (batch := region.next_batch_records()) is not None:
        out.extend(batch)
    return out


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=20), min_size=1, max_size=8), st.data())
def test_truncated_trailing_batch_is_ignored(batch_sizes, data):
    log = _log(batch_sizes)
    cut = data.draw(st.integers(min_value=0, max_value=len(log)))
    region = PartitionRecords("t", 0, log, 0, cut, 0)
    got = _drain(region)
    complete = [(p, h) for p, h in records.iter_batches(log, 0, cut)]
    expected_count = sum(h.records_count for _, h in complete)
    assert [r.offset for r in got] == list(range(expected_count))
    assert all(r.value == b"v%d" % r.offset and r.key == b"k%d" % r.offset for r in got)
    # The next fetch starts after the last complete batch; the cut one comes back whole then.
    assert region.next_fetch_offset == expected_count
    assert region.truncated_first_batch == (cut > 0 and not complete)
    assert region.exhausted


def test_fetch_offset_inside_a_batch_skips_earlier_records():
    log = _log([10, 10])
    region = PartitionRecords("t", 3, log, 0, len(log), 14)
    got = _drain(region)
    assert [r.offset for r in got] == list(range(14, 20))
    assert {r.partition for r in got} == {3}


def test_scan_next_offset_walks_headers_only():
    log = _log([5, 7, 9])
    assert PartitionRecords("t", 0, log, 0, len(log) - 1, 0).scan_next_offset() == 12
    assert PartitionRecords("t", 0, log, 0, len(log), 0).scan_next_offset() == 21
    assert PartitionRecords("t", 0, log, 0, 30, 0).scan_next_offset() is None


def test_corrupt_batch_raises_and_control_batches_are_skipped():
    log = bytearray(_log([3, 3]))
    log[70] ^= 0xFF  # inside the first batch's records
    with pytest.raises(records.InvalidBatchError):
        PartitionRecords("t", 0, bytes(log), 0, len(log), 0).next_batch_records()
    # check_crcs=False still parses structurally (the flipped byte is inside a value here)
    control = bytearray(_log([1]))
    struct.pack_into(">h", control, 21, records.CONTROL_BIT)
    control[17:21] = struct.pack(">I", records.crc32c(bytes(control[21:])))
    data = bytes(control) + _log([2], base_offset=1)
    got = _drain(PartitionRecords("t", 0, data, 0, len(data), 0))
    assert [r.offset for r in got] == [1, 2]


def test_log_append_time_batches_use_max_timestamp():
    log = bytearray(_log([3]))
    records.set_log_append_time(log, 0, len(log), 424242)
    got = _drain(PartitionRecords("t", 0, bytes(log), 0, len(log), 0))
    assert {(r.timestamp, r.timestamp_type) for r in got} == {(424242, LOG_APPEND_TIME)}


def test_decoder_agrees_with_records_decode_records_on_gzip_and_headers():
    builder = BatchBuilder(codec=records.CODEC_GZIP)
    for i in range(50):
        builder.append(5 + i, None if i % 3 else b"key", b"x" * (i * 7), [(f"h{i}", None), ("z", b"1")])
    data = builder.build().to_bytes()
    ours = _drain(PartitionRecords("t", 0, data, 0, len(data), 0))
    reference = records.decode_records(data)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in ours] == [
        (r.offset, r.timestamp, r.key, r.value, r.headers) for r in reference
    ]


def _frames(sizes):
    stream = bytearray()
    bodies = []
    for i, size in enumerate(sizes):
        body = struct.pack(">i", i) + bytes([i % 256]) * size
        bodies.append(body)
        stream += struct.pack(">i", len(body)) + body
    return bytes(stream), bodies


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(st.integers(0, 300), st.integers(5000, 70000)), min_size=1, max_size=12),
    st.lists(st.integers(min_value=1, max_value=50000), min_size=1, max_size=40),
)
def test_receive_buffer_frames_any_chunking(sizes, chunks):
    stream, bodies = _frames(sizes)
    receive = ReceiveBuffer(chunk_bytes=16384, large_frame_bytes=4096)
    got = []
    offset = 0
    chunk_cycle = itertools.cycle(chunks)
    while offset < len(stream):
        target = receive.get_buffer()
        count = min(len(target), next(chunk_cycle), len(stream) - offset)
        assert count > 0
        target[:count] = stream[offset : offset + count]
        target.release()
        receive.buffer_updated(count)
        offset += count
        while (frame := receive.next_frame()) is not None:
            if isinstance(frame, LeasedFrame):
                got.append(bytes(frame.view))
                frame.release()
            else:
                got.append(frame)
    assert got == bodies


def test_large_frames_reuse_pooled_buffers():
    stream, bodies = _frames([50000] * 6)
    receive = ReceiveBuffer(chunk_bytes=65536, large_frame_bytes=4096)
    offset = 0
    seen = 0
    while offset < len(stream):
        target = receive.get_buffer()
        count = min(len(target), len(stream) - offset)
        target[:count] = stream[offset : offset + count]
        target.release()
        receive.buffer_updated(count)
        offset += count
        while (frame := receive.next_frame()) is not None:
            assert isinstance(frame, LeasedFrame)
            assert bytes(frame.view) == bodies[seen]
            seen += 1
            frame.release()
    assert seen == 6
    assert receive.pool.allocations == 1  # one buffer served all six responses


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_garbage_records_parse_or_raise_invalid_batch(data):
    """The parser's fuzz invariant: a batch whose record bytes are damaged (with a matching CRC, as a buggy
    producer would send) either decodes or raises InvalidBatchError - never anything else."""
    log = bytearray(_log([data.draw(st.integers(1, 6))], value=data.draw(st.binary(max_size=300))))
    for _ in range(data.draw(st.integers(1, 4))):
        where = data.draw(st.integers(records.RECORD_BATCH_OVERHEAD, len(log) - 1))
        log[where] = data.draw(st.integers(0, 255))
    log[17:21] = struct.pack(">I", records.crc32c(bytes(log[21:])))
    region = PartitionRecords("t", 0, bytes(log), 0, len(log), 0)
    try:
        got = _drain(region)
    except records.InvalidBatchError:
        return
    assert all(isinstance(r.offset, int) for r in got)


def test_record_that_does_not_fit_leaves_the_batch_untouched():
    builder = BatchBuilder(batch_size=200)
    assert builder.append(1000, None, b"a" * 50) == 0
    assert builder.append(99999, None, b"b" * 500) == -1  # refused: neither counted nor timestamped
    header = records.validate_batch(builder.build().to_bytes())
    assert (header.records_count, header.max_timestamp) == (1, 1000)


# The column-wise decoder must hand out exactly what the record-by-record one does, and take over only the
# batches it fully verified: uniform ones of every size class (1- and 2-byte lengths, the 64-record offset
# varint step, LogAppendTime, a fetch offset inside the batch), and near-misses it must refuse (a key, a
# header, one value of another length, a timestamp spread past 1-byte deltas, a non-zero attributes byte,
# offset gaps as log compaction leaves them).
def _uniform_batch(count, value_bytes, *, spread_ms=3, odd=None, base_offset=0, log_append_time=False):
    from copyless.protocol.batch_builder import BatchBuilder as Builder

    builder = Builder(batch_size=1 << 30)
    for i in range(count):
        value = bytes([i % 251]) * value_bytes
        timestamp = 1_700_000_000_000 + (i * spread_ms) // max(count, 1)
        if odd == "key" and i == count // 2:
            builder.append(timestamp, b"k", value)
        elif odd == "header" and i == count - 1:
            builder.append(timestamp, None, value, [("h", b"1")])
        elif odd == "length" and i == count // 3:
            builder.append_value(timestamp, value + b"+")
        elif odd == "null" and i == 5:
            builder.append_value(timestamp, None)
        else:
            builder.append_value(timestamp, value)
    data = bytearray(builder.build().to_bytes())
    records.set_base_offset(data, 0, base_offset)
    if log_append_time:
        records.set_log_append_time(data, 0, len(data), 1_800_000_000_000)
    return bytes(data)


def _decoded_both_ways(data, min_offset=0):
    from copyless.protocol.fetch_records import _decode_uniform, decode_batch_records, decode_records_one_by_one

    header = records.read_header(data, 0)
    body = bytes(data[records.RECORD_BATCH_OVERHEAD :])
    fast, slow = [], []
    decode_batch_records(body, header, "t", 3, min_offset, fast)
    decode_records_one_by_one(body, header, "t", 3, min_offset, slow)
    return fast, slow, _decode_uniform(body, header, "t", 3, min_offset) is not None


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=1, max_value=3000),
    st.sampled_from([0, 1, 20, 59, 60, 61, 100, 1000, 8191, 8192]),
    st.sampled_from([1, 3, 60, 1000]),
    st.sampled_from([None, None, "key", "header", "length", "null"]),
    st.booleans(),
    st.integers(min_value=0, max_value=5000),
)
def test_column_wise_decoding_equals_record_by_record(count, value_bytes, spread_ms, odd, log_append_time, skip):
    if count * value_bytes > 4_000_000:
        count = 4_000_000 // max(value_bytes, 1) or 1
    data = _uniform_batch(count, value_bytes, spread_ms=spread_ms, odd=odd, base_offset=1000,
                          log_append_time=log_append_time)
    fast, slow, took_columns = _decoded_both_ways(data, min_offset=1000 + skip % (count + 1))
    assert fast == slow
    assert [type(r) for r in fast] == [type(r) for r in slow]
    first = 1000 + skip % (count + 1)
    independent = [r for r in records.decode_records(data) if r.offset >= first]  # the shared decoder
    assert [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in fast] == [
        (r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in independent
    ]
    largest_delta = ((count - 1) * spread_ms) // count
    expected_uniform = odd is None and count >= 16 and value_bytes <= 8191 and largest_delta <= 63
    assert took_columns == expected_uniform  # it takes every batch of the shape, and nothing else


def test_column_wise_decoding_refuses_offset_gaps_and_attributes():
    data = bytearray(_uniform_batch(100, 50))
    fast, slow, took_columns = _decoded_both_ways(bytes(data))
    assert took_columns and fast == slow and [r.offset for r in fast] == list(range(100))
    # A compacted batch: the record with offsetDelta 70 (2-byte varint 0x8c 0x01) claims 71 instead.
    body_start = records.RECORD_BATCH_OVERHEAD
    first_size = 1 + 1 + 1 + 1 + 1 + 1 + 50 + 1  # length, attributes, ts, offset, key, vlen, value, headers
    second_size = first_size + 1  # 2-byte offsetDelta from record 64 on
    at = body_start + 64 * first_size + 6 * second_size + 3  # record 70's offsetDelta, first byte
    assert data[at : at + 2] == b"\x8c\x01"
    data[at] = 0x8E
    crc = records.crc32c(bytes(data[21:]))
    struct.pack_into(">I", data, 17, crc)
    fast, slow, took_columns = _decoded_both_ways(bytes(data))
    assert not took_columns and fast == slow and fast[70].offset == 71
    # A record whose attributes byte is not 0 (ignored by decoders, but not the uniform shape).
    data = bytearray(_uniform_batch(100, 50))
    data[body_start + 1] = 0x04
    struct.pack_into(">I", data, 17, records.crc32c(bytes(data[21:])))
    fast, slow, took_columns = _decoded_both_ways(bytes(data))
    assert not took_columns and fast == slow


def _txn_batch(offset: int, producer_id: int, *, control: bool = False, commit: bool = False) -> bytes:
    """One transactional batch of one record at ``offset`` (a data record, or a COMMIT/ABORT marker)."""
    builder = BatchBuilder(batch_size=1 << 30, transactional=True)
    if control:
        builder.append(1000 + offset, struct.pack(">hh", 0, 1 if commit else 0), struct.pack(">hi", 0, 0))
    else:
        builder.append(1000 + offset, None, b"%d-%d" % (producer_id, offset))
    batch = bytearray(builder.build(producer_id, 0, 0).to_bytes())
    records.set_base_offset(batch, 0, offset)
    if control:
        struct.pack_into(">h", batch, 21, records.CONTROL_BIT | records.TRANSACTIONAL_BIT)
    batch[17:21] = struct.pack(">I", records.crc32c(bytes(batch[21:])))
    return bytes(batch)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["data", "data", "commit", "abort"])), max_size=40),
       st.integers(0, 60))
def test_read_committed_skips_exactly_the_aborted_transactions(events, start):
    """Interleaved transactions of four producers, ended by COMMIT or ABORT markers, decoded with the
    aborted-transactions list the broker sends (producer id, first offset): the records handed out are
    exactly those of committed transactions at or after the fetch offset, and no marker is ever one."""
    log = bytearray()
    open_first: dict[int, int] = {}
    members: dict[int, list[bytes]] = {}
    aborted, committed = [], set()
    offset = 0
    for producer, kind in events + [(p, "abort") for p in range(4)]:
        if kind == "data":
            log += _txn_batch(offset, producer)
            open_first.setdefault(producer, offset)
            members.setdefault(producer, []).append((offset, b"%d-%d" % (producer, offset)))
        elif producer in open_first:
            log += _txn_batch(offset, producer, control=True, commit=kind == "commit")
            if kind == "commit":
                committed.update(value for at, value in members[producer] if at >= start)
            else:
                aborted.append((producer, open_first[producer]))
            del open_first[producer], members[producer]
        else:
            continue
        offset += 1
    got = _drain(PartitionRecords("t", 0, bytes(log), 0, len(log), start, aborted_transactions=tuple(aborted)))
    assert sorted(r.value for r in got) == sorted(committed)
    assert all(r.offset >= start for r in got)
