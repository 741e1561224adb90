"""PartitionLog: the ordered segments of one partition: append, read, roll, flush, retention, load/recovery.

Directory ``<topic>-<partition>/`` holds the segments (formats in segment.py and index.py). Offsets are
assigned here, contiguously: a batch appended at log_end_offset L gets baseOffset L and the log end moves to
L + recordsCount.

Threads. ``append``/``read``/``offset_for_timestamp``/``batch_headers`` run on the event-loop thread and
never block: an append is a memcpy into a pre-warmed map plus header rewrites; reads pread a few headers and
return FileSlice handles. Seal, flush, warm-up and deletion run on the Background executors. Retention may
run on any thread: it swaps the (immutable) segment tuple under ``_lock`` and readers work on whichever
tuple they read, pinning a segment before touching its fd.

Positions and offsets::

    log_start_offset <= high_watermark <= log_end_offset
    log_start_offset <= flushed_offset <= log_end_offset
    recovery_point = flushed_offset, held back to the base of a rolled segment until its seal (trim + index
                     fdatasync) is done: recovery rescans from the segment holding it.

The high watermark is replication's (the partition layer sets it: on a single node, to the log end after
each append); the log keeps it so it survives a restart (the data dir's ``high-watermark-checkpoint``,
written by LogManager) and reports it with each read. ``leader_epochs`` (leader_epoch_cache.py) records the
leader epoch of each stretch of the log; its file covers every batch below the recovery point: each flush
and seal writes it (when it changed) before the recovery point moves.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Iterator, NamedTuple

from copyless.client.protocol.records import (
    LOG_OVERHEAD,
    BatchHeader,
    InvalidBatchError,
    iter_batches,
    iter_record_timestamps,
    validate_batch,
)

from . import filenames
from . import segment as segment_module
from ._failpoints import failpoint
from ._fileops import sync_data
from . import blocking
from .background import Background
from .checkpoint import fsync_directory
from .config import LogConfig
from .errors import (AppendNotReady, OffsetOutOfRangeError, StorageError, UnexpectedAppendOffsetError, free_bytes,
                     storage_error_from)
from .file_slice import FileSlice
from .leader_epoch_cache import LeaderEpochCache
from .segment import PreparedSegment, RecoveryOutcome, Segment, now_ms, scan_headers
from .truncation import TruncationMixin

__all__ = ["PartitionLog", "AppendResult", "FollowerAppend", "ReadResult", "LoadStats"]

log = logging.getLogger("copyless.storage")

# When to prepare (create, posix_fallocate, pre-fault) the next segment: once the active one is past half
# full *and* expected to fill within PREPARE_HORIZON_MS at its current write rate (or its index, or
# segment.ms, runs out as soon). Pre-faulting 1 GiB takes ~0.1-0.4 s here, so 10 s leaves a wide margin,
# and only partitions about to roll hold a spare segment's worth of disk (a spare for every partition would
# double what a 1000-partition broker with 1 GiB segments reserves). The half-full floor keeps the warm-up
# away from the roll, where the io thread is already unmapping, trimming and fdatasyncing the sealed
# segment: pre-faulting zeroes pages at ~3 GB/s and competes with appends for memory bandwidth (measured
# here, 1 MiB appends right after a roll ran at 0.38x the warm rate when the next warm-up started at the
# roll, 0.88x when it started at half full). The rate is the larger of the segment-lifetime average and
# the last ~100 ms, so a burst after an idle spell is noticed. A partition appending faster than
# pre-faulting runs (memcpy into warm pages ~6.7 GB/s) still catches its warm-up: the benchmark's "burst".
PREPARE_MIN_FILL = 0.5
PREPARE_HORIZON_MS = 10_000
RATE_SAMPLE_MS = 100
# After a roll failed for lack of space, how often an append may start a background preallocation retry.
ROLL_RETRY_INTERVAL_S = 0.25
MAX_RELATIVE_OFFSET = 0x7FFFFFFF
# Allocate at least this much of the observed append rate ahead of the write position (stepped allocation
# only); the rate of a fresh segment counts from RATE_FLOOR_MS so one early batch does not look like a flood.
ALLOCATE_AHEAD_MS = 1_000
RATE_FLOOR_MS = 10
# Pre-fault at least this much of the observed append rate ahead of the write position (see
# LogConfig.prefault_window_bytes for the floor and segment.py for why it is a window). Half a second: the warm thread pre-faults
# recycled memory at ~6.7 GB/s, so it stays ahead of any append rate this machine reaches once it has a head
# start of a few milliseconds; a longer window only pre-faults more pages a run may never use. A partition
# appending at 6 GB/s (the storage benchmark's 1 MiB batches) gets whole segments, as before.
WARM_AHEAD_MS = 500
# The head of the next segment is asked for this many times the time pre-faulting it should take before the
# roll: the warm thread may first finish a step of the active segment's window.
HEAD_LEAD_MARGIN = 1.5


class AppendResult(NamedTuple):
    base_offset: int
    last_offset: int
    log_append_time_ms: int  # -1 for CreateTime
    log_start_offset: int


class FollowerAppend(NamedTuple):
    first_offset: int
    last_offset: int  # first_offset - 1 when nothing was appended
    headers: list[tuple[int, BatchHeader]]  # (base offset, header) of each appended batch


class ReadResult(NamedTuple):
    slice: FileSlice | None
    high_watermark: int
    log_start_offset: int


class LoadStats(NamedTuple):
    segments: int
    segments_recovered: int
    bytes_rescanned: int
    bytes_discarded: int
    segments_removed: int
    seconds: float


class PartitionLog(TruncationMixin):
    """One partition's log. See the module docstring for the threading rules; truncation is in
    truncation.py."""

    def __init__(self, topic: str, partition: int, directory: Path, config: LogConfig, background: Background,
                 segments: list[Segment]) -> None:
        self.topic = topic
        self.partition = partition
        self.directory = directory
        self.config = config
        self._background = background
        self._lock = threading.Lock()  # segment tuple swaps (roll, retention)
        self._segments: tuple[Segment, ...] = tuple(segments)
        self._bases: tuple[int, ...] = tuple(s.base_offset for s in segments)
        self._active = segments[-1]
        self.log_start_offset = segments[0].base_offset
        self.log_end_offset = self._active.next_offset
        self.flushed_offset = self.log_end_offset
        # Replication's committed end (set_high_watermark, loop thread); load() restores the checkpointed one.
        self.high_watermark = self.log_end_offset
        self.leader_epochs = LeaderEpochCache(directory / filenames.LEADER_EPOCH_CHECKPOINT,
                                              schedule_flush=self._submit_flush)
        # LogManager's writer of the data dir's offset checkpoints (blocking): truncation and DeleteRecords
        # call it before they return, so their new offsets survive a crash. None: a log outside a manager.
        self.checkpoint_offsets = None
        self._truncations = 0  # bumped by each truncation: a flush that raced one does not move flushed_offset
        self._pending_log_start: int | None = None  # a full truncation's new start, checkpointed before it cuts
        # (log_end_offset, active segment, its committed position): one tuple, replaced atomically after each
        # append, so a flush thread reads a consistent snapshot without a lock.
        self._commit_point = (self.log_end_offset, self._active, self._active.committed_position)
        self._prepared: PreparedSegment | None = None
        self._prepared_future: Future | None = None
        self._prepared_sequence = 0
        self._sealing: list[Segment] = []
        self._io_lock = threading.Lock()  # serialises fdatasync with seal (unmap/trim) of the same segment
        self._flush_lock = threading.Lock()
        self._flush_waiters: list[tuple[int, Future]] = []
        self._flush_requested = False
        self._flush_scheduled = False
        self._last_flush_ms = now_ms()
        self._directory_durable = True
        self._closed = False
        self._last_unprepared_warning_s = -1e9
        # Set while no segment can be preallocated (disk full): rolls are then retried only in the background
        # (see _take_prepared), never by a posix_fallocate on the append path.
        self._roll_error: StorageError | None = None
        self._roll_retry_s = 0.0
        self._rate_sample_ms = 0
        self._rate_sample_bytes = 0
        self._rate_sample_segment: Segment | None = None
        self._recent_bytes_per_ms = 0.0
        self.stats = {"rolls": 0, "rolls_unprepared": 0, "roll_waits": 0, "flushes": 0, "appends": 0,
                      "segments_deleted": 0, "extensions": 0, "extensions_waited": 0}

    # --- properties ----------------------------------------------------------------------------------------

    @property
    def log_start_offset_to_checkpoint(self) -> int:
        """The log start offset the data dir's checkpoint must hold: the new start of a full truncation in
        progress (written before its segments go), else the log start offset."""
        pending = self._pending_log_start
        return self.log_start_offset if pending is None else pending

    def set_high_watermark(self, value: int) -> None:
        """Record replication's high watermark (loop thread, O(1)); LogManager checkpoints it in the
        background."""
        self.high_watermark = value

    def _submit_flush(self, function) -> None:
        """Queue ``function`` on a flush thread (the epoch cache's background writes: off the io thread, whose
        FIFO of seals and renames they would delay). Raises RuntimeError once the executors are shut down."""
        self._background.flush.submit(function)

    @property
    def recovery_point(self) -> int:
        """Everything below is durable with trimmed, synced indexes: recovery rescans from here."""
        if self._pending_log_start is not None:
            return self._pending_log_start  # a full truncation: the log about to start there is empty
        point = self.flushed_offset
        for segment in list(self._sealing):
            point = min(point, segment.base_offset)
        return max(point, self.log_start_offset)

    @property
    def segments(self) -> tuple[Segment, ...]:
        return self._segments

    def segment_base_offsets(self) -> list[int]:
        return list(self._bases)

    @property
    def size_bytes(self) -> int:
        return sum(segment.committed_position for segment in self._segments)

    def __repr__(self) -> str:
        return (f"PartitionLog({self.topic}-{self.partition}, start={self.log_start_offset},"
                f" end={self.log_end_offset}, flushed={self.flushed_offset}, segments={len(self._segments)})")

    # --- append (loop thread) -------------------------------------------------------------------------------

    def append(self, records, *, leader_epoch: int | None = 0, log_append_time_ms: int | None = None) -> AppendResult:
        """Append one or more complete, validated v2 batches; assign their offsets. Loop thread, non-blocking.

        The batches are copied into the active segment's map and their baseOffset (and leader epoch; with
        ``log_append_time_ms``, the LogAppendTime timestamp and CRC) rewritten there. Records are never
        decoded. A ``leader_epoch`` newer than the epoch cache's latest is recorded as starting at the first
        batch; None keeps each batch's epoch as it is (the follower path, which records them itself).

        Never blocks: what a worker thread has not prepared yet (the next segment at a roll, the next step of
        blocks, zeros being written where the batches would go) makes it raise AppendNotReady instead, with
        the worker's work queued; the caller awaits ``ready`` and appends again (``Partition``), or, off the
        event loop, calls ``append_blocking``.

        Raises:
            AppendNotReady: nothing (or, for more batches than one segment holds, only ``appended``) went in.
            StorageError: a needed roll could not create a segment, or blocks could not be allocated (ENOSPC,
                ...); nothing was appended, the log stays consistent and readable.
            ValueError: ``records`` is not a sequence of whole batches, or a batch exceeds segment_bytes.
        """
        if self._closed:
            raise StorageError("log is closed", path=self.directory)
        view = memoryview(records)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        total = len(view)
        batches: list[tuple[int, BatchHeader]] = []
        record_count = 0
        end = 0
        segment_bytes = self.config.segment_bytes
        for position, header in iter_batches(view, 0, total):
            batches.append((position, header))
            record_count += header.last_offset_delta + 1
            size = header.batch_length + LOG_OVERHEAD
            end = position + size
            if size > segment_bytes:
                raise ValueError(f"batch of {size} bytes exceeds segment_bytes {segment_bytes}")
        if not batches or end != total:
            raise ValueError(f"records must be whole v2 batches: {end} of {total} bytes parsed")
        now = now_ms()
        active = self._active
        if self._should_roll(active, total, record_count, now):
            active = self._roll(now)
        base_offset = self.log_end_offset
        if leader_epoch is not None and leader_epoch != self.leader_epochs.latest_epoch():
            # Before the copy: an append that fails part-way (a roll on a full disk) leaves whole batches of
            # this epoch behind, which the entry must cover; an entry at the log end with nothing after it
            # is harmless (a new leader records one before its first append).
            self.leader_epochs.assign(leader_epoch, base_offset)
        if total <= active.room_bytes:
            self._require_allocated(active, active.written_position + total, now)
            next_offset = active.append_run(view, batches, base_offset, leader_epoch, log_append_time_ms)
        else:
            next_offset = self._append_split(view, batches, leader_epoch, log_append_time_ms, now)
            active = self._active
        self.log_end_offset = next_offset
        self._commit_point = (next_offset, active, active.committed_position)
        self.stats["appends"] += 1
        rate = self._append_rate(active, now)
        if active.allocated_bytes < active.capacity_bytes:
            ahead = self._ahead_bytes(rate)
            # After a failed extension (disk full) retry at most every ROLL_RETRY_INTERVAL_S, not per append.
            if active.allocated_bytes - active.written_position < ahead // 2 and (
                    time.monotonic() - active.extension_failed_s >= ROLL_RETRY_INTERVAL_S
                    or active.extension_failed_s < 0) and active.start_extension():
                self.stats["extensions"] += 1
                self._background.submit_warm(active._extension_done, active.extend_ahead,
                                             active.written_position + ahead)
        if self._prepared is None and self._should_prepare(active, now, rate):
            self._prepare_next()
        self._prefault_ahead(active, max(self.config.prefault_window_bytes, int(rate * WARM_AHEAD_MS)), rate)
        flush_messages = self.config.flush_messages
        if flush_messages is not None and next_offset - self.flushed_offset >= flush_messages:
            self._request_flush(None)
        return AppendResult(base_offset, next_offset - 1,
                            -1 if log_append_time_ms is None else log_append_time_ms, self.log_start_offset)

    def append_as_follower(self, records) -> FollowerAppend:
        """Append the leader's batches as they are: offsets, leader epochs and timestamps kept, nothing
        assigned. Loop thread, non-blocking; the same single copy into the map as ``append``.

        Every batch is checked first (framing, magic, CRC-32C, count), so a corrupt fetch appends nothing. A
        trailing partial batch is left out (the next fetch starts at the new log end), as Kafka's follower
        does. Each new epoch a batch carries is recorded in the epoch cache at that batch's base offset.

        Returns:
            FollowerAppend: the offsets appended and each batch's header (producer state is rebuilt from them).
        Raises:
            UnexpectedAppendOffsetError: the first batch does not start at ``log_end_offset``.
            InvalidBatchError: a batch is corrupt, or the batches' offsets do not follow on one another.
            AppendNotReady: as ``append``; ``follower_headers`` lists the batches already in (if any).
            StorageError: as ``append`` (nothing appended, the log stays consistent).
        """
        if self._closed:
            raise StorageError("log is closed", path=self.directory)
        view = memoryview(records)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        total = len(view)
        headers: list[tuple[int, BatchHeader]] = []
        position = 0
        next_offset = self.log_end_offset
        while position < total:
            try:
                header = validate_batch(view, position, limit=total)
            except InvalidBatchError as exc:
                if exc.reason in ("truncated header", "truncated batch"):
                    break  # a fetch cut at its byte limit: the rest comes with the next one
                raise
            if not headers and header.base_offset != next_offset:
                raise UnexpectedAppendOffsetError(header.base_offset, next_offset, f"{self.topic}-{self.partition}")
            if header.base_offset != next_offset:
                raise InvalidBatchError("bad offsets", f"batch at {header.base_offset} after offset {next_offset - 1}")
            headers.append((header.base_offset, header))
            next_offset = header.next_offset
            position += header.size
        first_offset = self.log_end_offset
        if not headers:
            return FollowerAppend(first_offset, first_offset - 1, headers)
        try:
            result = self.append(view[:position], leader_epoch=None)
        except AppendNotReady as exc:
            # Batches a roll split off before the wait are in: their epochs and headers count now.
            appended = [] if exc.appended is None else [(b, h) for b, h in headers if b <= exc.appended[1]]
            self._assign_epochs(appended)
            exc.follower_headers = appended
            raise
        assert result.base_offset == first_offset and result.last_offset == next_offset - 1, (result, next_offset)
        self._assign_epochs(headers)
        return FollowerAppend(first_offset, next_offset - 1, headers)

    def append_as_follower_blocking(self, records, timeout_s: float = 60.0) -> FollowerAppend:
        """``append_as_follower``, waiting (blocking) for whatever the worker threads are preparing. For
        callers off the event loop's thread: tests, tools."""
        view = memoryview(records)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        first_offset = self.log_end_offset
        done: list[tuple[int, BatchHeader]] = []
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                result = self.append_as_follower(view)
            except AppendNotReady as exc:
                done += exc.follower_headers
                if exc.appended is not None:
                    view = view[exc.appended[2]:]
                blocking.check("waiting for the storage's worker threads")
                exc.ready.result(max(0.0, deadline - time.monotonic()))
                continue
            return FollowerAppend(first_offset, result.last_offset, done + result.headers)

    def _assign_epochs(self, headers: list[tuple[int, BatchHeader]]) -> None:
        """Record in the epoch cache each new epoch the appended batches carry, at its first batch."""
        cache = self.leader_epochs
        for base_offset, header in headers:
            if header.partition_leader_epoch != cache.latest_epoch():
                cache.assign(header.partition_leader_epoch, base_offset)

    def _append_split(self, view, batches, leader_epoch, log_append_time_ms, now) -> int:
        """More bytes than one whole segment: append in runs, rolling between them. A StorageError part-way
        leaves the earlier runs appended (they are whole batches with contiguous offsets); so does an
        AppendNotReady, which then says how far the append got (``appended``)."""
        index = 0
        first_offset = next_offset = self.log_end_offset
        while index < len(batches):
            active = self._active
            start = batches[index][0]
            stop = index
            last_offset = next_offset - 1
            while stop < len(batches):
                position, header = batches[stop]
                last_offset += header.last_offset_delta + 1
                if position + header.size - start > active.room_bytes or (
                        last_offset - active.base_offset > MAX_RELATIVE_OFFSET):
                    break
                stop += 1
            try:
                if stop == index:
                    active = self._roll(now)
                    continue
                run_end = batches[stop - 1][0] + batches[stop - 1][1].size
                run = [(position - start, header) for position, header in batches[index:stop]]
                self._require_allocated(active, active.written_position + run_end - start, now)
                next_offset = active.append_run(view[start:run_end], run, next_offset, leader_epoch,
                                                log_append_time_ms)
            except AppendNotReady as exc:
                if next_offset > first_offset:
                    exc.appended = (first_offset, next_offset - 1, start)
                raise
            self.log_end_offset = next_offset
            self._commit_point = (next_offset, active, active.committed_position)
            index = stop
        return next_offset

    def append_blocking(self, records, *, leader_epoch: int = 0, log_append_time_ms: int | None = None,
                        timeout_s: float = 60.0) -> AppendResult:
        """``append``, waiting (blocking) for whatever the worker threads are preparing. For callers off the
        event loop's thread: tests, benchmarks, tools. Raises StorageError (and TimeoutError after
        ``timeout_s`` of waiting)."""
        view = memoryview(records)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        first: AppendResult | None = None
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                result = self.append(view, leader_epoch=leader_epoch, log_append_time_ms=log_append_time_ms)
            except AppendNotReady as exc:
                if exc.appended is not None:
                    base_offset, _last_offset, consumed = exc.appended
                    if first is None:
                        first = AppendResult(base_offset, base_offset, -1, self.log_start_offset)
                    view = view[consumed:]
                blocking.check("waiting for the storage's worker threads")
                started = time.monotonic()
                exc.ready.result(max(0.0, deadline - started))
                exc.waited(time.monotonic() - started)
                continue
            if first is None:
                return result
            return AppendResult(first.base_offset, result.last_offset, result.log_append_time_ms,
                                result.log_start_offset)

    def _append_rate(self, active: Segment, now: int) -> float:
        """Bytes per ms appended to the active segment: the larger of its lifetime average and the last
        ~RATE_SAMPLE_MS, so a burst after an idle spell is noticed at once."""
        written = active.written_position
        if now - self._rate_sample_ms >= RATE_SAMPLE_MS:
            if self._rate_sample_segment is active:
                self._recent_bytes_per_ms = (written - self._rate_sample_bytes) / (now - self._rate_sample_ms)
            else:
                self._recent_bytes_per_ms = 0.0
            self._rate_sample_ms, self._rate_sample_bytes, self._rate_sample_segment = now, written, active
        started = active.first_append_ms
        if started is None:
            return self._recent_bytes_per_ms
        return max(self._recent_bytes_per_ms, written / max(now - started, RATE_FLOOR_MS))

    def _ahead_bytes(self, bytes_per_ms: float) -> int:
        """How many blocks the active segment should own past its write position: ALLOCATE_AHEAD_MS of the
        append rate, at least a first step, at most what the log may reserve (LogConfig.log_ahead_bytes) less
        what a prepared next segment already holds. So the first step of a new partition is small (an
        idle partition holds 4 MiB) and the next ones follow the rate at once (a burst gets whole budgets)."""
        config = self.config
        budget = config.log_ahead_bytes
        prepared = self._prepared
        if prepared is not None and not config.preallocate:
            budget -= prepared.allocated_bytes
        return max(config.first_step_bytes, min(budget, int(bytes_per_ms * ALLOCATE_AHEAD_MS)))

    def _prefault_ahead(self, active: Segment, window: int, bytes_per_ms: float) -> None:
        """Keep ``window`` bytes ahead of the write position pre-faulted (loop thread; a few comparisons per
        append). A refill is asked for once half the window is used, so the warm thread works in steps of
        at least half a window (8 MiB+), one task per segment at a time.

        Near the active segment's end, a whole window at the head of the prepared next one is pre-faulted, so
        the appends after a roll land in warm pages with no pre-faulting running beside them (with only the
        spill pre-faulted, 1 MiB appends after a roll ran at 0.58-0.70x the warm rate instead of 0.94-1.03x),
        while a spare that is never rolled into stays cold. That head is asked for early enough to be done by
        the roll: once the room left would fill (at ``bytes_per_ms``) in less time than pre-faulting a window
        takes at the speed pre-faulting has been going. Appends of 1 MiB batches in a loop run at 5-6 GB/s
        here, pre-faulting fresh memory at ~0.7 GB/s: starting at half a window before the end, as this once
        did, left the head cold and the appends after a roll at 0.2x the warm rate."""
        written = active.written_position
        prefault = active.prefault
        prefault.rate_margin = int(bytes_per_ms * segment_module.ZERO_MARGIN_MS)
        if prefault.target - written < window >> 1 and prefault.want(min(written + window, active.allocated_bytes)):
            self._background.submit_warm(prefault.idle, active.chase, self._background.prefault_helper)
        prepared = self._prepared
        if prepared is None or prepared.taken:
            return
        head = prepared.prefault
        if head.target > window >> 1:
            return  # asked for already (again only if the window more than doubles)
        room = active.capacity_bytes - written
        prefault_ms = window / segment_module.prefault_bytes_per_ms()  # to pre-fault the head
        lead = max(window >> 1, int(HEAD_LEAD_MARGIN * prefault_ms * bytes_per_ms))
        if room < lead and head.want(min(window, prepared.allocated_bytes)):
            self._background.submit_warm(head.idle, prepared.chase, self._background.prefault_helper)

    def _require_allocated(self, active: Segment, end: int, now: int) -> None:
        """Before writing up to ``end``: blocks must cover it. An append that outran extend_ahead queues the
        next step on the warm thread and raises AppendNotReady (the caller awaits it); once an extension
        has failed (disk full), appends past the blocks get StorageError, and a new attempt is queued at
        most every ROLL_RETRY_INTERVAL_S. Loop thread, never blocks; nothing appended when it raises."""
        if end <= active.allocated_bytes:
            return
        self.stats["extensions_waited"] += 1
        extending = not active._extension_done.is_set()
        failed_recently = (active.extension_failed_s >= 0
                           and time.monotonic() - active.extension_failed_s < ROLL_RETRY_INTERVAL_S)
        if not extending and failed_recently:
            raise StorageError("allocating failed: no space for the next step of the segment",
                               path=active.log_path, bytes_needed=end - active.allocated_bytes,
                               bytes_free=free_bytes(self.directory))
        if not extending and active.start_extension():
            self.stats["extensions"] += 1
            target = max(end, active.written_position + self._ahead_bytes(self._append_rate(active, now)))
            self._background.submit_warm(active._extension_done, active.extend_ahead, target)
        raise AppendNotReady("the next step of blocks", active._extension_done.future())

    def _should_roll(self, active: Segment, total_bytes: int, record_count: int, now: int) -> bool:
        """Kafka ``LogSegment.shouldRoll``: size, segment.ms, index full, relative offset overflow."""
        if active.written_position == 0:
            return False
        if total_bytes > active.room_bytes:
            return True
        segment_ms = self.config.segment_ms
        if segment_ms is not None and active.first_append_ms is not None and now - active.first_append_ms > segment_ms:
            return True
        if active.offset_index.is_full or active.time_index.is_full:
            return True
        return self.log_end_offset + record_count - 1 - active.base_offset > MAX_RELATIVE_OFFSET

    def _should_prepare(self, active: Segment, now: int, bytes_per_ms: float) -> bool:
        """True once the active segment should fill (by bytes, index entries or segment.ms) within
        PREPARE_HORIZON_MS at ``bytes_per_ms``."""
        started = active.first_append_ms
        if started is None:
            return False
        written = active.written_position
        elapsed_ms = max(now - started, 1)
        if written >= active.capacity_bytes * PREPARE_MIN_FILL and active.room_bytes <= bytes_per_ms * PREPARE_HORIZON_MS:
            return True
        index = active.offset_index
        if index.entries >= index.max_entries * PREPARE_MIN_FILL and (
                (index.max_entries - index.entries) * elapsed_ms <= index.entries * PREPARE_HORIZON_MS):
            return True
        segment_ms = self.config.segment_ms
        return segment_ms is not None and now - started >= segment_ms - PREPARE_HORIZON_MS

    def _prepare_next(self) -> None:
        """Queue creation + warm-up of the next segment on the warm thread (non-blocking)."""
        self._prepared_sequence += 1
        config, active = self.config, self._active
        # Its first step: the rate's, within what the active segment leaves of the budget.
        rate_bytes = int(self._append_rate(active, now_ms()) * ALLOCATE_AHEAD_MS)
        left = config.log_ahead_bytes - max(0, active.allocated_bytes - active.written_position)
        prepared = PreparedSegment(self.directory, f"{filenames.PREPARED_PREFIX}-{self._prepared_sequence}",
                                   config, max(config.first_step_bytes, min(rate_bytes, left)))
        self._prepared = prepared
        self._prepared_future = self._background.submit_warm(prepared.warm_done, prepared.create_and_warm,
                                                             self.config.index_interval_bytes)

    def _take_prepared(self) -> PreparedSegment:
        """The prepared next segment. When it is not ready (still being created on the warm thread, or never
        asked for: appends outran the preparation horizon), its creation is queued if need be and
        AppendNotReady raised: the roll happens on the append after it is ready. Loop thread, never blocks."""
        if self._roll_error is not None:
            return self._take_prepared_after_error()
        prepared = self._prepared
        if prepared is not None and prepared.ready.is_set():
            if prepared.failed is None:
                self._prepared = self._prepared_future = None
                return prepared
            # Creating it failed (create() removed its files): rolls pause until a retry succeeds.
            self._prepared = self._prepared_future = None
            exc = prepared.failed
            self._roll_error = (storage_error_from(exc, "creating a segment", prepared.log_path,
                                                   bytes_needed=self.config.segment_bytes)
                                if isinstance(exc, OSError) else
                                StorageError(f"creating a segment failed: {exc}", path=prepared.log_path))
            self._roll_retry_s = time.monotonic() + ROLL_RETRY_INTERVAL_S
            log.error("%s-%d: appends paused: %s", self.topic, self.partition, self._roll_error)
            raise self._paused_error()
        if prepared is None:
            # Appends outran the preparation (it starts once a roll is near at the current rate).
            self.stats["rolls_unprepared"] += 1
            now = time.monotonic()
            if now - self._last_unprepared_warning_s >= 60:
                self._last_unprepared_warning_s = now
                log.info("%s-%d: a roll found no prepared segment (%d such rolls so far): appends wait for "
                         "its creation", self.topic, self.partition, self.stats["rolls_unprepared"])
            self._prepare_next()
            prepared = self._prepared
        self.stats["roll_waits"] += 1
        raise AppendNotReady("the next segment", prepared.ready.future())

    def _take_prepared_after_error(self) -> PreparedSegment:
        """Rolls are paused since a segment could not be preallocated: take a segment the background retry
        has prepared, else start such a retry (at most every ROLL_RETRY_INTERVAL_S, and only when statvfs
        shows room for it: one syscall, ~2 us) and refuse this append. Loop thread, never blocks."""
        prepared, future = self._prepared, self._prepared_future
        if prepared is not None and prepared.ready.is_set() and prepared.failed is None:
            self._prepared = self._prepared_future = None
            self._roll_error = None
            log.info("%s-%d: a segment could be preallocated again: appends resume", self.topic, self.partition)
            return prepared
        if prepared is not None and future is not None and future.done():
            # The retry failed (create() removed its files); remember why.
            self._prepared = self._prepared_future = None
            exc = future.exception()
            if isinstance(exc, OSError):
                self._roll_error = storage_error_from(exc, "creating a segment", prepared.log_path,
                                                      bytes_needed=self.config.segment_bytes)
        now = time.monotonic()
        if self._prepared is None and now >= self._roll_retry_s:
            self._roll_retry_s = now + ROLL_RETRY_INTERVAL_S
            config = self.config
            needed = config.segment_bytes + 2 * config.segment_index_bytes
            available = free_bytes(self.directory)
            if available is None or available >= needed:
                self._prepare_next()
        raise self._paused_error()

    def _paused_error(self) -> StorageError:
        cause = self._roll_error
        return StorageError("appends paused: no segment could be preallocated (retrying in the background)",
                            path=cause.path, errno=cause.errno,
                            **{**cause.numbers, "bytes_free": free_bytes(self.directory)})

    def _roll(self, now: int) -> Segment:
        """Seal the active segment and continue in the prepared one. Loop thread, no I/O: the new segment's
        renames and the old one's unmap/trim/fdatasync are queued on the io thread."""
        old = self._active
        prepared = self._take_prepared()
        base_offset = old.next_offset
        failpoint("roll.before_rename")
        new = Segment.from_prepared(prepared, base_offset, self.config.index_interval_bytes)
        old.seal_begin()
        with self._lock:
            if old.committed_position == 0:
                # An empty segment (left read-only by a failed reopen) is replaced, not kept: the rename
                # above already took its file name.
                self._segments = self._segments[:-1] + (new,)
                self._bases = self._bases[:-1] + (base_offset,)
            else:
                self._segments = self._segments + (new,)
                self._bases = self._bases + (base_offset,)
                self._sealing.append(old)
            self._active = new
        if old.committed_position == 0:
            self._directory_durable = False
            self._commit_point = (self.log_end_offset, new, 0)
            self._background.submit_io(old.close)
            self._background.submit_io(self._name_segment, new)  # replaces the empty file's name
            return new
        self._directory_durable = False
        self._commit_point = (self.log_end_offset, new, 0)
        self.stats["rolls"] += 1
        # The seal task holds a pin: retention may retire the segment meanwhile, but not close its fd.
        old.try_pin()
        self._background.submit_io(self._name_segment, new)
        # Kafka flushes the rolled segment asynchronously, never under the append path (KAFKA-9693).
        self._background.submit_io(self._seal, old)
        return new

    def _name_segment(self, segment: Segment) -> None:
        """io thread: give a rolled-to segment its base-offset file names (the directory fsync follows in the
        seal of its predecessor, queued right after)."""
        try:
            if segment.assign_name():
                self._directory_durable = False
        except OSError as exc:
            log.error("%s-%d: naming %s failed: %s", self.topic, self.partition, segment.log_path, exc)

    def _seal(self, segment: Segment) -> None:
        """io thread: unmap + trim + fdatasync a rolled segment, fsync the directory (the new segment's name),
        then move the flushed offset and recovery point past it."""
        try:
            with self._io_lock:
                segment.seal_finish()
                fsync_directory(self.directory)
                self._directory_durable = True
            self.leader_epochs.flush()  # before the recovery point passes this segment (module docstring)
        except (OSError, BufferError) as exc:
            # BufferError: something still exports the map (a memoryview), so it cannot be unmapped and the
            # file must not be trimmed under it. The segment stays readable through its fd; it is left out
            # of the recovery point, so a restart rescans (and trims) it.
            log.error("%s-%d: sealing %s failed: %s", self.topic, self.partition, segment.log_path, exc)
            return
        finally:
            if segment.unpin():
                self._background.on_unpinned(segment)
        with self._lock:
            if segment in self._sealing:
                self._sealing.remove(segment)
        self._advance_flushed(segment.next_offset)

    def roll(self, timeout_s: float = 60.0) -> Segment | None:
        """Roll now (Kafka ``UnifiedLog.roll``) unless the active segment is empty, waiting for the next
        segment if it is still being prepared. Blocking: off the event loop's thread (tests, tools).

        Raises:
            StorageError: the next segment could not be created.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if self._closed:
                raise StorageError("log is closed", path=self.directory)
            if self._active.written_position == 0:
                return None
            try:
                return self._roll(now_ms())
            except AppendNotReady as exc:
                blocking.check("waiting for the next segment")
                exc.ready.result(max(0.0, deadline - time.monotonic()))

    def wait_warm(self, timeout_s: float | None = None) -> bool:
        """Block until the active segment and the prepared next one (if any) are created and pre-faulted as
        far as their windows ask. For benchmarks and tests; never on the loop thread. Returns False on
        timeout."""
        prepared = self._prepared
        events = [event for event in (self._active._warm_done, self._active._extension_done,
                                      self._active.prefault.idle,
                                      prepared.warm_done if prepared is not None else None,
                                      prepared.prefault.idle if prepared is not None else None)
                  if event is not None]
        return all(event.wait(timeout_s) for event in events)

    # --- read (loop thread) --------------------------------------------------------------------------------

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

    # --- flush ------------------------------------------------------------------------------------------

    def flush(self, upto_offset: int | None = None) -> Future:
        """fdatasync everything below ``upto_offset`` (default: the log end) on a flush thread.

        Returns a concurrent Future resolving to the new flushed_offset (or raising StorageError).
        Loop-thread safe: never blocks.
        """
        return self._request_flush(upto_offset, want_future=True)

    def wait_flushed(self, offset: int) -> Future:
        """Group commit (RocketMQ ``GroupCommitService``): resolves once flushed_offset >= ``offset``. Every
        waiter that arrives while an fdatasync runs is covered by the next one, so N producers cost ~1
        fdatasync per round, not N."""
        return self._request_flush(offset, want_future=True)

    def _request_flush(self, upto_offset: int | None, want_future: bool = False) -> Future | None:
        target = self.log_end_offset if upto_offset is None else min(upto_offset, self.log_end_offset)
        future: Future | None = Future() if want_future else None
        with self._flush_lock:
            if self.flushed_offset >= target:
                if future is not None:
                    future.set_result(self.flushed_offset)
                return future
            if future is not None:
                self._flush_waiters.append((target, future))
            else:
                self._flush_requested = True
            if not self._flush_scheduled:
                self._flush_scheduled = True
                try:
                    self._background.flush.submit(self._flush_loop)
                except RuntimeError as exc:  # shut down
                    self._flush_scheduled = False
                    error = StorageError(f"flush unavailable: {exc}", path=self.directory)
                    self._fail_waiters(error)
        return future

    def _flush_loop(self) -> None:
        """Flush thread: fdatasync rounds until no waiter or request is left."""
        while True:
            with self._flush_lock:
                if not self._flush_waiters and not self._flush_requested:
                    self._flush_scheduled = False
                    return
                self._flush_requested = False
            log_end_offset, active, committed_position = self._commit_point
            truncations = self._truncations
            try:
                self._flush_segments(log_end_offset, active, committed_position)
                # The recovery point moves with the flushed offset: the epochs of what lies below it must be
                # in the file first (a write only when they changed, which is rare).
                self.leader_epochs.flush()
            except OSError as exc:
                error = storage_error_from(exc, "fdatasync", self.directory)
                log.error("%s-%d: %s", self.topic, self.partition, error)
                with self._flush_lock:
                    self._flush_scheduled = False
                    self._flush_requested = False
                    self._fail_waiters(error)
                return
            self.stats["flushes"] += 1
            self._last_flush_ms = now_ms()
            if truncations == self._truncations:  # else what it synced was cut meanwhile
                self._advance_flushed(log_end_offset)

    def _flush_segments(self, log_end_offset: int, active: Segment, committed_position: int) -> None:
        with self._io_lock:
            for segment in self._segments:
                if segment.base_offset > log_end_offset or (segment.base_offset == log_end_offset and segment is not active):
                    break
                end = committed_position if segment is active else segment.committed_position
                if segment.flushed_position >= end or not segment.try_pin():
                    continue
                try:
                    sync_data(segment.fd)
                finally:
                    if segment.unpin():
                        self._background.on_unpinned(segment)
                segment.flushed_position = max(segment.flushed_position, end)
            if not self._directory_durable:
                fsync_directory(self.directory)
                self._directory_durable = True

    def _fail_waiters(self, error: Exception) -> None:
        waiters, self._flush_waiters = self._flush_waiters, []
        for _, future in waiters:
            if not future.done():
                future.set_exception(error)

    def _advance_flushed(self, offset: int) -> None:
        with self._flush_lock:
            if offset > self.flushed_offset:
                self.flushed_offset = offset
            flushed = self.flushed_offset
            remaining = []
            for target, future in self._flush_waiters:
                if target <= flushed:
                    if not future.done():
                        future.set_result(flushed)
                else:
                    remaining.append((target, future))
            self._flush_waiters = remaining

    def maybe_flush(self, now: int | None = None) -> bool:
        """flush.ms policy: request a flush if the oldest unflushed data is older than flush_ms."""
        flush_ms = self.config.flush_ms
        now = now_ms() if now is None else now
        if flush_ms is None or self.log_end_offset <= self.flushed_offset or now - self._last_flush_ms < flush_ms:
            return False
        self._request_flush(None)
        return True

    # --- retention (any thread) -------------------------------------------------------------------------

    def run_retention(self, now: int | None = None) -> int:
        """Delete the oldest whole segments past retention.ms (by their largest timestamp) or beyond
        retention.bytes; never the active segment, and only segments wholly below the high watermark
        (Kafka's ``deletableSegments`` rule). The log start offset moves first, then the files are renamed
        ``.deleted`` and handed to the reaper, which removes them once no FileSlice pins them and
        file_delete_delay_ms has passed. Returns the number of segments retired.

        Why the high watermark bounds it: on a leader, records above it are not yet on every ISR member. If
        retention removed them, the log start would pass a follower that is still in the ISR, and that
        follower would have to restart its log at the leader's start, dropping records it never received
        (and the high watermark, held at or above the log start, would jump over them: acks=all writes
        acknowledged without being replicated). A single-node broker's partition layer keeps the high
        watermark at the log end, so there it bounds nothing.
        """
        now = now_ms() if now is None else now
        retention_ms, retention_bytes = self.config.retention_ms, self.config.retention_bytes
        with self._lock:
            segments = self._segments
            candidates = segments[:-1]
            # Only segments whose every record is below the high watermark: the next segment starts at or
            # below it.
            upper_bound = min(self.high_watermark, self.log_end_offset)
            for number, segment in enumerate(segments[1:len(candidates) + 1], start=1):
                if segment.base_offset > upper_bound:
                    candidates = candidates[: number - 1]
                    break
            # The segment before one that still carries its prepared name stays until the rename (io thread,
            # just after the roll) is done: after a crash in that window the successor's base offset is
            # known only from its first batch, and if that batch was torn this named predecessor is what
            # keeps the log end where it was (offsets are never handed out twice).
            for number, segment in enumerate(segments[1:], start=1):
                if not segment.named:
                    candidates = candidates[: number - 1]
                    break
            count = 0
            # Segments wholly below the log start (DeleteRecords moved it past them: Kafka's
            # deleteLogStartOffsetBreachedSegments).
            while count < len(candidates) and segments[count + 1].base_offset <= self.log_start_offset:
                count += 1
            if retention_ms is not None:
                while count < len(candidates):
                    segment = candidates[count]
                    newest = segment.max_timestamp if segment.max_timestamp >= 0 else segment.created_ms
                    if now - newest <= retention_ms:
                        break
                    count += 1
            if retention_bytes is not None:
                excess = sum(segment.committed_position for segment in segments[count:]) - retention_bytes
                while count < len(candidates) and excess - candidates[count].committed_position >= 0:
                    excess -= candidates[count].committed_position
                    count += 1
            if count == 0:
                return 0
            doomed = segments[:count]
            self.log_start_offset = max(self.log_start_offset, segments[count].base_offset)
            # The bound above keeps the new start at or below the high watermark; this only lifts one that
            # was already below the start (a checkpointed value older than a DeleteRecords start).
            self.high_watermark = max(self.high_watermark, self.log_start_offset)
            failpoint("retention.after_log_start")
            self._segments = segments[count:]
            self._bases = self._bases[count:]
            self._sealing = [segment for segment in self._sealing if segment not in doomed]
        # Nothing below the log start needs flushing any more (Kafka bumps the recovery point the same way).
        self._advance_flushed(self.log_start_offset)
        for segment in doomed:
            try:
                segment.rename_deleted()
            except OSError as exc:
                log.warning("%s-%d: renaming %s for deletion failed: %s", self.topic, self.partition,
                            segment.log_path, exc)
            self._background.retire(segment, now + self.config.file_delete_delay_ms)
        self.stats["segments_deleted"] += count
        log.info("%s-%d: retention removed %d segment(s); log start offset now %d", self.topic, self.partition,
                 count, self.log_start_offset)
        return count

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: raise the log start offset to ``offset`` (-1: to the high watermark). Reads below it
        answer OFFSET_OUT_OF_RANGE and ListOffsets(earliest) answers it at once; the whole segments below it go
        the way retention removes segments. Blocking (writes the data dir's log start checkpoint before it
        returns, so the records do not come back after a crash): a worker thread. An offset at or below the
        log start changes nothing.

        Returns:
            the log start offset now.
        Raises:
            OffsetOutOfRangeError: ``offset`` is above the high watermark (Kafka's rule: only committed
                records can be deleted).
        """
        high_watermark = self.high_watermark
        if offset == -1:
            offset = high_watermark
        if offset < 0 or offset > high_watermark:
            raise OffsetOutOfRangeError(offset, self.log_start_offset, high_watermark,
                                        f"{self.topic}-{self.partition} (DeleteRecords beyond the high watermark)")
        with self._lock:
            if offset <= self.log_start_offset:
                return self.log_start_offset
            self.log_start_offset = offset
        self.leader_epochs.truncate_from_start(offset)
        if self.checkpoint_offsets is not None:
            self.checkpoint_offsets()
        self.run_retention()
        log.info("%s-%d: records before offset %d deleted (DeleteRecords)", self.topic, self.partition, offset)
        return self.log_start_offset

    # --- loading (start-up, blocking) ------------------------------------------------------------------------

    @classmethod
    def create_new(cls, topic: str, partition: int, directory: Path, config: LogConfig,
                   background: Background, base_offset: int = 0) -> "PartitionLog":
        """A new, empty log with one segment at ``base_offset`` (blocking: allocates its first step)."""
        directory.mkdir(parents=True, exist_ok=True)
        prepared = PreparedSegment(directory, f"{filenames.PREPARED_PREFIX}-0", config)
        try:
            prepared.create()
        except OSError as exc:
            prepared.warm_done.set()
            raise storage_error_from(exc, "creating a log", directory, bytes_needed=config.segment_bytes) from None
        segment = Segment.from_prepared(prepared, base_offset, config.index_interval_bytes)
        segment.assign_name()
        fsync_directory(directory)
        fsync_directory(directory.parent)
        background.submit_warm(prepared.warm_done, prepared.warm, config.index_interval_bytes)
        if segment.prefault.want(min(config.prefault_window_bytes, segment.allocated_bytes)):
            background.submit_warm(segment.prefault.idle, segment.chase, background.prefault_helper)
        return cls(topic, partition, directory, config, background, [segment])

    @classmethod
    def load(cls, topic: str, partition: int, directory: Path, config: LogConfig, background: Background, *,
             clean: bool, recovery_point: int, high_watermark: int | None = None,
             log_start_offset: int | None = None) -> tuple["PartitionLog", LoadStats]:
        """Open an existing log directory (blocking, start-up).

        Clean: trust files and indexes (cheap sanity checks; a segment failing them is recovered). Unclean:
        rescan every segment from the one holding ``recovery_point``, truncating at the first torn or corrupt
        batch, removing later segments and rebuilding indexes; then fdatasync what was recovered so the
        recovery point can be the log end. The leader epoch cache is loaded and made to agree with the log
        (its file's entries past the log end dropped, the batches from the recovery point scanned again), and
        the checkpointed ``high_watermark`` restored (None: the log start), clamped to the log. A checkpointed
        ``log_start_offset`` above the first segment's base is the log start (DeleteRecords); above the log
        end, the log is emptied and restarted there (a full truncation a crash interrupted, Kafka's rule).
        """
        log_, stats = cls._load_segments(topic, partition, directory, config, background, clean=clean,
                                         recovery_point=max(recovery_point, log_start_offset or 0))
        if log_start_offset is not None and log_start_offset > log_.log_start_offset:
            if log_start_offset > log_.log_end_offset:
                log.warning("%s: the log ends at %d, below its checkpointed start %d: restarting it there",
                            directory, log_.log_end_offset, log_start_offset)
                log_.truncate_fully_and_start_at(log_start_offset)
            else:
                log_.log_start_offset = log_start_offset
        log_._restore_replication_state(rescan_from=None if clean else recovery_point,
                                        high_watermark=high_watermark)
        return log_, stats

    def _restore_replication_state(self, *, rescan_from: int | None, high_watermark: int | None) -> None:
        """Start-up, after the segments are loaded: the epoch cache and the high watermark. Blocking."""
        cache = self.leader_epochs
        cache.restore(self.batch_headers, log_start_offset=self.log_start_offset,
                      log_end_offset=self.log_end_offset, rescan_from=rescan_from)
        if self.log_end_offset == self.log_start_offset:
            cache.clear()
        # Written now: the recovery point written after an unclean start-up is the log end.
        cache.flush()
        start, end = self.log_start_offset, self.log_end_offset
        self.high_watermark = min(max(start if high_watermark is None else high_watermark, start), end)

    @classmethod
    def _load_segments(cls, topic: str, partition: int, directory: Path, config: LogConfig, background: Background,
                       *, clean: bool, recovery_point: int) -> tuple["PartitionLog", LoadStats]:
        started = time.perf_counter()
        bases = cls._clean_directory(directory)
        if not bases:
            # Never restart below the checkpointed recovery point: those offsets were handed out already.
            log_ = cls.create_new(topic, partition, directory, config, background, recovery_point)
            return log_, LoadStats(1, 0, 0, 0, 0, time.perf_counter() - started)
        segments = [Segment.open_existing(directory, base, config.index_interval_bytes) for base in bases]
        first_to_recover = len(segments)
        if not clean:
            first_to_recover = 0
            for number, segment in enumerate(segments):
                if segment.base_offset <= recovery_point:
                    first_to_recover = number
        recovered = rescanned = discarded = removed = 0
        kept: list[Segment] = []
        truncated = False  # a segment out of sequence was found: it and everything after it go
        for number, segment in enumerate(segments):
            if truncated or (kept and segment.base_offset != kept[-1].next_offset):
                if not truncated:
                    log.warning("%s: segment %d does not follow offset %d: removing it and later segments",
                                directory, segment.base_offset, kept[-1].next_offset)
                truncated = True
                segment.close(unlink=True)
                removed += 1
                continue
            if number < first_to_recover and segment.load_clean():
                kept.append(segment)
                continue
            outcome: RecoveryOutcome = segment.recover(config.segment_index_bytes)
            recovered += 1
            rescanned += outcome.valid_bytes
            discarded += outcome.discarded_bytes
            if outcome.stop_reason is not None and outcome.discarded_bytes:
                # A zero tail ("bad length") is the unused preallocated part of a segment; anything else is a
                # torn or corrupt batch. Later segments survive only if they still follow on by offset (the
                # continuity check above): a rolled-but-untrimmed segment keeps its successors, a cut in the
                # middle of the data does not.
                if outcome.stop_reason == "bad length":
                    log.info("%s: %s: trimmed %d bytes of preallocated space past the last batch (at position"
                             " %d)", directory, segment.log_path.name, outcome.discarded_bytes, outcome.valid_bytes)
                else:
                    log.warning("%s: %s: cut at position %d, the end of the last whole batch (%s); the %d bytes"
                                " after it (a torn or corrupt write, and preallocated space) were dropped",
                                directory, segment.log_path.name, outcome.valid_bytes, outcome.stop_reason,
                                outcome.discarded_bytes)
            kept.append(segment)
        if not kept:
            log_ = cls.create_new(topic, partition, directory, config, background, recovery_point)
            return log_, LoadStats(1, recovered, rescanned, discarded, removed, time.perf_counter() - started)
        for segment in kept[:-1]:
            if segment.offset_index.writable or segment.time_index.writable:
                segment.seal_recovered()
        last = kept[-1]
        roll_error: StorageError | None = None
        try:
            last.make_active(config)
        except OSError as exc:
            # Typically ENOSPC: start degraded. The log serves reads; appends get StorageError until a
            # segment can be preallocated (retried in the background, see _take_prepared).
            roll_error = storage_error_from(exc, "preallocating", last.log_path, bytes_needed=config.segment_bytes)
            log.error("%s: cannot reopen %s for appends: %s", directory, last.log_path.name, roll_error)
            last.make_read_only()
        if recovered:
            sync_data(last.fd)
            last.flushed_position = last.committed_position
        fsync_directory(directory)
        log_ = cls(topic, partition, directory, config, background, kept)
        if roll_error is not None:
            log_._roll_error = roll_error
        if last.map is not None:
            background.submit_warm(last._warm_done, last.warm_remainder)
            window_end = min(last.written_position + config.prefault_window_bytes, last.allocated_bytes)
            if last.prefault.want(window_end):
                background.submit_warm(last.prefault.idle, last.chase, background.prefault_helper)
        stats = LoadStats(len(kept), recovered, rescanned, discarded, removed, time.perf_counter() - started)
        return log_, stats

    @staticmethod
    def _clean_directory(directory: Path) -> list[int]:
        """Remove leftovers of interrupted operations and return the segment base offsets, sorted.

        Leftovers: ``*.deleted`` (retention was interrupted; the log start already moved past them);
        ``prepared-*`` files: adopted under their first batch's base offset when they hold batches past the
        named segments (a roll whose renames never ran), removed otherwise (an unused spare); index files
        without a ``.log`` (a roll interrupted between renames; a ``.log`` without indexes gets them rebuilt).
        """
        logs: set[int] = set()
        indexes: list[tuple[int, Path]] = []
        named = [parsed[0] for parsed in map(filenames.parse_segment_file, os.listdir(directory))
                 if parsed is not None and parsed[1] == "log"]
        for entry in sorted(os.scandir(directory), key=lambda entry: entry.name):
            if entry.name.startswith(filenames.PREPARED_PREFIX) and entry.name.endswith(filenames.LOG_SUFFIX):
                adopted = Segment.adopt_prepared(directory, Path(entry.path), max(named, default=-1))
                if adopted is not None:
                    log.info("%s: adopted %s as segment %d (a roll's renames were interrupted)", directory,
                             entry.name, adopted)
        for entry in os.scandir(directory):
            name = entry.name
            path = Path(entry.path)
            if name.endswith(filenames.DELETED_SUFFIX) or name.startswith(filenames.PREPARED_PREFIX) \
                    or name.endswith(".tmp"):
                path.unlink(missing_ok=True)
                continue
            parsed = filenames.parse_segment_file(name)
            if parsed is None:
                continue
            base_offset, kind = parsed
            if kind == "log":
                logs.add(base_offset)
            else:
                indexes.append((base_offset, path))
        for base_offset, path in indexes:
            if base_offset not in logs:
                path.unlink(missing_ok=True)
        return sorted(logs)

    # --- close ------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Clean close: wait for pending seals and flushes, trim the active segment, fdatasync everything,
        release fds and maps. Blocking (worker thread or shutdown). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.stop_warming()
        if self._prepared is not None:
            if self._prepared_future is not None and not self._prepared_future.cancel():
                try:
                    self._prepared_future.result()
                except Exception:
                    pass
            self._prepared.discard()
            self._prepared = self._prepared_future = None
        self._background.submit_io(lambda: None).result()  # pending seals are done (io thread is FIFO)
        with self._io_lock:
            active = self._active
            active.trim_for_shutdown()
            for segment in self._segments:
                if segment.flushed_position < segment.committed_position:
                    sync_data(segment.fd)
                    segment.flushed_position = segment.committed_position
            fsync_directory(self.directory)
        try:
            self.leader_epochs.flush()
        except OSError as exc:
            # The file then lags the log: start-up notices (the last batch's epoch is not the latest entry's)
            # and rebuilds it from the batches.
            log.warning("%s-%d: writing the leader epoch checkpoint failed: %s", self.topic, self.partition, exc)
        self._advance_flushed(self.log_end_offset)
        with self._lock:
            self._sealing.clear()
        for segment in self._segments:
            segment.close()

    def stop_warming(self) -> None:
        """Ask every running pre-fault of this log to stop (shutdown: warm-ups must not delay it)."""
        if self._prepared is not None:
            self._prepared.stop_warm = True
        for segment in self._segments:
            segment.stop_warming()

    def stop_for_abandon(self) -> None:
        """First half of abandon(): refuse appends and stop warm-ups (before the executors stop)."""
        self._closed = True
        self.stop_warming()

    def abandon(self) -> None:
        """Drop maps and fds with no trim, flush or checkpoint: the files are left as a kill -9 at this instant
        leaves them (page cache intact). The Background executors must already be stopped (no task may touch
        these fds any more). For crash tests and emergency stops."""
        self.stop_for_abandon()
        prepared = self._prepared
        if prepared is not None and prepared.map is not None:
            prepared.map.close()
            os.close(prepared.fd)
            prepared.offset_index.close()
            prepared.time_index.close()
        for segment in self._segments:
            segment._warm_done = None
            segment._prepared = None
            segment.close()
        with self._flush_lock:
            self._fail_waiters(StorageError("log abandoned", path=self.directory))

    def retire_all(self, directory: Path, now: int) -> list[Segment]:
        """For delete_log: stop appends and hand every segment to the reaper (files now under ``directory``)."""
        self._closed = True
        self.stop_warming()
        if self._prepared is not None:
            prepared, self._prepared = self._prepared, None
            prepared.stop_warm = True
            self._background.submit_io(prepared.discard)
        segments = list(self._segments)
        for segment in segments:
            segment.log_path = directory / segment.log_path.name
            segment.offset_index.path = directory / segment.offset_index.path.name
            segment.time_index.path = directory / segment.time_index.path.name
        return segments
