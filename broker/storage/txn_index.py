"""The aborted-transaction index of a segment: ``<base offset>.txnindex`` (Kafka's ``TransactionIndex``).

Owns the file's format and its blocking operations; what goes in it is decided above storage
(``broker.txn_partition``: an entry per ABORT marker that closes a transaction with batches here).

Format: a flat array of 34-byte big-endian entries, Kafka's ``AbortedTxn`` layout::

    version            int16   0
    producer id        int64
    first offset       int64   the aborted transaction's first batch in this partition
    last offset        int64   its ABORT marker's offset (decides which segment's file holds the entry)
    last stable offset int64   the partition's LSO when the marker was appended

Entries are in marker order. A segment's file holds the entries whose marker lies in the segment; a
segment with no aborted transaction has no file. It is deleted with its segment (``Segment.rename_deleted``
/ ``close``), cut with a truncation (``truncate_to``), and read whole when a partition loads.

Reading (``SealedIndex``, Kafka's ``TransactionIndex.collectAbortedTxns``): once its segment is sealed a file
is never written in place again (a rewrite replaces it by rename, a removal unlinks it), so it is mapped
read-only, off the loop (``open_sealed``, which first checks it holds exactly the entries the partition
expects), and a read_committed fetch reads the entries it overlaps from the map on the loop thread, as
storage's sealed offset indexes are read: a binary search on the marker offsets, then a walk. The map
outlives a rename or an unlink of its file (retention), its pages are the page cache's, not the heap's, and
it holds a file descriptor until its holder lets it go. Nothing here truncates a file in place, which would
fault a reader of its map.

The crash story: entries are appended without fsync when a marker is appended (``append``); the file of a
segment below a producer-state snapshot was fsync'd before that snapshot was written
(``broker.producer_snapshot``), so a loaded snapshot vouches for every entry whose marker is below it.
Entries at or above the snapshot are never trusted: loading replays the log from the snapshot and rewrites
those files (``rewrite``: tmp, fsync, rename, directory fsync). A crash mid-append leaves a torn tail (a size
that is not a multiple of 34): ``decode`` ignores the partial entry and ``read`` reports it, and the replay
rewrites the file. Pure but for the functions marked blocking (worker threads or start-up).
"""

from __future__ import annotations

import bisect
import mmap
import os
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from . import blocking
from .checkpoint import replace_durably
from .filenames import prefix_from_offset

__all__ = ["TXN_INDEX_SUFFIX", "ENTRY", "IndexEntry", "encode", "decode", "txn_index_path", "read", "append",
           "rewrite", "sync", "truncate_to", "index_bases", "remove", "SealedIndex", "open_sealed", "search_done"]

TXN_INDEX_SUFFIX = ".txnindex"
ENTRY = struct.Struct(">hqqqq")
_VERSION = 0
_LAST_OFFSET = struct.Struct(">q")
_LAST_OFFSET_AT = 18  # version, producer id, first offset


class IndexEntry(NamedTuple):
    """One aborted transaction (``broker.txn_partition.AbortedTxn`` is this type)."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def txn_index_path(directory: Path, base_offset: int) -> Path:
    return Path(directory) / (prefix_from_offset(base_offset) + TXN_INDEX_SUFFIX)


def encode(entries: Iterable[tuple[int, int, int, int]]) -> bytes:
    """The bytes of ``entries`` (producer id, first, last, last stable offset), in order. Pure."""
    return b"".join(ENTRY.pack(_VERSION, *entry) for entry in entries)


def decode(data: bytes | mmap.mmap) -> tuple[list[IndexEntry], bool]:
    """``(entries, torn)``: the whole entries of ``data`` and whether a partial one ends it. An entry of
    an unknown version ends the list too (treated as torn: the file is rebuilt or distrusted). Pure."""
    entries: list[IndexEntry] = []
    whole = len(data) - len(data) % ENTRY.size
    for version, producer_id, first, last, stable in ENTRY.iter_unpack(memoryview(data)[:whole]):
        if version != _VERSION:
            return entries, True
        entries.append(IndexEntry(producer_id, first, last, stable))
    return entries, whole != len(data)


def read(path: Path) -> tuple[list[IndexEntry], bool]:
    """``decode`` of the file (no file: no entries). Blocking."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return [], False
    return decode(data)


def append(path: Path, entries: Iterable[tuple[int, int, int, int]]) -> None:
    """Append ``entries`` (no fsync: the snapshot that vouches for them syncs the file first). Blocking."""
    blocking.check("appending to a transaction index")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, encode(entries))
    finally:
        os.close(fd)


def sync(path: Path) -> None:
    """fsync the file if it exists. Blocking."""
    blocking.check("fsync of a transaction index")
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rewrite(path: Path, entries: Sequence[tuple[int, int, int, int]]) -> None:
    """Replace the file by ``entries`` atomically (tmp, fsync, rename, directory fsync); no entries: remove
    it. Blocking."""
    blocking.check("rewriting a transaction index")
    if not entries:
        remove(path)
        return
    replace_durably(path, encode(entries))


def truncate_to(path: Path, offset: int) -> None:
    """Drop the entries whose marker is at or past ``offset`` (a truncation of the log to end there).
    Blocking."""
    entries, torn = read(path)
    kept = [entry for entry in entries if entry.last_offset < offset]
    if len(kept) != len(entries) or torn:
        rewrite(path, kept)


def remove(path: Path) -> None:
    blocking.check("unlink of a transaction index")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def index_bases(directory: Path) -> list[int]:
    """The base offsets of the ``.txnindex`` files in ``directory``, in order. Blocking."""
    bases = []
    for name in os.listdir(directory):
        stem, dot, suffix = name.partition(".")
        if dot and "." + suffix == TXN_INDEX_SUFFIX and len(stem) == 20 and stem.isdigit():
            bases.append(int(stem))
    return sorted(bases)


def search_done(entry: tuple[int, int, int, int], upper_offset: int) -> bool:
    """Whether no entry after ``entry`` (in marker order) can overlap a fetch below ``upper_offset`` (Kafka's
    ``lastStableOffset >= upperBoundOffset``). When its marker was appended, every transaction still open
    began at or after its last stable offset, and any later one begins after its marker: every later entry's
    first offset is at least ``min(last stable offset, marker + 1)``. (The marker bound holds even for an entry
    whose last stable offset was computed by a load against a later high watermark.) Pure."""
    return min(entry[3], entry[2] + 1) >= upper_offset


class SealedIndex:
    """A sealed segment's index file mapped read-only: its ``count`` entries, whose markers lie in
    [``first_marker``, ``last_marker``]. Reads on the loop thread; opened by ``open_sealed`` off it."""

    __slots__ = ("base_offset", "count", "first_marker", "last_marker", "_map")

    def __init__(self, base_offset: int, region: mmap.mmap, count: int) -> None:
        self.base_offset = base_offset
        self._map = region
        self.count = count
        self.first_marker = self._last_offset(0)
        self.last_marker = self._last_offset(count - 1)

    def __repr__(self) -> str:
        return f"SealedIndex({self.base_offset}, {self.count} entries, markers {self.first_marker}..{self.last_marker})"

    def _last_offset(self, number: int) -> int:
        last: int = _LAST_OFFSET.unpack_from(self._map, number * ENTRY.size + _LAST_OFFSET_AT)[0]
        return last

    def entries(self) -> list[IndexEntry]:
        return decode(self._map)[0]

    def collect(self, fetch_offset: int, upper_offset: int, found: list[IndexEntry]) -> int | None:
        """Append to ``found`` the entries a fetch of [fetch_offset, upper_offset) overlaps (marker at or after
        the fetch offset, first offset below the upper bound). Returns the marker of the entry at which the
        search is done (``search_done``: no later entry, here or in a later file, overlaps the fetch), or
        None."""
        number = bisect.bisect_left(range(self.count), fetch_offset, key=self._last_offset)
        make = tuple.__new__  # IndexEntry(...) without its Python-level __new__: a third of the walk's cost
        with memoryview(self._map) as view:
            last: int
            for _version, producer_id, first, last, stable in ENTRY.iter_unpack(view[number * ENTRY.size:]):
                if first < upper_offset:
                    found.append(make(IndexEntry, (producer_id, first, last, stable)))
                if (stable if stable <= last else last + 1) >= upper_offset:  # search_done, inlined
                    return last
        return None


def open_sealed(path: Path, base_offset: int, expected: Sequence[tuple[int, int, int, int]]) -> SealedIndex | None:
    """Map the sealed segment's file read-only, if it holds exactly ``expected`` (the entries the partition
    recorded for the segment; anything else, a torn tail or an append that failed, and the caller keeps its
    own copy). Blocking (worker threads or start-up)."""
    blocking.check("mapping a transaction index")
    if not expected:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size != len(expected) * ENTRY.size:
            return None
        region = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
    entries, torn = decode(region)
    if torn or entries != list(expected):  # IndexEntry == tuple, field by field
        region.close()
        return None
    return SealedIndex(base_offset, region, len(entries))
