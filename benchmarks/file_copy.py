"""Copying a file: unbuffered stream, buffered stream, mmap, sendfile and copy_file_range.

Reproduces the file-copy comparison of seed 001 (JDK 11, CentOS 7, a 1.34 GB file): a plain Java IO
stream, a buffered stream, ``FileChannel.map`` (mmap) and ``FileChannel.transferTo`` (sendfile). Its
figures (printed in "seconds", plainly milliseconds): stream 3,973,924; buffered 33,196; mmap 7,131;
sendfile 1,784 — every user-space copy and every system call per byte shows.

Here, for 200 MB .. 1.34 GB files in the page cache (written just before; the copy's destination is a new
file, its pages allocated as it is written, not fsynced):

- ``stream 1 B``: ``os.read(fd, 1)`` + ``os.write(fd, b)`` per byte, the unbuffered stream's ``read()``;
- ``buffered 1 B``: ``read(1)`` / ``write(b)`` on Python's buffered file objects with 8 KiB buffers
  (Java's BufferedInputStream/BufferedOutputStream default);
  both per-byte methods run on a prefix of the file and are extrapolated linearly (flagged in the rows),
  since a 1.34 GB byte-at-a-time copy takes the article an hour;
- ``read+write 64 KiB``: ``readinto`` a reused 64 KiB buffer + ``write`` (shutil.copyfileobj's size);
- ``mmap``: both files mapped, ``dst[a:b] = src[a:b]`` through memoryviews in 64 MiB steps (one memcpy
  per step, no system call per byte);
- ``sendfile``: ``os.sendfile(dst, src, ...)`` file to file, in-kernel;
- ``copy_file_range``: ``os.copy_file_range`` (in-kernel, may share extents on filesystems that can).

Each copy is checked (size and sampled contents). JSON rows: ``size_mb, method, time_ms, mb_per_s,
vs_sendfile, extrapolated``.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._harness import Benchmark

MIB = 1 << 20
ARTICLE_FILE_MB = 1340  # "准备1.34G测试文件"
ARTICLE_MS = {"stream 1 B": 3_973_924, "buffered 1 B": 33_196, "mmap": 7_131, "sendfile": 1_784}
METHODS = ("stream 1 B", "buffered 1 B", "read+write 64 KiB", "mmap", "sendfile", "copy_file_range")
_STEP_BYTES = 64 * MIB
_KERNEL_STEP_BYTES = 0x7FFFF000  # sendfile/copy_file_range move at most this per call


def _copy_stream_1b(src: Path, dst: Path, limit: int) -> int:
    fd_in = os.open(src, os.O_RDONLY)
    fd_out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        read, write = os.read, os.write
        for _ in range(limit):
            write(fd_out, read(fd_in, 1))
    finally:
        os.close(fd_in)
        os.close(fd_out)
    return limit


def _copy_buffered_1b(src: Path, dst: Path, limit: int) -> int:
    with open(src, "rb", buffering=8192) as f_in, open(dst, "wb", buffering=8192) as f_out:
        read, write = f_in.read, f_out.write
        for _ in range(limit):
            write(read(1))
    return limit


def _copy_read_write(src: Path, dst: Path, limit: int) -> int:
    buffer = bytearray(64 * 1024)
    view = memoryview(buffer)
    copied = 0
    with open(src, "rb", buffering=0) as f_in, open(dst, "wb", buffering=0) as f_out:
        while copied < limit:
            n = f_in.readinto(view)
            if not n:
                break
            out = view[:n]
            while out:
                out = out[f_out.write(out):]
            copied += n
    return copied


def _copy_mmap(src: Path, dst: Path, limit: int) -> int:
    fd_in = os.open(src, os.O_RDONLY)
    fd_out = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd_out, limit)
        with mmap.mmap(fd_in, limit, prot=mmap.PROT_READ) as m_in, mmap.mmap(fd_out, limit) as m_out:
            source = memoryview(m_in)
            target = memoryview(m_out)
            try:
                for start in range(0, limit, _STEP_BYTES):
                    end = min(start + _STEP_BYTES, limit)
                    target[start:end] = source[start:end]
            finally:
                source.release()
                target.release()
    finally:
        os.close(fd_in)
        os.close(fd_out)
    return limit


def _copy_kernel(call: Callable[[int, int, int, int], int]) -> Callable[[Path, Path, int], int]:
    def copy(src: Path, dst: Path, limit: int) -> int:
        fd_in = os.open(src, os.O_RDONLY)
        fd_out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            copied = 0
            while copied < limit:
                n = call(fd_in, fd_out, copied, min(limit - copied, _KERNEL_STEP_BYTES))
                if n == 0:
                    break
                copied += n
        finally:
            os.close(fd_in)
            os.close(fd_out)
        return copied
    return copy


def _sendfile(fd_in: int, fd_out: int, offset: int, count: int) -> int:
    # The output fd's own position advances; the input offset is explicit.
    return os.sendfile(fd_out, fd_in, offset, count)


def _copy_file_range(fd_in: int, fd_out: int, offset: int, count: int) -> int:
    return os.copy_file_range(fd_in, fd_out, count, offset, offset)


COPIERS: dict[str, Callable[[Path, Path, int], int]] = {
    "stream 1 B": _copy_stream_1b,
    "buffered 1 B": _copy_buffered_1b,
    "read+write 64 KiB": _copy_read_write,
    "mmap": _copy_mmap,
    "sendfile": _copy_kernel(_sendfile),
    "copy_file_range": _copy_kernel(_copy_file_range),
}


def _write_source(path: Path, size: int, bar) -> None:
    block = os.urandom(MIB)
    with open(path, "wb", buffering=0) as f:
        written = 0
        while written < size:
            n = f.write(block[: min(MIB, size - written)])
            written += n
            bar.advance(n)


def _verify(src: Path, dst: Path, length: int) -> None:
    """Same size and same bytes at a few sampled offsets (a full compare would double the I/O)."""
    actual = os.stat(dst).st_size
    if actual != length:
        raise AssertionError(f"{dst.name}: {actual} bytes, expected {length}")
    with open(src, "rb") as a, open(dst, "rb") as b:
        for offset in {0, length // 3, length // 2, max(0, length - 4096)}:
            a.seek(offset)
            b.seek(offset)
            if a.read(4096) != b.read(4096):
                raise AssertionError(f"{dst.name}: contents differ at {offset}")


def main(argv=None) -> dict[str, Any]:
    bench = Benchmark("file_copy", "copy a file: unbuffered stream, buffered, mmap, sendfile, copy_file_range",
                      argv)
    sizes_mb = bench.pick(full=[200, 500, 1000, ARTICLE_FILE_MB], quick=[64, 200], tiny=[4, 8])
    prefix_bytes = {
        "stream 1 B": bench.pick(full=2 * MIB, quick=256 * 1024, tiny=16 * 1024),
        "buffered 1 B": bench.pick(full=8 * MIB, quick=1 * MIB, tiny=32 * 1024),
    }
    needed = 2 * max(sizes_mb) * MIB  # source + one destination at a time
    scale = bench.disk_scale(needed, what="source and copy")
    if scale < 1.0:
        limit = max(1, int(max(sizes_mb) * scale))
        sizes_mb = sorted({min(s, limit) for s in sizes_mb})
    bench.note("source in the page cache, destination not fsynced: the copy's CPU and memory cost is "
               "measured, not the disk")
    bench.note("per-byte methods run on a prefix (stream 1 B: "
               f"{prefix_bytes['stream 1 B'] // 1024} KiB, buffered 1 B: "
               f"{prefix_bytes['buffered 1 B'] // 1024} KiB) and are extrapolated linearly to the file size")
    bench.note("sizes are MiB (2^20 bytes), as the articles' MB most likely were; MB/s are 10^6 bytes per second")
    bench.note("the article labels its figures seconds; they are read here as milliseconds")

    timings: dict[tuple[int, str], tuple[float, bool]] = {}
    with bench.scratch_dir() as scratch:
        src = scratch / "source.bin"
        dst = scratch / "copy.bin"
        largest = max(sizes_mb) * MIB
        with bench.progress(largest, "bytes", label="writing the source") as bar:
            _write_source(src, largest, bar)
        with bench.progress(len(sizes_mb) * len(METHODS), "copies") as bar:
            for size_mb in sizes_mb:
                length = size_mb * MIB
                for method in METHODS:
                    bar.describe(f"{size_mb} MiB {method}")
                    # A smaller size copies a prefix of the one big source file.
                    limit = min(length, prefix_bytes.get(method, length))
                    started = time.perf_counter()
                    copied = COPIERS[method](src, dst, limit)
                    elapsed = time.perf_counter() - started
                    if copied != limit:
                        raise AssertionError(f"{method}: copied {copied} of {limit}")
                    _verify(src, dst, limit)
                    os.unlink(dst)
                    timings[(size_mb, method)] = (elapsed * length / limit, limit < length)
                    bar.advance(1)

    for size_mb in sizes_mb:
        sendfile_s = timings[(size_mb, "sendfile")][0]
        for method in METHODS:
            seconds, extrapolated = timings[(size_mb, method)]
            bench.row(size_mb=size_mb, method=method, time_ms=seconds * 1000,
                      mb_per_s=size_mb * MIB / 1e6 / seconds, vs_sendfile=seconds / sendfile_s,
                      extrapolated=extrapolated)

    nearest = min(sizes_mb, key=lambda s: abs(s - ARTICLE_FILE_MB))
    article_rows = []
    for method in METHODS:
        today = next(r for r in bench.rows if r["size_mb"] == nearest and r["method"] == method)
        article = ARTICLE_MS.get(method)
        article_rows.append({
            "method": method,
            "article_ms_1340MB": article,
            "article_vs_sendfile": article / ARTICLE_MS["sendfile"] if article else None,
            f"today_ms_{nearest}MB": today["time_ms"],
            "today_vs_sendfile": today["vs_sendfile"],
        })
    bench.table(f"The article's 1.34 GB copy beside today's {nearest} MiB copy (ms; x = times sendfile)",
                article_rows)

    def at(method: str) -> float:
        return next(r["time_ms"] for r in bench.rows if r["size_mb"] == nearest and r["method"] == method)

    ratios = {
        "stream_1b_vs_sendfile": at("stream 1 B") / at("sendfile"),
        "buffered_1b_vs_sendfile": at("buffered 1 B") / at("sendfile"),
        "read_write_64k_vs_sendfile": at("read+write 64 KiB") / at("sendfile"),
        "mmap_vs_sendfile": at("mmap") / at("sendfile"),
        "copy_file_range_vs_sendfile": at("copy_file_range") / at("sendfile"),
        "article_mmap_vs_sendfile": ARTICLE_MS["mmap"] / ARTICLE_MS["sendfile"],
        "article_buffered_vs_sendfile": ARTICLE_MS["buffered 1 B"] / ARTICLE_MS["sendfile"],
    }

    def chart(fig) -> None:
        left, right = fig.subplots(1, 2)
        for method in METHODS:
            chosen = [r for r in bench.rows if r["method"] == method]
            left.plot([r["size_mb"] for r in chosen], [r["mb_per_s"] for r in chosen], marker="o",
                      linestyle="--" if chosen[0]["extrapolated"] else "-", label=method)
        left.set_yscale("log")
        left.set_xlabel("file size (MiB)")
        left.set_ylabel("MB/s (dashed: extrapolated from a prefix)")
        left.set_title("copy throughput")
        left.legend(fontsize=7)
        names = [m for m in METHODS]
        x = range(len(names))
        right.bar([i - 0.2 for i in x], [ARTICLE_MS.get(m, float("nan")) / ARTICLE_MS["sendfile"] for m in names],
                  0.4, label="article 1.34 GB (JDK 11)")
        right.bar([i + 0.2 for i in x], [at(m) / at("sendfile") for m in names], 0.4,
                  label=f"today {nearest} MiB (CPython)")
        right.set_yscale("log")
        right.set_xticks(list(x), names, rotation=30, ha="right", fontsize=8)
        right.set_ylabel("time / sendfile time")
        right.set_title("relative to sendfile")
        right.legend(fontsize=7)
        fig.suptitle("copying a file four (six) ways", fontsize=11)

    return bench.finish(ratios=ratios, chart=chart,
                        extra={"sizes_mb": sizes_mb, "article_ms": ARTICLE_MS, "prefix_bytes": prefix_bytes},
                        columns=["size_mb", "method", "time_ms", "mb_per_s", "vs_sendfile", "extrapolated"])


if __name__ == "__main__":
    main()
