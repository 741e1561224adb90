"""FetchResponse v4-v11, encoded by hand so record bytes stay in the page cache.

kio would need the records as a Python ``bytes``; instead this encoder emits the response as a list of
segments, ``bytes`` for everything the broker writes and the storage's ``FileSlice`` for each partition's
records, which the shell sends with ``os.sendfile`` (Kafka's ``MultiRecordsSend`` of heap buffers and
``FileRecords`` slices). Adjacent fields are joined into one ``bytes`` so a response with N partitions has at
most 2N+1 segments: one gathered write per header run, one sendfile per partition.

Wire format (non-flexible versions; big-endian; ``[vN+]`` = present from version N)::

    int32  frame size                          (everything after this field)
    int32  correlation_id                      (response header v0)
    int32  throttle_time_ms                    [v1+]
    int16  error_code                          [v7+]
    int32  session_id                          [v7+]
    int32  topic count
      int16 length + bytes  topic
      int32  partition count
        int32  partition_index
        int16  error_code
        int64  high_watermark
        int64  last_stable_offset              [v4+]
        int64  log_start_offset                [v5+]
        int32  aborted transaction count       [v4+] (-1 = null)
          int64 producer_id, int64 first_offset
        int32  preferred_read_replica          [v11+]
        int32  records length (-1 = null), records bytes

Pure: the encoder reads only ``length`` from a slice; it never touches its bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FetchPartitionResult", "encode_fetch_response", "MIN_VERSION", "MAX_VERSION", "segments_length"]

MIN_VERSION = 4
MAX_VERSION = 11

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEAD_V7 = struct.Struct(">iihi")  # correlation_id, throttle_time_ms, error_code, session_id
_HEAD_V4 = struct.Struct(">ii")  # correlation_id, throttle_time_ms
_PARTITION_V4 = struct.Struct(">ihqqi")  # index, error, hw, lso, aborted count
_PARTITION_V5 = struct.Struct(">ihqqqi")  # + log_start_offset
_PARTITION_V11 = struct.Struct(">ihqqqii")  # + preferred_read_replica
_ABORTED = struct.Struct(">qq")  # producer_id, first_offset
_PREFERRED_REPLICA = struct.Struct(">i")


@dataclass(slots=True)
class FetchPartitionResult:
    """One partition of a FetchResponse. ``records`` is a FileSlice (anything with ``.length``), bytes, or
    None for "no records" (encoded as an empty record set, as Kafka sends ``MemoryRecords.EMPTY``)."""

    partition: int
    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: Any = None
    aborted: Any = None  # [(producer_id, first_offset)] for read_committed fetches

    @property
    def records_bytes(self) -> int:
        records = self.records
        if records is None:
            return 0
        return len(records) if isinstance(records, (bytes, bytearray, memoryview)) else records.length


def _encode_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return _I16.pack(len(raw)) + raw


def encode_fetch_response(
    version: int,
    correlation_id: int,
    topics: Sequence[tuple[str, Sequence[FetchPartitionResult]]],
    *,
    error_code: int = 0,
    session_id: int = 0,
) -> list[Any]:
    """Encode a whole response frame as ``[bytes, slice, bytes, slice, ..., bytes]``.

    Args:
        version: 4..11.
        topics: in request order, each with its partitions in request order.

    Returns:
        Segments whose concatenation is the frame, size prefix included. Byte records are inlined.
    """
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ValueError(f"Fetch v{version} is not encoded here")
    segments: list[Any] = []  # bytes, and the FileSlices between them
    pending: list[bytes] = []
    if version >= 7:
        pending.append(_HEAD_V7.pack(correlation_id, 0, error_code, session_id))
    else:
        pending.append(_HEAD_V4.pack(correlation_id, 0))
    pending.append(_I32.pack(len(topics)))
    total = 0
    for topic, partitions in topics:
        pending.append(_encode_string(topic))
        pending.append(_I32.pack(len(partitions)))
        for result in partitions:
            aborted = result.aborted or ()
            if version >= 5:
                pending.append(
                    _PARTITION_V5.pack(
                        result.partition, result.error_code, result.high_watermark, result.last_stable_offset,
                        result.log_start_offset, len(aborted),
                    )
                )
            else:
                pending.append(
                    _PARTITION_V4.pack(
                        result.partition, result.error_code, result.high_watermark, result.last_stable_offset,
                        len(aborted),
                    )
                )
            for producer_id, first_offset in aborted:
                pending.append(_ABORTED.pack(producer_id, first_offset))
            if version >= 11:
                pending.append(_PREFERRED_REPLICA.pack(-1))
            records = result.records
            if records is None:
                pending.append(_I32.pack(0))
            elif isinstance(records, (bytes, bytearray, memoryview)):
                pending.append(_I32.pack(len(records)))
                pending.append(bytes(records))
            else:
                pending.append(_I32.pack(records.length))
                chunk = b"".join(pending)
                total += len(chunk)
                segments.append(chunk)
                pending = []
                segments.append(records)
                total += records.length
    chunk = b"".join(pending)
    total += len(chunk)
    segments.append(chunk)
    # The size prefix counts everything after itself.
    segments[0] = _I32.pack(total) + segments[0]
    return segments


def segments_length(segments: Sequence[Any]) -> int:
    """Bytes the segments occupy on the wire."""
    return sum(len(s) if isinstance(s, (bytes, bytearray, memoryview)) else s.length for s in segments)
