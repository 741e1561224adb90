"""Applying a cluster image (``broker.replica_manager``): an image that failed to apply is not counted as
applied, and a stalled disk does not hold back the partitions' states.

A real broker state (storage on a real data dir, the replica manager, producer state) in this process; the
images are built by hand, as the etcd backend would publish them. The faults are injected in-process: a
transient failure while applying, and a log creation that blocks on its worker thread (a stalled disk).
"""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest

from copyless.broker import replica_manager
from copyless.broker.cluster.image import BrokerInfo, ClusterImage, TopicInfo
from copyless.broker.config import BrokerConfig
from copyless.broker.partition import PartitionState
from copyless.broker.state import Broker


@pytest.fixture
def broker(tmp_path):
    state = Broker(BrokerConfig(data_dir=tmp_path / "data", node_id=1))
    state.startup()
    yield state
    state.replicas.close()
    state.shutdown_logs()


def image(revision: int, states: dict[str, PartitionState], topic_ids: dict[str, uuid.UUID]) -> ClusterImage:
    return ClusterImage(revision=revision, brokers={1: BrokerInfo(1, {}, epoch=1)},
                        topics={name: TopicInfo(name, topic_ids[name], ((1,),)) for name in states},
                        partitions={(name, 0): state for name, state in states.items()})


def test_an_image_that_failed_to_apply_is_applied_again_before_it_counts(broker):
    ids = {"t": uuid.uuid4()}
    failures = []
    apply_configs = broker.apply_broker_configs

    def failing_once(dynamic):
        if not failures:
            failures.append(dynamic)
            raise OSError("injected: a transient failure while applying")
        return apply_configs(dynamic)

    broker.apply_broker_configs = failing_once

    async def scenario():
        broker.replicas.publish(image(5, {"t": PartitionState(1, 0, (1,), (1,), version=5)}, ids))
        await asyncio.wait_for(broker.replicas.wait_applied(5), 10)
        return broker.replicas.get("t", 0)

    partition = asyncio.run(scenario())
    assert failures, "the injected failure never happened"
    assert partition is not None and partition.is_leader, "revision 5 was counted applied without being applied"


def test_a_stalled_disk_does_not_hold_back_the_partitions_states(broker, monkeypatch):
    monkeypatch.setattr(replica_manager, "DISK_STEP_TIMEOUT_S", 0.3, raising=False)
    ids = {"a": uuid.uuid4(), "b": uuid.uuid4()}
    stalled = threading.Event()
    create = broker.replicas.create_logs_blocking

    def stalling(topic, partitions):
        if topic.name == "b":
            assert stalled.wait(30), "never released"
        return create(topic, partitions)

    monkeypatch.setattr(broker.replicas, "create_logs_blocking", stalling)

    async def scenario():
        replicas = broker.replicas
        replicas.publish(image(5, {"a": PartitionState(-1, 0, (1,), (1,), version=5)}, ids))
        await asyncio.wait_for(replicas.wait_applied(5), 10)
        assert not replicas.get("a", 0).is_leader
        # Revision 6: this broker leads "a", and "b" is new (its log creation hangs on the disk).
        replicas.publish(image(6, {"a": PartitionState(1, 1, (1,), (1,), version=6),
                                   "b": PartitionState(1, 0, (1,), (1,), version=6)}, ids))
        try:
            await asyncio.wait_for(replicas.wait_applied(6), 5)
            leads_a = replicas.get("a", 0).is_leader
            has_b = replicas.get("b", 0) is not None
        finally:
            stalled.set()
        # Once the disk answers, "b" follows without any new image.
        for _ in range(100):
            if replicas.get("b", 0) is not None and replicas.get("b", 0).is_leader:
                break
            await asyncio.sleep(0.05)
        return leads_a, has_b, replicas.get("b", 0) is not None and replicas.get("b", 0).is_leader

    leads_a, has_b_while_stalled, leads_b_after = asyncio.run(scenario())
    assert leads_a, "the leadership of 'a' waited for the disk"
    assert not has_b_while_stalled
    assert leads_b_after, "'b' was not created once the disk answered"
