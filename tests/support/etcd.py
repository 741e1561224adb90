"""A real etcd for the cluster tests: one ``etcd`` process on loopback ports, with its own data dir.

The suite starts it from Debian's ``etcd-server`` package (``tests/run.sh`` installs it); where the binary
is missing the tests that need it skip, saying so. One server is shared by a test session and each test
works under its own root (``etcd://host:port/<root>``), so tests never see each other's keys; tests that
stop, pause or restart etcd start their own.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.polling import wait_until

ETCD = shutil.which("etcd")
ETCDCTL = shutil.which("etcdctl")
START_TIMEOUT_S = 30.0


def require_etcd() -> None:
    if ETCD is None or ETCDCTL is None:
        pytest.skip("etcd is not installed (Debian: apt-get install etcd-server etcd-client; tests/run.sh does)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class EtcdProcess:
    """One etcd member on loopback. ``endpoint`` is ``127.0.0.1:PORT``."""

    def __init__(self, workdir: Path, name: str = "n1", *, host: str = "127.0.0.1",
                 wrapper: tuple[str, ...] = ()) -> None:
        require_etcd()
        self.workdir = Path(workdir)
        self.name = name
        self.host = host
        self.wrapper = wrapper  # e.g. ``ip netns exec NAME``: etcd on a host of a NetLab
        self.client_port = free_port()
        self.peer_port = free_port()
        self.process: subprocess.Popen | None = None
        self.log_path = self.workdir / f"etcd-{name}.log"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    def url(self, root: str | None = None) -> str:
        """The broker's ``--metadata`` value; ``root`` defaults to a fresh one (a private cluster)."""
        return f"etcd://{self.endpoint}/{root or unique_root()}"

    def start(self) -> EtcdProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        peer = f"http://{self.host}:{self.peer_port}"
        client = f"http://{self.host}:{self.client_port}"
        with open(self.log_path, "ab", buffering=0) as log:  # the child has its own copy of the descriptor
            self.process = subprocess.Popen(
                [*self.wrapper, ETCD, "--name", self.name, "--data-dir", str(self.workdir / f"data-{self.name}"),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"{self.name}={peer}", "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        process = self.process

        def healthy() -> bool:
            if self.healthy():
                return True
            if process.poll() is not None:
                raise RuntimeError(f"etcd exited with {process.returncode}:\n{self.log_path.read_text()[-3000:]}")
            return False

        try:
            wait_until(healthy, what=f"etcd at {self.endpoint} to report healthy", timeout_s=START_TIMEOUT_S,
                       interval_s=0.1, detail=lambda: self.log_path.read_text()[-3000:])
        except AssertionError as exc:
            self.kill()
            raise RuntimeError(str(exc)) from None
        return self

    def healthy(self) -> bool:
        result = subprocess.run([ETCDCTL, "--endpoints", self.endpoint, "--command-timeout=1s", "endpoint", "health"],
                                capture_output=True, text=True, env=_etcdctl_env())
        return result.returncode == 0

    def etcdctl(self, *args: str) -> str:
        result = subprocess.run([ETCDCTL, "--endpoints", self.endpoint, *args], capture_output=True, text=True,
                                env=_etcdctl_env(), timeout=30)
        if result.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)} failed: {result.stderr}")
        return result.stdout

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=15)

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)


def _etcdctl_env() -> dict:
    env = dict(os.environ)
    env["ETCDCTL_API"] = "3"
    return env


def unique_root() -> str:
    return f"t{uuid.uuid4().hex[:12]}"
