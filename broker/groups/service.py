"""The asyncio shell around the group coordinator and the offsets store: timers, parked requests, the log,
and which groups this broker coordinates.

Groups map to ``__consumer_offsets`` partitions (Kafka's hash, ``offsets.partition_for``), and the leader of
a group's partition is its coordinator (FindCoordinator names it). This broker keeps one *shard* per offsets
partition it leads: a pure ``GroupCoordinator`` and an ``OffsetStore`` for that partition's groups.

- becoming leader of an offsets partition loads its shard: the partition's log is replayed on a worker
  thread while its groups answer COORDINATOR_LOAD_IN_PROGRESS (14); a shard is only loaded once its
  leader epoch is current, so it sees every commit the previous coordinator acknowledged (those were
  replicated to the ISR this leader came from);
- losing leadership unloads it: parked JoinGroup/SyncGroup requests answer NOT_COORDINATOR (16), and so
  does every later request for its groups, which makes clients look the coordinator up again;
- parked JoinGroup/SyncGroup requests are asyncio futures handed to the pure coordinator as waiter tokens;
  after every call the coordinator's completions resolve them;
- one timer task sleeps until the earliest deadline of any shard (join window, rebalance timeout, sync
  timeout, session expiry) and ticks them, so a member that stopped heartbeating is removed at its session
  timeout even when no request arrives;
- committed offsets are appended to the group's partition through ``Partition.append_as_leader`` and
  acknowledged once replicated (the high watermark passed them: acks=all), so a commit the client saw
  succeed survives a coordinator failover; group metadata is appended the same way, best effort;
- a periodic task expires offsets of groups that stayed empty past ``offsets.retention.minutes``.

Which offsets partitions are led here, the shard of each, ``shard_for`` and FindCoordinator are
``broker.coordinator_shards`` (``shard_map``), shared with the transaction coordinator; this module says
what a shard holds, how it loads and what its unloading answers. On a single node the topic has one
partition by default and is created at start; in a cluster it is created on the first FindCoordinator
(Kafka's lazy creation), with ``offsets.topic.num.partitions`` partitions and
``offsets.topic.replication.factor`` replicas, refused until that many brokers are live.

Acting only while entitled to (the safety argument). Two coordinators must never both run one group: the
old one would keep members it no longer owns heartbeating and synced while the new one hands their
partitions to others. A coordinator is the leader of its group's offsets partition, so it acts only while
a leader may: ``shard_for`` (``CoordinatorShards.entitled``) answers NOT_COORDINATOR (16) once this
broker's metadata lease may have expired (``lease_valid``, counted from the last keepalive etcd answered, so
it ends before etcd can expire the lease and let the controller elect a successor) or once the partition is
no longer led here at the shard's epoch.
A cut-off coordinator therefore stops answering JoinGroup, SyncGroup, Heartbeat and OffsetCommit before
its successor can load the group, and its members look the coordinator up again.

SyncGroup completes only once stored: the leader's assignment is appended to the group's partition and
replicated to the ISR (acks=all, ``COMMIT_TIMEOUT_S`` at most) before any member gets it (Kafka's
``doSyncGroup``). A new coordinator loads what the ISR holds, so no member ever acts on an assignment its
successor does not know; an assignment that could not be stored is answered with the error (the members
rejoin).

Clocks: deadlines (join windows, rebalance and session timeouts) run on the monotonic clock, so a step of
the wall clock neither expires every member at once nor keeps a dead one for an hour; the timestamps that
are persisted and compared across restarts (commit times, the Empty-since time) are wall-clock
milliseconds, as Kafka's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from copyless.broker.coordinator_shards import CoordinatorShards
from copyless.broker.groups.coordinator import (
    GroupConfig,
    GroupCoordinator,
    GroupSnapshot,
    GroupState,
    JoinResult,
    SyncResult,
)
from copyless.broker.groups.offsets import (
    OFFSETS_TOPIC,
    CommittedOffset,
    OffsetStore,
    build_batch,
    build_batches,
    offset_commit_key,
    partition_for,
)
from copyless.broker.storage._failpoints import delaypoint
from copyless.protocol.records import read_header as batch_header

__all__ = ["GroupService", "now_ms"]

log = logging.getLogger("copyless.groups")

# __consumer_offsets segments: offsets.topic.segment.bytes (broker/config.py, 16 MiB: ~200,000 commits).
# Startup replay reads the log in slices of this size (whole batches; the first one whole even if larger).
LOAD_READ_BYTES = 1024 * 1024
# How long an offset commit waits for its records to reach the ISR (Kafka: offsets.commit.timeout.ms).
COMMIT_TIMEOUT_S = 5.0
# Compacted, as Kafka's: each commit key (group, topic, partition) and group key keeps its latest record, so a
# coordinator's load replays the live keys (plus the active segment), not the history.
OFFSETS_TOPIC_CONFIGS = {"cleanup.policy": "compact"}


def offsets_topic_configs(config: Any) -> dict[str, str]:
    """The configs ``__consumer_offsets`` is created with."""
    return {**OFFSETS_TOPIC_CONFIGS, "segment.bytes": str(config.offsets_topic_segment_bytes)}


def now_ms() -> int:
    """Wall-clock milliseconds: for timestamps that are persisted (commit times, group state times)."""
    return int(time.time() * 1000)


def monotonic_ms() -> int:
    """Monotonic milliseconds: for the coordinators' deadlines (module docstring, "Clocks")."""
    return int(time.monotonic() * 1000)


# Kafka's ``GroupMetadataManager.storeGroup``: what a member's SyncGroup answers when its assignment could
# not be stored (the client rejoins or looks the coordinator up again).
_STORE_ERRORS = {
    ErrorCode.unknown_topic_or_partition: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas_after_append: ErrorCode.coordinator_not_available,
    ErrorCode.request_timed_out: ErrorCode.coordinator_not_available,
    ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator,
    ErrorCode.kafka_storage_error: ErrorCode.not_coordinator,
    ErrorCode.fenced_leader_epoch: ErrorCode.not_coordinator,
}


def group_config_from(config: Any) -> GroupConfig:
    return GroupConfig(
        min_session_timeout_ms=getattr(config, "group_min_session_timeout_ms", 6_000),
        max_session_timeout_ms=getattr(config, "group_max_session_timeout_ms", 1_800_000),
        initial_rebalance_delay_ms=config.initial_rebalance_delay,
        max_size=getattr(config, "group_max_size", None),
    )


# A parked JoinGroup or SyncGroup: the future its handler awaits, the coordinator's waiter token.
_Waiter = asyncio.Future[JoinResult | SyncResult]


@dataclass
class _Shard:
    """The groups of one offsets partition this broker leads."""

    partition: int
    leader_epoch: int
    coordinator: GroupCoordinator[_Waiter]
    store: OffsetStore = field(default_factory=OffsetStore)
    load_task: asyncio.Task | None = None
    # (group, topic, partition) -> commits appended but not yet known replicated (Kafka's
    # pendingOffsetCommits): unstable for OffsetFetch with require_stable until they are.
    committing: dict[tuple[str, str, int], int] = field(default_factory=dict)

    @property
    def status(self) -> str:
        """The coordinator's: "loading", "active" or "inactive" (what ``CoordinatorShards`` reads)."""
        return self.coordinator.status


class GroupService:
    """One per broker (``broker.groups``). Loop thread only, except log replay (worker thread)."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        config = broker.config
        self.group_config = group_config_from(config)
        self.num_partitions: int = config.offsets_partitions
        self.retention_ms: int = getattr(config, "offsets_retention_ms", 7 * 24 * 3600_000)
        self.retention_check_interval_ms: int = getattr(config, "offsets_retention_check_interval_ms", 600_000)
        self.shard_map: CoordinatorShards[_Shard] = CoordinatorShards(
            broker, topic=OFFSETS_TOPIC, num_partitions=self.num_partitions, partition_for=partition_for,
            topic_configs=lambda: offsets_topic_configs(self.broker.config),
            replication_factor=lambda: self.broker.config.offsets_topic_replication_factor,
            new_shard=self._new_shard, load=self._load, unload=self._unload, log=log, task_prefix="groups",
            keys_noun="group(s)", topic_noun="the offsets topic", partition_noun="the group's offsets partition")
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._writes: set[asyncio.Task] = set()  # group metadata appends in flight
        self.load_ms: float = 0.0

    @property
    def shards(self) -> dict[int, _Shard]:
        """Offsets partition -> the shard of its groups, for each one led here (``shard_map``'s)."""
        return self.shard_map.shards

    # --- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """On a single node create ``__consumer_offsets`` now; everywhere, follow the leadership of its
        partitions (each one this broker leads is loaded)."""
        await self.shard_map.start()
        self._tasks.append(asyncio.create_task(self._timer(), name="groups-timer"))
        self._tasks.append(asyncio.create_task(self._expiry(), name="groups-offset-expiry"))
        self._tasks.append(asyncio.create_task(self._watch_shutdown(), name="groups-shutdown-watch"))

    async def _watch_shutdown(self) -> None:
        """Answer parked JoinGroup/SyncGroup requests as soon as the broker starts shutting down.

        The server waits for in-flight requests before it runs shutdown hooks, and a parked JoinGroup is in
        flight for up to the rebalance timeout (minutes): without this, SIGTERM would wait that long. The
        server wakes every long-poll waiter of ``broker.appends`` when it starts closing; this task parks on
        a key nothing appends to, so only that wake-up (or the hourly timeout) resolves it.
        """
        appends = self.broker.appends
        while not self.broker.closing:
            await appends.wait([("__consumer_groups_shutdown__", -1)], 3600.0)
        for shard in self.shards.values():
            shard.coordinator.deactivate()
        self._after()

    async def stop(self) -> None:
        self.shard_map.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        # Parked JoinGroup/SyncGroup requests get COORDINATOR_NOT_AVAILABLE: clients look for the
        # coordinator again and rejoin once the broker is back.
        for shard in self.shards.values():
            shard.coordinator.deactivate()
        self._after()

    # --- which groups are ours ----------------------------------------------------------------------------

    def _new_shard(self, index: int, leader_epoch: int) -> _Shard:
        """A shard for an offsets partition led here from ``leader_epoch``: its groups load first."""
        coordinator: GroupCoordinator[_Waiter] = GroupCoordinator(self.group_config, store_assignments=True,
                                                                  wall_clock_ms=now_ms)
        coordinator.status = "loading"
        return _Shard(index, leader_epoch, coordinator)

    def _unload(self, shard: _Shard) -> int:
        """A shard dropped (``shard_map``): its parked JoinGroup/SyncGroup requests answer NOT_COORDINATOR.
        Returns how many groups it held."""
        shard.coordinator.deactivate(ErrorCode.not_coordinator)
        self._resolve(shard)
        return len(shard.coordinator.group_ids())

    def partition_of(self, group_id: str) -> int:
        return self.shard_map.partition_of(group_id)

    def shard_for(self, group_id: str) -> tuple[_Shard | None, ErrorCode]:
        """The group's shard when this broker coordinates it and has loaded it, else the error to answer."""
        return self.shard_map.shard_for(group_id)

    def find_coordinator(self, group_id: str, listener: str) -> tuple[ErrorCode, str | None, int, str, int]:
        """FindCoordinator: (error, message, node id, host, port) of the leader of the group's partition."""
        return self.shard_map.find_coordinator(group_id, listener)

    async def _load(self, shard: _Shard, partition) -> None:
        started = time.monotonic()
        try:
            store, offset = await asyncio.to_thread(_replay_log, partition.log)
            # Transaction markers are appended while the replay runs (the coordinator writes them whatever
            # the group shard's state) and fold their pending offsets into no store yet: replay what came
            # meanwhile until, checked on this thread (where markers are appended and applied), nothing
            # did. A marker applied here and again by its writer changes nothing the second time.
            while offset < partition.log.log_end_offset:
                store, reached = await asyncio.to_thread(_replay_log, partition.log, store, offset)
                if reached <= offset:
                    break  # nothing complete to read (a torn tail)
                offset = reached
        except asyncio.CancelledError:
            raise
        except Exception:
            # Unreadable log (I/O error): serve none of its groups rather than groups without their
            # offsets. Clients get COORDINATOR_NOT_AVAILABLE and keep retrying; the log line says why.
            log.exception("cannot load %s-%d; its groups stay unavailable", OFFSETS_TOPIC, shard.partition)
            shard.coordinator.status = "inactive"
            return
        if self.shards.get(shard.partition) is not shard:
            return  # unloaded while loading
        shard.store = store
        now = monotonic_ms()
        for group_id in sorted(store.group_ids()):
            snapshot = store.groups.get(group_id) or GroupSnapshot(group_id, GroupState.EMPTY, 0, None, None,
                                                                    None, now_ms())
            shard.coordinator.load_group(snapshot, now)
        shard.coordinator.status = "active"
        elapsed_ms = (time.monotonic() - started) * 1000
        self.load_ms = max(self.load_ms, elapsed_ms)
        log.info("%s-%d: loaded %d group(s), %d committed offset(s) from %d record(s) in %.0f ms%s", OFFSETS_TOPIC,
                 shard.partition, len(store.group_ids()), sum(len(v) for v in store.offsets.values()),
                 store.records_replayed, elapsed_ms,
                 f" ({store.corrupt_records} unreadable record(s) skipped)" if store.corrupt_records else "")
        self._wakeup.set()

    # --- the coordinators' deadlines -------------------------------------------------------------------------

    async def _timer(self) -> None:
        # One Event and one loop timer rather than asyncio.wait_for: on Python 3.11 wait_for can swallow a
        # cancellation that races with its inner future (gh-86296), and this task must stop on shutdown.
        loop = asyncio.get_running_loop()
        while not self.shard_map.stopping:
            deadlines = [d for d in (s.coordinator.next_deadline_ms() for s in self.shards.values()) if d is not None]
            self._wakeup.clear()
            alarm = None
            if deadlines:
                alarm = loop.call_later(max(min(deadlines) - monotonic_ms(), 0) / 1000, self._wakeup.set)
            try:
                await self._wakeup.wait()
            finally:
                if alarm is not None:
                    alarm.cancel()
            now = monotonic_ms()
            for shard in list(self.shards.values()):
                try:
                    shard.coordinator.tick(now)
                except Exception:  # a bug here must not stop every group's timers
                    log.exception("group coordinator tick failed")
            self._after()

    def _resolve(self, shard: _Shard) -> None:
        for waiter, result in shard.coordinator.take_completions():
            if not waiter.done():
                waiter.set_result(result)

    def _after(self, shard: _Shard | None = None) -> None:
        """Resolve parked requests, persist groups that changed, and re-arm the timer."""
        for current in ([shard] if shard is not None else list(self.shards.values())):
            self._resolve(current)
            changed = current.coordinator.take_changed_groups()
            if changed and self.shards.get(current.partition) is current:
                # A task, in order: the append may have to await its log (a roll). An assignment is handed
                # out once stored (module docstring); other group metadata is advisory (offsets are what
                # must survive), so a failed write of it is only logged.
                task = asyncio.get_running_loop().create_task(self._persist_groups(current, changed))
                self._writes.add(task)
                task.add_done_callback(self._writes.discard)
        self._wakeup.set()

    async def _persist_groups(self, shard: _Shard, snapshots: list[GroupSnapshot]) -> None:
        coordinator = shard.coordinator
        storing = [(s.group_id, s.generation_id) for s in snapshots
                   if coordinator.storing(s.group_id) == s.generation_id]
        error = ErrorCode.none
        try:
            info, partition = await self._append(shard, [shard.store.group_record(s) for s in snapshots])
            if storing:
                await self._wait_stored(partition, info)
        except Exception as exc:
            from copyless.broker.errors import error_for

            code = error_for(exc)[0]
            error = _STORE_ERRORS.get(code, ErrorCode.unknown_server_error)
            log.warning("could not store group metadata of %s (%s): %s", [s.group_id for s in snapshots],
                        code.name, getattr(exc, "message", exc))
        if storing and self.shards.get(shard.partition) is shard:
            for group_id, generation in storing:
                coordinator.assignment_stored(monotonic_ms(), group_id=group_id, generation_id=generation,
                                              error=error)
            self._after(shard)

    async def _wait_stored(self, partition, info) -> None:
        """Until the ISR has the records (acks=all) and, under the sync flush mode, an fdatasync covers them;
        ``COMMIT_TIMEOUT_S`` at most in all. Raises BrokerError (RequestTimedOut, NotLeaderOrFollower, ...)."""
        started = time.monotonic()
        await partition.wait_replicated(info.last_offset + 1, COMMIT_TIMEOUT_S, info.leader_epoch)
        if partition.config.flush_mode == "sync":
            await self._wait_flushed(partition, info.last_offset + 1, COMMIT_TIMEOUT_S - (time.monotonic() - started))

    @staticmethod
    async def _wait_flushed(partition, offset: int, timeout_s: float) -> None:
        """The sync flush mode's wait for the fdatasync covering ``offset``, bounded: a stalled disk answers
        REQUEST_TIMED_OUT (the client retries) instead of holding the request forever."""
        from copyless.broker.errors import RequestTimedOut

        try:
            async with asyncio.timeout(max(timeout_s, 0.0)):
                await asyncio.wrap_future(partition.log.wait_flushed(offset))
        except TimeoutError:
            raise RequestTimedOut(f"{partition.topic}-{partition.partition}: offset {offset - 1} not flushed "
                                  f"within {COMMIT_TIMEOUT_S:.0f} s") from None

    # --- group membership -------------------------------------------------------------------------------------

    async def join_group(self, **kwargs) -> JoinResult:
        shard, error = self.shard_for(kwargs["group_id"])
        if shard is None:
            return JoinResult(error, kwargs.get("member_id", ""))
        waiter = asyncio.get_running_loop().create_future()
        result = shard.coordinator.join_group(monotonic_ms(), waiter=waiter, **kwargs)
        self._after(shard)
        if result is not None:
            return result
        return await waiter

    async def sync_group(self, **kwargs) -> SyncResult:
        shard, error = self.shard_for(kwargs["group_id"])
        if shard is None:
            return SyncResult(error)
        waiter = asyncio.get_running_loop().create_future()
        result = shard.coordinator.sync_group(monotonic_ms(), waiter=waiter, **kwargs)
        self._after(shard)
        if result is not None:
            return result
        return await waiter

    def heartbeat(self, **kwargs) -> ErrorCode:
        shard, error = self.shard_for(kwargs["group_id"])
        if shard is None:
            return error
        error = shard.coordinator.heartbeat(monotonic_ms(), **kwargs)
        self._after(shard)
        return error

    def leave_group(self, **kwargs):
        from copyless.broker.groups.coordinator import LeaveResult

        shard, error = self.shard_for(kwargs["group_id"])
        if shard is None:
            return LeaveResult(error, tuple((m, i, error) for m, i in kwargs.get("members", ())))
        result = shard.coordinator.leave_group(monotonic_ms(), **kwargs)
        self._after(shard)
        return result

    def describe(self, group_id: str) -> tuple[ErrorCode, GroupSnapshot | None]:
        shard, error = self.shard_for(group_id)
        if shard is None:
            return error, None
        return ErrorCode.none, shard.coordinator.describe(group_id)

    def list_groups(self) -> tuple[ErrorCode, list[tuple[str, str]]]:
        """(error, [(group id, protocol type)]) of every group this broker coordinates; an error while one
        of its shards is still loading (as Kafka's ListGroups)."""
        groups = []
        error = ErrorCode.none
        for shard in self.shards.values():
            if not self.shard_map.entitled(shard):
                continue
            if shard.coordinator.status == "loading":
                error = ErrorCode.coordinator_load_in_progress
                continue
            if shard.coordinator.status != "active":
                continue
            for group_id in shard.coordinator.group_ids():
                groups.append((group_id, shard.coordinator.describe(group_id).protocol_type or ""))
        if not self.shard_map.started:
            error = ErrorCode.coordinator_not_available
        return error, sorted(groups)

    # --- offsets -----------------------------------------------------------------------------------------------

    def validate_commit(self, **kwargs) -> ErrorCode:
        shard, error = self.shard_for(kwargs["group_id"])
        if shard is None:
            return error
        error = shard.coordinator.validate_offset_commit(monotonic_ms(), **kwargs)
        self._after(shard)
        return error

    def validate_txn_commit(self, **kwargs) -> ErrorCode:
        shard, error = self.shard_for(kwargs["group_id"])
        if shard is None:
            return error
        return shard.coordinator.validate_txn_offset_commit(**kwargs)

    def committed(self, group_id: str) -> tuple[ErrorCode, dict[tuple[str, int], CommittedOffset]]:
        shard, error = self.shard_for(group_id)
        if shard is None:
            return error, {}
        return ErrorCode.none, shard.store.committed(group_id)

    def unstable(self, group_id: str, topic: str, partition: int) -> bool:
        """KIP-447 (Kafka's ``hasPendingOffsetCommitsForTopicPartition``): is an offset of the group for this
        partition being committed, or held by an open transaction? OffsetFetch with require_stable then
        answers UNSTABLE_OFFSET_COMMIT, and the client retries until the transaction ends."""
        shard, _error = self.shard_for(group_id)
        if shard is None:
            return False
        return (group_id, topic, partition) in shard.committing or shard.store.has_pending(group_id, topic, partition)

    @contextlib.contextmanager
    def _committing(self, shard: _Shard, group_id: str, commits) -> Iterator[None]:
        keys = [(group_id, topic, partition) for topic, partition in commits]
        for key in keys:
            shard.committing[key] = shard.committing.get(key, 0) + 1
        try:
            yield
        finally:
            for key in keys:
                left = shard.committing.get(key, 0) - 1
                if left > 0:
                    shard.committing[key] = left
                else:
                    shard.committing.pop(key, None)

    async def commit_offsets(self, group_id: str, commits: dict[tuple[str, int], CommittedOffset]) -> None:
        """Append the commits to the group's partition and show them once replicated.

        Raises:
            BrokerError / StorageError: the commit did not happen (or is not known to be replicated).
        """
        if not commits:
            return
        shard, error = self.shard_for(group_id)
        if shard is None:
            from copyless.broker.errors import BrokerError

            raise BrokerError(error, error.name)
        records = shard.store.commit_records(group_id, commits)
        with self._committing(shard, group_id, commits):
            info, partition = await self._append(shard, records, fold=False)
            # A commit is acknowledged once replicated (acks=all on its __consumer_offsets partition), and
            # only then shown to OffsetFetch: the view never holds an offset a failover could take back.
            await self._wait_stored(partition, info)
            if self.shards.get(shard.partition) is shard:
                shard.store.apply(records)

    # --- transactional offset commits (TxnOffsetCommit) -----------------------------------------------------------

    async def txn_commit_offsets(self, group_id: str, producer_id: int, producer_epoch: int,
                                 commits: dict[tuple[str, int], CommittedOffset]) -> None:
        """Append the commits as a transactional batch of the producer to the group's partition (fenced by
        the producer's epoch there) and hold them until the transaction's marker reaches that partition
        (``complete_txn``): OffsetFetch shows them only once committed. Raises BrokerError / StorageError."""
        if not commits:
            return
        shard, error = self.shard_for(group_id)
        if shard is None:
            from copyless.broker.errors import BrokerError

            raise BrokerError(error, error.name)
        records = shard.store.commit_records(group_id, commits)
        data = build_batch(records, now_ms(), producer_id=producer_id, producer_epoch=producer_epoch)
        partition = self.broker.replicas.leader(OFFSETS_TOPIC, shard.partition)
        with self._committing(shard, group_id, commits):
            await partition.ensure_transactional()
            info = await partition.append_as_leader(data, batch_header(data), acks=-1)
            await self._wait_stored(partition, info)
            if self.shards.get(shard.partition) is shard:
                shard.store.add_pending(producer_id, records)

    def complete_txn(self, partition_index: int, producer_id: int, commit: bool) -> None:
        """The transaction coordinator wrote a marker for ``producer_id`` to this offsets partition."""
        shard = self.shards.get(partition_index)
        if shard is not None:
            count = shard.store.complete_txn(producer_id, commit)
            if count:
                log.debug("%s-%d: %d offset(s) of producer %d %s", OFFSETS_TOPIC, partition_index, count,
                          producer_id, "committed" if commit else "dropped")

    # --- deleting groups and offsets (DeleteGroups, OffsetDelete) ------------------------------------------------

    def _known(self, shard: _Shard, group_id: str) -> bool:
        return shard.coordinator.has_group(group_id) or group_id in shard.store.group_ids()

    async def _append_replicated(self, shard: _Shard, records: list) -> None:
        """Append tombstones and wait, as a commit does, until the ISR has them; the view drops what they
        delete at once (a deleted offset is never served again by this coordinator)."""
        info, partition = await self._append(shard, records)
        await partition.wait_replicated(info.last_offset + 1, COMMIT_TIMEOUT_S, info.leader_epoch)

    async def delete_groups(self, group_ids) -> dict[str, ErrorCode]:
        """DeleteGroups (Kafka's ``GroupCoordinator.handleDeleteGroups``): an Empty (or Dead) group loses its
        committed offsets and its metadata, by tombstones in ``__consumer_offsets``. Per group: NONE,
        NON_EMPTY_GROUP (members remain), GROUP_ID_NOT_FOUND, or the coordinator errors (NOT_COORDINATOR, ...)."""
        results: dict[str, ErrorCode] = {}
        for group_id in group_ids:
            shard, error = self.shard_for(group_id)
            if shard is None:
                results[group_id] = error
                continue
            if not self._known(shard, group_id):
                results[group_id] = ErrorCode.group_id_not_found
                continue
            snapshot = shard.coordinator.describe(group_id)
            removable = snapshot.state in (GroupState.EMPTY, GroupState.DEAD)
            if not removable or not shard.coordinator.remove_group(group_id):
                results[group_id] = ErrorCode.non_empty_group
                continue
            tombstones: list[tuple[bytes, bytes | None]] = [(offset_commit_key(group_id, topic, partition), None)
                          for topic, partition in sorted(shard.store.committed(group_id))]
            tombstones.append(shard.store.group_record(GroupSnapshot(group_id, GroupState.DEAD, -1, None, None,
                                                                     None, now_ms())))
            try:
                await self._append_replicated(shard, tombstones)
                results[group_id] = ErrorCode.none
                log.info("deleted group %s (%d committed offset(s))", group_id, len(tombstones) - 1)
            except Exception as exc:
                from copyless.broker.errors import error_for

                results[group_id] = error_for(exc)[0]
        return results

    async def delete_offsets(self, group_id: str, partitions) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        """OffsetDelete (KIP-496): drop a group's committed offsets of ``partitions`` [(topic, partition)].

        Returns (group error, per partition error). A group with members may lose only offsets of topics
        none of them subscribes to (GROUP_SUBSCRIBED_TO_TOPIC for the others), and only when it uses the
        consumer protocol, whose subscriptions the broker can read (otherwise NON_EMPTY_GROUP).
        """
        shard, error = self.shard_for(group_id)
        if shard is None:
            return error, {}
        if not self._known(shard, group_id):
            return ErrorCode.group_id_not_found, {}
        snapshot = shard.coordinator.describe(group_id)
        subscribed: set[str] = set()
        if snapshot.state not in (GroupState.EMPTY, GroupState.DEAD):
            if snapshot.protocol_type != "consumer":
                return ErrorCode.non_empty_group, {}
            for member in snapshot.members:
                subscribed.update(subscribed_topics(member.metadata))
        outcome: dict[tuple[str, int], ErrorCode] = {}
        committed = shard.store.committed(group_id)
        tombstones = []
        for topic, partition in partitions:
            if topic in subscribed:
                outcome[(topic, partition)] = ErrorCode.group_subscribed_to_topic
                continue
            outcome[(topic, partition)] = ErrorCode.none
            if (topic, partition) in committed:
                tombstones.append((offset_commit_key(group_id, topic, partition), None))
        if tombstones:
            try:
                await self._append_replicated(shard, tombstones)
            except Exception as exc:
                from copyless.broker.errors import error_for

                return error_for(exc)[0], {}
            log.info("group %s: deleted %d committed offset(s)", group_id, len(tombstones))
        return ErrorCode.none, outcome

    async def _append(self, shard: _Shard, records: list, *, fold: bool = True):
        """Append ``(key, value)`` records to the shard's partition (loop thread; a memcpy into the mapped
        segment, or an await while its log prepares a segment). Returns (AppendInfo, Partition). Raises
        BrokerError / StorageError."""
        data = build_batches(records, now_ms())
        partition = self.broker.replicas.leader(OFFSETS_TOPIC, shard.partition)
        info = await partition.append_as_leader(data, batch_header(data), acks=-1)
        if fold:
            shard.store.apply(records)
        return info, partition

    async def _expiry(self) -> None:
        while True:
            await asyncio.sleep(self.retention_check_interval_ms / 1000)
            try:
                await self.expire_offsets(now_ms())
            except Exception:
                log.exception("offset expiry failed")

    async def expire_offsets(self, now: int) -> int:
        """Tombstone the offsets ``offsets.retention.minutes`` expired; drop groups left empty. Returns count."""
        expired_count = removed_count = 0
        for shard in list(self.shards.values()):
            if shard.coordinator.status != "active":
                continue
            store, coordinator = shard.store, shard.coordinator
            tombstones: list[tuple[bytes, bytes | None]] = []
            for group_id in sorted(store.group_ids()):
                snapshot = coordinator.describe(group_id)
                expired = store.expired(group_id, snapshot, now, self.retention_ms)
                for topic, partition in expired:
                    tombstones.append((offset_commit_key(group_id, topic, partition), None))
                expired_count += len(expired)
                remaining = len(store.committed(group_id)) - len(expired)
                if remaining == 0 and snapshot.state in (GroupState.EMPTY, GroupState.DEAD) and \
                        coordinator.remove_group(group_id):
                    removed_count += 1
                    if group_id in store.groups:
                        dead = GroupSnapshot(group_id, GroupState.DEAD, -1, None, None, None, now)
                        tombstones.append(store.group_record(dead))
            if tombstones:
                try:
                    await self._append(shard, tombstones)
                except Exception as exc:
                    log.warning("%s-%d: expiring offsets failed: %s", OFFSETS_TOPIC, shard.partition, exc)
        if expired_count or removed_count:
            log.info("expired %d committed offset(s); removed %d empty group(s)", expired_count, removed_count)
        return expired_count


def subscribed_topics(metadata: bytes) -> list[str]:
    """The topics of a consumer-protocol member's subscription (``ConsumerProtocolSubscription``: int16
    version, then an array of int16-length topic names; later fields are not needed). Unreadable metadata
    subscribes to nothing. Pure."""
    import struct

    try:
        (count,) = struct.unpack_from(">i", metadata, 2)
        position, topics = 6, []
        for _ in range(max(count, 0)):
            (length,) = struct.unpack_from(">h", metadata, position)
            position += 2
            topics.append(bytes(metadata[position:position + length]).decode())
            position += length
        return topics
    except (struct.error, UnicodeDecodeError):
        return []


def _replay_log(partition_log, store: OffsetStore | None = None, offset: int | None = None) -> tuple[OffsetStore, int]:
    """Fold one ``__consumer_offsets`` partition into ``store`` (a new one) from ``offset`` (its start) to its
    end (worker thread: pread, decode); returns the store and the offset after the last batch read."""
    store = store if store is not None else OffsetStore()
    offset = partition_log.log_start_offset if offset is None else offset
    end = partition_log.log_end_offset
    while offset < end:
        result = partition_log.read(offset, LOAD_READ_BYTES, min_one_message=True)
        if result.slice is None:
            break
        with result.slice as region:
            data = region.read_bytes()
        next_offset = store.replay(data)
        if next_offset <= offset:
            break  # no complete batch: a torn tail recovery left behind; nothing more to read
        offset = next_offset
    delaypoint("groups.load.replayed")
    return store, offset
