"""RecordBatch v2 bytes for tests, written and read independently of the code under test.

Owns the suite's one batch encoder (``build_batch``; ``keyed_batch`` and ``idempotent_batch`` are its
common forms, ``frame_batch`` frames any payload, records or not) and the reading side for what a broker
sends back (``batch_headers``, ``records_of``, ``values_of``). Nothing here imports copyless: the layout
follows Kafka's DefaultRecordBatch and DefaultRecord directly, so a bug in copyless's own batch builder or
records module cannot cancel out in a test. Shared with the broker only: crc32c (the checksum) and the
compression libraries (gzip, cramjam).

Layout, big-endian. The 61-byte batch header: baseOffset i64, batchLength i32 (bytes after this field),
partitionLeaderEpoch i32, magic i8, crc u32 (CRC-32C of attributes through the end), attributes i16 (bits
0-2 codec, bit 3 LogAppendTime, bit 4 transactional, bit 5 control), lastOffsetDelta i32, baseTimestamp
i64, maxTimestamp i64, producerId i64, producerEpoch i16, baseSequence i32, recordsCount i32. Then the
records (compressed as one blob when the codec says so), each: length varint, attributes i8,
timestampDelta varint, offsetDelta varint, key (varint length, -1 for null, bytes), value (likewise),
header count varint, and per header a key (varint length, UTF-8) and a value (varint length or -1).
Varints are zig-zag encoded, as in Kafka.
"""

from __future__ import annotations

import gzip
import struct
import time
import zlib
from dataclasses import dataclass
from typing import NamedTuple

import crc32c

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
LOG_APPEND_TIME_BIT = 0x08
HEADER_BYTES = 61
CRC_POSITION = 17
ATTRIBUTES_POSITION = 21  # the CRC covers from here to the batch's end
DEFAULT_BASE_TIMESTAMP_MS = 1_700_000_000_000

_HEAD = struct.Struct(">qiibI")  # baseOffset, batchLength, partitionLeaderEpoch, magic, crc
_AFTER_CRC = struct.Struct(">hiqqqhii")  # attributes .. recordsCount


# -- varints -------------------------------------------------------------------------------------------------
def uvarint(value: int) -> bytes:
    """An unsigned varint (7 bits a byte, low bits first), as the protocol's compact lengths use."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def varint(value: int) -> bytes:
    """A zig-zag varint, as record fields use (-1 for a null key or value)."""
    return uvarint(((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)


def _read_varint(data: bytes, cursor: int) -> tuple[int, int]:
    raw, shift = 0, 0
    while True:
        if cursor >= len(data):
            raise AssertionError(f"varint runs past the end of the records at {cursor}")
        byte = data[cursor]
        cursor += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), cursor
        shift += 7


# -- writing -------------------------------------------------------------------------------------------------
def encode_record(offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None) -> bytes:
    """One record (no headers), length-prefixed."""
    body = bytearray(b"\x00")
    body += varint(timestamp_delta)
    body += varint(offset_delta)
    body += varint(-1) if key is None else varint(len(key)) + key
    body += varint(-1) if value is None else varint(len(value)) + value
    body += varint(0)  # headers
    return varint(len(body)) + bytes(body)


def compress(codec: int, payload: bytes) -> bytes:
    """``payload`` as a producer compresses it: gzip, raw snappy (no xerial framing), lz4 frame, zstd."""
    if codec == NONE:
        return payload
    if codec == GZIP:
        return gzip.compress(payload)
    import cramjam

    if codec == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(payload))
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(payload))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(payload))
    raise ValueError(f"no codec {codec}")


def frame_batch(
    payload: bytes,
    *,
    records_count: int,
    last_offset_delta: int | None = None,
    attributes: int = NONE,
    base_offset: int = 0,
    base_timestamp_ms: int = DEFAULT_BASE_TIMESTAMP_MS,
    max_timestamp_ms: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    magic: int = 2,
    corrupt_crc: bool = False,
) -> bytes:
    """A batch header with a correct CRC-32C (unless ``corrupt_crc``) in front of ``payload`` as it is.

    ``payload`` need not be records: a valid header over bytes that do not decode is how tests reach the
    paths that decode records lazily. ``last_offset_delta`` defaults to ``records_count - 1`` and
    ``max_timestamp_ms`` to ``base_timestamp_ms``.
    """
    after_crc = _AFTER_CRC.pack(
        attributes,
        records_count - 1 if last_offset_delta is None else last_offset_delta,
        base_timestamp_ms,
        base_timestamp_ms if max_timestamp_ms is None else max_timestamp_ms,
        producer_id,
        producer_epoch,
        base_sequence,
        records_count,
    ) + payload
    crc = crc32c.crc32c(after_crc)
    if corrupt_crc:
        crc ^= 0xFFFF
    batch_length = 4 + 1 + 4 + len(after_crc)  # leader epoch + magic + crc + the rest
    return _HEAD.pack(base_offset, batch_length, -1, magic, crc) + after_crc


def build_batch(
    values: list[bytes | None],
    timestamps_ms: list[int] | None = None,
    *,
    keys: list[bytes | None] | None = None,
    base_offset: int = 0,
    base_timestamp_ms: int = DEFAULT_BASE_TIMESTAMP_MS,
    timestamp_step_ms: int = 1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    codec: int = NONE,
    magic: int = 2,
    attributes_extra: int = 0,
    records_count: int | None = None,
    last_offset_delta: int | None = None,
    corrupt_crc: bool = False,
) -> bytes:
    """A batch holding one record per value, as a producer sends it (baseOffset 0 unless given).

    Record i has offset delta i, key ``keys[i]`` (None: null keys) and timestamp ``base_timestamp_ms + i *
    timestamp_step_ms``, or ``timestamps_ms[i]`` when those are given (the batch's base timestamp is then
    the first of them and its max timestamp the largest, as Kafka's builder sets them). ``codec`` compresses
    the records; ``attributes_extra`` is OR-ed into the attributes (transactional, control, a codec id that
    does not exist); ``records_count``, ``last_offset_delta``, ``magic`` and ``corrupt_crc`` build batches a
    broker must refuse.
    """
    keys = keys if keys is not None else [None] * len(values)
    if timestamps_ms is not None:
        base_timestamp_ms = timestamps_ms[0] if timestamps_ms else base_timestamp_ms
        deltas = [t - base_timestamp_ms for t in timestamps_ms]
        max_timestamp_ms = max(timestamps_ms, default=base_timestamp_ms)
    else:
        deltas = [i * timestamp_step_ms for i in range(len(values))]
        max_timestamp_ms = base_timestamp_ms + max(0, len(values) - 1) * timestamp_step_ms
    records = b"".join(encode_record(i, deltas[i], keys[i], values[i]) for i in range(len(values)))
    count = len(values) if records_count is None else records_count
    return frame_batch(
        compress(codec, records),
        records_count=count,
        last_offset_delta=last_offset_delta,
        attributes=codec | attributes_extra,
        base_offset=base_offset,
        base_timestamp_ms=base_timestamp_ms,
        max_timestamp_ms=max_timestamp_ms,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        magic=magic,
        corrupt_crc=corrupt_crc,
    )


def message_set(messages: list[tuple[int | None, bytes | None, bytes | None]], *, magic: int, codec: int = NONE,
                log_append_time: bool = False, kafka_lz4_checksum: bool = True) -> bytes:
    """A MessageSet in message format ``magic`` 0 or 1 (what Produce v0-v2 carry from pre-0.11 clients).

    ``messages`` are (timestamp, key, value); v0 has no timestamp field (pass None). With a ``codec`` the
    messages become the compressed value of one wrapper message (offsets 0..n-1 inside, the wrapper's offset
    the last one; a v1 wrapper carries the largest timestamp, and ``log_append_time`` sets its bit 3). LZ4 in
    magic 0 gets the frame header checksum Kafka 0.8-0.9 wrote (over the magic number too, KAFKA-3160)
    unless ``kafka_lz4_checksum`` is False. Layout: offset i64, size i32, crc u32 (CRC-32 of the rest),
    magic i8, attributes i8, [timestamp i64 in v1], key and value as i32 length (-1 null) + bytes.
    """
    def one(offset: int, timestamp: int | None, key, value, attributes: int) -> bytes:
        body = struct.pack(">bb", magic, attributes)
        if magic == 1:
            body += struct.pack(">q", -1 if timestamp is None else timestamp)
        for field in (key, value):
            body += struct.pack(">i", -1) if field is None else struct.pack(">i", len(field)) + field
        body = struct.pack(">I", zlib.crc32(body)) + body
        return struct.pack(">qi", offset, len(body)) + body

    inner = b"".join(one(i, t, k, v, 0) for i, (t, k, v) in enumerate(messages))
    if codec == NONE:
        return inner
    if codec == GZIP:
        blob = gzip.compress(inner)
    elif codec == SNAPPY:
        import cramjam

        blob = bytes(cramjam.snappy.compress_raw(inner))
    elif codec == LZ4:
        import cramjam

        compressor = cramjam.lz4.Compressor(block_linked=False)
        compressor.compress(inner)
        blob = bytes(compressor.finish())
        if magic == 0 and kafka_lz4_checksum:
            # The descriptor here is FLG, BD (no content size, no dictionary id): HC is byte 6.
            blob = blob[:6] + bytes([_xxh32(blob[:6]) >> 8 & 0xFF]) + blob[7:]
    else:
        raise ValueError(f"codec {codec} does not exist in message format v{magic}")
    timestamps = [t for t, _, _ in messages if t is not None]
    wrapper_attributes = codec | (LOG_APPEND_TIME_BIT if log_append_time else 0)
    return one(len(messages) - 1, max(timestamps, default=-1), None, blob, wrapper_attributes)


def _xxh32(data: bytes) -> int:
    """XXH32, seed 0, of fewer than 16 bytes (from the algorithm's description; for the LZ4 checksum above)."""
    p1, p2, p3, p4, p5, mask = 2654435761, 2246822519, 3266489917, 668265263, 374761393, 0xFFFFFFFF
    h = (p5 + len(data)) & mask
    i = 0
    while len(data) - i >= 4:
        h = (h + int.from_bytes(data[i:i + 4], "little") * p3) & mask
        h = ((h << 17 | h >> 15) & mask) * p4 & mask
        i += 4
    for byte in data[i:]:
        h = (h + byte * p5) & mask
        h = ((h << 11 | h >> 21) & mask) * p1 & mask
    h = (h ^ h >> 15) * p2 & mask
    h = (h ^ h >> 13) * p3 & mask
    return h ^ h >> 16


def keyed_batch(values: list[bytes | None], **options) -> bytes:
    """``build_batch`` with keys ``k0``, ``k1``, ... (the raw-protocol tests' batches)."""
    return build_batch(values, keys=[b"k%d" % i for i in range(len(values))], **options)


def idempotent_batch(values: list[bytes], *, producer_id: int, producer_epoch: int, base_sequence: int) -> bytes:
    """A keyed batch of an idempotent producer, stamped with the current time: brokers expire idle producer
    ids by their batches' timestamps (producer.id.expiration.ms), and Kafka drops expired ones when it
    reloads producer state, so old timestamps would lose the sequences a test checks."""
    return keyed_batch(values, base_timestamp_ms=int(time.time() * 1000), producer_id=producer_id,
                       producer_epoch=producer_epoch, base_sequence=base_sequence)


def restamp_crc(batch: bytearray) -> bytearray:
    """Recompute the CRC-32C of a batch edited in place (fields after the CRC), so only the edit is wrong."""
    struct.pack_into(">I", batch, CRC_POSITION, crc32c.crc32c(bytes(batch[ATTRIBUTES_POSITION:])))
    return batch


# -- reading -------------------------------------------------------------------------------------------------
@dataclass
class BatchHeader:
    base_offset: int
    size: int
    magic: int
    attributes: int
    last_offset_delta: int
    records_count: int
    base_timestamp_ms: int = 0
    max_timestamp_ms: int = 0

    @property
    def codec(self) -> str:
        return CODEC_NAMES.get(self.attributes & 0x7, f"codec{self.attributes & 0x7}")


class Record(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def batch_headers(records: bytes) -> list[BatchHeader]:
    """The complete batches in a fetched records blob (a trailing partial batch is ignored, as clients do).

    Raises:
        AssertionError: a batch fails its CRC-32C, or its length cannot hold a header.
    """
    headers, cursor = [], 0
    while cursor + HEADER_BYTES <= len(records):
        base_offset, batch_length, _, magic, crc = _HEAD.unpack_from(records, cursor)
        size = batch_length + 12
        if size < HEADER_BYTES:
            raise AssertionError(f"batch at offset {base_offset} has a length of {batch_length}")
        if cursor + size > len(records):
            break
        attributes, last_delta, base_timestamp, max_timestamp, _, _, _, count = _AFTER_CRC.unpack_from(
            records, cursor + ATTRIBUTES_POSITION)
        if crc != crc32c.crc32c(records[cursor + ATTRIBUTES_POSITION : cursor + size]):
            raise AssertionError(f"batch at offset {base_offset} fails its CRC-32C")
        headers.append(BatchHeader(base_offset, size, magic, attributes, last_delta, count, base_timestamp,
                                   max_timestamp))
        cursor += size
    return headers


def decompress(codec: int, payload: bytes) -> bytes:
    """A batch's records blob uncompressed; snappy may be raw or xerial-framed (the Java client's)."""
    if codec == NONE:
        return payload
    if codec == GZIP:
        return gzip.decompress(payload)
    import cramjam

    if codec == SNAPPY:
        if not payload.startswith(b"\x82SNAPPY\x00"):
            return bytes(cramjam.snappy.decompress_raw(payload))
        out, cursor = bytearray(), 16  # xerial: a 16-byte header, then (int32 length, raw block) chunks
        while cursor < len(payload):
            (length,) = struct.unpack_from(">i", payload, cursor)
            out += bytes(cramjam.snappy.decompress_raw(payload[cursor + 4 : cursor + 4 + length]))
            cursor += 4 + length
        return bytes(out)
    if codec == LZ4:
        return bytes(cramjam.lz4.decompress(payload))
    if codec == ZSTD:
        return bytes(cramjam.zstd.decompress(payload))
    raise AssertionError(f"no codec {codec}")


def records_of(data: bytes) -> list[Record]:
    """Every record of every complete batch in ``data``, with absolute offsets; a LogAppendTime batch gives
    each record its max timestamp, as consumers read it.

    Raises:
        AssertionError: a batch fails its CRC-32C or its records do not decode.
    """
    out: list[Record] = []
    cursor = 0
    for header in batch_headers(data):
        payload = decompress(header.attributes & 0x7, bytes(data[cursor + HEADER_BYTES : cursor + header.size]))
        cursor += header.size
        append_time = header.max_timestamp_ms if header.attributes & LOG_APPEND_TIME_BIT else None
        position = 0
        for _ in range(header.records_count):
            length, position = _read_varint(payload, position)
            end = position + length
            position += 1  # attributes
            timestamp_delta, position = _read_varint(payload, position)
            offset_delta, position = _read_varint(payload, position)
            key, position = _read_bytes(payload, position)
            value, position = _read_bytes(payload, position)
            header_count, position = _read_varint(payload, position)
            record_headers = []
            for _ in range(header_count):
                name, position = _read_bytes(payload, position)
                header_value, position = _read_bytes(payload, position)
                record_headers.append(((name or b"").decode("utf-8", "replace"), header_value))
            if position != end:
                raise AssertionError(f"record at offset {header.base_offset + offset_delta} ends at {position}, "
                                     f"its length says {end}")
            timestamp = append_time if append_time is not None else header.base_timestamp_ms + timestamp_delta
            out.append(Record(header.base_offset + offset_delta, timestamp, key, value, tuple(record_headers)))
    return out


def _read_bytes(payload: bytes, position: int) -> tuple[bytes | None, int]:
    length, position = _read_varint(payload, position)
    if length < 0:
        return None, position
    if position + length > len(payload):
        raise AssertionError(f"a field of {length} bytes runs past the end of the records at {position}")
    return payload[position : position + length], position + length


def values_of(data: bytes) -> list[bytes | None]:
    """The values of every record of every complete batch in ``data``, in log order."""
    return [record.value for record in records_of(data)]
