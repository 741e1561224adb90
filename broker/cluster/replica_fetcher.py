"""Follower replication: one fetch session per leader broker, pulling every partition this broker follows
from that leader (Kafka's ``ReplicaFetcherThread``, as one asyncio task per connection).

Owns, per leader broker: the inter-broker connection (the leader's ``inter.broker.listener.name``
endpoint), the set of partitions fetched from it, and the loop:

1. truncate: a partition that starts following (a new leader or a new epoch) asks the leader, with
   OffsetForLeaderEpoch, where the follower's latest leader epoch ends on the leader, and truncates its log
   to ``min(that offset, where the same epoch ends in its own log)`` (KIP-101, KIP-279). Never to its high
   watermark: a high watermark can lag the records an old leader had acknowledged, and cutting there after
   a quick double failover loses them (the bug KIP-101 fixed). When the leader's answer names an epoch this
   log does not have (it skipped epochs the leader has), the log is cut where its largest epoch below that
   ends and the exchange repeats for the epoch then latest, until the epochs agree (``truncation_step``);
   each round removes at least one epoch, so it ends. The cut runs through the partition
   (``Partition.mutate_as_follower``), at the epoch it was decided under, and a role change waits for it;
2. fetch: Fetch v11 with ``replica_id`` = this broker and each partition's log end as its fetch offset
   (which tells the leader how far this follower is: its ISR and high watermark follow from it), and the
   leader epoch this broker knows (so a leader that has moved on fences the fetch);
3. append: the leader's batches go into the log as they are (offsets, leader epochs, timestamps kept;
   CRC-32C checked by storage), producer state is rebuilt from their headers, and the follower's high
   watermark becomes ``min(the leader's, its own log end)``. The append goes through the partition at the
   epoch the fetch was sent under: if the role or epoch moved during any await, nothing more of that
   answer is appended and its high watermark is ignored. Under ``--flush-mode sync`` the round's appends
   are fdatasynced before the next fetch reports the new log end, so the leader counts only durable
   records towards its high watermark; the wait is bounded (``FLUSH_WAIT_S``): a partition whose flush
   outlasts it is not fetched again (its log end not reported) until the flush ends.

The response's record bytes are received straight into a pooled buffer (``recv_into``) and copied once into
the log: the leader sent them with sendfile, so replication costs the leader no copy through Python.

Errors: a fenced or not-leader answer means one of the two brokers' metadata is behind the other's; the
partition waits for the next image (which calls ``follow`` again), or ``FENCED_RETRY_S`` at most: when it is
the leader that is behind (it has not applied the image naming it leader yet: its replica manager creates
the log and takes leadership a moment after the state is written), no newer image is coming, and a
partition waiting for one would not fetch until some unrelated change, its ISR membership lapsing after
``replica.lag.time.max.ms`` meanwhile. OFFSET_OUT_OF_RANGE below the leader's log start restarts the
log at the leader's log start; above its end, the partition truncates again. A lost connection is retried
with backoff. A partition whose role or leader changed while a fetch was in flight ignores that fetch's
answer.

Loop thread; truncation runs on a worker thread, serialized by the partition.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import logging
import time
from typing import Any, cast

from kio.schema.errors import ErrorCode
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta, i64

from copyless.broker.cluster.backend import replica_client_id
from copyless.broker.host_interfaces import FetcherHost
from copyless.broker.partition import Partition, Role
from copyless.broker.storage.errors import UnexpectedAppendOffsetError

__all__ = ["FetcherManager", "ReplicaFetcher", "truncation_step"]

log = logging.getLogger("copyless.replication")

FETCH_API_KEY, OFFSET_FOR_LEADER_EPOCH_API_KEY = 1, 23
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.05, 1.0
# How long a partition answered "fenced" or "not the leader" waits for a newer image before it asks again
# (Kafka's fetcher retries such a partition after replica.fetch.backoff.ms, 1 s). A leader applies a new image
# within milliseconds of a follower, so half a second is long enough to skip the useless retries and short
# enough to stay far inside replica.lag.time.max.ms (30 s; 4 s in the cluster tests).
FENCED_RETRY_S = 0.5
# How long a fetch round waits for the fdatasync of its appends under --flush-mode sync (as the replica
# manager waits for a disk step): past it, the other partitions go on fetching and the ones whose flush is
# still running wait for it, unreported, so a stalled disk stalls only its own partitions, which leave the
# ISR after replica.lag.time.max.ms as any follower that stops fetching does.
FLUSH_WAIT_S = 5.0

# A fetch's constant fields, in kio's checked types once at import rather than on every round: one byte at
# least (answer as soon as anything is there), read_uncommitted (a follower copies the whole log, open
# transactions too), and no fetch session (session 0, epoch -1: every round names all its partitions).
_MIN_BYTES, _READ_UNCOMMITTED, _NO_SESSION, _NO_SESSION_EPOCH = i32(1), i8(0), i32(0), i32(-1)


def truncation_step(own_epochs: Any, log_end: int, leader_epoch: int, leader_end: int) -> tuple[int, bool]:
    """One round of truncation by leader epoch (KIP-279), pure: the offset this log is cut to, and whether
    it then agrees with the leader (True) or must ask again for the epoch that is then its latest (False).

    ``own_epochs`` is this log's leader epoch cache, ``(leader_epoch, leader_end)`` the leader's answer for
    this log's latest epoch: the largest epoch the leader has at or below it, and where that epoch ends on
    the leader. When this log has that epoch too, both logs agree up to where it ends on both: cut there.
    When it has not (its latest epoch is one the leader never had, and below it this log skips the
    leader's epoch: follower [(0, 0), (2, 10)] against leader [(0, 0), (1, 5), (3, 15)], answered (1, 15)),
    only this log's own epochs below the answer are known to be the leader's: cut where the largest of
    them ends (10), then ask again, for epoch 0 (answered (0, 5): cut to 5). Each round that asks again
    removes at least this log's latest epoch, so the exchange ends."""
    if leader_epoch < 0:
        # The leader knows no epoch at or below ours: our records predate its log; the fetch's
        # OFFSET_OUT_OF_RANGE handling restarts the log at the leader's log start if needed.
        return log_end, True
    own_epoch, own_end = own_epochs.end_offset_for(leader_epoch, log_end)
    if own_epoch < 0 or own_end < 0:
        return log_end, True
    if own_epoch == leader_epoch:
        return min(leader_end, own_end, log_end), True
    target = min(own_end, log_end)
    return target, target >= log_end


def _delete_records_before(partition: Partition, offset: int) -> Any:
    """A follower's move of its log start (blocking: the log in place when the step runs)."""
    return partition.log.delete_records_before(offset)


@dataclasses.dataclass
class _Follow:
    partition: Partition
    leader_epoch: i32
    needs_truncation: bool = True
    retry_at: float = 0.0  # after a fenced answer: the monotonic time to ask again if no image came first
    # Under --flush-mode sync, an fdatasync of this partition's appends that outlasted FLUSH_WAIT_S: the
    # partition is not fetched (its log end is not reported) until it is done.
    flushing: asyncio.Future | None = None
    # The partition's name as the requests carry it, in kio's types: built (and checked) once per follow, not
    # on every fetch round (kio's check costs 0.4 to 2 us a field).
    topic: TopicName = dataclasses.field(init=False)
    index: i32 = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        topic, index = self.partition.key
        self.topic, self.index = TopicName(topic), i32(index)


class FetcherManager:
    """The replica fetchers of this broker, one per leader it follows. ``broker`` provides config,
    node_id, metadata (its image names the leaders' endpoints), replicas and stats."""

    def __init__(self, broker: FetcherHost) -> None:
        self.broker = broker
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self.closing = False

    def follow(self, partition: Partition, changed: bool | None) -> None:
        """The replica manager's hook: ``partition`` follows ``partition.leader_id`` (``changed``: it must
        truncate first), or stops following (``changed`` is None)."""
        key = partition.key
        for leader_id, running in list(self.fetchers.items()):
            if key in running.partitions and (changed is None or leader_id != partition.leader_id):
                running.remove(key)
        if changed is None or self.closing or partition.leader_id < 0:
            return
        fetcher = self.fetchers.get(partition.leader_id)
        if fetcher is None:
            fetcher = self.fetchers[partition.leader_id] = ReplicaFetcher(self.broker, partition.leader_id)
        fetcher.add(partition, truncate=changed)

    async def close(self) -> None:
        self.closing = True
        fetchers, self.fetchers = list(self.fetchers.values()), {}
        for fetcher in fetchers:
            await fetcher.close()


class ReplicaFetcher:
    """Fetches from one leader broker for every partition this broker follows there."""

    def __init__(self, broker: FetcherHost, leader_id: int) -> None:
        self.broker = broker
        self.leader_id = leader_id
        self._replica_id = BrokerId(broker.node_id)
        self.partitions: dict[tuple[str, int], _Follow] = {}
        self._connection: Any = None
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._closing = False
        self.stats = {"fetches": 0, "bytes": 0, "truncations": 0, "errors": 0}

    # --- membership -------------------------------------------------------------------------------------------

    def add(self, partition: Partition, *, truncate: bool) -> None:
        follow = self.partitions.get(partition.key)
        if follow is None or truncate or follow.leader_epoch != partition.leader_epoch:
            self.partitions[partition.key] = _Follow(partition, i32(partition.leader_epoch),
                                                     needs_truncation=truncate or follow is None)
        else:
            follow.retry_at = 0.0
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"copyless-fetcher-{self.leader_id}")
        self._wake.set()

    def remove(self, key) -> None:
        self.partitions.pop(key, None)

    def _current(self, follow: _Follow) -> bool:
        """Still this fetcher's: a follower of this leader at the epoch it was added with."""
        partition = follow.partition
        return (self.partitions.get(partition.key) is follow and partition.role is Role.FOLLOWER
                and partition.leader_id == self.leader_id and partition.leader_epoch == follow.leader_epoch)

    # --- the loop -----------------------------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = BACKOFF_MIN_S
        while not self._closing and self.partitions:
            now = time.monotonic()
            active = [f for f in self.partitions.values()
                      if f.retry_at <= now and f.flushing is None and self._current(f)]
            if not active:
                self._wake.clear()
                waiting = [f.retry_at - now for f in self.partitions.values() if f.retry_at > now]
                try:
                    async with asyncio.timeout(min([1.0, *waiting])):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                continue
            try:
                connection = await self._connect()
                truncating = [f for f in active if f.needs_truncation]
                if truncating:
                    await self._truncate(connection, truncating)
                    continue
                if await self._fetch(connection, active):
                    # Some partition was answered with a retriable error (the leader is behind, say):
                    # do not spin on it.
                    await asyncio.sleep(BACKOFF_MIN_S)
                backoff = BACKOFF_MIN_S
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.stats["errors"] += 1
                if self._connection is not None:
                    self._connection.close()
                    self._connection = None
                log.info("fetching from node %d failed (%s); retrying in %.2f s", self.leader_id, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _connect(self):
        from copyless.client.conn import Connection

        if self._connection is not None and not self._connection.closed:
            return self._connection
        image = self.broker.metadata.image
        leader = image.brokers.get(self.leader_id)
        listener = self.broker.config.inter_broker_listener_name
        if leader is None or listener not in leader.endpoints:
            raise ConnectionError(f"node {self.leader_id} is not registered (no {listener} endpoint)")
        host, port = leader.endpoints[listener]
        # The request timeout bounds a long poll: the wait plus a margin for the transfer.
        timeout_ms = self.broker.config.replica_fetch_wait_max_ms + 30_000
        self._connection = await Connection.open(host, port, client_id=f"copyless-replica-{self.broker.node_id}",
                                                 request_timeout_ms=timeout_ms,
                                                 security=self.broker.security.inter_broker_client())
        return self._connection

    # --- truncation ---------------------------------------------------------------------------------------------

    async def _truncate(self, connection, follows: list[_Follow]) -> None:
        from kio.schema.offset_for_leader_epoch.v3.request import (
            OffsetForLeaderEpochRequest,
            OffsetForLeaderPartition,
            OffsetForLeaderTopic,
        )
        from kio.schema.offset_for_leader_epoch.v3.response import OffsetForLeaderEpochResponse

        by_topic: dict[TopicName, list[tuple[_Follow, int]]] = {}
        asked = []
        for follow in follows:
            latest = follow.partition.log.leader_epochs.latest_epoch()
            if latest < 0:
                follow.needs_truncation = False  # an empty log (no epoch at all): nothing to cut
                continue
            by_topic.setdefault(follow.topic, []).append((follow, latest))
            asked.append((follow, latest))
        if not asked:
            return
        request = OffsetForLeaderEpochRequest(
            replica_id=self._replica_id,
            topics=tuple(OffsetForLeaderTopic(topic=topic, partitions=tuple(
                OffsetForLeaderPartition(partition=f.index, current_leader_epoch=f.leader_epoch,
                                         leader_epoch=i32(latest))
                for f, latest in items)) for topic, items in by_topic.items()))
        response = await connection.request_kio(request, OffsetForLeaderEpochResponse)
        answers = {(t.topic, p.partition): p for t in response.topics for p in t.partitions}
        for follow, latest in asked:
            answer = answers.get(follow.partition.key)
            if not self._current(follow) or answer is None:
                continue
            code = ErrorCode(answer.error_code)
            if code != ErrorCode.none:
                self._on_error(follow, code, "OffsetForLeaderEpoch")
                continue
            partition = follow.partition
            if latest != partition.log.leader_epochs.latest_epoch():
                continue  # the log changed while the question was out: ask again
            log_end = partition.log.log_end_offset
            target, done = truncation_step(partition.log.leader_epochs, log_end, answer.leader_epoch,
                                           answer.end_offset)
            if target < log_end:
                self.stats["truncations"] += 1
                log.info("%s-%d: truncating from %d to %d (leader %d, epoch %d ends at %d there%s)", partition.topic,
                         partition.partition, log_end, target, self.leader_id, answer.leader_epoch,
                         answer.end_offset, "" if done else "; this log lacks that epoch: asking again after")
                if not await self.broker.replicas.truncate(partition, target, follow.leader_epoch):
                    continue  # no longer a follower at this epoch: the new role's own truncation follows
            if self._current(follow):
                follow.needs_truncation = not done

    # --- fetching -------------------------------------------------------------------------------------------------

    async def _fetch(self, connection, follows: list[_Follow]) -> bool:
        """One fetch round. Returns True when a partition got a retriable error."""
        from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic

        from copyless.protocol.messages import decode_fetch_response, encode_kio

        config = self.broker.config
        by_topic: dict[TopicName, list[_Follow]] = {}
        for each in follows:
            by_topic.setdefault(each.topic, []).append(each)
        # The values that change from round to round (the logs' offsets, and the settings, which may be
        # altered while the broker runs) go in unchecked: typing.cast is free, and kio's check would cost 0.4 to
        # 2 us a field, per partition, on every round of replication. Unchecked loses nothing:
        # offsets are a log's (int64 by construction) and an out-of-range setting fails the encoding anyway.
        partition_max_bytes = cast(i32, config.replica_fetch_max_bytes)
        request = FetchRequest(
            replica_id=self._replica_id,
            max_wait=cast(i32Timedelta, datetime.timedelta(milliseconds=config.replica_fetch_wait_max_ms)),
            min_bytes=_MIN_BYTES, max_bytes=cast(i32, config.replica_fetch_response_max_bytes),
            isolation_level=_READ_UNCOMMITTED, session_id=_NO_SESSION, session_epoch=_NO_SESSION_EPOCH,
            topics=tuple(FetchTopic(topic=topic, partitions=tuple(
                FetchPartition(partition=f.index, current_leader_epoch=f.leader_epoch,
                               fetch_offset=cast(i64, f.partition.log.log_end_offset),
                               log_start_offset=cast(i64, f.partition.log.log_start_offset),
                               partition_max_bytes=partition_max_bytes)
                for f in items)) for topic, items in by_topic.items()),
            forgotten_topics_data=(), rack_id="")

        def decode(frame, offset):
            view = frame.view if hasattr(frame, "view") else memoryview(frame)
            return frame, view, decode_fetch_response(view, offset)

        # The fetch names this broker's current epoch: the leader admits it to an ISR under that one only.
        connection.client_id = replica_client_id(self.broker.node_id, self.broker.metadata.broker_epoch)
        future = connection.send(FETCH_API_KEY, [encode_kio(request)], decode, wants_lease=True, version=11)
        frame, view, (error_code, partitions) = await future
        retriable = False
        appended: list[Partition] = []
        log_starts: list[tuple[Partition, int]] = []  # the leader's log start moved (DeleteRecords, retention)
        try:
            self.stats["fetches"] += 1
            if error_code:
                raise ConnectionError(f"fetch answered {ErrorCode(error_code).name}")
            follows_by_key = {f.partition.key: f for f in follows}
            for answer in partitions:
                follow = follows_by_key.get((answer.topic, answer.partition))
                if follow is None or not self._current(follow):
                    continue
                code = ErrorCode(answer.error_code)
                if code != ErrorCode.none:
                    if code == ErrorCode.offset_out_of_range:
                        await self._out_of_range(follow, answer.log_start_offset)
                    else:
                        retriable |= not self._on_error(follow, code, "Fetch")
                    continue
                partition = follow.partition
                if answer.records_end > answer.records_start:
                    records = view[answer.records_start:answer.records_end]
                    try:
                        # Through the Partition, at the epoch this fetch was sent under: after an await
                        # (storage, another mutation) it appends nothing if the role or epoch moved.
                        appended_to = await partition.append_as_follower(records, follow.leader_epoch)
                    except UnexpectedAppendOffsetError as exc:
                        # The log moved under the fetch (a truncation): ask where to cut again.
                        log.info("%s-%d: %s; truncating again", partition.topic, partition.partition, exc)
                        follow.needs_truncation = True
                        continue
                    finally:
                        records.release()
                    if appended_to is None or not self._current(follow):
                        continue
                    self.stats["bytes"] += answer.records_end - answer.records_start
                    appended.append(partition)
                partition.update_follower_high_watermark(answer.high_watermark)
                if answer.log_start_offset > partition.log.log_start_offset:
                    log_starts.append((partition, answer.log_start_offset))
        finally:
            view.release()
            if hasattr(frame, "release"):
                frame.release()
        for partition, leader_log_start in log_starts:
            # Kafka's follower moves its log start with the leader's (DeleteRecords must not come back on
            # a new leader), as far as its own high watermark; storage fsyncs the checkpoint, so a thread,
            # as one step of the partition (after its other mutations, at this fetch's epoch only).
            target = min(leader_log_start, partition.high_watermark)
            follow = follows_by_key[partition.key]
            if target > partition.log.log_start_offset and self._current(follow):
                await partition.mutate_as_follower(follow.leader_epoch,
                                                   functools.partial(_delete_records_before, partition, target),
                                                   lambda _start: None)
        if appended and config.flush_mode == "sync":
            # The next fetch's offset tells the leader how far this replica is, and the leader's high
            # watermark (so acks=all) follows from it: under the sync flush mode that offset must be durable
            # here, so an acknowledged record survives a power loss of every replica (KIP-966's stronger
            # promise), at the cost of one group-committed fdatasync per fetch round.
            await self._wait_flushed(appended, follows_by_key)
        return retriable

    async def _wait_flushed(self, appended: list[Partition], follows_by_key: dict) -> None:
        """The fdatasync of this round's appends, waited for FLUSH_WAIT_S at most (see FLUSH_WAIT_S)."""
        flushes = {partition.key: asyncio.wrap_future(partition.log.flush()) for partition in appended}
        _done, pending = await asyncio.wait(flushes.values(), timeout=FLUSH_WAIT_S)
        failed = None
        for key, flush in flushes.items():
            follow = follows_by_key[key]
            if flush in pending:
                log.warning("%s-%d: the fdatasync of replicated records still runs after %.0f s (a stalled disk?); "
                            "the partition is not fetched until it ends", key[0], key[1], FLUSH_WAIT_S)
                follow.flushing = flush
                flush.add_done_callback(functools.partial(self._flushed, follow))
            elif flush.exception() is not None:
                failed = flush.exception()
        if failed is not None:
            raise failed

    def _flushed(self, follow: _Follow, flush: asyncio.Future) -> None:
        """A late fdatasync ended: fetch the partition again, unless it failed (then what was appended is not
        durable and is never reported: the partition stays out of the fetch, so out of the ISR, until its
        state changes)."""
        if flush.cancelled() or flush.exception() is not None:
            log.error("%s-%d: the fdatasync of replicated records failed (%s); the partition stops fetching",
                      *follow.partition.key, flush.exception() if not flush.cancelled() else "cancelled")
            return
        follow.flushing = None
        self._wake.set()

    async def _out_of_range(self, follow: _Follow, leader_log_start: int) -> None:
        partition = follow.partition
        if partition.log.log_end_offset < leader_log_start:
            log.info("%s-%d: log end %d is below the leader's log start %d: restarting the log there",
                     partition.topic, partition.partition, partition.log.log_end_offset, leader_log_start)
            await self.broker.replicas.truncate_fully(partition, leader_log_start, follow.leader_epoch)
        else:
            follow.needs_truncation = True

    def _on_error(self, follow: _Follow, code: ErrorCode, what: str) -> bool:
        """Handle a partition's error answer. True when it waits for metadata, False when it retries."""
        partition = follow.partition
        if code in (ErrorCode.fenced_leader_epoch, ErrorCode.not_leader_or_follower,
                    ErrorCode.unknown_topic_or_partition):
            # One of the two brokers' metadata is behind: wait for an image, or ask again after a while (the
            # module docstring: it may be the leader that has not caught up with ours).
            # Logged once per wait (a new image resets it): a broker whose metadata stays behind would
            # otherwise log every retry of every partition.
            level = logging.INFO if follow.retry_at == 0.0 else logging.DEBUG
            follow.retry_at = time.monotonic() + FENCED_RETRY_S
            log.log(level, "%s-%d: %s from node %d answered %s; waiting for newer metadata (asking again in "
                    "%.1f s)", partition.topic, partition.partition, what, self.leader_id, code.name, FENCED_RETRY_S)
            return True
        log.debug("%s-%d: %s from node %d answered %s; retrying", partition.topic, partition.partition, what,
                  self.leader_id, code.name)
        return False

    async def close(self) -> None:
        self._closing = True
        self.partitions.clear()
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self._connection is not None:
            self._connection.close()
