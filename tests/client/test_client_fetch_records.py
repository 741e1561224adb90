"""Lazy fetch parsing: truncated trailing batches (as Kafka's byte-sliced fetches produce), a partial first
batch, offsets inside a batch, control batches, CRC errors; and response framing into reusable buffers."""

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.protocol import records
from client.protocol.batch_builder import BatchBuilder
from client.protocol.fetch_records import LOG_APPEND_TIME, PartitionRecords
from client.protocol.receive import LeasedFrame, ReceiveBuffer


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
        builder.append(5 + i, None if i % 3 else b"key", b"x" * (i * 7), [("h%d" % i, None), ("z", b"1")])
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
