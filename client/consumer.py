"""The asyncio consumer: manual assignment or group subscription, prefetching fetches, lazy record parsing.

Owns the public ``Consumer`` API and composes the pieces that do the work, one idea each:
- ``fetcher.Fetcher``: positions, offset resets, fetches from each partition's leader, record hand-out;
- ``group.GroupMembership`` (with ``group.GroupCoordinator``): joining, syncing, heartbeats, leaving;
- ``commits.OffsetCommits``: committing positions and reading committed offsets.
The consumer wires them: the membership's assignments go to the fetcher, the fetcher's starting offsets
come from the commits, and with auto-commit the positions are committed periodically, before a rejoin
and on close.
"""

from __future__ import annotations

import asyncio
import logging
import time

from copyless.client.assignors import ASSIGNORS, TopicPartition
from copyless.client.cluster import Cluster
from copyless.client.commits import OffsetCommits
from copyless.client.conn import DEFAULT_REQUEST_TIMEOUT_MS
from copyless.client.errors import ClientError
from copyless.client.fetcher import Fetcher, OffsetOutOfRangeError, RecordTooLargeError
from copyless.client.group import GroupCoordinator, GroupMembership
from copyless.client.security import resolve as resolve_security
from copyless.protocol.fetch_records import ConsumerRecord

__all__ = ["Consumer", "ConsumerRecord", "TopicPartition", "OffsetOutOfRangeError", "RecordTooLargeError"]

log = logging.getLogger("copyless.client.consumer")


class Consumer:
    """An asyncio Kafka consumer.

    Args:
        *topics: subscribe to these at ``start()`` (requires ``group_id``); or call ``assign``/``subscribe``.
        bootstrap_servers: ``"host:port[,...]"``.
        group_id: consumer group (None: no group; offsets only via ``seek``/``auto_offset_reset``).
        auto_offset_reset: "earliest", "latest" or "none" (raise ``OffsetOutOfRangeError``).
        enable_auto_commit / auto_commit_interval_ms: commit positions periodically, on rebalance and close.
        fetch_max_wait_ms, fetch_min_bytes, fetch_max_bytes, max_partition_fetch_bytes: Kafka's fetch knobs.
        partition_assignment_strategy: names from ("range", "roundrobin"), preferred first.
        check_crcs: verify each batch's CRC-32C.
        isolation_level: "read_uncommitted" or "read_committed".
        security, or security_protocol / sasl_mechanism / sasl_plain_username / sasl_plain_password /
            ssl_cafile / ssl_certfile / ssl_keyfile / ssl_password / ssl_check_hostname / ssl_context: TLS and
            SASL (``client.security``).
    """

    def __init__(
        self,
        *topics: str,
        bootstrap_servers,
        group_id: str | None = None,
        client_id: str = "copyless-consumer",
        auto_offset_reset: str = "latest",
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5000,
        fetch_max_wait_ms: int = 500,
        fetch_min_bytes: int = 1,
        fetch_max_bytes: int = 50 * 1024 * 1024,
        max_partition_fetch_bytes: int = 1024 * 1024,
        session_timeout_ms: int = 45_000,
        heartbeat_interval_ms: int = 3000,
        rebalance_timeout_ms: int = 300_000,
        partition_assignment_strategy=("range", "roundrobin"),
        check_crcs: bool = True,
        isolation_level: str = "read_uncommitted",
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        retry_backoff_ms: int = 100,
        security=None,
        **security_options,
    ) -> None:
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError(f"auto_offset_reset must be earliest, latest or none, not {auto_offset_reset!r}")
        strategies = tuple(partition_assignment_strategy)
        for name in strategies:
            if name not in ASSIGNORS:
                raise ValueError(f"unknown assignment strategy {name!r}; use {sorted(ASSIGNORS)}")
        if topics and group_id is None:
            raise ValueError("subscribing to topics needs a group_id (or use assign())")
        self.group_id = group_id
        self.auto_offset_reset = auto_offset_reset
        self.enable_auto_commit = enable_auto_commit and group_id is not None
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.strategies = strategies
        self.retry_backoff_ms = retry_backoff_ms
        self._cluster = Cluster(
            bootstrap_servers,
            client_id=client_id,
            request_timeout_ms=max(request_timeout_ms, fetch_max_wait_ms + 5000),
            retry_backoff_ms=retry_backoff_ms,
            security=resolve_security(security, security_options),
        )
        self._fetcher = Fetcher(
            self._cluster,
            committed_lookup=self._committed_for_reset if group_id is not None else None,
            auto_offset_reset=auto_offset_reset,
            fetch_max_wait_ms=fetch_max_wait_ms,
            fetch_min_bytes=fetch_min_bytes,
            fetch_max_bytes=fetch_max_bytes,
            max_partition_fetch_bytes=max_partition_fetch_bytes,
            check_crcs=check_crcs,
            isolation_level=1 if isolation_level == "read_committed" else 0,
            retry_backoff_ms=retry_backoff_ms,
        )
        self._initial_topics = topics
        self._coordinator: GroupCoordinator | None = None
        self._membership: GroupMembership | None = None
        self._commits: OffsetCommits | None = None
        self._assignment_ready = asyncio.Event()  # set on each assignment (a consumer without a group)
        self._started = False
        self._closed = False

    # --- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and load broker metadata; join the group if topics were given."""
        self._assignment_ready = asyncio.Event()
        await self._cluster.start()
        if self.group_id is not None:
            self._coordinator = GroupCoordinator(self._cluster, self.group_id, self.retry_backoff_ms)
            self._commits = OffsetCommits(
                self._coordinator, None,
                auto_commit_interval_ms=self.auto_commit_interval_ms if self.enable_auto_commit else 0,
            )
        self._fetcher.start()
        self._started = True
        if self._initial_topics:
            self.subscribe(list(self._initial_topics))

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self) -> None:
        """Commit (with auto-commit), leave the group, release buffers and close connections."""
        if self._closed:
            return
        try:
            membership = self._membership
            if membership is not None and membership.generation >= 0:
                if self.enable_auto_commit:
                    try:
                        await self.commit()
                    except Exception as exc:
                        log.warning("final commit failed: %s", exc)
                await membership.leave()
        finally:
            self._closed = True
            if self._membership is not None:
                self._membership.close()
            if self._commits is not None:
                self._offsets.close()
            self._fetcher.close()
            await self._cluster.close()

    # --- assignment and positions ------------------------------------------------------------------------

    def assign(self, partitions) -> None:
        """Consume exactly these partitions (no group management). Positions start unknown: the consumer
        resets them per ``auto_offset_reset`` unless ``seek`` is called."""
        if self._membership is not None:
            raise ClientError("assign() after subscribe(): use one or the other")
        self._set_assignment([TopicPartition(*tp) for tp in partitions])

    def assignment(self) -> set[TopicPartition]:
        return set(self._fetcher.assignment)

    def subscribe(self, topics) -> None:
        """Join ``group_id`` for ``topics``; partitions are assigned by the group (asynchronously)."""
        if self.group_id is None:
            raise ClientError("subscribe() needs a group_id")
        if not self._started:
            self._initial_topics = tuple(topics)
            return
        if self._membership is None:
            self._membership = GroupMembership(
                self._cluster,
                self._offsets.coordinator,
                strategies=self.strategies,
                on_assigned=self._set_assignment,
                before_rejoin=self._commit_before_rejoin if self.enable_auto_commit else None,
                session_timeout_ms=self.session_timeout_ms,
                rebalance_timeout_ms=self.rebalance_timeout_ms,
                heartbeat_interval_ms=self.heartbeat_interval_ms,
                retry_backoff_ms=self.retry_backoff_ms,
            )
            self._offsets.membership = self._membership
        self._membership.subscribe(topics)

    @property
    def _offsets(self) -> OffsetCommits:
        """The group's offset commits: a consumer with a group_id has them from start() on."""
        if self._commits is None:
            raise ClientError("the consumer has no group (group_id) or is not started")
        return self._commits

    def _set_assignment(self, partitions: list[TopicPartition]) -> None:
        self._fetcher.set_assignment(partitions)
        self._assignment_ready.set()

    async def wait_for_assignment(self, timeout_ms: int = 60_000) -> set[TopicPartition]:
        """Wait until the group has given this member an assignment (possibly empty)."""
        membership = self._membership
        ready = membership.assignment_ready if membership is not None else self._assignment_ready
        async with asyncio.timeout(timeout_ms / 1000):
            if membership is None:
                await ready.wait()
            else:
                waits = [asyncio.ensure_future(ready.wait()), asyncio.ensure_future(membership.failed.wait())]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for wait in waits:
                        wait.cancel()
                if membership.fatal_error is not None:
                    raise membership.fatal_error
        return self.assignment()

    def seek(self, partition, offset: int) -> None:
        """Fetch ``partition`` from ``offset`` next (buffered records of it are dropped)."""
        self._fetcher.seek(partition, offset)

    def seek_to_beginning(self, *partitions) -> None:
        self._fetcher.seek_to_beginning(*partitions)

    def seek_to_end(self, *partitions) -> None:
        self._fetcher.seek_to_end(*partitions)

    async def position(self, partition) -> int:
        """The offset of the next record to be handed out for ``partition`` (resolving resets first)."""
        return await self._fetcher.position(partition)

    def pause(self, *partitions) -> None:
        self._fetcher.pause(*partitions)

    def resume(self, *partitions) -> None:
        self._fetcher.resume(*partitions)

    async def beginning_offsets(self, partitions) -> dict[TopicPartition, int]:
        return await self._fetcher.beginning_offsets(partitions)

    async def end_offsets(self, partitions) -> dict[TopicPartition, int]:
        return await self._fetcher.end_offsets(partitions)

    async def offsets_for_times(self, timestamps: dict) -> dict[TopicPartition, int | None]:
        """``{tp: timestamp_ms}`` -> the first offset whose record timestamp is >= it (None: no such record)."""
        return await self._fetcher.offsets_for_times(timestamps)

    # --- records ------------------------------------------------------------------------------------------

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        """Records ready now, waiting up to ``timeout_ms`` for some: ``{TopicPartition: [ConsumerRecord]}``.

        Raises the first fetch error (``OffsetOutOfRangeError`` with reset "none", a corrupt batch, ...).
        """
        fetcher = self._fetcher
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            if fetcher.errors:
                raise fetcher.errors.popleft()
            if self._membership is not None:
                if self._membership.fatal_error is not None:
                    raise self._membership.fatal_error
                self._membership.ensure_joining()
            records = fetcher.take_records(max_records)
            if records:
                self._maybe_auto_commit()
                return records
            if fetcher.errors:
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._maybe_auto_commit()
                return {}
            if self._membership is not None and self._membership.generation < 0:
                # Not in the group yet: wake up as well if joining fails for good.
                remaining = min(remaining, 0.1)
            await fetcher.wait_for_data(remaining)

    async def getone(self) -> ConsumerRecord:
        """The next record (waits as long as needed)."""
        while True:
            batch = await self.getmany(timeout_ms=1000, max_records=1)
            for records in batch.values():
                return records[0]

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        while not self._closed:
            batch = await self.getmany(timeout_ms=1000)
            for records in batch.values():
                for record in records:
                    yield record

    # --- commits ----------------------------------------------------------------------------------------

    def _maybe_auto_commit(self) -> None:
        membership = self._membership
        if self.enable_auto_commit and membership is not None and membership.generation >= 0:
            self._offsets.maybe_auto_commit(self._fetcher.positions)

    async def _commit_before_rejoin(self) -> None:
        try:
            await self.commit()
        except Exception as exc:
            log.info("commit before rejoin failed: %s", exc)

    async def _committed_for_reset(self, tps) -> dict[TopicPartition, int | None]:
        return await self._offsets.fetch(tps)

    async def commit(self, offsets: dict | None = None) -> None:
        """Commit ``{TopicPartition: offset}`` (default: every position) for the group.

        Raises:
            KafkaError: e.g. REBALANCE_IN_PROGRESS / ILLEGAL_GENERATION (the member then rejoins).
        """
        if self.group_id is None:
            raise ClientError("commit() needs a group_id")
        if offsets is None:
            await self._offsets.commit(self._fetcher.positions(), only_changed=True)
        else:
            await self._offsets.commit({TopicPartition(*tp): int(o) for tp, o in offsets.items()})

    async def committed(self, partition) -> int | None:
        """The group's committed offset for ``partition`` (None if nothing was committed)."""
        if self.group_id is None:
            raise ClientError("committed() needs a group_id")
        tp = TopicPartition(*partition)
        return (await self._offsets.fetch([tp])).get(tp)
