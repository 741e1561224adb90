"""Durable small files: the offset checkpoints and the clean-shutdown marker.

Checkpoint format (Kafka's ``CheckpointFile``, text, one entry per line)::

    0                       version
    <count>
    <topic> <partition> <offset>      the data dir's offset checkpoints (recovery point, high watermark,
    ...                               log start offset), one line per partition
    <epoch> <start_offset>            a partition's ``leader-epoch-checkpoint`` (leader_epoch_cache.py)

Written as Kafka does: ``<file>.tmp`` is written and fsynced, renamed over ``<file>``, then the directory is
fsynced so the rename itself survives a power cut. A reader therefore sees either the old file or the new
one, never a torn one; a leftover ``.tmp`` is ignored. An unreadable checkpoint is treated as absent (every
log then recovers from offset 0: slower, never wrong).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from . import blocking
from ._failpoints import failpoint

__all__ = ["write_checkpoint", "read_checkpoint", "write_entries", "read_entries", "fsync_directory", "write_marker",
           "remove_marker"]

log = logging.getLogger("copyless.storage")
_VERSION = 0


def fsync_directory(directory) -> None:
    """fsync a directory so renames and unlinks in it are durable (worker threads, start-up, shutdown)."""
    blocking.check("fsync of a directory")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(path: Path, entries: dict[tuple[str, int], int]) -> None:
    """Atomically replace ``path`` with ``entries``. Blocking (fsync x2): worker thread or shutdown only."""
    write_entries(path, [(topic, partition, offset) for (topic, partition), offset in sorted(entries.items())])


def write_entries(path: Path, entries: list[tuple]) -> None:
    """Atomically replace ``path`` with a checkpoint of ``entries`` (each a tuple of fields, written
    space-separated). Blocking (fsync x2): worker thread or shutdown only."""
    blocking.check("writing a checkpoint")
    lines = [str(_VERSION), str(len(entries))]
    lines += [" ".join(str(field) for field in entry) for entry in entries]
    replace_durably(path, ("\n".join(lines) + "\n").encode(), "checkpoint")


def replace_durably(path: Path, data: bytes, failpoints: str | None = None) -> None:
    """Replace ``path`` by ``data`` so that a crash leaves the old file or the new one, never a torn one:
    ``<file>.tmp`` written and fsync'd, renamed over ``path``, the directory fsync'd. ``failpoints`` names
    the ``<name>.after_tmp_write`` / ``before_rename`` / ``after_rename`` steps a crash test can stop at.
    Blocking (fsync x2): worker thread, start-up or shutdown only."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if failpoints:
                failpoint(f"{failpoints}.after_tmp_write")
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        # A full disk: give back what the partial copy took; the old file stays in force.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if failpoints:
        failpoint(f"{failpoints}.before_rename")
    os.replace(tmp, path)
    if failpoints:
        failpoint(f"{failpoints}.after_rename")
    fsync_directory(path.parent)


def read_entries(path: Path) -> list[str] | None:
    """The entry lines of the checkpoint at ``path``: None when the file is missing.

    Raises:
        ValueError: the file is not a version-0 checkpoint or its count does not match its lines.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    lines = text.splitlines()
    if not lines or lines[0] != str(_VERSION):
        raise ValueError(f"version {lines[0] if lines else '(empty file)'}")
    if len(lines) < 2:
        raise ValueError("no count line")
    count = int(lines[1])
    entries = lines[2 : 2 + count]
    if len(entries) != count or any(line.strip() for line in lines[2 + count :]):
        raise ValueError(f"{len(entries)} entries, header says {count}")
    return entries


def read_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """The entries of ``path``; {} when missing or malformed (logged)."""
    try:
        lines = read_entries(path)
        if lines is None:
            return {}
        entries = {}
        for line in lines:
            topic, partition, offset = line.rsplit(" ", 2)
            entries[(topic, int(partition))] = int(offset)
        if len(entries) != len(lines):
            raise ValueError(f"{len(lines)} lines, {len(entries)} distinct partitions")
        return entries
    except (ValueError, IndexError) as exc:
        log.warning("ignoring malformed checkpoint %s: %s", path, exc)
        return {}


def write_marker(path: Path) -> None:
    """Create ``path`` durably (file fsync + directory fsync)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_directory(path.parent)


def remove_marker(path: Path) -> bool:
    """Remove ``path`` durably; True if it existed. The directory fsync matters: a marker that reappears
    after a power cut would make the next start skip recovery of a log that was never shut down cleanly."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    fsync_directory(path.parent)
    return True
