"""The consumer's fetcher: positions, offset resets, prefetching fetches and lazy record hand-out.

Owns, for the partitions assigned (by ``assign`` or by the group): each partition's position (the offset of
the next record to hand out), resets (ListOffsets by leader, through ``Cluster.list_offsets``), one Fetch
in flight per leader, issued again as soon as the previous response's partitions are handed out, and the
buffered responses. It knows nothing of groups: the committed offsets it starts from come through the
``committed_lookup`` it is given, and the assignment through ``set_assignment``.

Data path: a Fetch response larger than 32 KiB is read by the connection straight into a pooled buffer
(``protocol.receive``); the response is decoded only down to each partition's byte range
(``messages.decode_fetch_response``); ``PartitionRecords`` decodes one batch at a time as ``take_records``
asks for records; when a response's last partition is exhausted its buffer returns to the pool for the
next fetch. A trailing partial batch is ignored (it comes back whole in the next fetch); a response
holding only part of one batch doubles that partition's fetch size (see ``fetch_records``).

Positions: records are handed out in offset order per partition; the position moves past each record
handed out and past batches that hold no consumable record (control batches, compacted gaps).

Leader moves: each Fetch carries the partition's leader epoch as known from metadata (KIP-320); an answer
of NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH or any other retriable error, or a
lost connection, refreshes metadata and fetches again from the leader it names, from the same position.
Loop thread only.
"""

from __future__ import annotations

import asyncio
import collections
import logging

from copyless.client.assignors import TopicPartition
from copyless.client.cluster import EARLIEST, LATEST, Cluster
from copyless.client.errors import ClientError, KafkaConnectionError, KafkaError
from copyless.protocol.fetch_records import ConsumerRecord, PartitionRecords
from copyless.protocol.messages import ApiKey, FetchPartition, decode_fetch_response, encode_fetch_request
from copyless.protocol.receive import LeasedFrame

__all__ = ["Fetcher", "OffsetOutOfRangeError", "RecordTooLargeError", "EARLIEST", "LATEST"]

log = logging.getLogger("copyless.client.consumer")

OFFSET_OUT_OF_RANGE = 1
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


class _Fetched:
    """Records of one partition from one fetch response, handed out in order."""

    __slots__ = ("tp", "records", "leftover")

    def __init__(self, tp: TopicPartition, records: PartitionRecords) -> None:
        self.tp = tp
        self.records = records
        self.leftover: list | None = None  # decoded records of a batch cut by max_records


class Fetcher:
    """Positions and fetching for the assigned partitions (see the module docstring).

    Args:
        cluster: the consumer's ``Cluster``.
        committed_lookup: ``async f([tp]) -> {tp: offset | None}`` (the group's committed offsets), or None.
        auto_offset_reset: "earliest", "latest" or "none".
        The rest: the ``Consumer``'s fetch settings of the same names.
    """

    def __init__(
        self,
        cluster: Cluster,
        *,
        committed_lookup,
        auto_offset_reset: str,
        fetch_max_wait_ms: int,
        fetch_min_bytes: int,
        fetch_max_bytes: int,
        max_partition_fetch_bytes: int,
        check_crcs: bool,
        isolation_level: int,
        retry_backoff_ms: int,
    ) -> None:
        self._cluster = cluster
        self._committed_lookup = committed_lookup
        self.auto_offset_reset = auto_offset_reset
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_bytes = fetch_max_bytes
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.check_crcs = check_crcs
        self.isolation_level = isolation_level
        self.retry_backoff_ms = retry_backoff_ms
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
        self._tp_generation: dict[TopicPartition, int] = {}  # bumped by seek/assign: older responses dropped
        self._data_waiters: list[asyncio.Future] = []
        self.errors: collections.deque[BaseException] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        self.started = False
        self.closed = False

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.started = True

    def close(self) -> None:
        """Stop fetching and release every buffered response."""
        self.closed = True
        for task in list(self._tasks):
            task.cancel()
        for fetched in self._buffered:
            fetched.records._finish()
        self._buffered.clear()
        self.wake_waiters()

    def _spawn(self, coroutine) -> asyncio.Task:
        assert self._loop is not None  # start() ran
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @property
    def assignment(self) -> list[TopicPartition]:
        return self._assignment

    def positions(self) -> dict[TopicPartition, int]:
        """The known positions (partitions still being reset are left out)."""
        return {tp: position for tp, position in self._positions.items() if position is not None}

    async def wait_for_data(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for a fetch response or an error (fetching first if idle)."""
        self.maybe_fetch()
        assert self._loop is not None  # start() ran
        waiter = self._loop.create_future()
        self._data_waiters.append(waiter)
        # asyncio.timeout, not wait_for: on 3.11, wait_for returns the waiter's result when a fetch wakes it
        # in the same step as a cancellation, and the cancellation (Ctrl-C, close) is lost.
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except TimeoutError:
            pass

    def set_assignment(self, partitions: list[TopicPartition]) -> None:
        old = set(self._assignment)
        self._assignment = list(partitions)
        new = set(partitions)
        for tp in old - new:
            self._positions.pop(tp, None)
            self._pending_reset.pop(tp, None)
            self._drop_buffered(tp)
        for tp in new - old:
            self._positions.setdefault(tp, None)
        self.maybe_fetch()

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
        self.maybe_fetch()

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
        self.maybe_fetch()

    async def position(self, partition) -> int:
        """The offset of the next record to be handed out for ``partition`` (resolving resets first)."""
        tp = TopicPartition(*partition)
        if tp not in self._positions:
            raise ClientError(f"{tp} is not assigned")
        while (position := self._positions.get(tp)) is None:
            await self.resolve_positions([tp])
            if tp in self._unresolvable:
                raise ClientError(f"{tp} has no committed offset and auto_offset_reset is 'none': seek first")
        return position

    def pause(self, *partitions) -> None:
        self._paused.update(TopicPartition(*tp) for tp in partitions)

    def resume(self, *partitions) -> None:
        self._paused.difference_update(TopicPartition(*tp) for tp in partitions)
        self.maybe_fetch()

    def _drop_buffered(self, tp: TopicPartition) -> None:
        self._tp_generation[tp] = self._tp_generation.get(tp, 0) + 1
        self._unresolvable.discard(tp)
        if self._buffered_count.pop(tp, None):
            kept: collections.deque[_Fetched] = collections.deque()
            for fetched in self._buffered:
                if fetched.tp == tp:
                    fetched.records._finish()
                else:
                    kept.append(fetched)
            self._buffered = kept
        self._prefetch_position.pop(tp, None)

    # --- offsets lookups ---------------------------------------------------------------------------------

    async def list_offsets(self, requests: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """``{tp: timestamp}`` (-2 earliest, -1 latest) -> ``{tp: offset}`` (-1 when no record has a
        timestamp >= the one asked), from each partition's leader (``Cluster.list_offsets``)."""
        found = await self._cluster.list_offsets(requests, isolation_level=self.isolation_level)
        return {TopicPartition(*tp): offset for tp, offset in found.items()}

    async def beginning_offsets(self, partitions) -> dict[TopicPartition, int]:
        return await self.list_offsets({TopicPartition(*tp): EARLIEST for tp in partitions})

    async def end_offsets(self, partitions) -> dict[TopicPartition, int]:
        return await self.list_offsets({TopicPartition(*tp): LATEST for tp in partitions})

    async def offsets_for_times(self, timestamps: dict) -> dict[TopicPartition, int | None]:
        result = await self.list_offsets({TopicPartition(*tp): int(ts) for tp, ts in timestamps.items()})
        return {tp: (offset if offset >= 0 else None) for tp, offset in result.items()}

    async def resolve_positions(self, tps: list[TopicPartition]) -> None:
        """Give every partition in ``tps`` without a position one: committed offset, else the reset policy."""
        missing = [tp for tp in tps if self._positions.get(tp) is None]
        if not missing:
            return
        if self._committed_lookup is not None:
            committed = await self._committed_lookup([tp for tp in missing if tp not in self._pending_reset])
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
                        self.errors.append(
                            ClientError(f"no committed offset for {tp} and auto_offset_reset is 'none': seek first")
                        )
                        continue
                    timestamp = EARLIEST if self.auto_offset_reset == "earliest" else LATEST
                lookups[tp] = timestamp
        if lookups:
            offsets = await self.list_offsets(lookups)
            for tp, offset in offsets.items():
                if tp in self._positions and self._positions[tp] is None:
                    if offset < 0:  # by-time lookup past the last record: go to the end
                        offset = (await self.list_offsets({tp: LATEST}))[tp]
                    self._positions[tp] = offset
                    self._pending_reset.pop(tp, None)

    # --- fetching ---------------------------------------------------------------------------------------

    def maybe_fetch(self) -> None:
        """Send a Fetch to every leader that has fetchable partitions and no fetch in flight."""
        if self.closed or not self.started:
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
                p.fetch_offset >= high_watermarks.get(TopicPartition(p.topic, p.partition), 1 << 62) for p in partitions
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
            await self.resolve_positions(tps)
        except Exception as exc:
            if isinstance(exc, ClientError) and not getattr(exc, "retriable", False):
                self.errors.append(exc)
                self.wake_waiters()
            await asyncio.sleep(self.retry_backoff_ms / 1000)
        finally:
            self._resolving = False
        self.maybe_fetch()

    async def _connect_then_fetch(self, leader: int) -> None:
        try:
            await self._cluster.connection(leader)
        except Exception as exc:
            log.info("cannot connect to broker %s: %s", leader, exc)
            self._cluster.request_update({tp.topic for tp in self._assignment})
            await asyncio.sleep(self.retry_backoff_ms / 1000)
        finally:
            self._connecting_leaders.discard(leader)
        self.maybe_fetch()

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
        self.maybe_fetch()

    def _on_fetch(self, future: asyncio.Future, leader: int, tps, generations, positions) -> None:
        self._fetching_nodes.discard(leader)
        self._fetching_tps.difference_update(tps)
        if self.closed:
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
                        self.errors.append(OffsetOutOfRangeError(tp, positions[tp]))
                    else:
                        self._positions[tp] = None
                        self._pending_reset[tp] = EARLIEST if self.auto_offset_reset == "earliest" else LATEST
                else:
                    error = KafkaError(code, f"fetch {tp.topic}-{tp.partition}")
                    if error.retriable:
                        refresh.add(tp.topic)
                    else:
                        self.errors.append(error)
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
                    aborted_transactions=partition.aborted_transactions,
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
        if pending or self.errors:
            self.wake_waiters()
        self.maybe_fetch()

    def wake_waiters(self) -> None:
        waiters, self._data_waiters = self._data_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def take_records(self, max_records: int | None) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Hand out buffered records (decoding batches lazily), at most ``max_records``."""
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        budget = max_records if max_records is not None else 1 << 62
        buffered = self._buffered
        positions = self._positions
        while buffered and budget > 0:
            fetched = buffered[0]
            tp = fetched.tp
            source = fetched.records
            records: list[ConsumerRecord] | None
            if fetched.leftover is not None:
                records, fetched.leftover = fetched.leftover, None
            else:
                try:
                    records = source.next_batch_records()
                except Exception as exc:  # a corrupt batch: surface it, drop the rest of this response
                    self._pop_buffered(fetched)
                    source._finish()
                    self.errors.append(exc)
                    break
                if records is None:
                    self._pop_buffered(fetched)
                    if source.truncated_first_batch:
                        size = self._fetch_sizes.get(tp, self.max_partition_fetch_bytes) * 2
                        if size > MAX_PARTITION_FETCH_BYTES_CAP:
                            self.errors.append(
                                RecordTooLargeError(f"{tp}: the batch at offset {positions.get(tp)} is too large")
                            )
                        self._fetch_sizes[tp] = size
                    elif source.next_fetch_offset > (positions.get(tp) or 0):
                        positions[tp] = source.next_fetch_offset
                    # Refill now (position and fetch size settled), not after the rest of this call: the
                    # next response is then on the wire while the responses still buffered are decoded
                    # (refilling only at the end, the consumer sat idle ~25% of the time waiting for it).
                    self.maybe_fetch()
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
        self.maybe_fetch()
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
