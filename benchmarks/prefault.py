"""The log's pre-fault, both ways, through the whole broker: zeros written first vs ``MADV_POPULATE_WRITE`` alone.

copyless pre-faults the segment it appends to in a window ahead of the writer (README, "Segments written
through mmap, preallocated, pre-faulted"). Since the change described in "Pre-faulting writes zeros first,
a margin past the appends", each step of that window is first written with zeros by ``pwrite`` (1 MiB
chunks, claimed a margin past the appends) and then mapped with ``MADV_POPULATE_WRITE``; before it, the
madvise alone allocated and zeroed the page cache. ``COPYLESS_PREFAULT_ZEROS=0`` restores the old way, and
this benchmark compares the two where it matters: a broker taking a producer's stream.

Method. Per round, first a memory probe: 256 MiB (64 in --quick) put into a fresh file's page cache both
ways by this process (``mmap_warmup``'s first-touch table), CPU seconds per GiB. On this VM the price of a
page's first touch depends on the guest's history (on a guest a minute after boot the two ways cost about
the same, 1.4 s per GiB; an hour later, populate alone 1.5-2.2 and zeros first 0.4), so the probe says what
memory each round ran on. Then, per record size (1 KB and 10 KB), one run per variant, the order
alternating by round: a fresh ``copyless serve`` on an empty data dir with the variant's environment, the
memory settled (``Benchmark.settle``), the throughput benchmark's confluent-kafka producer (acks=1, one
partition) sending 1.5 GiB (``--quick``: 256 MiB), then one read back by its consumer (which checks every
record came back), and the broker stopped. Per run: produce MB/s, the broker's CPU seconds per GB over the
produce window, and its pre-fault counters (``stats-json``): bytes zeroed, appends that waited for a chunk
of zeros and the longest wait.

Ratios (``zeros_vs_populate_mb_per_s_<size>``, ``zeros_vs_populate_cpu_<size>``) are the medians of the
per-round ratios, each of two runs seconds apart; with five rounds or more the table gives their sign-test
interval and a verdict against 1.0 (``median_interval``).

Rows: ``round, record_bytes, variant, produce_mb_per_s, broker_produce_cpu_s_per_gb, consume_mb_per_s,
zeroed_mb, append_waits, append_wait_max_ms`` and, on ``variant="memory probe"`` rows,
``populate_cpu_s_per_gib, zeros_cpu_s_per_gib``.
"""

from __future__ import annotations

import multiprocessing
import shutil
import statistics
from pathlib import Path
from typing import Any

from benchmarks._harness import Benchmark, median_interval
from benchmarks.mmap_warmup import FIRST_TOUCH_WAYS, MIB, first_touch_cpu_s
from benchmarks.throughput import Workload, run_workload, start_copyless

VARIANTS = ("zeros", "populate")
ENVIRONMENT = {"zeros": {"COPYLESS_PREFAULT_ZEROS": "1"}, "populate": {"COPYLESS_PREFAULT_ZEROS": "0"}}
POPULATE_WAY, ZEROS_WAY = FIRST_TOUCH_WAYS[2], FIRST_TOUCH_WAYS[3]


def _probe(bench: Benchmark, scratch: Path, nbytes: int, number: int) -> dict[str, float]:
    """CPU seconds per GiB to put non-zero data into a fresh file's page cache, both ways, order alternating."""
    per_gib = (1 << 30) / nbytes
    costs = {}
    for way in (POPULATE_WAY, ZEROS_WAY) if number % 2 else (ZEROS_WAY, POPULATE_WAY):
        bench.settle()
        costs[way] = first_touch_cpu_s(way, scratch / "probe.log", nbytes)[0] * per_gib
    return {"populate_cpu_s_per_gib": costs[POPULATE_WAY], "zeros_cpu_s_per_gib": costs[ZEROS_WAY]}


def _run(bench: Benchmark, ctx, scratch: Path, variant: str, work: Workload) -> dict[str, Any]:
    """One fresh broker with ``variant``'s pre-fault, one produce + read back; its figures and counters."""
    data_dir = scratch / f"data-{variant}"
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir()
    handle = start_copyless(data_dir, scratch / f"broker-{variant}.log", env=ENVIRONMENT[variant])
    try:
        bench.settle()
        figures = run_workload(ctx, handle.bootstrap, work, serving_stats=handle.serving_stats,
                               broker_pid=handle.cpu_pid)
        counters = handle.serving_stats() or {}
    finally:
        handle.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    if "prefault_zeroed_bytes" not in counters:
        raise RuntimeError(f"the {variant} broker gave no pre-fault counters (log: {handle.log_path})")
    zeroed = counters["prefault_zeroed_bytes"]
    if (zeroed > 0) != (variant == "zeros"):
        raise RuntimeError(f"the {variant} broker zeroed {zeroed} bytes: COPYLESS_PREFAULT_ZEROS was not applied")
    return {"produce_mb_per_s": figures["produce_mb_per_s"],
            "broker_produce_cpu_s_per_gb": figures.get("broker_produce_cpu_s_per_gb"),
            "consume_mb_per_s": figures.get("consume_mb_per_s"),
            "zeroed_mb": zeroed / 1e6,
            "append_waits": counters["prefault_append_waits"],
            "append_wait_max_ms": counters["prefault_append_wait_max_ms"]}


def _paired(rows: list[dict[str, Any]], record_bytes: int, key: str) -> list[float]:
    """zeros / populate of ``key`` within each round, in round order."""
    by_round: dict[int, dict[str, float]] = {}
    for row in rows:
        if row["record_bytes"] == record_bytes and row.get(key):
            by_round.setdefault(row["round"], {})[row["variant"]] = row[key]
    return [pair["zeros"] / pair["populate"] for _, pair in sorted(by_round.items()) if len(pair) == 2]


def _summary(rows: list[dict[str, Any]], record_bytes: int, key: str) -> dict[str, Any]:
    ratios = _paired(rows, record_bytes, key)
    interval = median_interval(ratios)
    return {"by_round": [round(r, 2) for r in ratios],
            "median": statistics.median(ratios) if ratios else None,
            "interval": None if interval is None else [round(interval.low, 3), round(interval.high, 3)],
            "verdict": None if interval is None else f"{interval.verdict(1.0)} ({interval.confidence:.0%})"}


def main(argv=None) -> dict[str, Any]:
    bench = Benchmark("prefault", "the broker's pre-fault: zeros written first vs MADV_POPULATE_WRITE alone, "
                                  "produce MB/s and broker CPU per GB, rounds alternating", argv)
    rounds = bench.pick(full=6, quick=2, tiny=1)
    sizes = bench.pick(full=[1000, 10_000], quick=[1000, 10_000], tiny=[1000])
    budget = bench.pick(full=1536 << 20, quick=256 << 20, tiny=4 << 20)
    probe_bytes = bench.pick(full=256 * MIB, quick=64 * MIB, tiny=8 * MIB)
    scale = bench.disk_scale(budget * 2 + probe_bytes, what="two brokers' logs and the memory probe")
    if scale < 1.0:
        budget = max(4 << 20, int(budget * scale))
    bench.note(f"{budget >> 20} MiB produced per run, a fresh broker on an empty data dir each time; "
               f"{rounds} round(s), the variants' order alternating")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["confluent_kafka"])
    with bench.scratch_dir() as scratch, bench.progress(rounds * (1 + len(sizes) * len(VARIANTS)), "runs") as bar:
        for number in range(1, rounds + 1):
            bar.describe(f"round {number}: memory probe")
            bench.row(round=number, record_bytes=None, variant="memory probe",
                      **_probe(bench, scratch, probe_bytes, number))
            bar.advance(1)
            for record_bytes in sizes:
                work = Workload("prefault", record_bytes, max(50, budget // record_bytes), acks="1",
                                topic=f"prefault-{record_bytes}", label=f"{record_bytes} B")
                for variant in VARIANTS if number % 2 else VARIANTS[::-1]:
                    bar.describe(f"round {number}: {record_bytes} B, {variant}")
                    bench.row(round=number, record_bytes=record_bytes, variant=variant,
                              **_run(bench, ctx, scratch, variant, work))
                    bar.advance(1)

    runs = [r for r in bench.rows if r["variant"] in VARIANTS]
    ratios: dict[str, Any] = {}
    table = []
    for record_bytes in sizes:
        rate = _summary(runs, record_bytes, "produce_mb_per_s")
        cpu = _summary(runs, record_bytes, "broker_produce_cpu_s_per_gb")
        size = f"{record_bytes // 1000}KB"
        ratios[f"zeros_vs_populate_mb_per_s_{size}"] = rate["median"]
        ratios[f"zeros_vs_populate_cpu_{size}"] = cpu["median"]
        mine = [r for r in runs if r["record_bytes"] == record_bytes]

        def median_of(variant: str, key: str) -> float | None:
            values = [r[key] for r in mine if r["variant"] == variant and r[key] is not None]
            return statistics.median(values) if values else None

        table.append({"record_bytes": record_bytes,
                      "zeros_mb_per_s": median_of("zeros", "produce_mb_per_s"),
                      "populate_mb_per_s": median_of("populate", "produce_mb_per_s"),
                      "mb_per_s_ratio": rate["median"], "mb_per_s_by_round": rate["by_round"],
                      "mb_per_s_interval": rate["interval"], "mb_per_s_verdict": rate["verdict"],
                      "zeros_cpu_s_per_gb": median_of("zeros", "broker_produce_cpu_s_per_gb"),
                      "populate_cpu_s_per_gb": median_of("populate", "broker_produce_cpu_s_per_gb"),
                      "cpu_ratio": cpu["median"], "cpu_by_round": cpu["by_round"],
                      "cpu_interval": cpu["interval"], "cpu_verdict": cpu["verdict"],
                      "append_waits_max": max(r["append_waits"] for r in mine if r["variant"] == "zeros")})
    bench.table("Zeros first vs MADV_POPULATE_WRITE alone: medians over rounds, zeros / populate within each "
                "round, the median of those with its sign-test interval (5 rounds or more) and verdict vs 1.0 "
                "(MB/s above 1.0 and CPU below it favour the zeros)", table)
    probes = [r for r in bench.rows if r["variant"] == "memory probe"]
    bench.table("Memory probe before each round: CPU s/GiB to fill a fresh file's page cache "
                f"({probe_bytes // MIB} MiB), MADV_POPULATE_WRITE + copy / zeros + MADV_POPULATE_WRITE + copy",
                [{"round": r["round"], "populate_cpu_s_per_gib": r["populate_cpu_s_per_gib"],
                  "zeros_cpu_s_per_gib": r["zeros_cpu_s_per_gib"]} for r in probes])

    def chart(fig) -> None:
        left, right = fig.subplots(1, 2)
        for ax, key, label in ((left, "produce_mb_per_s", "produce MB/s"),
                               (right, "broker_produce_cpu_s_per_gb", "broker CPU s per GB produced")):
            for i, record_bytes in enumerate(sizes):
                for j, variant in enumerate(VARIANTS):
                    values = [r[key] for r in runs if r["record_bytes"] == record_bytes
                              and r["variant"] == variant and r[key] is not None]
                    x = i * 3 + j
                    ax.scatter([x] * len(values), values, s=18, alpha=0.7,
                               color="tab:green" if variant == "zeros" else "tab:gray",
                               label=variant if i == 0 else None)
                    if values:
                        ax.hlines(statistics.median(values), x - 0.3, x + 0.3, color="black")
            ax.set_xticks([i * 3 + 0.5 for i in range(len(sizes))], [f"{s} B records" for s in sizes])
            ax.set_ylabel(label)
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=8)
        fig.suptitle("pre-fault with zeros first vs MADV_POPULATE_WRITE alone (a dot per run, bar: median)",
                     fontsize=10)

    return bench.finish(ratios=ratios, chart=chart,
                        extra={"rounds": rounds, "sizes": sizes, "produce_bytes_per_run": budget,
                               "probe_bytes": probe_bytes},
                        columns=["round", "record_bytes", "variant", "produce_mb_per_s",
                                 "broker_produce_cpu_s_per_gb", "consume_mb_per_s", "zeroed_mb", "append_waits",
                                 "append_wait_max_ms", "populate_cpu_s_per_gib", "zeros_cpu_s_per_gib"])


if __name__ == "__main__":
    main()
