"""Appending into a memory-mapped segment: sparse vs preallocated vs pre-faulted vs warmed.

Seed 001 explains RocketMQ's storage: fixed 1 GiB CommitLog files, each mapped whole
(``FileChannel.map``), with an allocator thread that creates the next file ahead of time and, when
``warmMapedFileEnable`` is set, warms it by writing one zero byte per 4 KiB page (``warmMappedFile``) and
``mlock``s it, so that appends never take a page fault. This benchmark shows why a log warms its next
segment: the cost of the first write into each page (block allocation, page-cache allocation, page-table
fill, write-protect fault for dirty tracking) lands on whoever touches the page first.

For one segment (1 GiB as RocketMQ's, smaller in --quick), a fresh file each time, appends of
``batch_bytes`` are copied into the map through a memoryview (one memcpy each) until it is full:

- ``sparse``: ``ftruncate`` only — blocks are allocated by page faults during the appends;
- ``fallocate``: ``posix_fallocate`` — blocks reserved, pages still faulted in on first write;
- ``MAP_POPULATE``: fallocate + ``mmap(MAP_SHARED | MAP_POPULATE)`` — page tables filled at map time;
- ``MADV_POPULATE_WRITE``: fallocate + ``madvise(23)`` (Linux 5.14+; not named in Python 3.11) — pages
  prefaulted writable, as if written;
- ``written ahead``: ``os.pwrite`` of zeros over the file, then map (page cache populated, GIL released
  while the kernel works);
- ``touched per page``: RocketMQ's ``warmMappedFile`` — one byte written through the map per 4 KiB page.

``prep_ms`` is the preparation (the broker does it on a worker thread while the previous segment is
being filled); ``append_ms``/``mb_per_s`` are the appends alone, ``p99_us``/``max_us`` the latency of
single append calls (a stall there is a stall on the event loop). Rows: ``batch_bytes, variant, prep_ms,
append_ms, mb_per_s, p50_us, p99_us, max_us, vs_sparse``.

Pre-faulting moves the cost of the first touch off the appending thread; it does not remove it. The
"first touch" table prices it in CPU seconds per GiB of data put into the page cache of a fresh file, four
ways, on memory settled before every run (``Benchmark.settle``: on this VM freed memory goes back to the
hypervisor, which backs each page again on its first touch):

- ``write()``: ``os.write`` of 1 MiB chunks appended to an empty file (Kafka's path, a produce request's
  batches written as they come);
- ``write() 4 MiB``: the same in 4 MiB chunks;
- ``MADV_POPULATE_WRITE + copy``: copyless's path: ``posix_fallocate``, map, pre-fault, then the 1 MiB
  chunks copied into the map;
- ``zeros by write() + MADV_POPULATE_WRITE + copy``: the page cache filled by writing zeros in 1 MiB chunks
  first, then pre-faulted and copied into as above.

Rounds alternate which way goes first; the ratios are of the medians (``populate_copy_vs_write_cpu``,
1.0: the mmap path costs the CPU the write path does; ``zeros_first_vs_populate_cpu``, under 1.0: writing
zeros first makes the mmap path cheaper).
"""

from __future__ import annotations

import mmap
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import Benchmark, percentile

MIB = 1 << 20
PAGE_BYTES = mmap.PAGESIZE
# MADV_POPULATE_WRITE from <linux/mman.h>; Python 3.11 does not export it.
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
VARIANTS = ("sparse", "fallocate", "MAP_POPULATE", "MADV_POPULATE_WRITE", "written ahead", "touched per page")
FIRST_TOUCH_WAYS = ("write()", "write() 4 MiB", "MADV_POPULATE_WRITE + copy",
                    "zeros by write() + MADV_POPULATE_WRITE + copy")


class _Unsupported(Exception):
    pass


def _prepare(variant: str, path: Path, segment_bytes: int) -> tuple[int, mmap.mmap]:
    """Create the segment file the variant's way and map it; returns (fd, map)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if variant == "sparse":
            os.ftruncate(fd, segment_bytes)
        elif variant == "written ahead":
            zeros = bytes(4 * MIB)
            written = 0
            while written < segment_bytes:
                written += os.pwrite(fd, zeros[: min(len(zeros), segment_bytes - written)], written)
        else:
            os.posix_fallocate(fd, 0, segment_bytes)
        flags = mmap.MAP_SHARED
        if variant == "MAP_POPULATE":
            flags |= mmap.MAP_POPULATE
        segment = mmap.mmap(fd, segment_bytes, flags=flags)
        if variant == "MADV_POPULATE_WRITE":
            try:
                segment.madvise(MADV_POPULATE_WRITE, 0, segment_bytes)
            except OSError as e:
                segment.close()
                raise _Unsupported(f"madvise(MADV_POPULATE_WRITE) failed: {e}") from e
        elif variant == "touched per page":
            for offset in range(0, segment_bytes, PAGE_BYTES):
                segment[offset] = 0
        return fd, segment
    except BaseException:
        os.close(fd)
        raise


def _append_all(segment: mmap.mmap, segment_bytes: int, batch: bytes) -> list[int]:
    """Fill the map with copies of ``batch``; returns each append's duration in ns."""
    view = memoryview(segment)
    size = len(batch)
    durations = []
    clock = time.perf_counter_ns
    try:
        for position in range(0, segment_bytes - size + 1, size):
            started = clock()
            view[position:position + size] = batch
            durations.append(clock() - started)
    finally:
        view.release()
    return durations


def _run(variant: str, path: Path, segment_bytes: int, batch: bytes) -> tuple[float, list[int]]:
    started = time.perf_counter()
    fd, segment = _prepare(variant, path, segment_bytes)
    prep_s = time.perf_counter() - started
    try:
        durations = _append_all(segment, segment_bytes, batch)
    finally:
        segment.close()
        os.close(fd)
        os.unlink(path)
    return prep_s, durations


def first_touch_cpu_s(way: str, path: Path, nbytes: int) -> tuple[float, float]:
    """CPU seconds of this process to put ``nbytes`` (a multiple of 4 MiB) of non-zero data into a fresh
    file's page cache ``way``, and of that the pre-fault alone (zeros written and MADV_POPULATE_WRITE; 0 for
    the write() ways)."""
    chunk = bytes(range(1, 256)) * (MIB // 255) + bytes(range(1, MIB % 255 + 1))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        started = time.process_time()
        prefault = 0.0
        if way.startswith("write()"):
            data = chunk * (4 if way.endswith("4 MiB") else 1)
            for _ in range(nbytes // len(data)):
                os.write(fd, data)
        else:
            os.posix_fallocate(fd, 0, nbytes)
            if way.startswith("zeros"):
                zeros = bytes(MIB)
                for position in range(0, nbytes, MIB):
                    os.pwrite(fd, zeros, position)
            with mmap.mmap(fd, nbytes) as segment:
                segment.madvise(MADV_POPULATE_WRITE, 0, nbytes)
                prefault = time.process_time() - started
                for position in range(0, nbytes, MIB):
                    segment[position:position + MIB] = chunk
        return time.process_time() - started, prefault
    finally:
        os.close(fd)
        os.unlink(path)


def _first_touch(bench: Benchmark, scratch: Path, nbytes: int, rounds: int) -> list[dict[str, Any]]:
    """The first-touch table's rows: per way, CPU seconds per GiB in each round (order alternating), and
    their median."""
    per_gib = (1 << 30) / nbytes
    seconds: dict[str, list[tuple[float, float]]] = {way: [] for way in FIRST_TOUCH_WAYS}
    with bench.progress(rounds * len(FIRST_TOUCH_WAYS), "runs", label="first touch") as bar:
        for number in range(rounds):
            for way in FIRST_TOUCH_WAYS if number % 2 == 0 else FIRST_TOUCH_WAYS[::-1]:
                bar.describe(f"first touch, {way}")
                bench.settle()
                total, prefault = first_touch_cpu_s(way, scratch / "first-touch.log", nbytes)
                seconds[way].append((total * per_gib, prefault * per_gib))
                bar.advance(1)
    return [{"way": way, "cpu_s_per_gib": statistics.median(t for t, _ in runs),
             "prefault_cpu_s_per_gib": statistics.median(p for _, p in runs),
             "by_round": [round(t, 2) for t, _ in runs]}
            for way, runs in seconds.items()]


def main(argv=None) -> dict[str, Any]:
    bench = Benchmark("mmap_warmup",
                      "append into an mmap'd segment: sparse, fallocate, MAP_POPULATE, MADV_POPULATE_WRITE, warmed",
                      argv)
    segment_bytes = bench.pick(full=1 << 30, quick=256 * MIB, tiny=8 * MIB)
    batch_sizes = bench.pick(full=[16 * 1024, MIB], quick=[16 * 1024, MIB], tiny=[16 * 1024])
    repeats = bench.pick(full=2, quick=1, tiny=1)
    scale = bench.disk_scale(segment_bytes, what="one segment")
    if scale < 1.0:
        segment_bytes = max(4 * MIB, int(segment_bytes * scale) // MIB * MIB)
    bench.note(f"segment {segment_bytes // MIB} MiB, a fresh file per run; the page cache, not the disk, "
               f"takes the writes (nothing is fsynced)")

    first_touch_bytes = bench.pick(full=512 * MIB, quick=128 * MIB, tiny=8 * MIB)
    first_touch_rounds = bench.pick(full=3, quick=1, tiny=2)
    results: dict[tuple[int, str], list[tuple[float, list[int]]]] = {}
    unsupported: set[str] = set()
    first_touch: list[dict[str, Any]] = []
    with bench.scratch_dir() as scratch:
        path = scratch / "00000000000000000000.log"
        # A process's first mapping of fresh memory is slower than later ones: take that hit off the clock.
        _run("sparse", path, min(segment_bytes, 16 * MIB), bytes(16 * 1024))
        runs = len(batch_sizes) * len(VARIANTS) * repeats
        with bench.progress(runs, "segments") as bar:
            for _ in range(repeats):
                for batch_bytes in batch_sizes:
                    batch = bytes(range(256)) * (batch_bytes // 256)
                    for variant in VARIANTS:
                        bar.describe(f"{batch_bytes // 1024} KiB {variant}")
                        if variant in unsupported:
                            bar.advance(1)
                            continue
                        try:
                            results.setdefault((batch_bytes, variant), []).append(
                                _run(variant, path, segment_bytes, batch))
                        except _Unsupported as e:
                            unsupported.add(variant)
                            bench.note(f"{variant} skipped: {e}")
                            results.pop((batch_bytes, variant), None)
                            if path.exists():
                                path.unlink()
                        bar.advance(1)
        if "MADV_POPULATE_WRITE" not in unsupported:
            first_touch = _first_touch(bench, scratch, first_touch_bytes, first_touch_rounds)

    for batch_bytes in batch_sizes:
        sparse_rate = None
        for variant in VARIANTS:
            runs = results.get((batch_bytes, variant))
            if not runs:
                continue
            # The run with the fastest appends of the repeats (the least disturbed by other processes).
            prep_s, durations = min(runs, key=lambda r: sum(r[1]))
            append_s = sum(durations) / 1e9
            rate = len(durations) * batch_bytes / append_s / 1e6
            if variant == "sparse":
                sparse_rate = rate
            bench.row(batch_bytes=batch_bytes, variant=variant, prep_ms=prep_s * 1000, append_ms=append_s * 1000,
                      mb_per_s=rate, p50_us=percentile(durations, 50) / 1e3,
                      p99_us=percentile(durations, 99) / 1e3, max_us=max(durations) / 1e3,
                      vs_sparse=rate / sparse_rate if sparse_rate else None,
                      total_ms=(prep_s + append_s) * 1000)

    def rate_of(batch_bytes: int, variant: str) -> float | None:
        return next((r["mb_per_s"] for r in bench.rows
                     if r["batch_bytes"] == batch_bytes and r["variant"] == variant), None)

    ratios = {}
    for batch_bytes in batch_sizes:
        base = rate_of(batch_bytes, "sparse")
        for variant in VARIANTS[1:]:
            rate = rate_of(batch_bytes, variant)
            if rate is not None and base:
                key = variant.lower().replace(" ", "_")
                ratios[f"{key}_vs_sparse_{batch_bytes // 1024}KiB"] = rate / base
    if first_touch:
        cost = {r["way"]: r["cpu_s_per_gib"] for r in first_touch}
        if cost["write()"] > 0:
            ratios["populate_copy_vs_write_cpu"] = cost["MADV_POPULATE_WRITE + copy"] / cost["write()"]
        if cost["MADV_POPULATE_WRITE + copy"] > 0:
            ratios["zeros_first_vs_populate_cpu"] = (cost["zeros by write() + MADV_POPULATE_WRITE + copy"]
                                                     / cost["MADV_POPULATE_WRITE + copy"])
        bench.table(f"First touch: CPU seconds per GiB put into a fresh file's page cache, on settled memory "
                    f"({first_touch_bytes // MIB} MiB per run, {first_touch_rounds} round(s), order "
                    f"alternating; median and by round; prefault = the part before the copy: zeros written and "
                    f"MADV_POPULATE_WRITE)", first_touch)
    bench.table("Reference figures measured earlier on a machine of this size (1 MiB chunks, GB/s)", [
        {"case": "first touch, sparse (ftruncate)", "gb_per_s": 1.87},
        {"case": "first touch, posix_fallocate", "gb_per_s": 2.35},
        {"case": "MAP_POPULATE", "gb_per_s": "2.7-3.3"},
        {"case": "warmed: 1 byte per page (RocketMQ)", "gb_per_s": "5.5-7.9"},
        {"case": "resident pages", "gb_per_s": 6.7},
    ])

    def chart(fig) -> None:
        left, right = fig.subplots(1, 2)
        width = 0.8 / len(batch_sizes)
        for i, batch_bytes in enumerate(batch_sizes):
            chosen = [r for r in bench.rows if r["batch_bytes"] == batch_bytes]
            x = [j + (i - (len(batch_sizes) - 1) / 2) * width for j in range(len(chosen))]
            left.bar(x, [r["mb_per_s"] for r in chosen], width, label=f"{batch_bytes // 1024} KiB appends")
            right.bar(x, [r["p99_us"] for r in chosen], width, label=f"p99, {batch_bytes // 1024} KiB")
            right.scatter(x, [r["max_us"] for r in chosen], marker="_", s=200, color="black",
                          label="max" if i == 0 else None, zorder=3)
        names = [r["variant"] for r in bench.rows if r["batch_bytes"] == batch_sizes[0]]
        for ax in (left, right):
            ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
            ax.legend(fontsize=7)
        left.set_ylabel("append MB/s")
        left.set_title(f"append throughput, {segment_bytes // MIB} MiB segment")
        right.set_yscale("log")
        right.set_ylabel("append latency (µs)")
        right.set_title("per-append latency: p99 and max")
        fig.suptitle("why the log warms the next segment", fontsize=11)

    return bench.finish(ratios=ratios, chart=chart,
                        extra={"segment_bytes": segment_bytes, "batch_sizes": batch_sizes,
                               "unsupported": sorted(unsupported), "first_touch": first_touch,
                               "first_touch_bytes": first_touch_bytes},
                        columns=["batch_bytes", "variant", "prep_ms", "append_ms", "mb_per_s", "vs_sparse",
                                 "p50_us", "p99_us", "max_us", "total_ms"])


if __name__ == "__main__":
    main()
