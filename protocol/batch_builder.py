"""Building RecordBatch v2 batches as a list of buffers for a gathered write (the producer's hot path).

Owns: record encoding, the batch header, the CRC-32C, compression of the records blob. Pure: bytes in,
buffers out; no I/O. The header and record layout are documented in ``protocol.records``.

Gathering. A batch is not copied into one contiguous buffer: every value at or above ``gather_min_bytes``
stays its own buffer (the caller's ``bytes``, referenced, never copied) and everything else - headers,
varints, keys, small values - is coalesced. ``build()`` returns the batch as
``[view(bytearray)[a:b], value, view(bytearray)[b:c], value, ...]`` for ``socket.sendmsg``.

Appending defers the copy: ``append`` adds the record's pieces (prefix bytes, the value object) to a list
and ``build()`` joins each run of small pieces into one ``bytearray`` with a single ``join`` - one memcpy
per byte, in C, instead of growing a buffer record by record. ``append_value`` is the producer's fast
path for the common record - no key, no headers, a ``bytes`` value: consecutive records with the same
timestamp and value length form a run sharing one prefix (the previous record's headerCount 0, length,
attributes, timestampDelta, offsetDelta, keyLength -1, valueLength) but for the offsetDelta varint, so a
record is one list append (its value) and a count; when the run ends, ``prefix.join(values)`` writes it
as one buffer and strided slice assignments write the offsetDelta varints (see ``_settle``). How many
records the run may take (varint length, ``batch_size``) is computed when it starts. The producer inlines
the fast case (see ``append_value``). At 100k-1M records/s nearly every record shares its millisecond.

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
from collections.abc import Sequence
from typing import TypeAlias

import crc32c as _crc32c

from copyless.protocol.records import (
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
from copyless.protocol.records import encode_varint as _encode_varint_uncached

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


# Zig-zag encodings of 0..16383 (1-3 bytes each), precomputed: a list index is ~30 ns against ~600 ns for
# the uncached loop; offset deltas, timestamp deltas and lengths of ordinary records all fall in this range.
_VARINT_CACHE_SIZE = 1 << 14
_VARINTS = [_encode_varint_uncached(i) for i in range(_VARINT_CACHE_SIZE)]
_NULL_VARINT = b"\x01"  # zig-zag(-1): null key / value


def encode_varint(value: int) -> bytes:
    """Zig-zag varint (Kafka's ``ByteUtils.writeVarint``/``writeVarlong``) of a signed int."""
    if 0 <= value < _VARINT_CACHE_SIZE:
        return _VARINTS[value]
    return _encode_varint_uncached(value)


# A key or value: bytes-like, or None for a null one.
Payload: TypeAlias = bytes | bytearray | memoryview
# A record's headers: (name, value) pairs; a name is text or its UTF-8 bytes, a value bytes or None.
Headers: TypeAlias = Sequence[tuple[str | bytes, Payload | None]]


def _clock_seconds(ns: int) -> float:
    """What ``time.time()`` returns when ``time.time_ns()`` would return ``ns``.

    CPython reads one clock for both and converts with ``(double)ns / 1e9`` (``_PyTime_AsSecondsDouble``;
    whole seconds are converted exactly, which ``float(ns) / 1e9`` also gives below 2**53 / 1953125 s, the
    year 2116), a non-decreasing function of ``ns``. So for a millisecond [a, b) in ns,
    ``_clock_seconds(a) < time.time() < _clock_seconds(b)`` implies a < ns < b: a reading that passes
    is inside the millisecond, and the few that fall on a bound's float go the exact way.
    """
    return float(ns) / 1e9


def _encode_headers(headers: Headers | None) -> bytes:
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


def record_size(
    offset_delta: int, timestamp_delta: int, key: Payload | None, value: Payload | None, headers: Headers | None = None
) -> int:
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


def compress(codec: int, data: Payload) -> bytes:
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

    def __init__(self, buffers: list[Payload], size_bytes: int, record_count: int, header: bytearray) -> None:
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


# A record's offsetDelta varint is 1 byte below 64 and 2 bytes below 8192: a run of ``append_value`` records
# shares one length prefix only while that length stays the same (see ``BatchBuilder._start_run``).
_ONE_BYTE_OFFSETS = 64
_TWO_BYTE_OFFSETS = 8192
# The offsetDelta varints of 0..8191 as two byte columns (the second byte is 0 below 64, where the varint
# has one): _settle writes a run's varints with one strided slice assignment per column.
_VARINT_BYTE0 = bytes(varint[0] for varint in _VARINTS[:_TWO_BYTE_OFFSETS])
_VARINT_BYTE1 = bytes(varint[1] if len(varint) > 1 else 0 for varint in _VARINTS[:_TWO_BYTE_OFFSETS])
_HEADER_PLACEHOLDER = bytes(RECORD_BATCH_OVERHEAD)  # overwritten by build()
_NO_HEADERS = b"\x00"


class BatchBuilder:
    """Accumulates records for one partition and finishes them into a RecordBatch v2.

    Args:
        batch_size: soft cap in bytes (Kafka ``batch.size``): ``append`` refuses a record that would take
            the batch past it, except the first (a record larger than batch_size gets its own batch).
        codec: CODEC_* constant; compressed batches are built contiguous.
        gather_min_bytes: values this large or larger are kept as separate buffers (see module doc).
        transactional: sets the transactional attribute bit.

    Values are held by reference until ``build()`` (small ``bytes`` ones included: they are immutable);
    other bytes-like small values are copied by ``append``. Not thread-safe; loop thread only.
    """

    __slots__ = (
        "batch_size",
        "codec",
        "gather_min_bytes",
        "transactional",
        "_parts",
        "_cuts",
        "_count",
        "_size",
        "_base_timestamp",
        "_max_timestamp",
        "closed",
        "_record_open",
        "_run_timestamp",
        "_run_from_s",
        "_run_until_s",
        "_run_value_bytes",
        "_run_limit",
        "_run_count",
        "_run_head",
        "_run_tail",
        "_run_values",
        "_run_record_bytes",
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
        # The batch's pieces in wire order; [0] stands for the header. Joined by build().
        self._parts: list[Payload] = [_HEADER_PLACEHOLDER]
        self._cuts: list[int] = []  # indexes in _parts of values sent as their own iovec
        self._count = 0
        self._size = RECORD_BATCH_OVERHEAD  # exact up to _run_count records (see _settle)
        self._base_timestamp = 0
        self._max_timestamp = -1
        self.closed = False
        # True while the last record's headerCount byte (0) is not in _parts yet: an append_value record
        # leaves it to the next record of its run, which writes it as the first byte of its prefix.
        self._record_open = False
        # The current append_value run (see _start_run); _run_limit = 0 means "no run".
        self._run_timestamp = -1  # no run yet (and _run_limit = 0 admits none)
        # The run's millisecond as time.time() readings: from < time.time() < until only for a clock
        # reading inside it (see _clock_seconds), which stamps a record with _run_timestamp, so the
        # producer tests a reading without converting it to milliseconds.
        self._run_from_s = 0.0
        self._run_until_s = 0.0
        self._run_value_bytes = -1
        self._run_limit = 0
        self._run_count = 0
        self._run_head = b""
        self._run_tail = b""
        # The values of the run's records after its first, in order: their pieces are laid out by _settle.
        self._run_values: list[bytes] = []
        self._run_record_bytes = 0

    @property
    def record_count(self) -> int:
        return self._count

    @property
    def size_bytes(self) -> int:
        """Uncompressed size of the batch so far (header included)."""
        return self._size + len(self._run_values) * self._run_record_bytes  # + the unsettled run

    def append_value(self, timestamp_ms: int, value: bytes) -> int:
        """``append(timestamp_ms, None, value)`` for the producer's common record; same bytes, same result.

        The fast case - a ``bytes`` value with the timestamp and length of the previous ``append_value``
        record, while the run has room - is one list append and a count (~0.15 us for a 100-byte value,
        against ~0.7 us for ``append``); ``_settle`` lays the run's pieces out in bulk. Anything else (a new
        millisecond, a new length, another bytes-like type, a large value, the offsetDelta varint growing, the batch
        filling up) goes through ``_start_run``.

        ``Producer.send`` and ``send_nowait`` inline this fast case (see ``Producer.send``): they test
        ``_run_from_s < time.time() < _run_until_s`` instead of comparing millisecond timestamps, then
        ``_count < _run_limit``, the value's type and ``_run_value_bytes``, and do
        ``_run_values.append(value)`` and ``_count += 1``. A change to the run's state must keep them
        true to this method.
        """
        count = self._count
        if (
            timestamp_ms != self._run_timestamp
            or count >= self._run_limit
            or type(value) is not bytes
            or len(value) != self._run_value_bytes
        ):
            return self._start_run(timestamp_ms, value)
        self._run_values.append(value)
        self._count = count + 1
        return count

    def _settle(self) -> None:
        """Account the run's records in ``_size``, close the open record and end the run."""
        values = self._run_values
        if values:
            # Every record of the run has the same size and the same bytes but for its value and its
            # offsetDelta varint, so the run is written as one buffer: ``prefix.join`` puts the prefix
            # (the previous record's headerCount, length, attributes, timestampDelta, a placeholder
            # offsetDelta, keyLength, valueLength) before each value in one C loop, and one or two strided
            # slice assignments write the real offsetDelta bytes from precomputed columns. One piece per
            # run instead of four per record (prefix, varint, suffix, value) for build()'s join: ~22-30 ns
            # per 100-byte record for this and its share of the join, against ~54-60 ns (measured here).
            records = len(values)
            first = self._run_count
            head = self._run_head
            prefix = head + _VARINTS[first] + self._run_tail
            values.insert(0, b"")  # the prefix goes before the first value too
            run = bytearray(prefix).join(values)
            stride = self._run_record_bytes  # len(prefix) + the value length
            at = len(head)
            end = first + records
            run[at::stride] = _VARINT_BYTE0[first:end]
            if first >= _ONE_BYTE_OFFSETS:  # a run never crosses a varint length (see _start_run)
                run[at + 1 :: stride] = _VARINT_BYTE1[first:end]
            self._parts.append(run)
            self._size += records * stride
            values.clear()
        self._run_count = self._count
        self._run_limit = 0
        if self._record_open:
            self._parts.append(_NO_HEADERS)
            self._record_open = False

    def _start_run(self, timestamp_ms: int, value: Payload | None) -> int:
        """Append one record through the general path and, for a small ``bytes`` value, set up the run:
        the pieces later records with the same timestamp and value length share, and how many fit."""
        if type(value) is not bytes or len(value) >= self.gather_min_bytes:
            return self.append(timestamp_ms, None, value)
        self._settle()
        count = self._count
        base_timestamp = self._base_timestamp if count else timestamp_ms
        timestamp_varint = encode_varint(timestamp_ms - base_timestamp)
        offset_varint = encode_varint(count)
        value_bytes = len(value)
        value_prefix = encode_varint(value_bytes)
        body_length = 3 + len(timestamp_varint) + len(offset_varint) + len(value_prefix) + value_bytes
        length_varint = encode_varint(body_length)
        total = len(length_varint) + body_length
        size = self._size + total
        if count and size > self.batch_size:
            return -1
        head = length_varint + b"\x00" + timestamp_varint  # length, attributes, timestampDelta
        tail = b"\x01" + value_prefix  # keyLength -1 (null key), valueLength
        self._parts += (head, offset_varint, tail, value)
        self._record_open = True
        if not count:
            self._base_timestamp = self._max_timestamp = timestamp_ms
        elif timestamp_ms > self._max_timestamp:
            self._max_timestamp = timestamp_ms
        self._count = count + 1
        self._size = size
        # The run lasts while the offsetDelta varint keeps this record's length (its byte count is inside
        # the shared length prefix) and the batch has room for another record of this size; past the
        # varint table every record starts its own run.
        varint_limit = (
            _ONE_BYTE_OFFSETS if count < _ONE_BYTE_OFFSETS else _TWO_BYTE_OFFSETS if count < _TWO_BYTE_OFFSETS else 0
        )
        self._run_limit = min(varint_limit, count + 1 + (self.batch_size - size) // total)
        self._run_count = count + 1
        self._run_timestamp = timestamp_ms
        self._run_from_s = _clock_seconds(timestamp_ms * 1_000_000)
        self._run_until_s = _clock_seconds((timestamp_ms + 1) * 1_000_000)
        self._run_value_bytes = value_bytes
        self._run_head = _NO_HEADERS + head  # the previous record's headerCount, then this prefix
        self._run_tail = tail
        self._run_record_bytes = total
        return count

    def append(
        self, timestamp_ms: int, key: Payload | None, value: Payload | None, headers: Headers | None = None
    ) -> int:
        """Add one record; return its offset delta, or -1 when it does not fit (the batch is full).

        ``key``/``value`` are bytes-like or None. ``headers`` is a sequence of ``(str, bytes | None)``.
        """
        self._settle()
        count = self._count
        timestamp_delta = timestamp_ms - self._base_timestamp if count else 0
        varints = _VARINTS
        if 0 <= timestamp_delta < _VARINT_CACHE_SIZE:
            timestamp_varint = varints[timestamp_delta]
        else:
            timestamp_varint = encode_varint(timestamp_delta)
        offset_varint = varints[count] if count < _VARINT_CACHE_SIZE else encode_varint(count)
        if value is None:
            value_prefix = _NULL_VARINT
            value_length = 0
            value = b""
        else:
            value_length = len(value)
            value_prefix = varints[value_length] if value_length < _VARINT_CACHE_SIZE else encode_varint(value_length)
        if key is None:
            key_prefix = _NULL_VARINT
            key = b""
        else:
            key_length = len(key)
            key_prefix = varints[key_length] if key_length < _VARINT_CACHE_SIZE else encode_varint(key_length)
        header_bytes = _encode_headers(headers) if headers else _NO_HEADERS
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
        length_varint = varints[body_length] if body_length < _VARINT_CACHE_SIZE else encode_varint(body_length)
        total = len(length_varint) + body_length
        if count and self._size + total > self.batch_size:
            return -1
        parts = self._parts
        if value_length >= self.gather_min_bytes:
            # %b takes any buffer (PEP 461); mypy's format check admits only bytes.
            parts.append(b"%b\x00%b%b%b%b%b" % (  # type: ignore[str-format]
                length_varint, timestamp_varint, offset_varint, key_prefix, key, value_prefix))
            self._cuts.append(len(parts))
            parts.append(value)
            parts.append(header_bytes)
        else:
            # One copy now: the caller may reuse a mutable value (bytearray, memoryview) after the call.
            pieces = (length_varint, timestamp_varint, offset_varint, key_prefix, key, value_prefix, value,
                      header_bytes)
            parts.append(b"%b\x00%b%b%b%b%b%b%b" % pieces)  # type: ignore[str-format]  # any buffer, as above
        if not count:
            self._base_timestamp = self._max_timestamp = timestamp_ms
        elif timestamp_ms > self._max_timestamp:
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
        """Finish the batch: join, header, compression, CRC. The builder is closed afterwards.

        Returns:
            BuiltBatch whose ``buffers`` concatenate to the batch bytes.
        Raises:
            ValueError: the batch is empty.
        """
        if self._count == 0:
            raise ValueError("cannot build an empty batch")
        self._settle()
        self.closed = True
        parts = self._parts
        cuts = self._cuts
        self._parts = []
        self._cuts = []
        attributes = self.codec | (TRANSACTIONAL_BIT if self.transactional else 0)
        join = bytearray().join  # a bytearray: the header is packed (and maybe rewritten) in place
        if self.codec != CODEC_NONE:
            blob = compress(self.codec, b"".join(parts[1:]))
            buffer = bytearray(_HEADER_PLACEHOLDER)
            buffer += blob
            size = len(buffer)
            cuts = []
        else:
            buffer = join(parts[: cuts[0]] if cuts else parts)
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
        crc = _crc32c.crc32c
        view = memoryview(buffer)
        buffers: list[Payload] = [view]
        checksum = crc(view[_ATTRIBUTES_POSITION:])
        for number, cut in enumerate(cuts):
            value = parts[cut]
            buffers.append(value)
            checksum = crc(value, checksum)
            end = cuts[number + 1] if number + 1 < len(cuts) else len(parts)
            piece = memoryview(join(parts[cut + 1 : end]))
            buffers.append(piece)
            checksum = crc(piece, checksum)
        _CRC.pack_into(buffer, _CRC_POSITION, checksum)
        return BuiltBatch(buffers, size, self._count, buffer)
