"""Truncation of a partition log: the follower's cut back to where it agrees with its leader (KIPs 101 and
279), and the full restart of a follower that fell below its leader's log start. Mixed into PartitionLog.

Both are blocking and run on a worker thread while the caller keeps appends to that partition paused; reads
may go on (a follower's log serves no consumer, and the leader never cut below its high watermark, so no
FileSlice handed out covers what is cut). Flushes and seals of the log wait: the cut holds its io lock.

Crash story: a kill -9 at any step recovers to a log that is a prefix of the one before, or, for a full
truncation, to the empty log it was heading for. The steps, each a named failpoint:

``truncate_to(offset)``
    1. the segments past the one holding ``offset`` are renamed ``.deleted``, the last first (a crash keeps
       a prefix; start-up removes ``.deleted`` files), then the directory is fsynced;
    2. the segment holding ``offset`` is cut before the batch holding it (``Segment.truncate_to``: zeros from
       the cut up over an active segment, ftruncate of a sealed one; recovery stops at the cut);
    3. the leader epoch checkpoint loses the entries past the new end (a crash before: start-up drops them);
    4. the data dir's checkpoints take the lower recovery point and high watermark (a crash before: the
       stale recovery point lies past the new end, so recovery rescans the cut segment, the last one).

``truncate_fully_and_start_at(offset)``
    1. the data dir's checkpoints take ``offset`` as log start and recovery point (start-up deletes a log
       that ends below its checkpointed start and starts an empty one there: Kafka's rule);
    2. every segment is renamed ``.deleted``, the last first;
    3. an empty segment is created at ``offset``;
    4. the leader epoch checkpoint is emptied, and the checkpoints are written again.
"""

from __future__ import annotations

import logging

from ._failpoints import delaypoint, failpoint
from .checkpoint import fsync_directory
from .errors import StorageError, storage_error_from
from .clock import now_ms
from .prepared_segment import PreparedSegment
from .segment import Segment

__all__ = ["TruncationMixin"]

log = logging.getLogger("copyless.storage")


class TruncationMixin:
    """``truncate_to`` and ``truncate_fully_and_start_at`` for PartitionLog (see the module docstring)."""

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
        first = self._segments[0]
        found = first.find_batch(offset, first.committed_position) if offset < first.next_offset else None
        if found is not None and found[1].base_offset < self.log_start_offset:
            # The cut would take the batch DeleteRecords left straddling the log start: nothing is kept.
            self.truncate_fully_and_start_at(self.log_start_offset)
            return
        self._background.submit_io(lambda: None).result()  # the queued renames and seals are done
        try:
            with self._io_lock:  # no fdatasync or seal of these segments meanwhile
                old_end, new_end, dropped = self._truncate_files(offset)
        except OSError as exc:
            raise storage_error_from(exc, "truncating", self.directory, offset=offset) from None
        self._after_truncation(new_end, dropped)
        log.info("%s-%d: truncated from offset %d to %d (%d segment(s) removed)", self.topic, self.partition,
                 old_end, new_end, len(dropped))

    def _truncate_files(self, offset: int):
        with self._lock:
            segments = self._segments
            keep = [segment for segment in segments if segment.base_offset <= offset] or [segments[0]]
            dropped = list(segments[len(keep):])
            self._segments = tuple(keep)
            self._bases = tuple(segment.base_offset for segment in keep)
            self._sealing = [segment for segment in self._sealing if segment not in dropped]
            previous_active, self._active = self._active, keep[-1]
        self._truncations += 1
        for segment in reversed(dropped):
            segment.stop_warming()
            segment.rename_deleted()
            failpoint("truncate.after_segment_rename")
        if dropped:
            fsync_directory(self.directory)
        cut = keep[-1]
        old_end = self.log_end_offset
        new_end = cut.truncate_to(offset)
        if cut is not previous_active:
            self._reactivate(cut)
        self._set_truncated_end(new_end, cut)
        return old_end, new_end, dropped

    def _reactivate(self, segment: Segment) -> None:
        """A sealed segment became the last one: map it for appends again (as start-up does)."""
        config = self.config
        try:
            segment.make_active(config)
        except OSError as exc:
            # A full disk: appends wait for a segment the background can preallocate (as after start-up).
            self._roll_error = storage_error_from(exc, "preallocating", segment.log_path,
                                                  bytes_needed=config.segment_bytes)
            log.error("%s-%d: cannot reopen %s for appends: %s", self.topic, self.partition, segment.log_path.name,
                      self._roll_error)
            segment.make_read_only()
            return
        self._background.submit_warm(segment.warm_done, segment.warm_remainder)

    def _set_truncated_end(self, new_end: int, active: Segment) -> None:
        self.log_end_offset = new_end
        self._commit_point = (new_end, active, active.committed_position)
        self._rate_sample_segment = None
        self.high_watermark = min(self.high_watermark, new_end)
        error = StorageError(f"the log was truncated to offset {new_end} before this offset was flushed",
                             path=self.directory)
        with self._flush_lock:
            self.flushed_offset = min(self.flushed_offset, new_end)
            waiting, self._flush_waiters = self._flush_waiters, []
            for target, future in waiting:
                if target > new_end and not future.done():
                    future.set_exception(error)
                else:
                    self._flush_waiters.append((target, future))

    def _after_truncation(self, new_end: int, dropped: list[Segment]) -> None:
        """Steps 3 and 4 (module docstring), then hand the removed segments to the reaper."""
        self.leader_epochs.truncate_from_end(new_end)
        try:
            self.leader_epochs.flush()
            failpoint("truncate.after_epoch_checkpoint")
            if self.checkpoint_offsets is not None:
                self.checkpoint_offsets()
        except OSError as exc:
            raise storage_error_from(exc, "checkpointing a truncation", self.directory) from None
        finally:
            delete_after = now_ms() + self.config.file_delete_delay_ms
            for segment in dropped:
                self._background.retire(segment, delete_after)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and restart the log, empty, at ``offset`` (a follower whose log ends below its
        leader's log start; a truncation below this log's start). Blocking: a worker thread, appends paused.

        Raises:
            StorageError: an I/O failure (after a crash or a restart, the log is the old one's prefix or the
                empty one at ``offset``).
        """
        self._background.submit_io(lambda: None).result()
        old_start, old_end = self.log_start_offset, self.log_end_offset
        try:
            with self._io_lock:
                self._pending_log_start = offset
                if self.checkpoint_offsets is not None:
                    self.checkpoint_offsets()
                failpoint("truncate_fully.after_log_start_checkpoint")
                dropped = list(self._segments)
                for segment in reversed(dropped):
                    segment.stop_warming()
                    segment.rename_deleted()
                    failpoint("truncate.after_segment_rename")
                fsync_directory(self.directory)
                new = self._create_empty_segment(offset)
                failpoint("truncate_fully.after_new_segment")
                with self._lock:
                    self._segments = (new,)
                    self._bases = (offset,)
                    self._sealing = []
                    self._active = new
                    self.log_start_offset = offset
                self._truncations += 1
                self._roll_error = None
                self._set_truncated_end(offset, new)
                with self._flush_lock:
                    self.flushed_offset = offset
                self.high_watermark = offset
                self.leader_epochs.clear()
                self._pending_log_start = None
        except OSError as exc:
            raise storage_error_from(exc, "truncating fully", self.directory, offset=offset) from None
        self._after_truncation(offset, dropped)
        log.info("%s-%d: emptied (offsets %d-%d) and restarted at offset %d", self.topic, self.partition,
                 old_start, old_end, offset)

    def _create_empty_segment(self, base_offset: int) -> Segment:
        """An empty active segment named ``base_offset`` (blocking: creates and allocates its files)."""
        config = self.config
        self._prepared_sequence += 1
        prepared = PreparedSegment(self.directory, f"prepared-t{self._prepared_sequence}", config)
        try:
            prepared.create()
        except BaseException:
            prepared.warm_done.set()
            raise
        segment = Segment.from_prepared(prepared, base_offset, config.index_interval_bytes)
        segment.assign_name()
        fsync_directory(self.directory)
        background = self._background
        background.submit_warm(prepared.warm_done, prepared.warm, config.index_interval_bytes)
        if segment.prefault.want(min(config.prefault_window_bytes, segment.allocated_bytes)):
            background.submit_warm(segment.prefault.idle, segment.chase, background.prefault_helper)
        return segment
