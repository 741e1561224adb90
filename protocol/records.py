"""Kafka RecordBatch (magic v2): the header, its checksum, and the in-place rewrites a broker makes.

This module is the one RecordBatch implementation in copyless: the broker (validation on produce, offset
assignment, recovery scans, timestamp lookups) and the client (building and parsing batches) both import it,
as Kafka's broker imports its clients' record classes. It is pure: bytes in, values out; no I/O.

Wire and on-disk format (all big-endian, ``RECORD_BATCH_OVERHEAD`` = 61 bytes before the records)::

    offset size field
    0      8    baseOffset            rewritten by the broker (clients send 0)
    8      4    batchLength           bytes after this field: total size = batchLength + 12
    12     4    partitionLeaderEpoch  rewritten by the broker; outside the CRC on purpose
    16     1    magic = 2
    17     4    crc                   CRC-32C over [21, end)
    21     2    attributes            bits 0-2 codec, 3 LogAppendTime, 4 transactional, 5 control
    23     4    lastOffsetDelta
    27     8    baseTimestamp
    35     8    maxTimestamp          rewritten for LogAppendTime topics (then the CRC is recomputed)
    43     8    producerId            -1 when not idempotent
    51     2    producerEpoch
    53     4    baseSequence
    57     4    recordsCount
    61     ...  records               one compressed blob when the codec is not 0

Each record: ``length varint, attributes int8, timestampDelta varlong, offsetDelta varint, keyLen varint
(-1 = null), key, valueLen varint, value, headerCount varint, [hKeyLen varint, hKey, hValLen varint, hVal]``,
varints zig-zag encoded.

Storage never decodes records: appends rewrite ``baseOffset`` (and ``partitionLeaderEpoch``) in place, and
these rewrites leave the CRC untouched because both fields lie before byte 21.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

import crc32c as _crc32c

__all__ = [
    "BASE_OFFSET_OFFSET",
    "LENGTH_OFFSET",
    "LEADER_EPOCH_OFFSET",
    "MAGIC_OFFSET",
    "CRC_OFFSET",
    "ATTRIBUTES_OFFSET",
    "LOG_OVERHEAD",
    "RECORD_BATCH_OVERHEAD",
    "CODEC_MASK",
    "CODEC_NONE",
    "CODEC_GZIP",
    "CODEC_SNAPPY",
    "CODEC_LZ4",
    "CODEC_ZSTD",
    "TIMESTAMP_TYPE_BIT",
    "TRANSACTIONAL_BIT",
    "CONTROL_BIT",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "BatchHeader",
    "InvalidBatchError",
    "crc32c",
    "read_header",
    "batch_size_at",
    "check_crc",
    "validate_batch",
    "set_base_offset",
    "set_leader_epoch",
    "set_log_append_time",
    "iter_batches",
    "Record",
    "encode_varint",
    "read_varint",
    "decode_records",
    "iter_record_timestamps",
]

BASE_OFFSET_OFFSET = 0
LENGTH_OFFSET = 8
LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
BASE_TIMESTAMP_OFFSET = 27
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43
RECORDS_COUNT_OFFSET = 57
# baseOffset + batchLength: the part of a batch that batchLength does not count.
LOG_OVERHEAD = 12
RECORD_BATCH_OVERHEAD = 61

CODEC_MASK = 0x07
CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = 0, 1, 2, 3, 4
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20

NO_PRODUCER_ID = -1
NO_SEQUENCE = -1

# One struct for the whole 61-byte header: a single unpack costs ~0.3 us, against ~2 us for field-by-field
# int.from_bytes; recovery scans call it once per batch.
_HEADER = struct.Struct(">qiibIhiqqqhii")
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")
assert _HEADER.size == RECORD_BATCH_OVERHEAD

# What the codec reads batches from: bytes, a receive buffer, a view of either, or a segment's mmap.
Buffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap
# What it rewrites in place (offsets, epochs, timestamps before a batch is appended).
WritableBuffer: TypeAlias = bytearray | memoryview | mmap.mmap


def crc32c(data: Buffer) -> int:
    """CRC-32C (Castagnoli) of ``data`` (any buffer), as Kafka's ``Crc32C``."""
    return _crc32c.crc32c(data)


class InvalidBatchError(ValueError):
    """A byte range is not a well-formed v2 RecordBatch. ``reason`` names the broken rule.

    Maps to CORRUPT_MESSAGE (2) for a bad checksum or framing and INVALID_RECORD (87) otherwise.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class BatchHeader(NamedTuple):
    """The 61-byte RecordBatch header, decoded."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch on the wire / on disk."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def codec(self) -> int:
        return self.attributes & CODEC_MASK

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_BIT)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def last_sequence(self) -> int:
        """The sequence of the batch's last record (sequences wrap at 2**31, as Kafka's)."""
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) % (1 << 31)


def read_header(buf: Buffer, position: int = 0) -> BatchHeader:
    """Decode the header of the batch starting at ``position`` in ``buf``.

    Raises:
        InvalidBatchError: fewer than 61 bytes remain ("truncated header").
    """
    if len(buf) - position < RECORD_BATCH_OVERHEAD:
        raise InvalidBatchError("truncated header", f"{len(buf) - position} bytes at {position}")
    return BatchHeader._make(_HEADER.unpack_from(buf, position))


def batch_size_at(buf: Buffer, position: int = 0) -> int | None:
    """Total size of the batch at ``position`` from its length field, or None if 12 bytes aren't there yet."""
    if len(buf) - position < LOG_OVERHEAD:
        return None
    size: int = _I32.unpack_from(buf, position + LENGTH_OFFSET)[0]
    return size + LOG_OVERHEAD


def check_crc(buf: Buffer, position: int, size: int, header: BatchHeader | None = None) -> bool:
    """True when the stored CRC-32C matches bytes [position+21, position+size) of ``buf``."""
    stored = header.crc if header is not None else _U32.unpack_from(buf, position + CRC_OFFSET)[0]
    with memoryview(buf) as view:
        return crc32c(view[position + ATTRIBUTES_OFFSET : position + size]) == stored


def validate_batch(buf: Buffer, position: int = 0, *, limit: int | None = None, cleaned: bool = False) -> BatchHeader:
    """Check framing, magic, CRC and the count rule of the batch at ``position``; return its header.

    The checks are Kafka's shallow produce-path checks (``UnifiedLog.analyzeAndValidateRecords``,
    ``LogValidator.validateBatch``) and the recovery-path ones (``LogSegment.recover``): they read the header
    and checksum the body, and never decode records.

    Args:
        buf: any buffer holding the batch.
        position: where the batch starts.
        limit: the end of the valid region (default: ``len(buf)``).
        cleaned: the batch comes from a log (recovery, a leader's fetch), where compaction may have left it
            fewer records than its offset range (down to none: a producer's last batch kept empty); a
            producer's batch (False) must hold exactly ``lastOffsetDelta + 1``.

    Raises:
        InvalidBatchError: with ``reason`` one of "truncated header", "bad length", "truncated batch",
            "bad magic", "bad crc", "bad count".
    """
    end = len(buf) if limit is None else limit
    if end - position < RECORD_BATCH_OVERHEAD:
        raise InvalidBatchError("truncated header", f"{end - position} bytes at {position}")
    header = BatchHeader._make(_HEADER.unpack_from(buf, position))
    if header.batch_length < RECORD_BATCH_OVERHEAD - LOG_OVERHEAD:
        raise InvalidBatchError("bad length", f"batchLength {header.batch_length} at {position}")
    if header.size > end - position:
        raise InvalidBatchError("truncated batch", f"needs {header.size} bytes, {end - position} left at {position}")
    if header.magic != 2:
        raise InvalidBatchError("bad magic", f"magic {header.magic} at {position}")
    if not check_crc(buf, position, header.size, header):
        raise InvalidBatchError("bad crc", f"at {position}")
    if cleaned:
        if header.records_count < 0 or header.last_offset_delta < 0 or \
                header.records_count > header.last_offset_delta + 1:
            raise InvalidBatchError(
                "bad count", f"lastOffsetDelta {header.last_offset_delta}, recordsCount {header.records_count}")
    elif header.records_count <= 0 or header.last_offset_delta + 1 != header.records_count:
        raise InvalidBatchError(
            "bad count", f"lastOffsetDelta {header.last_offset_delta}, recordsCount {header.records_count}"
        )
    return header


def set_base_offset(buf: WritableBuffer, position: int, base_offset: int) -> None:
    """Rewrite baseOffset in place (outside the CRC: no recompute)."""
    _I64.pack_into(buf, position + BASE_OFFSET_OFFSET, base_offset)


def set_leader_epoch(buf: WritableBuffer, position: int, epoch: int) -> None:
    """Rewrite partitionLeaderEpoch in place (outside the CRC: no recompute)."""
    _I32.pack_into(buf, position + LEADER_EPOCH_OFFSET, epoch)


def set_log_append_time(buf: WritableBuffer, position: int, size: int, timestamp_ms: int) -> None:
    """Mark the batch LogAppendTime with ``timestamp_ms`` as its maxTimestamp, and recompute the CRC.

    Records keep their deltas; consumers use maxTimestamp for every record when the bit is set
    (``DefaultRecordBatch.setMaxTimestamp``).
    """
    attributes = _I16.unpack_from(buf, position + ATTRIBUTES_OFFSET)[0]
    _I16.pack_into(buf, position + ATTRIBUTES_OFFSET, attributes | TIMESTAMP_TYPE_BIT)
    _I64.pack_into(buf, position + MAX_TIMESTAMP_OFFSET, timestamp_ms)
    with memoryview(buf) as view:
        crc = crc32c(view[position + ATTRIBUTES_OFFSET : position + size])
    _U32.pack_into(buf, position + CRC_OFFSET, crc)


def iter_batches(buf: Buffer, position: int = 0, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for each complete batch in ``buf[position:end]``, without CRC checks.

    Stops silently at a trailing partial batch (as Kafka clients do with a byte-sliced fetch).
    """
    end = len(buf) if end is None else end
    while end - position >= RECORD_BATCH_OVERHEAD:
        header = BatchHeader._make(_HEADER.unpack_from(buf, position))
        if header.batch_length < RECORD_BATCH_OVERHEAD - LOG_OVERHEAD or header.size > end - position:
            return
        yield position, header
        position += header.size


# --- records -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record, with its absolute offset and timestamp."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


def encode_varint(value: int) -> bytes:
    """Zig-zag varint encoding (protobuf sint64) of ``value``, as record fields use it."""
    raw = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def read_varint(buf: Buffer, position: int) -> tuple[int, int]:
    """Zig-zag varint (up to 64 bits) at ``position``: returns (value, next position).

    Raises:
        InvalidBatchError: the varint runs off the end of ``buf`` or past 64 bits.
    """
    shift = 0
    raw = 0
    while True:
        try:
            byte = buf[position]
        except IndexError:
            raise InvalidBatchError("truncated record", f"varint at {position}") from None
        position += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), position
        shift += 7
        if shift > 63:
            raise InvalidBatchError("bad varint", f"at {position}")


def decompress(codec: int, data: Buffer) -> bytes:
    """Decompress a batch's records blob. Snappy accepts both raw and xerial-framed (Java client) data.

    Raises:
        InvalidBatchError: unknown codec or corrupt data ("bad compression").
    """
    if codec == CODEC_NONE:
        return bytes(data)
    try:
        if codec == CODEC_GZIP:
            import gzip

            return gzip.decompress(bytes(data))
        import cramjam

        if codec == CODEC_SNAPPY:
            raw = bytes(data)
            if raw.startswith(b"\x82SNAPPY\x00"):
                # xerial framing: 16-byte header, then (int32 length, raw snappy block) chunks.
                out = bytearray()
                position = 16
                while position < len(raw):
                    (length,) = _I32.unpack_from(raw, position)
                    position += 4
                    out += bytes(cramjam.snappy.decompress_raw(raw[position : position + length]))
                    position += length
                return bytes(out)
            return bytes(cramjam.snappy.decompress_raw(raw))
        if codec == CODEC_LZ4:
            return bytes(cramjam.lz4.decompress(bytes(data)))
        if codec == CODEC_ZSTD:
            return bytes(cramjam.zstd.decompress(bytes(data)))
    except InvalidBatchError:
        raise
    except Exception as exc:  # every codec library has its own error type
        raise InvalidBatchError("bad compression", f"codec {codec}: {exc}") from exc
    raise InvalidBatchError("bad compression", f"unknown codec {codec}")


def _records_payload(buf: Buffer, position: int, header: BatchHeader) -> bytes:
    start = position + RECORD_BATCH_OVERHEAD
    end = position + header.size
    with memoryview(buf) as view:
        payload = view[start:end]
        if header.codec == CODEC_NONE:
            return bytes(payload)
        return decompress(header.codec, payload)


def decode_records(buf: Buffer, position: int = 0) -> list[Record]:
    """Decode every record of the batch at ``position`` (decompressing when needed).

    LogAppendTime batches give every record the batch's maxTimestamp, as consumers do.

    Raises:
        InvalidBatchError: truncated or malformed records.
    """
    header = read_header(buf, position)
    data = _records_payload(buf, position, header)
    records: list[Record] = []
    cursor = 0
    append_time = header.max_timestamp if header.is_log_append_time else None
    for _ in range(header.records_count):
        length, cursor = read_varint(data, cursor)
        end = cursor + length
        if length < 0 or end > len(data):
            raise InvalidBatchError("truncated record", f"length {length} at {cursor}")
        cursor += 1  # attributes (unused)
        timestamp_delta, cursor = read_varint(data, cursor)
        offset_delta, cursor = read_varint(data, cursor)
        key_length, cursor = read_varint(data, cursor)
        key = None
        if key_length >= 0:
            key = bytes(data[cursor : cursor + key_length])
            cursor += key_length
        value_length, cursor = read_varint(data, cursor)
        value = None
        if value_length >= 0:
            value = bytes(data[cursor : cursor + value_length])
            cursor += value_length
        header_count, cursor = read_varint(data, cursor)
        headers = []
        for _h in range(header_count):
            hkey_length, cursor = read_varint(data, cursor)
            hkey = bytes(data[cursor : cursor + hkey_length]).decode("utf-8", "replace")
            cursor += hkey_length
            hvalue_length, cursor = read_varint(data, cursor)
            hvalue = None
            if hvalue_length >= 0:
                hvalue = bytes(data[cursor : cursor + hvalue_length])
                cursor += hvalue_length
            headers.append((hkey, hvalue))
        if cursor != end:
            raise InvalidBatchError("bad record", f"record ends at {cursor}, length says {end}")
        timestamp = append_time if append_time is not None else header.base_timestamp + timestamp_delta
        records.append(Record(header.base_offset + offset_delta, timestamp, key, value, tuple(headers)))
    return records


def iter_record_timestamps(buf: Buffer, position: int = 0) -> Iterator[tuple[int, int]]:
    """Yield ``(offset, timestamp)`` of each record in the batch at ``position``, in log order.

    Used by the broker's exact per-record timestamp lookup (Kafka ``FileRecords.searchForTimestamp``).
    """
    for record in decode_records(buf, position):
        yield record.offset, record.timestamp
