"""The brokers librdkafka's suite runs against: what its own harness gives Kafka, for each target.

librdkafka's scenarios (``tests/scenarios/*.json`` in its tree) ask for 4 partitions per auto-created topic
and replication factor 3, topics created on first use (``default``) or not (``noautocreate``). A target is
started once per scenario and each test number then runs alone against it:

- ``single``: one ``copyless serve --num-partitions 4`` (replication factor 1: there is one node);
- ``cluster``: three ``copyless serve --metadata etcd://...`` nodes (``tests.support.cluster``) with
  ``--num-partitions 4`` and ``default.replication.factor`` 3, on an etcd the target starts;
- ``kafka``: Apache Kafka 3.9.1 in KRaft mode from the benchmark anchor (``../shared/anchors/kafka`` or
  ``$COPYLESS_KAFKA_ANCHOR``), ``num.partitions=4``: the reference that says which tests pass on Kafka
  under this harness. Only ``python -m tests.librdkafka.run --target kafka`` uses it; no test does.

Each target brings its ``KAFKA_PATH``: copyless's is ``kafka_path/`` beside this file (``kafka-topics.sh``
and ``kafka-acls.sh`` over copyless's CLI); Kafka's is a directory of scripts running Kafka's own
``TopicCommand``, ``AclCommand`` and ``ConfigCommand``. No target has an authorizer, as librdkafka's harness
gives Kafka none, so the tests that add ACLs fail alike on all three (SECURITY_DISABLED).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.broker_process import TEST_BROKER_CONFIG, BrokerProcess
from tests.support.polling import wait_until
from tests.support.subprocesses import REPO_ROOT

HERE = Path(__file__).resolve().parent
COPYLESS_KAFKA_PATH = HERE / "kafka_path"
# librdkafka's scenarios: 4 partitions per auto-created topic, replication factor 3 where there are 3 nodes.
NUM_PARTITIONS = 4
CLUSTER_REPLICATION_FACTOR = 3
# librdkafka's harness (trivup) leaves Kafka's default join window for new groups, 3 s, and its group tests
# rely on it: 0102 starts two consumers and expects both in the first generation. copyless's single node
# defaults to 0 (as Kafka's quickstart), so every target sets Kafka's default.
INITIAL_REBALANCE_DELAY_MS = 3000
# The cluster tests' fast failure detection (tests.support.cluster: 2 s broker leases, a 4 s replica lag) is
# for failover tests; librdkafka's suite gets Kafka's defaults, as its harness does. With 2 s leases, a
# broker starved for CPU by the machine's other work lost its lease mid-test (seen at load average 10), and
# topics with replication factor 3 could not be created while it registered again.
KAFKA_CLUSTER_DEFAULTS = {
    "broker.session.timeout.ms": 9000,
    "replica.lag.time.max.ms": 30000,
    "leader.imbalance.check.interval.ms": 300000,
}
TARGETS = ("single", "cluster", "kafka")
ANCHOR_ENV = "COPYLESS_KAFKA_ANCHOR"
DEFAULT_ANCHOR = Path("../shared/anchors/kafka")
KAFKA_START_TIMEOUT_S = 90.0


@dataclass
class Target:
    """A running broker (or cluster) for one scenario."""

    name: str
    scenario: str
    bootstrap: str
    kafka_path: Path
    alive: Callable[[], bool]
    log_tail: Callable[[], str]
    extra_env: dict[str, str] = field(default_factory=dict)


def runner_path_env() -> dict[str, str]:
    """PATH and PYTHONPATH so that copyless's kafka-topics.sh runs this checkout with this interpreter."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    return {"PATH": path, "PYTHONPATH": pythonpath}


def _copyless_args(auto_create: bool) -> tuple[str, ...]:
    return ("--num-partitions", str(NUM_PARTITIONS)) + (() if auto_create else ("--no-auto-create-topics",))


@contextlib.contextmanager
def copyless_single(workdir: Path, scenario: str) -> Iterator[Target]:
    config = {**TEST_BROKER_CONFIG, "group.initial.rebalance.delay.ms": INITIAL_REBALANCE_DELAY_MS}
    broker = BrokerProcess(data_dir=workdir / "data", log_path=workdir / "broker.log", config=config,
                           extra_args=_copyless_args(scenario != "noautocreate"))
    broker.start()
    try:
        yield Target("single", scenario, broker.bootstrap, COPYLESS_KAFKA_PATH, broker.alive,
                     lambda: broker.log_tail(), runner_path_env())
    finally:
        if broker.alive():
            broker.stop()


@contextlib.contextmanager
def copyless_cluster(workdir: Path, scenario: str) -> Iterator[Target]:
    from tests.support.cluster import Cluster
    from tests.support.etcd import EtcdProcess

    etcd = EtcdProcess(workdir / "etcd").start()
    cluster = Cluster(workdir, etcd, 3, config={"default.replication.factor": CLUSTER_REPLICATION_FACTOR,
                                                "group.initial.rebalance.delay.ms": INITIAL_REBALANCE_DELAY_MS,
                                                **KAFKA_CLUSTER_DEFAULTS},
                      extra_args=_copyless_args(scenario != "noautocreate"))
    try:
        cluster.start()
        yield Target("cluster", scenario, cluster.bootstrap, COPYLESS_KAFKA_PATH,
                     lambda: len(cluster.live()) == len(cluster.brokers), cluster.log_texts, runner_path_env())
    finally:
        cluster.stop()
        etcd.stop()


def kafka_anchor() -> Path | None:
    anchor = Path(os.environ.get(ANCHOR_ENV) or DEFAULT_ANCHOR)
    return anchor if (anchor / "libs").is_dir() and shutil.which("java") else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _kafka_tool_scripts(directory: Path, anchor: Path) -> Path:
    """A KAFKA_PATH whose bin/ runs Kafka's own command-line tools from the anchor's jars."""
    tools = {"kafka-topics.sh": "org.apache.kafka.tools.TopicCommand", "kafka-acls.sh": "kafka.admin.AclCommand",
             "kafka-configs.sh": "kafka.admin.ConfigCommand"}
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for script, main_class in tools.items():
        path = bin_dir / script
        path.write_text(f'#!/bin/sh\nexec java -Xmx256m -Dlog4j.configuration="file:{anchor}/log4j.properties" '
                        f'-cp "{anchor}/libs/*" {main_class} "$@"\n')
        path.chmod(0o755)
    return directory


@contextlib.contextmanager
def kafka_single(workdir: Path, scenario: str) -> Iterator[Target]:
    anchor = kafka_anchor()
    if anchor is None:
        raise RuntimeError(f"no Kafka anchor with java (set {ANCHOR_ENV} to a directory with libs/)")
    port, controller_port = _free_port(), _free_port()
    data = workdir / "kafka"
    data.mkdir(parents=True, exist_ok=True)
    properties = data / "server.properties"
    properties.write_text("\n".join([
        "process.roles=broker,controller", "node.id=1", f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}", "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT", f"log.dirs={data / 'log'}",
        f"num.partitions={NUM_PARTITIONS}", f"auto.create.topics.enable={str(scenario != 'noautocreate').lower()}",
        "offsets.topic.replication.factor=1", "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1", f"group.initial.rebalance.delay.ms={INITIAL_REBALANCE_DELAY_MS}", ""]))
    classpath = f"{anchor}/libs/*"
    subprocess.run(["java", "-cp", classpath, "kafka.tools.StorageTool", "format", "-t", uuid.uuid4().hex[:22],
                    "-c", str(properties)], check=True, capture_output=True)
    log_path = data / "kafka.out"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(["java", "-Xmx1g", f"-Dlog4j.configuration=file:{anchor}/log4j.properties", "-cp",
                                    classpath, "kafka.Kafka", str(properties)], stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    try:

        def accepting() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                if process.poll() is not None:
                    raise RuntimeError(f"Kafka exited with {process.returncode}; see {log_path}") from None
                return False

        wait_until(accepting, what=f"Kafka to accept connections on port {port}", timeout_s=KAFKA_START_TIMEOUT_S,
                   interval_s=0.5, detail=lambda: f"see {log_path}")
        yield Target("kafka", scenario, f"127.0.0.1:{port}", _kafka_tool_scripts(workdir / "kafka_path", anchor),
                     lambda: process.poll() is None, lambda: log_path.read_text(errors="replace")[-6000:])
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


STARTERS = {"single": copyless_single, "cluster": copyless_cluster, "kafka": kafka_single}
