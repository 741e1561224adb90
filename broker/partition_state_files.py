"""A partition's producer state and transactions on disk: loaded from the latest snapshot plus the log after
it, kept by appending ``.txnindex`` entries and writing snapshots on one worker thread.

Loading (``load_partition_state``; start-up, and a follower's truncation), as Kafka's ``LogLoader`` /
``ProducerStateManager.truncateAndReload``:

1. snapshots outside [first segment base, log end] are deleted: past the end, the log they describe was cut
   (by recovery after a crash, or by the truncation); below the first segment, retention removed it;
2. the latest snapshot that reads back (CRC) gives the producers, the open transactions and those whose
   marker may not be replicated; the ``.txnindex`` entries whose marker is below it give the aborted ones
   (every file is read: an entry belongs to the segment holding its marker, whichever file a cleaning
   left it in);
3. the log is replayed from the snapshot's offset: its headers, and the key of each control batch;
4. the ``.txnindex`` files from the segment holding that offset on are rewritten from the result (a torn
   tail, entries past a truncation, entries in the file of a segment a cleaning merged away), and a
   snapshot at the log end is written when the replay read anything, so the next load starts there;
5. the sealed segments' files are mapped (``txn_index.open_sealed``) and their entries leave the heap: the
   loaded state holds the active segment's aborted transactions only (``broker.txn_partition``).

With no usable snapshot (a data dir written before snapshots existed, or every snapshot was past a cut) the
replay starts at the first segment for a partition that ever held a transactional batch (its
``transactional`` file says so: ``broker.txn_partition``) and, for the others, at the second-to-last segment
(``producer_state_scan_start``: only idempotent producers' recent batches matter there). A torn index file
of the snapshot's segment or an earlier one is not trusted either (its entries below the snapshot were
fsync'd before it, but a tear cannot say which entries it cut: a crash cuts only later ones, a disk fault any):
the replay then starts at the first segment, as it did before snapshots existed. A torn file of a later
segment lost only entries the replay reads back.

Writing (``StateFiles``, one thread for the whole broker, so each partition's writes land in the order the
loop thread asked for them): an ABORT marker's entry is appended to the ``.txnindex`` of the segment holding
it; at each roll (the partition sees a new active segment after an append) and at a clean shutdown a
snapshot at the log end is captured on the loop thread (O(producers)) and written there, after the
partition's index files written since the last snapshot are fsync'd; then the rolled segment's file is
mapped and handed to the partition's state (``seal``), which drops those entries from the heap. A write that
fails is logged; after a failed index append no snapshot of that partition is written until it is loaded
again (one would vouch for an entry that is not on disk), and no file of it is mapped (the heap keeps the
entries). The loop thread never waits for any of it.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from copyless.broker import producer_snapshot
from copyless.broker.partition_interfaces import ProducerStates
from copyless.broker.producer_snapshot import CorruptSnapshotError, ProducerSnapshot, SnapshotProducer
from copyless.broker.producer_state import ProducerStateManager, producer_state_scan_start
from copyless.broker.storage import txn_index
from copyless.broker.txn_partition import TXN_MARKER_FILE, AbortedTxn, PartitionTxns

__all__ = ["LoadedState", "load_partition_state", "capture_snapshot", "StateFiles"]

log = logging.getLogger("copyless.producer_state")


class LoadedState(NamedTuple):
    producers: list  # (producer id, epoch, last timestamp, batches): ProducerStateManager.restore's input
    txns: PartitionTxns
    snapshot_offset: int | None  # the snapshot loaded, None when there was none
    replay_start: int
    batches_replayed: int
    snapshot_at_end: bool  # a snapshot at the log end is on disk (loaded, or written by the load)


def _segment_of(bases: list[int], offset: int) -> int:
    return bases[max(bisect.bisect_right(bases, offset) - 1, 0)]


def load_partition_state(partition_log: Any, high_watermark: int) -> LoadedState:
    """Load one partition's state (module docstring). Blocking: start-up, or the ``StateFiles`` thread."""
    directory = Path(partition_log.directory)
    bases = partition_log.segment_base_offsets()
    first_base, end = bases[0], partition_log.log_end_offset
    producer_snapshot.remove_outside(directory, first_base, end)
    snapshot = None
    for offset in reversed(producer_snapshot.snapshot_offsets(directory)):
        try:
            snapshot = producer_snapshot.read(directory, offset)
            break
        except (CorruptSnapshotError, OSError) as exc:
            log.warning("%s: producer snapshot %d is unreadable (%s): deleted", directory, offset, exc)
            producer_snapshot.snapshot_path(directory, offset).unlink(missing_ok=True)
    transactional = (directory / TXN_MARKER_FILE).exists()
    # Every index entry, by file; an entry is filed under the segment holding its marker.
    files = {base: txn_index.read(txn_index.txn_index_path(directory, base))
             for base in txn_index.index_bases(directory)}
    start = snapshot.offset if snapshot is not None else None
    # A torn file at or below the snapshot's segment may have lost an entry whose marker is below the snapshot,
    # which the replay from the snapshot would never see again; a torn file of a later segment lost only
    # entries the replay reads back.
    if start is not None and any(torn and base <= _segment_of(bases, start) for base, (_, torn) in files.items()):
        log.warning("%s: a .txnindex at or below producer snapshot %d's segment is torn: replaying from the "
                    "first segment", directory, start)
        snapshot = start = None
    if start is None:
        start = first_base if transactional else producer_state_scan_start(partition_log)

    producers = ProducerStateManager()
    txns = PartitionTxns()
    txns.persisted = transactional
    key = ("", 0)
    if snapshot is not None:
        producers.restore(*key, ((p.producer_id, p.epoch, p.last_timestamp, p.batches) for p in snapshot.producers))
        txns.ongoing = dict(snapshot.ongoing)
        txns.completing = list(snapshot.completing)
        txns.coordinator_epochs = dict(snapshot.coordinator_epochs)
        # By marker offset: an entry refiled by an earlier load that crashed before removing the old file
        # is in two files.
        below = {entry.last_offset: entry for entries, _ in files.values() for entry in entries
                 if first_base <= entry.last_offset < start}
        for marker in sorted(below):
            txns.add_aborted(AbortedTxn(*below[marker]))
    replayed = 0
    for header, marker in partition_log.transaction_events(start):
        replayed += 1
        if header.producer_id < 0:
            continue
        if header.is_control:
            producers.update_marker(*key, header.producer_id, header.producer_epoch, header.max_timestamp)
            if marker is not None:
                txns.on_marker(header.producer_id, header.base_offset, marker.control_type, high_watermark,
                               marker.coordinator_epoch)
        else:
            producers.update(*key, header, header.base_offset)
            if header.is_transactional:
                txns.on_batch(header, header.base_offset)
    if transactional or files:
        from_base = _segment_of(bases, start) if snapshot is not None else first_base
        # A file of no segment (a cleaning merged its segment into an earlier one): refile from there.
        orphans = [_segment_of(bases, base) for base in files if base not in bases and base >= first_base]
        _rewrite_indexes(directory, bases, files, txns.aborted, min([from_base, *orphans]))
    for base, expected in _by_segment(bases, txns.unsealed_below(bases[-1])).items():
        index = txn_index.open_sealed(txn_index.txn_index_path(directory, base), base, expected)
        if index is not None:
            txns.install_sealed(index)
    txns.sealing_from = bases[-1]
    entries = producers.entries_of(*key)
    at_end = snapshot is not None and start == end
    if replayed and end > start:
        _write_snapshot(directory, _snapshot(end, entries, txns), first_base)
        at_end = True
    return LoadedState(entries, txns, None if snapshot is None else snapshot.offset, start, replayed, at_end)


def _by_segment(bases: list[int], entries: list) -> dict[int, list]:
    """``entries`` by the base of the segment holding their marker (marker order kept)."""
    grouped: dict[int, list] = defaultdict(list)
    for entry in entries:
        grouped[_segment_of(bases, entry.last_offset)].append(tuple(entry))
    return grouped


def _rewrite_indexes(directory: Path, bases: list[int], files: dict, aborted: list, from_base: int) -> None:
    """Make the ``.txnindex`` files of the segments from ``from_base`` on hold exactly ``aborted``'s entries
    with a marker there, and remove files of no segment (their entries were refiled)."""
    wanted: dict[int, list] = defaultdict(list)
    for entry in aborted:
        if entry.last_offset >= from_base:
            wanted[_segment_of(bases, entry.last_offset)].append(tuple(entry))
    live = set(bases)
    for base in sorted(set(files) | set(wanted)):
        path = txn_index.txn_index_path(directory, base)
        if base not in live or base < bases[0]:
            txn_index.remove(path)
        elif base >= from_base:
            current, torn = files.get(base, ([], False))
            if torn or [tuple(entry) for entry in current] != wanted.get(base, []):
                txn_index.rewrite(path, wanted.get(base, []))


def _snapshot(offset: int, producers: list, txns: PartitionTxns) -> ProducerSnapshot:
    return ProducerSnapshot(offset, tuple(SnapshotProducer(*producer) for producer in producers),
                            tuple(sorted(txns.ongoing.items())), tuple(txns.completing),
                            tuple(sorted(txns.coordinator_epochs.items())))


def capture_snapshot(partition_log: Any, producers: ProducerStates, topic: str, partition: int,
                     txns: PartitionTxns) -> ProducerSnapshot:
    """The partition's state at its log end, as a snapshot. Loop thread: O(producers), no I/O."""
    return _snapshot(partition_log.log_end_offset, producers.entries_of(topic, partition), txns)


def _write_snapshot(directory: Path, snapshot: ProducerSnapshot, first_base: int) -> None:
    producer_snapshot.write(directory, snapshot)
    producer_snapshot.remove_outside(directory, first_base, snapshot.offset)


class StateFiles:
    """The one thread that appends ``.txnindex`` entries and writes snapshots (module docstring)."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="copyless-producer-state")
        self._lock = threading.Lock()
        self._closed = False
        self._unsynced: dict[Path, set[Path]] = defaultdict(set)  # directory -> index files to fsync (thread)
        self._broken: set[Path] = set()  # directories whose index missed an entry (thread)
        self.stats = {"snapshots": 0, "index_entries": 0, "sealed": 0, "errors": 0}

    def _submit(self, function: Callable, *args) -> Future | None:
        with self._lock:
            if self._closed:
                return None
            return self._executor.submit(function, *args)

    def append_aborted(self, partition_log: Any, entry: AbortedTxn) -> None:
        """Queue ``entry`` for the ``.txnindex`` of the segment holding its marker. Loop thread."""
        base = _segment_of(partition_log.segment_base_offsets(), entry.last_offset)
        self._submit(self._append, Path(partition_log.directory), base, tuple(entry))

    def seal(self, partition_log: Any, txns: PartitionTxns) -> None:
        """A roll: map the files of the segments below the active one, once the entries queued for them are
        written, and hand them to ``txns`` (``PartitionTxns.adopt``). Loop thread: O(their entries)."""
        bases = partition_log.segment_base_offsets()
        active = bases[-1]
        entries = [entry for entry in txns.unsealed_below(active) if entry.last_offset >= txns.sealing_from]
        txns.sealing_from = max(txns.sealing_from, active)
        if entries:
            self._submit(self._seal, Path(partition_log.directory), _by_segment(bases, entries), txns)

    def snapshot(self, partition_log: Any, snapshot: ProducerSnapshot) -> Future | None:
        """Queue the write of ``snapshot`` (``capture_snapshot``). Loop thread."""
        return self._submit(self._write, Path(partition_log.directory), snapshot,
                            partition_log.segment_base_offsets()[0])

    def reload(self, partition_log: Any, high_watermark: int) -> LoadedState:
        """``load_partition_state`` on the thread, after what is queued, and wait for it (a truncation:
        after the appends queued before it). Blocking: worker threads only."""
        future = self._submit(self._reload, partition_log, high_watermark)
        return load_partition_state(partition_log, high_watermark) if future is None else future.result()

    def close(self) -> None:
        """Finish what is queued (a clean shutdown's snapshots), then stop. Blocking."""
        with self._lock:
            self._closed = True
        self._executor.shutdown(wait=True)

    # --- the thread ---------------------------------------------------------------------------------------

    def _append(self, directory: Path, base: int, entry: tuple) -> None:
        path = txn_index.txn_index_path(directory, base)
        try:
            txn_index.append(path, [entry])
            self._unsynced[directory].add(path)
            self.stats["index_entries"] += 1
        except OSError as exc:
            self.stats["errors"] += 1
            self._broken.add(directory)
            log.warning("%s: appending to %s failed (%s): no snapshot until the partition loads again",
                        directory, path.name, exc)

    def _write(self, directory: Path, snapshot: ProducerSnapshot, first_base: int) -> None:
        if directory in self._broken or not os.path.isdir(directory):
            return
        try:
            for path in sorted(self._unsynced.pop(directory, ())):
                txn_index.sync(path)
            _write_snapshot(directory, snapshot, first_base)
            self.stats["snapshots"] += 1
        except OSError as exc:
            self.stats["errors"] += 1
            self._broken.add(directory)
            log.warning("%s: writing producer snapshot %d failed (%s)", directory, snapshot.offset, exc)

    def _seal(self, directory: Path, segments: dict[int, list], txns: PartitionTxns) -> None:
        if directory in self._broken or not os.path.isdir(directory):
            return
        for base, expected in segments.items():
            try:
                index = txn_index.open_sealed(txn_index.txn_index_path(directory, base), base, expected)
            except (OSError, ValueError) as exc:
                log.warning("%s: mapping the .txnindex of segment %d failed (%s): its aborted transactions "
                            "stay in memory", directory, base, exc)
                continue
            if index is None:
                log.warning("%s: the .txnindex of segment %d does not hold the %d aborted transaction(s) "
                            "recorded for it: they stay in memory", directory, base, len(expected))
            else:
                txns.adopt(index)
                self.stats["sealed"] += 1

    def _reload(self, partition_log: Any, high_watermark: int) -> LoadedState:
        directory = Path(partition_log.directory)
        # The load rewrites (and fsyncs) the index files it does not trust: the partition starts afresh.
        self._unsynced.pop(directory, None)
        self._broken.discard(directory)
        return load_partition_state(partition_log, high_watermark)
