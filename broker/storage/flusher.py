"""Flusher: fdatasync of one log's segments, for the flush policies and for group commit. Requests from any
thread, the work on a flush thread.

Owns: ``flushed_offset`` (everything below is fdatasynced), the commit point it flushes to (``commit_point``:
log end, active segment, its committed position; one tuple the appends replace whole, so a flush thread
reads a consistent snapshot without a lock), the waiters of group commit, whether the directory needs an
fsync (a roll's renames), and when the last flush ran (flush.ms). It reads the segment list (log_segments.py)
and writes nothing but fdatasyncs; the epoch cache's file is written through ``leader_epochs.flush``.

A request (``flush``, ``wait_flushed``, flush.messages, flush.ms) queues one flush loop per log; each round
snapshots the commit point, fdatasyncs every segment up to it and then advances ``flushed_offset`` and
completes every waiter it covers, so N producers waiting cost about one fdatasync per round (RocketMQ's
``GroupCommitService``). Crash story: ``flushed_offset`` (the recovery point) moves only after the
fdatasync returned, and the epoch cache's file is written first; a round that raced a truncation (the
segment list's ``truncations`` moved) does not move it.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from pathlib import Path

from ._fileops import sync_data
from .background import Background
from .checkpoint import fsync_directory
from .clock import now_ms
from .errors import StorageError, storage_error_from
from .leader_epoch_cache import LeaderEpochCache
from .log_segments import LogSegments
from .segment import Segment

__all__ = ["Flusher"]

log = logging.getLogger("copyless.storage")


class Flusher:
    """Flushes and group commit of one log (see the module docstring)."""

    def __init__(self, name: str, directory: Path, segments: LogSegments, background: Background,
                 leader_epochs: LeaderEpochCache, log_end_offset: int, stats: dict) -> None:
        self._name = name
        self._directory = directory
        self._segments = segments
        self._background = background
        self._leader_epochs = leader_epochs
        self._stats = stats
        self.flushed_offset = log_end_offset
        active = segments.active
        self.commit_point: tuple[int, Segment, int] = (log_end_offset, active, active.committed_position)
        self.directory_durable = True  # False after a roll's renames until the directory is fsynced
        self.last_flush_ms = now_ms()
        self._lock = threading.Lock()
        self._waiters: list[tuple[int, Future]] = []
        self._requested = False
        self._scheduled = False

    def flush(self, upto_offset: int | None = None) -> Future:
        """fdatasync everything below ``upto_offset`` (default: the log end) on a flush thread.

        Returns a concurrent Future resolving to the new flushed_offset (or raising StorageError).
        Loop-thread safe: never blocks.
        """
        return self._future(upto_offset)

    def wait_flushed(self, offset: int) -> Future:
        """Group commit (RocketMQ ``GroupCommitService``): resolves once flushed_offset >= ``offset``. Every
        waiter that arrives while an fdatasync runs is covered by the next one, so N producers cost ~1
        fdatasync per round, not N."""
        return self._future(offset)

    def _future(self, offset: int | None) -> Future:
        future = self.request(offset, want_future=True)
        assert future is not None  # want_future=True always returns one
        return future

    def maybe_flush(self, flush_ms: int | None, now: int | None = None) -> bool:
        """flush.ms policy: request a flush if the oldest unflushed data is older than ``flush_ms``."""
        now = now_ms() if now is None else now
        if flush_ms is None or self.commit_point[0] <= self.flushed_offset or now - self.last_flush_ms < flush_ms:
            return False
        self.request(None)
        return True

    def request(self, upto_offset: int | None, want_future: bool = False) -> Future | None:
        log_end_offset = self.commit_point[0]
        target = log_end_offset if upto_offset is None else min(upto_offset, log_end_offset)
        future: Future | None = Future() if want_future else None
        with self._lock:
            if self.flushed_offset >= target:
                if future is not None:
                    future.set_result(self.flushed_offset)
                return future
            if future is not None:
                self._waiters.append((target, future))
            else:
                self._requested = True
            if not self._scheduled:
                self._scheduled = True
                try:
                    self._background.flush.submit(self._flush_loop)
                except RuntimeError as exc:  # shut down
                    self._scheduled = False
                    self._fail_waiters_locked(StorageError(f"flush unavailable: {exc}", path=self._directory))
        return future

    def _flush_loop(self) -> None:
        """Flush thread: fdatasync rounds until no waiter or request is left."""
        while True:
            with self._lock:
                if not self._waiters and not self._requested:
                    self._scheduled = False
                    return
                self._requested = False
            log_end_offset, active, committed_position = self.commit_point
            truncations = self._segments.truncations
            try:
                self._flush_segments(log_end_offset, active, committed_position)
                # The recovery point moves with the flushed offset: the epochs of what lies below it must be
                # in the file first (a write only when they changed, which is rare).
                self._leader_epochs.flush()
            except OSError as exc:
                error = storage_error_from(exc, "fdatasync", self._directory)
                log.error("%s: %s", self._name, error)
                with self._lock:
                    self._scheduled = False
                    self._requested = False
                    self._fail_waiters_locked(error)
                return
            self._stats["flushes"] += 1
            self.last_flush_ms = now_ms()
            if truncations == self._segments.truncations:  # else what it synced was cut meanwhile
                self.advance(log_end_offset)

    def _flush_segments(self, log_end_offset: int, active: Segment, committed_position: int) -> None:
        segments = self._segments
        with segments.io_lock:
            for segment in segments.all:
                if segment.base_offset > log_end_offset or (
                        segment.base_offset == log_end_offset and segment is not active):
                    break
                end = committed_position if segment is active else segment.committed_position
                if segment.flushed_position >= end or not segment.try_pin():
                    continue
                try:
                    sync_data(segment.fd)
                finally:
                    segments.release(segment)
                segment.flushed_position = max(segment.flushed_position, end)
            if not self.directory_durable:
                self.sync_directory_locked()

    def sync_directory_locked(self) -> None:
        """fsync the log's directory (a roll's or a truncation's renames). The caller holds ``io_lock``."""
        fsync_directory(self._directory)
        self.directory_durable = True

    def advance(self, offset: int) -> None:
        """Everything below ``offset`` is durable: move ``flushed_offset`` and complete the waiters it covers."""
        with self._lock:
            if offset > self.flushed_offset:
                self.flushed_offset = offset
            flushed = self.flushed_offset
            remaining = []
            for target, future in self._waiters:
                if target <= flushed:
                    if not future.done():
                        future.set_result(flushed)
                else:
                    remaining.append((target, future))
            self._waiters = remaining

    def truncated(self, new_end: int, active: Segment) -> None:
        """The log was cut to ``new_end``: the commit point and the flushed offset go back, and waiters above it
        fail (what they waited for is gone)."""
        self.commit_point = (new_end, active, active.committed_position)
        error = StorageError(f"the log was truncated to offset {new_end} before this offset was flushed",
                             path=self._directory)
        with self._lock:
            self.flushed_offset = min(self.flushed_offset, new_end)
            waiting, self._waiters = self._waiters, []
            for target, future in waiting:
                if target > new_end and not future.done():
                    future.set_exception(error)
                else:
                    self._waiters.append((target, future))

    def restarted(self, offset: int) -> None:
        """A full truncation restarted the log, empty, at ``offset``."""
        with self._lock:
            self.flushed_offset = offset

    def fail_waiters(self, error: Exception) -> None:
        with self._lock:
            self._fail_waiters_locked(error)

    def _fail_waiters_locked(self, error: Exception) -> None:
        waiters, self._waiters = self._waiters, []
        for _, future in waiters:
            if not future.done():
                future.set_exception(error)
