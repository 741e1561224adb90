"""Start-up of a partition with a long transactional log: the producer state and transactions loaded by a scan
of the whole log (the way before snapshots) against loading the latest producer snapshot, the .txnindex files
and the log after the snapshot.

Workload: one partition written through the storage layer as the partition layer writes it (``--batches``:
1,000,000; 100,000 with ``--quick``): eight transactional producers, transactions of nine one-record batches
and a marker, one in three aborted, one transaction left open; 16 MiB segments (64 KiB tiny), the .txnindex
entries and the roll snapshots written by ``StateFiles`` as the broker writes them. Then, each ``--repeats``
times (median kept), with the files in the page cache:

- ``storage``: ``LogManager.startup`` after a clean shutdown (the storage's own load, unchanged, for scale);
- ``whole-log scan``: what start-up did before snapshots, per partition: producer state from the headers of
  the last two segments, and the transactions from every header and marker key of the log;
- ``fallback scan``: the new load with no snapshot and no index (a data dir written before snapshots);
- ``clean restart``: the new load after a clean shutdown (a snapshot at the log end: nothing replayed);
- ``after a crash``: the new load with the snapshot of the last roll (the active segment replayed).

Rows: ``path, batches, batches_replayed, ms``.
"""

from __future__ import annotations

import statistics
import time

from benchmarks._harness import Benchmark
from copyless.broker import producer_snapshot
from copyless.broker.partition_state_files import StateFiles, capture_snapshot, load_partition_state
from copyless.broker.producer_state import ProducerStateManager, producer_state_scan_start
from copyless.broker.storage import LogConfig, LogManager, txn_index
from copyless.broker.txn_partition import ABORT, COMMIT, TXN_MARKER_FILE, PartitionTxns, build_marker
from copyless.protocol.records import read_header
from tests.support.batches import keyed_batch
from tests.support.blocking_appends import append_blocking

PRODUCERS = 8
BATCHES_PER_TXN = 9
CHUNK = 200  # batches per append call


def _write_history(partition_log, batches: int, state_files: StateFiles, bar) -> None:
    """The transactional history, with the live state the partition layer keeps and its files."""
    producers, txns = ProducerStateManager(), PartitionTxns()
    (partition_log.directory / TXN_MARKER_FILE).touch()
    sequences = [0] * PRODUCERS
    active = partition_log.segments[-1].base_offset
    written = number = 0
    while written < batches:
        chunk, pending = bytearray(), []
        while len(pending) < CHUNK and written + len(pending) < batches:
            producer = number % PRODUCERS + 1
            last_open = written + len(pending) + BATCHES_PER_TXN + 1 >= batches and producer == 1
            for _ in range(BATCHES_PER_TXN):
                batch = keyed_batch([b"x" * 100], producer_id=producer, producer_epoch=0,
                                    base_sequence=sequences[producer - 1], attributes_extra=0x10)
                sequences[producer - 1] += 1
                pending.append((batch, None))
            if not last_open:
                commit = number % 3 != 1
                pending.append((build_marker(producer, 0, commit, 0, 1_700_000_000_000), COMMIT if commit else ABORT))
            number += 1
        for batch, _ in pending:
            chunk += batch
        result = append_blocking(partition_log, bytes(chunk))
        offset = result.base_offset
        for batch, control in pending:
            header = read_header(batch)
            if control is None:
                producers.update("t", 0, header, offset)
                txns.on_batch(header, offset)
            else:
                producers.update_marker("t", 0, header.producer_id, 0, header.max_timestamp)
                aborted = txns.on_marker(header.producer_id, offset, control, offset)
                if aborted is not None:
                    state_files.append_aborted(partition_log, aborted)
            offset += header.last_offset_delta + 1
        written += len(pending)
        bar.advance(len(pending))
        if partition_log.segments[-1].base_offset != active:
            active = partition_log.segments[-1].base_offset
            state_files.snapshot(partition_log, capture_snapshot(partition_log, producers, "t", 0, txns))
    partition_log.set_high_watermark(partition_log.log_end_offset)
    state_files.snapshot(partition_log, capture_snapshot(partition_log, producers, "t", 0, txns))


def _whole_log_scan(partition_log) -> int:
    """Start-up's work before snapshots: the last two segments' headers for producer state, then every
    header (and marker key) from the log start for the transactions."""
    producers, txns = ProducerStateManager(), PartitionTxns()
    producers.rebuild("t", 0, partition_log.batch_headers(producer_state_scan_start(partition_log)))
    events = list(partition_log.transaction_events(partition_log.log_start_offset))
    for header, control in events:
        if header.is_control:
            producers.update_marker("t", 0, header.producer_id, header.producer_epoch, header.max_timestamp)
            if control is not None:
                txns.on_marker(header.producer_id, header.base_offset, control, partition_log.high_watermark)
        else:
            txns.on_batch(header, header.base_offset)
    return len(events)


def main(argv=None) -> None:
    bench = Benchmark("txn_startup", "start-up of a long transactional partition: whole-log scan vs snapshots",
                      argv, arguments=lambda parser: (
                          parser.add_argument("--batches", type=int, default=None),
                          parser.add_argument("--repeats", type=int, default=None)))
    batches = bench.args.batches or bench.pick(1_000_000, 100_000, 3_000)
    repeats = bench.args.repeats or bench.pick(5, 3, 1)
    config = LogConfig(segment_bytes=bench.pick(16 << 20, 16 << 20, 64 << 10), retention_ms=None)
    with bench.scratch_dir() as scratch:
        manager = LogManager(scratch, default_config=config, background_interval_ms=None)
        manager.startup()
        partition_log = manager.create_log("t", 0)
        state_files = StateFiles()
        with bench.progress(batches, "batches", "writing") as bar:
            _write_history(partition_log, batches, state_files, bar)
        state_files.close()
        manager.shutdown()
        directory = partition_log.directory
        segments = len(partition_log.segment_base_offsets())

        def timed(path: str, prepare, run) -> None:
            samples, replayed = [], 0
            for _ in range(repeats):
                started = time.perf_counter()
                log_manager = LogManager(scratch, default_config=config, background_interval_ms=None)
                log_manager.startup()
                storage_ms = (time.perf_counter() - started) * 1000
                partition = log_manager.get_log("t", 0)
                prepare(partition)
                started = time.perf_counter()
                replayed = run(partition)
                samples.append((time.perf_counter() - started) * 1000)
                log_manager.shutdown()
                storage.append(storage_ms)
            bench.row(path=path, batches=batches, segments=segments, batches_replayed=replayed,
                      ms=round(statistics.median(samples), 1))

        storage: list[float] = []

        def load(partition) -> int:
            return load_partition_state(partition, partition.high_watermark).batches_replayed

        def drop_latest_snapshot(partition) -> None:
            offsets = producer_snapshot.snapshot_offsets(directory)
            if offsets and offsets[-1] == partition.log_end_offset:
                producer_snapshot.snapshot_path(directory, offsets[-1]).unlink()

        def drop_all(partition) -> None:
            for offset in producer_snapshot.snapshot_offsets(directory):
                producer_snapshot.snapshot_path(directory, offset).unlink()
            for base in txn_index.index_bases(directory):
                txn_index.txn_index_path(directory, base).unlink()

        # The fallback scan deletes every snapshot: it runs last.
        timed("clean restart", lambda partition: None, load)
        timed("after a crash", drop_latest_snapshot, load)
        timed("whole-log scan", lambda partition: None, _whole_log_scan)
        timed("fallback scan", drop_all, load)
        bench.row(path="storage", batches=batches, segments=segments, batches_replayed=0,
                  ms=round(statistics.median(storage), 1))
    bench.note("files in the page cache (written just before); each path's figure is the median of "
               f"{repeats} loads")
    rows = {row["path"]: row["ms"] for row in bench.rows}
    bench.finish(ratios={"whole_log_scan_over_clean_restart": rows["whole-log scan"] / max(rows["clean restart"], 0.1),
                         "whole_log_scan_over_after_a_crash": rows["whole-log scan"] / max(rows["after a crash"], 0.1)},
                 columns=["path", "batches", "segments", "batches_replayed", "ms"])


if __name__ == "__main__":
    main()
