"""The log's pre-fault through the whole broker: zeros written first, pwrite for appends that outrun it.

copyless pre-faults the segment it appends to in a window ahead of the writer
(docs/segments-mmap-steps-prefault-window.md). Two choices of that pre-fault are measured here against the ways
they replaced, each switched off by an environment variable the broker reads at start:

- ``default`` (the broker's defaults, set explicitly): each step of the window is written with zeros by
  ``pwrite`` (1 MiB chunks, claimed a margin past the appends) and then mapped with
  ``MADV_POPULATE_WRITE``; an append that runs past the pre-faulted pages writes them with ``pwrite``
  instead of faulting them in through the map;
- ``outrun faults`` (``"log.prefault.outrun.pwrite" = false``): the same zeros, but an append past the pre-faulted pages
  copies into the map and faults each page in;
- ``populate only`` (also ``"log.prefault.zeros" = false``): ``MADV_POPULATE_WRITE`` alone allocates and zeroes
  the page cache, the way before either change.

Method. Per round, first a memory probe: 256 MiB (64 in --quick) put into a fresh file's page cache both
ways by this process (``mmap_warmup``'s first-touch table), CPU seconds per GiB. On this VM the price of a
page's first touch depends on the guest's history (a minute after boot the two ways cost about the same,
1.4-1.7 s per GiB; later, populate alone 1.5-2.2 and zeros first 0.4-1.0), so the probe says what memory
each round ran on. Then, per record size (1 KB and 10 KB), one run per variant, the order rotating by
round: a fresh ``copyless serve`` on an empty data dir with the variant's environment, the memory settled
(``Benchmark.settle``), the throughput benchmark's confluent-kafka producer (acks=1, one partition) sending
1.5 GiB (``--quick``: 256 MiB), then one read back by its consumer (which checks every record came back),
and the broker stopped. Per run: produce MB/s, the broker's CPU seconds per GB over the produce window, and
its pre-fault counters (``stats-json``): bytes zeroed, bytes appended with pwrite past the pre-faulted pages,
appends that waited for a chunk of zeros and the longest wait.

Ratios are the medians of per-round ratios, each of two runs in the same round:
``<a>_vs_<b>_mb_per_s_<size>`` and ``<a>_vs_<b>_cpu_<size>`` for ``default`` against ``outrun faults`` (what
the pwrite does), and ``outrun faults`` against ``populate only`` (what the zeros do). With five rounds or
more the table gives their sign-test interval and a verdict against 1.0 (``median_interval``).

Rows: ``round, record_bytes, variant, produce_mb_per_s, broker_produce_cpu_s_per_gb, consume_mb_per_s,
zeroed_mb, outrun_mb, append_waits, append_wait_max_ms`` and, on ``variant="memory probe"`` rows,
``populate_cpu_s_per_gib, zeros_cpu_s_per_gib``.
"""

from __future__ import annotations

import multiprocessing
import shutil
import statistics
from pathlib import Path
from typing import Any

from benchmarks._harness import Benchmark
from benchmarks.mmap_warmup import FIRST_TOUCH_WAYS, MIB, first_touch_cpu_s
from benchmarks.throughput import Workload, ratio_verdict, run_workload, start_copyless

VARIANTS = ("default", "outrun faults", "populate only")
# Each variant's broker settings (a --config TOML file).
SETTINGS = {
    "default": {"log.prefault.zeros": True, "log.prefault.outrun.pwrite": True},
    "outrun faults": {"log.prefault.zeros": True, "log.prefault.outrun.pwrite": False},
    "populate only": {"log.prefault.zeros": False, "log.prefault.outrun.pwrite": False},
}
COLOURS = {"default": "tab:green", "outrun faults": "tab:blue", "populate only": "tab:gray"}
# (a, b): the ratio a / b isolates one change: the pwrite past the pre-faulted pages, then the zeros.
PAIRS = (("default", "outrun faults"), ("outrun faults", "populate only"))
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
    name = variant.replace(" ", "-")
    data_dir = scratch / f"data-{name}"
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir()
    config_path = scratch / f"broker-{name}.toml"
    config_path.write_text("".join(f'"{key}" = {str(value).lower()}\n' for key, value in SETTINGS[variant].items()))
    handle = start_copyless(data_dir, scratch / f"broker-{name}.log", extra_args=("--config", str(config_path)))
    try:
        bench.settle()
        figures = run_workload(ctx, handle.bootstrap, work, serving_stats=handle.serving_stats,
                               broker_pid=handle.cpu_pid)
        counters = handle.serving_stats() or {}
    finally:
        handle.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    if "prefault_outrun_bytes" not in counters:
        raise RuntimeError(f"the {variant} broker gave no pre-fault counters (log: {handle.log_path})")
    zeroed, outrun = counters["prefault_zeroed_bytes"], counters["prefault_outrun_bytes"]
    if (zeroed > 0) != (variant != "populate only") or (outrun > 0 and variant != "default"):
        raise RuntimeError(f"the {variant} broker zeroed {zeroed} bytes and wrote {outrun} past its pre-fault: "
                           f"its settings {SETTINGS[variant]} were not applied")
    return {"produce_mb_per_s": figures["produce_mb_per_s"],
            "broker_produce_cpu_s_per_gb": figures.get("broker_produce_cpu_s_per_gb"),
            "consume_mb_per_s": figures.get("consume_mb_per_s"),
            "zeroed_mb": zeroed / 1e6,
            "outrun_mb": outrun / 1e6,
            "append_waits": counters["prefault_append_waits"],
            "append_wait_max_ms": counters["prefault_append_wait_max_ms"]}


def _paired(rows: list[dict[str, Any]], record_bytes: int, key: str, a: str, b: str) -> list[float]:
    """a / b of ``key`` within each round, in round order."""
    by_round: dict[int, dict[str, float]] = {}
    for row in rows:
        if row["record_bytes"] == record_bytes and row.get(key):
            by_round.setdefault(row["round"], {})[row["variant"]] = row[key]
    return [pair[a] / pair[b] for _, pair in sorted(by_round.items()) if a in pair and b in pair]


def _summary(rows: list[dict[str, Any]], record_bytes: int, key: str, a: str, b: str) -> dict[str, Any]:
    """The per-round a / b ratios with their median, interval and verdict vs 1.0 (the throughput benchmark's)."""
    ratios = _paired(rows, record_bytes, key, a, b)
    return {"by_round": [round(r, 2) for r in ratios], **ratio_verdict(ratios)}


def _key(variant: str) -> str:
    return variant.replace(" ", "_")


def main(argv=None) -> dict[str, Any]:
    bench = Benchmark("prefault", "the broker's pre-fault: zeros written first, pwrite past it, and without "
                                  "either: produce MB/s and broker CPU per GB, rounds rotating", argv)
    rounds = bench.pick(full=6, quick=2, tiny=1)
    sizes = bench.pick(full=[1000, 10_000], quick=[1000, 10_000], tiny=[1000])
    budget = bench.pick(full=1536 << 20, quick=256 << 20, tiny=4 << 20)
    probe_bytes = bench.pick(full=256 * MIB, quick=64 * MIB, tiny=8 * MIB)
    scale = bench.disk_scale(budget + probe_bytes, what="a broker's log and the memory probe")
    if scale < 1.0:
        budget = max(4 << 20, int(budget * scale))
    bench.note(f"{budget >> 20} MiB produced per run, a fresh broker on an empty data dir each time; "
               f"{rounds} round(s), the variants' order rotating")
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
                shift = (number - 1) % len(VARIANTS)
                for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                    bar.describe(f"round {number}: {record_bytes} B, {variant}")
                    bench.row(round=number, record_bytes=record_bytes, variant=variant,
                              **_run(bench, ctx, scratch, variant, work))
                    bar.advance(1)

    runs = [r for r in bench.rows if r["variant"] in VARIANTS]
    ratios: dict[str, Any] = {}
    table = []
    for a, b in PAIRS:
        for record_bytes in sizes:
            rate = _summary(runs, record_bytes, "produce_mb_per_s", a, b)
            cpu = _summary(runs, record_bytes, "broker_produce_cpu_s_per_gb", a, b)
            key = f"{_key(a)}_vs_{_key(b)}"
            ratios[f"{key}_mb_per_s_{record_bytes // 1000}KB"] = rate["paired"]
            ratios[f"{key}_cpu_{record_bytes // 1000}KB"] = cpu["paired"]
            mine = [r for r in runs if r["record_bytes"] == record_bytes]

            def median_of(variant: str, field: str, mine: list[dict] = mine) -> float | None:
                values = [r[field] for r in mine if r["variant"] == variant and r[field] is not None]
                return statistics.median(values) if values else None

            table.append({"pair": f"{a} / {b}", "record_bytes": record_bytes,
                          "a_mb_per_s": median_of(a, "produce_mb_per_s"),
                          "b_mb_per_s": median_of(b, "produce_mb_per_s"),
                          "mb_per_s_ratio": rate["paired"], "mb_per_s_by_round": rate["by_round"],
                          "mb_per_s_interval": rate["interval"], "mb_per_s_verdict": rate["verdict"],
                          "a_cpu_s_per_gb": median_of(a, "broker_produce_cpu_s_per_gb"),
                          "b_cpu_s_per_gb": median_of(b, "broker_produce_cpu_s_per_gb"),
                          "cpu_ratio": cpu["paired"], "cpu_by_round": cpu["by_round"],
                          "cpu_interval": cpu["interval"], "cpu_verdict": cpu["verdict"],
                          "a_outrun_mb": median_of(a, "outrun_mb"),
                          "a_append_waits_max": max(r["append_waits"] for r in mine if r["variant"] == a)})
    bench.table("Pairs of variants, each isolating one change: medians over rounds (a, b), a / b within each "
                "round, the median of those with its sign-test interval (5 rounds or more) and verdict vs 1.0 "
                "(MB/s above 1.0 and CPU below it favour a)", table)
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
                    x = i * (len(VARIANTS) + 1) + j
                    ax.scatter([x] * len(values), values, s=18, alpha=0.7, color=COLOURS[variant],
                               label=variant if i == 0 else None)
                    if values:
                        ax.hlines(statistics.median(values), x - 0.3, x + 0.3, color="black")
            ax.set_xticks([i * (len(VARIANTS) + 1) + (len(VARIANTS) - 1) / 2 for i in range(len(sizes))],
                          [f"{s} B records" for s in sizes])
            ax.set_ylabel(label)
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=8)
        fig.suptitle("the log's pre-fault three ways (a dot per run, bar: median)", fontsize=10)

    return bench.finish(ratios=ratios, chart=chart,
                        extra={"rounds": rounds, "sizes": sizes, "produce_bytes_per_run": budget,
                               "probe_bytes": probe_bytes},
                        columns=["round", "record_bytes", "variant", "produce_mb_per_s",
                                 "broker_produce_cpu_s_per_gb", "consume_mb_per_s", "zeroed_mb", "outrun_mb",
                                 "append_waits",
                                 "append_wait_max_ms", "populate_cpu_s_per_gib", "zeros_cpu_s_per_gib"])


if __name__ == "__main__":
    main()
