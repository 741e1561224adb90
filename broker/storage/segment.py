"""Segment: one ``.log`` file of RecordBatch v2 bytes plus its ``.index`` and ``.timeindex`` (file layer).

On disk the ``.log`` is the concatenation of batches exactly as they travel on the wire (see
``protocol/records.py`` for the 61-byte header), so a fetch can sendfile a byte range of it. The first
batch's baseOffset equals the segment's base offset (its file name) and every batch's baseOffset equals the
previous batch's last offset + 1. A batch never straddles two segments.

Positions, in bytes from the start of the file, kept per segment (RocketMQ's ``MappedFile``)::

    flushed_position <= committed_position <= written_position <= allocated_bytes <= capacity_bytes
    fdatasync'ed        visible to readers     copied into the map   own real blocks    mapped, file size

The active segment's file has its full logical size (``segment_bytes``) and is mapped once. Blocks
(``posix_fallocate``) cover a prefix that grows in steps ahead of the write position (``extend_ahead``, warm
thread; the whole segment with LogConfig.preallocate). Nothing is ever written at or past
``allocated_bytes`` (a write into a sparse page on a full disk is SIGBUS): an append that outruns the steps
is told to wait for the next one (AppendNotReady), never allocates on the loop thread. Pages are
pre-faulted on the warm thread in a window that runs ahead of the write position (prefault.py). The next
segment is created ahead of the roll (prepared_segment.py); start-up's part (clean load, recovery,
reopening for appends) is segment_recovery.py; header scans are scan.py. Appends are a memcpy into the map plus in-place
header rewrites; an append that runs past the pre-faulted pages writes them with pwrite instead
(LogConfig.outrun_pwrite: the page cache takes them as from write(), for a seventh of a fault's CPU). A segment's
first append puts its base offset in before the rest of the batch (see ``adopt_prepared``). Reads
never touch the map: they hand out ``(fd, position, length)`` regions and scan headers with ``os.pread``
(coherent with the map: one page cache). Sealing (at a roll) unmaps, trims the zero or sparse tail and
fdatasyncs, on a worker thread.

A crash leaves the active file at full length with a zero, sparse (it reads as zeros) or torn tail; recovery
rescans batches with their CRC-32C, stops at the first bad one, truncates there (the file is not mapped
during recovery: truncating a mapped file and touching the lost pages is SIGBUS) and rebuilds both indexes.
A roll's segment keeps the spare's temporary name until the io thread renames it; a crash before that leaves
a ``prepared-N.log`` that start-up names after its first batch's base offset (``adopt_prepared``).

Pinning (RocketMQ ``ReferenceResource``): every handed-out FileSlice pins its segment; a segment retired by
retention closes its fd and unlinks its files only once the pin count is zero.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
import time
from pathlib import Path

from copyless.protocol.records import (
    LOG_OVERHEAD,
    BatchHeader,
    set_base_offset,
    set_leader_epoch,
    set_log_append_time,
)

from . import filenames
from . import prefault as prefault_module
from ._failpoints import failpoint
from ._fileops import preallocate, remove_file, set_readahead, sync_data, write_at, write_zeros
from .background import Completion
from .clock import now_ms
from .errors import AppendNotReady, storage_error_from
from .index import OffsetIndex, TimeIndex
from .prefault import Prefault, observe_append_wait, observe_outrun
from .prepared_segment import PreparedSegment, index_allocation_bytes
from .scan import scan_headers
from .segment_recovery import SegmentRecovery
from .txn_index import txn_index_path

__all__ = ["Segment"]

log = logging.getLogger("copyless.storage")

_BASE_OFFSET_BYTES = 8  # baseOffset, the first field of a batch (int64)


class Segment(SegmentRecovery):
    """One segment. Appends and reads run on the loop thread; seal/flush/close on worker threads."""

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        fd: int,
        offset_index: OffsetIndex,
        time_index: TimeIndex,
        *,
        size_bytes: int,
        index_interval_bytes: int,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.log_path = filenames.log_path(directory, base_offset)
        self.fd = fd
        self.offset_index = offset_index
        self.time_index = time_index
        self.index_interval_bytes = index_interval_bytes
        self.index_ahead_bytes = 1 << 20  # the most index blocks past its entries (set from LogConfig)
        self.window_floor_bytes = 16 << 20  # the pre-fault window's floor (set from LogConfig)
        self.map: mmap.mmap | None = None
        self.capacity_bytes = size_bytes
        # Bytes [0, allocated_bytes) own real blocks. The map covers capacity_bytes but nothing may ever
        # be written at or past allocated_bytes (a sparse page on a full disk is SIGBUS): appends extend it
        # first, in steps ahead of the write position (extend_ahead, warm thread) or, when they outrun
        # that, synchronously (allocate_to).
        self.allocated_bytes = size_bytes
        self.extension_done = Completion(done=True)
        # The end of the last step queued (loop thread; block_budget charges it until the step is done).
        self.promised_bytes = size_bytes
        self.regrant_at = 0  # no step asked of the budget before the appends reach this (loop thread)
        self.sealing_holdings: list[tuple[int, int]] | None = None  # block_holdings at its roll
        self.extension_failed_s = -1.0  # time.monotonic() of the last failed extend_ahead
        self.written_position = size_bytes
        self.committed_position = size_bytes
        self.flushed_position = size_bytes
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self.created_ms = now_ms()
        # segment.ms counts from the first append by the broker's clock. Kafka counts from the first batch's
        # timestamp, so a producer with a skewed or ancient clock rolls a segment on every append; the
        # broker's own clock cannot be pushed around by clients.
        self.first_append_ms: int | None = self.created_ms if size_bytes else None
        self.last_append_s = 0.0  # time.monotonic() of the last append (Prefault's lead)
        self.bytes_since_last_index_entry = 0
        self.sealed = True
        self.named = True  # False while the files still carry their prepared names
        self.warm_done: Completion | None = None  # index warm-up (and creation) of this segment
        self.prefault = Prefault(size_bytes)  # the log's pre-fault window (only an active segment moves it)
        self.stop_warm = False
        self.prepared_from: PreparedSegment | None = None  # the spare it was made from (its warm-up)
        # Pinning.
        self._lock = threading.Lock()
        self._pins = 0
        self.retired = False
        self.closed = False
        self.delete_after_ms = 0

    def __repr__(self) -> str:
        return (
            f"Segment({self.log_path.name}, next_offset={self.next_offset}, committed={self.committed_position},"
            f" flushed={self.flushed_position}, sealed={self.sealed})"
        )

    # --- opening ----------------------------------------------------------------------------------------

    @classmethod
    def open_existing(cls, directory: Path, base_offset: int, index_interval_bytes: int) -> Segment:
        """Open a segment's files as found on disk (start-up). Not mapped; call load_clean or recover next."""
        log_path, index_path, time_index_path = filenames.segment_paths(directory, base_offset)
        fd = os.open(log_path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            offset_index = OffsetIndex.open_existing(index_path)
            time_index = TimeIndex.open_existing(time_index_path)
        except BaseException:
            os.close(fd)
            raise
        return cls(directory, base_offset, fd, offset_index, time_index, size_bytes=size,
                   index_interval_bytes=index_interval_bytes)

    @classmethod
    def from_prepared(cls, prepared: PreparedSegment, base_offset: int, index_interval_bytes: int) -> Segment:
        """Make a prepared segment the active one (loop thread, at a roll). No I/O: the files keep their
        prepared names until ``assign_name`` runs on the io thread (three renames are journal operations
        that took 1-8 ms here under load; start-up adopts a prepared file that holds batches, see
        ``adopt_prepared``)."""
        prepared.taken = True
        # Taken only once ready and not failed (PartitionLog's roll): its files exist and are open.
        assert prepared.offset_index is not None and prepared.time_index is not None
        segment = cls(prepared.directory, base_offset, prepared.fd, prepared.offset_index, prepared.time_index,
                      size_bytes=0, index_interval_bytes=index_interval_bytes)
        segment.log_path = prepared.log_path
        segment.named = False
        segment.map = prepared.map
        segment.capacity_bytes = prepared.segment_bytes
        segment.allocated_bytes = prepared.allocated_bytes
        segment.promised_bytes = prepared.promised_bytes
        segment.extension_done = prepared.extension_done  # a step of the spare may still be running
        segment.index_ahead_bytes = prepared.index_ahead_bytes
        segment.window_floor_bytes = prepared.window_floor_bytes
        segment.sealed = False
        segment.warm_done = prepared.warm_done
        segment.prefault = prepared.prefault  # a chase of the spare's head may still be running: it carries on
        segment.prepared_from = prepared
        return segment

    def assign_name(self) -> bool:
        """Rename the files to the base offset (io thread). False if the segment was retired meanwhile."""
        log_path, index_path, time_index_path = filenames.segment_paths(self.directory, self.base_offset)
        with self._lock:
            if self.named or self.retired or self.closed:
                return False
            os.rename(self.log_path, log_path)
            self.log_path = log_path
            failpoint("roll.after_log_rename")
            self.offset_index.rename(index_path)
            self.time_index.rename(time_index_path)
            self.named = True
        failpoint("roll.after_index_rename")
        return True

    # --- loop thread: append -------------------------------------------------------------------------------

    @property
    def size_bytes(self) -> int:
        return self.committed_position

    @property
    def room_bytes(self) -> int:
        return self.capacity_bytes - self.written_position

    def start_extension(self, end: int) -> bool:
        """Loop thread: mark an extend_ahead to ``end`` as queued (False if one already is). seal/close wait
        for it; block_budget charges ``end`` until it is done."""
        if not self.extension_done.is_set() or self.sealed:
            return False
        self.promised_bytes = end
        self.extension_done.clear()
        return True

    def promised_log_end(self) -> int:
        """The end of the log's blocks, counting a queued step as done (loop thread: block_budget). The
        allocate thread publishes ``allocated_bytes`` before ``extension_done`` is set, so once it is set the
        prefix is final (and a failed step promises nothing)."""
        done = self.extension_done.is_set()  # first: what it announces was published before it
        spare = self.prepared_from
        if spare is not None and spare.allocated_bytes > self.allocated_bytes:
            # A step the spare took before the roll, published on the spare (its Completion is ours now).
            self.allocated_bytes = spare.allocated_bytes
        if done:
            return self.allocated_bytes
        return max(self.allocated_bytes, self.promised_bytes)

    def block_holdings(self, log_end: int | None = None) -> list[tuple[int, int]]:
        """``(data_end, promised_end)`` of the log and both indexes (block_budget), the log promised to
        ``log_end`` (default: as it is) and the indexes to what that log end makes the allocate thread give
        them. A sealed, trimmed segment holds nothing past its data."""
        pending = log_end is not None or not self.extension_done.is_set()
        if log_end is None:
            log_end = self.promised_log_end()
        holdings = [(self.written_position, log_end)]
        for index in (self.offset_index, self.time_index):
            if index.in_memory:
                continue
            size = index.entry.size
            used = index.entries * size
            promised = index.allocated_entries * size
            if pending and index.writable:
                promised = max(promised, index_allocation_bytes(log_end, size, used, self.index_interval_bytes,
                                                                self.index_ahead_bytes))
            holdings.append((used, promised))
        return holdings

    def extend_ahead(self, end: int) -> None:
        """Allocate thread: allocate [allocated_bytes, end) and publish it. Appends may write a byte only once
        allocated_bytes covers it, so publishing after posix_fallocate is what keeps writes off sparse pages.
        Pre-faulting is the window's job (chase)."""
        try:
            if self.sealed or self.closed or self.stop_warm or self.map is None:
                return
            start = self.allocated_bytes
            end = min(end, self.capacity_bytes)
            if end <= start:
                return
            # Index blocks first: an entry is written only once the log bytes it points at are written.
            for index in (self.offset_index, self.time_index):
                index.allocate_to(index_allocation_bytes(end, index.entry.size, index.entries * index.entry.size,
                                                         self.index_interval_bytes, self.index_ahead_bytes))
            preallocate(self.fd, end, start)
            self.allocated_bytes = max(self.allocated_bytes, end)
        except OSError as exc:  # the append path reports it (StorageError) to the appends that need blocks
            first = self.extension_failed_s < 0
            self.extension_failed_s = time.monotonic()
            log.log(logging.WARNING if first else logging.DEBUG, "extending %s failed: %s", self.log_path, exc)

    def chase(self, helper=None) -> None:
        """Warm thread: pre-fault the log from the write position up to the window's target."""
        usable = not (self.sealed or self.closed or self.stop_warm)
        self.prefault.chase(self.map if usable else None, self.fd, lambda: self.allocated_bytes,
                            lambda: self.written_position, helper, self._prefault_lead)

    def _prefault_lead(self) -> int:
        """How far the window may be pre-faulted now (warm thread): as far as its target while appends keep
        arriving; once they have paused for PREFAULT_IDLE_S, the floor window past the write position."""
        if time.monotonic() - self.last_append_s < prefault_module.PREFAULT_IDLE_S:
            return self.capacity_bytes
        return self.written_position + self.window_floor_bytes

    def append_run(self, view: memoryview, batches: list[tuple[int, BatchHeader]], first_offset: int,
                   leader_epoch: int | None, log_append_time_ms: int | None) -> int:
        """Copy ``view`` (whole batches, positions in ``batches`` relative to it) to the end of the map and
        assign offsets from ``first_offset``; stamp ``leader_epoch`` on each batch (None: keep theirs, as a
        follower does). Returns the next offset. Loop thread.

        The copy is one memcpy (6.7 GB/s into pre-faulted pages here vs 2.35 GB/s first-touch), or, for an
        append past the pages the chase has pre-faulted, one pwrite (LogConfig.outrun_pwrite); the header rewrites
        happen in the map so the caller's buffer is never copied twice and never changed. A segment's first
        append writes its base offset first: until then the file may hold no whole batch.

        Raises AppendNotReady (nothing written) while a pre-fault chunk of zeros is being written over the
        range; StorageError if the pwrite fails (EIO, ...; nothing is committed: the bytes past
        ``committed_position`` are overwritten by the next append or cut by recovery), except with EFBIG,
        where the memcpy takes the bytes.
        """
        start = self.written_position
        end = start + len(view)
        # The SIGBUS invariant: never touch a byte that owns no block.
        if end > self.allocated_bytes:
            raise AssertionError(f"append to {end} past the allocated prefix {self.allocated_bytes}")
        # No zeros of a pre-fault chase may land in [start, end): wait (await) for a chunk being written there.
        released = self.prefault.begin_append(start, end)
        if released is not None:
            raise AppendNotReady("a pre-fault's zeros", released, on_waited=observe_append_wait)
        if start == 0:
            self.first_append_ms = now_ms()
        self.last_append_s = time.monotonic()
        region = self.map
        assert region is not None  # only the active segment takes appends, and it is mapped
        head = 0
        if start == 0:
            # A segment's first batch names it at start-up when a roll's renames never ran (adopt_prepared),
            # so its base offset goes in before the rest of it: a kill between the copy and the rewrites
            # below must not leave a whole batch that still carries the client's base offset 0.
            set_base_offset(region, 0, first_offset)
            head = _BASE_OFFSET_BYTES
        prefault = self.prefault
        # position before warm_from: the chase moves warm_from past a gap before position past it.
        if prefault.outrun_pwrite and (end > prefault.position or start < prefault.warm_from):
            try:
                write_at(self.fd, view[head:], start + head)
            except OSError as exc:
                if exc.errno != errno.EFBIG:
                    raise storage_error_from(exc, "appending to", self.log_path) from None
                # A per-file size limit (RLIMIT_FSIZE) caps write(2), not stores into a map over blocks
                # allocated before it: those bytes go in by memcpy, as without the pwrite. The limit
                # then stops the log where it always did, at the next segment's preallocation.
                region[start + head:end] = view[head:]
            else:
                observe_outrun(end - start)
        else:
            region[start + head:end] = view[head:]
        if start == 0:
            failpoint("append.first_copied")
        self.written_position = end
        offset = first_offset
        for relative, header in batches:
            position = start + relative
            size = header.batch_length + LOG_OVERHEAD
            set_base_offset(region, position, offset)
            if leader_epoch is not None and header.partition_leader_epoch != leader_epoch:
                set_leader_epoch(region, position, leader_epoch)
            max_timestamp = header.max_timestamp
            if log_append_time_ms is not None:
                set_log_append_time(region, position, size, log_append_time_ms)
                max_timestamp = log_append_time_ms
            self._index_batch(position, offset, max_timestamp, size)
            offset += header.last_offset_delta + 1
        self.next_offset = offset
        # Visible to readers only now, with every header rewritten.
        self.committed_position = end
        return offset

    def _index_batch(self, position: int, base_offset: int, max_timestamp: int, size: int) -> None:
        """Kafka ``LogSegment.append`` index rule: one entry per index_interval_bytes of log, at a batch start."""
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = base_offset
        if self.bytes_since_last_index_entry > self.index_interval_bytes or (
            self.index_interval_bytes == 0 and position > 0
        ):
            self.offset_index.maybe_append(base_offset - self.base_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp - self.base_offset)
            self.bytes_since_last_index_entry = 0
        self.bytes_since_last_index_entry += size

    def indexes_full(self) -> bool:
        return self.offset_index.is_full or self.time_index.is_full

    # --- loop thread: read -------------------------------------------------------------------------------

    def find_batch(self, offset: int, end_position: int) -> tuple[int, BatchHeader] | None:
        """The batch holding ``offset`` (or the first one after it) below ``end_position``: index floor, then a
        forward header scan (Kafka ``translateOffset``). Touches disk (pread)."""
        _, start = self.offset_index.floor_position(max(0, offset - self.base_offset))
        if start >= end_position:
            start = 0
        for position, header in scan_headers(self.fd, start, end_position):
            if header.last_offset >= offset:
                return position, header
        return None

    def fetch_upper_bound(self, position: int) -> int:
        """An offset above every record of the batches below file ``position`` (a batch start): the base
        offset of the first indexed batch at or after it, else the segment's next offset (Kafka
        ``LogSegment.fetchUpperBoundOffset``, whose caller falls back to the next segment's base). What a
        read_committed fetch's aborted-transaction list is bounded by. Loop thread; reads the index only."""
        entry = self.offset_index.ceiling_position(position) if position > 0 else None
        return self.next_offset if entry is None else self.base_offset + entry[0]

    def whole_batches_end(self, start: int, limit: int) -> int:
        """End of the last batch lying wholly in [start, limit), ``start`` being a batch start; ``start`` if
        none does. The index gives the last indexed batch start below ``limit`` and a header scan walks the
        rest: at most one index interval (4 KiB) of small batches, or one header of big ones. Touches disk."""
        indexed = self.offset_index.floor_batch_start(limit)
        end = indexed if indexed > start else start
        for position, header in scan_headers(self.fd, end, limit):
            end = position + header.size
        return end

    def find_timestamp(self, timestamp_ms: int, end_position: int) -> tuple[int, BatchHeader] | None:
        """The first batch below ``end_position`` whose max timestamp is >= ``timestamp_ms``."""
        entry = self.time_index.floor_below(timestamp_ms)
        start = 0
        if entry is not None:
            _, start = self.offset_index.floor_position(entry[1])
        for position, header in scan_headers(self.fd, start, end_position):
            if header.max_timestamp >= timestamp_ms:
                return position, header
        return None

    # --- pinning -----------------------------------------------------------------------------------------

    def try_pin(self) -> bool:
        """Pin the segment's fd open; False once it has been closed (retired and reaped, or shut down)."""
        with self._lock:
            if self.closed:
                return False
            self._pins += 1
            return True

    def unpin(self) -> bool:
        """Drop one pin; True when this made a retired segment deletable."""
        with self._lock:
            self._pins -= 1
            return self.retired and self._pins == 0

    @property
    def pins(self) -> int:
        return self._pins

    def retire(self, delete_after_ms: int) -> None:
        """Mark the segment retired (renamed ``.deleted``): it is closed and unlinked once unpinned and past
        ``delete_after_ms`` (``take_for_deletion``). Any thread."""
        with self._lock:
            self.retired = True
            self.delete_after_ms = delete_after_ms

    def take_for_deletion(self, now_ms: int) -> bool | None:
        """The reaper's check (any thread): True when the segment is unpinned and past its delay (it is then
        marked closed: the caller closes and unlinks it), False to keep waiting, None when already closed."""
        with self._lock:
            if self.closed:
                return None
            if self._pins == 0 and now_ms >= self.delete_after_ms:
                self.closed = True
                return True
            return False

    def abandon(self) -> None:
        """Close map and fds without waiting for warm-ups (crash tests: the executors are already stopped)."""
        self.warm_done = None
        self.prepared_from = None
        self.close()

    # --- worker threads ------------------------------------------------------------------------------------

    def stop_warming(self) -> None:
        """Ask a running pre-fault of this segment to stop at its next step (any thread)."""
        self.stop_warm = True
        self.prefault.stopped = True
        if self.prepared_from is not None:
            self.prepared_from.stop_warm = True

    def seal_begin(self) -> None:
        """Loop thread, at a roll: no more appends; record the final time-index entry (Kafka
        ``onBecomeInactiveSegment``) so the segment's largest timestamp survives a clean restart."""
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp - self.base_offset,
                                         final=True)
        self.sealed = True

    def _unmap(self) -> None:
        """Stop and wait out every pre-fault of this segment, then unmap it (worker thread): a pre-fault
        running into a closed map would touch freed memory."""
        if self.prepared_from is not None:
            self.prepared_from.stop_warm = True
        self.prefault.stopped = True
        if self.warm_done is not None:
            self.warm_done.wait()
        self.prefault.idle.wait()
        self.extension_done.wait()
        region, self.map = self.map, None
        if region is not None:
            region.close()

    def seal_finish(self) -> None:
        """Unmap, trim the preallocated tail, fdatasync log and indexes (worker thread, after seal_begin)."""
        self._unmap()
        failpoint("seal.after_unmap")
        os.ftruncate(self.fd, self.committed_position)
        set_readahead(self.fd, True)
        self.capacity_bytes = self.allocated_bytes = self.committed_position
        for index in (self.offset_index, self.time_index):
            index.seal_readers()
            index.trim()
        failpoint("seal.after_trim")
        self.offset_index.sync()
        self.time_index.sync()
        sync_data(self.fd)
        self.flushed_position = self.committed_position

    def truncate_to(self, offset: int) -> int:
        """Cut this segment before the batch holding ``offset`` (or the first batch past it). Worker thread;
        appends to the log are paused. Returns the new next offset: that batch's base offset, so at most
        ``offset`` (a cut inside a batch drops the whole batch: the log never holds part of one).

        A mapped (active) segment gets zeros over [cut, committed end), written from the cut upwards: after
        a kill at any moment, recovery stops at the cut (a zero length), and no old batch survives past it
        to be taken, after later appends end right where it starts, for a continuation of the log (it could
        pass both the CRC and the offset checks). The file keeps its size, blocks and pre-faulted pages,
        which the appends reuse. A sealed segment is cut with ftruncate (then made active by the caller).
        Both indexes forget their entries past the cut; the largest timestamp is recomputed from the last
        time entry kept (a scan of at most one index interval plus the batches after it).
        """
        committed = self.committed_position
        found = self.find_batch(offset, committed) if offset < self.next_offset else None
        if found is None:
            return self.next_offset
        cut, header = found
        next_offset = min(header.base_offset, max(offset, self.base_offset))
        if self.map is not None:
            write_zeros(self.fd, cut, committed)
        else:
            os.ftruncate(self.fd, cut)
            self.capacity_bytes = self.allocated_bytes = cut
        failpoint("truncate.after_log_cut")
        self.offset_index.truncate_entries(self.offset_index.entries_below_position(cut))
        self.time_index.truncate_entries(self.time_index.entries_below_offset(next_offset - self.base_offset))
        last = self.time_index.last_entry()
        self.max_timestamp, self.offset_of_max_timestamp, start = -1, self.base_offset, 0
        if last is not None:
            self.max_timestamp, relative = last
            self.offset_of_max_timestamp = self.base_offset + relative
            start = self.offset_index.floor_position(relative)[1]
        for _, batch in scan_headers(self.fd, start, cut):
            if batch.max_timestamp > self.max_timestamp:
                self.max_timestamp, self.offset_of_max_timestamp = batch.max_timestamp, batch.base_offset
        indexed = self.offset_index.floor_batch_start(cut - 1) if self.offset_index.entries else 0
        self.bytes_since_last_index_entry = cut - indexed
        self.written_position = self.committed_position = cut
        self.flushed_position = min(self.flushed_position, cut)
        self.next_offset = next_offset
        return next_offset

    def rename_deleted(self, *, keep_txn_index: bool = False) -> None:
        """Rename the three files to ``*.deleted`` (retention), and its ``.txnindex`` unless
        ``keep_txn_index`` (a cleaning: the markers stay in the log, and loading files each index entry
        under the segment holding its marker); the fd stays valid for pinned readers."""
        with self._lock:
            for attribute in ("log", "offset_index", "time_index"):
                path = self.log_path if attribute == "log" else getattr(self, attribute).path
                target = path.with_name(path.name + filenames.DELETED_SUFFIX)
                try:
                    if attribute == "log":
                        os.rename(path, target)
                        self.log_path = target
                    else:
                        getattr(self, attribute).rename(target)
                except FileNotFoundError:
                    pass
                failpoint("retention.after_rename")
            if not keep_txn_index:
                # The segment's aborted-transaction index goes with it (a later segment may reuse the base).
                index = txn_index_path(self.log_path.parent, self.base_offset)
                try:
                    os.rename(index, index.with_name(index.name + filenames.DELETED_SUFFIX))
                except FileNotFoundError:
                    pass

    def relocate(self, directory: Path) -> None:
        """The directory holding the files was renamed to ``directory``: the paths follow (fds stay valid)."""
        self.log_path = directory / self.log_path.name
        self.offset_index.path = directory / self.offset_index.path.name
        self.time_index.path = directory / self.time_index.path.name

    def close(self, *, unlink: bool = False) -> None:
        """Release map and fds (and remove the files when ``unlink``). Blocking; worker thread or shutdown."""
        with self._lock:
            self.closed = True
        self.sealed = True
        self._unmap()
        self.offset_index.close()
        self.time_index.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if unlink:
            failpoint("retention.before_unlink")
            for path in (self.log_path, self.offset_index.path, self.time_index.path):
                remove_file(path)
            # Its .txnindex, when the segment was live or retired under its own name (not a cleaning's
            # .cleaned segment, whose base names a live segment's index).
            live = filenames.log_path(self.log_path.parent, self.base_offset)
            index = txn_index_path(self.log_path.parent, self.base_offset)
            if self.log_path == live:
                remove_file(index)
            elif self.log_path.name == live.name + filenames.DELETED_SUFFIX:
                remove_file(index.with_name(index.name + filenames.DELETED_SUFFIX))

    def trim_for_shutdown(self) -> None:
        """Clean close of the active segment: final time entry, unmap, trim, fdatasync (shutdown)."""
        if not self.sealed:
            self.seal_begin()
        if self.map is not None or self.capacity_bytes != self.committed_position:
            self.seal_finish()
        else:
            sync_data(self.fd)
            self.flushed_position = self.committed_position
