"""Many connections: do 10,000 idle clients slow the active ones down? (copyless broker, real protocol)

The pollset article (seed 003) showed poll() paying for every registered descriptor on every call, busy or
not, while pollset/epoll report only the ready ones. copyless multiplexes its connections with epoll through
uvloop (or asyncio's epoll selector), so a broker holding N idle Kafka connections should serve its active
clients exactly as fast as one holding none. This benchmark checks that claim end to end on the broker
itself, not on a toy server.

Design: two ``copyless serve`` subprocesses per event loop, started alike (RLIMIT_NOFILE raised to its hard
limit first; they inherit it). The *control* broker never has an idle connection; the *loaded* broker is
given N = 1,000 then 10,000 idle connections (each connected and did one ApiVersions round trip, so the
broker holds a live connection object for it, then stays silent). For each N a fixed set of active clients
(each a closed loop of one request at a time on its own connection) alternates between the two brokers in
short windows, control-loaded then loaded-control, for several rounds. Workloads: ``api_versions``
(ApiVersions v0: pure per-request overhead) and ``produce`` (Produce v3, acks=1, one 100-byte record per
batch: the write path through the log). This machine is shared and its speed shifts by tens of percent
from one second to the next (other tenants, CPU frequency); windows a fraction of a second apart see the
same conditions, so the per-round ratio loaded/control cancels the drift that sequential runs suffer.

Rows, per loop, workload, N and broker: ``requests_per_s, p50_us, p99_us, broker_cpu_us_per_request``
pooled over the rounds, and for the loaded broker ``vs_control`` = the median over rounds of its window's
requests/s divided by the adjacent control window's. The claim holds when ``vs_control`` at 10,000 idle is
about 1.0 (within the round-to-round spread, also reported as min..max), with broker CPU per request flat.

The load generator is this process (asyncio on uvloop when installed; idle sockets are never registered
with its loop, so they cost it nothing); it shares the two cores with the brokers.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import Benchmark, cpu_seconds, percentile
from copyless.protocol.records import crc32c, encode_varint

WORKLOADS = ("api_versions", "produce")
LOOPS = ("uvloop", "asyncio")
_LINGER_RESET = struct.pack("ii", 1, 0)  # close with RST: 10,000 closes leave no TIME_WAIT pile-up
_ADDRESS_RE = re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}):(\d{1,5})\b")
_STARTUP_TIMEOUT_S = 60.0
_CONNECT_BATCH = 100  # below the listen backlog, so no SYN is dropped and retried a second later


# -- Kafka requests, encoded by hand (header v1; ApiVersions v0, Metadata v1, Produce v3) -------------------


def _request(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    payload = struct.pack(">hhih", api_key, version, correlation_id, 5) + b"bench" + body
    return struct.pack(">i", len(payload)) + payload


def _api_versions(correlation_id: int) -> bytes:
    return _request(18, 0, correlation_id, b"")


def _metadata(correlation_id: int, topic: str) -> bytes:
    name = topic.encode()
    return _request(3, 1, correlation_id, struct.pack(">ih", 1, len(name)) + name)


def _record_batch(value: bytes) -> bytes:
    """One uncompressed v2 batch of one record, built by hand so the load generator stays a few syscalls."""
    # attributes, timestamp delta, offset delta, key length -1 (null), value, no headers
    record = (b"\x00" + encode_varint(0) + encode_varint(0) + encode_varint(-1)
              + encode_varint(len(value)) + value + encode_varint(0))
    records = encode_varint(len(record)) + record
    now = int(time.time() * 1000)
    tail = struct.pack(">hiqqqhii", 0, 0, now, now, -1, -1, -1, 1) + records
    return struct.pack(">qiibI", 0, 9 + len(tail), -1, 2, crc32c(tail)) + tail


def _produce(correlation_id: int, topic: str, batch: bytes) -> bytes:
    name = topic.encode()
    body = struct.pack(">hhi", -1, 1, 10000) + struct.pack(">ih", 1, len(name)) + name
    body += struct.pack(">iii", 1, 0, len(batch)) + batch
    return _request(0, 3, correlation_id, body)


def _produce_error(body: bytes) -> int:
    # responses[1]: name, partitions[1]: index, error_code, ...
    (name_len,) = struct.unpack_from(">h", body, 4)
    (error,) = struct.unpack_from(">h", body, 6 + name_len + 4 + 4)
    return error


# -- the broker subprocess -----------------------------------------------------------------------------------


class BrokerProcess:
    def __init__(self, data_dir: Path, loop: str):
        self.data_dir = data_dir
        self.loop = loop
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = data_dir.parent / f"broker-{loop}.log"
        config = data_dir.parent / f"broker-{loop}.toml"
        config.write_text('"log.segment.bytes" = 67108864\n"stats.interval.s" = 0\n')
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "copyless.broker", "serve", "--data-dir", str(data_dir),
                 "--listen", "127.0.0.1:0", "--loop", loop, "--config", str(config)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            )
        self.host, self.port = self._wait_for_address()

    def _wait_for_address(self) -> tuple[str, int]:
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            for line in text.splitlines():
                match = _ADDRESS_RE.search(line)
                if match and int(match.group(2)) != 0:
                    return match.group(1), int(match.group(2))
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"copyless serve did not report its address:\n{self.log_path.read_text()[-4000:]}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# -- idle and active clients ---------------------------------------------------------------------------------


async def _read_frame(loop, sock: socket.socket, buffer: bytearray) -> bytes:
    while True:
        if len(buffer) >= 4:
            (size,) = struct.unpack_from(">i", buffer)
            if len(buffer) >= 4 + size:
                frame = bytes(buffer[4 : 4 + size])
                del buffer[: 4 + size]
                return frame
        chunk = await loop.sock_recv(sock, 65536)
        if not chunk:
            raise ConnectionError("broker closed the connection")
        buffer += chunk


async def _open_idle(address, count: int, into: list[socket.socket]) -> None:
    """Open ``count`` connections, each doing one ApiVersions round trip, then leave them silent."""
    loop = asyncio.get_running_loop()

    async def one() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        await loop.sock_connect(sock, address)
        await loop.sock_sendall(sock, _api_versions(1))
        await _read_frame(loop, sock, bytearray())
        return sock

    remaining = count
    while remaining:
        batch = min(_CONNECT_BATCH, remaining)
        into.extend(await asyncio.gather(*(one() for _ in range(batch))))
        remaining -= batch


def _close_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        except OSError:
            pass
        sock.close()
    sockets.clear()


async def _active_window(address, workload: str, clients: int, window_s: float, topic: str) -> list[float]:
    """Run ``clients`` closed-loop clients for ``window_s``; returns every request's latency in seconds."""
    loop = asyncio.get_running_loop()
    batch = _record_batch(b"x" * 100)
    latencies: list[float] = []
    stop_at = time.perf_counter() + window_s

    async def client() -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await loop.sock_connect(sock, address)
        buffer = bytearray()
        correlation_id = 0
        try:
            while True:
                correlation_id += 1
                if workload == "api_versions":
                    frame = _api_versions(correlation_id)
                else:
                    frame = _produce(correlation_id, topic, batch)
                started = time.perf_counter()
                if started >= stop_at:
                    return
                await loop.sock_sendall(sock, frame)
                response = await _read_frame(loop, sock, buffer)
                latencies.append(time.perf_counter() - started)
                (got_id,) = struct.unpack_from(">i", response)
                if got_id != correlation_id:
                    raise RuntimeError(f"correlation id {got_id}, expected {correlation_id}")
                if workload == "produce" and _produce_error(response[4:]):
                    raise RuntimeError(f"produce failed with error {_produce_error(response[4:])}")
        finally:
            sock.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies


async def _create_topic(address, topic: str) -> None:
    """Metadata for the topic until it is there (auto-create), so the produce windows measure appends."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    await loop.sock_connect(sock, address)
    try:
        for attempt in range(50):
            await loop.sock_sendall(sock, _produce(attempt, topic, _record_batch(b"warm")))
            response = await _read_frame(loop, sock, bytearray())
            if _produce_error(response[4:]) == 0:
                return
            await loop.sock_sendall(sock, _metadata(1000 + attempt, topic))
            await _read_frame(loop, sock, bytearray())
            await asyncio.sleep(0.1)
    finally:
        sock.close()
    raise RuntimeError(f"topic {topic} could not be produced to")


def _raise_nofile(wanted: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft if soft != resource.RLIM_INFINITY else wanted


def _new_event_loop() -> asyncio.AbstractEventLoop:
    if importlib.util.find_spec("uvloop") is not None:
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


# -- main ----------------------------------------------------------------------------------------------------


def _measure(event_loop, broker: BrokerProcess, workload: str, active: int, window_s: float,
             topic: str) -> dict[str, Any]:
    cpu_before = cpu_seconds(broker.pid)
    started = time.perf_counter()
    latencies = event_loop.run_until_complete(
        _active_window((broker.host, broker.port), workload, active, window_s, topic))
    elapsed = time.perf_counter() - started
    return {"requests": len(latencies), "elapsed_s": elapsed, "latencies": latencies,
            "broker_cpu_s": cpu_seconds(broker.pid) - cpu_before}


def _pooled(windows: list[dict[str, Any]]) -> dict[str, Any]:
    requests = sum(w["requests"] for w in windows)
    latencies = [x for w in windows for x in w["latencies"]]
    return {
        "requests_per_s": round(requests / sum(w["elapsed_s"] for w in windows), 1),
        "p50_us": round(percentile(latencies, 50) * 1e6, 1),
        "p99_us": round(percentile(latencies, 99) * 1e6, 1),
        "broker_cpu_us_per_request": round(sum(w["broker_cpu_s"] for w in windows) / requests * 1e6, 1),
    }


def main(argv=None) -> dict[str, Any]:
    def arguments(parser) -> None:
        parser.add_argument("--active", type=int, default=4, help="active clients (default 4)")
        parser.add_argument("--loops", default=",".join(LOOPS), help="broker event loops to measure")

    bench = Benchmark("connections", "copyless active-client throughput and latency with N idle connections",
                      argv, arguments=arguments)
    idle_counts = bench.pick(full=[1000, 5000, 10000], quick=[1000, 10000], tiny=[100])
    window_s = bench.pick(full=1.0, quick=0.4, tiny=0.2)
    rounds = bench.pick(full=6, quick=3, tiny=2)
    workloads = bench.pick(full=list(WORKLOADS), quick=list(WORKLOADS), tiny=["api_versions"])
    loops = [name for name in bench.args.loops.split(",") if name]
    if "uvloop" in loops and importlib.util.find_spec("uvloop") is None:
        loops.remove("uvloop")
        bench.note("uvloop not installed: only asyncio measured")
    if bench.tiny:
        loops = loops[:1]
    active = bench.args.active
    # This process holds one end of every idle connection and the loaded broker the other.
    limit = _raise_nofile(max(idle_counts) + 2 * active + 512)
    if limit < max(idle_counts) + 2 * active + 128:
        allowed = limit - 2 * active - 128
        bench.note(f"RLIMIT_NOFILE hard limit {limit}: idle connections capped at {allowed}")
        idle_counts = sorted({min(n, allowed) for n in idle_counts})
    bench.note(f"{active} active clients, one request in flight each; {rounds} rounds of {window_s:g} s windows "
               "alternating control (0 idle) and loaded broker, order swapped every round")

    points = len(loops) * len(idle_counts) * len(workloads) * rounds
    ratios: dict[str, Any] = {}
    per_round: dict[tuple[str, str, int], list[float]] = {}
    with bench.progress(points, "rounds") as bar, bench.scratch_dir() as scratch:
        for loop_name in loops:
            control = BrokerProcess(scratch / f"control-{loop_name}" / "data", loop_name)
            try:
                loaded = BrokerProcess(scratch / f"loaded-{loop_name}" / "data", loop_name)
            except BaseException:
                control.stop()
                raise
            event_loop = _new_event_loop()
            idle: list[socket.socket] = []
            topic = "connections-bench"
            try:
                for broker in (control, loaded):
                    event_loop.run_until_complete(_create_topic((broker.host, broker.port), topic))
                for count in idle_counts:
                    if count > len(idle):
                        bar.describe(f"{loop_name}: opening {count - len(idle)} idle connections")
                        event_loop.run_until_complete(
                            _open_idle((loaded.host, loaded.port), count - len(idle), idle))
                    fds = {"control": control.open_fds(), "loaded": loaded.open_fds()}
                    for workload in workloads:
                        windows: dict[str, list[dict[str, Any]]] = {"control": [], "loaded": []}
                        ratios_this: list[float] = []
                        for number in range(rounds):
                            bar.describe(f"{loop_name} {workload} idle={count} round {number + 1}/{rounds}")
                            order = (("control", control), ("loaded", loaded))
                            if number % 2:
                                order = order[::-1]
                            measured = {}
                            for role, broker in order:
                                measured[role] = _measure(event_loop, broker, workload, active, window_s, topic)
                                windows[role].append(measured[role])
                            rate = {role: m["requests"] / m["elapsed_s"] for role, m in measured.items()}
                            ratios_this.append(rate["loaded"] / rate["control"])
                            bar.advance()
                        ratios_this.sort()
                        median = ratios_this[len(ratios_this) // 2] if len(ratios_this) % 2 else \
                            (ratios_this[len(ratios_this) // 2 - 1] + ratios_this[len(ratios_this) // 2]) / 2
                        per_round[(loop_name, workload, count)] = ratios_this
                        for role in ("control", "loaded"):
                            bench.row(loop=loop_name, workload=workload,
                                      idle_connections=count if role == "loaded" else 0,
                                      broker=role, broker_fds=fds[role], **_pooled(windows[role]),
                                      vs_control=round(median, 3) if role == "loaded" else None,
                                      vs_control_range=(f"{ratios_this[0]:.2f}..{ratios_this[-1]:.2f}"
                                                        if role == "loaded" else None))
                        key = f"{loop_name}/{workload} at {count} idle"
                        ratios[f"{key}: requests/s vs control (median of rounds)"] = round(median, 3)
                        control_cpu = _pooled(windows["control"])["broker_cpu_us_per_request"]
                        loaded_cpu = _pooled(windows["loaded"])["broker_cpu_us_per_request"]
                        ratios[f"{key}: broker CPU per request vs control"] = round(loaded_cpu / control_cpu, 3)
                for broker in (control, loaded):
                    if broker.process.poll() is not None:
                        raise RuntimeError(f"broker exited during the run:\n{broker.log_path.read_text()[-4000:]}")
            finally:
                _close_all(idle)
                event_loop.close()
                control.stop()
                loaded.stop()

    def chart(fig) -> None:
        axes = fig.subplots(1, 2)
        loaded_rows = [r for r in bench.rows if r["broker"] == "loaded"]
        for loop_name in loops:
            for workload in workloads:
                rows = [r for r in loaded_rows if r["loop"] == loop_name and r["workload"] == workload]
                xs = [r["idle_connections"] for r in rows]
                label = f"{loop_name} {workload}"
                axes[0].plot(xs, [r["vs_control"] for r in rows], marker="o", label=label)
                lows = [per_round[(loop_name, workload, x)][0] for x in xs]
                highs = [per_round[(loop_name, workload, x)][-1] for x in xs]
                axes[0].fill_between(xs, lows, highs, alpha=0.15)
                axes[1].plot(xs, [r["broker_cpu_us_per_request"] for r in rows], marker="o", label=label)
        axes[0].axhline(1.0, color="0.5", linewidth=0.8)
        axes[0].set_title("requests/s with N idle / without (median, band = rounds)")
        axes[0].set_ylim(0, max(1.5, axes[0].get_ylim()[1]))
        axes[1].set_title("broker CPU per request (us), loaded broker")
        axes[1].set_ylim(bottom=0)
        for ax in axes:
            ax.set_xscale("log")
            ax.set_xlabel("idle connections")
            ax.legend(fontsize=7)

    return bench.finish(
        ratios=ratios,
        chart=chart,
        columns=["loop", "workload", "idle_connections", "broker", "broker_fds", "requests_per_s", "p50_us",
                 "p99_us", "broker_cpu_us_per_request", "vs_control", "vs_control_range"],
        extra={"idle_counts": idle_counts, "window_s": window_s, "rounds": rounds, "active_clients": active},
    )


if __name__ == "__main__":
    main()
