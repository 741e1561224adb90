"""The controller: the one broker that writes topic assignments and partition leadership to etcd.

Election (ZooKeeper-era Kafka's ``/controller`` znode plus ``/controller_epoch``, as one etcd transaction):
a broker that sees no controller key runs

    if create_revision(controller) == 0 and mod_revision(controller_epoch) == seen:
        put controller = {"broker_id": me}   (on this broker's lease)
        put controller_epoch = seen_value + 1

Exactly one candidate's transaction succeeds (etcd serialises them; the loser's comparisons fail). The
winner's fencing token is the revision of that transaction, the controller-epoch key's mod_revision.

An election whose answer was lost. The transaction may commit while its answer never arrives (the call's
deadline passed: etcd was slow, the connection dropped). The candidate then does not know it won, yet the
key names it, on its live lease, and no other broker stands while the key is there: nothing would act as
controller until that lease ended. So the backend takes office from its image instead: when the watched
controller key names this broker on its current lease and the controller-epoch key was written by the same
transaction (equal mod_revisions), the election was this broker's, and that revision is its token
(``take_office``). A candidate that is no longer sure of its lease does not take office; its key goes with
the lease, and the brokers stand again.

Safety: every write a controller makes carries ``mod_revision(controller_epoch) == token`` among its
comparisons. A controller whose lease expired lost its controller key with it; the next controller bumped
the controller epoch in its election, so the old controller's token no longer matches and etcd refuses its
writes, however late they arrive. A refused write makes the controller read the epoch key and resign if it
moved. Partition-state writes also carry ``mod_revision(state) == version`` of the state they were
computed from, so a controller never overwrites an ISR change a leader made meanwhile (it recomputes from
the next image), and a leader's ISR change fails if the controller moved the partition first.

Duties (each a pure computation over the latest image, then conditional writes):

- failover: a partition whose leader is not a live broker, or is a broker registered after the state was
  written (a restarted process: the state names its predecessor), gets a new leader by Kafka's clean rule
  (``placement.elect_leader``) among the ISR members whose entries hold (below) and a new leader epoch;
  with none it gets no leader (-1) and keeps its ISR as recorded, epochs and all, so the first of its
  members to come back with its data leads and nothing acknowledged is lost (unless
  ``unclean.leader.election.enable``);
- ISR entries are tied to broker incarnations (KIP-903/966, ``broker.cluster.incarnation``): each names the
  broker epoch its member was admitted under. An entry holds while the member's live registration has that
  epoch, or vouches for it (``previous_epoch``: a clean restart, or one in the same boot); then the
  controller carries it to the new epoch. A member whose entry does not hold (dead, or restarted without
  its data: a power loss, a wiped disk; also one that re-registered within one watch batch, which the
  epoch shows although the watch never saw it gone) leaves the ISR of every partition with a leader, and
  is never elected on it: it rejoins by catching up from the leader, whose ISR expansion names the epoch
  the follower fetched with. So an elected leader is always a process that holds every record its entry
  promised;
- a dead broker leaves the ISR of every partition it follows (same leader epoch), so acks=all writes stop
  waiting for it at once instead of after ``replica.lag.time.max.ms``;
- a partition without a state key (a topic whose creation was split over several transactions and
  interrupted) gets one;
- topic creation, deletion and growth (CreatePartitions: the topic key's new assignment and the new
  partitions' states, conditional on the topic key being what the plan was made from), preferred leader
  election (on request and periodically, Kafka's auto leader
  rebalance).

Loop thread only; one change at a time (a lock), so two duties never race each other's writes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kio.schema.errors import ErrorCode

from copyless.broker.cluster import etcd_client as etcd
from copyless.broker.cluster.backend import NewTopic, plan_partitions, plan_topic
from copyless.broker.cluster.image import ClusterImage, TopicInfo
from copyless.broker.cluster.incarnation import holding_members
from copyless.broker.cluster.keys import encode_state, encode_topic
from copyless.broker.cluster.placement import elect_leader, preferred_leader
from copyless.broker.partition import PartitionState
from copyless.broker.topics import TopicError

__all__ = ["Controller", "next_state", "MAX_TXN_OPS"]

log = logging.getLogger("copyless.controller")

# etcd refuses transactions with more than --max-txn-ops operations (128 by default); the compare list
# counts separately. Writes are chunked below it.
MAX_TXN_OPS = 100


def next_state(state: PartitionState | None, replicas: tuple[int, ...], live: dict, *,
               unclean: bool = False, isr_epochs: Mapping[int, int] | None = None
               ) -> tuple[PartitionState, dict[int, int]] | None:
    """The state a partition should move to given the ``live`` brokers (id -> BrokerInfo), with the broker
    epoch of each ISR member, or None when it is fine as it is. ``isr_epochs``: the epochs its current ISR
    entries were admitted under. Pure (the module docstring's failover and ISR rules)."""
    epochs = dict(isr_epochs or {})
    if state is None:
        leader, isr = elect_leader(replicas, replicas, live, unclean=unclean)
        if leader < 0:
            return PartitionState(leader, 0, tuple(replicas), replicas), {}
        return PartitionState(leader, 0, isr, replicas), {member: live[member].epoch for member in isr}
    # The members whose entries hold for their live registration (``broker.cluster.incarnation``): a member
    # that restarted without vouching for its data is out, even if it re-registered before anyone saw it go.
    holding = holding_members(state.isr, epochs, live)
    leader_broker = live.get(state.leader)
    if leader_broker is None or state.version < leader_broker.epoch or state.leader not in holding:
        leader, isr = elect_leader(replicas, holding, live, unclean=unclean)
        if leader < 0:
            if state.leader < 0:
                return None
            # No member can lead: the ISR stays as recorded, epochs and all, for one of them to come back
            # with its data.
            return PartitionState(leader, state.leader_epoch + 1, state.isr, replicas), epochs
        return (PartitionState(leader, state.leader_epoch + 1, isr, replicas),
                {member: live[member].epoch for member in isr})
    current = {member: live[member].epoch for member in holding}
    if holding != state.isr or any(epochs.get(member) != epoch for member, epoch in current.items()):
        # Dead members leave; restarted ones that vouched for their data are carried to their new epoch.
        return PartitionState(state.leader, state.leader_epoch, holding, replicas), current
    return None


def _live_epochs(replicas, brokers: Mapping) -> dict[int, int]:
    """A new partition's ISR entries: each replica at its current registration (all are live when planned)."""
    return {replica: brokers[replica].epoch for replica in replicas if replica in brokers}


class Controller:
    """Runs on every broker; acts only while this broker holds the controller key. ``metadata`` is the
    EtcdMetadata backend (client, layout, lease, image, node id, config)."""

    def __init__(self, metadata: Any) -> None:
        self.metadata = metadata
        self.node_id = metadata.node_id
        self.active = False
        self.epoch = 0  # the controller epoch (election count)
        self.token = 0  # the controller-epoch key's mod_revision when this broker won
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._rebalance_task: asyncio.Task | None = None
        self.stats = {"elections_won": 0, "leader_elections": 0, "isr_removals": 0, "fenced_writes": 0}

    @property
    def client(self) -> etcd.EtcdClient:
        return self.metadata.client

    @property
    def layout(self):
        return self.metadata.layout

    def fence(self):
        return etcd.modified(self.layout.controller_epoch, self.token)

    # --- election ----------------------------------------------------------------------------------------

    async def campaign(self) -> bool:
        """Try to become the controller (the image shows none). Returns True when this broker won."""
        if self.active or not self.metadata.lease_valid():
            return False
        layout = self.layout
        current, _revision = await self.client.get(layout.controller_epoch)
        seen_value = int(current.value) if current is not None else 0
        seen_revision = current.mod_revision if current is not None else 0
        result = await self.client.txn(
            [etcd.created(layout.controller, 0), etcd.modified(layout.controller_epoch, seen_revision)],
            [etcd.put(layout.controller, json.dumps({"broker_id": self.node_id}).encode(), self.metadata.lease_id),
             etcd.put(layout.controller_epoch, str(seen_value + 1).encode())],
        )
        if not result.succeeded:
            return False
        self.take_office(seen_value + 1, result.revision, "won the election")
        return True

    def take_office(self, epoch: int, token: int, how: str) -> None:
        """Act as the controller of ``epoch``, fenced by ``token`` (the controller-epoch key's mod_revision
        written by this broker's election). Called by ``campaign`` on its answer, and by the backend when its
        image shows the key naming this broker on its lease although no answer came (module docstring,
        "An election whose answer was lost"). Idempotent: both may happen for one election."""
        if self.active and self.token == token:
            return
        if self.active:
            self.resign(f"a newer election (token {token}) names this broker")
        self.active, self.epoch, self.token = True, epoch, token
        self.stats["elections_won"] += 1
        log.info("node %d is the controller (controller epoch %d, token revision %d): %s", self.node_id,
                 self.epoch, self.token, how)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="copyless-controller")
        if self.metadata.broker.config.auto_leader_rebalance:
            self._rebalance_task = asyncio.get_running_loop().create_task(self._rebalance(),
                                                                          name="copyless-leader-rebalance")
        self._wake.set()

    def resign(self, reason: str) -> None:
        if not self.active:
            return
        self.active = False
        log.warning("node %d stops acting as controller: %s", self.node_id, reason)
        for task in (self._task, self._rebalance_task):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._task = self._rebalance_task = None

    def on_image(self, image: ClusterImage) -> None:
        """Every new image: a controller that no longer holds the key resigns; one that does re-checks."""
        if not self.active:
            return
        # An image older than this broker's election (built from watch events already on their way while the
        # election's transaction ran) cannot name it yet. Resigning on it left a cluster with no controller at
        # all: every other broker saw this one named and never campaigned (the compose cluster hung at its first
        # CreateTopics, NOT_CONTROLLER, in one start of three).
        if image.revision < self.token:
            return
        if image.controller_id != self.node_id:
            self.resign(f"the controller key names node {image.controller_id}")
            return
        self._wake.set()

    async def _run(self) -> None:
        while self.active:
            await self._wake.wait()
            self._wake.clear()
            try:
                async with self._lock:
                    if self.active:
                        await self.reconcile(self.metadata.image)
            except etcd.EtcdUnavailable as exc:
                log.warning("controller cannot reach etcd (%s); retrying", exc)
                await asyncio.sleep(0.2)
                self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("controller reconciliation failed; retrying")
                await asyncio.sleep(0.5)
                self._wake.set()

    # --- writes -----------------------------------------------------------------------------------------------

    async def _write(self, compares: list, operations: list) -> etcd.TxnResult:
        """One fenced transaction. Resigns (and returns the failed result) when the fence refused it."""
        result = await self.client.txn([self.fence(), *compares], operations)
        if not result.succeeded:
            current, _ = await self.client.get(self.layout.controller_epoch)
            if current is None or current.mod_revision != self.token:
                self.stats["fenced_writes"] += 1
                self.resign("the controller epoch moved on (another broker was elected)")
        return result

    async def _write_states(
        self, changes: Sequence[tuple[str, int, PartitionState | None, PartitionState, Mapping[int, int]]]
    ) -> int:
        """Write (topic, partition, old state or None, new state, its ISR members' broker epochs) in chunks,
        each conditional on the old versions. Returns the revision of the last successful chunk (0 if none)."""
        layout = self.layout
        revision = 0
        for start in range(0, len(changes), MAX_TXN_OPS):
            chunk = changes[start:start + MAX_TXN_OPS]
            compares = [etcd.modified(layout.partition(topic, index), old.version if old is not None else 0)
                        for topic, index, old, _new, _epochs in chunk]
            operations = [etcd.put(layout.partition(topic, index), encode_state(new, self.epoch, epochs))
                          for topic, index, _old, new, epochs in chunk]
            result = await self._write(compares, operations)
            if not self.active:
                break
            if result.succeeded:
                revision = result.revision
        return revision

    # --- duties -----------------------------------------------------------------------------------------------

    async def reconcile(self, image: ClusterImage) -> None:
        """Failover, ISR cleanup and missing states for the whole image (module docstring)."""
        live = dict(image.brokers)
        changes = []
        for topic in image.topics.values():
            unclean = topic.configs.get("unclean.leader.election.enable", "").lower() == "true" or (
                "unclean.leader.election.enable" not in topic.configs
                and self.metadata.broker.config.unclean_leader_election)
            for index, replicas in enumerate(topic.assignment):
                state = image.partition_state(topic.name, index)
                decided = next_state(state, replicas, live, unclean=unclean,
                                     isr_epochs=image.isr_epochs.get((topic.name, index)))
                if decided is None:
                    continue
                new, epochs = decided
                changes.append((topic.name, index, state, new, epochs))
                if state is None or new.leader != state.leader or new.leader_epoch != state.leader_epoch:
                    self.stats["leader_elections"] += 1
                    log.info("%s-%d: leader %s -> %d at epoch %d, ISR %s (live brokers %s)", topic.name, index,
                             "none" if state is None else state.leader, new.leader, new.leader_epoch,
                             list(new.isr), sorted(live))
                else:
                    self.stats["isr_removals"] += 1
                    log.info("%s-%d: ISR %s -> %s at broker epochs %s (brokers gone or restarted)", topic.name,
                             index, list(state.isr), list(new.isr), [epochs.get(b, 0) for b in new.isr])
        if changes:
            await self._write_states(changes)

    async def create_topic(self, new: NewTopic, *, validate_only: bool = False) -> tuple[TopicInfo, int]:
        """Plan and write a topic: its key and every partition's state, conditional on the name being free.
        Returns (the topic, the revision it was written at). Raises TopicError."""
        async with self._lock:
            self._require_active()
            image = self.metadata.image
            config = self.metadata.broker.config
            info = plan_topic(new, existing=list(image.topics), live_brokers=list(image.brokers),
                              default_partitions=config.num_partitions,
                              default_replication_factor=config.default_replication_factor)
            if validate_only:
                return info, image.revision
            layout = self.layout
            states = []
            for index, replicas in enumerate(info.assignment):
                leader = replicas[0]  # every replica is a live broker: the first leads
                states.append(etcd.put(layout.partition(info.name, index),
                                       encode_state(PartitionState(leader, 0, replicas, replicas), self.epoch,
                                                    _live_epochs(replicas, image.brokers))))
            first = states[:MAX_TXN_OPS - 1]
            result = await self._write([etcd.created(layout.topic(info.name), 0)],
                                       [etcd.put(layout.topic(info.name), encode_topic(info)), *first])
            if not result.succeeded:
                if not self.active:
                    raise TopicError(ErrorCode.not_controller, "the controller moved during the request")
                raise TopicError(ErrorCode.topic_already_exists, f"Topic '{info.name}' already exists.")
            revision = result.revision
            # A topic with more partitions than one transaction holds: the rest in further (fenced)
            # transactions; if this controller stops in between, the next one's reconcile writes them.
            for start in range(MAX_TXN_OPS - 1, len(states), MAX_TXN_OPS):
                chunk = states[start:start + MAX_TXN_OPS]
                keys = [layout.partition(info.name, index) for index in range(start, start + len(chunk))]
                more = await self._write([etcd.created(key, 0) for key in keys], chunk)
                if more.succeeded:
                    revision = more.revision
            log.info("created topic %s: %d partition(s), replicas %s", info.name, info.partitions,
                     [list(r) for r in info.assignment])
            return info, revision

    async def create_partitions(self, name: str, count: int, assignments=None, *,
                                validate_only: bool = False) -> tuple[TopicInfo, int]:
        """Grow a topic to ``count`` partitions placed by Kafka's rules (``plan_partitions``): the topic key
        and the new partitions' states in one transaction, conditional on the topic key being the one
        planned from and on each new state key being absent. Returns (the topic, the revision). Raises
        TopicError."""
        async with self._lock:
            self._require_active()
            image = self.metadata.image
            current = image.topic(name)
            if current is None:
                raise TopicError(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")
            info = plan_partitions(current, count, assignments, live_brokers=list(image.brokers))
            if validate_only:
                return info, image.revision
            layout = self.layout
            added = range(current.partitions, count)
            states = [etcd.put(layout.partition(name, index),
                               encode_state(PartitionState(info.assignment[index][0], 0, info.assignment[index],
                                                           info.assignment[index]), self.epoch,
                                            _live_epochs(info.assignment[index], image.brokers)))
                      for index in added]
            first = states[:MAX_TXN_OPS - 1]
            compares = [etcd.value_is(layout.topic(name), encode_topic(current)),
                        *(etcd.created(layout.partition(name, index), 0) for index in added[:len(first)])]
            result = await self._write(compares, [etcd.put(layout.topic(name), encode_topic(info)), *first])
            if not result.succeeded:
                if not self.active:
                    raise TopicError(ErrorCode.not_controller, "the controller moved during the request")
                raise TopicError(ErrorCode.invalid_partitions,
                                 f"Topic '{name}' changed while partitions were added; retry")
            revision = result.revision
            # More states than one transaction holds: the rest follow; reconcile writes any a stop interrupts.
            for start in range(len(first), len(states), MAX_TXN_OPS):
                chunk = states[start:start + MAX_TXN_OPS]
                keys = [layout.partition(name, index) for index in added[start:start + len(chunk)]]
                more = await self._write([etcd.created(key, 0) for key in keys], chunk)
                if more.succeeded:
                    revision = more.revision
            log.info("topic %s: %d -> %d partitions, new replicas %s", name, current.partitions, count,
                     [list(info.assignment[index]) for index in added])
            return info, revision

    async def delete_topic(self, name: str) -> int:
        """Delete a topic's key and its partitions' states in one transaction. Returns its revision."""
        async with self._lock:
            self._require_active()
            image = self.metadata.image
            info = image.topic(name)
            if info is None:
                raise TopicError(ErrorCode.unknown_topic_or_partition,
                                 "This server does not host this topic-partition.")
            if info.internal:
                raise TopicError(ErrorCode.invalid_topic_exception, f"Topic '{name}' is internal and cannot be deleted")
            layout = self.layout
            result = await self._write(
                [etcd.value_is(layout.topic(name), encode_topic(info))],
                [etcd.delete(layout.topic(name)), etcd.delete_prefix(layout.partitions_of(name))])
            if not result.succeeded:
                if not self.active:
                    raise TopicError(ErrorCode.not_controller, "the controller moved during the request")
                raise TopicError(ErrorCode.unknown_topic_or_partition, f"Topic '{name}' changed while being deleted")
            log.info("deleted topic %s (topic id %s)", name, info.topic_id)
            return result.revision

    async def elect_preferred(self, partitions: Iterable[tuple[str, int]] | None = None) -> dict:
        """Move leadership to each partition's preferred (first) replica where it is alive and in the ISR.
        Returns {(topic, partition): ErrorCode} for the partitions asked about (all: only the moved ones)."""
        async with self._lock:
            self._require_active()
            image = self.metadata.image
            live = image.brokers
            keys = list(partitions) if partitions is not None else list(image.partitions)
            outcome: dict = {}
            changes = []
            for topic, index in keys:
                state = image.partition_state(topic, index)
                if state is None:
                    outcome[(topic, index)] = ErrorCode.unknown_topic_or_partition
                    continue
                epochs = image.isr_epochs.get((topic, index), {})
                preferred = preferred_leader(state.replicas, holding_members(state.isr, epochs, live), live)
                if preferred is None:
                    outcome[(topic, index)] = ErrorCode.preferred_leader_not_available
                elif preferred == state.leader:
                    outcome[(topic, index)] = ErrorCode.election_not_needed
                else:
                    changes.append((topic, index, state,
                                    PartitionState(preferred, state.leader_epoch + 1, state.isr, state.replicas),
                                    epochs))
                    outcome[(topic, index)] = ErrorCode.none
            if changes:
                for topic, index, state, new, _epochs in changes:
                    log.info("%s-%d: preferred leader %d takes over from %d at epoch %d", topic, index, new.leader,
                             state.leader, new.leader_epoch)
                revision = await self._write_states(changes)
                if revision == 0:
                    for topic, index, _state, _new, _epochs in changes:
                        outcome[(topic, index)] = (ErrorCode.unknown_server_error if self.active
                                                   else ErrorCode.not_controller)
            return outcome

    async def _rebalance(self) -> None:
        """Kafka's auto leader rebalance: every ``leader.imbalance.check.interval`` move leadership back to
        preferred replicas that are in the ISR again (a restarted broker gets its partitions back)."""
        interval_s = self.metadata.broker.config.leader_imbalance_check_interval_ms / 1000
        while self.active:
            await asyncio.sleep(interval_s)
            try:
                await self.elect_preferred()
            except (etcd.EtcdUnavailable, TopicError) as exc:
                log.info("preferred leader election skipped: %s", exc)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("preferred leader election failed")

    def _require_active(self) -> None:
        if not self.active:
            raise TopicError(ErrorCode.not_controller, f"node {self.node_id} is not the controller")
