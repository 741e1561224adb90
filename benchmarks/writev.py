"""write() or writev()? One copied buffer + write vs gathered writes, to a file and to a TCP socket.

Reproduces "write() или writev()?" (seed 004, FreeBSD 4.3, 2001): NUM_ELEMS = 1000 separately allocated
buffers of ELEM_SIZE bytes, WRITES_COUNT = 100 rounds, each round one ``iov_write`` (writev of the 1000
buffers) and one ``buf_write`` (memcpy every buffer into one array, then one write), user + system time
per call from gprof. The article: writev wins from about 200 bytes per element, write wins below.

Here, in CPython, for ELEM_SIZE from 1 to 1000 (the article's rows) and on to 64 KiB:

- ``join+write``: ``b"".join(buffers)`` (the memcpy loop, done in C) then one ``os.write`` /
  ``sock.sendall``;
- ``copy-loop+write``: a Python loop assigning each buffer into a preallocated bytearray (the article's
  loop written literally; shows what per-element interpreter work costs), then one write;
- ``writev``: ``os.writev(fd, buffers)`` / ``sock.sendmsg(buffers)`` (1000 <= IOV_MAX 1024).

Rounds interleave the methods as the article's loop does. The file target rewinds to offset 0 whenever
it would pass 256 MiB, so the page cache, not the disk, is measured; the socket target is TCP loopback
to a forked receiver draining into a 1 MiB buffer. Per call the sender's thread CPU time (user + system,
as the article summed) and wall time are recorded; rows hold medians.

``crossover_bytes`` (JSON, per target): the smallest ELEM_SIZE from which writev's CPU per call stays
below join+write's for every larger size measured — above it, gathering beats copying. None when
writev never wins. Rounds per size shrink for big elements so one size moves at most ~1 GiB per method.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import statistics
import time
from functools import partial
from typing import Any

from benchmarks._harness import Benchmark

NUM_ELEMS = 1000
WRITES_COUNT = 100
ARTICLE_SIZES = (1, 3, 5, 10, 50, 100, 200, 300, 500, 1000)
BEYOND_SIZES = (2048, 4096, 8192, 16384, 32768, 65536)
# The article's table: ELEM_SIZE -> (iov_write ms, buf_write ms) per call.
ARTICLE_TABLE = {
    1000: (1.59, 2.34), 500: (0.96, 1.27), 300: (0.55, 0.76), 200: (0.38, 0.50), 100: (0.23, 0.21),
    50: (0.10, 0.09), 10: (0.03, 0.02), 5: (0.04, 0.02), 3: (0.03, 0.02), 1: (0.03, 0.02),
}

METHODS = ("join+write", "copy-loop+write", "writev")
TARGETS = ("file", "socket")
_FILE_WRAP_BYTES = 256 << 20
_BYTES_PER_SIZE_MAX = 1 << 30


def _drain(listener: socket.socket) -> None:
    """Forked receiver: read everything until EOF, then acknowledge with one byte."""
    conn, _ = listener.accept()
    buffer = bytearray(1 << 20)
    with conn:
        while conn.recv_into(buffer):
            pass
        conn.sendall(b"k")


def _sendmsg_all(sock: socket.socket, buffers: list[bytes], total: int) -> None:
    """sendmsg until every byte is out; a blocking TCP send is normally whole, partial sends are handled."""
    sent = sock.sendmsg(buffers)
    if sent == total:
        return
    view = memoryview(b"".join(buffers))  # rare path: finish the remainder simply
    sock.sendall(view[sent:])


class _Writer:
    """One target (file or socket) and the three ways to write NUM_ELEMS buffers to it."""

    def __init__(self, target: str, fd: int, sock: socket.socket | None):
        self.target = target
        self.fd = fd
        self.sock = sock
        self.file_offset = 0

    def _rewind_if_needed(self, total: int) -> None:
        if self.target == "file":
            if self.file_offset + total > _FILE_WRAP_BYTES:
                os.lseek(self.fd, 0, os.SEEK_SET)
                self.file_offset = 0
            self.file_offset += total

    def write_one(self, data: bytes) -> None:
        if self.sock is not None:
            self.sock.sendall(data)
        else:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view):]

    def join_write(self, buffers: list[bytes], total: int) -> None:
        self._rewind_if_needed(total)
        self.write_one(b"".join(buffers))

    def copy_loop_write(self, buffers: list[bytes], total: int, scratch: bytearray) -> None:
        self._rewind_if_needed(total)
        view = memoryview(scratch)
        position = 0
        for buffer in buffers:
            end = position + len(buffer)
            view[position:end] = buffer
            position = end
        if self.sock is not None:
            self.sock.sendall(view[:total])
        else:
            out = view[:total]
            while out:
                out = out[os.write(self.fd, out):]

    def gathered_write(self, buffers: list[bytes], total: int) -> None:
        self._rewind_if_needed(total)
        if self.sock is not None:
            _sendmsg_all(self.sock, buffers, total)
            return
        written = os.writev(self.fd, buffers)
        if written != total:  # a regular file writes whole unless the disk is full
            self.write_one(b"".join(buffers)[written:])


def _crossover(rows: list[dict[str, Any]], target: str) -> int | None:
    """Smallest size from which writev's CPU per call stays below join+write's for all larger sizes."""
    by_size: dict[int, dict[str, float]] = {}
    for row in rows:
        if row["target"] == target:
            by_size.setdefault(row["elem_size"], {})[row["method"]] = row["cpu_us_per_call"]
    crossover = None
    for size in sorted(by_size, reverse=True):
        methods = by_size[size]
        if methods["writev"] < methods["join+write"]:
            crossover = size
        else:
            break
    return crossover


def main(argv=None) -> dict[str, Any]:
    bench = Benchmark("writev", "one buffer + write vs writev/sendmsg, 1000 buffers x ELEM_SIZE (file, socket)",
                      argv)
    num_elems = bench.pick(full=NUM_ELEMS, quick=NUM_ELEMS, tiny=100)
    writes_count = bench.pick(full=WRITES_COUNT, quick=40, tiny=3)
    sizes = bench.pick(full=list(ARTICLE_SIZES + BEYOND_SIZES),
                       quick=[1, 10, 50, 100, 200, 500, 1000, 2048, 4096, 16384, 65536],
                       tiny=[1, 100, 1000, 4096])
    bytes_cap = bench.pick(full=_BYTES_PER_SIZE_MAX, quick=_BYTES_PER_SIZE_MAX // 4, tiny=1 << 24)
    disk = bench.disk_scale(_FILE_WRAP_BYTES, what="the write target file")
    if disk < 1.0:
        raise SystemExit("not enough free disk for a 256 MiB target file")

    rounds_for = {s: max(3, min(writes_count, bytes_cap // (num_elems * s))) for s in sizes}
    trimmed = [s for s in sizes if rounds_for[s] < writes_count]
    if trimmed:
        bench.note(f"rounds per size capped at ~{bytes_cap >> 20} MiB per method: sizes "
                   f"{', '.join(str(s) for s in trimmed)} ran {min(rounds_for[s] for s in trimmed)}-"
                   f"{max(rounds_for[s] for s in trimmed)} rounds instead of {writes_count}")
    bench.note("file target rewinds to offset 0 every 256 MiB: page-cache writes, as the article's small "
               "files were; CPU = sender thread user+system time per call (the article summed both)")

    samples: dict[tuple[str, int, str], list[tuple[float, float]]] = {}
    ctx = multiprocessing.get_context("fork")
    total_calls = sum(rounds_for[s] for s in sizes) * len(METHODS) * len(TARGETS)
    with bench.scratch_dir() as scratch, bench.progress(total_calls, "calls") as bar:
        for target in TARGETS:
            sock = None
            receiver = None
            fd = -1
            listener = None
            if target == "file":
                fd = os.open(scratch / "test_write", os.O_RDWR | os.O_TRUNC | os.O_CREAT, 0o644)
            else:
                listener = socket.create_server(("127.0.0.1", 0))
                receiver = ctx.Process(target=_drain, args=(listener,), daemon=True)
                receiver.start()
                sock = socket.create_connection(listener.getsockname())
            writer = _Writer(target, fd, sock)
            try:
                for size in sizes:
                    bar.describe(f"{target} {size} B")
                    # Separate allocations, like the article's malloc per element; non-zero contents.
                    buffers = [bytes([i % 251 + 1]) * size for i in range(num_elems)]
                    total = num_elems * size
                    scratch_buffer = bytearray(total)
                    calls = {
                        "join+write": partial(writer.join_write, buffers, total),
                        "copy-loop+write": partial(writer.copy_loop_write, buffers, total, scratch_buffer),
                        "writev": partial(writer.gathered_write, buffers, total),
                    }
                    for _ in range(rounds_for[size]):
                        for method in METHODS:
                            call = calls[method]
                            cpu_start = time.thread_time_ns()
                            wall_start = time.perf_counter_ns()
                            call()
                            wall_ns = time.perf_counter_ns() - wall_start
                            cpu_ns = time.thread_time_ns() - cpu_start
                            samples.setdefault((target, size, method), []).append((cpu_ns, wall_ns))
                            bar.advance(1)
            finally:
                if sock is not None:
                    sock.shutdown(socket.SHUT_WR)
                    sock.recv(1)
                    sock.close()
                if receiver is not None:
                    receiver.join(10)
                    if receiver.is_alive():
                        receiver.kill()
                if listener is not None:
                    listener.close()
                if fd >= 0:
                    os.close(fd)

    for target in TARGETS:
        for size in sizes:
            join_cpu = statistics.median(c for c, _ in samples[(target, size, "join+write")])
            for method in METHODS:
                runs = samples[(target, size, method)]
                cpu_ns = statistics.median(c for c, _ in runs)
                wall_ns = statistics.median(w for _, w in runs)
                bench.row(target=target, elem_size=size, method=method, rounds=len(runs),
                          cpu_us_per_call=cpu_ns / 1e3, wall_us_per_call=wall_ns / 1e3,
                          mb_per_s=num_elems * size / (wall_ns / 1e9) / 1e6,
                          cpu_vs_join=cpu_ns / join_cpu if join_cpu else None)

    crossover = {target: _crossover(bench.rows, target) for target in TARGETS}

    def cpu_ms(target: str, size: int, method: str) -> float:
        return next(r["cpu_us_per_call"] for r in bench.rows
                    if r["target"] == target and r["elem_size"] == size and r["method"] == method) / 1e3

    article_rows = []
    for size in sizes:
        article = ARTICLE_TABLE.get(size)
        article_rows.append({
            "elem_size": size,
            "article_iov_ms": article[0] if article else None,
            "article_buf_ms": article[1] if article else None,
            "article_winner": (("writev" if article[0] < article[1] else "write") if article else None),
            "file_writev_ms": cpu_ms("file", size, "writev"),
            "file_join_ms": cpu_ms("file", size, "join+write"),
            "file_winner": "writev" if cpu_ms("file", size, "writev") < cpu_ms("file", size, "join+write")
            else "write",
            "socket_sendmsg_ms": cpu_ms("socket", size, "writev"),
            "socket_join_ms": cpu_ms("socket", size, "join+write"),
            "socket_winner": "writev" if cpu_ms("socket", size, "writev") < cpu_ms("socket", size, "join+write")
            else "write",
        })
    bench.table(f"The article's table (ms per call, {NUM_ELEMS} elements) beside today's "
                f"({num_elems} elements, CPU ms per call, median)", article_rows)
    bench.table("Crossover: ELEM_SIZE from which writev beats one joined write (article: ~200 B)",
                [{"target": t, "crossover_bytes": crossover[t]} for t in TARGETS])

    ratios = {}
    for target in TARGETS:
        for size in (min(sizes), 1000 if 1000 in sizes else sizes[len(sizes) // 2], max(sizes)):
            ratios[f"{target}_writev_cpu_vs_join_at_{size}B"] = (
                cpu_ms(target, size, "writev") / cpu_ms(target, size, "join+write"))

    def chart(fig) -> None:
        axes = fig.subplots(1, 2, sharey=False)
        colors = {"join+write": "tab:blue", "copy-loop+write": "tab:gray", "writev": "tab:green"}
        for ax, target in zip(axes, TARGETS, strict=True):
            for method in METHODS:
                chosen = [r for r in bench.rows if r["target"] == target and r["method"] == method]
                ax.plot([r["elem_size"] for r in chosen], [r["cpu_us_per_call"] / 1e3 for r in chosen],
                        marker="o", color=colors[method],
                        label=method if target == "file" else method.replace("writev", "sendmsg")
                        .replace("+write", "+sendall"))
            if target == "file":
                known = [s for s in sizes if s in ARTICLE_TABLE]
                ax.plot(known, [ARTICLE_TABLE[s][0] for s in known], ":", marker="x", color="tab:green",
                        alpha=0.6, label="article: iov_write (2001)")
                ax.plot(known, [ARTICLE_TABLE[s][1] for s in known], ":", marker="x", color="tab:blue",
                        alpha=0.6, label="article: buf_write (2001)")
            if crossover[target] is not None:
                ax.axvline(crossover[target], color="0.5", linestyle="--",
                           label=f"crossover {crossover[target]} B")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("ELEM_SIZE (bytes)")
            ax.set_ylabel(f"CPU ms per call ({num_elems} buffers)")
            ax.set_title(f"to a {'file' if target == 'file' else 'TCP socket'}")
            ax.legend(fontsize=7)
        fig.suptitle("write() or writev()? one copied buffer vs gathered buffers", fontsize=11)

    return bench.finish(
        ratios=ratios, chart=chart,
        extra={"crossover_bytes": crossover, "num_elems": num_elems, "writes_count": writes_count,
               "sizes": sizes, "article_table": ARTICLE_TABLE},
        columns=["target", "elem_size", "method", "rounds", "cpu_us_per_call", "wall_us_per_call", "mb_per_s",
                 "cpu_vs_join"])


if __name__ == "__main__":
    main()
