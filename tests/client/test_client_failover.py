"""The client when the network or a broker fails: connections reset mid-request (through a proxy that cuts
them), a broker of a real three-broker cluster killed with kill -9 while an idempotent acks=all
producer writes to it, and a broker cut off from the cluster that still answers the client (scripted over a
real socket: its Metadata names no leader, its FindCoordinator no coordinator). The invariants: every
acknowledged record is read back exactly once, at the offset it was acknowledged with; metadata never goes
back to an older leader epoch; and a broker whose answer was of no use is not the one asked again."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import struct
import time

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v8 import response as metadata_v8

from copyless.client import Admin, Consumer, Producer, TopicPartition
from copyless.client.cluster import Cluster, Metadata
from copyless.protocol.messages import encode_kio
from tests.support.proxy import CuttingProxy
from tests.support.read_back import assert_exactly_once, read_back
from tests.support.topics import unique_topic


def run(coroutine):
    import uvloop

    return uvloop.run(coroutine)


# --- metadata: leader epochs only move forward ------------------------------------------------------------


def _metadata_response(leader: int, epoch: int, topic: str = "t") -> metadata_v8.MetadataResponse:
    brokers = tuple(
        metadata_v8.MetadataResponseBroker(node_id=n, host="127.0.0.1", port=9000 + n, rack=None) for n in (1, 2, 3)
    )
    partition = metadata_v8.MetadataResponsePartition(
        error_code=ErrorCode.none, partition_index=0, leader_id=leader, leader_epoch=epoch, replica_nodes=(1, 2, 3),
        isr_nodes=(1, 2, 3), offline_replicas=())
    return metadata_v8.MetadataResponse(
        throttle_time=datetime.timedelta(0),
        brokers=brokers, cluster_id="c", controller_id=1,
        topics=(metadata_v8.MetadataResponseTopic(error_code=ErrorCode.none, name=topic, is_internal=False,
                                                  partitions=(partition,), topic_authorized_operations=-2147483648),),
        cluster_authorized_operations=-2147483648)


def test_metadata_keeps_the_newest_leader_epoch_against_a_lagging_broker():
    metadata = Metadata()
    assert metadata.update(_metadata_response(leader=1, epoch=4)) == set()
    assert (metadata.leader("t", 0), metadata.leader_epoch("t", 0)) == (1, 4)
    # A broker that has seen the failover answers with the new leader at a higher epoch...
    metadata.update(_metadata_response(leader=2, epoch=5))
    assert (metadata.leader("t", 0), metadata.leader_epoch("t", 0)) == (2, 5)
    # ...and one that has not still names the old leader: that answer is stale and ignored for the partition.
    assert metadata.update(_metadata_response(leader=1, epoch=4)) == {"t"}
    assert (metadata.leader("t", 0), metadata.leader_epoch("t", 0)) == (2, 5)
    # The same epoch is accepted (ISR changes do not bump the leader epoch).
    assert metadata.update(_metadata_response(leader=2, epoch=5)) == set()
    # Brokers and controller still come from the newest answer.
    assert set(metadata.brokers) == {1, 2, 3}


# --- a broker cut off from the cluster but still reachable ----------------------------------------------------


class _ScriptedBroker:
    """A real listener that answers as broker ``node_id``: ApiVersions v0, Metadata v8 naming ``leader`` for
    partition t-0 at ``epoch`` (among the brokers in ``cluster``), FindCoordinator v1 with ``coordinator_error``
    (0: itself). It stands for a broker whose view stopped changing: cut off from etcd and its peers, it still
    answers a client that reaches it."""

    def __init__(self, node_id: int, *, leader: int, epoch: int, coordinator_error: int = 0) -> None:
        self.node_id, self.leader, self.epoch, self.coordinator_error = node_id, leader, epoch, coordinator_error
        self.cluster: dict[int, int] = {}
        self.asked: dict[int, int] = {}  # api key -> requests answered
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self) -> _ScriptedBroker:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def _answer(self, api_key: int):
        from kio.schema.api_versions.v0 import response as api_versions
        from kio.schema.find_coordinator.v1 import response as find_coordinator

        if api_key == 18:
            return api_versions.ApiVersionsResponse(error_code=ErrorCode.none, api_keys=tuple(
                api_versions.ApiVersion(api_key=key, min_version=0, max_version=high)
                for key, high in ((3, 8), (10, 1), (18, 0))))
        if api_key == 3:
            response = _metadata_response(self.leader, self.epoch)
            brokers = tuple(metadata_v8.MetadataResponseBroker(node_id=n, host="127.0.0.1", port=port, rack=None)
                            for n, port in self.cluster.items())
            return dataclasses.replace(response, brokers=brokers)
        return find_coordinator.FindCoordinatorResponse(
            throttle_time=datetime.timedelta(0), error_code=ErrorCode(self.coordinator_error), error_message=None,
            node_id=-1 if self.coordinator_error else self.node_id, host="127.0.0.1", port=self.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                api_key, _version, correlation_id = struct.unpack(">hhi", (await reader.readexactly(size))[:8])
                self.asked[api_key] = self.asked.get(api_key, 0) + 1
                body = struct.pack(">i", correlation_id) + encode_kio(self._answer(api_key))
                writer.write(struct.pack(">i", len(body)) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


async def _two_brokers(cut_off: _ScriptedBroker, healthy: _ScriptedBroker) -> Cluster:
    for broker in (cut_off, healthy):
        await broker.start()
    ports = {cut_off.node_id: cut_off.port, healthy.node_id: healthy.port}
    cut_off.cluster = healthy.cluster = ports
    cluster = Cluster(f"127.0.0.1:{cut_off.port}", request_timeout_ms=2000, retry_backoff_ms=20)
    await cluster.start()
    # The client already holds a connection to the cut-off broker, as a producer writing to the partition it
    # led does; before, every refresh went to the first live connection, so it asked that broker forever.
    await cluster.connection(cut_off.node_id)
    return cluster


def test_metadata_is_asked_of_another_broker_when_one_names_no_leader():
    async def main():
        cut_off = _ScriptedBroker(1, leader=-1, epoch=5)
        healthy = _ScriptedBroker(2, leader=2, epoch=6)
        cluster = await _two_brokers(cut_off, healthy)
        try:
            assert await cluster.wait_for_topic("t", timeout_ms=5000) == 1
            assert (cluster.metadata.leader("t", 0), cluster.metadata.leader_epoch("t", 0)) == (2, 6)
            assert healthy.asked.get(3, 0) >= 1
        finally:
            await cluster.close()

    run(main())


def test_find_coordinator_is_asked_of_another_broker_after_a_coordinator_error():
    async def main():
        cut_off = _ScriptedBroker(1, leader=1, epoch=5, coordinator_error=15)  # COORDINATOR_NOT_AVAILABLE
        healthy = _ScriptedBroker(2, leader=1, epoch=5)
        cluster = await _two_brokers(cut_off, healthy)
        try:
            await cluster.connection(2)
            connection = await cluster.coordinator("g", timeout_ms=5000)
            assert connection.node_id == 2
            assert cut_off.asked.get(10, 0) <= 1
        finally:
            await cluster.close()

    run(main())


# --- connections reset mid-request ---------------------------------------------------------------------------


@pytest.fixture
def proxied_broker(broker_factory):
    proxy = CuttingProxy()
    broker = broker_factory(extra_args=("--advertise", proxy.address))
    proxy.start(("127.0.0.1", broker.port))
    yield proxy, broker
    proxy.close()


async def _cut_every(proxy: CuttingProxy, interval_s: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await asyncio.sleep(interval_s)
        await asyncio.to_thread(proxy.cut)


@pytest.mark.timeout(180)
def test_idempotent_producer_and_consumer_through_connections_cut_every_200_ms(proxied_broker):
    proxy, _broker = proxied_broker
    topic = unique_topic("cut")

    async def scenario():
        async with Admin(proxy.address) as admin:
            await admin.create_topics([topic], num_partitions=3)
        stop = asyncio.Event()
        cutter = asyncio.create_task(_cut_every(proxy, 0.2, stop))
        acknowledged: dict = {}
        failures = []
        async with Producer(proxy.address, linger_ms=2, batch_size=16 * 1024, retry_backoff_ms=20) as producer:
            deliveries = []
            i = 0
            # At least 20,000 records, and on until a cut has hit a produce request in flight (a quiet machine
            # can send 20,000 between two cuts), at most 200,000.
            while i < 20_000 or (producer.stats["retries"] == 0 and i < 200_000):
                deliveries.append((await producer.send(topic, f"v{i:06d}".encode() * 4), f"v{i:06d}".encode() * 4))
                if i % 200 == 0:
                    await asyncio.sleep(0.005)  # a steady stream over several cuts
                i += 1
            await producer.flush()
            for delivery, value in deliveries:
                try:
                    metadata = await delivery
                except Exception as exc:  # noqa: BLE001 - counted below: there must be none
                    failures.append(exc)
                    continue
                acknowledged[(metadata.partition, metadata.offset)] = value
            retries = producer.stats["retries"]
        assert not failures, failures[:3]
        assert len(acknowledged) == len(deliveries)
        records = await read_back(proxy.address, topic, 3, len(deliveries), fetch_max_wait_ms=100)
        stop.set()
        await cutter
        return acknowledged, records, retries

    acknowledged, records, retries = run(scenario())
    assert proxy.cuts >= 5, "the proxy cut too few connections for the test to mean anything"
    assert retries > 0, "no produce request was ever retried: the cuts missed the producer"
    assert_exactly_once(acknowledged, records)


@pytest.mark.timeout(180)
def test_group_commits_survive_cut_connections(proxied_broker):
    proxy, _broker = proxied_broker
    topic = unique_topic("cutgroup")
    group = unique_topic("g")

    async def scenario():
        async with Admin(proxy.address) as admin:
            await admin.create_topics([topic], num_partitions=2)
        async with Producer(proxy.address) as producer:
            for i in range(3000):
                await producer.send(topic, b"%d" % i, partition=i % 2)
            await producer.flush()
        stop = asyncio.Event()
        cutter = asyncio.create_task(_cut_every(proxy, 0.3, stop))
        consumer = Consumer(topic, bootstrap_servers=proxy.address, group_id=group, auto_offset_reset="earliest",
                            enable_auto_commit=False, heartbeat_interval_ms=200, session_timeout_ms=10_000)
        await consumer.start()
        received = set()
        try:
            deadline = time.monotonic() + 90
            while len(received) < 3000:
                assert time.monotonic() < deadline, f"{len(received)} of 3000 records"
                batch = await consumer.getmany(timeout_ms=300, max_records=100)
                for records in batch.values():
                    received.update((r.partition, r.offset) for r in records)
                if batch:
                    await consumer.commit()  # retried through lost connections and coordinator lookups
            stop.set()
            await cutter
            committed = {p: await consumer.committed(TopicPartition(topic, p)) for p in (0, 1)}
        finally:
            await consumer.close()
        return received, committed

    received, committed = run(scenario())
    assert received == {(i % 2, i // 2) for i in range(3000)}
    assert committed == {0: 1500, 1: 1500}
