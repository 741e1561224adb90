"""Zero copy over TCP: a file sent the traditional way (read 4 KiB + send) vs os.sendfile.

Reproduces Table 1 of IBM developerWorks' "Efficient data transfer through zero copy" (seeds 000, and the
translation 002 with its own table): a client sends a file to a server over a socket, either with
``File.read()`` + ``Socket.send()`` through a 4 KiB user buffer (TraditionalClient) or with
``FileChannel.transferTo()``, which is sendfile(2) on Linux. The article reports transferTo taking about
65% less time for 7 MB .. 1 GB files on a Linux 2.6 kernel.

Here, over TCP loopback on this machine:

- the sender is this process; the receiver is a forked process that reads the socket into a user buffer
  (4 KiB like the article's TraditionalServer, and 256 KiB, a receiver that is not syscall-bound);
- one page-cached file of the largest size is written once and every size sends its first N bytes
  (so the figures are CPU and memory-bandwidth figures, not disk ones, as the article's repeat runs were);
- a transfer is timed from connect until the receiver acknowledges the last byte (after EOF);
- methods: ``read+send 4 KiB`` (the article's TraditionalClient), ``read+send 256 KiB`` (what a careful
  copying server does), ``mmap+send`` (the file mapped, the map sent: one CPU copy, no user buffer — seed
  001's "mmap + write"), ``sendfile`` (transferTo). Each (size, receiver, method) runs ``repeats`` times,
  interleaved, and the median is reported;
- CPU seconds per GB transferred are reported for the sender and the receiver separately, from
  ``time.thread_time`` in each process. On 2 cores the wall clock is bounded by the receiver's copy out of
  the socket, which is the same for every method; the sender's CPU is where zero copy shows.

JSON rows: ``size_mb, receiver_buffer, method, time_ms, mb_per_s, sender_cpu_s_per_gb,
receiver_cpu_s_per_gb, saved_pct`` (time saved vs read+send 4 KiB at the same size and receiver).
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import socket
import statistics
import struct
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import Benchmark

MIB = 1 << 20

# The article's Table 1 (ms): file size -> (traditional, transferTo).
ARTICLE_TABLE_1 = {
    7: (156, 45), 21: (337, 128), 63: (843, 387), 98: (1320, 617),
    200: (2124, 1150), 350: (3631, 1762), 700: (13498, 4422), 1024: (18399, 8537),
}
# The translation's own table (seed 002; JDK 8, kernel 4.14): file size MB -> (traditional, nio) ms.
ARTICLE_002_TABLE = {12: (50, 18), 221: (690, 314), 2560: (15496, 2610)}

METHODS = ("read+send 4 KiB", "read+send 256 KiB", "mmap+send", "sendfile")
TRADITIONAL = METHODS[0]
RECEIVER_BUFFERS = (4096, 256 * 1024)

# sendfile(2) transfers at most 0x7ffff000 bytes per call (man 2 sendfile); larger files need a loop.
_SENDFILE_MAX_BYTES = 0x7FFFF000
_RESULT = struct.Struct("!QQ")  # receiver -> sender after EOF: bytes received, receiver thread CPU ns


def _receiver(listener: socket.socket, buffer_bytes: int, transfers: int, results) -> None:
    """Forked receiver: for each connection read to EOF into one reusable buffer, then report.

    The acknowledgement (bytes, CPU ns) goes back over the same socket so the sender's clock stops only
    when the last byte has been copied out of the socket by the receiver.
    """
    buffer = bytearray(buffer_bytes)
    view = memoryview(buffer)
    for _ in range(transfers):
        conn, _ = listener.accept()
        with conn:
            cpu_start = time.thread_time_ns()
            received = 0
            recv_into = conn.recv_into
            while True:
                n = recv_into(view, buffer_bytes)
                if n == 0:
                    break
                received += n
            cpu_ns = time.thread_time_ns() - cpu_start
            conn.sendall(_RESULT.pack(received, cpu_ns))
    results.send("done")


def _send_traditional(sock: socket.socket, fd: int, length: int, buffer_bytes: int) -> None:
    buffer = bytearray(buffer_bytes)
    view = memoryview(buffer)
    readinto = os.readv
    remaining = length
    os.lseek(fd, 0, os.SEEK_SET)
    while remaining:
        n = readinto(fd, [view[:min(buffer_bytes, remaining)]])
        if n == 0:
            raise EOFError("file shorter than expected")
        sock.sendall(view[:n])
        remaining -= n


def _send_sendfile(sock: socket.socket, fd: int, length: int) -> None:
    offset = 0
    out_fd = sock.fileno()
    while offset < length:
        sent = os.sendfile(out_fd, fd, offset, min(length - offset, _SENDFILE_MAX_BYTES))
        if sent == 0:
            raise EOFError("file shorter than expected")
        offset += sent


def _send_mmap(sock: socket.socket, mapped: mmap.mmap, length: int) -> None:
    # One CPU copy (page cache -> socket buffer) and no user-space buffer: the article-001 "mmap + write".
    with memoryview(mapped) as view:
        sock.sendall(view[:length])


def _transfer(address, fd: int, length: int, method: str, mapped: mmap.mmap) -> tuple[float, float, int, float]:
    """One transfer: returns (wall s, sender thread CPU s, bytes received, receiver CPU s)."""
    started = time.perf_counter()
    cpu_start = time.thread_time()
    with socket.create_connection(address) as sock:
        if method == "sendfile":
            _send_sendfile(sock, fd, length)
        elif method == "mmap+send":
            _send_mmap(sock, mapped, length)
        else:
            _send_traditional(sock, fd, length, 4096 if "4 KiB" in method else 256 * 1024)
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        while len(reply) < _RESULT.size:
            chunk = sock.recv(_RESULT.size - len(reply))
            if not chunk:
                raise ConnectionError("receiver closed without acknowledging")
            reply += chunk
    wall = time.perf_counter() - started
    sender_cpu = time.thread_time() - cpu_start
    received, receiver_cpu_ns = _RESULT.unpack(reply)
    return wall, sender_cpu, received, receiver_cpu_ns / 1e9


def _write_file(path: Path, size: int, bar) -> None:
    """Non-constant data (a repeated 1 MiB random block), so nothing downstream can shortcut zeros."""
    block = os.urandom(MIB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        written = 0
        while written < size:
            n = os.write(fd, block[: min(MIB, size - written)])
            written += n
            bar.advance(n)
    finally:
        os.close(fd)


def main(argv=None) -> dict[str, Any]:
    bench = Benchmark("zero_copy", "file -> TCP loopback: read 4 KiB + send vs os.sendfile (IBM Table 1)",
                      argv)
    sizes_mb = bench.pick(full=[7, 12, 21, 63, 98, 200, 221, 350, 700, 1024], quick=[7, 21, 63, 98],
                          tiny=[1, 2])
    repeats = bench.pick(full=3, quick=2, tiny=1)
    largest = max(sizes_mb) * MIB
    scale = bench.disk_scale(largest, what="the transfer file")
    if scale < 1.0:
        limit_mb = max(1, int(max(sizes_mb) * scale))
        sizes_mb = sorted({min(s, limit_mb) for s in sizes_mb})
        largest = max(sizes_mb) * MIB
    bench.note("the file is in the page cache (written just before): times are CPU and memory figures, "
               "as the article's repeated runs were; the disk is not measured")
    bench.note("sizes are MiB (2^20 bytes), as the articles' MB most likely were; MB/s are 10^6 bytes per second")
    bench.note("the 2.5 GB row of the translation's table (002) is not run: beyond the 7 MB .. 1 GB range")

    ctx = multiprocessing.get_context("fork")
    with bench.scratch_dir() as scratch:
        path = scratch / "transfer.bin"
        with bench.progress(largest, "bytes", label="writing the file") as bar:
            _write_file(path, largest, bar)
        fd = os.open(path, os.O_RDONLY)
        mapped = mmap.mmap(fd, largest, prot=mmap.PROT_READ)
        try:
            samples: dict[tuple[int, int, str], list[tuple[float, float, float]]] = {}
            total = sum(sizes_mb) * MIB * len(METHODS) * len(RECEIVER_BUFFERS) * repeats
            with bench.progress(total / MIB, "MiB sent", label="transfers") as bar:
                for receiver_buffer in RECEIVER_BUFFERS:
                    listener = socket.create_server(("127.0.0.1", 0), backlog=8)
                    transfers = len(sizes_mb) * len(METHODS) * repeats
                    parent_end, child_end = ctx.Pipe()
                    receiver = ctx.Process(target=_receiver,
                                           args=(listener, receiver_buffer, transfers, child_end),
                                           daemon=True)
                    receiver.start()
                    try:
                        address = listener.getsockname()
                        for size_mb in sizes_mb:
                            length = size_mb * MIB
                            for _ in range(repeats):
                                for method in METHODS:  # interleaved: noise from others hits all methods
                                    wall, sender_cpu, received, receiver_cpu = _transfer(
                                        address, fd, length, method, mapped)
                                    if received != length:
                                        raise AssertionError(f"{method}: receiver got {received} of {length}")
                                    samples.setdefault((size_mb, receiver_buffer, method), []).append(
                                        (wall, sender_cpu, receiver_cpu))
                                    bar.advance(size_mb)
                        if not parent_end.poll(30):
                            raise RuntimeError("receiver did not finish")
                        parent_end.recv()
                    finally:
                        receiver.join(10)
                        if receiver.is_alive():
                            receiver.kill()
                        listener.close()
        finally:
            mapped.close()
            os.close(fd)

    for receiver_buffer in RECEIVER_BUFFERS:
        for size_mb in sizes_mb:
            base_ms = None
            for method in METHODS:
                runs = samples[(size_mb, receiver_buffer, method)]
                wall = statistics.median(r[0] for r in runs)
                gb = size_mb * MIB / 1e9
                time_ms = wall * 1000
                if method == TRADITIONAL:
                    base_ms = time_ms
                bench.row(size_mb=size_mb, receiver_buffer=f"{receiver_buffer // 1024} KiB", method=method,
                          time_ms=time_ms, mb_per_s=size_mb * MIB / 1e6 / wall,
                          sender_cpu_s_per_gb=statistics.median(r[1] for r in runs) / gb,
                          receiver_cpu_s_per_gb=statistics.median(r[2] for r in runs) / gb,
                          saved_pct=None if method == TRADITIONAL else 100 * (1 - time_ms / base_ms))

    def find(size_mb: int, receiver: str, method: str) -> dict[str, Any]:
        return next(r for r in bench.rows
                    if r["size_mb"] == size_mb and r["receiver_buffer"] == receiver and r["method"] == method)

    article_rows = []
    for size_mb in sizes_mb:
        traditional = find(size_mb, "4 KiB", TRADITIONAL)
        zero = find(size_mb, "4 KiB", "sendfile")
        zero_256 = find(size_mb, "256 KiB", "sendfile")
        trad_256 = find(size_mb, "256 KiB", TRADITIONAL)
        article = ARTICLE_TABLE_1.get(size_mb) or ARTICLE_002_TABLE.get(size_mb)
        article_rows.append({
            "size_mb": size_mb,
            "article_traditional_ms": article[0] if article else None,
            "article_transferTo_ms": article[1] if article else None,
            "article_saved_pct": 100 * (1 - article[1] / article[0]) if article else None,
            "today_traditional_ms": traditional["time_ms"],
            "today_sendfile_ms": zero["time_ms"],
            "today_saved_pct": zero["saved_pct"],
            "today_saved_pct_rx256k": 100 * (1 - zero_256["time_ms"] / trad_256["time_ms"]),
        })
    bench.table("Article Table 1 (and 002's 12/221 MB rows) beside today's; today = 4 KiB receiver "
                "like the article's server, last column with a 256 KiB receiver", article_rows)

    # CPU per GB aggregated over every size: total CPU / total bytes, per method and receiver.
    cpu_rows = []
    for receiver_buffer in RECEIVER_BUFFERS:
        label = f"{receiver_buffer // 1024} KiB"
        for method in METHODS:
            chosen = [r for r in bench.rows if r["receiver_buffer"] == label and r["method"] == method]
            weights = [r["size_mb"] for r in chosen]
            cpu_rows.append({
                "receiver_buffer": label, "method": method,
                "sender_cpu_s_per_gb":
                    sum(r["sender_cpu_s_per_gb"] * w for r, w in zip(chosen, weights, strict=True)) / sum(weights),
                "receiver_cpu_s_per_gb":
                    sum(r["receiver_cpu_s_per_gb"] * w for r, w in zip(chosen, weights, strict=True)) / sum(weights),
                "mb_per_s": sum(r["size_mb"] for r in chosen) * MIB / 1e6
                / (sum(r["time_ms"] for r in chosen) / 1000),
            })
    bench.table("CPU seconds per GB, sender and receiver (all sizes pooled)", cpu_rows)

    def pooled(receiver: str, method: str, key: str) -> float:
        return next(r[key] for r in cpu_rows if r["receiver_buffer"] == receiver and r["method"] == method)

    saved_4k = [r["today_saved_pct"] for r in article_rows]
    article_saved = [r["article_saved_pct"] for r in article_rows if r["article_saved_pct"] is not None]
    ratios = {
        "time_saved_pct_median_rx4k": statistics.median(saved_4k),
        "time_saved_pct_median_rx256k": statistics.median(r["today_saved_pct_rx256k"] for r in article_rows),
        "article_time_saved_pct_median": statistics.median(article_saved) if article_saved else None,
        "sender_cpu_sendfile_vs_read4k": pooled("256 KiB", "sendfile", "sender_cpu_s_per_gb")
        / pooled("256 KiB", TRADITIONAL, "sender_cpu_s_per_gb"),
        "sender_cpu_sendfile_vs_read256k": pooled("256 KiB", "sendfile", "sender_cpu_s_per_gb")
        / pooled("256 KiB", "read+send 256 KiB", "sender_cpu_s_per_gb"),
        "sender_cpu_sendfile_vs_mmap": pooled("256 KiB", "sendfile", "sender_cpu_s_per_gb")
        / pooled("256 KiB", "mmap+send", "sender_cpu_s_per_gb"),
        "throughput_sendfile_vs_read4k_rx256k": pooled("256 KiB", "sendfile", "mb_per_s")
        / pooled("256 KiB", TRADITIONAL, "mb_per_s"),
    }

    def chart(fig) -> None:
        left, right = fig.subplots(1, 2)
        styles = {RECEIVER_BUFFERS[0]: "-", RECEIVER_BUFFERS[1]: "--"}
        colors = {METHODS[0]: "tab:red", METHODS[1]: "tab:orange", METHODS[2]: "tab:blue", METHODS[3]: "tab:green"}
        for receiver_buffer in RECEIVER_BUFFERS:
            label = f"{receiver_buffer // 1024} KiB"
            for method in METHODS:
                chosen = [r for r in bench.rows if r["receiver_buffer"] == label and r["method"] == method]
                left.plot([r["size_mb"] for r in chosen], [r["time_ms"] for r in chosen],
                          styles[receiver_buffer], marker="o", color=colors[method],
                          label=f"{method} (receiver {label})")
        known = [s for s in sizes_mb if s in ARTICLE_TABLE_1]
        if known:
            left.plot(known, [ARTICLE_TABLE_1[s][0] for s in known], ":", marker="x", color="0.3",
                      label="article: traditional")
            left.plot(known, [ARTICLE_TABLE_1[s][1] for s in known], ":", marker="+", color="0.6",
                      label="article: transferTo")
        left.set_xscale("log")
        left.set_yscale("log")
        left.set_xlabel("file size (MiB)")
        left.set_ylabel("transfer time (ms, median)")
        left.set_title("time per transfer")
        left.legend(fontsize=7)
        labels = [f"{r['method']}\nrx {r['receiver_buffer']}" for r in cpu_rows]
        x = range(len(cpu_rows))
        right.bar([i - 0.2 for i in x], [r["sender_cpu_s_per_gb"] for r in cpu_rows], 0.4, label="sender")
        right.bar([i + 0.2 for i in x], [r["receiver_cpu_s_per_gb"] for r in cpu_rows], 0.4, label="receiver")
        right.set_xticks(list(x), labels, fontsize=7, rotation=30, ha="right")
        right.set_ylabel("CPU seconds per GB")
        right.set_title("CPU per GB (sizes pooled)")
        right.legend(fontsize=8)
        fig.suptitle("zero copy: read+send vs sendfile over TCP loopback", fontsize=11)

    return bench.finish(
        ratios=ratios, chart=chart,
        extra={"sizes_mb": sizes_mb, "repeats": repeats, "methods": list(METHODS),
               "receiver_buffers": list(RECEIVER_BUFFERS), "article_table_1": ARTICLE_TABLE_1,
               "article_002_table": ARTICLE_002_TABLE},
        columns=["size_mb", "receiver_buffer", "method", "time_ms", "mb_per_s", "sender_cpu_s_per_gb",
                 "receiver_cpu_s_per_gb", "saved_pct"])


if __name__ == "__main__":
    main()
