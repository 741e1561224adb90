"""Building RecordBatch v2 bytes for tests, independent of the code under test (only crc32c is shared).

Follows Kafka's DefaultRecordBatch / DefaultRecord layout: zig-zag varints, CRC-32C over bytes [21, end).
"""

from __future__ import annotations

import gzip
import struct

import crc32c


def _zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


def varint(value: int) -> bytes:
    raw = _zigzag(value) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while True:
        byte = raw & 0x7F
        raw >>= 7
        if raw:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_record(offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None) -> bytes:
    body = bytearray(b"\x00")
    body += varint(timestamp_delta)
    body += varint(offset_delta)
    if key is None:
        body += varint(-1)
    else:
        body += varint(len(key)) + key
    if value is None:
        body += varint(-1)
    else:
        body += varint(len(value)) + value
    body += varint(0)  # headers
    return varint(len(body)) + bytes(body)


def build_batch(
    values: list[bytes | None],
    *,
    keys: list[bytes | None] | None = None,
    base_offset: int = 0,
    base_timestamp: int = 1_700_000_000_000,
    timestamp_step: int = 1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    codec: int = 0,
    magic: int = 2,
    attributes_extra: int = 0,
    records_count: int | None = None,
    last_offset_delta: int | None = None,
    corrupt_crc: bool = False,
) -> bytes:
    keys = keys if keys is not None else [None] * len(values)
    records = b"".join(
        encode_record(i, i * timestamp_step, keys[i], values[i]) for i in range(len(values))
    )
    if codec == 1:
        records = gzip.compress(records)
    elif codec != 0:
        import cramjam

        if codec == 2:
            records = bytes(cramjam.snappy.compress_raw(records))
        elif codec == 3:
            records = bytes(cramjam.lz4.compress(records))
        elif codec == 4:
            records = bytes(cramjam.zstd.compress(records))
    count = len(values) if records_count is None else records_count
    delta = count - 1 if last_offset_delta is None else last_offset_delta
    max_timestamp = base_timestamp + max(0, len(values) - 1) * timestamp_step
    after_crc = struct.pack(
        ">hiqqqhii",
        codec | attributes_extra,
        delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    ) + records
    crc = crc32c.crc32c(after_crc)
    if corrupt_crc:
        crc ^= 0xFFFF
    batch_length = 4 + 1 + 4 + len(after_crc)  # leader epoch + magic + crc + rest
    return struct.pack(">qiibI", base_offset, batch_length, -1, magic, crc) + after_crc
