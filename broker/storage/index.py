"""OffsetIndex and TimeIndex: the sparse index files of a segment (file layer; search math in index_search).

Formats (big-endian, no header, no checksum: Kafka's ``OffsetIndex``/``TimeIndex``)::

    .index      entry = relative_offset u32 | position u32           8 bytes
    .timeindex  entry = timestamp_ms i64 | relative_offset u32       12 bytes

One offset entry is added per ``index_interval_bytes`` of log (4096 by default) and points at a batch start;
a time entry is added alongside when the segment's largest timestamp grew. Relative offset = offset -
segment base offset.

Lifecycle. An active index file has the logical size ``segment_index_bytes`` (rounded down to whole entries)
and is mapped read-write, but owns blocks only for a prefix (``allocated_entries``) that grows in steps
with the segment's own blocks (``allocate_to``, worker thread): a write into a page without blocks on a full
disk is SIGBUS, so an entry that would land past the prefix is skipped (a sparse index may skip entries;
lookups then scan a little further). Appends are a ``pack_into`` on the map (no syscall). Sealing swaps readers onto a
read-only map of the used prefix, unmaps the writable map and trims the file to its entries (worker
thread). Sealed indexes are mapped lazily on first lookup (Kafka's ``LazyIndex``: start-up time with many
segments). Indexes are never trusted after a crash: recovery rebuilds them from the log.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
from pathlib import Path

from . import index_search
from ._fileops import populate, preallocate, sync_data

__all__ = ["SparseIndex", "OffsetIndex", "TimeIndex"]

log = logging.getLogger("copyless.storage")
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class SparseIndex:
    """A file of fixed-size entries, append-only while active. Loop thread: append, lookups. Worker: trim."""

    entry = index_search.OFFSET_ENTRY

    def __init__(self, path: Path, fd: int, entries: int, max_entries: int, writable_map: mmap.mmap | None) -> None:
        self.path = path
        self.fd = fd
        self.entries = entries
        self.max_entries = max_entries
        self._writable_map = writable_map
        # Entries [0, allocated_entries) own blocks; appends never write past them.
        self.allocated_entries = max_entries
        self.skipped_entries = 0
        # What lookups read: the writable map while active, a read-only map (or b"") once sealed, None until
        # a sealed index is first used.
        self._data: mmap.mmap | bytes | None = writable_map
        # True while the entries live in an anonymous map (rebuilt on a full disk; see make_writable).
        self.in_memory = False

    # --- construction (worker thread or start-up) ---------------------------------------------------------

    @classmethod
    def create(cls, path: Path, max_index_bytes: int, allocate_bytes: int | None = None):
        """A new, empty, mapped index at ``path`` (replacing any file there), with blocks for its first
        ``allocate_bytes`` (all of it when None)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            index = cls(path, fd, 0, 0, None)
            index.make_writable(max_index_bytes, allocate_bytes=allocate_bytes)
            return index
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def open_existing(cls, path: Path):
        """Open a sealed (trimmed) index; a missing file opens as an empty one."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        size = os.fstat(fd).st_size
        entries = size // cls.entry.size
        return cls(path, fd, entries, entries, None)

    def make_writable(self, max_index_bytes: int, *, memory_fallback: bool = False,
                      allocate_bytes: int | None = None) -> None:
        """Grow to the maximum size (sparse), give the used entries plus ``allocate_bytes`` (all when None)
        blocks, and map read-write (the active segment's index).

        With ``memory_fallback``, a full disk (ENOSPC, EDQUOT, EFBIG) is not an error: the entries are kept in
        an anonymous map instead (recovery on a full disk must not need new space) and written to the file
        when the index is sealed; a later call moves them back into a preallocated file when space allows.
        """
        length = max(self.entry.size, max_index_bytes - max_index_bytes % self.entry.size)
        used = self.entries * self.entry.size
        if length < used:
            length = used
        previous_writable = self._writable_map
        allocated = length if allocate_bytes is None else min(length, used + allocate_bytes)
        allocated -= allocated % self.entry.size
        try:
            preallocate(self.fd, allocated)
            if os.fstat(self.fd).st_size < length:
                os.ftruncate(self.fd, length)  # the sparse rest: a map may not reach past the end of its file
            region = mmap.mmap(self.fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            if self.in_memory and used:
                assert previous_writable is not None  # in_memory: the entries are in an anonymous map
                region[:used] = previous_writable[:used]
            self.in_memory = False
        except OSError as exc:
            if not memory_fallback or exc.errno not in _DISK_FULL:
                raise
            if self.in_memory:  # already in memory: keep it (it has room for what recovery needs)
                return
            region = mmap.mmap(-1, length)
            if used:
                region[:used] = os.pread(self.fd, used, 0)
            self.in_memory = True
            allocated = length
        self.max_entries = length // self.entry.size
        self.allocated_entries = allocated // self.entry.size
        previous, self._data = self._data, region
        self._writable_map = region
        for stale in {id(r): r for r in (previous, previous_writable) if isinstance(r, mmap.mmap)}.values():
            if stale is not region:
                stale.close()

    def reset(self, max_index_bytes: int) -> None:
        """Drop every entry (recovery rebuild): unmap, truncate to 0, preallocate and map again (in memory
        when the disk is full: see make_writable)."""
        self._release_maps()
        os.ftruncate(self.fd, 0)
        self.entries = 0
        self.in_memory = False
        self.make_writable(max_index_bytes, memory_fallback=True)

    # --- loop thread ----------------------------------------------------------------------------------

    @property
    def writable(self) -> bool:
        return self._writable_map is not None

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    def _append(self, a: int, b: int) -> None:
        if self.entries >= self.allocated_entries:
            self.skipped_entries += 1  # its blocks are not allocated yet (allocate_to): a sparse index skips
            return
        region = self._writable_map
        assert region is not None  # sealing sets allocated_entries = entries: a sealed index returns above
        self.entry.pack_into(region, self.entries * self.entry.size, a, b)
        self.entries += 1

    def prefault(self, start: int, length: int, should_stop=lambda: False) -> None:
        """Pre-fault [start, start+length) of the writable map (worker thread; see _fileops.populate): the
        first write to each page of a mapped file may wait for the filesystem's journal. Nothing when the
        index is not writable."""
        region = self._writable_map
        if region is not None and length > 0:
            populate(region, start, length, should_stop)

    def allocate_to(self, length: int) -> None:
        """Give the first ``length`` bytes (whole entries, at most the maximum size) blocks (worker thread).
        Raises OSError (ENOSPC...): the index then keeps skipping entries past its blocks."""
        if self._writable_map is None or self.in_memory:
            return
        length = min(length, self.max_entries * self.entry.size)
        length -= length % self.entry.size
        current = self.allocated_entries * self.entry.size
        if length > current:
            preallocate(self.fd, length, current)
            self.allocated_entries = length // self.entry.size

    def data(self):
        """The buffer lookups read (mapping a sealed index on first use)."""
        data = self._data
        if data is None:
            length = self.entries * self.entry.size
            data = mmap.mmap(self.fd, length, mmap.MAP_SHARED, mmap.PROT_READ) if length else b""
            self._data = data
        return data

    def _search(self, function, *args):
        # A seal on a worker thread may close the writable map between our read of self._data and the search
        # (the GIL can switch between bytecodes); CPython then raises ValueError, and the fresh map works.
        for _ in range(3):
            data = self.data()
            try:
                return function(data, self.entries, *args)
            except ValueError:
                if data is self._data:
                    raise
        return function(self.data(), self.entries, *args)

    def seal_readers(self) -> None:
        """Point lookups at a read-only map of the used entries (worker thread, before trim)."""
        if self.in_memory:
            self._write_out()
        length = self.entries * self.entry.size
        previous = self._data
        self._data = mmap.mmap(self.fd, length, mmap.MAP_SHARED, mmap.PROT_READ) if length else b""
        self.max_entries = self.allocated_entries = self.entries
        writable, self._writable_map = self._writable_map, None
        for region in {id(r): r for r in (writable, previous) if isinstance(r, mmap.mmap)}.values():
            region.close()

    def _write_out(self) -> None:
        """Persist entries kept in memory (sealing on a full disk). If even that finds no space, the file is
        left empty: an empty index is valid (lookups scan from position 0) and recovery rebuilds it."""
        length = self.entries * self.entry.size
        region = self._writable_map
        assert region is not None  # only an index still in memory is written out
        data = bytes(region[:length])
        try:
            written = 0
            while written < length:
                written += os.pwrite(self.fd, data[written:], written)
            os.ftruncate(self.fd, length)
        except OSError as exc:
            if exc.errno not in _DISK_FULL:
                raise
            log.warning("%s: no space to write %d index bytes; left empty (lookups scan the segment)",
                        self.path, length)
            os.ftruncate(self.fd, 0)
            self.entries = 0
        self.in_memory = False

    def truncate_entries(self, count: int) -> None:
        """Keep only the first ``count`` entries (the log was truncated; worker thread, appends paused). A
        writable index forgets the rest (they are overwritten by the next entries, cut at seal, and never
        trusted after a crash); a sealed one is cut on disk and mapped again on its next lookup."""
        if count >= self.entries:
            return
        if self.writable:
            self.entries = count
            return
        region, self._data = self._data, None
        if isinstance(region, mmap.mmap):
            region.close()
        os.ftruncate(self.fd, count * self.entry.size)
        self.entries = self.max_entries = count

    def trim(self) -> None:
        """Cut the preallocated tail (worker thread; after seal_readers, so nothing maps the tail)."""
        os.ftruncate(self.fd, self.entries * self.entry.size)
        self.allocated_entries = self.entries

    def sync(self) -> None:
        sync_data(self.fd)

    def rename(self, path: Path) -> None:
        os.rename(self.path, path)
        self.path = path

    def _release_maps(self) -> None:
        for region in (self._writable_map, self._data):
            if isinstance(region, mmap.mmap):
                region.close()
        self._writable_map = None
        self._data = None

    def close(self) -> None:
        self._release_maps()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class OffsetIndex(SparseIndex):
    """relative_offset u32 | position u32."""

    entry = index_search.OFFSET_ENTRY

    def last_relative_offset(self) -> int:
        return index_search.offset_entry(self.data(), self.entries - 1)[0] if self.entries else -1

    def maybe_append(self, relative_offset: int, position: int) -> None:
        """Add an entry unless full or not strictly after the last one (a sparse index may skip entries)."""
        if self.entries < self.max_entries and (self.entries == 0 or relative_offset > self.last_relative_offset()):
            self._append(relative_offset, position)

    def floor_position(self, relative_offset: int) -> tuple[int, int]:
        """``(relative_offset, position)`` of the last entry <= ``relative_offset``; (0, 0) if none."""

        def lookup(data, entries, target):
            slot = index_search.floor_offset_slot(data, entries, target)
            return (0, 0) if slot < 0 else index_search.offset_entry(data, slot)

        return self._search(lookup, relative_offset)

    def ceiling_position(self, position: int) -> tuple[int, int] | None:
        """``(relative_offset, position)`` of the first entry at or after file ``position``; None if none."""

        def lookup(data, entries, target):
            slot = index_search.floor_position_slot(data, entries, target - 1) + 1
            return index_search.offset_entry(data, slot) if slot < entries else None

        return self._search(lookup, position)

    def floor_batch_start(self, position: int) -> int:
        """File position of the last indexed batch start <= ``position``; 0 (the first batch) if none."""

        def lookup(data, entries, target):
            slot = index_search.floor_position_slot(data, entries, target)
            return 0 if slot < 0 else index_search.offset_entry(data, slot)[1]

        return self._search(lookup, position)

    def entries_below_position(self, position: int) -> int:
        """How many entries point below file ``position``."""
        if position <= 0:
            return 0
        return self._search(index_search.floor_position_slot, position - 1) + 1

    def sane(self, next_relative_offset: int, size_bytes: int) -> bool:
        """O(1) check of a trusted index (Kafka's ``sanityCheck``): the last entry lies inside the segment."""
        if self.entries == 0:
            return True
        relative_offset, position = index_search.offset_entry(self.data(), self.entries - 1)
        return relative_offset < max(next_relative_offset, 1) and position < max(size_bytes, 1)


class TimeIndex(SparseIndex):
    """timestamp_ms i64 | relative_offset u32."""

    entry = index_search.TIME_ENTRY

    def last_entry(self) -> tuple[int, int] | None:
        return index_search.time_entry(self.data(), self.entries - 1) if self.entries else None

    @property
    def is_full(self) -> bool:
        # The last slot is reserved for the entry written when the segment is sealed (Kafka's TimeIndex does
        # the same): that entry records the segment's largest timestamp, which a clean restart reads back.
        return self.entries >= self.max_entries - 1

    def maybe_append(self, timestamp_ms: int, relative_offset: int, *, final: bool = False) -> None:
        """Add an entry when the timestamp grew past the last entry (timestamps strictly increase). Only the
        ``final`` entry (at seal) may take the reserved last slot."""
        if self.entries >= (self.max_entries if final else self.max_entries - 1):
            return
        if self.entries:
            last_timestamp, last_relative_offset = index_search.time_entry(self.data(), self.entries - 1)
            if timestamp_ms <= last_timestamp or relative_offset < last_relative_offset:
                return
        self._append(timestamp_ms, relative_offset)

    def entries_below_offset(self, relative_offset: int) -> int:
        """How many entries name a relative offset below ``relative_offset`` (their offsets never decrease)."""

        def count(data, entries, target):
            while entries and index_search.time_entry(data, entries - 1)[1] >= target:
                entries -= 1
            return entries

        return self._search(count, relative_offset)

    def floor_below(self, timestamp_ms: int) -> tuple[int, int] | None:
        """``(timestamp, relative_offset)`` of the last entry with timestamp < ``timestamp_ms``; None if none."""

        def lookup(data, entries, target):
            slot = index_search.floor_timestamp_slot(data, entries, target)
            return None if slot < 0 else index_search.time_entry(data, slot)

        return self._search(lookup, timestamp_ms)

    def sane(self, next_relative_offset: int) -> bool:
        """O(1) check of a trusted index: the last entry names an offset inside the segment."""
        last = self.last_entry()
        return last is None or last[1] < max(next_relative_offset, 1)
