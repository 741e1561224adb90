"""The two cases where the broker rewrites a producer's records instead of appending them as they came.

Every other batch goes to the log byte for byte (the broker rewrites only baseOffset, partitionLeaderEpoch
and, for LogAppendTime topics, maxTimestamp in place). These two are rebuilt here, in Python memory, as
Kafka's ``LogValidator`` rebuilds them:

1. **Message format v0/v1** (``MessageSet``, what Produce v0-v2 carry from clients older than Kafka 0.11, or
   from librdkafka told ``broker.version.fallback`` < 0.10.0 and ``api.version.request=false``):
   ``convert_message_set`` turns the messages into one RecordBatch v2 (Kafka 3.9 converts them the same way
   on append; Kafka 4 no longer takes them). Compressed wrapper messages are opened and their inner
   messages become the records. A v0 message has no timestamp: its record gets -1 (NO_TIMESTAMP), as in
   Kafka. The new batch has no producer id (v0/v1 have no idempotence).
2. **A topic ``compression.type`` that differs from the batch's codec** (``gzip``, ``snappy``, ``lz4``,
   ``zstd`` or ``uncompressed``; ``producer``, the default, keeps whatever the producer sent):
   ``recompress_batch`` decompresses the records blob and compresses it again with the topic's codec,
   keeping every header field but the attributes' codec bits, the length and the CRC.

Neither touches the read path: the rewritten batch is an ordinary v2 batch in the log and goes to consumers
by ``sendfile`` like any other. What they cost is the producer side's append-as-is: the broker holds the
records in Python memory, (de)compresses them and computes a new CRC (figures in docs/record-conversion.md).

MessageSet v0/v1 (big-endian)::

    int64 offset | int32 message size | uint32 crc (CRC-32 of magic..end) | int8 magic (0 or 1)
    | int8 attributes (bits 0-2 codec, bit 3 LogAppendTime in v1) | int64 timestamp (v1 only)
    | int32 key length (-1 = null) | key | int32 value length (-1 = null) | value

A compressed message's value is a compressed MessageSet of the inner messages. LZ4 in magic 0 carries a
frame header checksum computed over the wrong bytes (KAFKA-3160); it is recomputed before decompressing.

Pure: bytes in, bytes out. Malformed input raises ``RecordConversionError`` with CORRUPT_MESSAGE (2) for a bad
checksum or framing and INVALID_RECORD (87) otherwise.
"""

from __future__ import annotations

import struct
import zlib

import cramjam
from kio.schema.errors import ErrorCode

from copyless.broker.errors import BrokerError
from copyless.protocol.batch_builder import BatchBuilder, compress
from copyless.protocol.records import (
    ATTRIBUTES_OFFSET,
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_MASK,
    CODEC_NONE,
    CODEC_SNAPPY,
    CODEC_ZSTD,
    CRC_OFFSET,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    crc32c,
)

__all__ = [
    "RecordConversionError",
    "COMPRESSION_TYPES",
    "is_message_set",
    "convert_message_set",
    "target_codec",
    "recompress_batch",
    "bounded_decompress",
]

# Topic compression.type values (Kafka's BrokerCompressionType) -> codec id; "producer" keeps the batch's.
COMPRESSION_TYPES = {"uncompressed": CODEC_NONE, "gzip": CODEC_GZIP, "snappy": CODEC_SNAPPY, "lz4": CODEC_LZ4,
                     "zstd": CODEC_ZSTD, "producer": None}
# One converted MessageSet may hold at most this many messages: a v2 batch's offset deltas are int32, and a
# message takes at least 26 bytes, so a request within max.message.bytes never comes near it.
MAX_MESSAGES = 1 << 31
# A compressed wrapper's inner MessageSet may expand to at most this many bytes, so that a small gzip bomb
# in a Produce request cannot take the broker's memory (1 GiB of zeros gzips to 1 MB). 64 times Kafka's
# default max.message.bytes; a larger pre-0.11 message set gets INVALID_RECORD.
MAX_INFLATED_BYTES = 64 << 20

_MESSAGE_HEADER = struct.Struct(">qiIbb")  # offset, size, crc, magic, attributes
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")
_LOG_APPEND_TIME_V1 = 0x08
_MESSAGE_OVERHEAD_V0 = 8 + 4 + 4 + 1 + 1 + 4 + 4  # offset, size, crc, magic, attributes, key/value lengths


class RecordConversionError(BrokerError):
    code = ErrorCode.invalid_record


def is_message_set(records) -> bool:
    """True when ``records`` starts with a v0/v1 message rather than a v2 batch (the magic byte sits at the
    same position, 16, in both formats)."""
    return len(records) > MAGIC_OFFSET and records[MAGIC_OFFSET] < 2


def convert_message_set(records, *, codec: int | None) -> bytes:
    """One RecordBatch v2 holding every message of the v0/v1 ``records``, in order.

    Args:
        codec: the batch's codec; None keeps the producer's (the first message's codec), as
            ``compression.type=producer`` does in Kafka.

    Raises:
        RecordConversionError: truncated, bad CRC, unknown magic or codec, nested compression, or too large.
    """
    messages = list(_iter_messages(memoryview(records), outer_magic=None))
    if not messages:
        raise RecordConversionError(ErrorCode.invalid_record, "a Produce request's MessageSet holds no message")
    if len(messages) >= MAX_MESSAGES:
        raise RecordConversionError(ErrorCode.invalid_record, f"{len(messages)} messages in one MessageSet")
    if codec is None:
        codec = _producer_codec(records)
    builder = BatchBuilder(batch_size=1 << 62, codec=codec)
    for timestamp, key, value in messages:
        builder.append(timestamp, key, value)
    return builder.build().to_bytes()


def _producer_codec(records) -> int:
    attributes = records[MAGIC_OFFSET + 1]
    return attributes & CODEC_MASK


def _iter_messages(view: memoryview, outer_magic: int | None):
    """Yield (timestamp, key, value) of each message, opening compressed wrappers (one level deep)."""
    position = 0
    end = len(view)
    while position < end:
        if end - position < LOG_OVERHEAD:
            raise RecordConversionError(ErrorCode.corrupt_message, f"truncated message at {position}")
        (size,) = _I32.unpack_from(view, position + LENGTH_OFFSET)
        if size < _MESSAGE_OVERHEAD_V0 - LOG_OVERHEAD or size > end - position - LOG_OVERHEAD:
            raise RecordConversionError(ErrorCode.corrupt_message, f"bad message size {size} at {position}")
        message_end = position + LOG_OVERHEAD + size
        _offset, _size, crc, magic, attributes = _MESSAGE_HEADER.unpack_from(view, position)
        if magic not in (0, 1):
            raise RecordConversionError(ErrorCode.invalid_record,
                                        f"message magic {magic} at {position} in a MessageSet of magic 0/1")
        if outer_magic is not None and magic != outer_magic:
            raise RecordConversionError(ErrorCode.invalid_record, "Log record magic does not match outer magic")
        if zlib.crc32(view[position + 16 : message_end]) != crc:
            raise RecordConversionError(ErrorCode.corrupt_message, f"message at {position} fails its CRC")
        cursor = position + 18
        timestamp = -1
        if magic == 1:
            if message_end - cursor < 8:
                raise RecordConversionError(ErrorCode.corrupt_message, f"truncated message at {position}")
            (timestamp,) = _I64.unpack_from(view, cursor)
            cursor += 8
        key, cursor = _read_bytes(view, cursor, message_end)
        value, cursor = _read_bytes(view, cursor, message_end)
        if cursor != message_end:
            raise RecordConversionError(ErrorCode.corrupt_message, f"message at {position} has trailing bytes")
        codec = attributes & CODEC_MASK
        if codec == CODEC_NONE:
            yield timestamp, key, value
        else:
            if outer_magic is not None:
                raise RecordConversionError(ErrorCode.invalid_record, "nested compressed messages")
            if value is None:
                raise RecordConversionError(ErrorCode.invalid_record, "a compressed message without a value")
            inner = _inflate(codec, value, magic)
            log_append_time = timestamp if magic == 1 and attributes & _LOG_APPEND_TIME_V1 else None
            for inner_timestamp, inner_key, inner_value in _iter_messages(memoryview(inner), outer_magic=magic):
                yield (inner_timestamp if log_append_time is None else log_append_time), inner_key, inner_value
        position = message_end


def _read_bytes(view: memoryview, cursor: int, end: int) -> tuple[bytes | None, int]:
    if end - cursor < 4:
        raise RecordConversionError(ErrorCode.corrupt_message, f"truncated message at {cursor}")
    (length,) = _I32.unpack_from(view, cursor)
    cursor += 4
    if length < 0:
        return None, cursor
    if length > end - cursor:
        raise RecordConversionError(ErrorCode.corrupt_message, f"key or value of {length} bytes overruns its message")
    return bytes(view[cursor : cursor + length]), cursor + length


def _inflate(codec: int, data: bytes, magic: int) -> bytes:
    if codec == CODEC_LZ4 and magic == 0:
        data = _fix_lz4_header_checksum(data)
    if codec not in (CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4):
        raise RecordConversionError(ErrorCode.corrupt_message, f"codec {codec} in message format v{magic}")
    return bounded_decompress(codec, data)


# The first output buffer a bounded LZ4 or zstd decompression tries, as a multiple of the input: record
# batches of text or JSON compress 3-10x, so one buffer nearly always does; a larger output is retried once
# with a MAX_INFLATED_BYTES buffer.
_FIRST_GUESS_RATIO = 16
_FIRST_GUESS_MIN_BYTES = 1 << 20
_TOO_SMALL = "failed to write whole buffer"


def bounded_decompress(codec: int, data) -> bytes:
    """Decompress a producer's blob, refusing one that inflates past MAX_INFLATED_BYTES before it does.

    Raises:
        RecordConversionError: CORRUPT_MESSAGE when the data does not decompress, INVALID_RECORD when it
            inflates past the limit.
    """
    data = bytes(data)
    too_large = RecordConversionError(ErrorCode.invalid_record,
                                      f"a compressed blob inflates past {MAX_INFLATED_BYTES} bytes")
    try:
        if codec == CODEC_GZIP:
            # Streamed with a cap (what gzip.decompress would inflate whole).
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            out = inflater.decompress(data, MAX_INFLATED_BYTES)
            if inflater.unconsumed_tail:
                raise too_large
            if not inflater.eof:
                raise RecordConversionError(ErrorCode.corrupt_message, "gzip: truncated stream")
            return out
        if codec == CODEC_SNAPPY:
            # Raw snappy states its length up front; xerial framing (the Java client's) is raw chunks.
            chunks = _xerial_chunks(data) if data.startswith(_XERIAL_MAGIC) else [data]
            if sum(cramjam.snappy.decompress_raw_len(chunk) for chunk in chunks) > MAX_INFLATED_BYTES:
                raise too_large
            return b"".join(bytes(cramjam.snappy.decompress_raw(chunk)) for chunk in chunks)
        if codec in (CODEC_LZ4, CODEC_ZSTD):
            module = cramjam.lz4 if codec == CODEC_LZ4 else cramjam.zstd
            size = min(MAX_INFLATED_BYTES, max(_FIRST_GUESS_RATIO * len(data), _FIRST_GUESS_MIN_BYTES))
            while True:
                inflated = bytearray(size)
                try:
                    written = module.decompress_into(data, inflated)
                except Exception as exc:
                    if _TOO_SMALL not in str(exc):
                        raise
                    if size >= MAX_INFLATED_BYTES:
                        raise too_large from None
                    size = MAX_INFLATED_BYTES
                    continue
                del inflated[written:]
                return bytes(inflated)
    except RecordConversionError:
        raise
    except Exception as exc:  # each codec library has its own error types
        raise RecordConversionError(ErrorCode.corrupt_message, f"codec {codec}: {exc}") from None
    raise RecordConversionError(ErrorCode.corrupt_message, f"unknown codec {codec}")


_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _xerial_chunks(data: bytes) -> list[bytes]:
    chunks, position = [], 16  # magic, version, compatible version
    while position < len(data):
        (length,) = _I32.unpack_from(data, position)
        position += 4
        if length < 0 or position + length > len(data):
            raise RecordConversionError(ErrorCode.corrupt_message, "snappy: bad xerial chunk")
        chunks.append(data[position : position + length])
        position += length
    return chunks


_XXH_PRIME1, _XXH_PRIME2, _XXH_PRIME3, _XXH_PRIME4, _XXH_PRIME5 = (
    2654435761, 2246822519, 3266489917, 668265263, 374761393)
_MASK32 = 0xFFFFFFFF


def _xxh32_short(data: bytes) -> int:
    """XXH32 with seed 0 of fewer than 16 bytes (an LZ4 frame descriptor is 2 to 14)."""
    assert len(data) < 16
    h = (_XXH_PRIME5 + len(data)) & _MASK32
    position = 0
    while len(data) - position >= 4:
        (word,) = struct.unpack_from("<I", data, position)
        h = (h + word * _XXH_PRIME3) & _MASK32
        h = (((h << 17) | (h >> 15)) & _MASK32) * _XXH_PRIME4 & _MASK32
        position += 4
    for byte in data[position:]:
        h = (h + byte * _XXH_PRIME5) & _MASK32
        h = (((h << 11) | (h >> 21)) & _MASK32) * _XXH_PRIME1 & _MASK32
    h ^= h >> 15
    h = h * _XXH_PRIME2 & _MASK32
    h ^= h >> 13
    h = h * _XXH_PRIME3 & _MASK32
    h ^= h >> 16
    return h


def _fix_lz4_header_checksum(data: bytes) -> bytes:
    """Kafka's magic-0 LZ4 frames (KAFKA-3160) checksum the descriptor with the magic number included: put the
    checksum the LZ4 frame format defines in its place (bytes 4.. are FLG, BD, [content size], [dict id])."""
    if len(data) < 7 or data[:4] != b"\x04\x22\x4d\x18":
        return data
    flags = data[4]
    descriptor_end = 6 + (8 if flags & 0x08 else 0) + (4 if flags & 0x01 else 0)
    if len(data) <= descriptor_end:
        return data
    checksum = (_xxh32_short(data[4:descriptor_end]) >> 8) & 0xFF
    return data[:descriptor_end] + bytes([checksum]) + data[descriptor_end + 1:]


def target_codec(compression_type: str, batch_codec: int) -> int | None:
    """The codec a batch must be stored with under topic ``compression_type``, or None to keep it as sent."""
    codec = COMPRESSION_TYPES[compression_type]
    return None if codec is None or codec == batch_codec else codec


def recompress_batch(records, header: BatchHeader, codec: int) -> bytes:
    """The v2 batch ``records`` (one whole batch, already validated) with its records blob in ``codec``.

    Raises:
        RecordConversionError(CORRUPT_MESSAGE): the blob does not decompress.
    """
    with memoryview(records) as view:
        payload = view[RECORD_BATCH_OVERHEAD : header.size]
        raw = bounded_decompress(header.codec, payload) if header.codec != CODEC_NONE else bytes(payload)
        blob = compress(codec, raw) if codec != CODEC_NONE else raw
        out = bytearray(view[:RECORD_BATCH_OVERHEAD])
    out += blob
    _I32.pack_into(out, LENGTH_OFFSET, len(out) - LOG_OVERHEAD)
    _I16.pack_into(out, ATTRIBUTES_OFFSET, (header.attributes & ~CODEC_MASK) | codec)
    _U32.pack_into(out, CRC_OFFSET, crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)
