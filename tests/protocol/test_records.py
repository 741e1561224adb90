"""RecordBatch v2 core: round trips against kafka-python's independent implementation, and the rule that any
byte string either validates or raises InvalidBatchError — never anything else."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from copyless.protocol import records as R

record_st = st.tuples(
    st.integers(min_value=0, max_value=10_000),  # timestamp delta
    st.one_of(st.none(), st.binary(max_size=40)),  # key
    st.one_of(st.none(), st.binary(max_size=300)),  # value
    st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=3),
)


def build(records, *, codec=R.CODEC_NONE, base_timestamp=1_700_000_000_000, producer_id=-1, base_sequence=-1):
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=base_sequence,
        batch_size=1 << 22,
    )
    for offset, (delta, key, value, headers) in enumerate(records):
        builder.append(offset, timestamp=base_timestamp + delta, key=key, value=value, headers=headers)
    return bytearray(builder.build())


@settings(max_examples=60, deadline=None)
@given(st.lists(record_st, min_size=1, max_size=20), st.sampled_from([R.CODEC_NONE, R.CODEC_GZIP]))
def test_decode_matches_kafka_python(records, codec):
    batch = build(records, codec=codec)
    header = R.validate_batch(batch)
    assert header.records_count == len(records)
    assert header.size == len(batch)
    # kafka-python sends a batch uncompressed when compressing would not shrink it.
    assert header.codec in (codec, R.CODEC_NONE)
    ours = R.decode_records(batch)
    theirs = list(DefaultRecordBatch(bytes(batch)))
    assert [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in ours] == [
        (r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in theirs
    ]


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=2**62), st.integers(min_value=-1, max_value=2**31 - 1))
def test_base_offset_and_epoch_rewrite_keep_crc(base_offset, epoch):
    batch = build([(0, b"k", b"v", [])] * 3)
    R.set_base_offset(batch, 0, base_offset)
    R.set_leader_epoch(batch, 0, epoch)
    header = R.validate_batch(batch)  # CRC still valid: both fields lie before byte 21
    assert header.base_offset == base_offset
    assert header.partition_leader_epoch == epoch
    assert header.last_offset == base_offset + 2
    assert [r.offset for r in R.decode_records(batch)] == [base_offset, base_offset + 1, base_offset + 2]


def test_log_append_time_rewrites_timestamps_and_crc():
    batch = build([(5, None, b"a", []), (9, None, b"b", [])])
    before = R.read_header(batch).crc
    R.set_log_append_time(batch, 0, len(batch), 1234)
    header = R.validate_batch(batch)
    assert header.crc != before
    assert header.is_log_append_time and header.max_timestamp == 1234
    assert [r.timestamp for r in R.decode_records(batch)] == [1234, 1234]
    # kafka-python agrees that the rewritten batch is valid and reads LogAppendTime.
    parsed = DefaultRecordBatch(bytes(batch))
    assert parsed.validate_crc()
    assert [r.timestamp for r in parsed] == [1234, 1234]


@pytest.mark.parametrize("codec", [R.CODEC_SNAPPY, R.CODEC_LZ4, R.CODEC_ZSTD])
def test_compressed_codecs_decode(codec):
    import cramjam

    plain = build([(i, b"key%d" % i, b"value" * i, []) for i in range(10)])
    header = R.read_header(plain)
    payload = bytes(plain[R.RECORD_BATCH_OVERHEAD :])
    blob = {
        R.CODEC_SNAPPY: lambda: bytes(cramjam.snappy.compress_raw(payload)),
        R.CODEC_LZ4: lambda: bytes(cramjam.lz4.compress(payload)),
        R.CODEC_ZSTD: lambda: bytes(cramjam.zstd.compress(payload)),
    }[codec]()
    # Re-frame the same records as a compressed batch by hand: attributes carry the codec, CRC recomputed.
    body = bytearray(plain[: R.RECORD_BATCH_OVERHEAD]) + blob
    struct.pack_into(">i", body, R.LENGTH_OFFSET, len(body) - R.LOG_OVERHEAD)
    struct.pack_into(">h", body, R.ATTRIBUTES_OFFSET, header.attributes | codec)
    struct.pack_into(">I", body, R.CRC_OFFSET, R.crc32c(bytes(body[R.ATTRIBUTES_OFFSET :])))
    assert R.validate_batch(body).codec == codec
    assert [(r.key, r.value) for r in R.decode_records(body)] == [(r.key, r.value) for r in R.decode_records(plain)]


def test_xerial_snappy_framing_decodes():
    import cramjam

    payload = b"x" * 5000 + b"y" * 5000
    chunks = [payload[:4000], payload[4000:]]
    framed = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for chunk in chunks:
        block = bytes(cramjam.snappy.compress_raw(chunk))
        framed += struct.pack(">i", len(block)) + block
    assert R.decompress(R.CODEC_SNAPPY, framed) == payload


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda b: b[:40], "truncated header"),
        (lambda b: b[:-1], "truncated batch"),
        (lambda b: b[:16] + b"\x01" + b[17:], "bad magic"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 0xFF]), "bad crc"),
        (lambda b: b[:8] + struct.pack(">i", 10) + b[12:], "bad length"),
    ],
)
def test_validate_names_the_broken_rule(mutate, reason):
    batch = bytes(build([(0, b"k", b"v", [])] * 2))
    with pytest.raises(R.InvalidBatchError) as info:
        R.validate_batch(mutate(batch))
    assert info.value.reason == reason


def test_bad_count_detected_even_with_valid_crc():
    batch = build([(0, b"k", b"v", [])] * 2)
    struct.pack_into(">i", batch, 57, 3)  # recordsCount 3 but lastOffsetDelta 1
    struct.pack_into(">I", batch, R.CRC_OFFSET, R.crc32c(bytes(batch[R.ATTRIBUTES_OFFSET :])))
    with pytest.raises(R.InvalidBatchError) as info:
        R.validate_batch(batch)
    assert info.value.reason == "bad count"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_validate_or_raise_invalid_batch(data):
    try:
        header = R.validate_batch(data)
    except R.InvalidBatchError:
        return
    assert header.size <= len(data)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_batches_validate_or_raise_invalid_batch(data):
    batch = bytearray(build([(1, b"key", b"value" * 4, [("h", b"1")])] * 3))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        index = data.draw(st.integers(min_value=0, max_value=len(batch) - 1))
        batch[index] = data.draw(st.integers(min_value=0, max_value=255))
    try:
        R.validate_batch(batch)
    except R.InvalidBatchError:
        return
    # A mutation that keeps the batch valid must leave records decodable or raise InvalidBatchError.
    try:
        R.decode_records(batch)
    except R.InvalidBatchError:
        pass


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=6), st.integers(min_value=0, max_value=200))
def test_iter_batches_stops_at_partial_tail(counts, cut):
    blobs = [bytes(build([(0, b"k", b"v", [])] * n)) for n in counts]
    joined = b"".join(blobs)
    truncated = joined[: max(0, len(joined) - cut)]
    found = [h.records_count for _, h in R.iter_batches(truncated)]
    # Exactly the batches that fit whole are yielded, in order.
    expected, total = [], 0
    for blob, n in zip(blobs, counts, strict=True):
        total += len(blob)
        if total <= len(truncated):
            expected.append(n)
    assert found == expected
