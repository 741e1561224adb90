"""Batch building: round-trips through records.decode_records and kafka-python's own batch parser; the
gathered buffer layout (large values by reference, small ones coalesced); compression; CRC rewrites."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from copyless.protocol import records
from copyless.protocol.batch_builder import GATHER_MIN_VALUE_BYTES, BatchBuilder, record_size

header_lists = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=16))), max_size=3
)
record_lists = st.lists(
    st.tuples(
        st.integers(min_value=-(10**6), max_value=10**6),  # timestamp delta from a base
        st.one_of(st.none(), st.binary(max_size=40)),
        st.one_of(st.none(), st.binary(max_size=300), st.binary(min_size=2048, max_size=5000)),
        header_lists,
    ),
    min_size=1,
    max_size=30,
)


def _build(items, gather_min_bytes=64, codec=0, producer=(-1, -1, -1)):
    builder = BatchBuilder(batch_size=1 << 30, gather_min_bytes=gather_min_bytes, codec=codec)
    base = 1_700_000_000_000
    for delta, key, value, headers in items:
        assert builder.append(base + delta, key, value, headers) >= 0
    return builder.build(*producer)


@settings(max_examples=60, deadline=None)
@given(record_lists, st.integers(min_value=1, max_value=4096))
def test_round_trip_through_decode_records_and_kafka_python(items, gather_min_bytes):
    built = _build(items, gather_min_bytes, producer=(77, 3, 1000))
    data = built.to_bytes()
    assert len(data) == built.size_bytes
    header = records.validate_batch(data)  # framing, magic, CRC-32C over the gathered pieces, count
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (77, 3, 1000)
    assert header.records_count == len(items)
    base = 1_700_000_000_000
    expected = [
        (i, base + delta, key, value, tuple((name, hv) for name, hv in headers))
        for i, (delta, key, value, headers) in enumerate(items)
    ]
    decoded = records.decode_records(data)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decoded] == expected
    assert header.max_timestamp == max(t for _, t, *_ in expected)
    theirs = DefaultRecordBatch(bytearray(data))
    assert theirs.validate_crc()
    assert [
        (r.offset, r.timestamp, r.key, r.value, tuple(tuple(h) for h in r.headers)) for r in theirs
    ] == expected


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=5000), min_size=1, max_size=20), st.integers(min_value=1, max_value=3000))
def test_values_at_or_above_the_crossover_are_their_own_buffers(values, gather_min_bytes):
    builder = BatchBuilder(batch_size=1 << 30, gather_min_bytes=gather_min_bytes)
    for value in values:
        builder.append(0, None, value)
    built = builder.build()
    large = [v for v in values if len(v) >= gather_min_bytes]
    referenced = [b for b in built.buffers if isinstance(b, bytes)]
    # Every large value is passed by reference (the very object), in order; nothing else is.
    assert len(referenced) == len(large)
    assert all(a is b for a, b in zip(referenced, large, strict=True))
    # Between two large values there is exactly one coalesced piece: 2 * large + 1 buffers.
    assert len(built.buffers) == 2 * len(large) + 1
    records.validate_batch(built.to_bytes())


def test_default_crossover_is_the_measured_socket_value():
    assert GATHER_MIN_VALUE_BYTES == 2048
    builder = BatchBuilder()
    builder.append(0, None, b"x" * 100)
    builder.append(0, None, b"y" * 4096)
    assert len(builder.build().buffers) == 3


@pytest.mark.parametrize("codec", [records.CODEC_GZIP, records.CODEC_SNAPPY, records.CODEC_LZ4, records.CODEC_ZSTD])
def test_compressed_batches_round_trip(codec):
    items = [(i, b"key%d" % i, b"value %d " % i * 50, [("h", b"%d" % i)]) for i in range(200)]
    built = _build(items, codec=codec)
    data = built.to_bytes()
    header = records.validate_batch(data)
    assert header.codec == codec
    assert len(data) < sum(len(v) for _, _, v, _ in items)  # it really compressed
    decoded = records.decode_records(data)
    assert [(r.key, r.value) for r in decoded] == [(k, v) for _, k, v, _ in items]
    theirs = DefaultRecordBatch(bytearray(data))
    assert [r.value for r in theirs] == [v for _, _, v, _ in items]


def test_batch_size_is_a_soft_cap():
    builder = BatchBuilder(batch_size=1000)
    assert builder.append(0, None, b"x" * 5000) == 0  # the first record always fits
    assert builder.append(0, None, b"x") == -1
    builder = BatchBuilder(batch_size=1000)
    count = 0
    while builder.append(0, None, b"x" * 100) >= 0:
        count += 1
    assert builder.size_bytes <= 1000
    assert builder.size_bytes + record_size(count, 0, None, b"x" * 100) > 1000


def test_set_producer_state_rewrites_and_rechecksums():
    built = _build([(0, None, b"a" * 3000, []), (1, b"k", b"b", [])], gather_min_bytes=100, producer=(1, 0, 0))
    built.set_producer_state(99, 7, 12345)
    header = records.validate_batch(built.to_bytes())
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (99, 7, 12345)


def test_empty_batch_is_refused():
    with pytest.raises(ValueError):
        BatchBuilder().build()


# append_value is the producer's fast path; it must write exactly what append(ts, None, value) writes,
# across every run boundary it keeps: a new millisecond (forward and backward), a new value length, a
# non-bytes value, a value at the gather crossover, offsetDelta varints growing at 64 and 8192 records,
# general appends interleaved, and the batch_size cap.
fast_steps = st.lists(
    st.tuples(
        st.sampled_from(["value", "value", "value", "general", "bytearray", "none"]),
        st.integers(min_value=-3, max_value=20_000),  # timestamp delta from the base
        st.sampled_from([0, 1, 7, 100, 100, 100, 300, 5000]),  # value length (5000: gathered)
        st.integers(min_value=1, max_value=700),  # how many records of this shape in a row
    ),
    min_size=1,
    max_size=12,
)


def _apply(builder, steps, fast):
    base = 1_700_000_000_000
    results = []
    for kind, delta, length, repeat in steps:
        value = bytes([65 + length % 26]) * length
        for _ in range(repeat):
            timestamp = base + delta
            if kind == "general":
                results.append(builder.append(timestamp, b"k", value, [("h", b"1")]))
            elif kind == "none":
                results.append(builder.append_value(timestamp, None) if fast else builder.append(timestamp, None, None))
            else:
                item = bytearray(value) if kind == "bytearray" else value
                results.append(builder.append_value(timestamp, item) if fast else builder.append(timestamp, None, item))
    return results


@settings(max_examples=40, deadline=None)
@given(fast_steps, st.sampled_from([1 << 30, 5000, 200_000]), st.sampled_from([64, 2048]))
def test_append_value_writes_exactly_what_append_writes(steps, batch_size, gather_min_bytes):
    fast = BatchBuilder(batch_size=batch_size, gather_min_bytes=gather_min_bytes)
    general = BatchBuilder(batch_size=batch_size, gather_min_bytes=gather_min_bytes)
    fast_results = _apply(fast, steps, True)
    assert fast_results == _apply(general, steps, False)  # same offset deltas, same -1 when full
    assert fast.size_bytes == general.size_bytes and fast.record_count == general.record_count
    if fast.record_count == 0:
        return
    fast_built, general_built = fast.build(5, 1, 10), general.build(5, 1, 10)
    data = fast_built.to_bytes()
    assert data == general_built.to_bytes()
    assert len(data) == fast_built.size_bytes
    assert len(fast_built.buffers) == len(general_built.buffers)
    header = records.validate_batch(data)
    assert header.records_count == fast.record_count
    assert [r.offset for r in records.decode_records(data)] == list(range(header.records_count))


def test_append_value_runs_cross_the_offset_varint_lengths():
    builder = BatchBuilder(batch_size=1 << 30)
    values = [b"%05d" % i for i in range(10_000)]
    for i, value in enumerate(values):
        assert builder.append_value(1_700_000_000_000 + i // 1000, value) == i
    data = builder.build().to_bytes()
    decoded = records.decode_records(data)
    assert [r.value for r in decoded] == values
    assert [r.timestamp for r in decoded] == [1_700_000_000_000 + i // 1000 for i in range(10_000)]
    assert [r.offset for r in decoded] == list(range(10_000))
    assert DefaultRecordBatch(bytearray(data)).validate_crc()


def test_append_value_copies_mutable_values():
    builder = BatchBuilder()
    value = bytearray(b"a" * 10)
    builder.append_value(0, value)
    builder.append_value(0, value)
    value[:] = b"b" * 10  # the caller reuses its buffer before the batch is built
    assert [r.value for r in records.decode_records(builder.build().to_bytes())] == [b"a" * 10] * 2


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=978_307_200, max_value=4_102_444_800), st.integers(min_value=-3, max_value=3))
def test_run_bounds_are_what_time_time_reads_at_the_millisecond_bounds(seconds, offset_ns):
    """The producer tests time.time() against a run's bounds; they must be the floats CPython's time.time()
    returns at those nanoseconds (``_PyTime_AsSecondsDouble``: whole seconds exactly, else ns / 1e9)."""
    from copyless.protocol.batch_builder import _clock_seconds

    for ns in (seconds * 1_000_000_000 + offset_ns, seconds * 1_000_000_000 + 123_000_000 + offset_ns):
        expected = float(ns // 1_000_000_000) if ns % 1_000_000_000 == 0 else float(ns) / 1e9
        assert _clock_seconds(ns) == expected
