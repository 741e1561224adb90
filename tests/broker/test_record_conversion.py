"""broker.record_conversion: MessageSet v0/v1 -> RecordBatch v2, and recompression for compression.type.

The inputs come from the suite's own encoders (tests/support/batches.py), the outputs are read back with the
suite's own reader, so copyless's builder and decoder cannot cancel each other's bugs out. Invariants:

- every message comes out as one record, in order, offsets 0..n-1, key and value unchanged; a v1 message
  keeps its timestamp, a v0 message gets -1, a v1 LogAppendTime wrapper gives its timestamp to every record;
- a recompressed batch has the same records and header fields, the new codec, a valid CRC;
- any bytes either convert or raise RecordConversionError, never anything else (the h11 fuzz invariant).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from copyless.broker.record_conversion import (
    MAX_INFLATED_BYTES,
    RecordConversionError,
    convert_message_set,
    is_message_set,
    recompress_batch,
    target_codec,
)
from copyless.protocol.records import read_header, validate_batch
from tests.support import batches
from tests.support.batches import GZIP, LZ4, NONE, SNAPPY, ZSTD

CODECS = (NONE, GZIP, SNAPPY, LZ4)


def _records(batch: bytes):
    (header,) = batches.batch_headers(batch)
    return header, batches.records_of(batch)


@pytest.mark.parametrize("codec", CODECS, ids=[batches.CODEC_NAMES[c] for c in CODECS])
@pytest.mark.parametrize("magic", [0, 1])
def test_message_set_becomes_one_v2_batch(magic, codec):
    messages = [(1_700_000_000_000 + 7 * i if magic else None, b"k%d" % i if i % 3 else None, b"v%d" % i)
                for i in range(25)]
    messages[4] = (messages[4][0], b"key", None)  # a null value (a tombstone) survives
    legacy = batches.message_set(messages, magic=magic, codec=codec)
    assert is_message_set(legacy)
    batch = convert_message_set(legacy, codec=None)
    assert validate_batch(batch).producer_id == -1
    header, records = _records(batch)
    assert header.magic == 2 and header.codec == batches.CODEC_NAMES[codec]
    assert header.records_count == len(messages)
    assert [(r.offset, r.key, r.value) for r in records] == [(i, k, v) for i, (_, k, v) in enumerate(messages)]
    expected = [t for t, _, _ in messages] if magic else [-1] * len(messages)
    assert [r.timestamp for r in records] == expected


def test_log_append_time_wrapper_stamps_every_record():
    messages = [(1_000 + i, None, b"v%d" % i) for i in range(3)]
    wrapper_time = max(t for t, _, _ in messages)
    header, records = _records(convert_message_set(batches.message_set(messages, magic=1, codec=GZIP,
                                                                        log_append_time=True), codec=None))
    assert [r.timestamp for r in records] == [wrapper_time] * 3


def test_magic0_lz4_with_a_correct_header_checksum_converts_too():
    messages = [(None, None, b"x" * 100)] * 4
    legacy = batches.message_set(messages, magic=0, codec=LZ4, kafka_lz4_checksum=False)
    assert [r.value for r in _records(convert_message_set(legacy, codec=None))[1]] == [b"x" * 100] * 4


def test_convert_into_the_topic_codec():
    legacy = batches.message_set([(5, b"k", b"v" * 500)] * 10, magic=1, codec=SNAPPY)
    header, records = _records(convert_message_set(legacy, codec=ZSTD))
    assert header.codec == "zstd" and [r.value for r in records] == [b"v" * 500] * 10


@pytest.mark.parametrize("mutate,code", [
    (lambda b: b[:-1], ErrorCode.corrupt_message),                                   # truncated
    (lambda b: b[:20] + bytes([b[20] ^ 1]) + b[21:], ErrorCode.corrupt_message),     # CRC fails
    (lambda b: b[:16] + b"\x05" + b[17:], ErrorCode.invalid_record),                 # unknown magic
    (lambda b: b[:8] + b"\x7f\xff\xff\xff" + b[12:], ErrorCode.corrupt_message),     # size overruns
])
def test_malformed_message_sets_are_refused(mutate, code):
    legacy = batches.message_set([(1, b"k", b"value")], magic=1)
    with pytest.raises(RecordConversionError) as raised:
        convert_message_set(mutate(legacy), codec=None)
    assert raised.value.code == code


def test_inner_magic_must_match_the_wrapper():
    inner_v1 = batches.message_set([(1, None, b"a")], magic=1)
    wrapper = batches.message_set([(None, None, b"placeholder")], magic=0)
    # A v0 wrapper whose gzip value holds v1 messages: Kafka's "Log record magic does not match outer magic".
    import gzip
    import struct
    import zlib

    body = struct.pack(">bb", 0, GZIP) + struct.pack(">i", -1) + struct.pack(">i", len(gzip.compress(inner_v1)))
    body += gzip.compress(inner_v1)
    wrapper = struct.pack(">qi", 0, len(body) + 4) + struct.pack(">I", zlib.crc32(body)) + body
    with pytest.raises(RecordConversionError) as raised:
        convert_message_set(wrapper, codec=None)
    assert raised.value.code == ErrorCode.invalid_record


def test_a_gzip_bomb_stops_at_the_inflate_limit():
    import struct
    import zlib

    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    bomb = b"".join([deflate.compress(zeros) for _ in range(MAX_INFLATED_BYTES >> 20)] + [deflate.compress(b"\x00"),
                                                                                         deflate.flush()])
    body = struct.pack(">bbq", 1, GZIP, 0) + struct.pack(">i", -1) + struct.pack(">i", len(bomb)) + bomb
    message = struct.pack(">qi", 0, len(body) + 4) + struct.pack(">I", zlib.crc32(body)) + body
    with pytest.raises(RecordConversionError) as raised:
        convert_message_set(message, codec=None)
    assert raised.value.code == ErrorCode.invalid_record


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=300), magic=st.sampled_from([0, 1]))
def test_any_bytes_convert_or_raise_conversion_error(data, magic):
    # Start from a well-formed set half the time so the fuzzing reaches past the first length check.
    if data[:1] == b"\x00":
        legacy = bytearray(batches.message_set([(1, b"k", data)], magic=magic, codec=GZIP))
        for i, byte in enumerate(data[1:40]):
            legacy[(i * 7) % len(legacy)] ^= byte
        data = bytes(legacy)
    try:
        batch = convert_message_set(data, codec=None)
    except RecordConversionError:
        return
    validate_batch(batch)


@given(messages=st.lists(st.tuples(st.integers(0, 1 << 45), st.none() | st.binary(max_size=40),
                                   st.none() | st.binary(max_size=200)), min_size=1, max_size=30),
       codec=st.sampled_from(CODECS))
@settings(max_examples=60, deadline=None)
def test_v1_conversion_keeps_every_field(messages, codec):
    header, records = _records(convert_message_set(batches.message_set(messages, magic=1, codec=codec), codec=None))
    assert [(r.offset, r.timestamp, r.key, r.value) for r in records] == [
        (i, t, k, v) for i, (t, k, v) in enumerate(messages)]


_ALL = (NONE, GZIP, SNAPPY, LZ4, ZSTD)


@pytest.mark.parametrize("source,target", [(s, t) for s in _ALL for t in _ALL if s != t],
                         ids=[f"{batches.CODEC_NAMES[s]}-{batches.CODEC_NAMES[t]}"
                              for s in _ALL for t in _ALL if s != t])
def test_recompress_keeps_records_and_header(source, target):
    values = [b"value-%d" % i * (i % 5 + 1) for i in range(40)]
    batch = batches.build_batch(values, keys=[b"k%d" % i for i in range(40)], codec=source, producer_id=42,
                                producer_epoch=3, base_sequence=17, timestamp_step_ms=3)
    original = read_header(batch)
    rewritten = recompress_batch(batch, original, target)
    header = validate_batch(rewritten)
    assert header.codec == target
    for name in ("producer_id", "producer_epoch", "base_sequence", "records_count", "last_offset_delta",
                 "base_timestamp", "max_timestamp", "base_offset"):
        assert getattr(header, name) == getattr(original, name), name
    assert batches.records_of(rewritten) == batches.records_of(batch)


def test_target_codec_keeps_what_needs_no_rewrite():
    assert target_codec("producer", GZIP) is None
    assert target_codec("gzip", GZIP) is None
    assert target_codec("lz4", GZIP) == LZ4
    assert target_codec("uncompressed", ZSTD) == NONE


def test_recompress_refuses_a_blob_that_does_not_decompress():
    batch = batches.frame_batch(b"not gzip at all", records_count=1, attributes=GZIP)
    with pytest.raises(RecordConversionError) as raised:
        recompress_batch(batch, read_header(batch), LZ4)
    assert raised.value.code == ErrorCode.corrupt_message


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD], ids=["gzip", "snappy", "lz4", "zstd"])
def test_recompress_refuses_a_blob_that_inflates_past_the_limit(codec):
    # Zeros past the limit compress to a few hundred KB: a bomb a producer could send to a topic whose
    # compression.type makes the broker open it.
    blob = batches.compress(codec, bytes(MAX_INFLATED_BYTES + 1))
    assert len(blob) < MAX_INFLATED_BYTES // 16
    batch = batches.frame_batch(blob, records_count=1, attributes=codec)
    with pytest.raises(RecordConversionError) as raised:
        recompress_batch(batch, read_header(batch), NONE if codec != NONE else GZIP)
    assert raised.value.code == ErrorCode.invalid_record
