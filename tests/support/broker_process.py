"""Brokers as the suite runs them: a real ``copyless serve`` subprocess with its own data dir and log file.

``BrokerProcess`` starts one on port 0 (the bound address is read from the broker's startup line, so tests
never collide), restarts it gracefully (SIGTERM) or with kill -9 on the same port, and reads what a test
may check from outside: its log, its ``stats`` line, its memory and file descriptors. With ``external``
it is only the address of some running Kafka-protocol broker (``COPYLESS_TEST_BOOTSTRAP``), and anything
that needs the process skips the test. The ``broker`` and ``broker_factory`` fixtures (tests/conftest.py)
hand these out.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.polling import wait_until
from tests.support.subprocesses import python_env

EXTERNAL_BOOTSTRAP_ENV = "COPYLESS_TEST_BOOTSTRAP"
# The broker's first start includes imports and (on a fresh dir) segment preallocation: on this loaded
# 2-core machine that has been seen to take a few seconds, so the wait is generous.
STARTUP_TIMEOUT_S = 60.0
SHUTDOWN_TIMEOUT_S = 30.0
# Kafka's defaults with two exceptions that keep a test broker light: segments are preallocated and
# pre-faulted, and a module creates ~50 partitions, so 1 GiB segments would mean tens of GiB of page cache;
# and the group-offsets and transaction-state topics get 4 partitions instead of 50 for the same reason.
TEST_BROKER_CONFIG = {
    "log.segment.bytes": 8 * 1024 * 1024,
    "offsets.topic.num.partitions": 4,
    "transaction.state.log.num.partitions": 4,
}

# Whether brokers started here run with --check-loop-blocking (a blocking storage call on the event loop's
# thread raises). The suite's conftest arms it through check_loop_blocking().
_check_loop_blocking = False


def check_loop_blocking(enabled: bool = True) -> None:
    """Start every later broker with ``--check-loop-blocking`` (or not)."""
    global _check_loop_blocking
    _check_loop_blocking = enabled


# "listening on 127.0.0.1:40123", "addr=[::1]:9092", "bound 0.0.0.0:5555" ... any HOST:PORT with a real port.
_ADDRESS_RE = re.compile(r"(?P<host>\d{1,3}(?:\.\d{1,3}){3}|\[[0-9A-Fa-f:.]+\]|localhost):(?P<port>\d{1,5})\b")


def external_bootstrap() -> str | None:
    return os.environ.get(EXTERNAL_BOOTSTRAP_ENV) or None


class BrokerStartError(RuntimeError):
    pass


@dataclass
class BrokerProcess:
    """A ``copyless serve`` subprocess (or, when ``external``, only the address of some running broker)."""

    data_dir: Path | None
    log_path: Path | None
    loop: str | None = "uvloop"
    sendfile: bool = True
    extra_args: tuple[str, ...] = ()
    config: dict | None = None
    external: bool = False
    host: str = "127.0.0.1"
    port: int = 0
    process: subprocess.Popen | None = None
    exit_codes: list[int] = field(default_factory=list)
    # A prefix for the command, e.g. ``ip netns exec NAME`` to run the broker on a host of a NetLab.
    wrapper: tuple[str, ...] = ()
    # The address to listen on (port 0 picks one); a broker in a network namespace listens on its host's.
    listen_host: str = "127.0.0.1"
    # Extra environment for the broker process (e.g. COPYLESS_DELAYPOINTS to arm a delay point).
    env: dict = field(default_factory=dict)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        self.require_process("reading the broker's pid")
        assert self.process is not None
        return self.process.pid

    def require_process(self, why: str) -> None:
        if self.external:
            pytest.skip(f"{why} needs a broker subprocess; {EXTERNAL_BOOTSTRAP_ENV} points at an external broker")

    # -- lifecycle -------------------------------------------------------------------------------------------
    def command(self, listen: str) -> list[str]:
        cmd = [*self.wrapper, sys.executable, "-m", "copyless.broker", "serve", "--data-dir", str(self.data_dir),
               "--listen", listen]
        if self.loop:
            cmd += ["--loop", self.loop]
        if not self.sendfile:
            cmd.append("--no-sendfile")
        if _check_loop_blocking:
            cmd.append("--check-loop-blocking")
        # A caller passing its own --config in extra_args owns the whole configuration.
        if self.config and "--config" not in self.extra_args:
            cmd += ["--config", str(self.config_path)]
        cmd += list(self.extra_args)
        return cmd

    @property
    def config_path(self) -> Path:
        assert self.log_path is not None
        return self.log_path.parent / "broker.toml"

    def write_config(self) -> None:
        lines = []
        for key, value in (self.config or {}).items():
            if isinstance(value, bool):
                rendered = "true" if value else "false"
            elif isinstance(value, (int, float)):
                rendered = repr(value)
            else:
                rendered = '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
            lines.append(f'"{key}" = {rendered}')
        self.config_path.write_text("\n".join(lines) + "\n")

    def start(self, port: int = 0) -> BrokerProcess:
        self.require_process("starting a broker")
        assert self.data_dir is not None and self.log_path is not None
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("broker already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.config and "--config" not in self.extra_args:
            self.write_config()
        # The child keeps its own descriptor of the log; ours closes once it is handed over.
        with open(self.log_path, "ab", buffering=0) as log_file:
            log_file.write(f"\n==== start: {' '.join(self.command(f'{self.listen_host}:{port}'))}\n".encode())
            log_offset = self.log_path.stat().st_size
            env = python_env(PYTHONUNBUFFERED="1", **self.env)
            self.process = subprocess.Popen(
                self.command(f"{self.listen_host}:{port}"),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=str(self.data_dir.parent),
                env=env,
            )
        self.host, self.port = self._wait_for_address(log_offset)
        self._wait_connectable()
        return self

    def _wait_for_address(self, log_offset: int) -> tuple[str, int]:
        assert self.process is not None and self.log_path is not None
        process = self.process

        def printed() -> tuple[str, int] | None:
            text = self.log_since(log_offset)
            found = find_address(text, exact_only=True)
            if found is None and process.poll() is not None:
                raise BrokerStartError(
                    f"broker exited with code {process.returncode} before printing its address:\n{text}")
            return found

        return self._wait_starting(printed, what="the broker's HOST:PORT line",
                                   detail=lambda: f"its output:\n{self.log_since(log_offset)}")

    def _wait_connectable(self) -> None:
        refused: list[OSError] = []

        def accepting() -> bool:
            try:
                with socket.create_connection((self.host.strip("[]"), self.port), timeout=2):
                    return True
            except OSError as exc:
                if self.process is not None and self.process.poll() is not None:
                    raise BrokerStartError(
                        f"broker exited with code {self.process.returncode}:\n{self.log_text()}") from None
                refused.append(exc)
                return False

        self._wait_starting(accepting, what=f"{self.bootstrap} to accept connections",
                            detail=lambda: f"last refusal: {refused[-1] if refused else None}\n{self.log_text()}")

    def _wait_starting(self, condition, *, what: str, detail):
        """``wait_until`` for a broker that is starting: at the deadline it is killed, and the failure is a
        BrokerStartError like its exiting early (what ``restart`` and the fault schedules catch)."""
        try:
            return wait_until(condition, what=what, timeout_s=STARTUP_TIMEOUT_S, detail=detail)
        except AssertionError as exc:
            self._force_kill()
            raise BrokerStartError(str(exc)) from None

    def stop(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> int:
        """SIGTERM and wait; returns the exit code (kills and fails if the broker does not exit in time)."""
        self.require_process("stopping the broker")
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._force_kill()
                raise AssertionError(
                    f"broker did not exit within {timeout_s:.0f}s of SIGTERM:\n{self.log_tail()}"
                ) from None
        self.exit_codes.append(self.process.returncode)
        return self.process.returncode

    def kill(self) -> None:
        """kill -9: no chance to flush, checkpoint or write the clean-shutdown marker."""
        self.require_process("killing the broker")
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=SHUTDOWN_TIMEOUT_S)
        self.exit_codes.append(self.process.returncode)

    def restart(self, mode: str) -> None:
        """Restart after SIGTERM or kill -9, on the same port (clients keep their bootstrap address) unless
        another process took it meanwhile; ``bootstrap`` always names the current address."""
        self.require_process("restarting the broker")
        if mode == "graceful":
            code = self.stop()
            assert code == 0, f"graceful shutdown exited with {code}:\n{self.log_tail()}"
        elif mode == "kill":
            self.kill()
        else:
            raise ValueError(mode)
        port = self.port
        # After kill -9 the port may hold connections in TIME_WAIT; a server socket with SO_REUSEADDR rebinds
        # at once. The port came from the ephemeral range, though, so in the second between stop and start
        # some other process's outgoing connection may have taken it: then (and only then) take a new one.
        try:
            self.start(port=port)
        except BrokerStartError as exc:
            if "in use" not in str(exc) and "Errno 98" not in str(exc):
                raise
            self.start(port=0)

    def _force_kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=SHUTDOWN_TIMEOUT_S)

    def alive(self) -> bool:
        if self.external:
            return True
        return self.process is not None and self.process.poll() is None

    # -- observation -----------------------------------------------------------------------------------------
    def log_since(self, offset: int) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")

    def log_text(self) -> str:
        return self.log_since(0)

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_text()[-chars:]

    def rss_bytes(self, field: str = "VmRSS") -> int:
        """Resident memory from /proc/PID/status. ``RssAnon`` leaves out mapped segment files (which count
        in VmRSS once touched), so it is the one that shows buffers and heap."""
        self.require_process("reading the broker's memory")
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {field} in /proc status")

    def stats(self, since_offset: int = 0) -> dict[str, float] | None:
        """The broker's most recent ``stats key=value ...`` log line (written after ``since_offset``)."""
        latest = None
        for line in self.log_since(since_offset).splitlines():
            marker = line.find("stats ")
            if marker < 0 or "fetch_sendfile_bytes=" not in line:
                continue
            fields = {}
            for token in line[marker + 6 :].split():
                key, sep, value = token.partition("=")
                if sep:
                    try:
                        fields[key] = float(value.rstrip("%"))
                    except ValueError:
                        pass
            latest = fields
        return latest

    def stats_json(self, timeout_s: float = 10.0) -> dict:
        """The broker's counters now: SIGUSR1 makes it print one ``stats-json {...}`` line, which this
        waits for and parses."""
        self.require_process("asking the broker for its counters")
        assert self.process is not None
        offset = self.log_size()
        self.process.send_signal(signal.SIGUSR1)

        def printed() -> dict | None:
            # Only whole lines: a reader can see a long line's write half done. The object is decoded from
            # the line's start, so a log line that slipped in before its newline does not matter.
            for line in reversed(self.log_since(offset).split("\n")[:-1]):
                if line.startswith("stats-json "):
                    return json.JSONDecoder().raw_decode(line[len("stats-json "):])[0]
            return None

        return wait_until(printed, what="a stats-json line after SIGUSR1", timeout_s=timeout_s,
                          detail=self.log_tail)

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path is not None and self.log_path.exists() else 0

    def open_fds(self) -> int:
        self.require_process("counting the broker's file descriptors")
        return len(os.listdir(f"/proc/{self.pid}/fd"))


_LISTENING_RE = re.compile(r"listening on " + _ADDRESS_RE.pattern)


def find_address(text: str, *, exact_only: bool = False) -> tuple[str, int] | None:
    """The bound address from the broker's output: the ``listening on HOST:PORT`` line when there is one,
    else (unless ``exact_only``) the first HOST:PORT on a line that talks about listening/serving and is
    not an error report. A clustered broker logs etcd's address before it listens, so waiting for a broker
    to come up takes only the exact line."""
    candidates: list[tuple[int, str, int]] = []
    for line in text.splitlines():
        if line.startswith("==== start:"):
            continue
        exact = _LISTENING_RE.search(line)
        if exact is not None and 0 < int(exact.group("port")) <= 65535:
            candidates.append((0, exact.group("host"), int(exact.group("port"))))
            continue
        if exact_only:
            continue
        lowered = line.lower()
        # "ERROR ... cannot listen on listener PLAINTEXT 127.0.0.1:9092: address already in use" names no bound
        # address. Only the words around the log level and the message start count: paths may contain anything.
        if " error " in f" {lowered} " or "cannot" in lowered or "in use" in lowered:
            continue
        for match in _ADDRESS_RE.finditer(line):
            port = int(match.group("port"))
            if port == 0 or port > 65535:
                continue
            rank = 1 if any(w in lowered for w in ("listen", "serving", "bound", "started", "accepting")) else 2
            candidates.append((rank, match.group("host"), port))
            break
    if not candidates:
        return None
    candidates.sort(key=lambda c: c[0])
    _, host, port = candidates[0]
    if host in ("0.0.0.0", "localhost"):
        host = "127.0.0.1"
    return host, port
