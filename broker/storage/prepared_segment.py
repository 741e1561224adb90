"""PreparedSegment: the next segment of a log, created ahead of its roll under a temporary name (file layer).

Files: ``prepared-N.log`` (the segment's full logical size, blocks for a first step), ``prepared-N.index``
and ``prepared-N.timeindex`` (their maximum size, blocks for the entries that step can need), all mapped
read-write. Created on the warm thread; a roll takes it (``Segment.from_prepared``) and the io thread later
renames its files after the base offset. Crash story: a crash before the renames leaves ``prepared-*`` files;
start-up adopts one that holds a whole first batch (a roll whose renames never ran) and removes the rest.
"""

from __future__ import annotations

import logging
import mmap
import os
import time
from pathlib import Path

from copyless.protocol.records import RECORD_BATCH_OVERHEAD

from . import filenames
from ._fileops import no_readaround, preallocate, remove_file, set_readahead
from .background import Completion
from .config import LogConfig
from .index import OffsetIndex, TimeIndex
from .prefault import Prefault

__all__ = ["PreparedSegment", "index_allocation_bytes"]

log = logging.getLogger("copyless.storage")

# The active segment's file has its logical size (segment_bytes, so one map covers it) from the start, but
# only a prefix owns blocks, and an append never writes past the allocated prefix. The prefix grows in steps
# ahead of the writer (LogConfig.preallocate_*), or is the whole segment with LogConfig.preallocate (the
# RocketMQ pattern: 1 GiB up front per partition reserves 1 TB for a 1000-partition topic).


def index_allocation_bytes(log_bytes: int, entry_size: int, used_bytes: int, index_interval_bytes: int,
                           ahead_bytes: int) -> int:
    """Bytes of an index that need blocks while the log has ``log_bytes`` of them: an entry per
    index_interval_bytes (or per batch) of log, plus the final time entry, at most ``ahead_bytes`` past the
    ``used_bytes`` of entries it holds."""
    entries = log_bytes // max(index_interval_bytes, RECORD_BATCH_OVERHEAD) + 2
    return min(entries * entry_size, used_bytes + ahead_bytes)


class PreparedSegment:
    """The next segment, created ahead of a roll under a temporary name (worker thread).

    ``ready`` is set once the files exist, are preallocated and mapped: from then on a roll may take it even
    while pre-faulting is still running (the warm-up then races the appends harmlessly: its zeros are claimed
    past them, see ``Prefault``). Its log is
    pre-faulted only as far as the active segment's pre-fault window reaches past the active end
    (``prefault``, moved by the appends), so a spare that is never rolled into costs no pre-faulting.
    """

    def __init__(self, directory: Path, name: str, config: LogConfig, allocate_bytes: int | None = None) -> None:
        self.directory = directory
        self.name = name
        self.segment_bytes = config.segment_bytes
        # The prefix given real blocks (and pre-faulted) up front; the rest follows in steps while appends
        # approach it (Segment.extend_ahead).
        self.allocated_bytes = min(self.segment_bytes, max(0, config.first_step_bytes if allocate_bytes is None
                                                           else allocate_bytes))
        self.promised_bytes = self.allocated_bytes  # the end of the last step queued (block_budget)
        self.regrant_at = 0  # no step asked of the budget before the appends reach this (loop thread)
        self.index_bytes = config.segment_index_bytes
        self.index_interval_bytes = config.index_interval_bytes
        self.index_ahead_bytes = config.index_ahead_bytes
        self.window_floor_bytes = config.prefault_window_bytes
        self.log_path = directory / f"{name}{filenames.LOG_SUFFIX}"
        self.index_path = directory / f"{name}{filenames.INDEX_SUFFIX}"
        self.time_index_path = directory / f"{name}{filenames.TIME_INDEX_SUFFIX}"
        self.fd = -1
        self.map: mmap.mmap | None = None
        self.offset_index: OffsetIndex | None = None
        self.time_index: TimeIndex | None = None
        self.extension_done = Completion(done=True)  # no step of blocks queued or running (extend_to)
        self.ready = Completion()  # the files exist, preallocated and mapped (or create() failed: see failed)
        self.failed: BaseException | None = None
        self.warm_done = Completion()  # create + index warm-up finished (or failed)
        self.prefault = Prefault(zeros=config.prefault_zeros, outrun_pwrite=config.outrun_pwrite)
        self.stop_warm = False
        self.taken = False
        self.create_seconds = 0.0
        self.warm_seconds = 0.0

    def create(self) -> None:
        """Create, preallocate and map the three files. Blocking (fallocate): worker thread normally."""
        started = time.perf_counter()
        fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            # Logical size = segment_bytes (a map may not extend past the end of its file), blocks only for
            # the allocated prefix: the tail stays sparse and is never written until allocated.
            preallocate(fd, self.allocated_bytes)
            os.ftruncate(fd, self.segment_bytes)
            set_readahead(fd, False)
            region = mmap.mmap(fd, self.segment_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            no_readaround(region)
            try:
                offset_index = OffsetIndex.create(self.index_path, self.index_bytes, index_allocation_bytes(
                    self.allocated_bytes, OffsetIndex.entry.size, 0, self.index_interval_bytes, self.index_ahead_bytes))
                try:
                    time_index = TimeIndex.create(self.time_index_path, self.index_bytes, index_allocation_bytes(
                        self.allocated_bytes, TimeIndex.entry.size, 0, self.index_interval_bytes,
                        self.index_ahead_bytes))
                except BaseException:
                    offset_index.close()
                    raise
            except BaseException:
                region.close()
                raise
        except BaseException as exc:
            os.close(fd)
            self.remove_files()
            self.failed = exc
            self.ready.set()  # whoever awaits the files learns of the failure (failed)
            raise
        self.fd, self.map, self.offset_index, self.time_index = fd, region, offset_index, time_index
        self.create_seconds = time.perf_counter() - started
        self.ready.set()

    def warm(self, index_interval_bytes: int = 4096) -> None:
        """Pre-fault the part of each index map the segment will use (worker thread); the log itself is
        pre-faulted by ``chase`` as the window asks.

        The first write to each page of a mapped file goes through the filesystem's page_mkwrite, which on
        ext4 may wait for a journal commit; unwarmed index pages cost 5-20 ms stalls on the first index entry
        of each fresh segment here. Both indexes of a 1 GiB segment fit in ~5 MiB: always warmed whole.
        """
        started = time.perf_counter()
        try:
            stop = lambda: self.stop_warm  # noqa: E731
            expected_entries = self.segment_bytes // max(index_interval_bytes, 64) + 2
            assert self.offset_index is not None and self.time_index is not None  # warm runs after create
            for index in (self.offset_index, self.time_index):
                length = min(index.allocated_entries, expected_entries) * index.entry.size
                if length and not self.stop_warm:
                    index.prefault(0, length, stop)
        except OSError as exc:  # not fatal: the segment works, its first appends just fault pages in
            log.warning("pre-faulting %s failed: %s", self.log_path, exc)
        finally:
            self.warm_seconds = time.perf_counter() - started
            self.warm_done.set()

    def create_and_warm(self, index_interval_bytes: int = 4096) -> PreparedSegment:
        try:
            self.create()
        except BaseException:
            self.warm_done.set()
            raise
        self.warm(index_interval_bytes)
        return self

    def chase(self, helper=None) -> None:
        """Warm thread: pre-fault the log up to the prefault target (nothing if the files do not exist)."""
        self.prefault.chase(None if self.stop_warm else self.map, self.fd, lambda: self.allocated_bytes,
                            helper=helper)

    def start_extension(self, end: int) -> bool:
        """Loop thread: mark an extend_to ``end`` as queued (False if one already is, or the files are not
        there); block_budget charges ``end`` until it is done."""
        if not self.extension_done.is_set() or not self.ready.is_set() or self.failed is not None or self.taken:
            return False
        self.promised_bytes = end
        self.extension_done.clear()
        return True

    def promised_log_end(self) -> int:
        """The end of the log's blocks, counting a queued step (or the creation) as done (loop thread)."""
        if self.extension_done.is_set():
            return self.allocated_bytes
        return max(self.allocated_bytes, self.promised_bytes)

    def block_holdings(self, log_end: int | None = None) -> list[tuple[int, int]]:
        """``(data_end, promised_end)`` of the log and both indexes (block_budget): nothing is data yet; the
        indexes are charged what the log's promised end (or ``log_end``) makes them own."""
        if log_end is None:
            log_end = self.promised_log_end()
        holdings = [(0, log_end)]
        for index, entry_size in ((self.offset_index, OffsetIndex.entry.size),
                                  (self.time_index, TimeIndex.entry.size)):
            promised = index_allocation_bytes(log_end, entry_size, 0, self.index_interval_bytes,
                                              self.index_ahead_bytes)
            if index is not None and not index.in_memory:
                promised = max(promised, index.allocated_entries * entry_size)
            holdings.append((0, promised))
        return holdings

    def extend_to(self, end: int) -> None:
        """Allocate thread: give the log [allocated_bytes, end) blocks, and the indexes what that needs, then
        publish it, as Segment.extend_ahead does once the roll has taken this segment (the same Completion
        then guards both). A failure is left to the segment's own steps after the roll."""
        try:
            start = self.allocated_bytes
            end = min(end, self.segment_bytes)
            if self.stop_warm or self.map is None or end <= start:
                return
            assert self.offset_index is not None and self.time_index is not None  # created with the map
            for index in (self.offset_index, self.time_index):
                index.allocate_to(index_allocation_bytes(end, index.entry.size, index.entries * index.entry.size,
                                                         self.index_interval_bytes, self.index_ahead_bytes))
            preallocate(self.fd, end, start)
            self.allocated_bytes = max(self.allocated_bytes, end)
        except OSError as exc:
            log.warning("extending %s failed: %s", self.log_path, exc)

    def discard(self) -> None:
        """Close and remove an unused prepared segment (worker thread or shutdown)."""
        self.stop_warm = True
        self.prefault.stopped = True
        if self.ready.is_set():
            self.warm_done.wait()
            self.extension_done.wait()
            self.prefault.idle.wait()
            if self.map is not None:
                self.map.close()
                self.map = None
            for index in (self.offset_index, self.time_index):
                if index is not None:
                    index.close()
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
        self.remove_files()

    def abandon(self) -> None:
        """Close map and fds, files left as they are (crash tests: the executors are already stopped)."""
        if self.map is not None:
            self.map.close()
            self.map = None
            os.close(self.fd)
            self.fd = -1
            assert self.offset_index is not None and self.time_index is not None  # created with the map
            self.offset_index.close()
            self.time_index.close()

    def remove_files(self) -> None:
        for path in (self.log_path, self.index_path, self.time_index_path):
            remove_file(path)
