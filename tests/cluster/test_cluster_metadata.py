"""Cluster metadata in etcd, seen from outside: several brokers, one controller, partitions placed across
them, and clients that route to leaders by themselves (issue: cluster metadata in etcd)."""

from __future__ import annotations

from collections import Counter

from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.cluster import Cluster


def create_topic(cluster: Cluster, name: str, partitions: int, replication_factor: int, via: int = 2,
                 **configs) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.brokers[via].bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, replication_factor, config=configs)],
                                  operation_timeout=20)
    futures[name].result(30)


def test_a_topic_spreads_its_leaders_over_every_broker(cluster_factory):
    cluster = cluster_factory(3)
    view = cluster.metadata()
    assert sorted(view.brokers) == [1, 2, 3]
    assert view.controller_id in (1, 2, 3)
    # Created through a broker that may not be the controller: forwarded to it.
    create_topic(cluster, "spread", 6, 1, via=2)
    leaders = cluster.wait_for_leaders("spread", 6)
    assert Counter(p.leader for p in leaders.values()) == {1: 2, 2: 2, 3: 2}
    for partition in leaders.values():
        assert partition.replicas == (partition.leader,) and partition.isr == (partition.leader,)
        assert partition.leader_epoch == 0
    # Every broker answers the same placement.
    for node_id in (1, 2, 3):
        again = cluster.metadata(["spread"], via=node_id).topics["spread"]
        assert {p: v.leader for p, v in again.items()} == {p: v.leader for p, v in leaders.items()}
