"""SegmentRecovery: what start-up does to one segment found on disk (mixed into Segment; file layer, blocking).

A cleanly closed segment is trusted: ``load_clean`` restores its state from the indexes and a scan of the
tail (O(index_interval_bytes)). Otherwise ``recover`` rescans every batch (framing, magic, CRC-32C, and its
offsets against where it sits: ``offsets_problem``), truncates at the first bad one and rebuilds both
indexes; the file is not mapped then (truncating a mapped file and touching the lost pages is SIGBUS). The
CRC does not cover a batch's base offset, so a garbled one is caught only by where the batch sits: not below
what precedes it, within the index's int32 relative range (Kafka's LogSegmentOffsetOverflowException rule),
below the next segment's base offset. Those checks are also what makes every index entry recovery writes
representable. ``make_active`` maps the last segment for appends again with a first step of blocks past its
data; ``adopt_prepared`` names a roll's segment whose renames never ran. Crash story: each of these may be
interrupted and rerun; recovery only ever cuts the segment at its first torn, corrupt or misplaced batch, and
rebuilt indexes are derived from the log.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from copyless.protocol.records import (
    LOG_OVERHEAD,
    RECORD_BATCH_OVERHEAD,
    InvalidBatchError,
    batch_size_at,
    validate_batch,
)

from . import filenames
from ._fileops import no_readaround, preallocate, set_readahead, sync_data
from .background import Completion
from .config import LogConfig
from .index import OffsetIndex, TimeIndex
from .prefault import Prefault
from .prepared_segment import index_allocation_bytes
from .scan import scan_headers

__all__ = ["SegmentRecovery", "RecoveryOutcome", "offsets_problem"]

log = logging.getLogger("copyless.storage")

# Recovery reads whole batches for their CRC: 8 MiB per pread (GIL released) keeps syscalls rare.
RECOVERY_CHUNK_BYTES = 8 << 20

# Kafka's bound on ``offset - segment base offset``: an int32 (the .index stores it as u32, the time index too).
MAX_RELATIVE_OFFSET = 0x7FFFFFFF
# The .index stores positions as u32: no batch of a segment may start past it.
MAX_POSITION = 0xFFFFFFFF


def offsets_problem(base_offset: int, last_offset: int, expected: int, segment_base: int,
                    next_segment_base: int | None) -> str | None:
    """Why a batch with these offsets cannot be the one after ``expected`` (the previous batch's next offset,
    or the segment's base offset for its first batch) in the segment named ``segment_base`` and followed by
    ``next_segment_base`` (None: the last segment); None when it can. A batch past ``expected`` follows a gap
    compaction left (or, on a follower, one the leader's compaction left in what it sent): allowed."""
    if base_offset < expected:
        return f"offset {base_offset}, expected {expected}"
    if last_offset - segment_base > MAX_RELATIVE_OFFSET:
        return f"offsets {base_offset}..{last_offset} overflow the index range of segment {segment_base}"
    if next_segment_base is not None and last_offset >= next_segment_base:
        return f"offsets {base_offset}..{last_offset} reach the next segment's base offset {next_segment_base}"
    return None


@dataclass
class RecoveryOutcome:
    """What a recovery scan of one segment found."""

    valid_bytes: int
    discarded_bytes: int
    batches: int
    stop_reason: str | None  # None when the scan reached the end of the file


class SegmentRecovery:
    """Start-up's part of Segment (see the module docstring). Blocking; start-up or a worker thread."""

    # Segment's state that recovery reads and sets (Segment.__init__ assigns each; declared here for the
    # type checker, which reads this class on its own).
    base_offset: int
    log_path: Path
    fd: int
    offset_index: OffsetIndex
    time_index: TimeIndex
    index_interval_bytes: int
    map: mmap.mmap | None
    committed_position: int
    warm_done: Completion | None
    stop_warm: bool
    closed: bool
    _index_batch: Callable[[int, int, int, int], None]

    @staticmethod
    def adopt_prepared(directory: Path, log_path: Path, after: int) -> int | None:
        """Start-up: a prepared file that already holds a valid first batch was the active segment of a roll
        whose renames never ran. Give it (and its indexes, if present) the name of that batch's base offset
        and return it; None when the file holds no valid batch (an unused spare: the caller removes it) or
        when that batch does not lie past ``after``, the highest base offset of the named segments (a roll's
        segment always comes after them)."""
        try:
            with open(log_path, "rb") as handle:
                head = handle.read(RECORD_BATCH_OVERHEAD)
                size = batch_size_at(head) or 0
                if size < RECORD_BATCH_OVERHEAD or size > 1 << 31:
                    return None
                handle.seek(0)
                first = handle.read(size)
            header = validate_batch(first, cleaned=True)
        except (OSError, InvalidBatchError):
            return None
        base_offset = header.base_offset
        target_log, target_index, target_time_index = filenames.segment_paths(directory, base_offset)
        if base_offset <= after or target_log.exists():
            return None
        stem = log_path.name[: -len(filenames.LOG_SUFFIX)]
        for suffix, target in ((filenames.INDEX_SUFFIX, target_index),
                               (filenames.TIME_INDEX_SUFFIX, target_time_index)):
            source = directory / f"{stem}{suffix}"
            if source.exists():
                os.rename(source, target)
        os.rename(log_path, target_log)
        return base_offset

    def load_clean(self, next_segment_base: int | None = None) -> bool:
        """Restore the in-memory state of a cleanly closed segment from its indexes and a scan of the tail
        after the last index entry (O(index_interval_bytes), not O(segment)). False when the file does not
        end on a batch boundary, a batch of the tail does not sit where its offsets say (``offsets_problem``)
        or an index is not sane: the caller then recovers the segment instead."""
        size = self.committed_position
        start = 0
        if not self.offset_index.sane(0x7FFFFFFF, size) or not self.time_index.sane(0x7FFFFFFF):
            return False
        if self.offset_index.entries:
            _, start = self.offset_index.floor_position(0x7FFFFFFF)
        next_offset = None
        end = start
        expected = self.base_offset
        for position, header in scan_headers(self.fd, start, size):
            if position == start and start:
                expected = header.base_offset  # the indexed batch: checked against the index by sane()
            if offsets_problem(header.base_offset, header.last_offset, expected, self.base_offset,
                               next_segment_base) is not None or position + header.size > MAX_POSITION:
                return False
            expected = next_offset = header.next_offset
            end = position + header.size
        if end != size:
            return False
        self.next_offset = self.base_offset if next_offset is None else next_offset
        self.bytes_since_last_index_entry = size - start
        last = self.time_index.last_entry()
        if last is not None:
            self.max_timestamp, relative = last
            self.offset_of_max_timestamp = self.base_offset + relative
        elif size:
            # No time entry at all (a segment sealed by an older version, or an empty index file): derive the
            # largest timestamp from the headers, O(batches) once.
            for _, header in scan_headers(self.fd, 0, size):
                if header.max_timestamp > self.max_timestamp:
                    self.max_timestamp = header.max_timestamp
                    self.offset_of_max_timestamp = header.base_offset
        return True

    def recover(self, index_bytes: int, next_segment_base: int | None = None) -> RecoveryOutcome:
        """Rescan every batch (framing, magic, CRC-32C, its offsets against where it sits), truncate at the
        first bad one and rebuild both indexes. ``next_segment_base``: the base offset of the segment after
        this one, None for the last. Start-up only, before the segment is mapped. Touches the whole file.

        A batch going back below its predecessor's end means one of the two has a garbled base offset. When
        it would follow the predecessor's records placed right after what preceded them (its base offset at
        least that offset plus the predecessor's record span, which the CRC covers), it is the continuation
        and the predecessor's base offset the outlier: the cut is made at the predecessor. Otherwise at the
        batch. Each batch is indexed only once its successor agrees with it."""
        file_size = os.fstat(self.fd).st_size
        # The index rule adds at most one entry per index_interval_bytes (or per batch) of log: sizing the
        # rebuilt indexes to that bound, not to segment_index_bytes, keeps a recovery from needing more
        # space than the trimmed indexes it replaces (a 512 KiB segment: 1 KiB of .index, not 10 MiB).
        bound_entries = file_size // max(self.index_interval_bytes, RECORD_BATCH_OVERHEAD) + 2
        for index in (self.offset_index, self.time_index):
            index.reset(min(index_bytes, bound_entries * index.entry.size))
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = self.base_offset
        self.bytes_since_last_index_entry = 0
        position = 0
        batches = 0
        stop_reason = None
        buffer = b""
        buffer_start = 0
        # The last accepted batch, (position, base offset, max timestamp, size), indexed once the next one
        # agrees with it; the next offset before it.
        pending: tuple[int, int, int, int] | None = None
        before_pending = self.next_offset
        pending_span = 0
        while position < file_size:
            if file_size - position < RECORD_BATCH_OVERHEAD:
                stop_reason = "truncated header"
                break
            relative = position - buffer_start
            if relative + LOG_OVERHEAD > len(buffer):
                buffer = os.pread(self.fd, min(RECOVERY_CHUNK_BYTES, file_size - position), position)
                buffer_start, relative = position, 0
            size = batch_size_at(buffer, relative)
            if size is None or size < RECORD_BATCH_OVERHEAD:
                stop_reason = "bad length"
                break
            if size > file_size - position:
                stop_reason = "truncated batch"
                break
            if relative + size > len(buffer):
                buffer = os.pread(self.fd, max(size, min(RECOVERY_CHUNK_BYTES, file_size - position)), position)
                buffer_start, relative = position, 0
            try:
                header = validate_batch(buffer, relative, limit=relative + size, cleaned=True)
            except InvalidBatchError as exc:
                stop_reason = exc.reason
                break
            problem = offsets_problem(header.base_offset, header.last_offset, self.next_offset, self.base_offset,
                                      next_segment_base)
            if problem is None and position + size > MAX_POSITION:
                problem = f"batch at position {position} is past the index's position range"
            if problem is not None:
                if pending is not None and header.base_offset < self.next_offset and offsets_problem(
                        header.base_offset, header.last_offset, before_pending + pending_span, self.base_offset,
                        next_segment_base) is None:
                    problem = (f"offset {pending[1]}, expected {before_pending} (the batch after it, at offset "
                               f"{header.base_offset}, continues from there): a garbled base offset")
                    position, pending = pending[0], None
                    self.next_offset = before_pending
                    batches -= 1
                stop_reason = problem
                break
            if pending is not None:
                self._index_batch(*pending)
            pending = (position, header.base_offset, header.max_timestamp, size)
            pending_span = header.last_offset_delta + 1
            before_pending, self.next_offset = self.next_offset, header.next_offset
            position += size
            batches += 1
        if pending is not None:
            self._index_batch(*pending)
        if position < file_size:
            # Unmapped here by construction: truncating a mapped file and touching the cut pages is SIGBUS.
            os.ftruncate(self.fd, position)
        self.capacity_bytes = self.written_position = self.committed_position = position
        self.flushed_position = 0
        return RecoveryOutcome(position, file_size - position, batches, stop_reason)

    def make_active(self, config: LogConfig) -> None:
        """Allocate a first step past the data and map a reopened last segment so appends can continue
        (start-up). Pre-faulting is left to worker threads (warm_remainder for the indexes, the appends'
        pre-fault window for the log)."""
        segment_bytes, index_bytes = config.segment_bytes, config.segment_index_bytes
        self.index_ahead_bytes = config.index_ahead_bytes
        self.window_floor_bytes = config.prefault_window_bytes
        capacity = max(segment_bytes, self.committed_position)
        allocated = min(capacity, self.committed_position + config.first_step_bytes)
        preallocate(self.fd, allocated)
        os.ftruncate(self.fd, capacity)
        set_readahead(self.fd, False)
        region = mmap.mmap(self.fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        no_readaround(region)
        try:
            for index in (self.offset_index, self.time_index):
                full_entries = index_bytes // index.entry.size
                if not index.writable or index.in_memory or index.max_entries < full_entries:
                    index.make_writable(index_bytes, allocate_bytes=index_allocation_bytes(
                        allocated - self.committed_position, index.entry.size, 0, self.index_interval_bytes,
                        self.index_ahead_bytes))
        except BaseException:
            region.close()
            raise
        self.map = region
        self.capacity_bytes = capacity
        self.allocated_bytes = allocated
        self.sealed = False
        self.warm_done = Completion()
        self.prefault = Prefault(self.committed_position, zeros=config.prefault_zeros,
                                 outrun_pwrite=config.outrun_pwrite)

    def make_read_only(self) -> None:
        """After make_active failed (disk full): give back any partial preallocation and take no appends
        (room_bytes == 0), so nothing ever writes past the blocks this file owns. Start-up, unmapped."""
        if self.map is not None:
            self.map.close()
            self.map = None
        os.ftruncate(self.fd, self.committed_position)
        set_readahead(self.fd, True)
        self.capacity_bytes = self.allocated_bytes = self.written_position = self.committed_position
        self.sealed = True
        self.warm_done = None

    def warm_remainder(self) -> None:
        """Pre-fault the unused part of a reopened active segment's indexes (worker thread)."""
        done = self.warm_done
        assert done is not None  # make_active gave it one before submitting this
        try:
            if self.map is not None and not self.sealed:
                stop = lambda: self.sealed or self.closed or self.stop_warm  # noqa: E731
                expected_entries = self.capacity_bytes // max(self.index_interval_bytes, 64) + 2
                for index in (self.offset_index, self.time_index):
                    start = index.entries * index.entry.size
                    end = min(index.allocated_entries, expected_entries) * index.entry.size
                    if index.writable and end > start and not stop():
                        index.prefault(start, end - start, stop)
        except OSError as exc:
            log.warning("warming %s failed: %s", self.log_path, exc)
        finally:
            done.set()

    def seal_recovered(self) -> None:
        """A recovered segment that is not the last one: final time entry, trim the rebuilt indexes,
        fdatasync (start-up)."""
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp - self.base_offset,
                                         final=True)
        for index in (self.offset_index, self.time_index):
            index.seal_readers()
            index.trim()
            index.sync()
        sync_data(self.fd)
        self.flushed_position = self.committed_position
