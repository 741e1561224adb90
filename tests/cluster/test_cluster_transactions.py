"""Transactions on a three-broker cluster, through librdkafka: the coordinator's broker is killed with -9
in the middle of a transaction that spans partitions led by every broker.

What it pins down: a new coordinator loads the transactional id's state from the replicated
``__transaction_state`` and lets the producer commit the open transaction (the markers go to each
partition's leader by WriteTxnMarkers); partitions whose leader died are led by a follower that tracked the
open and aborted transactions from the batches it replicated, so read_committed consumers see exactly the
committed transactions (never the aborted one) and read_uncommitted ones see everything.
"""

from __future__ import annotations

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Producer  # noqa: E402

from copyless.broker.txn.log import TXN_TOPIC, partition_for  # noqa: E402
from tests.support.read_back import read_topic_to_end  # noqa: E402
from tests.support.topics import unique_topic  # noqa: E402

pytestmark = pytest.mark.timeout(240)

PARTITIONS = 3
TXN_STATE_PARTITIONS = 4


def _read(bootstrap: str, topic: str, isolation: str) -> list[str]:
    # Leaders move in this test: the consumer's errors are librdkafka's to retry.
    return read_topic_to_end(bootstrap, topic, isolation, PARTITIONS, timeout_s=40, errors_retried=True)


def test_the_coordinator_dies_mid_transaction(cluster_factory):
    cluster = cluster_factory(3, config={"transaction.state.log.num.partitions": TXN_STATE_PARTITIONS,
                                         "transaction.state.log.replication.factor": 3})
    topic = unique_topic("txn-cluster")
    # Each broker the preferred leader of one partition: whichever broker coordinates, one leader dies with it.
    cluster.create_topic(topic, PARTITIONS, 3, replica_assignment=[[1, 2, 3], [2, 3, 1], [3, 1, 2]])
    cluster.wait_for_isr(topic, PARTITIONS, 3)
    tid = unique_topic("tid")
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": tid,
                         "transaction.timeout.ms": 60_000, "linger.ms": 5})
    producer.init_transactions(60)
    cluster.wait_for_isr(TXN_TOPIC, TXN_STATE_PARTITIONS, 3)

    def transaction(prefix: str):
        producer.begin_transaction()
        for p in range(PARTITIONS):
            producer.produce(topic, f"{prefix}{p}".encode(), partition=p)
        producer.flush(30)

    transaction("c")
    producer.commit_transaction(60)
    transaction("a")
    producer.abort_transaction(60)
    transaction("o")  # open while its coordinator dies
    leaders = {p: cluster.leader_of(topic, p) for p in range(PARTITIONS)}
    coordinator = cluster.leader_of(TXN_TOPIC, partition_for(tid, TXN_STATE_PARTITIONS))
    cluster.wait_for_isr(topic, PARTITIONS, 3)  # the followers hold the open transaction's batches
    cluster.brokers[coordinator].kill()
    cluster.wait_for_leaders(TXN_TOPIC, TXN_STATE_PARTITIONS, excluding={coordinator})
    cluster.wait_for_leaders(topic, PARTITIONS, excluding={coordinator})

    producer.commit_transaction(90)  # the new coordinator loaded it Ongoing

    committed = sorted([f"c{p}" for p in range(PARTITIONS)] + [f"o{p}" for p in range(PARTITIONS)])
    assert _read(cluster.bootstrap, topic, "read_committed") == committed
    aborted = [f"a{p}" for p in range(PARTITIONS)]
    assert _read(cluster.bootstrap, topic, "read_uncommitted") == sorted(committed + aborted)
    moved = [p for p, leader in leaders.items() if leader == coordinator]
    assert moved, f"the coordinator (node {coordinator}) led none of {topic}'s partitions: {leaders}"
    # The same id goes on with a new transaction through the new coordinator.
    transaction("n")
    producer.commit_transaction(60)
    assert _read(cluster.bootstrap, topic, "read_committed") == sorted(committed + [f"n{p}" for p in range(PARTITIONS)])
