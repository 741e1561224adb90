"""LeaderEpochCache: which leader epoch each stretch of a partition's log was written in (Kafka's
``LeaderEpochFileCache``, KIPs 101 and 279).

Owns the entries ``(epoch, start_offset)``: epoch E's records start at ``start_offset`` and run to the next
entry's start (the latest epoch runs to the log end). Both columns strictly increase. A new leader records
(its epoch, its log end) before its first append; every append whose batches carry a newer epoch records
(that epoch, the batch's base offset); truncation drops the entries past the new end; retention and
DeleteRecords clamp the first one to the log start.

On disk: ``<partition dir>/leader-epoch-checkpoint``, Kafka's text format (checkpoint.py)::

    0                   version
    <count>
    <epoch> <start_offset>
    ...

Crash story. The file is replaced atomically (tmp + fsync + rename + directory fsync), so it is the old or
the new list, never torn. It may lag the log (appends change the list in memory; the file follows on a
worker thread) or lead it (a tail lost in a crash): the log is the truth. The owner guarantees that the file
covers every batch below the log's recovery point (the flush writes it before the recovery point moves); on
load the entries past the log end are dropped and the batches from the recovery point on are scanned again.
A missing or unreadable file is rebuilt from every batch header's partitionLeaderEpoch (a log written before
the cache existed carries epoch 0 in its batches, so it rebuilds to ``[(0, log start)]``).

Threads: ``assign`` and the lookups run on the event-loop thread and never block (a lock held for a few list
operations); ``flush`` writes the file and blocks (worker thread, or start-up and shutdown).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from .checkpoint import read_entries, write_entries

__all__ = ["LeaderEpochCache", "EpochEntry", "UNDEFINED_EPOCH", "UNDEFINED_EPOCH_OFFSET"]

log = logging.getLogger("copyless.storage")

# Kafka's answer when no epoch at or below the requested one is known (OffsetForLeaderEpoch).
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


class LeaderEpochCache:
    """The epoch entries of one partition and their checkpoint file. See the module docstring.

    Args:
        path: the checkpoint file (``<partition dir>/leader-epoch-checkpoint``).
        schedule_flush: runs a blocking callable on a worker thread; called once per burst of changes so the
            file follows the list without the caller ever writing it on the loop thread. None: the owner
            calls ``flush`` itself.
    """

    def __init__(self, path: Path, *, schedule_flush: Callable[[Callable[[], None]], object] | None = None) -> None:
        self.path = path
        self._entries: list[EpochEntry] = []
        self._lock = threading.Lock()  # the list (loop thread) against a snapshot taken by flush (worker)
        self._write_lock = threading.Lock()  # one writer at a time, in version order
        self._version = 0  # bumped by every change of the list
        self._written_version = 0  # the version the file holds
        self._schedule_flush = schedule_flush
        self._flush_queued = False

    # --- lookups (any thread) ---------------------------------------------------------------------------------

    def entries(self) -> list[EpochEntry]:
        with self._lock:
            return list(self._entries)

    def latest_epoch(self) -> int:
        """The latest epoch, or -1 when there is none."""
        entries = self._entries
        return entries[-1].epoch if entries else UNDEFINED_EPOCH

    def epoch_for(self, offset: int) -> int:
        """The epoch the record at ``offset`` was written in (-1 when no entry covers it)."""
        with self._lock:
            epoch = UNDEFINED_EPOCH
            for entry in self._entries:
                if entry.start_offset > offset:
                    break
                epoch = entry.epoch
            return epoch

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: ``(the largest epoch <= epoch known here, the offset where it ends)``.

        The latest epoch ends at ``log_end_offset``; an earlier one at the next entry's start. An epoch
        below the first entry ends where the first entry starts, answered as ``(epoch, that start)``
        (Kafka's answer): a leader whose log never held that epoch's records (its own epoch began on an
        empty log, or retention removed them) still tells the asker where to cut, and a follower holding
        records of that epoch past that point truncates them instead of keeping a tail the leader would
        then count as its own records replicated. ``(-1, -1)`` for an empty cache, and when ``epoch`` is
        newer than the latest (Kafka answers the same: the asker knows an epoch this log never saw).
        """
        with self._lock:
            entries = self._entries
            if epoch < 0 or not entries:
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            if epoch == entries[-1].epoch:
                return epoch, log_end_offset
            if epoch > entries[-1].epoch:
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            floor = None
            for entry in entries:
                if entry.epoch > epoch:
                    if floor is None:
                        return epoch, entry.start_offset
                    return floor.epoch, entry.start_offset
                floor = entry
            raise AssertionError("unreachable: the latest epoch is above the requested one")

    # --- changes (loop thread; truncations on the worker thread that owns the log meanwhile) ---------------

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``. Returns True when the list changed.

        Idempotent: an epoch already latest with a start at or below ``start_offset`` changes nothing (the
        common case, one comparison per append). Entries starting at or after ``start_offset`` are dropped
        first (they describe records that are no longer there, as Kafka's ``assign`` drops non-monotonic
        entries), and so are later epochs than ``epoch`` (an epoch recorded by a leadership that wrote
        nothing here, overtaken by the old epoch's records fetched from the new leader); the entry is then
        added unless the epoch is already the latest, starting earlier.
        """
        if epoch < 0 or start_offset < 0:
            return False
        entries = self._entries
        if entries and entries[-1].epoch == epoch and entries[-1].start_offset <= start_offset:
            return False
        with self._lock:
            entries = self._entries
            removed = []
            while entries and (entries[-1].start_offset >= start_offset or entries[-1].epoch > epoch):
                removed.append(entries.pop())
            if not entries or entries[-1].epoch != epoch:
                entries.append(EpochEntry(epoch, start_offset))
            if len(removed) > 1 or (removed and removed[0].start_offset != start_offset):
                log.info("%s: epoch %d from offset %d replaced the entries %s", self.path.parent.name, epoch,
                         start_offset, [tuple(entry) for entry in reversed(removed)])
            self._changed()
        return True

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop the entries starting at or after ``end_offset`` (the log was cut to end there)."""
        with self._lock:
            if self._entries and self._entries[-1].start_offset >= end_offset:
                while self._entries and self._entries[-1].start_offset >= end_offset:
                    self._entries.pop()
                self._changed()

    def truncate_from_start(self, start_offset: int) -> None:
        """Drop the entries that end at or below ``start_offset`` (the new log start) and make the one covering
        it start there (Kafka's ``truncateFromStart``)."""
        with self._lock:
            entries = self._entries
            covering = None
            dropped = 0
            while entries and entries[0].start_offset <= start_offset:
                covering = entries.pop(0)
                dropped += 1
            if covering is None:
                return
            entries.insert(0, EpochEntry(covering.epoch, start_offset))
            if dropped > 1 or covering.start_offset != start_offset:
                self._changed()

    def clear(self) -> None:
        """Drop every entry (the log was emptied)."""
        with self._lock:
            if self._entries:
                self._entries.clear()
                self._changed()

    def _changed(self) -> None:
        """Under ``_lock``: a new version; queue a background write unless one is queued already."""
        self._version += 1
        if self._schedule_flush is not None and not self._flush_queued:
            self._flush_queued = True
            try:
                self._schedule_flush(self._flush_in_background)
            except RuntimeError:  # the worker threads are shut down: close() writes the file
                self._flush_queued = False

    def _flush_in_background(self) -> None:
        with self._lock:
            self._flush_queued = False
        try:
            self.flush()
        except OSError as exc:  # the next flush (each log flush, close) tries again
            log.warning("%s: writing %s failed: %s", self.path.parent.name, self.path.name, exc)

    # --- the file (blocking) --------------------------------------------------------------------------------

    @property
    def dirty(self) -> bool:
        """The file lags the list."""
        return self._written_version != self._version

    def flush(self) -> None:
        """Write the list to the checkpoint file if it changed since the last write. Blocking (two fsyncs):
        a worker thread, start-up or shutdown. Raises OSError."""
        with self._write_lock:
            with self._lock:
                version, entries = self._version, list(self._entries)
            if version == self._written_version:
                return
            write_entries(self.path, [tuple(entry) for entry in entries])
            self._written_version = version

    def restore(self, read_headers: Callable[[int], Iterable], *, log_start_offset: int, log_end_offset: int,
                rescan_from: int | None) -> None:
        """Start-up: load the checkpoint and make it agree with the log. Blocking (reads the file, and batch
        headers from ``rescan_from``).

        Args:
            read_headers: ``read_headers(offset)`` yields the headers of the batches holding offsets >= offset.
            rescan_from: the offset from which the batches are scanned for their epochs (the recovery point
                after an unclean stop; None after a clean one). A missing or unreadable file is rebuilt from
                every batch, from ``log_start_offset``.
        """
        loaded: list[EpochEntry] | None = None
        try:
            lines = read_entries(self.path)
            if lines is not None:
                loaded = []
                for line in lines:
                    epoch, start_offset = (int(field) for field in line.split())
                    if epoch < 0 or start_offset < 0 or (loaded and (epoch <= loaded[-1].epoch or
                                                                     start_offset <= loaded[-1].start_offset)):
                        raise ValueError(f"entry {line!r} does not follow {loaded[-1:] or 'nothing'}")
                    loaded.append(EpochEntry(epoch, start_offset))
            else:
                log.info("%s: no %s: rebuilding it from the batches", self.path.parent.name, self.path.name)
        except (OSError, ValueError) as exc:
            log.warning("%s: unreadable %s (%s): rebuilding it from the batches", self.path.parent.name,
                        self.path.name, exc)
            loaded = None
        with self._lock:
            self._entries = loaded or []
            if loaded is None:
                self._version += 1  # the file must be (re)written
        self.truncate_from_end(log_end_offset)
        if loaded is not None and rescan_from is None and log_end_offset > log_start_offset:
            # A clean stop wrote the file last; if that write failed, the last batch says so (one header).
            last = None
            for header in read_headers(log_end_offset - 1):
                last = header
            if last is not None and last.partition_leader_epoch != self.latest_epoch():
                log.warning("%s: %s ends at epoch %d, the log at %d: rebuilding it from the batches",
                            self.path.parent.name, self.path.name, self.latest_epoch(), last.partition_leader_epoch)
                loaded = None
                with self._lock:
                    self._entries = []
                    self._version += 1
        if loaded is None:
            rescan_from = log_start_offset
        if rescan_from is not None and rescan_from < log_end_offset:
            latest = self.latest_epoch()
            for header in read_headers(max(rescan_from, log_start_offset)):
                if header.partition_leader_epoch != latest:
                    self.assign(header.partition_leader_epoch, header.base_offset)
                    latest = self.latest_epoch()
        self.truncate_from_start(log_start_offset)
