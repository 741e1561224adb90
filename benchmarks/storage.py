"""The storage engine's own figures: mmap appends vs os.write, appends after a roll, recovery time.

What is measured, on this machine, through the real ``broker.storage`` API (PartitionLog.append: real
RecordBatch v2 bytes, offsets assigned by rewriting each batch's baseOffset in the map):

1. Append throughput for batches of 1 KiB, 16 KiB, 256 KiB and 1 MiB into the active segment of a partition
   in steady state, against the same bytes written with plain ``os.write`` to a fresh file (Kafka's
   FileChannel append path). Ratio ``append_vs_write`` (1 MiB): target >= 1.5. Steady state: a lead-in of
   10% of the segment at the same rate (untimed) lets the broker see the append rate, then 80% of the
   segment is timed. One more row, ``fresh partition burst``, times the same appends from the first byte of
   a new partition, where only a 4 MiB first step has blocks (target >= 1.0 of os.write).
2. Appends right after a roll vs appends into warm pages (1 MiB batches, just under half a segment each).
   Ratio ``after_roll_vs_warm``: target >= 0.9. A "burst" row rolls without waiting for the warm-up.
3. Restart time with one full segment: unclean (CRC-32C rescan of every batch, index rebuild) vs clean.
4. Blocks reserved per idle partition (target <= 4 MiB): new partitions with 1 GiB segments, ``st_blocks``.

How it decides. Each batch size runs in rounds; a round runs both methods back to back, alternating which
goes first, and its ratio pairs two runs seconds apart, so drift over minutes cancels out of it. The ratios
are the per-round ratios' medians, with every round's ratio listed (the spread is part of the figure).
Alongside wall-clock MB/s every window records CPU seconds per GB of the appending thread
(``time.thread_time``) and of each kind of helper thread (pre-fault: the warm thread and its helper;
allocate; io), read from each thread's own CPU clock (``pthread_getcpuclockid``), and the share of bytes
appended with pwrite past the pre-fault (``outrun_share``). The CPU ratios (``writer_cpu_vs_write``,
``total_cpu_vs_write``) hold when MB/s does not: on a 2-core machine that other work keeps busy, wall time
measures the scheduler as much as the code, while a thread's CPU per GB moves only with what the memory
costs (first touch), which the pairing cancels.

Every run starts from the same memory state (``Benchmark.settle``: written back, freed pages returned to the
host). Without that, a run that follows a deleted segment writes into pages freed moments ago (0.15 s per
GiB to fault in here) while the run before it paid for fresh ones (1.2-1.45 s per GiB).
Rows: ``test, batch_bytes, method, mb_per_s`` (median, min, max), the CPU columns, ``p99_us, max_us``;
side table: recovery; the JSON keeps every round's figures.
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from pathlib import Path

from benchmarks._harness import Benchmark, percentile
from copyless.broker.storage import LogConfig, LogManager
from copyless.broker.storage.prefault import PREFAULT_STATS
from copyless.protocol.records import RECORD_BATCH_OVERHEAD
from tests.support.blocking_appends import append_blocking

KIB, MIB = 1 << 10, 1 << 20
BATCH_SIZES = (1 * KIB, 16 * KIB, 256 * KIB, 1 * MIB)


def make_batch(total_bytes: int) -> bytes:
    """One v2 batch of about ``total_bytes`` holding a single record (kafka-python's builder: real bytes)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    value = os.urandom(max(1, total_bytes - RECORD_BATCH_OVERHEAD - 12))
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    builder.append(0, timestamp=int(time.time() * 1000), key=None, value=value, headers=[])
    return bytes(builder.build())


def open_log(bench: Benchmark, directory: Path, segment_bytes: int):
    bench.settle()
    config = LogConfig(segment_bytes=segment_bytes, retention_ms=None, segment_ms=None)
    manager = LogManager(directory, default_config=config, background_interval_ms=None)
    manager.startup()
    return manager, manager.create_log("bench", 0, config)


# Helper threads by role: the storage's executors are named after their work (storage/background.py).
HELPER_ROLES = (("copyless-warm", "prefault"), ("copyless-prefault", "prefault"), ("copyless-allocate", "allocate"),
                ("copyless-io", "io"), ("copyless-flush", "io"))


def helper_cpu() -> dict[str, float]:
    """CPU seconds so far of the storage's worker threads, summed by role (prefault: the warm thread and its
    helper; allocate; io: seals and flushes). Read from each thread's own CPU clock (pthread_getcpuclockid:
    nanoseconds, where /proc/self/task/<tid>/stat counts 10 ms ticks)."""
    totals = {"prefault": 0.0, "allocate": 0.0, "io": 0.0}
    for thread in threading.enumerate():
        for prefix, role in HELPER_ROLES:
            if thread.name.startswith(prefix) and thread.ident is not None:
                try:
                    totals[role] += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
                except (OSError, ProcessLookupError):  # the thread ended meanwhile
                    pass
                break
    return totals


class Window:
    """Wall time, the appending thread's CPU (time.thread_time) and the helpers' CPU over a timed window."""

    def __enter__(self) -> Window:
        self.helpers = helper_cpu()
        self.outrun = PREFAULT_STATS["outrun_bytes"]
        self.thread = time.thread_time()
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.started
        self.thread = time.thread_time() - self.thread
        after = helper_cpu()
        self.helpers = {role: after[role] - self.helpers[role] for role in after}
        self.outrun = PREFAULT_STATS["outrun_bytes"] - self.outrun

    def figures(self, nbytes: int, latencies: list[float]) -> dict:
        gb = nbytes / 1e9
        return {"mb_per_s": nbytes / self.seconds / 1e6, "p99_us": percentile(latencies, 99),
                "max_us": max(latencies), "writer_cpu_s_per_gb": self.thread / gb,
                "prefault_cpu_s_per_gb": self.helpers["prefault"] / gb,
                "allocate_cpu_s_per_gb": self.helpers["allocate"] / gb, "io_cpu_s_per_gb": self.helpers["io"] / gb,
                "outrun_share": self.outrun / nbytes}


def timed_appends(partition_log, batch: bytes, count: int) -> dict:
    """Append ``batch`` ``count`` times; the window's figures (Window.figures)."""
    latencies = []
    clock = time.perf_counter_ns
    with Window() as window:
        for _ in range(count):
            before = clock()
            append_blocking(partition_log, batch)
            latencies.append((clock() - before) / 1000)
    return window.figures(count * len(batch), latencies)


def measure_append(bench: Benchmark, scratch: Path, batch: bytes, segment_bytes: int, *, steady: bool = True
                   ) -> dict:
    """Appends filling 80% of one segment, after a 10% lead-in when ``steady``, else from the first byte of
    a new partition (Window.figures, plus the appends that waited for a step of blocks)."""
    manager, partition_log = open_log(bench, scratch / "append", segment_bytes)
    try:
        partition_log.wait_warm(60)
        if steady:
            timed_appends(partition_log, batch, max(1, int(segment_bytes * 0.1) // len(batch)))
            partition_log.wait_warm(60)
        count = max(1, int(segment_bytes * 0.8) // len(batch))
        waited = partition_log.stats["extensions_waited"]
        # At this rate the next segment's preparation starts at half full and runs on the warm thread during
        # the second half of the timed loop, as it would on a busy broker.
        figures = timed_appends(partition_log, batch, count)
        assert partition_log.stats["rolls"] == 0
        figures["block_waits"] = partition_log.stats["extensions_waited"] - waited
        return figures
    finally:
        manager.shutdown()
        _remove(scratch / "append")


def measure_write(bench: Benchmark, scratch: Path, batch: bytes, segment_bytes: int) -> dict:
    """The same bytes through os.write to a fresh file (no helper threads: the writer's CPU is all of it,
    apart from the kernel's writeback, which neither side's figures count)."""
    bench.settle()
    path = scratch / "plain.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    count = max(1, int(segment_bytes * 0.8) // len(batch))
    latencies = []
    clock = time.perf_counter_ns
    try:
        with Window() as window:
            for _ in range(count):
                before = clock()
                os.write(fd, batch)
                latencies.append((clock() - before) / 1000)
    finally:
        os.close(fd)
        path.unlink()
    return window.figures(count * len(batch), latencies)


def measure_roll(bench: Benchmark, scratch: Path, batch: bytes, segment_bytes: int, *,
                 wait_for_warm_up: bool) -> dict:
    """Fill most of a warm segment, roll into the prepared one, and time the same number of appends on each
    side of the roll."""
    manager, partition_log = open_log(bench, scratch / "roll", segment_bytes)
    try:
        partition_log.wait_warm(60)
        per_segment = segment_bytes // len(batch)
        # Just under half a segment each side: a roll costs ~0.1-0.4 ms of loop time (handing work to the io
        # thread), which a short window would magnify; and the new segment stays below half full, so its own
        # successor's warm-up does not start inside the window.
        window = max(1, per_segment // 2 - 2)
        # Half the segment: the next segment's preparation starts (past half full, and the fill rate puts the
        # roll within the preparation horizon); the warmed case waits for it to finish, the burst case not.
        timed_appends(partition_log, batch, per_segment // 2 + 1)
        if wait_for_warm_up:
            partition_log.wait_warm(60)
        # The last `window` appends of the segment (warm pages), then the roll and `window` more.
        timed_appends(partition_log, batch, per_segment - per_segment // 2 - 1 - window)
        warm = timed_appends(partition_log, batch, window)
        rolls = partition_log.stats["rolls"]
        after = timed_appends(partition_log, batch, window)
        assert partition_log.stats["rolls"] == rolls + 1, "the timed window must start with a roll"
        return {"warm": warm, "after": after, "unprepared": partition_log.stats["rolls_unprepared"],
                "ratio": after["mb_per_s"] / warm["mb_per_s"]}
    finally:
        manager.shutdown()
        _remove(scratch / "roll")


def measure_recovery(bench: Benchmark, scratch: Path, segment_bytes: int) -> dict:
    """Restart after a crash (abandon) and after a clean shutdown, with one full segment of 16 KiB batches."""
    directory = scratch / "recovery"
    manager, partition_log = open_log(bench, directory, segment_bytes)
    batch = make_batch(16 * KIB)
    count = segment_bytes // len(batch) - 1
    for _ in range(count):
        append_blocking(partition_log, batch)
    data_bytes = partition_log.size_bytes
    manager.abandon()
    config = LogConfig(segment_bytes=segment_bytes, retention_ms=None, segment_ms=None)
    manager = LogManager(directory, default_config=config, background_interval_ms=None)
    manager.startup()
    unclean = dict(manager.startup_stats)
    assert manager.get_log("bench", 0).log_end_offset == count and not unclean["clean"]
    manager.shutdown()
    manager = LogManager(directory, default_config=config, background_interval_ms=None)
    manager.startup()
    clean = dict(manager.startup_stats)
    manager.shutdown()
    _remove(directory)
    return {"data_bytes": data_bytes, "batches": count, "unclean_s": unclean["seconds"], "clean_s": clean["seconds"],
            "rescanned_bytes": unclean["bytes_rescanned"]}


def measure_idle_blocks(bench: Benchmark, scratch: Path, partitions: int) -> float:
    """MiB of blocks each new, idle partition owns (1 GiB segments, every file of its directory)."""
    directory = scratch / "idle"
    bench.settle()
    config = LogConfig(retention_ms=None, segment_ms=None)
    manager = LogManager(directory, default_config=config, background_interval_ms=None)
    manager.startup()
    try:
        logs = [manager.create_log("idle", partition) for partition in range(partitions)]
        for partition_log in logs:
            partition_log.wait_warm(60)
        owned = sum(entry.stat().st_blocks * 512 for partition_log in logs
                    for entry in os.scandir(partition_log.directory))
    finally:
        manager.shutdown()
        _remove(directory)
    return owned / partitions / MIB


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _spread(values) -> dict:
    """Median and range of a round's figures."""
    values = sorted(values)
    return {"median": statistics.median(values), "min": values[0], "max": values[-1]}


def _total_cpu(figures: dict) -> float:
    """CPU seconds per GB of the appending thread and every helper thread together."""
    return (figures["writer_cpu_s_per_gb"] + figures["prefault_cpu_s_per_gb"] + figures["allocate_cpu_s_per_gb"]
            + figures["io_cpu_s_per_gb"])


FIGURES = ("mb_per_s", "writer_cpu_s_per_gb", "prefault_cpu_s_per_gb", "allocate_cpu_s_per_gb", "io_cpu_s_per_gb",
           "outrun_share")


def main(argv=None) -> None:
    logging.getLogger("copyless.storage").setLevel(logging.ERROR)
    bench = Benchmark("storage", "mmap log appends vs os.write, appends after a roll, recovery time", argv)
    segment_bytes = bench.pick(1 << 30, 128 * MIB, 8 * MIB)
    # Rounds per batch size, each running both methods back to back in alternating order (the 1 MiB rows,
    # which carry the targets, get the most). The machine is shared: a round's ratio pairs two runs seconds
    # apart, so drift over minutes cancels out of it where a ratio of medians would not.
    rounds = {size: bench.pick(7, 5 if size >= 256 * KIB else 3, 1) for size in BATCH_SIZES}
    # The roll windows are short (just under half a segment each side), so a scheduler hiccup moves one run a
    # lot: take several runs and the median of the per-run ratios.
    roll_runs = bench.pick(7, 5, 1)
    # A log holds a segment and the next one's first steps; the plain file is as big.
    scale = bench.disk_scale(3 * segment_bytes, what="two segments and a plain file")
    if scale < 1.0:
        segment_bytes = max(8 * MIB, int(segment_bytes * scale) // MIB * MIB)
    bench.note(f"segment_bytes = {segment_bytes // MIB} MiB; rounds per size "
               f"{', '.join(f'{size // KIB} KiB: {n}' for size, n in rounds.items())} ({roll_runs} for the roll); "
               f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start")
    if bench.tiny:
        bench.note("tiny mode: each window is a few appends, so the ratios only prove the code path runs")
    batches = {size: make_batch(size) for size in BATCH_SIZES}
    runs: dict[tuple[str, int], list[dict]] = {}
    round_ratios: dict[int, list[float]] = {}
    cpu_ratios: dict[int, dict[str, list[float]]] = {}
    burst_ratios: list[float] = []

    steps = sum(2 * n for n in rounds.values()) + rounds[MIB] + 2 * roll_runs + 2
    with bench.scratch_dir() as scratch, bench.progress(steps, "steps") as bar:
        for size, batch in batches.items():
            for number in range(rounds[size]):
                figures = {}
                # Alternate which method goes first, so drift on a shared machine hits both alike.
                for method in (("append", "write") if number % 2 == 0 else ("write", "append")):
                    if method == "append":
                        figures[method] = measure_append(bench, scratch, batch, segment_bytes)
                    else:
                        figures[method] = measure_write(bench, scratch, batch, segment_bytes)
                    runs.setdefault((method, size), []).append(figures[method])
                    bar.advance()
                append, write = figures["append"], figures["write"]
                round_ratios.setdefault(size, []).append(append["mb_per_s"] / write["mb_per_s"])
                # CPU per GB, paired the same way: the appending thread's against os.write's, and all of the
                # mmap path's (appending thread and helpers) against os.write's.
                cpu_ratios.setdefault(size, {"writer": [], "total": []})
                cpu_ratios[size]["writer"].append(append["writer_cpu_s_per_gb"] / write["writer_cpu_s_per_gb"])
                cpu_ratios[size]["total"].append(_total_cpu(append) / write["writer_cpu_s_per_gb"])
                if size == MIB:
                    burst = measure_append(bench, scratch, batch, segment_bytes, steady=False)
                    runs.setdefault(("burst", size), []).append(burst)
                    burst_ratios.append(burst["mb_per_s"] / figures["write"]["mb_per_s"])
                    bar.advance()
            methods = [("PartitionLog.append (mmap)", "append"), ("os.write (fresh file)", "write")]
            if size == MIB:
                methods.insert(1, ("PartitionLog.append, fresh partition burst", "burst"))
            for method, key in methods:
                results = runs[(key, size)]
                rate = _spread(r["mb_per_s"] for r in results)
                bench.row(test="append", batch_bytes=len(batch), method=method, mb_per_s=round(rate["median"], 1),
                          mb_per_s_min=round(rate["min"], 1), mb_per_s_max=round(rate["max"], 1),
                          **{name: round(statistics.median(r[name] for r in results), 3) for name in FIGURES[1:]},
                          p99_us=round(statistics.median(r["p99_us"] for r in results), 1),
                          max_us=round(max(r["max_us"] for r in results), 1))
        roll_results = {True: [], False: []}
        unprepared = 0
        for _ in range(roll_runs):
            for wait in (True, False):
                result = measure_roll(bench, scratch, batches[MIB], segment_bytes, wait_for_warm_up=wait)
                roll_results[wait].append(result)
                unprepared += result["unprepared"]
                bar.advance()

        # The rows show the run whose after/warm ratio is the median one, so the table and the ratio agree
        # (independent medians of each column would pair figures from different runs).
        def median_run(results):
            return sorted(results, key=lambda r: r["ratio"])[len(results) // 2]

        warmed_run, burst_run = median_run(roll_results[True]), median_run(roll_results[False])
        warm, after, burst = warmed_run["warm"], warmed_run["after"], burst_run["after"]
        for method, figures in (("warm pages (before the roll)", warm),
                                ("after roll, next segment warmed", after),
                                ("after roll, burst (warm-up racing)", burst)):
            bench.row(test="roll", batch_bytes=len(batches[MIB]), method=method, mb_per_s=round(figures["mb_per_s"], 1),
                      **{name: round(figures[name], 3) for name in FIGURES[1:]},
                      p99_us=round(figures["p99_us"], 1), max_us=round(figures["max_us"], 1))
        if unprepared:
            bench.note(f"{unprepared} roll(s) found no prepared segment and waited for its creation")
        recovery = measure_recovery(bench, scratch, segment_bytes)
        bar.advance()
        idle_mib = measure_idle_blocks(bench, scratch, bench.pick(20, 10, 3))
        bar.advance()
    bench.table("restart with one full segment", [
        {"restart": "unclean (CRC rescan + index rebuild)", "segment_mb": round(recovery["data_bytes"] / MIB, 1),
         "batches": recovery["batches"], "seconds": round(recovery["unclean_s"], 3),
         "mb_per_s": round(recovery["rescanned_bytes"] / max(recovery["unclean_s"], 1e-9) / 1e6, 1)},
        {"restart": "clean (marker present)", "segment_mb": round(recovery["data_bytes"] / MIB, 1),
         "batches": recovery["batches"], "seconds": round(recovery["clean_s"], 3), "mb_per_s": None},
    ], columns=["restart", "segment_mb", "batches", "seconds", "mb_per_s"])

    def cpu(key: str, name: str) -> float:
        return statistics.median(r[name] for r in runs[(key, MIB)])

    def rounded(values) -> list[float]:
        return [round(value, 3) for value in sorted(values)]

    ratios = {
        # The per-round ratios' median, with every round's ratio: the spread is part of the figure.
        "append_vs_write": round(statistics.median(round_ratios[MIB]), 3),
        "append_vs_write_rounds": rounded(round_ratios[MIB]),
        "fresh_burst_vs_write": round(statistics.median(burst_ratios), 3),
        "fresh_burst_vs_write_rounds": rounded(burst_ratios),
        "after_roll_vs_warm": round(warmed_run["ratio"], 3),
        "after_roll_vs_warm_runs": rounded(r["ratio"] for r in roll_results[True]),
        "after_roll_burst_vs_warm": round(burst_run["ratio"], 3),
        # Per-round CPU ratios at 1 MiB (below 1: the mmap path spends less per GB than os.write): the
        # appending thread alone, and with its helper threads. Unlike MB/s they do not move with what else
        # runs on the machine, only with what the memory costs (first touch), which pairing cancels.
        "writer_cpu_vs_write": round(statistics.median(cpu_ratios[MIB]["writer"]), 3),
        "writer_cpu_vs_write_rounds": rounded(cpu_ratios[MIB]["writer"]),
        "total_cpu_vs_write": round(statistics.median(cpu_ratios[MIB]["total"]), 3),
        "total_cpu_vs_write_rounds": rounded(cpu_ratios[MIB]["total"]),
        "append_vs_write_by_size": {f"{size // KIB} KiB": round(statistics.median(values), 3)
                                    for size, values in round_ratios.items()},
        # CPU seconds per GB at 1 MiB (medians over the rounds): the appending thread alone, and the helper
        # threads (pre-fault, allocate) that work for it. os.write has no helpers.
        "writer_cpu_s_per_gb": {"append": round(cpu("append", "writer_cpu_s_per_gb"), 3),
                                "write": round(cpu("write", "writer_cpu_s_per_gb"), 3),
                                "burst": round(cpu("burst", "writer_cpu_s_per_gb"), 3)},
        "helper_cpu_s_per_gb": {key: {"prefault": round(cpu(key, "prefault_cpu_s_per_gb"), 3),
                                      "allocate": round(cpu(key, "allocate_cpu_s_per_gb"), 3)}
                                for key in ("append", "burst")},
        "outrun_share": {key: round(cpu(key, "outrun_share"), 3) for key in ("append", "burst")},
        "block_waits": {key: sum(r["block_waits"] for r in runs[(key, MIB)]) for key in ("append", "burst")},
        "blocks_per_idle_partition_mib": round(idle_mib, 2),
        "targets": {"append_vs_write": 1.5, "after_roll_vs_warm": 0.9, "fresh_burst_vs_write": 1.0,
                    "blocks_per_idle_partition_mib": 4.0},
    }

    def chart(fig) -> None:
        left, right = fig.subplots(1, 2)
        labels = [f"{size // KIB} KiB" for size in BATCH_SIZES]
        positions = range(len(BATCH_SIZES))
        for offset, key, label in ((-0.2, "append", "PartitionLog.append (mmap)"), (0.2, "write", "os.write")):
            medians = [statistics.median(r["mb_per_s"] for r in runs[(key, s)]) for s in BATCH_SIZES]
            lows = [m - min(r["mb_per_s"] for r in runs[(key, s)]) for m, s in zip(medians, BATCH_SIZES, strict=True)]
            highs = [max(r["mb_per_s"] for r in runs[(key, s)]) - m for m, s in zip(medians, BATCH_SIZES, strict=True)]
            left.bar([p + offset for p in positions], medians, 0.4, yerr=[lows, highs], label=label)
        left.set_xticks(list(positions), labels)
        left.set_ylabel("MB/s (median, range over rounds)")
        left.set_title("append throughput by batch size")
        left.legend()
        names = ["warm", "after roll\n(warmed)", "after roll\n(burst)"]
        right.bar(names, [warm["mb_per_s"], after["mb_per_s"], burst["mb_per_s"]],
                  color=["tab:blue", "tab:green", "tab:orange"])
        right.set_ylabel("MB/s (1 MiB batches)")
        right.set_title(f"roll: after/warm = {ratios['after_roll_vs_warm']}")

    every_round = {f"{key} {size // KIB} KiB": [{name: round(value, 4) for name, value in r.items()} for r in results]
                   for (key, size), results in runs.items()}
    bench.finish(ratios=ratios, extra={"segment_bytes": segment_bytes, "recovery": recovery, "rounds": every_round},
                 chart=chart,
                 columns=["test", "batch_bytes", "method", "mb_per_s", "mb_per_s_min", "mb_per_s_max",
                          "writer_cpu_s_per_gb", "prefault_cpu_s_per_gb", "allocate_cpu_s_per_gb", "io_cpu_s_per_gb",
                          "outrun_share",
                          "p99_us", "max_us"])


if __name__ == "__main__":
    main()
