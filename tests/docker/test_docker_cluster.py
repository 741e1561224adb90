"""The compose cluster (docker-compose.yml: three brokers on a three-node etcd) on the real Docker engine.

Every test here needs the brokers' etcd mode (`copyless serve --metadata etcd://...`) and skips, saying so,
until `copyless serve --help` offers it.

Invariants: from a clean state the six containers turn healthy, each broker registers under
``/copyless/<cluster_id>/brokers/<id>`` with its two named listeners, and every broker describes the same three
brokers at the host addresses the host can reach; an RF-3 topic takes acks=all writes through the published
ports and reads them back whole; with one etcd node killed the brokers keep serving, metadata writes
(a new topic) still go through, and a killed partition leader is replaced with nothing acknowledged lost;
after `down` and `up` (volumes kept) every record is still there and offsets continue.
"""

from __future__ import annotations

import base64
import json

import pytest

from tests.docker import docker_harness as harness
from tests.support.polling import wait_until

pytestmark = [pytest.mark.timeout(900), pytest.mark.usefixtures("cluster_mode")]

BROKERS = ("broker1", "broker2", "broker3")
ETCD = ("etcd1", "etcd2", "etcd3")
# The cluster's etcd layout: /<chroot>/cluster_id holds the id, /<chroot>/<cluster_id>/brokers/<id> each live
# broker's registration ({"endpoints": {"NAME": "host:port"}, ...}); the compose file sets no chroot.
CHROOT = "/copyless"


def _etcd_json(project: harness.ComposeProject, key: str, *, prefix: bool = False) -> dict[str, str]:
    """key -> value (decoded) of ``key`` (or every key under it) read from etcd1."""
    args = ["get", key, "-w", "json"] + (["--prefix"] if prefix else [])
    response = json.loads(project.etcdctl("etcd1", *args).stdout)
    return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv["value"]).decode()
            for kv in response.get("kvs", [])}


def _cluster_id(project: harness.ComposeProject) -> str:
    (cluster_id,) = _etcd_json(project, f"{CHROOT}/cluster_id").values()
    return cluster_id.strip().strip('"')


def _values(n: int, tag: str) -> list[bytes]:
    return [f"{tag}-{i:05d}".encode() for i in range(n)]


def _read_all(project, topic: str, partitions: int, count: int, services=()) -> dict[int, list[bytes]]:
    records = harness.consume(project.bootstrap(*services), topic, list(range(partitions)), count)
    by_partition: dict[int, list[tuple[int, bytes]]] = {}
    for partition, offset, _, value in records:
        by_partition.setdefault(partition, []).append((offset, value))
    for partition, entries in by_partition.items():
        assert [o for o, _ in entries] == list(range(len(entries))), f"partition {partition}: offsets {entries[:5]}..."
    return {p: [v for _, v in entries] for p, entries in by_partition.items()}


def _acknowledged_by_partition(values, acknowledged) -> dict[int, list[bytes]]:
    out: dict[int, list[tuple[int, bytes]]] = {}
    for value, (partition, offset) in zip(values, acknowledged, strict=False):
        out.setdefault(partition, []).append((offset, value))
    return {p: [v for _, v in sorted(entries)] for p, entries in out.items()}


def test_cluster_from_a_clean_state(compose_project):
    project = compose_project("cluster")
    assert project.volumes() == []
    project.timed_up(label="cluster (3 etcd + 3 brokers)")

    for service in (*ETCD, *BROKERS):
        assert project.state(service).health == "healthy", service

    registrations = _etcd_json(project, f"{CHROOT}/{_cluster_id(project)}/brokers/", prefix=True)
    assert sorted(registrations) == [f"{CHROOT}/{_cluster_id(project)}/brokers/{n}" for n in (1, 2, 3)]
    for key, value in registrations.items():
        node_id = int(key.rsplit("/", 1)[1])
        service = harness.broker_service(node_id)
        assert json.loads(value)["endpoints"] == {
            "INTERNAL": f"{service}-internal:9092",
            "EXTERNAL": f"127.0.0.1:{project.ports[service]}",
        }

    # Every broker, asked through its own published port, describes the same cluster at host addresses.
    expected = {n: f"127.0.0.1:{project.ports[harness.broker_service(n)]}" for n in (1, 2, 3)}
    for service in BROKERS:
        assert harness.metadata_brokers(project.bootstrap(service)) == expected

    # Every broker serves Prometheus metrics on the cluster network (cluster/broker.toml), where the opt-in
    # Prometheus scrapes them: asked from broker1's container, by each broker's cluster-only alias.
    for service in BROKERS:
        body = project.exec("broker1", "python3", "-c", "import sys, urllib.request; sys.stdout.write(urllib.request"
                            f".urlopen('http://{service}-internal:9404/metrics', timeout=10).read().decode())").stdout
        assert "\ncopyless_" in body and "# TYPE " in body, body[:500]


def test_cluster_rf3_topic_round_trip_through_the_published_ports(compose_project):
    project = compose_project("cluster")
    project.timed_up(label="cluster (3 etcd + 3 brokers)")
    harness.create_topic(project.bootstrap(), "rf3", partitions=3, replication_factor=3,
                         configs={"min.insync.replicas": "2"})
    partitions = harness.describe_partitions(project.bootstrap(), "rf3")
    assert sorted(partitions) == [0, 1, 2]
    for description in partitions.values():
        assert sorted(description.replicas) == [1, 2, 3] and description.leader in (1, 2, 3)

    values = _values(600, "rf3")
    acknowledged = harness.produce(project.bootstrap(), "rf3", values)
    assert _read_all(project, "rf3", 3, len(values)) == _acknowledged_by_partition(values, acknowledged)


def test_cluster_keeps_working_with_one_etcd_node_killed(compose_project):
    project = compose_project("cluster")
    project.timed_up(label="cluster (3 etcd + 3 brokers)")
    harness.create_topic(project.bootstrap(), "before", partitions=3, replication_factor=3,
                         configs={"min.insync.replicas": "2"})
    first = _values(300, "before")
    acknowledged = harness.produce(project.bootstrap(), "before", first)

    project.kill("etcd1")
    project.wait_state("etcd1", ("exited",))
    # When etcd1 led etcd, the other two elect a leader first (an election timeout, ~1 s): until then a broker's
    # etcd write fails (CreateTopics then closes the connection), so the test waits for etcd as a client would.
    wait_until(lambda: project.etcdctl("etcd2", "put", "/copyless-test/quorum", "2",
                                       endpoints="http://etcd2:2379,http://etcd3:2379", check=False,
                                       command_timeout_s=2).returncode == 0,
               what="etcd2 and etcd3 to take a write after etcd1's death", timeout_s=30, interval_s=0.5)

    # Writes through the brokers and a metadata write (a topic) both still succeed on two etcd nodes.
    second = _values(300, "after")
    acknowledged += harness.produce(project.bootstrap(), "before", second)
    harness.create_topic(project.bootstrap(), "during", partitions=1, replication_factor=3)
    assert harness.produce(project.bootstrap(), "during", [b"x"]) == [(0, 0)]
    for service in BROKERS:
        state = project.state(service)
        assert (state.status, state.restarts) == ("running", 0), f"{service}: {state}\n{project.logs(service, tail=40)}"

    # And a broker failover still works on two etcd nodes: its lease expires, the controller moves its
    # partitions, acks=all writes go on, and nothing acknowledged is lost.
    victim = harness.describe_partitions(project.bootstrap(), "before")[0].leader
    project.kill(harness.broker_service(victim))
    survivors = [s for s in BROKERS if s != harness.broker_service(victim)]
    seen: list = []

    def new_leaders() -> bool:
        try:
            partitions = harness.describe_partitions(project.bootstrap(*survivors), "before", timeout_s=10)
        except Exception as exc:  # a survivor mid-failover: ask again until the deadline
            seen[:] = [exc]
            return False
        seen[:] = [partitions]
        return all(p.leader not in (victim, -1) for p in partitions.values())

    wait_until(new_leaders, what=f"new leaders without broker {victim}", timeout_s=60, interval_s=0.2,
               detail=lambda: f"the last answer: {seen}")
    third = _values(300, "failover")
    acknowledged += harness.produce(project.bootstrap(*survivors), "before", third)
    assert _read_all(project, "before", 3, len(first) + len(second) + len(third), survivors) == \
        _acknowledged_by_partition(first + second + third, acknowledged)


def test_cluster_keeps_its_data_across_down_and_up(compose_project):
    project = compose_project("cluster")
    project.timed_up(label="cluster (3 etcd + 3 brokers)")
    harness.create_topic(project.bootstrap(), "kept", partitions=3, replication_factor=3)
    first = _values(300, "first")
    acknowledged = harness.produce(project.bootstrap(), "kept", first)
    cluster_id = _cluster_id(project)

    project.stop(*BROKERS)
    for service in BROKERS:
        state = project.wait_state(service, ("exited",))
        assert state.exit_code == 0, f"{service}: {state}\n{project.logs(service, tail=40)}"
    project.down()
    assert project.container("broker1") is None and project.volumes() != []

    project.timed_up(label="cluster, second up")
    assert _cluster_id(project) == cluster_id
    second = _values(30, "second")
    acknowledged += harness.produce(project.bootstrap(), "kept", second)
    assert _read_all(project, "kept", 3, len(first) + len(second)) == _acknowledged_by_partition(
        first + second, acknowledged
    )
