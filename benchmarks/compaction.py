"""The log cleaner's speed: MB/s and CPU seconds per GB cleaning a compacted log of N MB over K keys.

What is measured, through the real ``broker.storage`` API: a fresh ``LogManager`` on a scratch directory, one
``cleanup.policy=compact`` log appended with RecordBatch v2 batches of about 16 KiB (kafka-python's builder,
uncompressed, one record per key drawn at random from K keys, seeded), the high watermark at the log end,
then one ``cleaner.clean_log(force=True)`` on the calling thread, timed: wall seconds and the thread's CPU
seconds (``time.thread_time``: the cleaner's own work, its reads, writes and fdatasyncs included, none of the
log's other threads). Rows per (record size, keys): the sealed bytes cleaned, wall seconds, MB/s (sealed
bytes / wall), CPU s per GB of sealed bytes, the bytes the cleaner read (its map's pass over the dirty
segments, then the copy's over all of them: twice the log on a first cleaning) and wrote, the records
removed and the map's keys.

The log was just written, so the cleaner reads from the page cache (``Benchmark.settle`` writes the dirty
pages back first, so the cleaner's fdatasyncs flush only its own output): this is the cleaner's CPU cost, not
a disk's read rate. One cleaning pass (the default 128 MiB map holds 5M keys). Full: 512 MiB logs, 1,000 and
100,000 keys at 1 KB records, 1,000 keys at 100 B records, three rounds (medians); ``--quick``: 64 MiB,
three rounds; tiny (the test suite): 4 MiB, one round. The wall-clock MB/s swings with the machine's other
work (37 to 120 MB/s over three rounds of one case at a load average of 4-8 on 2 cores, when its CPU seconds
per GB went from 8.1 to 12.4): compare CPU seconds per GB, and medians of rounds.

Rows: ``round, record_bytes, keys, log_mb, seconds, mb_per_s, cpu_s_per_gb, read_mb, written_mb,
records_removed, map_keys``.
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import Benchmark
from copyless.broker.storage import LogConfig, LogManager
from copyless.broker.storage.cleaner import CleanerConfig, clean_log, cleanable_section
from tests.support.blocking_appends import append_blocking

MIB = 1 << 20
BATCH_BYTES = 16 << 10
# (record bytes, keys): 1 KB records over a small and a large key set, and 100 B records, where the cost per
# record (decoding and the map's lookup) weighs ten times as much per byte.
CASES = ((1000, 1_000), (1000, 100_000), (100, 1_000))


def _batches(record_bytes: int, keys: int, total_bytes: int, seed: int):
    """About ``total_bytes`` of ~16 KiB batches, records keyed at random over ``keys`` keys."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    rng = random.Random(seed)
    payload = b"v" * max(1, record_bytes - 20)
    per_batch = max(1, BATCH_BYTES // record_bytes)
    produced = 0
    now = int(time.time() * 1000)
    while produced < total_bytes:
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                            producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
        for delta in range(per_batch):
            builder.append(delta, timestamp=now, key=b"key-%08d" % rng.randrange(keys), value=payload, headers=[])
        batch = bytes(builder.build())
        produced += len(batch)
        yield batch


def _one(bench: Benchmark, scratch: Path, record_bytes: int, keys: int, log_bytes: int, seed: int) -> dict[str, Any]:
    directory = scratch / f"log-{record_bytes}-{keys}-{seed}"
    # A quarter of the log a segment: the cleaner merges the cleaned ones, as it would a real log's.
    segment_bytes = max(1 * MIB, log_bytes // 4)
    config = LogConfig(segment_bytes=segment_bytes, retention_ms=None, segment_ms=None, cleanup_policy=("compact",),
                       min_cleanable_dirty_ratio=0.0)
    manager = LogManager(directory, default_config=config, background_interval_ms=None)
    manager.startup()
    try:
        partition_log = manager.create_log("bench", 0, config)
        # The segment after ``log_bytes`` is the active one, which the cleaner leaves: the sealed ones hold
        # ``log_bytes``, give or take a batch.
        for batch in _batches(record_bytes, keys, log_bytes + segment_bytes // 2, seed):
            append_blocking(partition_log, batch)
        partition_log.set_high_watermark(partition_log.log_end_offset)
        bench.settle()
        section = _whole_section(partition_log)
        sealed = section.clean_bytes + section.dirty_bytes
        cpu_before = time.thread_time()
        started = time.perf_counter()
        result = clean_log(partition_log, force=True, max_map_entries=CleanerConfig().max_map_entries)
        seconds = time.perf_counter() - started
        cpu = time.thread_time() - cpu_before
        assert result is not None and result.aborted is None and result.end_offset == section.end_offset, result
        assert result.bytes_read == 2 * sealed, (result, sealed)  # one pass: the map's read, the copy's read
    finally:
        manager.shutdown()
    return {"record_bytes": record_bytes, "keys": keys, "log_mb": round(sealed / MIB, 1), "seconds": round(seconds, 3),
            "mb_per_s": round(sealed / seconds / 1e6, 1), "cpu_s_per_gb": round(cpu / (sealed / 1e9), 2),
            "read_mb": round(result.bytes_read / MIB, 1), "written_mb": round(result.bytes_written / MIB, 2),
            "records_removed": result.records_dropped, "map_keys": result.keys}


def _whole_section(partition_log, timeout_s: float = 10.0):
    """The cleanable section once it reaches the active segment (a rolled segment takes its offset name on a
    worker thread, a moment after the roll; until then it and those after it are not cleanable)."""
    deadline = time.monotonic() + timeout_s
    while True:
        section = cleanable_section(partition_log, int(time.time() * 1000))
        if section is not None and section.end_offset == partition_log.segments[-1].base_offset:
            return section
        if time.monotonic() > deadline:
            raise AssertionError(f"the sealed segments were not all named within {timeout_s} s")
        time.sleep(0.01)


def main(argv=None) -> dict[str, Any]:
    logging.basicConfig(level=logging.WARNING)
    bench = Benchmark("compaction", "the log cleaner: MB/s and CPU s per GB cleaning N MB over K keys", argv)
    log_bytes = bench.pick(512 * MIB, 64 * MIB, 4 * MIB)
    rounds = bench.pick(3, 3, 1)
    cases = CASES if not bench.tiny else ((1000, 1_000), (100, 1_000))
    with bench.scratch_dir() as scratch:
        scale = bench.disk_scale(3 * log_bytes, scratch, what="one log, its cleaned copy and headroom")
        log_bytes = max(MIB, int(log_bytes * scale))
        with bench.progress(rounds * len(cases), "runs") as bar:
            for number in range(rounds):
                for record_bytes, keys in cases:
                    row = _one(bench, scratch, record_bytes, keys, log_bytes, seed=number)
                    bench.row(round=number, **row)
                    bar.advance(1)
    medians = {}
    for record_bytes, keys in cases:
        chosen = [r for r in bench.rows if r["record_bytes"] == record_bytes and r["keys"] == keys]
        label = f"{record_bytes}B_{keys}keys"
        medians[f"mb_per_s_{label}"] = statistics.median(r["mb_per_s"] for r in chosen)
        medians[f"cpu_s_per_gb_{label}"] = statistics.median(r["cpu_s_per_gb"] for r in chosen)

    def chart(fig) -> None:
        left, right = fig.subplots(1, 2)
        labels = [f"{record_bytes} B\n{keys:,} keys" for record_bytes, keys in cases]
        keys_of = [f"{record_bytes}B_{keys}keys" for record_bytes, keys in cases]
        left.bar(labels, [medians[f"mb_per_s_{k}"] for k in keys_of], color="tab:green")
        left.set_ylabel("MB/s of log cleaned (median)")
        left.set_title("cleaner throughput")
        right.bar(labels, [medians[f"cpu_s_per_gb_{k}"] for k in keys_of], color="tab:blue")
        right.set_ylabel("CPU s per GB cleaned (median)")
        right.set_title("cleaner CPU")
        fig.suptitle(f"one cleaning of a {cleaned_mb:g} MiB compacted log, page cache warm", fontsize=11)

    # The log's sealed part, what one cleaning takes (the active segment, up to a quarter of it, stays).
    cleaned_mb = statistics.median(r["log_mb"] for r in bench.rows)
    return bench.finish(ratios=medians, chart=chart, extra={"log_mb": cleaned_mb, "cases": [list(c) for c in cases]},
                        columns=["round", "record_bytes", "keys", "log_mb", "seconds", "mb_per_s", "cpu_s_per_gb",
                                 "read_mb", "written_mb", "records_removed", "map_keys"])


if __name__ == "__main__":
    main()
