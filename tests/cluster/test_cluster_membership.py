"""Joining a cluster, and what a broker does when it should not: two brokers with one id, a data dir from
another cluster, etcd down at start and lost while running, named listeners (issue: cluster metadata in
etcd, "Registration", "Cluster-wide ids", "etcd trouble", "Named listeners")."""

from __future__ import annotations

import re
import threading
import time

import pytest
from kio.schema.errors import ErrorCode

from tests.support.batches import build_batch
from tests.support.broker_process import BrokerProcess, BrokerStartError
from tests.support.cluster import CLUSTER_TEST_CONFIG, Cluster, read_metadata
from tests.support.etcd import EtcdProcess
from tests.support.kio_requests import KafkaWire, create_topic, produce
from tests.support.polling import wait_until


def _member(tmp_path, name: str, url: str, node_id: int, *extra: str) -> BrokerProcess:
    return BrokerProcess(data_dir=tmp_path / name / "data", log_path=tmp_path / name / "broker.log",
                         config=dict(CLUSTER_TEST_CONFIG),
                         extra_args=("--node-id", str(node_id), "--metadata", url, *extra))


def _produce_code(broker: BrokerProcess, topic: str) -> int:
    wire = KafkaWire(broker.port)
    try:
        response = produce(wire, topic, {0: build_batch([b"x"])}, acks=1)
    finally:
        wire.close()
    return response.responses[0].partition_responses[0].error_code


def test_a_second_broker_with_the_same_id_refuses_to_start(cluster_factory, tmp_path):
    cluster = cluster_factory(1)
    twin = _member(tmp_path, "twin", cluster.url, 1)
    started = time.monotonic()
    with pytest.raises(BrokerStartError) as failure:
        twin.start()
    assert "another broker is registered with node id 1" in str(failure.value)
    # It waited for one lease time (a crashed predecessor's lease would have expired), not forever.
    assert time.monotonic() - started < 30
    assert twin.process.returncode == 1
    # The first broker is untouched.
    assert sorted(cluster.metadata().brokers) == [1]


def test_a_restarted_broker_takes_its_own_id_back_at_once(cluster_factory):
    # A lease long enough that the restart surely comes before it expires, even on a loaded machine: the
    # old registration is still there, and must be revoked rather than waited out.
    cluster = cluster_factory(1, config={"broker.session.timeout.ms": 20000})
    broker = cluster.brokers[1]
    epoch_line = re.compile(r"registered: broker epoch (\d+)")
    first = int(epoch_line.findall(broker.log_text())[-1])
    broker.kill()
    broker.start()  # the same data dir: its previous registration is revoked, no lease wait
    second = int(epoch_line.findall(broker.log_text())[-1])
    assert second > first
    assert "revoking the registration of this broker's previous process" in broker.log_text()


def test_a_data_dir_from_another_cluster_refuses_to_start(etcd_server, tmp_path):
    first = _member(tmp_path, "b", etcd_server.url("cluster-a"), 1).start()
    first.stop()
    other = _member(tmp_path, "b", etcd_server.url("cluster-b"), 1)
    with pytest.raises(BrokerStartError) as failure:
        other.start()
    assert "belongs to cluster" in str(failure.value)
    assert other.process.returncode == 1


def test_etcd_down_at_start_is_retried_until_it_comes(tmp_path):
    etcd = EtcdProcess(tmp_path / "etcd")
    broker = _member(tmp_path, "b", etcd.url(), 1)
    starter = threading.Thread(target=broker.start)
    starter.start()  # BrokerProcess.start returns once the broker serves: only after etcd came up
    try:
        wait_until(lambda: broker.log_path.exists() and "cannot reach etcd at" in broker.log_text(),
                   what="the broker saying it cannot reach etcd", timeout_s=60)
        assert "retrying in" in broker.log_text()
        assert "copyless listening on" not in broker.log_text()  # it does not serve without its metadata
        etcd.start()
        starter.join(timeout=90)
        assert not starter.is_alive() and broker.alive()
        assert sorted(read_metadata(broker.bootstrap).brokers) == [1]
    finally:
        starter.join(timeout=90)
        if broker.process is not None:
            broker.stop()
        etcd.stop()


def test_a_broker_cut_off_from_etcd_stops_writes_when_its_lease_would_expire_and_recovers(tmp_path):
    etcd = EtcdProcess(tmp_path / "etcd").start()
    cluster = Cluster(tmp_path / "cluster", etcd, 1).start()
    broker = cluster.brokers[1]
    try:
        wire = KafkaWire(broker.port)
        assert create_topic(wire, "cut", 1).error_code == ErrorCode.none
        wire.close()
        wait_until(lambda: _produce_code(broker, "cut") == ErrorCode.none, what="the new topic takes writes",
                   timeout_s=10)
        etcd.pause()  # etcd stops answering: keepalives time out
        stopped_at = time.monotonic()
        wait_until(lambda: _produce_code(broker, "cut") == ErrorCode.not_leader_or_follower,
                   what="writes refused once the lease may have expired", timeout_s=15)
        # Not before the lease (2 s) could have expired: it kept serving until then.
        assert time.monotonic() - stopped_at >= 1.0
        partition = read_metadata(broker.bootstrap, ["cut"]).topics["cut"][0]
        assert partition.leader == -1 and partition.error_code == ErrorCode.leader_not_available
        etcd.resume()
        wait_until(lambda: _produce_code(broker, "cut") == ErrorCode.none,
                   what="writes accepted again once etcd is back", timeout_s=30)
        assert read_metadata(broker.bootstrap, ["cut"]).topics["cut"][0].leader == 1
    finally:
        etcd.resume()
        cluster.stop()
        etcd.stop()


def test_metadata_answers_with_the_addresses_of_the_listener_asked(cluster_factory):
    cluster = cluster_factory(2, extra_args=("--listener", "INSIDE=127.0.0.1:0", "--listener", "OUTSIDE=127.0.0.1:0",
                                             "--inter-broker-listener", "INSIDE"))
    listeners = {}
    for node_id, broker in cluster.brokers.items():
        found = re.search(r"listeners=INSIDE=127\.0\.0\.1:(\d+)->\S+ OUTSIDE=127\.0\.0\.1:(\d+)->\S+",
                          broker.log_text())
        assert found, broker.log_tail()
        listeners[node_id] = {"INSIDE": int(found.group(1)), "OUTSIDE": int(found.group(2))}
    for name in ("INSIDE", "OUTSIDE"):
        view = read_metadata(f"127.0.0.1:{listeners[1][name]}")
        assert view.brokers == {node_id: ("127.0.0.1", ports[name]) for node_id, ports in listeners.items()}
