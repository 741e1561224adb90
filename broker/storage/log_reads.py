"""Reads of a log's segments: what a fetch, a ListOffsets by time and a header walk read. Functions over the
segment list (log_segments.py); PartitionLog's ``read``, ``offset_for_timestamp``, ``batch_headers`` and
``transaction_events`` call them with the log's offsets. Loop thread unless noted: preads of a few
headers, never the map.

Owns no state and no file. A fetch gets a FileSlice (a pinned segment fd, a position and a length) ending
on a batch boundary within its byte limit; the slice is sent with sendfile and released after. Reads pin
each segment they touch, so retention may retire it meanwhile without closing its fd under them; a
segment found closed (retired and reaped) makes a fetch check its offset against the log start again.
Nothing here writes, so there is no crash story of its own: a read sees only committed bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from copyless.protocol.records import RECORD_BATCH_OVERHEAD, BatchHeader, iter_record_timestamps

from .file_slice import FileSlice
from .log_segments import LogSegments
from .scan import scan_headers

__all__ = ["read_slice", "offset_for_timestamp", "transaction_events", "batch_headers"]


def read_slice(segments: LogSegments, fetch_offset: int, max_bytes: int, min_one_message: bool,
               max_offset: int | None, check_offset: Callable[[int], None], on_unpinned) -> FileSlice | None:
    """A FileSlice of committed bytes starting at the batch holding ``fetch_offset`` (Kafka's fetch rules),
    or None when there is nothing to send.

    The region ends within ``max_bytes`` (the first batch whole when ``min_one_message`` even if larger),
    never past the committed end or the batch holding ``max_offset``, and stays within one segment. Unlike
    Kafka it ends on a batch boundary: Kafka cuts at the byte limit and the client downloads a partial
    trailing batch only to drop it and fetch it again (a librdkafka consumer of 10 KB records, 1 MB
    batches, 4 MiB fetches, was sent 5.7% more bytes than it kept). ``check_offset`` raises
    OffsetOutOfRangeError when retention moved the log start past ``fetch_offset`` meanwhile (called when a
    segment turns out closed). The caller must release() the slice once sent.
    """
    for segment in segments.floor(fetch_offset):
        if not segment.try_pin():
            check_offset(fetch_offset)  # retention moved the start meanwhile
            continue
        handed_out = False
        try:
            end_position = segment.committed_position
            found = segment.find_batch(fetch_offset, end_position)
            if found is None:
                continue
            position, header = found
            if max_offset is not None and header.last_offset >= max_offset and header.base_offset >= max_offset:
                return None
            if max_offset is not None and max_offset < segment.next_offset:
                limit = segment.find_batch(max_offset, end_position)
                if limit is not None:
                    end_position = limit[0]
            available = end_position - position
            if available <= 0:
                return None
            if header.size > max_bytes:
                if not min_one_message:
                    return None
                length = min(header.size, available)
            elif max_bytes < available:
                # The first batch fits (above), so at least it is whole.
                length = segment.whole_batches_end(position, position + max_bytes) - position
            else:
                length = available
            handed_out = True
            return FileSlice(segment, position, length, on_unpinned)
        finally:
            if not handed_out:
                segments.release(segment)
    return None


def offset_for_timestamp(segments: LogSegments, timestamp_ms: int, log_start_offset: int) -> tuple[int, int] | None:
    """First ``(offset, timestamp)`` whose record timestamp is >= ``timestamp_ms`` (Kafka ListOffsets).

    As Kafka: the first segment whose largest timestamp reaches the target, then the time index, then a
    header scan to the first batch whose max timestamp reaches it, then that batch's records (decoded,
    decompressed if needed). Reads one batch from disk. ListOffsets' special timestamps (-1 latest, -2
    earliest) are log_end_offset / log_start_offset: the caller maps them.
    """
    for segment in segments.all:
        if segment.max_timestamp < timestamp_ms or not segment.try_pin():
            continue
        try:
            found = segment.find_timestamp(timestamp_ms, segment.committed_position)
            if found is None:
                continue
            position, header = found
            data = os.pread(segment.fd, header.size, position)
            for offset, timestamp in iter_record_timestamps(data, 0):
                if timestamp >= timestamp_ms and offset >= log_start_offset:
                    return offset, timestamp
        finally:
            segments.release(segment)
    return None


def _headers_from(segments: LogSegments, start_offset: int) -> Iterator[tuple[int, int, BatchHeader]]:
    """``(fd, position, header)`` of each committed batch holding offsets >= ``start_offset`` (pinned while
    yielded)."""
    for segment in segments.all:
        if segment.next_offset <= start_offset or not segment.try_pin():
            continue
        try:
            end_position = segment.committed_position
            found = segment.find_batch(start_offset, end_position) if start_offset > segment.base_offset else None
            start_position = found[0] if found is not None else 0
            for position, header in scan_headers(segment.fd, start_position, end_position):
                if header.last_offset >= start_offset:
                    yield segment.fd, position, header
        finally:
            segments.release(segment)


def transaction_events(segments: LogSegments, start_offset: int = 0) -> Iterator[tuple[BatchHeader, object]]:
    """``(header, marker)`` of each committed batch holding offsets >= ``start_offset``, in order: for control
    batches the ``broker.txn_partition.Marker`` (control type, coordinator epoch), read with one small pread
    each, None for data batches. Blocking (pread): a worker thread, or start-up."""
    from copyless.broker.txn_partition import CONTROL_KEY_READ, read_marker

    for fd, position, header in _headers_from(segments, start_offset):
        marker = None
        if header.is_control:
            data = os.pread(fd, min(header.size, RECORD_BATCH_OVERHEAD + CONTROL_KEY_READ), position)
            marker = read_marker(data)
        yield header, marker


def batch_headers(segments: LogSegments, start_offset: int = 0) -> Iterator[BatchHeader]:
    """Headers of committed batches holding offsets >= ``start_offset``, in order (pread, no CRC)."""
    for _, _, header in _headers_from(segments, start_offset):
        yield header
