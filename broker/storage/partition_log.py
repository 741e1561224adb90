"""PartitionLog: the ordered segments of one partition: offsets, append, roll, close (file layer).

Directory ``<topic>-<partition>/`` holds the segments (formats in segment.py and index.py). Offsets are
assigned here, contiguously: a batch appended at log_end_offset L gets baseOffset L and the log end moves to
L + recordsCount. The log's other ideas live beside it, each a mixin over the same object, as Kafka's log
layer is split (LocalLog, LogSegments, LogLoader, ...): reads (log_reads.py), the next segment, blocks and
pages made ready ahead of the appends (preparation.py), fdatasync and group commit (flusher.py), retention
and DeleteRecords (retention.py), start-up (loader.py), and truncation (truncation.py).

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

import logging
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from copyless.client.protocol.records import (
    LOG_OVERHEAD,
    BatchHeader,
    InvalidBatchError,
    iter_batches,
    validate_batch,
)

from . import filenames
from . import preparation as preparation_module
from ._failpoints import failpoint
from ._fileops import sync_data
from .background import Background
from .checkpoint import fsync_directory
from .clock import now_ms
from .config import LogConfig
from .errors import AppendNotReady, StorageError, UnexpectedAppendOffsetError
from .flusher import Flusher
from .leader_epoch_cache import LeaderEpochCache
from .loader import LoadStats, LogLoader
from .log_reads import LogReads
from .preparation import ROLL_RETRY_INTERVAL_S, SegmentPreparation
from .prepared_segment import PreparedSegment
from .results import AppendResult, FollowerAppend, ReadResult
from .retention import Retention
from .segment import Segment
from .truncation import TruncationMixin

__all__ = ["PartitionLog", "AppendResult", "FollowerAppend", "ReadResult", "LoadStats"]

log = logging.getLogger("copyless.storage")

MAX_RELATIVE_OFFSET = 0x7FFFFFFF


class PartitionLog(LogReads, SegmentPreparation, Flusher, Retention, LogLoader, TruncationMixin):
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

    @property
    def next_segment(self) -> PreparedSegment | None:
        """The next segment being prepared for the roll, if any (tests, benchmarks)."""
        return self._prepared

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
        if active.allocated_bytes < active.capacity_bytes and active.extension_done.is_set():
            # After a failed extension (disk full) retry at most every ROLL_RETRY_INTERVAL_S, not per append.
            if active.allocated_bytes - active.written_position < self._want_ahead(rate) // 2 and (
                    time.monotonic() - active.extension_failed_s >= ROLL_RETRY_INTERVAL_S
                    or active.extension_failed_s < 0):
                self._extend_active(active, rate)
        prepared = self._prepared
        if prepared is None:
            if self._should_prepare(active, now, rate):
                self._prepare_next()
        elif not self.config.preallocate:
            self._maybe_extend_next(active, prepared, rate)
        window = max(self.config.prefault_window_bytes, int(rate * preparation_module.WARM_AHEAD_MS))
        self._prefault_ahead(active, window, rate)
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

    def roll(self) -> Segment | None:
        """Roll now (Kafka ``UnifiedLog.roll``) unless the active segment is empty (None then). Loop thread,
        non-blocking: raises AppendNotReady, with the preparation queued, while the next segment is not ready
        (await ``ready`` and call again).

        Raises:
            StorageError: the log is closed, or the next segment could not be created.
        """
        if self._closed:
            raise StorageError("log is closed", path=self.directory)
        if self._active.written_position == 0:
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
        old = self._active
        prepared = self._take_prepared()
        base_offset = old.next_offset
        failpoint("roll.before_rename")
        new = Segment.from_prepared(prepared, base_offset, self.config.index_interval_bytes)
        old.seal_begin()
        old.sealing_holdings = old.block_holdings()  # charged until the seal is done (block_budget)
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
        if self._prepared is not None:
            self._prepared.abandon()
        for segment in self._segments:
            segment.abandon()
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
