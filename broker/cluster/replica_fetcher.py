"""Follower replication: one fetch session per leader broker, pulling every partition this broker follows
from that leader (Kafka's ``ReplicaFetcherThread``, as one asyncio task per connection).

Owns, per leader broker: the inter-broker connection (the leader's ``inter.broker.listener.name``
endpoint), the set of partitions fetched from it, and the loop:

1. truncate: a partition that starts following (a new leader or a new epoch) asks the leader, with
   OffsetForLeaderEpoch, where the follower's latest leader epoch ends on the leader, and truncates its log
   to ``min(that offset, where the same epoch ends in its own log)`` (KIP-101, KIP-279). Never to its high
   watermark: a high watermark can lag the records an old leader had acknowledged, and cutting there after
   a quick double failover loses them (the bug KIP-101 fixed);
2. fetch: Fetch v11 with ``replica_id`` = this broker and each partition's log end as its fetch offset
   (which tells the leader how far this follower is: its ISR and high watermark follow from it), and the
   leader epoch this broker knows (so a leader that has moved on fences the fetch);
3. append: the leader's batches go into the log as they are (offsets, leader epochs, timestamps kept;
   CRC-32C checked by storage), producer state is rebuilt from their headers, and the follower's high
   watermark becomes ``min(the leader's, its own log end)``. Under ``--flush-mode sync`` the round's
   appends are fdatasynced before the next fetch reports the new log end, so the leader counts only
   durable records towards its high watermark.

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

Loop thread; truncation runs on a worker thread while that partition is not fetched.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from typing import Any

from kio.schema.errors import ErrorCode

from copyless.broker.cluster.backend import replica_client_id
from copyless.broker.partition import Partition, Role
from copyless.broker.storage.errors import UnexpectedAppendOffsetError

__all__ = ["FetcherManager", "ReplicaFetcher"]

log = logging.getLogger("copyless.replication")

FETCH_API_KEY, OFFSET_FOR_LEADER_EPOCH_API_KEY = 1, 23
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.05, 1.0
# How long a partition answered "fenced" or "not the leader" waits for a newer image before it asks again
# (Kafka's fetcher retries such a partition after replica.fetch.backoff.ms, 1 s). A leader applies a new image
# within milliseconds of a follower, so half a second is long enough to skip the useless retries and short
# enough to stay far inside replica.lag.time.max.ms (30 s; 4 s in the cluster tests).
FENCED_RETRY_S = 0.5


@dataclasses.dataclass
class _Follow:
    partition: Partition
    leader_epoch: int
    needs_truncation: bool = True
    retry_at: float = 0.0  # after a fenced answer: the monotonic time to ask again if no image came first


class FetcherManager:
    """The replica fetchers of this broker, one per leader it follows. ``broker`` provides config,
    node_id, metadata (its image names the leaders' endpoints), replicas and stats."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self.closing = False

    def follow(self, partition: Partition, changed: bool | None) -> None:
        """The replica manager's hook: ``partition`` follows ``partition.leader_id`` (``changed``: it must
        truncate first), or stops following (``changed`` is None)."""
        key = partition.key
        for leader_id, fetcher in list(self.fetchers.items()):
            if key in fetcher.partitions and (changed is None or leader_id != partition.leader_id):
                fetcher.remove(key)
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

    def __init__(self, broker: Any, leader_id: int) -> None:
        self.broker = broker
        self.leader_id = leader_id
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
            self.partitions[partition.key] = _Follow(partition, partition.leader_epoch,
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
            active = [f for f in self.partitions.values() if f.retry_at <= now and self._current(f)]
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

        by_topic: dict[str, list[_Follow]] = {}
        asked = []
        for follow in follows:
            latest = follow.partition.log.leader_epochs.latest_epoch()
            if latest < 0:
                follow.needs_truncation = False  # an empty log (no epoch at all): nothing to cut
                continue
            by_topic.setdefault(follow.partition.topic, []).append(follow)
            asked.append((follow, latest))
        if not asked:
            return
        request = OffsetForLeaderEpochRequest(
            replica_id=self.broker.node_id,
            topics=tuple(OffsetForLeaderTopic(topic=topic, partitions=tuple(
                OffsetForLeaderPartition(partition=f.partition.partition, current_leader_epoch=f.leader_epoch,
                                         leader_epoch=f.partition.log.leader_epochs.latest_epoch())
                for f in items)) for topic, items in by_topic.items()))
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
            log_end = partition.log.log_end_offset
            if answer.leader_epoch < 0:
                # The leader knows no epoch at or below ours: our records predate its log; the fetch's
                # OFFSET_OUT_OF_RANGE handling restarts the log at the leader's log start if needed.
                target = log_end
            else:
                _epoch, own_end = partition.log.leader_epochs.end_offset_for(answer.leader_epoch, log_end)
                target = min(answer.end_offset, own_end if own_end >= 0 else log_end, log_end)
            if target < log_end:
                self.stats["truncations"] += 1
                log.info("%s-%d: truncating from %d to %d (leader %d, epoch %d ends at %d there)", partition.topic,
                         partition.partition, log_end, target, self.leader_id, answer.leader_epoch,
                         answer.end_offset)
                await self.broker.replicas.truncate(partition, target)
            if self._current(follow):
                follow.needs_truncation = False

    # --- fetching -------------------------------------------------------------------------------------------------

    async def _fetch(self, connection, follows: list[_Follow]) -> bool:
        """One fetch round. Returns True when a partition got a retriable error."""
        from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic

        from copyless.client.protocol.messages import decode_fetch_response, encode_kio

        config = self.broker.config
        by_topic: dict[str, list[_Follow]] = {}
        for follow in follows:
            by_topic.setdefault(follow.partition.topic, []).append(follow)
        request = FetchRequest(
            replica_id=self.broker.node_id,
            max_wait=datetime.timedelta(milliseconds=config.replica_fetch_wait_max_ms),
            min_bytes=1, max_bytes=config.replica_fetch_response_max_bytes, isolation_level=0,
            session_id=0, session_epoch=-1,
            topics=tuple(FetchTopic(topic=topic, partitions=tuple(
                FetchPartition(partition=f.partition.partition, current_leader_epoch=f.leader_epoch,
                               fetch_offset=f.partition.log.log_end_offset,
                               log_start_offset=f.partition.log.log_start_offset,
                               partition_max_bytes=config.replica_fetch_max_bytes)
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
                        await partition.append_as_follower(records)
                    except UnexpectedAppendOffsetError as exc:
                        # The log moved under the fetch (a truncation): ask where to cut again.
                        log.info("%s-%d: %s; truncating again", partition.topic, partition.partition, exc)
                        follow.needs_truncation = True
                        continue
                    finally:
                        records.release()
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
            # a new leader), as far as its own high watermark; storage fsyncs the checkpoint, so a thread.
            target = min(leader_log_start, partition.high_watermark)
            if target > partition.log.log_start_offset:
                await asyncio.to_thread(partition.log.delete_records_before, target)
        if appended and config.flush_mode == "sync":
            # The next fetch's offset tells the leader how far this replica is, and the leader's high
            # watermark (so acks=all) follows from it: under the sync flush mode that offset must be durable
            # here, so an acknowledged record survives a power loss of every replica (KIP-966's stronger
            # promise), at the cost of one group-committed fdatasync per fetch round.
            await asyncio.gather(*(asyncio.wrap_future(p.log.flush()) for p in appended))
        return retriable

    async def _out_of_range(self, follow: _Follow, leader_log_start: int) -> None:
        partition = follow.partition
        if partition.log.log_end_offset < leader_log_start:
            log.info("%s-%d: log end %d is below the leader's log start %d: restarting the log there",
                     partition.topic, partition.partition, partition.log.log_end_offset, leader_log_start)
            await self.broker.replicas.truncate_fully(partition, leader_log_start)
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
