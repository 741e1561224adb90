"""PartitionLog: one partition's log: offsets, append, roll, close, composed of objects that own their state
(file layer).

Directory ``<topic>-<partition>/`` holds the segments (formats in segment.py and index.py), the leader epoch
checkpoint (leader_epoch_cache.py) and a cleaning's swap manifest (cleaner.py). Offsets are assigned here,
contiguously: a batch appended at log_end_offset L gets baseOffset L and the log end moves to
L + recordsCount. As Kafka's log layer is split (UnifiedLog, LocalLog, LogSegments, LogLoader), this class
owns the log's offsets (log start, log end, high watermark, a full truncation's pending start), the
closed flag and the stats, and is built from, or delegates to:

    LogSegments (log_segments.py)   the segment tuple, the active segment, the seals running, the swap and io
                                    locks, pinning; a segment's companion files are the segment's own;
    LogLoader (loader.py)           reads the directory and returns the LoadedLog this is constructed from;
    Flusher (flusher.py)            flushed offset, commit point, group commit, the directory's fsync;
    LeaderEpochCache                the epochs of the log's stretches;
    log_reads.py                    fetch slices, ListOffsets by time, header walks (functions);
    retention.py                    which segments retention removes (a pure function);
    truncation.py                   the file steps of a truncation (functions), run in order here;
    SegmentPreparation              the next segment, blocks and pages made ready ahead of the appends,
                                    rolls paused on a full disk (preparation.py).

Threads. ``append``/``read``/``offset_for_timestamp``/``batch_headers`` run on the event-loop thread and
never block: an append is a memcpy into a pre-warmed map plus header rewrites; reads pread a few headers and
return FileSlice handles. Seal, flush, warm-up and deletion run on the Background executors. Retention may
run on any thread: it swaps the (immutable) segment tuple under the segment list's lock and readers work on
whichever tuple they read, pinning a segment before touching its fd. Truncation runs on a worker thread
with appends paused.

Positions and offsets::

    log_start_offset <= high_watermark <= log_end_offset
    log_start_offset <= flushed_offset <= log_end_offset
    recovery_point = flushed_offset, held back to the base of a rolled segment until its seal (trim + index
                     fdatasync) is done: recovery rescans from the segment holding it.

The high watermark is replication's (the partition layer sets it: on a single node, to the log end after
each append); the log keeps it so it survives a restart (the data dir's ``high-watermark-checkpoint``,
written by LogManager) and reports it with each read. ``leader_epochs`` (leader_epoch_cache.py) records the
leader epoch of each stretch of the log; its file covers every batch below the recovery point: each flush
and seal writes it (when it changed) before the recovery point moves. Crash story: the recovery point, the
data dir's checkpoints and the ordered steps of each module (roll here and in segment.py, truncation.py,
retention.py, cleaner.py) leave a log that start-up (loader.py) makes a prefix of what was acknowledged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

from copyless.protocol.records import (
    LOG_OVERHEAD,
    BatchHeader,
    InvalidBatchError,
    iter_batches,
    validate_batch,
)

from . import log_reads
from ._failpoints import delaypoint, failpoint
from ._fileops import sync_data
from .background import Background
from .checkpoint import fsync_directory
from .clock import now_ms
from .config import LogConfig
from .errors import (
    AppendNotReady,
    OffsetOutOfRangeError,
    StorageError,
    UnexpectedAppendOffsetError,
    storage_error_from,
)
from .flusher import Flusher
from .loader import LoadedLog, LoadStats, LogLoader, create_segment
from .log_segments import LogSegments
from .preparation import SegmentPreparation
from .prepared_segment import PreparedSegment
from .results import AppendResult, FollowerAppend, ReadResult
from .retention import deletable_count
from .segment import Segment
from .truncation import cut_files, reactivate, rename_all_deleted

__all__ = ["PartitionLog", "AppendResult", "FollowerAppend", "ReadResult", "LoadStats"]

log = logging.getLogger("copyless.storage")

MAX_RELATIVE_OFFSET = 0x7FFFFFFF


class PartitionLog:
    """One partition's log. See the module docstring for the threading rules."""

    def __init__(self, topic: str, partition: int, directory: Path, config: LogConfig, background: Background,
                 loaded: LoadedLog) -> None:
        self.topic = topic
        self.partition = partition
        self.directory = directory
        self._config = config
        self._background = background
        self._segments: LogSegments = loaded.segments
        self.log_start_offset = loaded.log_start_offset
        self.log_end_offset = loaded.log_end_offset
        # Replication's committed end (set_high_watermark, loop thread); the loader restores the checkpointed one.
        self.high_watermark = loaded.high_watermark
        self.leader_epochs = loaded.leader_epochs
        self.stats = {"rolls": 0, "rolls_unprepared": 0, "roll_waits": 0, "flushes": 0, "appends": 0,
                      "segments_deleted": 0, "extensions": 0, "extensions_waited": 0}
        self._flusher = Flusher(f"{topic}-{partition}", directory, self._segments, background, self.leader_epochs,
                                loaded.recovery_point, self.stats)
        # LogManager's writer of the data dir's offset checkpoints (blocking): truncation and DeleteRecords
        # call it before they return, so their new offsets survive a crash. None: a log outside a manager.
        self.checkpoint_offsets = None
        self._pending_log_start: int | None = None  # a full truncation's new start, checkpointed before it cuts
        self._closed = False
        self._preparation = SegmentPreparation(f"{topic}-{partition}", directory, config, background,
                                               self._segments, self.stats, loaded.roll_error)

    @property
    def config(self) -> LogConfig:
        return self._config

    @config.setter
    def config(self, config: LogConfig) -> None:
        """A topic's settings changed (AlterConfigs, or the broker's defaults): the next roll, step and
        retention check use them. The preparation of segments keeps its own reference, so it is told too."""
        self._config = config
        self._preparation.config = config

    # --- construction (blocking) ----------------------------------------------------------------------------

    @classmethod
    def create_new(cls, topic: str, partition: int, directory: Path, config: LogConfig,
                   background: Background, base_offset: int = 0) -> PartitionLog:
        """A new, empty log with one segment at ``base_offset`` (blocking: allocates its first step)."""
        loaded = LogLoader(directory, config, background).create_new(base_offset)
        return cls(topic, partition, directory, config, background, loaded)

    @classmethod
    def load(cls, topic: str, partition: int, directory: Path, config: LogConfig, background: Background, *,
             clean: bool, recovery_point: int, high_watermark: int | None = None,
             log_start_offset: int | None = None) -> tuple[PartitionLog, LoadStats]:
        """Open an existing log directory (blocking, start-up): ``LogLoader.load`` says how."""
        loaded = LogLoader(directory, config, background).load(
            clean=clean, recovery_point=recovery_point, high_watermark=high_watermark,
            log_start_offset=log_start_offset)
        return cls(topic, partition, directory, config, background, loaded), loaded.stats

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

    @property
    def flushed_offset(self) -> int:
        """Everything below is fdatasynced (flusher.py)."""
        return self._flusher.flushed_offset

    @property
    def recovery_point(self) -> int:
        """Everything below is durable with trimmed, synced indexes: recovery rescans from here."""
        if self._pending_log_start is not None:
            return self._pending_log_start  # a full truncation: the log about to start there is empty
        return max(self._segments.sealing_floor(self._flusher.flushed_offset), self.log_start_offset)

    @property
    def segments(self) -> tuple[Segment, ...]:
        return self._segments.all

    @property
    def log_segments(self) -> LogSegments:
        """The segment list itself (the cleaner swaps cleaned segments in under its locks)."""
        return self._segments

    @property
    def background(self) -> Background:
        return self._background

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def next_segment(self) -> PreparedSegment | None:
        """The next segment being prepared for the roll, if any (tests, benchmarks)."""
        return self._preparation.prepared

    def wait_warm(self, timeout_s: float | None = None) -> bool:
        """Block until the active segment and the prepared next one (if any) are created and pre-faulted as
        far as their windows ask. For benchmarks and tests; never on the loop thread. False on timeout."""
        return self._preparation.wait_warm(timeout_s)

    def segment_base_offsets(self) -> list[int]:
        return self._segments.base_offsets()

    @property
    def size_bytes(self) -> int:
        return self._segments.size_bytes

    def __repr__(self) -> str:
        return (f"PartitionLog({self.topic}-{self.partition}, start={self.log_start_offset},"
                f" end={self.log_end_offset}, flushed={self.flushed_offset}, segments={len(self.segments)})")

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
        event loop, waits for ``ready`` and calls again.

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
        active = self._segments.active
        preparation = self._preparation
        if self._should_roll(active, total, record_count, now):
            active = self._roll(now)
        base_offset = self.log_end_offset
        if leader_epoch is not None and leader_epoch != self.leader_epochs.latest_epoch():
            # Before the copy: an append that fails part-way (a roll on a full disk) leaves whole batches of
            # this epoch behind, which the entry must cover; an entry at the log end with nothing after it
            # is harmless (a new leader records one before its first append).
            self.leader_epochs.assign(leader_epoch, base_offset)
        if total <= active.room_bytes:
            preparation.require_allocated(active, active.written_position + total, now)
            next_offset = active.append_run(view, batches, base_offset, leader_epoch, log_append_time_ms)
        else:
            next_offset = self._append_split(view, batches, leader_epoch, log_append_time_ms, now)
            active = self._segments.active
        self.log_end_offset = next_offset
        flusher = self._flusher
        flusher.commit_point = (next_offset, active, active.committed_position)
        self.stats["appends"] += 1
        preparation.after_append(active, now)
        flush_messages = self.config.flush_messages
        if flush_messages is not None and next_offset - flusher.flushed_offset >= flush_messages:
            flusher.request(None)
        return AppendResult(base_offset, next_offset - 1,
                            -1 if log_append_time_ms is None else log_append_time_ms, self.log_start_offset)

    def append_as_follower(self, records) -> FollowerAppend:
        """Append the leader's batches as they are: offsets, leader epochs and timestamps kept, nothing
        assigned. Loop thread, non-blocking; the same single copy into the map as ``append``.

        Every batch is checked first (framing, magic, CRC-32C, count), so a corrupt fetch appends nothing. A
        trailing partial batch is left out (the next fetch starts at the new log end), as Kafka's follower
        does. Each new epoch a batch carries is recorded in the epoch cache at that batch's base offset. A
        leader's compacted log has offset gaps: a first batch past the log end moves the log end over the gap,
        and a gap between two batches ends what is appended now (the rest comes with the next fetch).

        Returns:
            FollowerAppend: the offsets appended and each batch's header (producer state is rebuilt from them).
        Raises:
            UnexpectedAppendOffsetError: the first batch starts below ``log_end_offset``.
            InvalidBatchError: a batch is corrupt, or the batches' offsets go back.
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
                header = validate_batch(view, position, limit=total, cleaned=True)
            except InvalidBatchError as exc:
                if exc.reason in ("truncated header", "truncated batch"):
                    break  # a fetch cut at its byte limit: the rest comes with the next one
                raise
            if not headers and header.base_offset < next_offset:
                raise UnexpectedAppendOffsetError(header.base_offset, next_offset, f"{self.topic}-{self.partition}")
            if header.base_offset < next_offset:
                raise InvalidBatchError("bad offsets", f"batch at {header.base_offset} after offset {next_offset - 1}")
            if headers and header.base_offset > next_offset:
                # A gap the leader's cleaner left: this run ends here, the next fetch starts at the gap.
                break
            headers.append((header.base_offset, header))
            next_offset = header.next_offset
            position += header.size
        if not headers:
            return FollowerAppend(self.log_end_offset, self.log_end_offset - 1, headers)
        if headers[0][0] > self.log_end_offset:
            # The leader compacted away the offsets between our log end and this batch (cleaner.py): the
            # log end moves over the gap, as Kafka's follower takes the leader's batches at their offsets.
            self.log_end_offset = headers[0][0]
        first_offset = self.log_end_offset
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
            active = self._segments.active
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
                self._preparation.require_allocated(active, active.written_position + run_end - start, now)
                next_offset = active.append_run(view[start:run_end], run, next_offset, leader_epoch,
                                                log_append_time_ms)
            except AppendNotReady as exc:
                if next_offset > first_offset:
                    exc.appended = (first_offset, next_offset - 1, start)
                raise
            self.log_end_offset = next_offset
            self._flusher.commit_point = (next_offset, active, active.committed_position)
            index = stop
        return next_offset

    def roll(self) -> Segment | None:
        """Roll now (Kafka ``UnifiedLog.roll``) unless the active segment is empty (None then). Loop thread,
        non-blocking: raises AppendNotReady, with the preparation queued, while the next segment is not ready
        (await ``ready`` and call again).

        Raises:
            StorageError: the log is closed, or the next segment could not be created.
        """
        if self._closed:
            raise StorageError("log is closed", path=self.directory)
        if self._segments.active.written_position == 0:
            return None
        return self._roll(now_ms())

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

    def _roll(self, now: int) -> Segment:
        """Seal the active segment and continue in the prepared one. Loop thread, no I/O: the new segment's
        renames and the old one's unmap/trim/fdatasync are queued on the io thread."""
        segments = self._segments
        old = segments.active
        prepared = self._preparation.take_prepared()
        base_offset = old.next_offset
        failpoint("roll.before_rename")
        new = Segment.from_prepared(prepared, base_offset, self.config.index_interval_bytes)
        old.seal_begin()
        old.sealing_holdings = old.block_holdings()  # charged until the seal is done (block_budget)
        kept = segments.roll(old, new)
        flusher = self._flusher
        flusher.directory_durable = False
        flusher.commit_point = (self.log_end_offset, new, 0)
        if not kept:
            # An empty segment (left read-only by a failed reopen) was replaced, not kept: the rename above
            # already took its file name.
            self._background.submit_io(old.close)
            self._background.submit_io(self._name_segment, new)  # replaces the empty file's name
            return new
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
                self._flusher.directory_durable = False
        except OSError as exc:
            log.error("%s-%d: naming %s failed: %s", self.topic, self.partition, segment.log_path, exc)

    def _seal(self, segment: Segment) -> None:
        """io thread: unmap + trim + fdatasync a rolled segment, fsync the directory (the new segment's name),
        then move the flushed offset and recovery point past it."""
        segments = self._segments
        try:
            with segments.io_lock:
                segment.seal_finish()
                self._flusher.sync_directory_locked()
            self.leader_epochs.flush()  # before the recovery point passes this segment (module docstring)
        except (OSError, BufferError) as exc:
            # BufferError: something still exports the map (a memoryview), so it cannot be unmapped and the
            # file must not be trimmed under it. The segment stays readable through its fd; it is left out
            # of the recovery point, so a restart rescans (and trims) it.
            log.error("%s-%d: sealing %s failed: %s", self.topic, self.partition, segment.log_path, exc)
            return
        finally:
            segments.release(segment)
        segments.sealed(segment)
        self._flusher.advance(segment.next_offset)

    # --- reads (loop thread; log_reads.py) ---------------------------------------------------------------------

    def _check_offset(self, offset: int) -> None:
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRangeError(offset, self.log_start_offset, self.log_end_offset,
                                        f"{self.topic}-{self.partition}")

    def read(self, fetch_offset: int, max_bytes: int, *, min_one_message: bool = True,
             max_offset: int | None = None) -> ReadResult:
        """A FileSlice of committed bytes starting at the batch holding ``fetch_offset``, within ``max_bytes``
        and below ``max_offset`` (``log_reads.read_slice`` has the rules), with the high watermark and log
        start. Loop thread; touches disk only to pread headers. The caller must release() the slice once sent.

        Raises:
            OffsetOutOfRangeError: fetch_offset < log_start_offset or > log_end_offset.
            StorageError: the log is closed, or a pread failed.
        """
        if self._closed:
            raise StorageError("log is closed", path=self.directory)
        high_watermark = self.high_watermark
        self._check_offset(fetch_offset)
        log_start_offset = self.log_start_offset
        if fetch_offset == self.log_end_offset or (max_offset is not None and fetch_offset >= max_offset):
            return ReadResult(None, high_watermark, log_start_offset)
        try:
            found = log_reads.read_slice(self._segments, fetch_offset, max_bytes, min_one_message, max_offset,
                                         self._check_offset, self._background.on_unpinned)
        except OSError as exc:
            raise storage_error_from(exc, "reading", self.directory, offset=fetch_offset) from None
        return ReadResult(found, high_watermark, log_start_offset)

    def max_timestamp(self) -> int:
        """The largest batch max timestamp in the log (-1 when empty or when no record has a timestamp).
        O(segments), from the segments' in-memory maxima; loop thread."""
        return self._segments.max_timestamp()

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """First ``(offset, timestamp)`` whose record timestamp is >= ``timestamp_ms`` (Kafka ListOffsets;
        ``log_reads.offset_for_timestamp``). Loop thread; reads one batch from disk."""
        try:
            return log_reads.offset_for_timestamp(self._segments, timestamp_ms, self.log_start_offset)
        except OSError as exc:
            raise storage_error_from(exc, "searching by timestamp", self.directory, timestamp_ms=timestamp_ms) from None

    def transaction_events(self, start_offset: int = 0) -> Iterator[tuple[BatchHeader, object]]:
        """``(header, marker)`` of each committed batch from ``start_offset`` (``log_reads``). Blocking."""
        return log_reads.transaction_events(self._segments, start_offset)

    def batch_headers(self, start_offset: int = 0) -> Iterator[BatchHeader]:
        """Headers of committed batches holding offsets >= ``start_offset``, in order (pread, no CRC)."""
        return log_reads.batch_headers(self._segments, start_offset)

    # --- flushes (any thread; flusher.py) -----------------------------------------------------------------------

    def flush(self, upto_offset: int | None = None) -> Future:
        """fdatasync everything below ``upto_offset`` (default: the log end) on a flush thread. A concurrent
        Future of the new flushed offset (or StorageError). Never blocks."""
        return self._flusher.flush(upto_offset)

    def wait_flushed(self, offset: int) -> Future:
        """Group commit: resolves once flushed_offset >= ``offset`` (``Flusher.wait_flushed``)."""
        return self._flusher.wait_flushed(offset)

    def maybe_flush(self, now: int | None = None) -> bool:
        """flush.ms policy: request a flush if the oldest unflushed data is older than flush_ms."""
        return self._flusher.maybe_flush(self.config.flush_ms, now)

    # --- retention and DeleteRecords (any thread; retention.py) -------------------------------------------------

    def run_retention(self, now: int | None = None) -> int:
        """Delete the oldest whole segments past retention.ms or beyond retention.bytes, or below the log
        start (``retention.deletable_count`` has the rules: never the active segment, only segments wholly
        below the high watermark). The log start offset moves first, then the files are renamed ``.deleted``
        and handed to the reaper, which removes them once no FileSlice pins them and file_delete_delay_ms has
        passed. Returns the number of segments retired."""
        now = now_ms() if now is None else now
        segments = self._segments
        with segments.lock:
            current = segments.all
            count = deletable_count(current, self.config, now, log_start_offset=self.log_start_offset,
                                    upper_bound=min(self.high_watermark, self.log_end_offset))
            if count == 0:
                return 0
            self.log_start_offset = max(self.log_start_offset, current[count].base_offset)
            # The bound above keeps the new start at or below the high watermark; this only lifts one that
            # was already below the start (a checkpointed value older than a DeleteRecords start).
            self.high_watermark = max(self.high_watermark, self.log_start_offset)
            failpoint("retention.after_log_start")
            doomed = segments.drop_first_locked(count)
        # Nothing below the log start needs flushing any more (Kafka bumps the recovery point the same way).
        self._flusher.advance(self.log_start_offset)
        for segment in doomed:
            try:
                segment.rename_deleted()
            except OSError as exc:
                log.warning("%s-%d: renaming %s for deletion failed: %s", self.topic, self.partition,
                            segment.log_path, exc)
        segments.retire(doomed, now + self.config.file_delete_delay_ms)
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
        with self._segments.lock:
            if offset <= self.log_start_offset:
                return self.log_start_offset
            self.log_start_offset = offset
        self.leader_epochs.truncate_from_start(offset)
        if self.checkpoint_offsets is not None:
            self.checkpoint_offsets()
        self.run_retention()
        log.info("%s-%d: records before offset %d deleted (DeleteRecords)", self.topic, self.partition, offset)
        return self.log_start_offset

    # --- truncation (a worker thread, appends paused; truncation.py has the steps and the crash story) ----------

    def truncate_to(self, offset: int) -> None:
        """Cut the log so it ends at ``offset``: a follower's truncation to where it agrees with its leader.
        Blocking: a worker thread, appends to this partition paused. A target inside a batch cuts the whole
        batch (the log end becomes its base offset); at or past the log end, nothing happens; below the log
        start, the log restarts empty there (``truncate_fully_and_start_at``).

        Raises:
            StorageError: an I/O failure (the log is then a prefix of what it was, as after a crash).
        """
        delaypoint("truncate.before_cut")
        if offset >= self.log_end_offset:
            return
        if offset < self.log_start_offset:
            self.truncate_fully_and_start_at(offset)
            return
        segments = self._segments
        first = segments.all[0]
        found = first.find_batch(offset, first.committed_position) if offset < first.next_offset else None
        if found is not None and found[1].base_offset < self.log_start_offset:
            # The cut would take the batch DeleteRecords left straddling the log start: nothing is kept.
            self.truncate_fully_and_start_at(self.log_start_offset)
            return
        self._background.submit_io(lambda: None).result()  # the queued renames and seals are done
        old_end = self.log_end_offset
        try:
            with segments.io_lock:  # no fdatasync or seal of these segments meanwhile
                previous_active, new_end, dropped = cut_files(segments, self.directory, offset)
                cut = segments.active
                if cut is not previous_active:
                    error = reactivate(cut, self.config, self._background, f"{self.topic}-{self.partition}")
                    if error is not None:
                        self._preparation.roll_error = error  # appends wait for a segment, as after start-up
                self._set_truncated_end(new_end, cut)
        except OSError as exc:
            raise storage_error_from(exc, "truncating", self.directory, offset=offset) from None
        self._after_truncation(new_end, dropped)
        log.info("%s-%d: truncated from offset %d to %d (%d segment(s) removed)", self.topic, self.partition,
                 old_end, new_end, len(dropped))

    def _set_truncated_end(self, new_end: int, active: Segment) -> None:
        self.log_end_offset = new_end
        self._preparation.truncated()
        self.high_watermark = min(self.high_watermark, new_end)
        self._flusher.truncated(new_end, active)

    def _after_truncation(self, new_end: int, dropped: list[Segment]) -> None:
        """Steps 3 and 4 (truncation.py), then hand the removed segments to the reaper."""
        self.leader_epochs.truncate_from_end(new_end)
        try:
            self.leader_epochs.flush()
            failpoint("truncate.after_epoch_checkpoint")
            if self.checkpoint_offsets is not None:
                self.checkpoint_offsets()
        except OSError as exc:
            raise storage_error_from(exc, "checkpointing a truncation", self.directory) from None
        finally:
            self._segments.retire(dropped, now_ms() + self.config.file_delete_delay_ms)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and restart the log, empty, at ``offset`` (a follower whose log ends below its
        leader's log start; a truncation below this log's start). Blocking: a worker thread, appends paused.

        Raises:
            StorageError: an I/O failure (after a crash or a restart, the log is the old one's prefix or the
                empty one at ``offset``).
        """
        self._background.submit_io(lambda: None).result()
        old_start, old_end = self.log_start_offset, self.log_end_offset
        segments = self._segments
        try:
            with segments.io_lock:
                self._pending_log_start = offset
                if self.checkpoint_offsets is not None:
                    self.checkpoint_offsets()
                failpoint("truncate_fully.after_log_start_checkpoint")
                rename_all_deleted(segments.all)
                fsync_directory(self.directory)
                new = create_segment(self.directory, self._preparation.next_name("t"), self.config,
                                     self._background, offset)
                failpoint("truncate_fully.after_new_segment")
                with segments.lock:
                    self.log_start_offset = offset
                    dropped = segments.reset_locked(new)
                self._preparation.restarted()
                self._set_truncated_end(offset, new)
                self._flusher.restarted(offset)
                self.high_watermark = offset
                self.leader_epochs.clear()
                self._pending_log_start = None
        except OSError as exc:
            raise storage_error_from(exc, "truncating fully", self.directory, offset=offset) from None
        self._after_truncation(offset, dropped)
        log.info("%s-%d: emptied (offsets %d-%d) and restarted at offset %d", self.topic, self.partition,
                 old_start, old_end, offset)

    # --- close ------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Clean close: wait for pending seals and flushes, trim the active segment, fdatasync everything,
        release fds and maps. Blocking (worker thread or shutdown). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.stop_warming()
        self._preparation.close()
        self._background.submit_io(lambda: None).result()  # pending seals are done (io thread is FIFO)
        segments = self._segments
        with segments.io_lock:
            segments.active.trim_for_shutdown()
            for segment in segments.all:
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
        self._flusher.advance(self.log_end_offset)
        with segments.lock:
            segments.sealing.clear()
        for segment in segments.all:
            segment.close()

    def stop_warming(self) -> None:
        """Ask every running pre-fault of this log to stop (shutdown: warm-ups must not delay it)."""
        self._preparation.stop_warming()
        self._segments.stop_warming()

    def stop_for_abandon(self) -> None:
        """First half of abandon(): refuse appends and stop warm-ups (before the executors stop)."""
        self._closed = True
        self.stop_warming()

    def abandon(self) -> None:
        """Drop maps and fds with no trim, flush or checkpoint: the files are left as a kill -9 at this instant
        leaves them (page cache intact). The Background executors must already be stopped (no task may touch
        these fds any more). For crash tests and emergency stops."""
        self.stop_for_abandon()
        self._preparation.abandon()
        for segment in self._segments.all:
            segment.abandon()
        self._flusher.fail_waiters(StorageError("log abandoned", path=self.directory))

    def retire_all(self, directory: Path, now: int) -> list[Segment]:
        """For delete_log: stop appends and hand every segment to the reaper (files now under ``directory``)."""
        self._closed = True
        self.stop_warming()
        self._preparation.discard()
        return self._segments.relocate(directory)
