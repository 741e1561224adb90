"""The clusters the replication and cluster-metadata benchmarks measure: etcd, copyless, the reference Kafka.

Owns ``EtcdServer`` (one etcd member on loopback with its own data dir), ``CopylessCluster`` (``copyless
serve --node-id N --metadata etcd://HOST:PORT/ROOT`` processes, node ids 1..N, one etcd root per cluster),
``KafkaCluster`` (the reference Apache Kafka 3.9.1 KRaft cluster through ``run-kafka-cluster.sh BASE DIR``;
a node killed here is started again with the script's own command line) and ``SingleCopyless`` (the
embedded single node, for the metadata figures that compare against it). Every node can be SIGKILLed,
started again on its port, and is stopped by pid when the benchmark ends, fails or is interrupted; a
cluster is always used inside ``with``. Metadata (leaders, ISR, controller) is read the way a client reads
it, with confluent-kafka's AdminClient, so the two products are observed alike.

Ports: every process listens in 61000-61999 (``PortPool`` hands out free ones in order), the range these
benchmarks own on a shared machine; a port some other process holds is skipped, never taken over.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_KAFKA_HOME = REPO_ROOT.parent / "shared" / "anchors" / "kafka"
PORT_RANGE = range(61000, 62000)
# A broker's first start imports the package and opens (preallocates) its logs; on this loaded 2-core
# machine a copyless start took up to 6 s and a Kafka JVM's 20-40 s: generous limits, never a figure.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
# A fresh topic's first acks=all write: milliseconds when its followers fetch (``Cluster.create_ready_topic``).
PROBE_TIMEOUT_S = 5.0


class PortPool:
    """Free loopback ports from ``PORT_RANGE``, in order: ``take()`` one, ``take_block(n, span)`` a base
    with ``n`` consecutive ports free at base and at base + span (Kafka's broker and controller ports)."""

    def __init__(self, ports: range = PORT_RANGE) -> None:
        self.ports = ports
        self.next = ports.start

    def take(self) -> int:
        return self.take_block(1)

    def take_block(self, count: int, span: int | None = None) -> int:
        offsets = list(range(count)) + ([span + i for i in range(count)] if span else [])
        base = self.next
        while base + max(offsets) < self.ports.stop:
            if all(port_free(base + o) for o in offsets):
                self.next = base + max(offsets) + 1
                return base
            base += 1
        raise RuntimeError(f"no {count} free ports in {self.ports.start}..{self.ports.stop - 1}")


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _connectable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _process_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has exited
    except OSError:
        return True


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _process_gone(pid):
            return True
        time.sleep(0.02)
    return _process_gone(pid)


def toml_text(config: dict[str, Any]) -> str:
    """Broker settings as the ``--config`` file's TOML (Kafka's property names, quoted)."""
    lines = []
    for key, value in config.items():
        if isinstance(value, bool):
            rendered = "true" if value else "false"
        elif isinstance(value, (int, float)):
            rendered = repr(value)
        else:
            rendered = json.dumps(str(value))
        lines.append(f"{json.dumps(key)} = {rendered}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------------
# etcd


class EtcdServer:
    """One etcd member on loopback; ``url(root)`` is a broker's ``--metadata`` value."""

    def __init__(self, workdir: Path, ports: PortPool) -> None:
        self.etcd = shutil.which("etcd")
        if self.etcd is None:
            raise RuntimeError("etcd is not installed (Debian: apt-get install etcd-server etcd-client)")
        self.workdir = workdir.resolve()  # brokers and etcd run in directories of their own
        self.client_port = ports.take()
        self.peer_port = ports.take()
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def url(self, root: str) -> str:
        return f"etcd://{self.endpoint}/{root}"

    def __enter__(self) -> EtcdServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        client, peer = f"http://{self.endpoint}", f"http://127.0.0.1:{self.peer_port}"
        with open(self.workdir / "etcd.log", "ab") as log:
            self.process = subprocess.Popen(
                [self.etcd, "--name", "bench", "--data-dir", str(self.workdir / "data"),
                 "--listen-client-urls", client, "--advertise-client-urls", client, "--listen-peer-urls", peer,
                 "--initial-advertise-peer-urls", peer, "--initial-cluster", f"bench={peer}", "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            _wait_for(lambda: _connectable(self.client_port), f"etcd on {self.endpoint}", self.process)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)


def _wait_for(ready: Callable[[], Any], what: str, process: subprocess.Popen | None = None,
              timeout_s: float = START_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = ready()
        if value:
            return value
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not ready within {timeout_s:.0f} s")
        time.sleep(0.05)


# ----------------------------------------------------------------------------------------------------------
# Nodes


class CopylessNode:
    """One ``copyless serve`` process on a fixed port; its output (and ``stats-json`` lines) in ``log_path``."""

    def __init__(self, node_id: int, port: int, workdir: Path, args: list[str]) -> None:
        self.node_id = node_id
        self.port = port
        self.workdir = workdir
        self.args = args
        self.log_path = workdir / "broker.log"
        self.process: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.alive() else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "copyless.broker", "serve", "--data-dir", str(self.workdir / "data"),
                   "--listen", f"127.0.0.1:{self.port}", *self.args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=env, cwd=str(self.workdir))
        marker = f"listening on 127.0.0.1:{self.port}"
        try:
            _wait_for(lambda: marker in self._log_since(offset), f"copyless node {self.node_id}", self.process)
        except BaseException as exc:
            self.kill()
            if isinstance(exc, Exception):
                raise RuntimeError(f"{exc}; its output:\n{self._log_since(offset)[-3000:]}") from None
            raise

    def _log_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            return log.read().decode("utf-8", "replace")

    def kill(self) -> None:
        """SIGKILL: no flush, no checkpoint, no goodbye to etcd (its lease expires)."""
        if self.alive():
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)

    def stop(self) -> None:
        if self.alive():
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()

    def stats(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """The broker's counters now: SIGUSR1 makes it print one ``stats-json`` line."""
        if not self.alive():
            raise RuntimeError(f"copyless node {self.node_id} is not running")
        offset = self.log_path.stat().st_size
        self.process.send_signal(signal.SIGUSR1)

        def latest():
            for line in reversed(self._log_since(offset).splitlines()):
                if line.startswith("stats-json "):
                    try:
                        return json.loads(line[len("stats-json "):])
                    except ValueError:
                        return None  # caught mid-write: read again
            return None
        return _wait_for(latest, f"a stats-json line from node {self.node_id}", timeout_s=timeout_s)


class KafkaNode:
    """One JVM of the reference cluster. The script starts the first one (``pid`` as it printed it); a start
    after a kill runs the script's own command line for this node's ``server.properties``."""

    def __init__(self, node_id: int, port: int, workdir: Path, kafka_home: Path, pid: int | None = None) -> None:
        self.node_id = node_id
        self.port = port
        self.workdir = workdir
        self.kafka_home = kafka_home
        self._pid = pid
        self.process: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        if self.process is not None:
            return self.process.pid if self.process.poll() is None else None
        return self._pid if self._pid is not None and not _process_gone(self._pid) else None

    def alive(self) -> bool:
        return self.pid is not None

    def start(self, ports: PortPool | None = None) -> None:
        """Start the node again. Its client port lies in the kernel's ephemeral range, and clients retrying
        the dead broker's port can take it meanwhile (a loopback connect to a port with no listener can
        connect to itself): when the JVM cannot bind, it starts once more on a fresh port from ``ports``,
        advertised as such (clients find it through Metadata)."""
        try:
            self._start_once()
        except Exception:
            if ports is None:
                raise
            self.kill()
            self._move_to(ports.take())
            self._start_once()

    def _move_to(self, port: int) -> None:
        config = self.workdir / "server.properties"
        text = config.read_text().replace(f"PLAINTEXT://127.0.0.1:{self.port}", f"PLAINTEXT://127.0.0.1:{port}")
        config.write_text(text)
        self.port = port

    def _start_once(self) -> None:
        command = ["java", "-Xmx768m", f"-Dlog4j.configuration=file:{self.kafka_home / 'log4j.properties'}",
                   "-cp", f"{self.kafka_home / 'libs'}/*", "kafka.Kafka", str(self.workdir / "server.properties")]
        with open(self.workdir / "kafka.out", "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._pid = None
        _wait_for(lambda: _connectable(self.port), f"kafka node {self.node_id}", self.process, timeout_s=90)

    def kill(self) -> None:
        pid = self.pid
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            if self.process is not None:
                self.process.wait(STOP_TIMEOUT_S)
            else:
                _wait_gone(pid, STOP_TIMEOUT_S)

    def stop(self) -> None:
        pid = self.pid
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, STOP_TIMEOUT_S):
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, 30)
        if self.process is not None:
            self.process.poll()

    def stats(self, timeout_s: float = 10.0) -> None:
        return None  # Kafka keeps its counters in JMX


# ----------------------------------------------------------------------------------------------------------
# Clusters


class Cluster:
    """Nodes by id, and the client's view of them (confluent-kafka's AdminClient)."""

    name = "cluster"

    def __init__(self) -> None:
        self.nodes: dict[int, CopylessNode | KafkaNode] = {}
        self._admin = None
        self.ports: PortPool | None = None

    @property
    def bootstrap(self) -> str:
        live = [n for n in self.nodes.values() if n.alive()] or list(self.nodes.values())
        return ",".join(f"127.0.0.1:{n.port}" for n in live)

    def admin(self):
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            bootstrap = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes.values())
            self._admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, "logger": _quiet_logger()})
        return self._admin

    def metadata(self, topic: str | None = None, timeout_s: float = 2.0):
        return self.admin().list_topics(topic, timeout=timeout_s)

    def partition(self, topic: str, partition: int = 0, timeout_s: float = 2.0):
        """(leader, replicas, isr) as Metadata says now; None if the topic or partition is not there."""
        try:
            described = self.metadata(topic, timeout_s).topics.get(topic)
        except Exception:  # a broker went away under the request: ask again later
            return None
        if described is None or described.error is not None or partition not in described.partitions:
            return None
        p = described.partitions[partition]
        return p.leader, tuple(p.replicas), tuple(p.isrs)

    def controller(self, timeout_s: float = 2.0) -> int:
        try:
            return self.metadata(None, timeout_s).controller_id
        except Exception:
            return -1

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 3,
                     configs: dict[str, str] | None = None, timeout_s: float = 60.0) -> None:
        from confluent_kafka.admin import NewTopic

        futures = self.admin().create_topics(
            [NewTopic(name, partitions, replication_factor, config=dict(configs or {}))], request_timeout=30)
        futures[name].result(timeout_s)
        self.wait_isr(name, replication_factor, partitions, timeout_s)

    def create_ready_topic(self, prefix: str, replication_factor: int = 3, configs: dict[str, str] | None = None,
                           attempts: int = 3, note: Callable[[str], None] = lambda text: None) -> str:
        """A fresh 1-partition topic whose acks=all writes are acknowledged: created, its ISR whole, and one
        record acknowledged within ``PROBE_TIMEOUT_S``. Returns its name.

        A guard: a fresh topic once could start stalled (a follower answered NOT_LEADER_OR_FOLLOWER by a leader
        that had not yet taken the partition up waited for newer metadata that never came, so acks=all writes
        waited until the ISR shrank, 30 s later; fixed since: the fetcher asks again after 0.5 s). A run on
        such a topic would measure that wait, not the produce path; the topic is replaced, with a note."""
        for attempt in range(1, attempts + 1):
            name = f"{prefix}-{uuid.uuid4().hex[:8]}"
            self.create_topic(name, 1, replication_factor, configs)
            if self._probe(name):
                return name
            note(f"{self.name}: fresh topic {name} did not acknowledge an acks=all write within "
                 f"{PROBE_TIMEOUT_S:g} s (attempt {attempt}); replaced")
            with contextlib.suppress(Exception):
                self.delete_topic(name)
        raise RuntimeError(f"{self.name}: no fresh topic acknowledged acks=all writes in {attempts} attempts")

    def _probe(self, topic: str) -> bool:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": 0,
                             "log_level": 0, "logger": _quiet_logger()})
        acked = []
        # Eight zero bytes: a latency consumer reads a zero send time and leaves the record out.
        producer.produce(topic, bytes(8), partition=0, on_delivery=lambda err, _m: acked.append(err is None))
        remaining = producer.flush(PROBE_TIMEOUT_S)
        if remaining:
            producer.purge()
            producer.flush(0)
        return acked == [True]

    def delete_topic(self, name: str) -> None:
        self.admin().delete_topics([name], request_timeout=30)[name].result(60)

    def wait_isr(self, topic: str, size: int, partitions: int = 1, timeout_s: float = 120.0) -> dict[int, tuple]:
        """Until every partition has a live leader and an ISR of ``size``; returns {partition: (leader,
        replicas, isr)}."""
        def ready():
            states = {p: self.partition(topic, p) for p in range(partitions)}
            if all(s is not None and s[0] in self.nodes and self.nodes[s[0]].alive() and len(s[2]) >= size
                   for s in states.values()):
                return states
            return None
        return _wait_for(ready, f"{self.name}: {topic} with an ISR of {size}", timeout_s=timeout_s)

    def restart(self, node_id: int) -> None:
        """Start a killed node again (on a fresh port if its own was taken meanwhile)."""
        node = self.nodes[node_id]
        node.start(self.ports) if isinstance(node, KafkaNode) else node.start()
        self._admin = None  # a moved node is found through Metadata; a fresh client bootstraps anew

    def pid_of(self, node_id: int) -> int | None:
        return self.nodes[node_id].pid

    def stats(self, node_id: int) -> dict[str, Any] | None:
        return self.nodes[node_id].stats()

    def stop(self) -> None:
        for node in self.nodes.values():
            try:
                node.stop()
            except Exception:
                if node.pid is not None:
                    os.kill(node.pid, signal.SIGKILL)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def _quiet_logger():
    import logging

    logger = logging.getLogger("bench-librdkafka")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger


class CopylessCluster(Cluster):
    """``size`` copyless brokers on ``etcd`` under a fresh root, each with ``config`` as its --config file."""

    def __init__(self, workdir: Path, etcd: EtcdServer, ports: PortPool, *, size: int = 3,
                 config: dict[str, Any] | None = None, sendfile: bool = True, name: str = "copyless") -> None:
        super().__init__()
        self.name = name
        self.root = f"bench{uuid.uuid4().hex[:10]}"
        workdir = workdir.resolve()  # each broker runs in its own directory: every path absolute
        workdir.mkdir(parents=True, exist_ok=True)
        config_path = workdir / "broker.toml"
        config_path.write_text(toml_text(config or {}))
        extra = [] if sendfile else ["--no-sendfile"]
        for node_id in range(1, size + 1):
            self.nodes[node_id] = CopylessNode(
                node_id, ports.take(), workdir / f"node{node_id}",
                ["--node-id", str(node_id), "--metadata", etcd.url(self.root), "--config", str(config_path), *extra])

    def __enter__(self) -> CopylessCluster:
        try:
            for node in self.nodes.values():
                node.start()
            _wait_for(lambda: len(self._brokers()) == len(self.nodes) and self.controller() > 0,
                      f"{self.name}: {len(self.nodes)} brokers registered and a controller")
        except BaseException:
            self.stop()
            raise
        return self

    def _brokers(self) -> dict:
        try:
            return self.metadata(None).brokers
        except Exception:
            return {}


class SingleCopyless(Cluster):
    """The embedded single node (metadata in its data dir, no etcd): node id 0."""

    def __init__(self, workdir: Path, ports: PortPool, *, config: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.name = "copyless single node"
        workdir = workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        config_path = workdir / "broker.toml"
        config_path.write_text(toml_text(config or {}))
        self.nodes[0] = CopylessNode(0, ports.take(), workdir / "node0", ["--config", str(config_path)])

    def __enter__(self) -> SingleCopyless:
        try:
            self.nodes[0].start()
        except BaseException:
            self.stop()
            raise
        return self


class KafkaCluster(Cluster):
    """The reference 3-node Kafka 3.9.1 KRaft cluster (every node broker and controller); node n listens on
    BASE + n - 1 and its controller on BASE + 10 + n - 1."""

    name = "kafka"

    def __init__(self, workdir: Path, ports: PortPool, kafka_home: Path = DEFAULT_KAFKA_HOME) -> None:
        super().__init__()
        self.root = workdir.resolve()
        self.workdir = self.root
        self.kafka_home = kafka_home.resolve()
        self.ports = ports
        self.base = 0
        self.delete_delay_kept: str | None = None

    @staticmethod
    def available(kafka_home: Path = DEFAULT_KAFKA_HOME) -> bool:
        return (kafka_home / "run-kafka-cluster.sh").exists() and shutil.which("java") is not None

    def __enter__(self) -> KafkaCluster:
        # Another process can take a port between the check and a JVM's bind, 10-20 s later on a loaded
        # machine (seen once, when these ports lay in the kernel's ephemeral range, 32768-60999, now
        # avoided). Then the whole cluster starts again on fresh ports.
        for attempt in range(1, 4):
            self.base = self.ports.take_block(3, span=10)
            self.workdir = self.root / f"start{attempt}"
            try:
                self._start()
                return self
            except Exception:
                self.stop()
                self.nodes.clear()
                self._admin = None
                if attempt == 3:
                    raise
        raise AssertionError("unreachable")

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            completed = subprocess.run([str(self.kafka_home / "run-kafka-cluster.sh"), str(self.base),
                                        str(self.workdir)], capture_output=True, text=True,
                                       timeout=START_TIMEOUT_S + 60, stdin=subprocess.DEVNULL)
            if completed.returncode != 0:
                raise RuntimeError(f"run-kafka-cluster.sh failed: {completed.stderr.strip()[-2000:]}")
            pids = [int(p) for p in completed.stdout.split()[-3:]]
        except BaseException:
            self._kill_strays()
            raise
        for n, pid in enumerate(pids, start=1):
            self.nodes[n] = KafkaNode(n, self.base + n - 1, self.workdir / f"node{n}", self.kafka_home, pid)
        _wait_for(lambda: len(self._brokers()) == 3 and all(n.alive() for n in self.nodes.values()),
                  "kafka: 3 brokers in Metadata")
        try:
            _delete_files_at_once(self.admin())
        except Exception as exc:  # measured all the same, its deleted topics' files unlinked 60 s late
            self.delete_delay_kept = str(exc)

    def _brokers(self) -> dict:
        try:
            return self.metadata(None).brokers
        except Exception:
            return {}

    def _kill_strays(self) -> None:
        """The JVMs the script may have started before it failed: those whose command line names one of
        this run's ``server.properties`` (scratch paths unique to it)."""
        configs = {str(self.workdir / f"node{n}" / "server.properties") for n in (1, 2, 3)}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                arguments = set((entry / "cmdline").read_bytes().decode("utf-8", "replace").split("\0"))
            except OSError:
                continue
            if arguments & configs:
                KafkaNode(0, 0, self.workdir, self.kafka_home, int(entry.name)).stop()

    def stop(self) -> None:
        super().stop()
        self._kill_strays()


def _delete_files_at_once(admin) -> None:
    """Kafka unlinks a deleted topic's files 60 s after the delete (``log.segment.delete.delay.ms``);
    copyless at once. Set Kafka's to 0 on every broker so no deletion's freed pages land in a later run."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    entry = ConfigEntry("log.segment.delete.delay.ms", "0", incremental_operation=AlterConfigOpType.SET)
    for broker in admin.list_topics(timeout=30).brokers:  # librdkafka takes one broker resource per call
        resource = ConfigResource(ResourceType.BROKER, str(broker), incremental_configs=[entry])
        for attempt in range(3):  # a JVM just started on a loaded machine can take a while to answer
            try:
                for future in admin.incremental_alter_configs([resource], request_timeout=60).values():
                    future.result(90)
                break
            except Exception:
                if attempt == 2:
                    raise
                time.sleep(2)


@contextlib.contextmanager
def keep_logs_on_failure(scratch: Path, keep: Path):
    """On an exception, copy every process's log under ``scratch`` (brokers, etcd, Kafka) to ``keep`` before
    the scratch directory goes: a run that failed half an hour in must say why."""
    try:
        yield
    except BaseException:
        # By name: a log directory's segments are *.log files too, preallocated a GiB each.
        logs = [p for name in ("broker.log", "etcd.log", "kafka.out") for p in scratch.rglob(name)]
        for log in logs:
            target = keep / log.relative_to(scratch)
            with contextlib.suppress(OSError):
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(log, target)
        raise
