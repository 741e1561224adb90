"""Building RecordBatch v2 batches as a list of buffers for a gathered write (the producer's hot path).

Owns: record encoding, the batch header, the CRC-32C, compression of the records blob. Pure: bytes in,
buffers out; no I/O. The header and record layout are documented in ``client.protocol.records``.

Gathering. A batch is not copied into one contiguous buffer: every value at or above ``gather_min_bytes``
stays its own buffer (the caller's ``bytes``, referenced, never copied) and everything else - headers,
varints, keys, small values - is coalesced into one growing ``bytearray``. ``build()`` returns the batch as
``[view(bytearray)[a:b], value, view(bytearray)[b:c], value, ...]`` for ``socket.sendmsg``.
The crossover ``GATHER_MIN_VALUE_BYTES`` is where a separate iovec starts to beat a memcpy into the batch
buffer on this machine (see its comment). Compressed batches are always contiguous: the codec needs one
input.

The CRC-32C covers bytes [21, end) - attributes through the last record - so it is computed incrementally
over the buffers in order (``crc32c.crc32c(data, value)`` continues a running CRC) and never over a joined
copy.

Record (zig-zag varints)::

    length varint | attributes int8 = 0 | timestampDelta varlong | offsetDelta varint
    | keyLength varint (-1 = null) | key | valueLength varint (-1 = null) | value
    | headerCount varint | [headerKeyLength varint | headerKey | headerValueLength varint | headerValue]
"""

from __future__ import annotations

import gzip
import struct

import crc32c as _crc32c

from client.protocol.records import (
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_NONE,
    CODEC_SNAPPY,
    CODEC_ZSTD,
    LOG_OVERHEAD,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    RECORD_BATCH_OVERHEAD,
    TRANSACTIONAL_BIT,
)

__all__ = [
    "GATHER_MIN_VALUE_BYTES",
    "BatchBuilder",
    "BuiltBatch",
    "CODECS",
    "compress",
    "encode_varint",
    "record_size",
]

# Values at or above this many bytes are sent as their own iovec instead of being copied into the batch
# buffer. Measured on this machine by benchmarks/writev.py (JSON "crossover_bytes", target "socket";
# 1000 buffers per sendmsg over loopback TCP, sender CPU per call): 100 B sendmsg 0.064 ms vs join+send
# 0.027 ms; 1000 B 0.180 vs 0.169 (a wash); 2 KiB 0.446 vs 0.474; 16 KiB 2.4 vs 4.1; 64 KiB 8.8 vs 59.
# Gathering wins from 2 KiB up on a socket (for page-cache files it wins from 500 B; the write/writev
# article's figure was ~200 B). Producers can override it with ``gather_min_bytes``.
GATHER_MIN_VALUE_BYTES = 2048

CODECS = {"none": CODEC_NONE, "gzip": CODEC_GZIP, "snappy": CODEC_SNAPPY, "lz4": CODEC_LZ4, "zstd": CODEC_ZSTD}

# magic=2 is fixed; the baseOffset(0) .. recordsCount header in one pack (61 bytes).
_HEADER = struct.Struct(">qiibIhiqqqhii")
_CRC = struct.Struct(">I")
_CRC_POSITION = 17
_ATTRIBUTES_POSITION = 21
_NO_LEADER_EPOCH = -1


def _zigzag_varint(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    raw &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


# Zig-zag encodings of 0..16383 (1-3 bytes each), precomputed: a list index is ~30 ns against ~600 ns for
# the loop above; offset deltas, timestamp deltas and lengths of ordinary records all fall in this range.
_VARINT_CACHE_SIZE = 1 << 14
_VARINTS = [_zigzag_varint(i) for i in range(_VARINT_CACHE_SIZE)]
_NULL_VARINT = b"\x01"  # zig-zag(-1): null key / value


def encode_varint(value: int) -> bytes:
    """Zig-zag varint (Kafka's ``ByteUtils.writeVarint``/``writeVarlong``) of a signed int."""
    if 0 <= value < _VARINT_CACHE_SIZE:
        return _VARINTS[value]
    return _zigzag_varint(value)


def _encode_headers(headers) -> bytes:
    if not headers:
        return b"\x00"
    out = bytearray(encode_varint(len(headers)))
    for name, value in headers:
        name_bytes = name.encode("utf-8") if isinstance(name, str) else bytes(name)
        out += encode_varint(len(name_bytes))
        out += name_bytes
        if value is None:
            out += _NULL_VARINT
        else:
            out += encode_varint(len(value))
            out += value
    return bytes(out)


def record_size(offset_delta: int, timestamp_delta: int, key, value, headers=None) -> int:
    """Bytes a record takes in a batch, its length varint included (for sizing estimates and tests)."""
    body = (
        1
        + len(encode_varint(timestamp_delta))
        + len(encode_varint(offset_delta))
        + (1 if key is None else len(encode_varint(len(key))) + len(key))
        + (1 if value is None else len(encode_varint(len(value))) + len(value))
        + len(_encode_headers(headers))
    )
    return len(encode_varint(body)) + body


def compress(codec: int, data) -> bytes:
    """Compress a records blob with Kafka's framing for ``codec``.

    gzip comes from the stdlib; snappy, lz4 and zstd from ``cramjam`` (one wheel, no system libraries).
    Snappy uses the raw block format, which Kafka and librdkafka read (as does ``records.decompress``);
    lz4 uses the frame format (KIP-57).
    """
    if codec == CODEC_GZIP:
        # Level 1: Kafka's default gzip level is 6, but level 1 is ~4x faster for ~10% larger output on log
        # data, and producer CPU is the bottleneck of a Python client.
        return gzip.compress(bytes(data), compresslevel=1, mtime=0)
    import cramjam

    if codec == CODEC_SNAPPY:
        return bytes(cramjam.snappy.compress_raw(bytes(data)))
    if codec == CODEC_LZ4:
        # LZ4 frame with independent blocks: Kafka's Lz4BlockInputStream rejects linked blocks ("Dependent
        # block stream is unsupported"), and cramjam.lz4.compress links them.
        compressor = cramjam.lz4.Compressor(block_linked=False)
        compressor.compress(bytes(data))
        return bytes(compressor.finish())
    if codec == CODEC_ZSTD:
        return bytes(cramjam.zstd.compress(bytes(data)))
    raise ValueError(f"unknown codec {codec}")


class BuiltBatch:
    """A finished batch: its buffers in wire order, its size, and what the producer needs to track it.

    ``set_producer_state`` rewrites producerId/epoch/baseSequence and the CRC in place (used when the
    producer's id is reset between retries).
    """

    __slots__ = ("buffers", "size_bytes", "record_count", "_header")

    def __init__(self, buffers: list, size_bytes: int, record_count: int, header: bytearray) -> None:
        self.buffers = buffers
        self.size_bytes = size_bytes
        self.record_count = record_count
        self._header = header

    def to_bytes(self) -> bytes:
        """The batch as one contiguous ``bytes`` (a copy; tests and the compressed path use it)."""
        return b"".join(bytes(buffer) for buffer in self.buffers)

    def set_producer_state(self, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
        """Rewrite producerId, producerEpoch and baseSequence (all inside the CRC) and re-checksum."""
        struct.pack_into(">qhi", self._header, 43, producer_id, producer_epoch, base_sequence)
        # buffers[0] always starts at the batch's first byte (a view of the header's bytearray).
        checksum = _crc32c.crc32c(self.buffers[0][_ATTRIBUTES_POSITION:])
        for buffer in self.buffers[1:]:
            checksum = _crc32c.crc32c(buffer, checksum)
        _CRC.pack_into(self._header, _CRC_POSITION, checksum)


class BatchBuilder:
    """Accumulates records for one partition and finishes them into a RecordBatch v2.

    Args:
        batch_size: soft cap in bytes (Kafka ``batch.size``): ``append`` refuses a record that would take
            the batch past it, except the first (a record larger than batch_size gets its own batch).
        codec: CODEC_* constant; compressed batches are built contiguous.
        gather_min_bytes: values this large or larger are kept as separate buffers (see module doc).
        transactional: sets the transactional attribute bit.

    Not thread-safe; loop thread only. ``append`` costs ~1 us for a 100-byte record on this machine.
    """

    __slots__ = (
        "batch_size",
        "codec",
        "gather_min_bytes",
        "transactional",
        "_buffer",
        "_cuts",
        "_count",
        "_size",
        "_base_timestamp",
        "_max_timestamp",
        "closed",
    )

    def __init__(
        self,
        *,
        batch_size: int = 16384,
        codec: int = CODEC_NONE,
        gather_min_bytes: int = GATHER_MIN_VALUE_BYTES,
        transactional: bool = False,
    ) -> None:
        self.batch_size = batch_size
        self.codec = codec
        # Compression needs one contiguous input: never cut values out of a compressed batch.
        self.gather_min_bytes = gather_min_bytes if codec == CODEC_NONE else 1 << 62
        self.transactional = transactional
        self._buffer = bytearray(RECORD_BATCH_OVERHEAD)
        self._cuts: list = []  # [(position in _buffer, value buffer)] for values sent as their own iovec
        self._count = 0
        self._size = RECORD_BATCH_OVERHEAD
        self._base_timestamp = 0
        self._max_timestamp = -1
        self.closed = False

    @property
    def record_count(self) -> int:
        return self._count

    @property
    def size_bytes(self) -> int:
        """Uncompressed size of the batch so far (header included)."""
        return self._size

    def append(self, timestamp_ms: int, key, value, headers=None) -> int:
        """Add one record; return its offset delta, or -1 when it does not fit (the batch is full).

        ``key``/``value`` are bytes-like or None. ``headers`` is a sequence of ``(str, bytes | None)``.
        """
        count = self._count
        if count:
            timestamp_delta = timestamp_ms - self._base_timestamp
        else:
            self._base_timestamp = self._max_timestamp = timestamp_ms
            timestamp_delta = 0
        varints = _VARINTS
        if 0 <= timestamp_delta < _VARINT_CACHE_SIZE:
            timestamp_varint = varints[timestamp_delta]
        else:
            timestamp_varint = _zigzag_varint(timestamp_delta)
        offset_varint = varints[count] if count < _VARINT_CACHE_SIZE else _zigzag_varint(count)
        if value is None:
            value_prefix = _NULL_VARINT
            value_length = 0
            value = b""
        else:
            value_length = len(value)
            value_prefix = varints[value_length] if value_length < _VARINT_CACHE_SIZE else _zigzag_varint(value_length)
        if key is None and not headers:
            # The common shape (no key, no headers) with its fixed bytes folded in: attributes 0,
            # keyLength -1, headerCount 0. ~10% faster than the general path below (0.66 vs 0.78 us/record).
            body_length = 3 + len(timestamp_varint) + len(offset_varint) + len(value_prefix) + value_length
            length_varint = varints[body_length] if body_length < _VARINT_CACHE_SIZE else _zigzag_varint(body_length)
            total = len(length_varint) + body_length
            if count and self._size + total > self.batch_size:
                return -1
            if value_length >= self.gather_min_bytes:
                buffer = self._buffer
                buffer += b"%b\x00%b%b\x01%b" % (length_varint, timestamp_varint, offset_varint, value_prefix)
                self._cuts.append((len(buffer), value))
                buffer += b"\x00"
            else:
                self._buffer += b"%b\x00%b%b\x01%b%b\x00" % (
                    length_varint,
                    timestamp_varint,
                    offset_varint,
                    value_prefix,
                    value,
                )
            if timestamp_ms > self._max_timestamp:
                self._max_timestamp = timestamp_ms
            self._count = count + 1
            self._size += total
            return count
        if key is None:
            key_prefix = _NULL_VARINT
            key = b""
        else:
            key_length = len(key)
            key_prefix = varints[key_length] if key_length < _VARINT_CACHE_SIZE else _zigzag_varint(key_length)
        header_bytes = _encode_headers(headers) if headers else b"\x00"
        body_length = (
            1
            + len(timestamp_varint)
            + len(offset_varint)
            + len(key_prefix)
            + len(key)
            + len(value_prefix)
            + value_length
            + len(header_bytes)
        )
        length_varint = varints[body_length] if body_length < _VARINT_CACHE_SIZE else _zigzag_varint(body_length)
        total = len(length_varint) + body_length
        if count and self._size + total > self.batch_size:
            return -1
        buffer = self._buffer
        if value_length >= self.gather_min_bytes:
            buffer += b"%b\x00%b%b%b%b%b" % (length_varint, timestamp_varint, offset_varint, key_prefix, key, value_prefix)
            self._cuts.append((len(buffer), value))
            buffer += header_bytes
        else:
            buffer += b"%b\x00%b%b%b%b%b%b%b" % (
                length_varint,
                timestamp_varint,
                offset_varint,
                key_prefix,
                key,
                value_prefix,
                value,
                header_bytes,
            )
        if timestamp_ms > self._max_timestamp:
            self._max_timestamp = timestamp_ms
        self._count = count + 1
        self._size += total
        return count

    def build(
        self,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = -1,
        base_sequence: int = NO_SEQUENCE,
    ) -> BuiltBatch:
        """Finish the batch: header, compression, CRC. The builder is closed afterwards.

        Returns:
            BuiltBatch whose ``buffers`` concatenate to the batch bytes.
        Raises:
            ValueError: the batch is empty.
        """
        if self._count == 0:
            raise ValueError("cannot build an empty batch")
        self.closed = True
        buffer = self._buffer
        attributes = self.codec | (TRANSACTIONAL_BIT if self.transactional else 0)
        if self.codec != CODEC_NONE:
            blob = compress(self.codec, memoryview(buffer)[RECORD_BATCH_OVERHEAD:])
            del buffer[RECORD_BATCH_OVERHEAD:]
            buffer += blob
            size = len(buffer)
        else:
            size = self._size
        _HEADER.pack_into(
            buffer,
            0,
            0,
            size - LOG_OVERHEAD,
            _NO_LEADER_EPOCH,
            2,
            0,
            attributes,
            self._count - 1,
            self._base_timestamp,
            self._max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            self._count,
        )
        view = memoryview(buffer)
        crc = _crc32c.crc32c
        if not self._cuts:
            buffers = [view]
            checksum = crc(view[_ATTRIBUTES_POSITION:])
        else:
            buffers = []
            start = 0
            checksum = 0
            for cut, value in self._cuts:
                piece = view[start:cut]
                buffers.append(piece)
                buffers.append(value)
                checksum = crc(piece[_ATTRIBUTES_POSITION:] if start == 0 else piece, checksum)
                checksum = crc(value, checksum)
                start = cut
            piece = view[start:]
            buffers.append(piece)
            checksum = crc(piece, checksum)
        _CRC.pack_into(buffer, _CRC_POSITION, checksum)
        return BuiltBatch(buffers, size, self._count, buffer)
