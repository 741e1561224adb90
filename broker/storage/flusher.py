"""Flusher: fdatasync of a log's segments, for the flush policies and for group commit (mixed into
PartitionLog; requests from any thread, the work on a flush thread).

A request (``flush``, ``wait_flushed``, flush.messages, flush.ms) queues one flush loop per log; each round
snapshots the commit point (log end, active segment, its committed position), fdatasyncs every segment up to
it and then advances ``flushed_offset`` and completes every waiter it covers, so N producers waiting cost
about one fdatasync per round (RocketMQ's ``GroupCommitService``). Crash story: ``flushed_offset`` (the
recovery point) moves only after the fdatasync returned, and the epoch cache's file is written first.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future

from ._fileops import sync_data
from .checkpoint import fsync_directory
from .clock import now_ms
from .errors import StorageError, storage_error_from
from .segment import Segment

__all__ = ["Flusher"]

log = logging.getLogger("copyless.storage")


class Flusher:
    """The flush half of PartitionLog (see the module docstring)."""

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
