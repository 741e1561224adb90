"""LogReads: what a fetch, a ListOffsets by time and a header walk read from a log (mixed into
PartitionLog; loop thread, preads of a few headers, never the map).

A fetch gets a FileSlice (a pinned segment fd, a position and a length) ending on a batch boundary within
its byte limit; the slice is sent with sendfile and released after. Reads pin each segment they touch, so
retention may retire it meanwhile without closing its fd under them.
"""

from __future__ import annotations

import bisect
import os
from typing import Iterator

from copyless.client.protocol.records import RECORD_BATCH_OVERHEAD, BatchHeader, iter_record_timestamps

from .errors import OffsetOutOfRangeError, StorageError, storage_error_from
from .file_slice import FileSlice
from .results import ReadResult
from .scan import scan_headers

__all__ = ["LogReads"]


class LogReads:
    """The read half of PartitionLog (see the module docstring)."""

    def _check_offset(self, offset: int) -> None:
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRangeError(offset, self.log_start_offset, self.log_end_offset,
                                        f"{self.topic}-{self.partition}")

    def read(self, fetch_offset: int, max_bytes: int, *, min_one_message: bool = True,
             max_offset: int | None = None) -> ReadResult:
        try:
            return self._read(fetch_offset, max_bytes, min_one_message, max_offset)
        except OSError as exc:
            raise storage_error_from(exc, "reading", self.directory, offset=fetch_offset) from None

    def _read(self, fetch_offset: int, max_bytes: int, min_one_message: bool, max_offset: int | None) -> ReadResult:
        """A FileSlice of committed bytes starting at the batch holding ``fetch_offset`` (Kafka's fetch rules).

        The region ends within ``max_bytes`` (the first batch whole when ``min_one_message`` even if larger),
        never past the committed end or the batch holding ``max_offset``, and stays within one segment. Unlike
        Kafka it ends on a batch boundary: Kafka cuts at the byte limit and the client downloads a partial
        trailing batch only to drop it and fetch it again (a librdkafka consumer of 10 KB records, 1 MB
        batches, 4 MiB fetches, was sent 5.7% more bytes than it kept). Loop thread; touches disk only to
        pread headers. The caller must release() the slice once sent.

        Raises:
            OffsetOutOfRangeError: fetch_offset < log_start_offset or > log_end_offset.
        """
        if self._closed:
            raise StorageError("log is closed", path=self.directory)
        high_watermark = self.high_watermark
        self._check_offset(fetch_offset)
        log_start_offset = self.log_start_offset
        if fetch_offset == self.log_end_offset or (max_offset is not None and fetch_offset >= max_offset):
            return ReadResult(None, high_watermark, log_start_offset)
        segments, bases = self._segments, self._bases
        slot = max(0, bisect.bisect_right(bases, fetch_offset) - 1)
        for segment in segments[slot:]:
            if not segment.try_pin():
                self._check_offset(fetch_offset)  # retention moved the start meanwhile
                continue
            handed_out = False
            try:
                end_position = segment.committed_position
                found = segment.find_batch(fetch_offset, end_position)
                if found is None:
                    continue
                position, header = found
                if max_offset is not None and header.last_offset >= max_offset and header.base_offset >= max_offset:
                    return ReadResult(None, high_watermark, log_start_offset)
                if max_offset is not None and max_offset < segment.next_offset:
                    limit = segment.find_batch(max_offset, end_position)
                    if limit is not None:
                        end_position = limit[0]
                available = end_position - position
                if available <= 0:
                    return ReadResult(None, high_watermark, log_start_offset)
                if header.size > max_bytes:
                    if not min_one_message:
                        return ReadResult(None, high_watermark, log_start_offset)
                    length = min(header.size, available)
                elif max_bytes < available:
                    # The first batch fits (above), so at least it is whole.
                    length = segment.whole_batches_end(position, position + max_bytes) - position
                else:
                    length = available
                handed_out = True
                return ReadResult(FileSlice(segment, position, length, self._background.on_unpinned),
                                  high_watermark, log_start_offset)
            finally:
                if not handed_out and segment.unpin():
                    self._background.on_unpinned(segment)
        return ReadResult(None, high_watermark, log_start_offset)

    def max_timestamp(self) -> int:
        """The largest batch max timestamp in the log (-1 when empty or when no record has a timestamp).
        O(segments), from the segments' in-memory maxima; loop thread."""
        return max((segment.max_timestamp for segment in self._segments), default=-1)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        try:
            return self._offset_for_timestamp(timestamp_ms)
        except OSError as exc:
            raise storage_error_from(exc, "searching by timestamp", self.directory, timestamp_ms=timestamp_ms) from None

    def _offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """First ``(offset, timestamp)`` whose record timestamp is >= ``timestamp_ms`` (Kafka ListOffsets).

        As Kafka: the first segment whose largest timestamp reaches the target, then the time index, then a
        header scan to the first batch whose max timestamp reaches it, then that batch's records (decoded,
        decompressed if needed). Loop thread; reads one batch from disk. ListOffsets' special timestamps
        (-1 latest, -2 earliest) are log_end_offset / log_start_offset: the caller maps them.
        """
        for segment in self._segments:
            if segment.max_timestamp < timestamp_ms or not segment.try_pin():
                continue
            try:
                found = segment.find_timestamp(timestamp_ms, segment.committed_position)
                if found is None:
                    continue
                position, header = found
                data = os.pread(segment.fd, header.size, position)
                for offset, timestamp in iter_record_timestamps(data, 0):
                    if timestamp >= timestamp_ms and offset >= self.log_start_offset:
                        return offset, timestamp
            finally:
                if segment.unpin():
                    self._background.on_unpinned(segment)
        return None

    def transaction_events(self, start_offset: int = 0) -> Iterator[tuple[BatchHeader, object]]:
        """``(header, marker)`` of each committed batch holding offsets >= ``start_offset``, in order: for
        control batches the ``broker.txn_partition.Marker`` (control type, coordinator epoch), read with one
        small pread each, None for data batches. Blocking (pread): a worker thread, or start-up."""
        from copyless.broker.txn_partition import CONTROL_KEY_READ, read_marker

        for segment in self._segments:
            if segment.next_offset <= start_offset or not segment.try_pin():
                continue
            try:
                end_position = segment.committed_position
                found = segment.find_batch(start_offset, end_position) if start_offset > segment.base_offset else None
                start_position = found[0] if found is not None else 0
                for position, header in scan_headers(segment.fd, start_position, end_position):
                    if header.last_offset < start_offset:
                        continue
                    marker = None
                    if header.is_control:
                        data = os.pread(segment.fd, min(header.size, RECORD_BATCH_OVERHEAD + CONTROL_KEY_READ),
                                        position)
                        marker = read_marker(data)
                    yield header, marker
            finally:
                if segment.unpin():
                    self._background.on_unpinned(segment)

    def batch_headers(self, start_offset: int = 0) -> Iterator[BatchHeader]:
        """Headers of committed batches holding offsets >= ``start_offset``, in order (pread, no CRC)."""
        for segment in self._segments:
            if segment.next_offset <= start_offset or not segment.try_pin():
                continue
            try:
                end_position = segment.committed_position
                found = segment.find_batch(start_offset, end_position) if start_offset > segment.base_offset else None
                start_position = found[0] if found is not None else 0
                for _, header in scan_headers(segment.fd, start_position, end_position):
                    if header.last_offset >= start_offset:
                        yield header
            finally:
                if segment.unpin():
                    self._background.on_unpinned(segment)
