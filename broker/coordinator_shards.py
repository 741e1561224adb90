"""Which keys a coordinator serves: the shards of an internal topic's partitions this broker leads.

Both coordinators place their keys the same way: a key (a group id, a transactional id) hashes to a
partition of an internal topic (``__consumer_offsets``, ``__transaction_state``), and the leader of that
partition is the key's coordinator. ``CoordinatorShards`` owns that placement for one topic, composed into
each service (``GroupService.shard_map``, ``TransactionService.shard_map``):

- the shard map, partition -> shard, where a shard is the service's own object with ``partition``,
  ``leader_epoch``, ``status`` ("loading", "active", "inactive") and ``load_task``;
- following leadership: becoming leader of a partition (or at a new leader epoch) makes a shard at that
  epoch and runs the service's ``load`` in a task; resigning drops the shard, cancels its load and calls the
  service's ``unload`` (which answers whatever it parked and says how many keys it held, for the log);
- ``shard_for``: the key's shard, or the error a client expects: COORDINATOR_NOT_AVAILABLE before start and
  while the broker closes, NOT_COORDINATOR when this broker is not entitled to the shard (or has none),
  COORDINATOR_LOAD_IN_PROGRESS while it loads, COORDINATOR_NOT_AVAILABLE when its load failed;
- ``find_coordinator``: the leader of the key's partition and its endpoint on the client's listener,
  creating the topic on the first lookup when it is absent (Kafka's lazy creation; on a single node it is
  created at start).

Acting only while entitled to (the fencing argument, docs/coordinator-fencing.md). Two coordinators must
never both act for one key: the old one would answer from state its successor is already changing. A
shard acts only while ``entitled``: this broker's metadata lease is valid (``lease_valid``, counted from
the last keepalive etcd answered, so it ends before etcd can expire the lease and let the controller elect
a successor) *and* the broker leads the partition at the shard's leader epoch. A new leader epoch is a new
shard, loaded from the log the ISR holds, so it sees everything its predecessor acknowledged (each service
acknowledges a state change only once it is replicated, acks=all). A cut-off or deposed coordinator
therefore stops answering before its successor can load, and its clients look the coordinator up again.

Pure bookkeeping on the loop thread; the services own what a shard holds, how it is loaded (the log replay
on a worker thread) and how state is written. Nothing here is persisted: after a crash the shards are
rebuilt from leadership and the logs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Generic, Protocol, TypeVar

from kio.schema.errors import ErrorCode

__all__ = ["CoordinatorShards", "Shard"]


class Shard(Protocol):
    """What the shard map reads of a service's shard."""

    partition: int
    leader_epoch: int
    load_task: asyncio.Task | None

    @property
    def status(self) -> str: ...


S = TypeVar("S", bound=Shard)


class CoordinatorShards(Generic[S]):
    """The shards of ``topic`` this broker leads. Loop thread only."""

    def __init__(self, broker: Any, *, topic: str, num_partitions: int,
                 partition_for: Callable[[str, int], int],
                 topic_configs: Callable[[], Mapping[str, str]], replication_factor: Callable[[], int],
                 new_shard: Callable[[int, int], S], load: Callable[[S, Any], Coroutine[Any, Any, None]],
                 unload: Callable[[S], int], log: logging.Logger, task_prefix: str, keys_noun: str,
                 topic_noun: str, partition_noun: str) -> None:
        """``new_shard(partition, leader_epoch)`` makes a loading shard, ``load(shard, partition)`` fills it,
        ``unload(shard)`` retires a dropped one and returns how many keys it held. The nouns name things in
        log lines and FindCoordinator messages ("group(s)", "the offsets topic", "the group's offsets
        partition")."""
        self.broker = broker
        self.topic = topic
        self.num_partitions = num_partitions
        self._partition_for = partition_for
        self._topic_configs = topic_configs
        self._replication_factor = replication_factor
        self._new_shard = new_shard
        self._load = load
        self._unload = unload
        self._log = log
        self._task_prefix = task_prefix
        self._keys_noun = keys_noun
        self._topic_noun = topic_noun
        self._partition_noun = partition_noun
        self.shards: dict[int, S] = {}
        self.started = False
        self.stopping = False
        self._creating: asyncio.Task | None = None

    # --- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """On a single node create the topic now; everywhere, follow the leadership of its partitions (each
        one this broker leads already is loaded)."""
        self.started = True
        self.broker.replicas.leadership_listeners.append(self.on_leadership)
        if not self.broker.config.clustered and self.broker.topic(self.topic) is None:
            await self.broker.create_topic(self.topic, self.num_partitions, dict(self._topic_configs()),
                                           internal=True)
        for partition in list(self.broker.replicas.leading()):
            if partition.topic == self.topic:
                self.on_leadership(partition, True)

    def stop(self) -> None:
        """Follow leadership no more and cancel the loads in flight (the shards stay, for the service's
        shutdown to answer what they parked)."""
        self.stopping = True
        for shard in self.shards.values():
            if shard.load_task is not None:
                shard.load_task.cancel()

    # --- leadership -----------------------------------------------------------------------------------------

    def on_leadership(self, partition, is_leader: bool) -> None:
        """The replica manager's hook: ``partition`` became (or stopped being) led here."""
        if partition.topic != self.topic or self.stopping:
            return
        index = partition.partition
        shard = self.shards.get(index)
        if is_leader:
            if shard is not None and shard.leader_epoch == partition.leader_epoch:
                return
            if shard is not None:
                self._drop(shard, "a new leader epoch")
            shard = self.shards[index] = self._new_shard(index, partition.leader_epoch)
            shard.load_task = asyncio.get_running_loop().create_task(
                self._load(shard, partition), name=f"{self._task_prefix}-load-{index}")
        elif shard is not None:
            self._drop(shard, "leadership moved")

    def _drop(self, shard: S, reason: str) -> None:
        self.shards.pop(shard.partition, None)
        if shard.load_task is not None:
            shard.load_task.cancel()
        count = self._unload(shard)
        self._log.info("%s-%d: unloaded %d %s (%s)", self.topic, shard.partition, count, self._keys_noun, reason)

    # --- which keys are ours --------------------------------------------------------------------------------

    def partition_of(self, key: str) -> int:
        topic = self.broker.topic(self.topic)
        return self._partition_for(key, topic.partitions if topic is not None else self.num_partitions)

    def shard_for(self, key: str) -> tuple[S | None, ErrorCode]:
        """The key's shard when this broker coordinates it and has loaded it, else the error to answer."""
        if not self.started or self.broker.closing:
            return None, ErrorCode.coordinator_not_available
        shard = self.shards.get(self.partition_of(key))
        if shard is None or not self.entitled(shard):
            return None, ErrorCode.not_coordinator
        status = shard.status
        if status == "loading":
            return None, ErrorCode.coordinator_load_in_progress
        if status != "active":
            return None, ErrorCode.coordinator_not_available
        return shard, ErrorCode.none

    def entitled(self, shard: S) -> bool:
        """This broker may act for the shard's keys: its metadata lease is valid and it leads their
        partition at the shard's epoch (module docstring, "Acting only while entitled to")."""
        if not self.broker.metadata.lease_valid():
            return False
        partition = self.broker.replicas.get(self.topic, shard.partition)
        return partition is not None and partition.is_leader and partition.leader_epoch == shard.leader_epoch

    def find_coordinator(self, key: str, listener: str) -> tuple[ErrorCode, str | None, int, str, int]:
        """FindCoordinator: (error, message, node id, host, port) of the leader of the key's partition."""
        image = self.broker.metadata.image
        topic = image.topic(self.topic)
        if topic is None:
            self._maybe_create_topic()
            return ErrorCode.coordinator_not_available, f"{self._topic_noun} is being created", -1, "", -1
        state = image.partition_state(self.topic, self._partition_for(key, topic.partitions))
        leader = image.brokers.get(state.leader) if state is not None else None
        if leader is None or (leader.node_id == self.broker.node_id and not self.broker.metadata.lease_valid()):
            return ErrorCode.coordinator_not_available, f"{self._partition_noun} has no leader", -1, "", -1
        endpoint = leader.endpoints.get(listener)
        if endpoint is None:
            return ErrorCode.coordinator_not_available, f"the coordinator has no {listener} listener", -1, "", -1
        return ErrorCode.none, None, leader.node_id, endpoint[0], endpoint[1]

    def _maybe_create_topic(self) -> None:
        if self._creating is not None and not self._creating.done():
            return
        self._creating = asyncio.get_running_loop().create_task(self._create_topic(),
                                                                name=f"{self._task_prefix}-create-topic")

    async def _create_topic(self) -> None:
        try:
            await self.broker.create_topic(self.topic, self.num_partitions, dict(self._topic_configs()),
                                           replication_factor=self._replication_factor(), internal=True)
        except Exception as exc:
            if getattr(exc, "code", None) != ErrorCode.topic_already_exists:
                self._log.warning("cannot create %s yet: %s", self.topic, getattr(exc, "message", exc))
