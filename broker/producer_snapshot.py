"""Producer-state snapshots: ``<offset>.snapshot`` in a partition's directory (Kafka's
``ProducerStateManager`` snapshot files).

A snapshot holds one partition's producer state and transactions as they were with the log ending at
``offset``: loading reads the latest usable one and replays only the log from there (``broker.
partition_state_files``) instead of the whole log.

Format (big-endian; ``crc`` is CRC-32C of every byte after it)::

    version      int16   1
    crc          uint32
    offset       int64   the log end the state is of (also the file's name, 20 digits)
    producers    int32, then per producer:
        producer id int64, epoch int16, last timestamp int64 (of its last batch or marker: what
        ``producer.id.expiration.ms`` goes by), batches int8 (at most 5, oldest first), then per batch:
        first sequence int32, last sequence int32, first offset int64, last offset int64
    ongoing      int32, then per open transaction: producer id int64, first offset int64
    completing   int32, then per transaction whose marker may not be replicated yet:
                 marker offset int64, first offset int64
    coordinator epochs  int32, then per producer with a marker here: producer id int64, the coordinator
                 epoch of its last marker int64 (a deposed coordinator's later marker is fenced by it)

Kafka keeps one batch per producer and the coordinator epoch; this keeps the coordinator epoch and the last
five batches (a retry of
any of them is still answered with its original offsets after a restart) and, like Kafka, no aborted
transactions: those are in the segments' ``.txnindex`` files (``broker.storage.txn_index``).

The crash story. A snapshot is written to ``<name>.tmp``, fsync'd, renamed, and the directory fsync'd: a
crash leaves the old set of snapshots, possibly with a ``.tmp`` that is ignored and removed, never a torn
snapshot under its name (the CRC catches one a disk tore anyway: it is deleted and the next older one
used). Before a snapshot is written, every ``.txnindex`` entry below its offset is fsync'd, so a snapshot
vouches for them. The log below a snapshot may be less durable than the snapshot: a snapshot past the log
end found at load (recovery cut what it covered) is deleted, as are those past a truncation's new end.
Snapshots below the first segment are deleted when a newer one is written. Pure but for the functions
marked blocking (worker threads, start-up, shutdown).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import NamedTuple

from copyless.broker.storage import blocking
from copyless.broker.storage.checkpoint import replace_durably
from copyless.broker.storage.filenames import prefix_from_offset
from copyless.protocol.records import crc32c

__all__ = ["SNAPSHOT_SUFFIX", "ProducerSnapshot", "SnapshotProducer", "CorruptSnapshotError", "encode", "decode",
           "snapshot_path", "snapshot_offsets", "write", "read", "remove_outside"]

SNAPSHOT_SUFFIX = ".snapshot"
_VERSION = 1
_HEAD = struct.Struct(">hI")
_OFFSET_COUNT = struct.Struct(">qi")
_COUNT = struct.Struct(">i")
_PRODUCER = struct.Struct(">qhqb")
_BATCH = struct.Struct(">iiqq")
_PAIR = struct.Struct(">qq")


class SnapshotProducer(NamedTuple):
    producer_id: int
    epoch: int
    last_timestamp: int  # ms, of its last batch or marker
    # (first sequence, last sequence, first offset, last offset), oldest first
    batches: tuple[tuple[int, int, int, int], ...]


class ProducerSnapshot(NamedTuple):
    offset: int
    producers: tuple[SnapshotProducer, ...]  # by producer id
    ongoing: tuple[tuple[int, int], ...]  # (producer id, first offset), by producer id
    completing: tuple[tuple[int, int], ...]  # (marker offset, first offset), in marker order
    coordinator_epochs: tuple[tuple[int, int], ...] = ()  # (producer id, its last marker's coordinator epoch)


class CorruptSnapshotError(ValueError):
    """A snapshot file whose version, CRC or length is wrong."""


def encode(snapshot: ProducerSnapshot) -> bytes:
    """The file's bytes. Pure."""
    parts = [_OFFSET_COUNT.pack(snapshot.offset, len(snapshot.producers))]
    for producer in snapshot.producers:
        parts.append(_PRODUCER.pack(producer.producer_id, producer.epoch, producer.last_timestamp,
                                    len(producer.batches)))
        parts.extend(_BATCH.pack(*batch) for batch in producer.batches)
    parts.append(_COUNT.pack(len(snapshot.ongoing)))
    parts.extend(_PAIR.pack(*pair) for pair in snapshot.ongoing)
    parts.append(_COUNT.pack(len(snapshot.completing)))
    parts.extend(_PAIR.pack(*pair) for pair in snapshot.completing)
    parts.append(_COUNT.pack(len(snapshot.coordinator_epochs)))
    parts.extend(_PAIR.pack(*pair) for pair in snapshot.coordinator_epochs)
    body = b"".join(parts)
    return _HEAD.pack(_VERSION, crc32c(body)) + body


def decode(data: bytes) -> ProducerSnapshot:
    """Parse a snapshot file. Pure.

    Raises:
        CorruptSnapshotError: an unknown version, a CRC mismatch, or a length that does not match.
    """
    try:
        version, crc = _HEAD.unpack_from(data, 0)
        if version != _VERSION:
            raise CorruptSnapshotError(f"unknown snapshot version {version}")
        body = memoryview(data)[_HEAD.size:]
        if crc32c(body) != crc:
            raise CorruptSnapshotError("snapshot CRC mismatch")
        offset, count = _OFFSET_COUNT.unpack_from(body, 0)
        at = _OFFSET_COUNT.size
        producers = []
        for _ in range(count):
            producer_id, epoch, last_timestamp, batch_count = _PRODUCER.unpack_from(body, at)
            at += _PRODUCER.size
            batches = tuple(_BATCH.unpack_from(body, at + i * _BATCH.size) for i in range(batch_count))
            at += batch_count * _BATCH.size
            producers.append(SnapshotProducer(producer_id, epoch, last_timestamp, batches))
        pairs = []
        for _ in range(3):
            (count,) = _COUNT.unpack_from(body, at)
            at += _COUNT.size
            pairs.append(tuple(_PAIR.unpack_from(body, at + i * _PAIR.size) for i in range(count)))
            at += count * _PAIR.size
    except struct.error as exc:
        raise CorruptSnapshotError(f"truncated snapshot: {exc}") from None
    if at != len(body):
        raise CorruptSnapshotError(f"{len(body) - at} stray bytes after the snapshot")
    return ProducerSnapshot(offset, tuple(producers), pairs[0], pairs[1], pairs[2])


def snapshot_path(directory: Path, offset: int) -> Path:
    return Path(directory) / (prefix_from_offset(offset) + SNAPSHOT_SUFFIX)


def snapshot_offsets(directory: Path) -> list[int]:
    """The offsets of the snapshot files in ``directory``, ascending. Blocking (listdir)."""
    offsets = []
    for name in os.listdir(directory):
        if name.endswith(SNAPSHOT_SUFFIX) and len(name) == 20 + len(SNAPSHOT_SUFFIX) and name[:20].isdigit():
            offsets.append(int(name[:20]))
    return sorted(offsets)


def write(directory: Path, snapshot: ProducerSnapshot) -> Path:
    """Write ``snapshot`` durably: tmp, fsync, rename, directory fsync (module docstring). Blocking."""
    blocking.check("writing a producer snapshot")
    path = snapshot_path(directory, snapshot.offset)
    replace_durably(path, encode(snapshot), "snapshot")
    return path


def read(directory: Path, offset: int) -> ProducerSnapshot:
    """Read and check one snapshot. Blocking.

    Raises:
        CorruptSnapshotError (also when the offset inside is not the one in the name), OSError.
    """
    snapshot = decode(snapshot_path(directory, offset).read_bytes())
    if snapshot.offset != offset:
        raise CorruptSnapshotError(f"snapshot {offset} says offset {snapshot.offset}")
    return snapshot


def remove_outside(directory: Path, low: int, high: int) -> list[int]:
    """Delete the snapshots below ``low`` or above ``high``, and leftover ``.tmp`` files; return the
    offsets deleted. Blocking (unlink)."""
    blocking.check("deleting producer snapshots")
    removed = [offset for offset in snapshot_offsets(directory) if offset < low or offset > high]
    for offset in removed:
        snapshot_path(directory, offset).unlink(missing_ok=True)
    for name in os.listdir(directory):
        if name.endswith(SNAPSHOT_SUFFIX + ".tmp"):
            (Path(directory) / name).unlink(missing_ok=True)
    return removed
