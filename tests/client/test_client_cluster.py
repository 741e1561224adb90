"""The client against a real three-broker cluster (real etcd, ``copyless serve`` processes): a broker leading
partitions is killed with kill -9 while the idempotent acks=all ``Producer`` writes to every partition,
and every acknowledged record is read back exactly once by the ``Consumer``, at the offset it was
acknowledged with. With replication factor 1 the partitions of the dead broker wait for it to restart on
its port (the producer holds their batches, retrying, within delivery_timeout_ms); with replication factor
3 a follower takes over and the producer follows the new leader."""

from __future__ import annotations

import asyncio
import time

import pytest

from copyless.client import Admin, Consumer, Producer, TopicPartition
from tests.support.cluster import Cluster
from tests.support.read_back import assert_exactly_once, read_back
from tests.support.topics import unique_topic


@pytest.fixture
def cluster(etcd_server, tmp_path):
    cluster = Cluster(tmp_path / "cluster", etcd_server, 3).start()
    yield cluster
    cluster.stop()


def run(coroutine):
    import uvloop

    return uvloop.run(coroutine)


async def _produce_through(cluster: Cluster, topic: str, partitions: int, count: int, fault, *,
                           at: int) -> tuple[dict, list, int]:
    # delivery_timeout_ms bounds the test too: pytest-timeout's alarm cannot interrupt a uvloop run.
    """Send ``count`` records round-robin over the partitions, calling ``fault()`` (in a thread) after
    ``at`` of them; returns ({(partition, offset): value} acknowledged, failures, retries)."""
    acknowledged: dict = {}
    failures: list = []
    async with Producer(cluster.bootstrap, linger_ms=2, batch_size=16 * 1024, retry_backoff_ms=50,
                        delivery_timeout_ms=60_000, request_timeout_ms=10_000) as producer:
        deliveries = []
        fault_task = None
        for i in range(count):
            value = f"r{i:06d}".encode()
            deliveries.append((await producer.send(topic, value, partition=i % partitions), value))
            if i == at:
                fault_task = asyncio.create_task(asyncio.to_thread(fault))
            if i % 100 == 0:
                await asyncio.sleep(0.01)  # a steady stream across the failure, not one burst
        await producer.flush()
        if fault_task is not None:
            await fault_task
        for delivery, value in deliveries:
            try:
                metadata = await delivery
            except Exception as exc:  # noqa: BLE001 - the test asserts there are none
                failures.append(exc)
                continue
            acknowledged[(metadata.partition, metadata.offset)] = value
        retries = producer.stats["retries"]
    return acknowledged, failures, retries


@pytest.mark.timeout(300)
def test_a_killed_and_restarted_broker_loses_no_acknowledged_record_replication_factor_1(cluster):
    topic = unique_topic("rf1")
    partitions = 6

    async def scenario():
        async with Admin(cluster.bootstrap) as admin:
            await admin.create_topics([topic], num_partitions=partitions, replication_factor=1)
        leaders = cluster.wait_for_leaders(topic, partitions)
        victim = cluster.brokers[leaders[0].leader]
        assert len({p.leader for p in leaders.values()}) > 1, "the partitions did not spread over brokers"

        def kill_and_restart():
            victim.kill()
            time.sleep(1.5)  # the producer meanwhile finds the connection gone and retries
            victim.start(port=victim.port)

        acknowledged, failures, retries = await _produce_through(cluster, topic, partitions, 12_000,
                                                                 kill_and_restart, at=3_000)
        records = await read_back(cluster.bootstrap, topic, partitions, 12_000, fetch_max_wait_ms=100)
        return acknowledged, failures, retries, records

    acknowledged, failures, retries, records = run(scenario())
    assert not failures, failures[:3]
    assert len(acknowledged) == 12_000
    assert retries > 0, "no batch was retried: the kill did not reach the producer"
    assert_exactly_once(acknowledged, records)


@pytest.mark.timeout(300)
def test_a_killed_leader_moves_and_the_producer_follows_it_replication_factor_3(cluster):
    topic = unique_topic("rf3")
    partitions = 3

    async def scenario():
        async with Admin(cluster.bootstrap) as admin:
            await admin.create_topics([topic], num_partitions=partitions, replication_factor=3,
                                      configs={"min.insync.replicas": "2"})
        before = cluster.wait_for_isr(topic, partitions, 3)
        victim = before[0].leader

        acknowledged, failures, retries = await _produce_through(
            cluster, topic, partitions, 12_000, cluster.brokers[victim].kill, at=3_000)
        after = cluster.wait_for_leaders(topic, partitions, excluding={victim})
        records = await read_back(cluster.bootstrap, topic, partitions, 12_000, fetch_max_wait_ms=100)
        return before, after, victim, acknowledged, failures, retries, records

    before, after, victim, acknowledged, failures, retries, records = run(scenario())
    assert after[0].leader != victim and after[0].leader_epoch > before[0].leader_epoch
    assert not failures, failures[:3]
    assert len(acknowledged) == 12_000
    assert retries > 0, "no batch was retried: the kill did not reach the producer"
    assert_exactly_once(acknowledged, records)


@pytest.mark.timeout(300)
def test_a_group_consumer_finds_its_coordinator_again_after_a_kill(cluster):
    """The broker coordinating the group (leading its __consumer_offsets partition) is killed mid-stream:
    the consumer finds the new coordinator, keeps its partitions, and every record arrives; the commits
    made after the kill are the ones the group ends with."""
    from copyless.client.cluster import Cluster as ClientCluster

    topic, group = unique_topic("coord"), unique_topic("g")

    async def scenario():
        async with Admin(cluster.bootstrap) as admin:
            await admin.create_topics([topic], num_partitions=3, replication_factor=3)
        cluster.wait_for_isr(topic, 3, 3)
        async with Producer(cluster.bootstrap) as producer:
            for i in range(3000):
                await producer.send(topic, b"%d" % i, partition=i % 3)
            await producer.flush()
        lookup = ClientCluster(cluster.bootstrap)
        consumer = Consumer(topic, bootstrap_servers=cluster.bootstrap, group_id=group, auto_offset_reset="earliest",
                            enable_auto_commit=False, heartbeat_interval_ms=300, session_timeout_ms=10_000,
                            fetch_max_wait_ms=100, request_timeout_ms=10_000)
        await consumer.start()
        received = set()
        killed = None
        try:
            deadline = time.monotonic() + 120
            while len(received) < 3000:
                assert time.monotonic() < deadline, f"{len(received)} of 3000 records"
                batch = await consumer.getmany(timeout_ms=300, max_records=200)
                for records in batch.values():
                    received.update((r.partition, r.offset) for r in records)
                if batch:
                    await consumer.commit()
                if killed is None and len(received) >= 1000:
                    await lookup.start()
                    killed = (await lookup.coordinator(group)).node_id
                    await lookup.close()
                    await asyncio.to_thread(cluster.brokers[killed].kill)
            committed = {p: await consumer.committed(TopicPartition(topic, p)) for p in range(3)}
        finally:
            await consumer.close()
        return killed, received, committed

    killed, received, committed = run(scenario())
    assert killed is not None
    assert received == {(i % 3, i // 3) for i in range(3000)}
    assert committed == {0: 1000, 1: 1000, 2: 1000}
