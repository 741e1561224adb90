"""ReplicaManager: the partitions this broker hosts, kept in step with the cluster metadata.

Owns the ``Partition`` objects (one per hosted (topic, partition)), and applying a ``ClusterImage`` to them:

1. logs whose topic is gone from the image, or whose topic id differs (the topic was deleted and created
   again under the same name), or that are no longer assigned here, are deleted;
2. partitions assigned here without a log get one (created on a worker thread), with a
   ``partition.metadata`` file naming the topic id (Kafka's file, KIP-516);
3. every hosted partition takes its topic's settings (again for all of them when the dynamic broker
   configs changed: they are the defaults under every topic's overrides) and its state: leader (``make_leader``),
   follower (``make_follower``, and the fetcher manager is told), or none.

Images are applied one at a time, in revision order, by one task; a newer image that arrives while one is
being applied replaces any image still queued (applying the newest covers the older ones). An image whose
application failed is not counted applied: it is tried again (unless a newer one replaced it), and
``wait_applied`` keeps waiting. The disk work of steps 1 and 2 is waited for ``DISK_STEP_TIMEOUT_S`` at
most: past that (a stalled disk) the states of step 3 are applied anyway, later images skip the disk work
while it runs, and the latest image is applied again once it ends, so a stalled disk never stops a broker
from learning that it no longer leads. Deleting a log
happens only on the word of a complete image (a backend publishes no other kind), so a broker never deletes
data because its own view is stale.

Role changes go through the partitions' serialization (``broker.partition``, "Serialization"): a state
that arrives while a partition's truncation runs is applied when the truncation ends (the latest one).

ISR changes (the leader's side of ``broker.partition``'s ISR rule): an ISR change is a conditional write
(the state version it was made from). A refusal on the first attempt is definite (the state had moved, so
the write cannot commit): the proposal is dropped and the next image brings the new state. A write that
raised (a timeout, a lost connection) has an unknown outcome: it may have committed, and the controller may
then elect a member the leader is about to stop counting, losing what the leader acknowledges meanwhile. So
the partition keeps its maximal ISR (KIP-497) and the write is sent again with the same condition, backing
off from ``ISR_RETRY_MIN_S`` to ``ISR_RETRY_MAX_S``: a success is definite; a refusal after an unknown
attempt is answered by reading the key back (a version past the one the change was made from is definite,
whatever it holds: either the change committed or it never can); an image showing such a version ends the
wait as well. Until then the high watermark counts the proposed members too, so it can only lag.

A leadership recorded before this broker registered (the state's version below this broker's epoch) is not
taken: that state names the process this one replaced, whose followers' progress this process never saw;
the controller elects anew and the new state arrives with the next image (Kafka's broker-epoch check,
KIP-380).

Loop thread, except the marked blocking helpers (worker threads).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from copyless.broker._files import write_atomically
from copyless.broker.cluster.image import ClusterImage, TopicInfo
from copyless.broker.errors import NotLeaderOrFollower, UnknownTopicOrPartition
from copyless.broker.host_interfaces import ReplicaHost
from copyless.broker.partition import NO_EPOCH_CHECK, Partition, PartitionState, Role

__all__ = ["ReplicaManager", "PARTITION_METADATA_FILE", "read_topic_id"]

log = logging.getLogger("copyless.replicas")

PARTITION_METADATA_FILE = "partition.metadata"
# How long applying an image waits for its log deletions and creations (worker threads) before it applies
# the partitions' states anyway: a stalled disk must not stop leadership and ISR changes from taking effect.
DISK_STEP_TIMEOUT_S = 5.0
# After an image failed to apply, the next attempt (the same image, unless a newer one came meanwhile).
APPLY_RETRY_S = 0.5
# An ISR change whose outcome is unknown (the etcd call timed out) is sent again after this, doubling up to
# the maximum, until a definite answer: short against replica.lag.time.max.ms (30 s; 4 s in the tests), as
# the maximal ISR holds the high watermark meanwhile.
ISR_RETRY_MIN_S, ISR_RETRY_MAX_S = 0.1, 1.0


def read_topic_id(directory: Path) -> uuid.UUID | None:
    """The topic id in ``directory/partition.metadata`` (None when the file is missing or unreadable: a data
    dir written before topic ids were recorded). Blocking."""
    try:
        text = (Path(directory) / PARTITION_METADATA_FILE).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "topic_id":
            try:
                return uuid.UUID(value.strip())
            except ValueError:
                return None
    return None


def write_topic_id(directory: Path, topic_id: uuid.UUID) -> None:
    """Write ``partition.metadata`` (tmp + fsync + rename). Blocking."""
    write_atomically(Path(directory) / PARTITION_METADATA_FILE, f"version: 0\ntopic_id: {topic_id}\n".encode())


class ReplicaManager:
    """The hosted partitions. ``broker`` provides ``node_id``, ``log_manager``, ``producers``, ``appends``
    (the long-poll notifier), ``config`` and ``log_config_for(topic_info)``."""

    def __init__(self, broker: ReplicaHost, *, lease_valid: Callable[[], bool] = lambda: True) -> None:
        self.broker = broker
        self.node_id = broker.node_id
        self.partitions: dict[tuple[str, int], Partition] = {}
        self.image = ClusterImage()
        self.applied_revision = -1
        # This process's registration epoch: leadership recorded before it is not taken (module docstring).
        self.broker_epoch = 0
        self._lease_valid = lease_valid
        self._pending: ClusterImage | None = None
        self._applying: asyncio.Task | None = None
        self._disk_work: asyncio.Future | None = None  # apply()'s log deletions and creations
        self._revision_waiters: list[tuple[int, asyncio.Future]] = []
        self._topic_ids: dict[tuple[str, int], uuid.UUID | None] = {}
        # Called with (partition, changed) whenever a hosted partition becomes or stays a follower, and with
        # (partition, None) when it stops being one: the fetcher manager's hook.
        self.on_follower: Callable[[Partition, bool | None], None] = lambda partition, changed: None
        # Called with (partition, True) when this broker starts leading a partition (or a new epoch of it),
        # and (partition, False) when it stops: the group coordinator follows its offsets partitions so.
        self.leadership_listeners: list[Callable[[Partition, bool], None]] = []
        self.closing = False
        self.stats = {"isr_shrinks": 0, "isr_expands": 0, "isr_changes_refused": 0, "isr_changes_unknown": 0,
                      "truncations": 0}

    # --- lookups (loop thread) -------------------------------------------------------------------------------

    def get(self, topic: str, partition: int) -> Partition | None:
        return self.partitions.get((topic, partition))

    def partition_or_error(self, topic: str, partition: int) -> Partition:
        """The hosted partition. Raises UnknownTopicOrPartition when the topic or partition does not exist,
        NotLeaderOrFollower when it exists but has no replica here."""
        found = self.partitions.get((topic, partition))
        if found is not None:
            return found
        info = self.image.topic(topic)
        if info is None or not 0 <= partition < info.partitions:
            raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
        raise NotLeaderOrFollower(f"{topic}-{partition} has no replica on node {self.node_id}")

    def leader(self, topic: str, partition: int, current_leader_epoch: int = NO_EPOCH_CHECK) -> Partition:
        """The partition, if this broker leads it for ``current_leader_epoch``. Raises as
        ``partition_or_error`` and ``Partition.check_leader``."""
        found = self.partition_or_error(topic, partition)
        found.check_leader(current_leader_epoch)
        return found

    def leading(self) -> Iterable[Partition]:
        return (p for p in self.partitions.values() if p.role is Role.LEADER)

    # --- startup (blocking) -------------------------------------------------------------------------------------

    def load_topic_ids(self) -> None:
        """Read every loaded log's ``partition.metadata``. Blocking: start-up, before serving."""
        for key, partition_log in self.broker.log_manager.logs().items():
            self._topic_ids[key] = read_topic_id(partition_log.directory)

    def local_topic_id(self, topic: str, partition: int) -> uuid.UUID | None:
        return self._topic_ids.get((topic, partition))

    def create_logs_blocking(self, topic: TopicInfo, partitions: Iterable[int]) -> list[int]:
        """Create the logs of ``partitions`` of ``topic`` that do not exist yet, each with its
        ``partition.metadata``. Returns the partitions created. Blocking (worker thread).

        Raises:
            StorageError: a log could not be created; the ones created by this call are removed again.
        """
        log_manager = self.broker.log_manager
        config = self.broker.log_config_for(topic)
        created: list[int] = []
        try:
            for partition in partitions:
                if log_manager.get_log(topic.name, partition) is not None:
                    if self._topic_ids.get((topic.name, partition)) is None:
                        write_topic_id(log_manager.get_log(topic.name, partition).directory, topic.topic_id)
                        self._topic_ids[(topic.name, partition)] = topic.topic_id
                    continue
                partition_log = log_manager.create_log(topic.name, partition, config)
                created.append(partition)
                write_topic_id(partition_log.directory, topic.topic_id)
                self._topic_ids[(topic.name, partition)] = topic.topic_id
        except Exception:
            for partition in created:
                try:
                    log_manager.delete_log(topic.name, partition)
                except Exception:
                    log.exception("cleanup of %s-%d failed", topic.name, partition)
                self._topic_ids.pop((topic.name, partition), None)
            raise
        return created

    def _delete_logs_blocking(self, keys: list[tuple[str, int]]) -> None:
        for topic, partition in keys:
            try:
                self.broker.log_manager.delete_log(topic, partition)
            except Exception:
                log.exception("deleting log %s-%d failed; it is deleted at the next startup", topic, partition)

    # --- applying images (loop thread) --------------------------------------------------------------------------

    def _publish_again(self, _disk_work: object) -> None:
        """Once stalled disk work ends, apply the latest image again (unless the broker is closing)."""
        if not self.closing:
            self.publish(self.image)

    def publish(self, image: ClusterImage) -> None:
        """A backend has a new image: apply it (after any image being applied now)."""
        self._pending = image
        if self._applying is None or self._applying.done():
            self._applying = asyncio.get_running_loop().create_task(self._apply_pending(), name="copyless-replicas")

    async def wait_applied(self, revision: int) -> None:
        """Until an image of at least ``revision`` has been applied."""
        if self.applied_revision >= revision:
            return
        future = asyncio.get_running_loop().create_future()
        self._revision_waiters.append((revision, future))
        await future

    async def _apply_pending(self) -> None:
        while self._pending is not None and not self.closing:
            image, self._pending = self._pending, None
            try:
                await self.apply(image)
            except Exception:
                # Not applied: waiters keep waiting, and the image is tried again unless a newer one (which
                # covers it) arrived meanwhile.
                log.exception("applying metadata revision %d failed; retrying in %.1f s", image.revision,
                              APPLY_RETRY_S)
                if self._pending is None:
                    self._pending = image
                await asyncio.sleep(APPLY_RETRY_S)
                continue
            self.applied_revision = max(self.applied_revision, image.revision)
            waiters, self._revision_waiters = self._revision_waiters, []
            for revision, future in waiters:
                if revision <= self.applied_revision:
                    if not future.done():
                        future.set_result(None)
                else:
                    self._revision_waiters.append((revision, future))

    async def apply(self, image: ClusterImage) -> None:
        """Bring the hosted partitions in line with ``image`` (module docstring, steps 1-3)."""
        self.image = image
        node_id = self.node_id
        apply_configs = getattr(self.broker, "apply_broker_configs", None)
        if apply_configs is not None and apply_configs(image.broker_configs):
            # New broker-wide log defaults: every partition takes its settings again (step 3).
            for hosted in self.partitions.values():
                hosted.configs = None
        wanted: dict[tuple[str, int], TopicInfo] = {}
        for topic, index, topic_info in image.hosted_by(node_id):
            wanted[(topic, index)] = topic_info
        # 1. Deletions: by the image's word only.
        doomed = []
        for key in list(self.broker.log_manager.logs()):
            info = wanted.get(key)
            local_id = self._topic_ids.get(key)
            if info is None or (local_id is not None and local_id != info.topic_id):
                doomed.append(key)
        disk_free = self._disk_work is None or self._disk_work.done()
        if doomed and disk_free:
            for key in doomed:
                partition = self.partitions.pop(key, None)
                if partition is not None:
                    was_leader = partition.role is Role.LEADER
                    partition.make_offline()
                    if was_leader:
                        self._notify_leadership(partition, False)
                    self.on_follower(partition, None)
                self.broker.producers.remove_partition(*key)
                self.broker.txn_partitions.remove_partition(*key)
                self._topic_ids.pop(key, None)
                log.info("deleting the local log of %s-%d (%s)", key[0], key[1],
                         "topic deleted" if key[0] not in image.topics else
                         "topic recreated" if wanted.get(key) is not None else "no longer assigned here")
        # 2. Creations.
        missing: dict[str, list[int]] = {}
        for topic, index in wanted:
            if self.broker.log_manager.get_log(topic, index) is None or self._topic_ids.get((topic, index)) is None:
                missing.setdefault(topic, []).append(index)
        if disk_free and (doomed or missing):
            # Worker threads, waited for a bounded time (a stalled disk must not hold the states of step 3);
            # when they finish late, the latest image is applied again for what they left to do.
            self._disk_work = asyncio.ensure_future(self._disk_steps(image, doomed, missing))
            try:
                async with asyncio.timeout(DISK_STEP_TIMEOUT_S):
                    await asyncio.shield(self._disk_work)
            except TimeoutError:
                log.error("metadata revision %d: log deletions or creations still running after %.0f s (a stalled "
                          "disk?); applying the partitions' states without them", image.revision, DISK_STEP_TIMEOUT_S)
                self._disk_work.add_done_callback(self._publish_again)
        elif doomed or missing:
            log.warning("metadata revision %d: the storage is still busy with earlier log deletions or creations; "
                        "applying the partitions' states now, the logs once it is done", image.revision)
            # Their deletion waits for the storage: until then they serve nothing, and step 3 leaves them
            # alone (a topic created again under the same name must not take the old log).
            for key in doomed:
                partition = self.partitions.get(key)
                wanted.pop(key, None)
                if partition is not None and partition.role is not Role.NONE:
                    was_leader = partition.role is Role.LEADER
                    partition.make_offline()
                    if was_leader:
                        self._notify_leadership(partition, False)
                    self.on_follower(partition, None)
        # 3. States. One partition that cannot take its settings (a topic config etcd holds but this broker
        # refuses) must not keep the others from theirs: it is logged and skipped.
        for key, info in wanted.items():
            partition_log = self.broker.log_manager.get_log(*key)
            if partition_log is None:
                continue
            partition = self.partitions.get(key)
            if partition is None:
                partition = Partition(key[0], key[1], partition_log, node_id=node_id,
                                      producers=self.broker.producers, notifier=self.broker.appends,
                                      lease_valid=self._lease_valid,
                                      txns=self.broker.txn_partitions.get(*key))
                partition.on_mutation_end = self._resume_role_change
                partition.keep_state_in(self.broker.state_files, key in self.broker.snapshots_at_end)
                self.partitions[key] = partition
            try:
                self._configure(partition, info)
            except Exception:
                log.exception("%s-%d: its topic's settings do not apply; it keeps the previous ones", *key)
            state = image.partition_state(*key)
            if state is None:
                continue
            self._apply_state(partition, state)

    async def _disk_steps(self, image: ClusterImage, doomed: list, missing: dict[str, list[int]]) -> None:
        """Steps 1 and 2's work on disk (worker threads)."""
        if doomed:
            await asyncio.to_thread(self._delete_logs_blocking, doomed)
        for topic, partitions in missing.items():
            try:
                await asyncio.to_thread(self.create_logs_blocking, image.topics[topic], partitions)
            except Exception:
                log.exception("cannot create the logs of %s %s; they are retried with the next image",
                              topic, partitions)

    def _configure(self, partition: Partition, info: TopicInfo) -> None:
        config = self.broker.config
        if partition.configs is not info.configs:
            # The topic's settings (new, or altered): the log takes them for what follows (new segments,
            # flush and retention policies), as Kafka applies topic config changes live.
            log_config = self.broker.log_config_for(info)
            if partition.log.config != log_config:
                partition.log.config = log_config
            partition.configs = info.configs
        partition.replica_lag_time_max_ms = config.replica_lag_time_max_ms
        text = info.configs.get("min.insync.replicas")
        partition.min_insync_replicas = int(text) if text is not None else config.min_insync_replicas

    def _apply_state(self, partition: Partition, state: PartitionState) -> None:
        if state.leader_epoch < partition.leader_epoch:
            return  # an older state than the one applied: images never go back, but be safe
        if partition.defer_role_change(state):
            return  # a truncation is cutting the log: the change is applied when it ends (module docstring)
        if state.leader == self.node_id and state.version >= self.broker_epoch:
            if partition.role is Role.LEADER and state.leader_epoch == partition.leader_epoch:
                if state.version > partition.state_version:
                    partition.make_leader(state)
                return
            if partition.role is Role.FOLLOWER:
                self.on_follower(partition, None)
            if partition.make_leader(state):
                self._notify_leadership(partition, True)
            return
        if state.leader == self.node_id:
            # Recorded before this process registered: not ours to take (module docstring); the controller
            # elects anew and the next image says who leads.
            state = PartitionState(-1, state.leader_epoch, state.isr, state.replicas, state.version)
        was_leader = partition.role is Role.LEADER
        changed = partition.make_follower(state)
        if was_leader:
            self._notify_leadership(partition, False)
        self.on_follower(partition, changed if state.leader >= 0 else None)

    def _resume_role_change(self, partition: Partition) -> None:
        """A follower's log mutation ended with a role change waiting: apply it now (the latest one)."""
        state = partition.take_deferred_role_change()
        if state is None or self.closing or self.partitions.get(partition.key) is not partition:
            return
        try:
            self._apply_state(partition, state)
        except Exception:
            log.exception("%s-%d: applying the state deferred by a truncation failed", *partition.key)

    def _notify_leadership(self, partition: Partition, leading: bool) -> None:
        for listener in self.leadership_listeners:
            try:
                listener(partition, leading)
            except Exception:
                log.exception("leadership listener failed for %s-%d", partition.topic, partition.partition)

    def new_broker_epoch(self, epoch: int) -> None:
        """This process (re-)registered at ``epoch``: leadership recorded before it is not its own (module
        docstring). Every partition it leads steps down now, before the new lease lets it act; the next
        image says which it leads again."""
        self.broker_epoch = epoch
        for partition in self.partitions.values():
            if partition.role is Role.LEADER and partition.state_version < epoch:
                partition.make_follower(PartitionState(-1, partition.leader_epoch, partition.isr, partition.replicas,
                                                       partition.state_version))
                self._notify_leadership(partition, False)
                self.on_follower(partition, None)

    # --- the ISR (leader side) ------------------------------------------------------------------------------------

    def after_follower_fetch(self, partition: Partition, replica_id: int, replica_epoch: int = -1) -> None:
        """Follower ``replica_id`` fetched, naming its broker epoch ``replica_epoch``: if it caught up,
        propose adding it to the ISR, admitted under that epoch (KIP-903: the entry names the process that
        has the records, ``broker.cluster.incarnation``). A fetch whose epoch is not the follower's
        registration in this broker's image (a process gone since, or an image not caught up yet) is no
        ground for admission.

        Only a registered broker is eligible (Kafka's KIP-903 check): the controller removes unregistered
        brokers from every ISR, so a follower cut off etcd alone, whose lease ran out while it still fetched,
        was added back by its leaders on each fetch and removed again by the controller, about 220 etcd
        writes a second over five partitions in the Jepsen test. It rejoins on its first fetch once it has
        registered again."""
        registered = self.image.brokers.get(replica_id)
        if registered is None or (self.broker.config.clustered and registered.epoch != replica_epoch):
            return
        proposed = partition.isr_expansion(replica_id)
        if proposed is not None:
            self._change_isr(partition, proposed, "caught up", {replica_id: replica_epoch})

    def check_isr(self) -> None:
        """Shrink the ISR of every partition led here by the followers that fell behind (periodic)."""
        for partition in self.leading():
            proposed = partition.isr_shrink()
            if proposed is not None:
                self._change_isr(partition, proposed, "fell behind")

    def _change_isr(self, partition: Partition, proposed: tuple[int, ...], reason: str,
                    joining_epochs: dict[int, int] | None = None) -> None:
        if not self._lease_valid():
            return
        state = PartitionState(partition.leader_id, partition.leader_epoch, partition.isr, partition.replicas,
                               partition.state_version)
        number = partition.begin_isr_change(proposed)
        log.info("%s-%d: proposing ISR %s -> %s (%s)", partition.topic, partition.partition, list(partition.isr),
                 list(proposed), reason)
        asyncio.get_running_loop().create_task(self._write_isr(partition, state, proposed, joining_epochs, number))

    async def _write_isr(self, partition: Partition, state: PartitionState, proposed: tuple[int, ...],
                         joining_epochs: dict[int, int] | None = None, number: int | None = None) -> None:
        """Send the change until the store gives a definite answer (module docstring, "ISR changes")."""
        metadata = self.broker.metadata
        unknown = False  # an earlier attempt's outcome is unknown: it may have committed
        retry_s = ISR_RETRY_MIN_S
        while True:
            try:
                new_state = await metadata.alter_isr(partition.topic, partition.partition, state, proposed,
                                                     joining_epochs)
                if new_state is None and unknown:
                    # Refused: the state moved, perhaps by that earlier attempt. What the store holds now is
                    # the answer (a state past the one the change was made from is definite).
                    new_state = await metadata.read_partition_state(partition.topic, partition.partition)
                    if new_state is None or new_state.version <= state.version:
                        raise ConnectionError(f"read back version {getattr(new_state, 'version', None)}, "
                                              f"not past {state.version}")
                break
            except Exception as exc:
                unknown = True
                self.stats["isr_changes_unknown"] += 1
                if number is not None and not partition.isr_change_pending(number):
                    # Answered meanwhile by a newer state from the watch (or the leadership moved).
                    log.info("%s-%d: ISR change %s resolved by the metadata meanwhile", partition.topic,
                             partition.partition, list(proposed))
                    return
                if self.closing:
                    return
                log.warning("%s-%d: ISR change %s has no definite answer (%s); the high watermark keeps counting "
                            "the maximal ISR %s; asking again in %.2f s", partition.topic, partition.partition,
                            list(proposed), exc, list(partition.maximal_isr), retry_s)
                await asyncio.sleep(retry_s)
                retry_s = min(retry_s * 2, ISR_RETRY_MAX_S)
                if number is not None and not partition.isr_change_pending(number):
                    return
        if new_state is None:
            self.stats["isr_changes_refused"] += 1
            log.info("%s-%d: ISR change %s refused (the partition's state moved on); waiting for the new state",
                     partition.topic, partition.partition, list(proposed))
        elif new_state.isr != tuple(proposed):
            self.stats["isr_changes_refused"] += 1
            log.info("%s-%d: ISR change %s superseded: the store holds %s at version %d", partition.topic,
                     partition.partition, list(proposed), list(new_state.isr), new_state.version)
        elif len(proposed) < len(state.isr):
            self.stats["isr_shrinks"] += 1
        else:
            self.stats["isr_expands"] += 1
        partition.end_isr_change(new_state, number)

    async def maintain_isr(self) -> None:
        """The leader's periodic ISR check, every half ``replica.lag.time.max.ms`` (Kafka's schedule)."""
        interval_s = max(self.broker.config.replica_lag_time_max_ms / 2000, 0.05)
        while not self.closing:
            await asyncio.sleep(interval_s)
            try:
                self.check_isr()
            except Exception:
                log.exception("ISR check failed")

    # --- truncation (follower side) --------------------------------------------------------------------------------

    async def truncate(self, partition: Partition, offset: int, leader_epoch: int) -> bool:
        """Cut ``partition``'s log to end at ``offset`` (worker thread), then drop the producer state past it
        and clamp the high watermark: one step of the partition (``Partition.mutate_as_follower``), run
        only if it is still a follower at ``leader_epoch``, the epoch the cut was decided under. Returns
        False when it is not (nothing cut)."""
        return await partition.mutate_as_follower(
            leader_epoch, lambda: self._truncate_blocking(partition, lambda: partition.log.truncate_to(offset)),
            lambda loaded: self._after_truncation(partition, loaded))

    async def truncate_fully(self, partition: Partition, offset: int, leader_epoch: int) -> bool:
        """Empty ``partition``'s log and restart it at ``offset`` (below the leader's log start); as
        ``truncate``."""
        return await partition.mutate_as_follower(
            leader_epoch,
            lambda: self._truncate_blocking(partition, lambda: partition.log.truncate_fully_and_start_at(offset)),
            lambda loaded: self._after_truncation(partition, loaded))

    def _truncate_blocking(self, partition: Partition, cut):
        """Cut, then load the producer state of the cut log: snapshots past the cut deleted, its .txnindex
        files cut, the log replayed from the latest snapshot left (broker/partition_state_files.py).
        Blocking (worker thread)."""
        cut()
        return self.broker.state_files.reload(partition.log, partition.log.high_watermark)

    def _after_truncation(self, partition: Partition, loaded) -> None:
        self.stats["truncations"] += 1
        self.broker.producers.restore(partition.topic, partition.partition, loaded.producers)
        partition.txns = self.broker.txn_partitions.install(partition.topic, partition.partition, loaded.txns)
        partition.keep_state_in(self.broker.state_files, loaded.snapshot_at_end)
        # Storage clamped its high watermark to the cut log (or set it to the new start of an emptied one).
        partition.high_watermark = partition.log.high_watermark

    # --- shutdown -------------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Shutdown: every partition goes offline (waiting acks=all writes answer NOT_LEADER_OR_FOLLOWER)."""
        self.closing = True
        for partition in self.partitions.values():
            was_leader = partition.role is Role.LEADER
            partition.make_offline()
            if was_leader:
                self._notify_leadership(partition, False)
        for _revision, future in self._revision_waiters:
            if not future.done():
                future.cancel()
        self._revision_waiters.clear()
