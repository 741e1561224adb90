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
"""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import Benchmark, percentile

MIB = 1 << 20
PAGE_BYTES = mmap.PAGESIZE
# MADV_POPULATE_WRITE from <linux/mman.h>; Python 3.11 does not export it.
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
VARIANTS = ("sparse", "fallocate", "MAP_POPULATE", "MADV_POPULATE_WRITE", "written ahead", "touched per page")


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

    results: dict[tuple[int, str], list[tuple[float, list[int]]]] = {}
    unsupported: set[str] = set()
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
                               "unsupported": sorted(unsupported)},
                        columns=["batch_bytes", "variant", "prep_ms", "append_ms", "mb_per_s", "vs_sparse",
                                 "p50_us", "p99_us", "max_us", "total_ms"])


if __name__ == "__main__":
    main()
