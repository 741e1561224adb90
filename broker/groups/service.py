"""The asyncio shell around the group coordinator and the offsets store: timers, parked requests, the log.

This module owns everything about groups that involves the event loop or the disk:

- parked JoinGroup/SyncGroup requests are asyncio futures handed to the pure coordinator as waiter tokens;
  after every call the coordinator's completions resolve them;
- one timer task sleeps until the coordinator's next deadline (join window, rebalance timeout, sync timeout,
  session expiry) and ticks it, so a member that stopped heartbeating is removed at its session timeout
  even when no request arrives;
- committed offsets and group metadata are appended to ``__consumer_offsets`` through the broker (loop
  thread, non-blocking mmap copy), and read back on startup on a worker thread while the coordinator answers
  COORDINATOR_LOAD_IN_PROGRESS;
- a periodic task expires offsets of groups that stayed empty past ``offsets.retention.minutes``.

Clock: wall-clock milliseconds, as Kafka's coordinator (commit timestamps and the Empty-since time are
persisted and compared across restarts).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from copyless.broker.groups.coordinator import GroupConfig, GroupCoordinator, GroupSnapshot, GroupState, JoinResult, SyncResult
from copyless.client.protocol.records import read_header as batch_header
from copyless.broker.groups.offsets import (
    OFFSETS_TOPIC,
    CommittedOffset,
    OffsetStore,
    build_batches,
    offset_commit_key,
    partition_for,
)

__all__ = ["GroupService", "now_ms"]

log = logging.getLogger("copyless.groups")

# __consumer_offsets segments: Kafka's offsets.topic.segment.bytes is 100 MiB; a commit record is ~80 bytes,
# so 16 MiB holds ~200,000 commits while keeping the preallocated active + pre-warmed next segment small.
OFFSETS_SEGMENT_BYTES = 16 * 1024 * 1024
# Startup replay reads the log in slices of this size (whole batches; the first one whole even if larger).
LOAD_READ_BYTES = 1024 * 1024
# How long an offset commit waits for its records to reach the ISR (Kafka: offsets.commit.timeout.ms).
COMMIT_TIMEOUT_S = 5.0


# A key of ``broker.appends`` that no partition uses: see GroupService._watch_shutdown.
_SHUTDOWN_KEY = ("__consumer_groups_shutdown__", -1)


def now_ms() -> int:
    return int(time.time() * 1000)


def group_config_from(config: Any) -> GroupConfig:
    return GroupConfig(
        min_session_timeout_ms=getattr(config, "group_min_session_timeout_ms", 6_000),
        max_session_timeout_ms=getattr(config, "group_max_session_timeout_ms", 1_800_000),
        initial_rebalance_delay_ms=getattr(config, "group_initial_rebalance_delay_ms", 3_000),
        max_size=getattr(config, "group_max_size", None),
    )


class GroupService:
    """One per broker (``broker.groups``). Loop thread only, except the startup replay (worker thread)."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        config = broker.config
        self.coordinator = GroupCoordinator(group_config_from(config))
        self.coordinator.status = "inactive"
        self.store = OffsetStore()
        self.num_partitions: int = getattr(config, "offsets_topic_num_partitions", 1)
        self.retention_ms: int = getattr(config, "offsets_retention_ms", 7 * 24 * 3600_000)
        self.retention_check_interval_ms: int = getattr(config, "offsets_retention_check_interval_ms", 600_000)
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._tasks: list[asyncio.Task] = []
        self.load_ms: float = 0.0

    # --- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Create ``__consumer_offsets`` if needed, then load it in the background and start the timers."""
        topic = self.broker.topic(OFFSETS_TOPIC)
        if topic is None:
            # cleanup.policy stays "delete" with retention off: the log is never truncated under live offsets
            # (copyless has no compaction; see the README).
            topic = await self.broker.create_topic(
                OFFSETS_TOPIC, self.num_partitions,
                {"retention.ms": "-1", "segment.bytes": str(OFFSETS_SEGMENT_BYTES)}, internal=True,
            )
        self.num_partitions = topic.partitions
        self.coordinator.status = "loading"
        self._tasks.append(asyncio.create_task(self._load(), name="groups-load"))
        self._tasks.append(asyncio.create_task(self._watch_shutdown(), name="groups-shutdown-watch"))

    async def _watch_shutdown(self) -> None:
        """Answer parked JoinGroup/SyncGroup requests as soon as the broker starts shutting down.

        The server waits for in-flight requests before it runs shutdown hooks, and a parked JoinGroup is in
        flight for up to the rebalance timeout (minutes): without this, SIGTERM would wait that long. The
        server wakes every long-poll waiter of ``broker.appends`` when it starts closing; this task parks on
        a key nothing appends to, so only that wake-up (or the hourly timeout) resolves it.
        """
        appends = getattr(self.broker, "appends", None)
        if appends is None:
            return
        while not getattr(self.broker, "closing", False):
            await appends.wait([_SHUTDOWN_KEY], 3600.0)
        self.coordinator.deactivate()
        self._after()

    async def stop(self) -> None:
        self._stopping = True
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
        self.coordinator.deactivate()
        self._after()

    async def _load(self) -> None:
        started = time.monotonic()
        logs = [self.broker.replicas.get(OFFSETS_TOPIC, p) for p in range(self.num_partitions)]
        logs = [partition.log if partition is not None else None for partition in logs]
        try:
            store = await asyncio.to_thread(_replay_logs, logs)
        except Exception:
            # Unreadable log (I/O error): serve no group rather than groups without their offsets. Clients
            # get COORDINATOR_NOT_AVAILABLE and keep retrying; the log line says why.
            log.exception("cannot load %s; the group coordinator stays unavailable", OFFSETS_TOPIC)
            self.coordinator.status = "inactive"
            return
        self.store = store
        now = now_ms()
        for group_id in sorted(store.group_ids()):
            snapshot = store.groups.get(group_id) or GroupSnapshot(group_id, GroupState.EMPTY, 0, None, None,
                                                                    None, now)
            self.coordinator.load_group(snapshot, now)
        self.coordinator.status = "active"
        self.load_ms = (time.monotonic() - started) * 1000
        log.info("group coordinator loaded %d group(s), %d committed offset(s) from %d record(s) in %.0f ms%s",
                 len(store.group_ids()), sum(len(v) for v in store.offsets.values()), store.records_replayed,
                 self.load_ms, f" ({store.corrupt_records} unreadable record(s) skipped)"
                 if store.corrupt_records else "")
        self._tasks.append(asyncio.create_task(self._timer(), name="groups-timer"))
        self._tasks.append(asyncio.create_task(self._expiry(), name="groups-offset-expiry"))

    # --- the coordinator's deadlines --------------------------------------------------------------------------

    async def _timer(self) -> None:
        # One Event and one loop timer rather than asyncio.wait_for: on Python 3.11 wait_for can swallow a
        # cancellation that races with its inner future (gh-86296), and this task must stop on shutdown.
        loop = asyncio.get_running_loop()
        while not self._stopping:
            deadline_ms = self.coordinator.next_deadline_ms()
            self._wakeup.clear()
            alarm = None
            if deadline_ms is not None:
                alarm = loop.call_later(max(deadline_ms - now_ms(), 0) / 1000, self._wakeup.set)
            try:
                await self._wakeup.wait()
            finally:
                if alarm is not None:
                    alarm.cancel()
            try:
                self.coordinator.tick(now_ms())
                self._after()
            except Exception:  # a bug here must not stop every group's timers
                log.exception("group coordinator tick failed")

    def _after(self) -> None:
        """Resolve parked requests, persist groups that changed, and re-arm the timer."""
        for waiter, result in self.coordinator.take_completions():
            if not waiter.done():
                waiter.set_result(result)
        changed = self.coordinator.take_changed_groups()
        if changed:
            try:
                self._append_records(
                    [(s.group_id, self.store.group_record(s)) for s in changed])
            except Exception:
                # Group metadata is advisory (offsets are what must survive): a failed write is logged.
                log.exception("could not persist group metadata of %s", [s.group_id for s in changed])
        self._wakeup.set()

    # --- group membership -------------------------------------------------------------------------------------

    async def join_group(self, **kwargs) -> JoinResult:
        waiter = asyncio.get_running_loop().create_future()
        result = self.coordinator.join_group(now_ms(), waiter=waiter, **kwargs)
        self._after()
        if result is not None:
            return result
        return await waiter

    async def sync_group(self, **kwargs) -> SyncResult:
        waiter = asyncio.get_running_loop().create_future()
        result = self.coordinator.sync_group(now_ms(), waiter=waiter, **kwargs)
        self._after()
        if result is not None:
            return result
        return await waiter

    def heartbeat(self, **kwargs):
        error = self.coordinator.heartbeat(now_ms(), **kwargs)
        self._after()
        return error

    def leave_group(self, **kwargs):
        result = self.coordinator.leave_group(now_ms(), **kwargs)
        self._after()
        return result

    # --- offsets -----------------------------------------------------------------------------------------------

    def validate_commit(self, **kwargs):
        error = self.coordinator.validate_offset_commit(now_ms(), **kwargs)
        self._after()
        return error

    async def commit_offsets(self, group_id: str, commits: dict[tuple[str, int], CommittedOffset]) -> None:
        """Append the commits to ``__consumer_offsets``, then show them. Raises StorageError on a failed append."""
        if not commits:
            return
        records = self.store.commit_records(group_id, commits)
        info, partition = self._append_records([(group_id, record) for record in records])
        if partition is not None:
            # A commit is acknowledged once replicated (acks=all on its __consumer_offsets partition).
            await partition.wait_replicated(info.last_offset + 1, COMMIT_TIMEOUT_S)
            if partition.config.flush_mode == "sync":
                await asyncio.wrap_future(partition.log.wait_flushed(info.last_offset + 1))

    def _append_records(self, records: list[tuple[str, tuple[bytes, bytes | None]]]):
        """Append ``(group_id, (key, value))`` records, each to its group's partition; fold them into the view.

        Loop thread; the append is a memcpy into the mapped segment. Returns the last (AppendInfo, Partition).
        """
        by_partition: dict[int, list] = {}
        for group_id, record in records:
            by_partition.setdefault(partition_for(group_id, self.num_partitions), []).append(record)
        last = (None, None)
        for index, batch_records in by_partition.items():
            data = build_batches(batch_records, now_ms())
            partition = self.broker.replicas.leader(OFFSETS_TOPIC, index)
            info = partition.append_as_leader(data, batch_header(data), acks=-1)
            self.store.apply(batch_records)
            last = (info, partition)
        return last

    async def _expiry(self) -> None:
        while True:
            await asyncio.sleep(self.retention_check_interval_ms / 1000)
            try:
                self.expire_offsets(now_ms())
            except Exception:
                log.exception("offset expiry failed")

    def expire_offsets(self, now: int) -> int:
        """Tombstone the offsets ``offsets.retention.minutes`` expired; drop groups left empty. Returns count."""
        tombstones: list[tuple[str, tuple[bytes, bytes | None]]] = []
        removed_groups = []
        expired_count = 0
        for group_id in sorted(self.store.group_ids()):
            snapshot = self.coordinator.describe(group_id)
            expired = self.store.expired(group_id, snapshot, now, self.retention_ms)
            for topic, partition in expired:
                tombstones.append((group_id, (offset_commit_key(group_id, topic, partition), None)))
            expired_count += len(expired)
            remaining = len(self.store.committed(group_id)) - len(expired)
            if remaining == 0 and snapshot.state in (GroupState.EMPTY, GroupState.DEAD) and \
                    self.coordinator.remove_group(group_id):
                removed_groups.append(group_id)
                if group_id in self.store.groups:
                    dead = GroupSnapshot(group_id, GroupState.DEAD, -1, None, None, None, now)
                    tombstones.append((group_id, self.store.group_record(dead)))
        if tombstones:
            self._append_records(tombstones)
        if expired_count or removed_groups:
            log.info("expired %d committed offset(s); removed %d empty group(s)", expired_count, len(removed_groups))
        return expired_count


def _replay_logs(logs) -> OffsetStore:
    """Read every partition of ``__consumer_offsets`` from its start (worker thread: pread, decode)."""
    store = OffsetStore()
    for partition_log in logs:
        if partition_log is None:
            continue
        offset = partition_log.log_start_offset
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
    return store
