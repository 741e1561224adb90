"""The asyncio consumer: manual assignment or group subscription, prefetching fetches, lazy record parsing.

Owns the consumer's public API, the fetcher (one Fetch in flight per leader, issued again as soon as the
previous response's partitions are handed out), offset resets (ListOffsets), and group membership
(FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch).

Data path: a Fetch response larger than 32 KiB is read by the connection straight into a pooled buffer
(``protocol.receive``); the response is decoded only down to each partition's byte range
(``messages.decode_fetch_response``); ``PartitionRecords`` decodes one batch at a time as ``getmany`` or
``async for`` asks for records; when a response's last partition is exhausted its buffer returns to the
pool for the next fetch. A trailing partial batch is ignored (it comes back whole in the next fetch); a
response holding only part of one batch doubles that partition's fetch size (see ``fetch_records``).

Positions: ``position(tp)`` is the offset of the next record to hand out. Records are handed out in
offset order per partition; the position moves past each record handed out and past batches that hold
no consumable record (control batches, compacted gaps).

Groups: the member runs a heartbeat task; a rebalance (REBALANCE_IN_PROGRESS, or a new member) makes the
member commit (with auto-commit), rejoin, and drop buffered data for partitions it no longer owns. The
group leader computes the assignment with the first strategy every member supports ("range" or
"roundrobin", Kafka's ConsumerProtocol, so Java/librdkafka/Python members can share the group).
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import logging
import time

from kio.schema.heartbeat.v1.request import HeartbeatRequest
from kio.schema.heartbeat.v1.response import HeartbeatResponse
from kio.schema.join_group.v5.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.join_group.v5.response import JoinGroupResponse
from kio.schema.leave_group.v1.request import LeaveGroupRequest
from kio.schema.leave_group.v1.response import LeaveGroupResponse
from kio.schema.offset_commit.v3.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.offset_commit.v3.response import OffsetCommitResponse
from kio.schema.offset_fetch.v3.request import OffsetFetchRequest, OffsetFetchRequestTopic
from kio.schema.offset_fetch.v3.response import OffsetFetchResponse
from kio.schema.sync_group.v3.request import SyncGroupRequest, SyncGroupRequestAssignment
from kio.schema.sync_group.v3.response import SyncGroupResponse

from copyless.client.assignors import (
    ASSIGNORS,
    Subscription,
    TopicPartition,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from copyless.client.cluster import Cluster
from copyless.client.conn import DEFAULT_REQUEST_TIMEOUT_MS
from copyless.client.errors import ClientError, KafkaConnectionError, KafkaError, KafkaTimeoutError
from copyless.client.protocol.fetch_records import ConsumerRecord, PartitionRecords
from copyless.client.protocol.messages import ApiKey, FetchPartition, decode_fetch_response, encode_fetch_request
from copyless.client.protocol.receive import LeasedFrame

__all__ = ["Consumer", "ConsumerRecord", "TopicPartition", "OffsetOutOfRangeError", "RecordTooLargeError"]

log = logging.getLogger("copyless.client.consumer")

OFFSET_OUT_OF_RANGE = 1
ILLEGAL_GENERATION = 22
UNKNOWN_MEMBER_ID = 25
REBALANCE_IN_PROGRESS = 27
MEMBER_ID_REQUIRED = 79
NOT_COORDINATOR = 16
COORDINATOR_NOT_AVAILABLE = 15
COORDINATOR_LOAD_IN_PROGRESS = 14
_COORDINATOR_ERRORS = {NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS}
EARLIEST = -2
LATEST = -1
# A partition whose first batch exceeds this even after doubling is an error (Kafka: RecordTooLarge).
MAX_PARTITION_FETCH_BYTES_CAP = 256 * 1024 * 1024
# Responses buffered per partition before it stops being fetched (the prefetch depth).
PREFETCH_RESPONSES = 2


class OffsetOutOfRangeError(KafkaError):
    def __init__(self, tp: TopicPartition, offset: int) -> None:
        super().__init__(OFFSET_OUT_OF_RANGE, f"{tp.topic}-{tp.partition} at offset {offset}")
        self.partition = tp
        self.offset = offset


class RecordTooLargeError(ClientError):
    pass


def _ms(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


class _Fetched:
    """Records of one partition from one fetch response, handed out in order."""

    __slots__ = ("tp", "records", "leftover")

    def __init__(self, tp: TopicPartition, records: PartitionRecords) -> None:
        self.tp = tp
        self.records = records
        self.leftover: list | None = None  # decoded records of a batch cut by max_records


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
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_bytes = fetch_max_bytes
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.strategies = strategies
        self.check_crcs = check_crcs
        self.isolation_level = 1 if isolation_level == "read_committed" else 0
        self.retry_backoff_ms = retry_backoff_ms
        self._cluster = Cluster(
            bootstrap_servers,
            client_id=client_id,
            request_timeout_ms=max(request_timeout_ms, fetch_max_wait_ms + 5000),
            retry_backoff_ms=retry_backoff_ms,
        )
        self._initial_topics = topics
        self._subscription: set[str] | None = None
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int | None] = {}
        self._pending_reset: dict[TopicPartition, int] = {}  # tp -> EARLIEST/LATEST/timestamp to look up
        self._fetch_sizes: dict[TopicPartition, int] = {}
        self._paused: set[TopicPartition] = set()
        self._buffered: collections.deque[_Fetched] = collections.deque()
        # Responses buffered per partition, and where the next (prefetch) fetch of it starts: a partition is
        # fetched again as soon as a response arrives, up to PREFETCH_RESPONSES deep, so the broker's send
        # overlaps the consumer's decoding.
        self._buffered_count: dict[TopicPartition, int] = {}
        self._prefetch_position: dict[TopicPartition, int | None] = {}
        self._unresolvable: set[TopicPartition] = set()
        self._resolving = False
        self._high_watermarks: dict[TopicPartition, int] = {}
        self._connecting_leaders: set[int] = set()
        self._retry_scheduled = False
        self._fetching_nodes: set[int] = set()
        self._fetching_tps: set[TopicPartition] = set()
        self._fetch_generation = 0  # bumped by seek/assign: responses from older fetches are dropped
        self._tp_generation: dict[TopicPartition, int] = {}
        self._data_waiters: list[asyncio.Future] = []
        self._errors: collections.deque[BaseException] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        self._started = False
        self._closed = False
        self._last_commit = 0.0
        self._committed_positions: dict[TopicPartition, int] = {}
        # group state
        self._coordinator = None
        self._member_id = ""
        self._generation = -1
        self._rejoin_needed = False
        self._joining: asyncio.Task | None = None
        self._heartbeat_task: asyncio.Task | None = None
        self._assignment_ready: asyncio.Event | None = None

    # --- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._assignment_ready = asyncio.Event()
        await self._cluster.start()
        self._started = True
        if self._initial_topics:
            self.subscribe(list(self._initial_topics))

    async def __aenter__(self) -> "Consumer":
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self) -> None:
        """Commit (with auto-commit), leave the group, release buffers and close connections."""
        if self._closed:
            return
        try:
            if self.group_id is not None and self._generation >= 0:
                if self.enable_auto_commit:
                    try:
                        await self.commit()
                    except Exception as exc:
                        log.warning("final commit failed: %s", exc)
                await self._leave_group()
        finally:
            self._closed = True
            for task in list(self._tasks) + [t for t in (self._joining, self._heartbeat_task) if t]:
                task.cancel()
            for fetched in self._buffered:
                fetched.records._finish()
            self._buffered.clear()
            self._wake_waiters()
            await self._cluster.close()

    def _spawn(self, coroutine) -> asyncio.Task:
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- assignment and positions ------------------------------------------------------------------------

    def assign(self, partitions) -> None:
        """Consume exactly these partitions (no group management). Positions start unknown: the consumer
        resets them per ``auto_offset_reset`` unless ``seek`` is called."""
        if self._subscription is not None:
            raise ClientError("assign() after subscribe(): use one or the other")
        self._set_assignment([TopicPartition(*tp) for tp in partitions])

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    def subscribe(self, topics) -> None:
        """Join ``group_id`` for ``topics``; partitions are assigned by the group (asynchronously)."""
        if self.group_id is None:
            raise ClientError("subscribe() needs a group_id")
        if not self._started:
            self._initial_topics = tuple(topics)
            return
        self._subscription = set(topics)
        self._rejoin_needed = True
        self._ensure_joining()

    def _set_assignment(self, partitions: list[TopicPartition]) -> None:
        old = set(self._assignment)
        self._assignment = list(partitions)
        new = set(partitions)
        for tp in old - new:
            self._positions.pop(tp, None)
            self._pending_reset.pop(tp, None)
            self._drop_buffered(tp)
        for tp in new - old:
            self._positions.setdefault(tp, None)
        self._assignment_ready.set()
        self._maybe_fetch()

    def seek(self, partition, offset: int) -> None:
        """Fetch ``partition`` from ``offset`` next (buffered records of it are dropped)."""
        tp = TopicPartition(*partition)
        if tp not in self._positions:
            raise ClientError(f"{tp} is not assigned")
        if offset < 0:
            raise ValueError("offset must be >= 0")
        self._positions[tp] = offset
        self._pending_reset.pop(tp, None)
        self._drop_buffered(tp)
        self._maybe_fetch()

    def seek_to_beginning(self, *partitions) -> None:
        self._seek_to(EARLIEST, partitions)

    def seek_to_end(self, *partitions) -> None:
        self._seek_to(LATEST, partitions)

    def _seek_to(self, timestamp: int, partitions) -> None:
        tps = [TopicPartition(*tp) for tp in partitions] or list(self._assignment)
        for tp in tps:
            if tp not in self._positions:
                raise ClientError(f"{tp} is not assigned")
            self._positions[tp] = None
            self._pending_reset[tp] = timestamp
            self._drop_buffered(tp)
        self._maybe_fetch()

    async def position(self, partition) -> int:
        """The offset of the next record to be handed out for ``partition`` (resolving resets first)."""
        tp = TopicPartition(*partition)
        if tp not in self._positions:
            raise ClientError(f"{tp} is not assigned")
        while self._positions.get(tp) is None:
            await self._resolve_positions([tp])
            if tp in self._unresolvable:
                raise ClientError(f"{tp} has no committed offset and auto_offset_reset is 'none': seek first")
        return self._positions[tp]

    def pause(self, *partitions) -> None:
        self._paused.update(TopicPartition(*tp) for tp in partitions)

    def resume(self, *partitions) -> None:
        self._paused.difference_update(TopicPartition(*tp) for tp in partitions)
        self._maybe_fetch()

    def _drop_buffered(self, tp: TopicPartition) -> None:
        self._tp_generation[tp] = self._tp_generation.get(tp, 0) + 1
        self._unresolvable.discard(tp)
        if self._buffered_count.pop(tp, None):
            kept = collections.deque()
            for fetched in self._buffered:
                if fetched.tp == tp:
                    fetched.records._finish()
                else:
                    kept.append(fetched)
            self._buffered = kept
        self._prefetch_position.pop(tp, None)

    # --- offsets lookups ---------------------------------------------------------------------------------

    async def _list_offsets(self, requests: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """``{tp: timestamp}`` (-2 earliest, -1 latest) -> ``{tp: offset}`` (-1 when no record has a
        timestamp >= the one asked), from each partition's leader (``Cluster.list_offsets``)."""
        found = await self._cluster.list_offsets(requests, isolation_level=self.isolation_level)
        return {TopicPartition(*tp): offset for tp, offset in found.items()}

    async def beginning_offsets(self, partitions) -> dict[TopicPartition, int]:
        return await self._list_offsets({TopicPartition(*tp): EARLIEST for tp in partitions})

    async def end_offsets(self, partitions) -> dict[TopicPartition, int]:
        return await self._list_offsets({TopicPartition(*tp): LATEST for tp in partitions})

    async def offsets_for_times(self, timestamps: dict) -> dict[TopicPartition, int | None]:
        result = await self._list_offsets({TopicPartition(*tp): int(ts) for tp, ts in timestamps.items()})
        return {tp: (offset if offset >= 0 else None) for tp, offset in result.items()}

    async def _resolve_positions(self, tps: list[TopicPartition]) -> None:
        """Give every partition in ``tps`` without a position one: committed offset, else the reset policy."""
        missing = [tp for tp in tps if self._positions.get(tp) is None]
        if not missing:
            return
        if self.group_id is not None:
            committed = await self._fetch_committed([tp for tp in missing if tp not in self._pending_reset])
            for tp, offset in committed.items():
                if offset is not None and offset >= 0 and self._positions.get(tp, 0) is None:
                    self._positions[tp] = offset
        lookups = {}
        for tp in missing:
            if tp in self._positions and self._positions[tp] is None:
                timestamp = self._pending_reset.get(tp)
                if timestamp is None:
                    if self.auto_offset_reset == "none":
                        self._unresolvable.add(tp)
                        self._errors.append(
                            ClientError(f"no committed offset for {tp} and auto_offset_reset is 'none': seek first")
                        )
                        continue
                    timestamp = EARLIEST if self.auto_offset_reset == "earliest" else LATEST
                lookups[tp] = timestamp
        if lookups:
            offsets = await self._list_offsets(lookups)
            for tp, offset in offsets.items():
                if tp in self._positions and self._positions[tp] is None:
                    if offset < 0:  # by-time lookup past the last record: go to the end
                        offset = (await self._list_offsets({tp: LATEST}))[tp]
                    self._positions[tp] = offset
                    self._pending_reset.pop(tp, None)

    # --- fetching ---------------------------------------------------------------------------------------

    def _maybe_fetch(self) -> None:
        """Send a Fetch to every leader that has fetchable partitions and no fetch in flight."""
        if self._closed or not self._started:
            return
        unresolved = []
        by_leader: dict[int, list[FetchPartition]] = {}
        metadata = self._cluster.metadata
        waiting_leaders: set[int] = set()  # leaders with a partition held back by a full prefetch buffer
        for tp in self._assignment:
            if tp in self._paused or tp in self._fetching_tps or tp in self._unresolvable:
                continue
            buffered = self._buffered_count.get(tp, 0)
            if buffered:
                if buffered >= PREFETCH_RESPONSES:
                    waiting_leaders.add(metadata.leader(tp.topic, tp.partition))
                    continue
                position = self._prefetch_position.get(tp)
                if position is None:  # the buffered response ended in a partial first batch
                    continue
            else:
                position = self._positions.get(tp)
                if position is None:
                    unresolved.append(tp)
                    continue
            leader = metadata.leader(tp.topic, tp.partition)
            if leader < 0:
                self._cluster.request_update([tp.topic])
                self._schedule_retry()
                continue
            if leader in self._fetching_nodes:
                continue
            by_leader.setdefault(leader, []).append(
                FetchPartition(
                    tp.topic,
                    tp.partition,
                    position,
                    self._fetch_sizes.get(tp, self.max_partition_fetch_bytes),
                    metadata.leader_epoch(tp.topic, tp.partition),
                )
            )
        if unresolved and not self._resolving:
            self._resolving = True
            self._spawn(self._resolve_then_fetch(unresolved))
        high_watermarks = self._high_watermarks
        for leader, partitions in by_leader.items():
            if leader in waiting_leaders and all(
                p.fetch_offset >= high_watermarks.get((p.topic, p.partition), 1 << 62) for p in partitions
            ):
                # Every partition in this fetch is caught up: the broker would hold it for fetch_max_wait_ms,
                # and with one fetch per broker in flight, the partitions still being consumed could not be
                # refilled meanwhile (seen: 500 ms stalls per refill). Fetch again once they have drained.
                continue
            connection = self._cluster.connection_nowait(leader)
            if connection is None:
                if leader not in self._connecting_leaders:
                    self._connecting_leaders.add(leader)
                    self._spawn(self._connect_then_fetch(leader))
                continue
            self._send_fetch(leader, connection, partitions)

    def _send_fetch(self, leader: int, connection, partitions: list[FetchPartition]) -> None:
        body = encode_fetch_request(
            partitions,
            max_wait_ms=self.fetch_max_wait_ms,
            min_bytes=self.fetch_min_bytes,
            max_bytes=self.fetch_max_bytes,
            isolation_level=self.isolation_level,
        )
        try:
            future = connection.send(ApiKey.FETCH, [body], _decode_fetch, wants_lease=True)
        except KafkaConnectionError:
            self._schedule_retry()
            return
        self._fetching_nodes.add(leader)
        tps = [TopicPartition(p.topic, p.partition) for p in partitions]
        self._fetching_tps.update(tps)
        generations = {tp: self._tp_generation.get(tp, 0) for tp in tps}
        positions = {TopicPartition(p.topic, p.partition): p.fetch_offset for p in partitions}
        future.add_done_callback(lambda f: self._on_fetch(f, leader, tps, generations, positions))

    async def _resolve_then_fetch(self, tps) -> None:
        try:
            await self._resolve_positions(tps)
        except Exception as exc:
            if isinstance(exc, ClientError) and not getattr(exc, "retriable", False):
                self._errors.append(exc)
                self._wake_waiters()
            await asyncio.sleep(self.retry_backoff_ms / 1000)
        finally:
            self._resolving = False
        self._maybe_fetch()

    async def _connect_then_fetch(self, leader: int) -> None:
        try:
            await self._cluster.connection(leader)
        except Exception as exc:
            log.info("cannot connect to broker %s: %s", leader, exc)
            self._cluster.request_update({tp.topic for tp in self._assignment})
            await asyncio.sleep(self.retry_backoff_ms / 1000)
        finally:
            self._connecting_leaders.discard(leader)
        self._maybe_fetch()

    def _schedule_retry(self) -> None:
        """Call ``_maybe_fetch`` again after retry_backoff_ms (at most one pending)."""
        if not self._retry_scheduled:
            self._retry_scheduled = True
            self._spawn(self._retry_fetch_later())

    async def _retry_fetch_later(self) -> None:
        try:
            await asyncio.sleep(self.retry_backoff_ms / 1000)
        finally:
            self._retry_scheduled = False
        self._maybe_fetch()

    def _on_fetch(self, future: asyncio.Future, leader: int, tps, generations, positions) -> None:
        self._fetching_nodes.discard(leader)
        self._fetching_tps.difference_update(tps)
        if self._closed:
            if not future.cancelled() and future.exception() is None:
                frame = future.result()[0]
                if isinstance(frame, LeasedFrame):
                    frame.release()
            return
        if future.cancelled() or future.exception() is not None:
            error = future.exception() if not future.cancelled() else None
            log.debug("fetch from %s failed: %r", leader, error)
            self._cluster.request_update({tp.topic for tp in tps})
            self._schedule_retry()
            return
        frame, buffer, error_code, partitions = future.result()
        pending = []
        refresh = set()
        for partition in partitions:
            tp = TopicPartition(partition.topic, partition.partition)
            if generations.get(tp) != self._tp_generation.get(tp, 0) or tp not in self._positions:
                continue  # seek/assign since the fetch was sent
            code = partition.error_code
            if partition.high_watermark >= 0:
                self._high_watermarks[tp] = partition.high_watermark
            if code != 0:
                if code == OFFSET_OUT_OF_RANGE:
                    if self.auto_offset_reset == "none":
                        self._unresolvable.add(tp)
                        self._errors.append(OffsetOutOfRangeError(tp, positions[tp]))
                    else:
                        self._positions[tp] = None
                        self._pending_reset[tp] = EARLIEST if self.auto_offset_reset == "earliest" else LATEST
                else:
                    error = KafkaError(code, f"fetch {tp.topic}-{tp.partition}")
                    if error.retriable:
                        refresh.add(tp.topic)
                    else:
                        self._errors.append(error)
                continue
            if partition.records_end > partition.records_start:
                records = PartitionRecords(
                    tp.topic,
                    tp.partition,
                    buffer,
                    partition.records_start,
                    partition.records_end,
                    positions[tp],
                    check_crcs=self.check_crcs,
                    high_watermark=partition.high_watermark,
                )
                pending.append(_Fetched(tp, records))
        if isinstance(frame, LeasedFrame) and pending:
            remaining = [len(pending)]

            def release_one(frame=frame, remaining=remaining) -> None:
                remaining[0] -= 1
                if remaining[0] == 0:
                    frame.release()

            for fetched in pending:
                fetched.records.on_done = release_one
        elif isinstance(frame, LeasedFrame):
            del buffer
            frame.release()
        for fetched in pending:
            self._buffered.append(fetched)
            tp = fetched.tp
            self._buffered_count[tp] = self._buffered_count.get(tp, 0) + 1
            # Header-only walk (~0.5 us per batch) to learn where this response's complete batches end.
            self._prefetch_position[tp] = fetched.records.scan_next_offset()
        if refresh:
            self._cluster.request_update(refresh)
            self._schedule_retry()
        if pending or self._errors:
            self._wake_waiters()
        self._maybe_fetch()

    def _wake_waiters(self) -> None:
        waiters, self._data_waiters = self._data_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _take_records(self, max_records: int | None) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Hand out buffered records (decoding batches lazily), at most ``max_records``."""
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        budget = max_records if max_records is not None else 1 << 62
        buffered = self._buffered
        positions = self._positions
        while buffered and budget > 0:
            fetched = buffered[0]
            tp = fetched.tp
            source = fetched.records
            if fetched.leftover is not None:
                records, fetched.leftover = fetched.leftover, None
            else:
                try:
                    records = source.next_batch_records()
                except Exception as exc:  # a corrupt batch: surface it, drop the rest of this response
                    self._pop_buffered(fetched)
                    source._finish()
                    self._errors.append(exc)
                    break
                if records is None:
                    self._pop_buffered(fetched)
                    if source.truncated_first_batch:
                        size = self._fetch_sizes.get(tp, self.max_partition_fetch_bytes) * 2
                        if size > MAX_PARTITION_FETCH_BYTES_CAP:
                            self._errors.append(
                                RecordTooLargeError(f"{tp}: the batch at offset {positions.get(tp)} is too large")
                            )
                        self._fetch_sizes[tp] = size
                    elif source.next_fetch_offset > (positions.get(tp) or 0):
                        positions[tp] = source.next_fetch_offset
                    # Refill now (position and fetch size settled), not after the rest of this call: the
                    # next response is then on the wire while the responses still buffered are decoded
                    # (refilling only at the end, the consumer sat idle ~25% of the time waiting for it).
                    self._maybe_fetch()
                    continue
                if not records:  # control batch or wholly before the position
                    if source.next_fetch_offset > (positions.get(tp) or 0):
                        positions[tp] = source.next_fetch_offset
                    continue
            if len(records) > budget:
                fetched.leftover = records[budget:]
                records = records[:budget]
                positions[tp] = records[-1].offset + 1
            else:
                positions[tp] = max(records[-1].offset + 1, source.next_fetch_offset)
            taken = out.get(tp)
            if taken is None:
                out[tp] = records
            else:
                taken.extend(records)
            budget -= len(records)
        self._maybe_fetch()
        return out

    def _pop_buffered(self, fetched: _Fetched) -> None:
        if self._buffered and self._buffered[0] is fetched:
            self._buffered.popleft()
        else:
            self._buffered.remove(fetched)
        tp = fetched.tp
        count = self._buffered_count.get(tp, 0) - 1
        if count <= 0:
            self._buffered_count.pop(tp, None)
            self._prefetch_position.pop(tp, None)
        else:
            self._buffered_count[tp] = count

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        """Records ready now, waiting up to ``timeout_ms`` for some: ``{TopicPartition: [ConsumerRecord]}``.

        Raises the first fetch error (``OffsetOutOfRangeError`` with reset "none", a corrupt batch, ...).
        """
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            if self._errors:
                raise self._errors.popleft()
            if self._rejoin_needed and self.group_id is not None:
                self._ensure_joining()
            records = self._take_records(max_records)
            if records:
                self._maybe_auto_commit()
                return records
            if self._errors:
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._maybe_auto_commit()
                return {}
            self._maybe_fetch()
            waiter = self._loop.create_future()
            self._data_waiters.append(waiter)
            # asyncio.timeout, not wait_for: on 3.11, wait_for returns the waiter's result when a fetch
            # wakes it in the same step as a cancellation, and the cancellation (Ctrl-C, close) is lost.
            try:
                async with asyncio.timeout(remaining):
                    await waiter
            except TimeoutError:
                pass

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

    # --- groups -------------------------------------------------------------------------------------------

    def _ensure_joining(self) -> None:
        if self._joining is None or self._joining.done():
            self._joining = self._loop.create_task(self._join_loop())

    async def wait_for_assignment(self, timeout_ms: int = 60_000) -> set[TopicPartition]:
        """Wait until the group has given this member an assignment (possibly empty)."""
        async with asyncio.timeout(timeout_ms / 1000):
            await self._assignment_ready.wait()
        return self.assignment()

    async def _join_loop(self) -> None:
        backoff = self.retry_backoff_ms / 1000
        while self._rejoin_needed and not self._closed:
            try:
                await self._join_once()
                backoff = self.retry_backoff_ms / 1000
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("joining group %s failed: %s; retrying", self.group_id, exc)
                if isinstance(exc, KafkaError) and exc.code in _COORDINATOR_ERRORS | {UNKNOWN_MEMBER_ID}:
                    self._coordinator = None
                if isinstance(exc, (KafkaConnectionError, KafkaTimeoutError)):
                    self._coordinator = None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _coordinator_connection(self):
        if self._coordinator is None or self._coordinator.closed:
            self._coordinator = await self._cluster.coordinator(self.group_id)
        return self._coordinator

    async def _join_once(self) -> None:
        if self.enable_auto_commit and self._generation >= 0:
            try:
                await self.commit()
            except Exception as exc:
                log.info("commit before rejoin failed: %s", exc)
        self._assignment_ready.clear()
        topics = sorted(self._subscription or ())
        for topic in topics:
            try:
                await self._cluster.wait_for_topic(topic, timeout_ms=5000, allow_auto_create=True)
            except KafkaError:
                pass  # an unknown topic simply gets no partitions
        coordinator = await self._coordinator_connection()
        metadata = encode_subscription(topics)
        protocols = tuple(JoinGroupRequestProtocol(name=name, metadata=metadata) for name in self.strategies)
        while True:
            response = await coordinator.request_kio(
                JoinGroupRequest(
                    group_id=self.group_id,
                    session_timeout=_ms(self.session_timeout_ms),
                    rebalance_timeout=_ms(self.rebalance_timeout_ms),
                    member_id=self._member_id,
                    group_instance_id=None,
                    protocol_type="consumer",
                    protocols=protocols,
                ),
                JoinGroupResponse,
            )
            code = int(response.error_code)
            if code == MEMBER_ID_REQUIRED:
                self._member_id = response.member_id
                continue
            if code in (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION):
                self._member_id = ""
                self._generation = -1
            if code != 0:
                raise KafkaError(code, f"JoinGroup {self.group_id}")
            break
        self._member_id = response.member_id
        generation = int(response.generation_id)
        assignments = ()
        if response.leader == response.member_id:
            assignments = await self._leader_assign(response)
        sync = await coordinator.request_kio(
            SyncGroupRequest(
                group_id=self.group_id,
                generation_id=generation,
                member_id=self._member_id,
                group_instance_id=None,
                assignments=assignments,
            ),
            SyncGroupResponse,
        )
        code = int(sync.error_code)
        if code != 0:
            if code in (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION):
                self._member_id = ""
            raise KafkaError(code, f"SyncGroup {self.group_id}")
        self._generation = generation
        self._rejoin_needed = False
        assigned = decode_assignment(sync.assignment)
        for topic in {tp.topic for tp in assigned}:
            if self._cluster.metadata.partition_count(topic) is None:
                await self._cluster.wait_for_topic(topic, allow_auto_create=False)
        self._set_assignment(assigned)
        log.info("joined group %s generation %s as %s: %s", self.group_id, generation, self._member_id, assigned)
        if self._heartbeat_task is None or self._heartbeat_task.done():
            self._heartbeat_task = self._loop.create_task(self._heartbeat_loop())

    async def _leader_assign(self, response: JoinGroupResponse) -> tuple:
        subscriptions: dict[str, Subscription] = {}
        for member in response.members:
            try:
                subscriptions[member.member_id] = decode_subscription(member.metadata)
            except Exception as exc:
                log.warning("member %s sent unreadable subscription: %s", member.member_id, exc)
                subscriptions[member.member_id] = Subscription(())
        counts: dict[str, int] = {}
        for topic in sorted({t for s in subscriptions.values() for t in s.topics}):
            count = self._cluster.metadata.partition_count(topic)
            if count is None:
                try:
                    count = await self._cluster.wait_for_topic(topic, timeout_ms=5000, allow_auto_create=False)
                except KafkaError:
                    count = 0
            counts[topic] = count
        assignor = ASSIGNORS[response.protocol_name]
        plan = assignor(subscriptions, counts)
        return tuple(
            SyncGroupRequestAssignment(member_id=member, assignment=encode_assignment(partitions))
            for member, partitions in plan.items()
        )

    async def _heartbeat_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.heartbeat_interval_ms / 1000)
            if self._rejoin_needed or self._generation < 0:
                continue
            try:
                coordinator = await self._coordinator_connection()
                response = await coordinator.request_kio(
                    HeartbeatRequest(group_id=self.group_id, generation_id=self._generation, member_id=self._member_id),
                    HeartbeatResponse,
                )
                code = int(response.error_code)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("heartbeat failed: %s", exc)
                self._coordinator = None
                continue
            if code == 0:
                continue
            if code == REBALANCE_IN_PROGRESS:
                self._rejoin_needed = True
            elif code in (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION):
                self._member_id = "" if code == UNKNOWN_MEMBER_ID else self._member_id
                self._generation = -1
                self._rejoin_needed = True
            elif code in _COORDINATOR_ERRORS:
                self._coordinator = None
                continue
            else:
                log.warning("heartbeat error %s", KafkaError(code))
                continue
            self._ensure_joining()

    async def _leave_group(self) -> None:
        try:
            coordinator = await self._coordinator_connection()
            async with asyncio.timeout(5):
                await coordinator.request_kio(
                    LeaveGroupRequest(group_id=self.group_id, member_id=self._member_id), LeaveGroupResponse
                )
        except Exception as exc:
            log.info("LeaveGroup failed: %s", exc)
        self._generation = -1

    # --- commits ----------------------------------------------------------------------------------------

    def _maybe_auto_commit(self) -> None:
        if not self.enable_auto_commit or self._generation < 0:
            return
        now = time.monotonic()
        if now - self._last_commit >= self.auto_commit_interval_ms / 1000:
            self._last_commit = now
            self._spawn(self._auto_commit())

    async def _auto_commit(self) -> None:
        try:
            await self.commit()
        except Exception as exc:
            log.info("auto-commit failed: %s", exc)

    async def commit(self, offsets: dict | None = None) -> None:
        """Commit ``{TopicPartition: offset}`` (default: every position) for the group.

        Raises:
            KafkaError: e.g. REBALANCE_IN_PROGRESS / ILLEGAL_GENERATION (the member then rejoins).
        """
        if self.group_id is None:
            raise ClientError("commit() needs a group_id")
        if offsets is None:
            offsets = {tp: position for tp, position in self._positions.items() if position is not None}
            offsets = {tp: o for tp, o in offsets.items() if self._committed_positions.get(tp) != o}
        else:
            offsets = {TopicPartition(*tp): int(o) for tp, o in offsets.items()}
        if not offsets:
            return
        topics: dict[str, list] = {}
        for tp, offset in offsets.items():
            topics.setdefault(tp.topic, []).append(
                OffsetCommitRequestPartition(partition_index=tp.partition, committed_offset=offset, committed_metadata="")
            )
        request = OffsetCommitRequest(
            group_id=self.group_id,
            generation_id_or_member_epoch=self._generation if self._subscription is not None else -1,
            member_id=self._member_id if self._subscription is not None else "",
            retention_time=_ms(-1),
            topics=tuple(OffsetCommitRequestTopic(name=t, partitions=tuple(p)) for t, p in topics.items()),
        )

        def check(response) -> None:
            for topic in response.topics:
                for partition in topic.partitions:
                    code = int(partition.error_code)
                    if code != 0:
                        if code in (REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID):
                            self._rejoin_needed = True
                        raise KafkaError(code, f"OffsetCommit {topic.name}-{partition.partition_index}")

        await self._coordinator_request(request, OffsetCommitResponse, check)
        self._committed_positions.update(offsets)

    async def _coordinator_request(self, request, response_cls, check):
        """Send ``request`` to the group coordinator and ``check(response)``; on a lost connection, a timeout
        or a coordinator error (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS:
        the group's ``__consumer_offsets`` partition moved or is loading) find the coordinator again and
        retry with backoff, for up to the request timeout (the Java consumer's commitSync does the same
        until default.api.timeout.ms). Other errors raise at once."""
        deadline = time.monotonic() + self._cluster.request_timeout_ms / 1000
        backoff = self.retry_backoff_ms / 1000
        while True:
            try:
                coordinator = await self._coordinator_connection()
                response = await coordinator.request_kio(request, response_cls)
                check(response)
                return response
            except (KafkaConnectionError, KafkaTimeoutError) as exc:
                error = exc
            except KafkaError as exc:
                if exc.code not in _COORDINATOR_ERRORS:
                    raise
                error = exc
            self._coordinator = None
            if time.monotonic() + backoff > deadline or self._closed:
                raise error
            log.info("group %s: %s; finding the coordinator again", self.group_id, error)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    async def _fetch_committed(self, tps) -> dict[TopicPartition, int | None]:
        if not tps:
            return {}
        topics: dict[str, list[int]] = {}
        for tp in tps:
            topics.setdefault(tp.topic, []).append(tp.partition)

        def check(response) -> None:
            if int(response.error_code) != 0:
                raise KafkaError(int(response.error_code), "OffsetFetch")

        response = await self._coordinator_request(
            OffsetFetchRequest(
                group_id=self.group_id,
                topics=tuple(OffsetFetchRequestTopic(name=t, partition_indexes=tuple(p)) for t, p in topics.items()),
            ),
            OffsetFetchResponse,
            check,
        )
        out = {}
        for topic in response.topics:
            for partition in topic.partitions:
                offset = int(partition.committed_offset)
                out[TopicPartition(topic.name, int(partition.partition_index))] = offset if offset >= 0 else None
        return out

    async def committed(self, partition) -> int | None:
        """The group's committed offset for ``partition`` (None if nothing was committed)."""
        if self.group_id is None:
            raise ClientError("committed() needs a group_id")
        tp = TopicPartition(*partition)
        return (await self._fetch_committed([tp])).get(tp)


def _decode_fetch(frame, offset: int):
    """Connection decoder for Fetch: keeps the lease, returns (frame, buffer, error_code, partitions)."""
    buffer = frame.view if isinstance(frame, LeasedFrame) else frame
    try:
        error_code, partitions = decode_fetch_response(buffer, offset)
    except Exception:
        if isinstance(frame, LeasedFrame):
            del buffer
            frame.release()
        raise
    return frame, buffer, error_code, partitions
