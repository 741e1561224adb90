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

The crash story: entries are appended without fsync when a marker is appended (``append``); the file of a
segment below a producer-state snapshot was fsync'd before that snapshot was written
(``broker.producer_snapshot``), so a loaded snapshot vouches for every entry whose marker is below it.
Entries at or above the snapshot are never trusted: loading replays the log from the snapshot and rewrites
those files (``rewrite``: tmp, fsync, rename, directory fsync). A crash mid-append leaves a torn tail (a size
that is not a multiple of 34): ``decode`` ignores the partial entry and ``read`` reports it, and the replay
rewrites the file. Pure but for the functions marked blocking (worker threads or start-up).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from . import blocking
from .checkpoint import replace_durably
from .filenames import prefix_from_offset

__all__ = ["TXN_INDEX_SUFFIX", "ENTRY", "IndexEntry", "encode", "decode", "txn_index_path", "read", "append",
           "rewrite", "sync", "truncate_to", "index_bases", "remove"]

TXN_INDEX_SUFFIX = ".txnindex"
ENTRY = struct.Struct(">hqqqq")
_VERSION = 0


class IndexEntry(NamedTuple):
    """One aborted transaction (the fields of ``broker.txn_partition.AbortedTxn``)."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def txn_index_path(directory: Path, base_offset: int) -> Path:
    return Path(directory) / (prefix_from_offset(base_offset) + TXN_INDEX_SUFFIX)


def encode(entries: Iterable[tuple[int, int, int, int]]) -> bytes:
    """The bytes of ``entries`` (producer id, first, last, last stable offset), in order. Pure."""
    return b"".join(ENTRY.pack(_VERSION, *entry) for entry in entries)


def decode(data: bytes) -> tuple[list[IndexEntry], bool]:
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
