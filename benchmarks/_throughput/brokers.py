"""The brokers ``benchmarks.throughput`` measures: starting, observing and stopping them.

Owns ``BrokerHandle`` (a bootstrap address and, for a broker this benchmark started, its process: stopped
by pid whatever happens, its CPU seconds, and copyless's serving histograms on SIGUSR1), ``start_copyless``
(``copyless serve --listen 127.0.0.1:0``, the bound address read from its startup line) and ``start_kafka``
(the reference Apache Kafka through ``run-kafka.sh PORT DATA_DIR``, on a free port pair from 19292 up). A
broker given with ``--bootstrap`` gets a handle without a process, and is never stopped.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_KAFKA_HOME = REPO_ROOT.parent / "shared" / "anchors" / "kafka"
KAFKA_PORTS = range(19292, 19392, 2)  # run-kafka.sh also takes PORT+1 for its controller
STARTUP_TIMEOUT_S = 90.0
_ADDRESS_RE = re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}|localhost):(\d{1,5})\b")


class BrokerHandle:
    """A broker under test: its bootstrap and, when this benchmark started it, the process to stop."""

    def __init__(self, name: str, bootstrap: str, *, pid: int | None = None, process=None, log_path=None):
        self.name = name
        self.bootstrap = bootstrap
        self.pid = pid
        self.process = process
        self.log_path = log_path
        self.stopped = False

    @property
    def cpu_pid(self) -> int | None:
        """The process whose CPU seconds are the broker's: the one this benchmark started (copyless, or the
        JVM run-kafka.sh reported); None for a broker given with --bootstrap."""
        return self.pid or (self.process.pid if self.process is not None else None)

    def serving_stats(self, timeout_s: float = 10.0) -> dict[str, Any] | None:
        """The counters of a copyless this benchmark started, now: SIGUSR1 makes it print one ``stats-json``
        line to the log. None for any other broker (Kafka keeps its metrics in JMX) or if none came."""
        if self.process is None or self.log_path is None or self.process.poll() is not None:
            return None
        offset = self.log_path.stat().st_size
        self.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                for line in log.read().decode("utf-8", "replace").splitlines():
                    if line.startswith("stats-json "):
                        try:
                            return json.loads(line[len("stats-json "):])
                        except ValueError:
                            break  # caught mid-write: read again
            time.sleep(0.02)
        return None

    def stop(self) -> None:
        """Stop the broker this benchmark started; later calls do nothing (its pid may be reused by then)."""
        if self.stopped:
            return
        self.stopped = True
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=30)
        elif self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    os.kill(self.pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.2)
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _find_listen_address(text: str) -> tuple[str, int] | None:
    for line in text.splitlines():
        if "listen" not in line.lower():
            continue
        match = _ADDRESS_RE.search(line)
        if match and int(match.group(2)) != 0:
            host = "127.0.0.1" if match.group(1) in ("0.0.0.0", "localhost") else match.group(1)
            return host, int(match.group(2))
    return None


def start_copyless(data_dir: Path, log_path: Path, *, sendfile: bool = True, extra_args: tuple[str, ...] = (),
                   env: dict[str, str] | None = None) -> BrokerHandle:
    """``copyless serve --data-dir D --listen 127.0.0.1:0``, with ``env`` added to this process's environment;
    returns once its startup line names the port."""
    command = [sys.executable, "-m", "copyless.broker", "serve", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0"]
    if not sendfile:
        command.append("--no-sendfile")
    command += list(extra_args)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    with open(log_path, "ab") as log_file:  # the child has its own copy of the descriptor
        offset = log_path.stat().st_size
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, cwd=str(data_dir.parent))
    try:
        host, port = _await_listen_address(process, log_path, offset)
    except BaseException:  # also an interrupt while it starts: no handle exists yet to stop it later
        if process.poll() is None:
            process.kill()
            process.wait(30)
        raise
    return BrokerHandle("copyless" if sendfile else "copyless --no-sendfile", f"{host}:{port}",
                        process=process, log_path=log_path)


def _await_listen_address(process, log_path: Path, offset: int) -> tuple[str, int]:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        with open(log_path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
        found = _find_listen_address(text)
        if found is not None:
            return found
        if process.poll() is not None:
            raise RuntimeError(f"copyless exited with {process.returncode} before listening:\n{text[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"copyless printed no listening address in {STARTUP_TIMEOUT_S:.0f} s:\n{text[-3000:]}")
        time.sleep(0.05)


def _port_free(port: int) -> bool:
    for candidate in (port, port + 1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", candidate))
            except OSError:
                return False
    return True


def start_kafka(kafka_home: Path, data_dir: Path) -> BrokerHandle:
    """``run-kafka.sh PORT DATA_DIR`` on the first free port pair from 19292; it prints the broker's pid."""
    port = next((p for p in KAFKA_PORTS if _port_free(p)), None)
    if port is None:
        raise RuntimeError(f"no free port pair in {KAFKA_PORTS.start}..{KAFKA_PORTS.stop}")
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        completed = subprocess.run([str(kafka_home / "run-kafka.sh"), str(port), str(data_dir)],
                                   capture_output=True, text=True, timeout=STARTUP_TIMEOUT_S + 30)
    except BaseException:  # timeout or interrupt: the JVM may be up without its pid printed yet
        _stop_kafka_in(data_dir)
        raise
    if completed.returncode != 0:
        raise RuntimeError(f"run-kafka.sh failed: {completed.stderr.strip()[-2000:]}")
    pid = int(completed.stdout.strip().split()[-1])
    return BrokerHandle("kafka", f"127.0.0.1:{port}", pid=pid, log_path=data_dir / "kafka.out")


def _stop_kafka_in(data_dir: Path) -> None:
    """Stop the JVM that run-kafka.sh launched for ``data_dir``: the only process whose command line names
    ``data_dir/server.properties`` (a scratch path unique to this run)."""
    config = str(data_dir / "server.properties")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            arguments = (entry / "cmdline").read_bytes().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        if config in arguments:
            BrokerHandle("kafka", "", pid=int(entry.name)).stop()
