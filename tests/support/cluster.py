"""A copyless cluster as the suite runs it: N ``copyless serve --metadata etcd://...`` processes on loopback
ports, all on one etcd (a private root per cluster), with helpers to read the cluster's state from outside.

``Cluster.metadata()`` asks any live broker for Metadata v8 (brokers, controller, each partition's leader,
leader epoch, replicas and ISR), as a client would; ``wait_until`` from ``tests.support.polling`` waits for
a state with a deadline. Brokers are ``BrokerProcess`` objects: kill -9, SIGTERM, SIGSTOP/SIGCONT and
restart on the same port work as for a single broker.

Given a ``NetLab`` (``tests.support.netns``), each broker runs on a host of its own, ``b<node id>``, listening
on that host's address and port 9092, so the network between two brokers, or between a broker and an etcd
on another host of the lab, can be cut and healed; the test process still reaches every broker.
"""

from __future__ import annotations

import os
import signal
import struct
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer
from kio.schema.metadata.v8 import request as metadata_v8
from kio.schema.metadata.v8 import response as metadata_v8_response

from tests.support.broker_process import TEST_BROKER_CONFIG, BrokerProcess
from tests.support.etcd import EtcdProcess, unique_root
from tests.support.kio_requests import KafkaWire
from tests.support.log_files import read_partition_log
from tests.support.netns import Host, NetLab
from tests.support.polling import wait_until

# Brokers on hosts of a NetLab each have an address of their own, so all listen on Kafka's port and a
# restarted broker is found where it was.
NETLAB_BROKER_PORT = 9092

# A cluster under test detects a dead broker within its etcd lease (2 s, etcd's minimum), checks the ISR
# every half replica.lag.time.max.ms, and rebalances leadership every few seconds, so failover tests take
# seconds, not Kafka's defaults' minutes.
CLUSTER_TEST_CONFIG = {
    **TEST_BROKER_CONFIG,
    "broker.session.timeout.ms": 2000,
    "replica.lag.time.max.ms": 4000,
    "leader.imbalance.check.interval.ms": 3000,
    "group.initial.rebalance.delay.ms": 0,
    "offsets.topic.replication.factor": 3,
}


@dataclass
class PartitionView:
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    error_code: int


@dataclass
class MetadataView:
    brokers: dict[int, tuple[str, int]]
    controller_id: int
    topics: dict[str, dict[int, PartitionView]]
    topic_errors: dict[str, int] = field(default_factory=dict)


def read_metadata(bootstrap: str, topics: list[str] | None = None, timeout_s: float = 5.0) -> MetadataView:
    """Metadata v8 from one broker (None: every topic). Raises OSError when it cannot be reached."""
    host, port = bootstrap.rsplit(":", 1)
    wire = KafkaWire(int(port), host=host)
    try:
        wire.sock.settimeout(timeout_s)
        request = metadata_v8.MetadataRequest(
            topics=None if topics is None else tuple(metadata_v8.MetadataRequestTopic(name=t) for t in topics),
            allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False)
        response = wire.request(request)
    finally:
        wire.close()
    assert isinstance(response, metadata_v8_response.MetadataResponse)
    view = MetadataView({b.node_id: (b.host, b.port) for b in response.brokers}, response.controller_id, {})
    for topic in response.topics:
        if topic.error_code:
            view.topic_errors[topic.name] = topic.error_code
        view.topics[topic.name] = {
            p.partition_index: PartitionView(p.leader_id, p.leader_epoch, tuple(p.replica_nodes), tuple(p.isr_nodes),
                                             p.error_code)
            for p in topic.partitions}
    return view


class Cluster:
    """``size`` brokers (node ids 1..size) on ``etcd`` under a fresh root, each on a host of ``lab`` when
    given (see the module docstring). Start with ``start()``."""

    def __init__(self, workdir: Path, etcd: EtcdProcess, size: int = 3, *, config: dict | None = None,
                 extra_args: tuple[str, ...] = (), root: str | None = None, lab: NetLab | None = None) -> None:
        self.workdir = Path(workdir)
        self.etcd = etcd
        self.root = root or unique_root()
        self.url = etcd.url(self.root)
        self.config = {**CLUSTER_TEST_CONFIG, **(config or {})}
        self.lab = lab
        self.hosts: dict[int, Host] = {}
        self.brokers: dict[int, BrokerProcess] = {}
        for node_id in range(1, size + 1):
            placement = {}
            if lab is not None:
                host = self.hosts[node_id] = lab.add_host(f"b{node_id}")
                placement = dict(wrapper=tuple(lab.command(host, [])), listen_host=host.address)
            self.brokers[node_id] = BrokerProcess(
                data_dir=self.workdir / f"broker{node_id}" / "data",
                log_path=self.workdir / f"broker{node_id}" / "broker.log",
                config=dict(self.config),
                extra_args=("--node-id", str(node_id), "--metadata", self.url, *extra_args), **placement)

    @property
    def start_port(self) -> int:
        return NETLAB_BROKER_PORT if self.lab is not None else 0

    def start(self) -> Cluster:
        for broker in self.brokers.values():
            broker.start(port=self.start_port)
        wait_until(lambda: len(self.metadata().brokers) == len(self.brokers) and self.metadata().controller_id > 0,
                   what=f"{len(self.brokers)} brokers registered and a controller elected", timeout_s=30)
        return self

    def stop(self) -> None:
        for broker in self.brokers.values():
            if broker.alive():
                try:
                    os.kill(broker.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                try:
                    broker.stop()
                except AssertionError:
                    pass

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values() if b.alive())

    def live(self) -> list[BrokerProcess]:
        return [b for b in self.brokers.values() if b.alive()]

    def metadata(self, topics: list[str] | None = None, *, via: int | None = None) -> MetadataView:
        """Metadata from broker ``via``, or from the first live broker that answers."""
        candidates = [self.brokers[via]] if via is not None else self.live()
        last: Exception | None = None
        for broker in candidates:
            try:
                return read_metadata(broker.bootstrap, topics)
            except (TimeoutError, OSError, struct.error) as exc:
                last = exc
        raise OSError(f"no broker answered Metadata: {last}")

    def create_topic(self, name: str, partitions: int, replication_factor: int, *, via: list[int] | None = None,
                     configs: dict[str, str] | None = None,
                     replica_assignment: list[list[int]] | None = None) -> dict[int, PartitionView]:
        """CreateTopics through librdkafka's admin client (bootstrapping on brokers ``via``, else every live
        one), then wait for every partition to have a live leader; returns the partitions. With
        ``replica_assignment`` (one replica list per partition, preferred leader first) the counts are
        taken from it."""
        from confluent_kafka.admin import AdminClient, NewTopic

        bootstrap = ",".join(self.brokers[n].bootstrap for n in via) if via else self.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        if replica_assignment is not None:
            assert len(replica_assignment) == partitions
            assert all(len(r) == replication_factor for r in replica_assignment)
            new_topic = NewTopic(name, partitions, replica_assignment=replica_assignment, config=dict(configs or {}))
        else:
            new_topic = NewTopic(name, partitions, replication_factor, config=dict(configs or {}))
        futures = admin.create_topics([new_topic], operation_timeout=20)
        futures[name].result(30)
        return self.wait_for_leaders(name, partitions)

    def leader_of(self, topic: str, partition: int = 0) -> int:
        return self.metadata([topic]).topics[topic][partition].leader

    def wait_for_leaders(self, topic: str, partitions: int, *, excluding: set[int] = frozenset(),
                         timeout_s: float = 30) -> dict[int, PartitionView]:
        """Until every partition of ``topic`` has a live leader (not in ``excluding``); returns them."""
        def ready():
            try:
                view = self.metadata([topic]).topics.get(topic, {})
            except OSError:
                return None
            if len(view) != partitions:
                return None
            if all(p.leader > 0 and p.leader not in excluding and p.leader in self.brokers
                   and self.brokers[p.leader].alive() for p in view.values()):
                return view
            return None
        return wait_until(ready, what=f"a live leader for every partition of {topic}", timeout_s=timeout_s)

    def wait_for_isr(self, topic: str, partitions: int, size: int, timeout_s: float = 60) -> dict[int, PartitionView]:
        def ready():
            try:
                view = self.metadata([topic]).topics.get(topic, {})
            except OSError:
                return None
            if len(view) == partitions and all(len(p.isr) >= size and p.leader > 0 for p in view.values()):
                return view
            return None
        return wait_until(ready, what=f"every partition of {topic} with an ISR of {size}", timeout_s=timeout_s)

    def log_texts(self) -> str:
        return "\n".join(f"---- broker {i}:\n{b.log_tail(4000)}" for i, b in self.brokers.items())


def produce_acks_all(bootstrap: str, topic: str, values: list[bytes]) -> list[int]:
    """An idempotent acks=all librdkafka producer to partition 0; every value must be acknowledged. Returns the
    offsets, in the order of ``values``."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "message.timeout.ms": 40000})
    results: dict[int, object] = {}
    for index, value in enumerate(values):
        producer.produce(topic, value, partition=0,
                         on_delivery=lambda err, msg, i=index: results.__setitem__(i, err or msg.offset()))
    assert producer.flush(60) == 0, "acks=all records still undelivered after 60 s"
    errors = {i: r for i, r in results.items() if not isinstance(r, int)}
    assert not errors, f"{len(errors)} acks=all records not acknowledged, the first: {next(iter(errors.items()))}"
    return [results[i] for i in range(len(values))]


def log_end(cluster: Cluster, node_id: int, topic: str) -> int:
    """The end offset of partition 0 of ``topic`` in broker ``node_id``'s log files, read from disk."""
    batches = read_partition_log(cluster.brokers[node_id].data_dir, topic, 0)
    return batches[-1].last_offset + 1 if batches else 0
