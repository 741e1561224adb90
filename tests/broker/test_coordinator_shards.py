"""The coordinators' shard map (broker/coordinator_shards.py) as a state machine: what ``shard_for``
answers before start, while not entitled (no shard, lease lapsed, partition led at another epoch or not at
all), while loading, once active, after a failed load, after resigning and while the broker closes; and what
``find_coordinator`` answers and creates. The replica manager, the metadata backend and the broker are
small fakes holding exactly the state the map reads; the services' own use of it runs in tests/groups,
tests/transactions and tests/cluster/test_coordinator_fencing.py against real brokers."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from types import SimpleNamespace

from kio.schema.errors import ErrorCode

from copyless.broker.coordinator_shards import CoordinatorShards

TOPIC = "__test_state"
NODE = 1


@dataclass
class FakePartition:
    partition: int
    leader_epoch: int
    is_leader: bool = True
    topic: str = TOPIC


@dataclass
class FakeShard:
    partition: int
    leader_epoch: int
    status: str = "loading"
    load_task: asyncio.Task | None = None


class FakeReplicas:
    def __init__(self) -> None:
        self.leadership_listeners: list = []
        self.partitions: dict[int, FakePartition] = {}

    def get(self, topic: str, index: int):
        return self.partitions.get(index) if topic == TOPIC else None

    def leading(self):
        return [p for p in self.partitions.values() if p.is_leader]

    def lead(self, index: int, epoch: int) -> FakePartition:
        """This broker becomes leader of ``index`` at ``epoch`` (the replica manager tells its listeners)."""
        partition = self.partitions[index] = FakePartition(index, epoch)
        for listener in self.leadership_listeners:
            listener(partition, True)
        return partition

    def resign(self, index: int) -> None:
        partition = self.partitions[index]
        partition.is_leader = False
        for listener in self.leadership_listeners:
            listener(partition, False)


@dataclass
class FakeImage:
    topics: dict[str, int] = field(default_factory=dict)  # name -> partition count
    leaders: dict[int, int] = field(default_factory=dict)  # partition -> leader node
    brokers: dict[int, SimpleNamespace] = field(default_factory=dict)

    def topic(self, name: str):
        return SimpleNamespace(partitions=self.topics[name]) if name in self.topics else None

    def partition_state(self, name: str, index: int):
        return SimpleNamespace(leader=self.leaders[index]) if index in self.leaders else None


class FakeBroker:
    def __init__(self, *, clustered: bool) -> None:
        self.config = SimpleNamespace(clustered=clustered)
        self.node_id = NODE
        self.closing = False
        self.replicas = FakeReplicas()
        self.lease = True
        self.metadata = SimpleNamespace(image=FakeImage(), lease_valid=lambda: self.lease)
        self.created: list[tuple] = []

    def topic(self, name: str):
        return self.metadata.image.topic(name)

    async def create_topic(self, name, partitions, configs, *, replication_factor=None, internal=False):
        self.created.append((name, partitions, configs, replication_factor, internal))
        self.metadata.image.topics[name] = partitions


class Service:
    """The part a coordinator service plays: shards it makes, loads (until told to finish) and unloads."""

    def __init__(self, broker: FakeBroker) -> None:
        self.loads: dict[tuple[int, int], asyncio.Future] = {}
        self.unloaded: list[FakeShard] = []
        self.map = CoordinatorShards(
            broker, topic=TOPIC, num_partitions=2, partition_for=lambda key, count: int(key) % count,
            topic_configs=lambda: {"cleanup.policy": "compact"}, replication_factor=lambda: 3,
            new_shard=FakeShard, load=self.load, unload=self.unload, log=logging.getLogger("test.shards"),
            task_prefix="test", keys_noun="key(s)", topic_noun="the test topic", partition_noun="the key's partition")

    async def load(self, shard: FakeShard, partition) -> None:
        outcome = self.loads[(shard.partition, shard.leader_epoch)] = asyncio.get_running_loop().create_future()
        shard.status = "active" if await outcome else "inactive"

    def finish(self, index: int, epoch: int, ok: bool = True) -> None:
        self.loads[(index, epoch)].set_result(ok)

    def unload(self, shard: FakeShard) -> int:
        self.unloaded.append(shard)
        return 7


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_shard_for_follows_start_entitlement_loading_and_resignation(caplog):
    async def scenario():
        broker = FakeBroker(clustered=False)
        service = Service(broker)
        shards = service.map
        broker.replicas.partitions[0] = FakePartition(0, 4)  # led before start: loaded by start

        assert shards.shard_for("0") == (None, ErrorCode.coordinator_not_available)
        await shards.start()
        assert broker.created == [(TOPIC, 2, {"cleanup.policy": "compact"}, None, True)]  # single node: at start
        await settle()
        assert shards.shard_for("0") == (None, ErrorCode.coordinator_load_in_progress)
        assert shards.shard_for("1") == (None, ErrorCode.not_coordinator)  # partition 1 is not led here

        service.finish(0, 4)
        await settle()
        shard, error = shards.shard_for("2")  # 2 % 2: partition 0
        assert error == ErrorCode.none and (shard.partition, shard.leader_epoch, shard.status) == (0, 4, "active")

        broker.lease = False  # lease lapsed: the successor may be elected any time now
        assert shards.shard_for("0") == (None, ErrorCode.not_coordinator)
        broker.lease = True
        assert shards.shard_for("0") == (shard, ErrorCode.none)

        # The replica manager moved to epoch 5 before telling the listener: the epoch-4 shard is fenced.
        broker.replicas.partitions[0] = FakePartition(0, 5)
        assert shards.shard_for("0") == (None, ErrorCode.not_coordinator)
        broker.replicas.partitions[0].is_leader = False
        assert shards.shard_for("0") == (None, ErrorCode.not_coordinator)

        with caplog.at_level(logging.INFO, logger="test.shards"):
            broker.replicas.lead(0, 5)  # a new epoch: the old shard goes, a new one loads
            assert service.unloaded == [shard]
            await settle()
            assert shards.shard_for("0") == (None, ErrorCode.coordinator_load_in_progress)
            assert shards.shards[0] is not shard and shards.shards[0].leader_epoch == 5
            reloading = shards.shards[0]

            broker.replicas.lead(0, 5)  # the same epoch again: nothing changes
            assert shards.shards[0] is reloading

            broker.replicas.resign(0)  # while loading: the load is cancelled and the shard dropped
            await settle()
            assert reloading.load_task.cancelled()
            assert service.unloaded == [shard, reloading] and 0 not in shards.shards
            assert shards.shard_for("0") == (None, ErrorCode.not_coordinator)
        assert [r.getMessage() for r in caplog.records] == [
            f"{TOPIC}-0: unloaded 7 key(s) (a new leader epoch)", f"{TOPIC}-0: unloaded 7 key(s) (leadership moved)"]

        broker.replicas.lead(1, 2)
        await settle()
        service.finish(1, 2, ok=False)  # an unreadable log: its keys stay unavailable
        await settle()
        assert shards.shard_for("1") == (None, ErrorCode.coordinator_not_available)

        broker.replicas.lead(0, 6)
        await settle()
        service.finish(0, 6)
        await settle()
        assert shards.shard_for("0")[1] == ErrorCode.none
        broker.closing = True
        assert shards.shard_for("0") == (None, ErrorCode.coordinator_not_available)

        shards.stop()  # stopping: leadership is followed no more
        broker.replicas.lead(1, 3)
        assert shards.shards[1].leader_epoch == 2

    asyncio.run(scenario())


def test_find_coordinator_names_the_leader_and_creates_the_topic_once():
    async def scenario():
        broker = FakeBroker(clustered=True)
        shards = Service(broker).map
        await shards.start()
        assert broker.created == []  # in a cluster the topic waits for the first lookup

        assert shards.find_coordinator("0", "PLAINTEXT") == (
            ErrorCode.coordinator_not_available, "the test topic is being created", -1, "", -1)
        shards.find_coordinator("1", "PLAINTEXT")  # while the creation runs: no second one
        await settle()
        assert broker.created == [(TOPIC, 2, {"cleanup.policy": "compact"}, 3, True)]

        assert shards.find_coordinator("1", "PLAINTEXT") == (
            ErrorCode.coordinator_not_available, "the key's partition has no leader", -1, "", -1)
        image = broker.metadata.image
        image.brokers = {NODE: SimpleNamespace(node_id=NODE, endpoints={"PLAINTEXT": ("h1", 9092)}),
                         2: SimpleNamespace(node_id=2, endpoints={"PLAINTEXT": ("h2", 9093)})}
        image.leaders = {0: NODE, 1: 2}
        assert shards.find_coordinator("1", "PLAINTEXT") == (ErrorCode.none, None, 2, "h2", 9093)
        assert shards.find_coordinator("0", "PLAINTEXT") == (ErrorCode.none, None, NODE, "h1", 9092)
        assert shards.find_coordinator("0", "SSL") == (
            ErrorCode.coordinator_not_available, "the coordinator has no SSL listener", -1, "", -1)
        broker.lease = False  # this broker may no longer lead: never name itself
        assert shards.find_coordinator("0", "PLAINTEXT")[0] == ErrorCode.coordinator_not_available
        assert shards.find_coordinator("1", "PLAINTEXT")[2] == 2

    asyncio.run(scenario())
