"""The asyncio shell of the transaction coordinator: which transactional ids this broker coordinates, their
state in ``__transaction_state``, the markers that end a transaction, and the timeouts that abort one.

Transactional ids map to ``__transaction_state`` partitions (``txn.log.partition_for``, Kafka's hash), and
the leader of an id's partition is its coordinator (FindCoordinator with key type 1 names it), exactly as
groups map to ``__consumer_offsets`` (``broker.groups.service``, whose pattern this follows). Which
partitions are led here, their shards, ``shard_for`` and FindCoordinator are ``broker.coordinator_shards``
(``shard_map``), shared with the group coordinator; it also fences a shard (it acts only while this broker's
metadata lease is valid and it leads the partition at the shard's leader epoch):

- becoming leader of a partition loads its *shard*: the partition's log is replayed on a worker thread
  (COORDINATOR_LOAD_IN_PROGRESS meanwhile); transactions found in PrepareCommit/PrepareAbort have their
  markers written again and are completed, Ongoing ones keep their start time and time out as before;
- losing leadership (or the metadata lease) unloads it: its ids answer NOT_COORDINATOR;
- every state change is appended to the id's partition and acknowledged only once replicated (acks=all),
  and only then becomes the in-memory state: the view never holds a state a failover could take back;
- requests for one transactional id are serialised by a per-id lock (Kafka marks a pending state and answers
  CONCURRENT_TRANSACTIONS; a lock gives the same order without the client's retry round trip);
- EndTxn persists PrepareCommit/PrepareAbort (the decision), then writes a marker to every partition of the
  transaction at once and waits until each is replicated, answers, and persists CompleteCommit/
  CompleteAbort in the background (holding the id's lock, so the producer's next request waits for it).
  Kafka answers after the Prepare write and writes the markers after; answering after the markers costs
  one more replication round and makes a committed transaction visible to read_committed consumers by the
  time commitTransaction returns. A marker that cannot be written (a partition without a leader) is retried in
  the background until it is; the transaction stays in Prepare* meanwhile (AddPartitions and EndTxn answer
  CONCURRENT_TRANSACTIONS, which clients retry);
- markers for ``__consumer_offsets`` partitions (AddOffsetsToTxn) also tell the group coordinator to show or
  drop the offsets the transaction committed (``GroupService.complete_txn``);
- a timer aborts transactions past their ``transaction.timeout.ms`` every
  ``transaction.abort.timed.out.transaction.cleanup.interval.ms``, fencing their producer (epoch + 1);
- another forgets transactional ids idle past ``transactional.id.expiration.ms`` (no transaction in
  progress) every ``transaction.remove.expired.transaction.cleanup.interval.ms``, by a tombstone in
  ``__transaction_state``, as Kafka does: the id is forgotten once the tombstone is replicated, and a load
  replays it; a producer of the forgotten id gets INVALID_PRODUCER_ID_MAPPING until it calls InitProducerId.

Markers go to partitions this broker leads (``Partition.write_marker``). On a single node that is every
partition; in a cluster the markers for partitions led elsewhere are sent with WriteTxnMarkers v1 to their
leader over the inter-broker listener (``_send_markers_remote``), which answers once the marker is
replicated there; a leader that moved answers NOT_LEADER_OR_FOLLOWER and the next attempt asks the new one.

Crash story: the decision is durable before any marker is written, and the markers are idempotent for
readers (a second COMMIT marker for a producer with no open transaction changes nothing), so a coordinator
that crashes anywhere between Prepare* and Complete* writes them again when it (or its successor) loads the
shard. A crash before the Prepare* record is replicated loses only an EndTxn the client never saw succeed;
the transaction is still Ongoing and is aborted by its timeout, or ended by the client's retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.types import ProducerId, TopicName
from kio.static.primitive import i16, i32

from copyless.broker.coordinator_shards import CoordinatorShards
from copyless.broker.errors import BrokerError, error_for
from copyless.broker.groups.offsets import OFFSETS_TOPIC, build_batch
from copyless.broker.storage._failpoints import failpoint
from copyless.broker.txn import metadata as m
from copyless.broker.txn.log import TXN_TOPIC, TxnLogView, encode_key, encode_value, partition_for
from copyless.protocol.records import read_header

__all__ = ["TransactionService"]

log = logging.getLogger("copyless.transactions")

# Kafka's transaction.state.log.segment.bytes is 100 MiB; a state record is ~100 bytes.
TXN_SEGMENT_BYTES = 16 * 1024 * 1024
TXN_TOPIC_CONFIGS = {"retention.ms": "-1", "segment.bytes": str(TXN_SEGMENT_BYTES)}
LOAD_READ_BYTES = 1024 * 1024
# How long a state write or a marker waits for the ISR (Kafka: transaction.state.log / request timeouts).
WRITE_TIMEOUT_S = 5.0
# Between attempts at markers that could not be written.
MARKER_RETRY_S = 0.5


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class _Holder:
    lock: asyncio.Lock
    handed_off: bool = False


@dataclass
class _Shard:
    partition: int
    leader_epoch: int
    status: str = "loading"
    transactions: dict[str, m.TxnMetadata] = field(default_factory=dict)
    load_task: asyncio.Task | None = None


class TransactionService:
    """One per broker (``broker.transactions``). Loop thread only, except log replay (worker thread)."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        config = broker.config
        self.num_partitions: int = config.transaction_partitions
        self.max_timeout_ms: int = config.transaction_max_timeout_ms
        self.cleanup_interval_ms: int = config.transaction_abort_timed_out_transaction_cleanup_interval_ms
        self.id_expiration_ms: int = config.transactional_id_expiration_ms
        self.expiry_interval_ms: int = config.transaction_remove_expired_transaction_cleanup_interval_ms
        self.shard_map: CoordinatorShards[_Shard] = CoordinatorShards(
            broker, topic=TXN_TOPIC, num_partitions=self.num_partitions, partition_for=partition_for,
            topic_configs=lambda: TXN_TOPIC_CONFIGS,
            replication_factor=lambda: self.broker.config.transaction_state_log_replication_factor,
            new_shard=_Shard, load=self._load, unload=lambda shard: len(shard.transactions), log=log,
            task_prefix="txn", keys_noun="transactional id(s)", topic_noun="the transaction state topic",
            partition_noun="the transactional id's partition")
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: list[asyncio.Task] = []
        self._completions: dict[str, asyncio.Task] = {}
        self._connections: dict[int, Any] = {}  # node id -> inter-broker connection (WriteTxnMarkers)
        self.stats = {"committed": 0, "aborted": 0, "timed_out": 0, "markers": 0, "expired_ids": 0}

    @property
    def shards(self) -> dict[int, _Shard]:
        """``__transaction_state`` partition -> the shard of its ids, for each one led here (``shard_map``'s)."""
        return self.shard_map.shards

    # --- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.shard_map.start()
        self._tasks.append(asyncio.create_task(self._abort_timed_out(), name="txn-timeouts"))
        self._tasks.append(asyncio.create_task(self._expire_ids(), name="txn-id-expiry"))

    async def stop(self) -> None:
        self.shard_map.stop()
        for task in [*self._tasks, *self._completions.values()]:
            task.cancel()
        for task in [*self._tasks, *list(self._completions.values())]:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()

    # --- which transactional ids are ours -------------------------------------------------------------------

    def partition_of(self, transactional_id: str) -> int:
        return self.shard_map.partition_of(transactional_id)

    def shard_for(self, transactional_id: str) -> tuple[_Shard | None, ErrorCode]:
        """The id's shard when this broker coordinates it and has loaded it, else the error to answer."""
        return self.shard_map.shard_for(transactional_id)

    def find_coordinator(self, transactional_id: str, listener: str) -> tuple[ErrorCode, str | None, int, str, int]:
        """FindCoordinator with key type 1: the leader of the id's ``__transaction_state`` partition."""
        return self.shard_map.find_coordinator(transactional_id, listener)

    async def _load(self, shard: _Shard, partition) -> None:
        started = time.monotonic()
        try:
            view = await asyncio.to_thread(_replay_log, partition.log)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("cannot load %s-%d; its transactional ids stay unavailable", TXN_TOPIC, shard.partition)
            shard.status = "inactive"
            return
        if self.shards.get(shard.partition) is not shard:
            return
        shard.transactions = view.transactions
        shard.status = "active"
        pending = [t for t in view.transactions.values() if t.state in m.PREPARING]
        log.info("%s-%d: loaded %d transactional id(s) (%d to complete) from %d record(s) in %.0f ms", TXN_TOPIC,
                 shard.partition, len(view.transactions), len(pending), view.records_replayed,
                 (time.monotonic() - started) * 1000)
        for metadata in pending:
            self._start_completion(shard, metadata)

    # --- requests -------------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _holding(self, transactional_id: str):
        """The id's lock for one request; ``_complete`` may hand it to the task that stores Complete*, which
        releases it, so the producer's next request for the id runs after that write (never in between)."""
        lock = self._lock(transactional_id)
        await lock.acquire()
        holder = _Holder(lock)
        try:
            yield holder
        finally:
            if not holder.handed_off:
                lock.release()

    def _lock(self, transactional_id: str) -> asyncio.Lock:
        lock = self._locks.get(transactional_id)
        if lock is None:
            lock = self._locks[transactional_id] = asyncio.Lock()
        return lock

    async def init_producer_id(self, transactional_id: str, timeout_ms: int, expected_producer_id: int = -1,
                               expected_epoch: int = -1) -> tuple[ErrorCode, int, int]:
        """(error, producer id, epoch)."""
        if not transactional_id:
            return ErrorCode.invalid_request, -1, -1
        if timeout_ms <= 0 or timeout_ms > self.max_timeout_ms:
            return ErrorCode.invalid_transaction_timeout, -1, -1
        async with self._holding(transactional_id) as holder:
            shard, error = self.shard_for(transactional_id)
            if shard is None:
                return error, -1, -1
            current = shard.transactions.get(transactional_id)
            new_id = -1
            if current is None or current.producer_epoch >= m.MAX_EPOCH:
                new_id = await self.broker.allocate_producer_id()
            decision = m.on_init(current, transactional_id=transactional_id, timeout_ms=timeout_ms,
                                 new_producer_id=new_id, expected_producer_id=expected_producer_id,
                                 expected_epoch=expected_epoch, now_ms=now_ms())
            if decision.metadata is not None:
                stored = await self._stored(shard, decision.metadata)
                if stored != ErrorCode.none:
                    return stored, -1, -1
            if decision.abort_first:
                # on_init aborts first only a known id's Ongoing transaction, and names the PrepareAbort.
                assert current is not None and decision.metadata is not None
                log.info("transactional id %r: a new producer fences epoch %d; aborting its open transaction",
                         transactional_id, current.producer_epoch)
                await self._complete(shard, decision.metadata, holder, wait_s=WRITE_TIMEOUT_S)
                return ErrorCode.concurrent_transactions, -1, -1
            if decision.error != ErrorCode.none:
                return decision.error, -1, -1
            assert decision.metadata is not None  # on_init's every success names the metadata it stored
            return ErrorCode.none, decision.metadata.producer_id, decision.metadata.producer_epoch

    async def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                             partitions: frozenset) -> ErrorCode:
        async with self._lock(transactional_id):
            shard, error = self.shard_for(transactional_id)
            if shard is None:
                return error
            decision = m.on_add_partitions(shard.transactions.get(transactional_id), producer_id=producer_id,
                                           producer_epoch=producer_epoch, partitions=partitions, now_ms=now_ms())
            if decision.error != ErrorCode.none or decision.metadata is None:
                return decision.error
            return await self._stored(shard, decision.metadata)

    async def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool) -> ErrorCode:
        async with self._holding(transactional_id) as holder:
            shard, error = self.shard_for(transactional_id)
            if shard is None:
                return error
            decision = m.on_end(shard.transactions.get(transactional_id), producer_id=producer_id,
                                producer_epoch=producer_epoch, commit=commit, now_ms=now_ms())
            if decision.error != ErrorCode.none or decision.metadata is None:
                return decision.error
            stored = await self._stored(shard, decision.metadata)
            if stored != ErrorCode.none:
                return stored
            failpoint("txn.after_prepare")
            # The decision is stored: the client's end succeeded whatever happens to the markers now.
            await self._complete(shard, decision.metadata, holder, wait_s=WRITE_TIMEOUT_S)
            return ErrorCode.none

    def verify(self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str,
               partition: int) -> ErrorCode:
        """A transactional batch for ``(topic, partition)``: NONE when its transaction is Ongoing and holds
        the partition (or when the id is coordinated elsewhere: its partition leader cannot tell), else the
        error (Kafka 3.9's ``transaction.partition.verification.enable``): a batch outside an open
        transaction would open one that no marker ever closes and hold the LSO back forever."""
        shard = self.shards.get(self.partition_of(transactional_id))
        if shard is None or shard.status != "active":
            return ErrorCode.none
        metadata = shard.transactions.get(transactional_id)
        if metadata is None or metadata.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping
        if metadata.producer_epoch != producer_epoch:
            return ErrorCode.invalid_producer_epoch
        if metadata.state is not m.TxnState.ONGOING or (topic, partition) not in metadata.partitions:
            return ErrorCode.invalid_txn_state
        return ErrorCode.none

    def describe(self, transactional_id: str) -> tuple[ErrorCode, m.TxnMetadata | None]:
        shard, error = self.shard_for(transactional_id)
        if shard is None:
            return error, None
        metadata = shard.transactions.get(transactional_id)
        return (ErrorCode.none if metadata is not None else ErrorCode.transactional_id_not_found), metadata

    def list_transactions(self) -> list[m.TxnMetadata]:
        return [t for shard in self.shards.values() if shard.status == "active" for t in shard.transactions.values()]

    # --- writing state and markers ---------------------------------------------------------------------------

    async def _persist(self, shard: _Shard, metadata: m.TxnMetadata) -> None:
        """Append the state, wait until the ISR has it, then make it the current state. Raises BrokerError."""
        await self._store(shard, metadata.transactional_id, encode_value(metadata))
        shard.transactions[metadata.transactional_id] = metadata

    async def _stored(self, shard: _Shard, metadata: m.TxnMetadata) -> ErrorCode:
        """``_persist``, answered: NONE once the state is stored, else what the client gets instead."""
        try:
            await self._persist(shard, metadata)
        except Exception as exc:
            return _store_error(exc)
        return ErrorCode.none

    async def _store(self, shard: _Shard, transactional_id: str, value: bytes | None) -> None:
        """Append one record of the id (None: its tombstone) and wait until the ISR has it. Raises
        BrokerError, with NOT_COORDINATOR once the shard is no longer this broker's."""
        data = build_batch([(encode_key(transactional_id), value)], now_ms())
        partition = self.broker.replicas.leader(TXN_TOPIC, shard.partition)
        if partition.leader_epoch != shard.leader_epoch:
            raise BrokerError(ErrorCode.not_coordinator, "the transaction state partition moved")
        info = await partition.append_as_leader(data, read_header(data), acks=-1)
        await partition.wait_replicated(info.last_offset + 1, WRITE_TIMEOUT_S, info.leader_epoch)
        if partition.config.flush_mode == "sync":
            from copyless.broker.groups.service import GroupService

            await GroupService._wait_flushed(partition, info.last_offset + 1, WRITE_TIMEOUT_S)
        if self.shards.get(shard.partition) is not shard:
            raise BrokerError(ErrorCode.not_coordinator, "the transaction state partition moved")

    def _start_completion(self, shard: _Shard, metadata: m.TxnMetadata, *, markers_written: bool = False,
                          holder: _Holder | None = None) -> None:
        key = metadata.transactional_id
        task = self._completions.get(key)
        if task is not None and not task.done():
            return
        if holder is not None:
            holder.handed_off = True
        task = asyncio.get_running_loop().create_task(
            self._complete_until_done(shard, metadata, markers_written, holder), name=f"txn-complete-{key}")
        self._completions[key] = task
        task.add_done_callback(functools.partial(self._completion_done, key))

    def _completion_done(self, key: str, task: asyncio.Task) -> None:
        if self._completions.get(key) is task:  # not a later completion of the same id
            del self._completions[key]

    async def _complete(self, shard: _Shard, metadata: m.TxnMetadata, holder: _Holder, *, wait_s: float) -> None:
        """Write the markers of a Prepare* transaction, then store Complete* in a task that takes over the
        id's lock (``holder``); or, when the markers could not all be written, hand the completion to a task
        that retries (the id's requests meanwhile get CONCURRENT_TRANSACTIONS, which clients retry). The
        caller has answered for the decision already; this returns once the markers are written or the
        attempt failed."""
        try:
            async with asyncio.timeout(wait_s):
                done = await self._write_markers(shard, metadata)
            if done:
                self._start_completion(shard, metadata, markers_written=True, holder=holder)
                return
        except Exception as exc:
            log.info("transactional id %r: markers not all written yet (%s); retrying in the background",
                     metadata.transactional_id, getattr(exc, "message", None) or exc.__class__.__name__)
        self._start_completion(shard, metadata)

    async def _complete_until_done(self, shard: _Shard, metadata: m.TxnMetadata, markers_written: bool,
                                   holder: _Holder | None) -> None:
        """Markers (unless written already), then Complete*; retried every ``MARKER_RETRY_S`` while this
        broker still coordinates the id. Runs under the id's lock: handed over by ``holder`` for the first
        attempt, taken for the others."""
        lock = self._lock(metadata.transactional_id)
        held = holder is not None
        try:
            while not self.shard_map.stopping and self.shards.get(shard.partition) is shard:
                if not held:
                    await lock.acquire()
                    held = True
                try:
                    if shard.transactions.get(metadata.transactional_id) != metadata:
                        return  # completed meanwhile
                    if markers_written or await self._write_markers(shard, metadata):
                        markers_written = True
                        failpoint("txn.after_markers")
                        await self._persist(shard, m.on_complete(metadata, now_ms()))
                        self._count(metadata)
                        return
                except Exception as exc:
                    log.debug("transactional id %r: completion failed: %s", metadata.transactional_id, exc)
                finally:
                    held = False
                    lock.release()
                await asyncio.sleep(MARKER_RETRY_S)
        finally:
            if held:
                lock.release()

    def _count(self, metadata: m.TxnMetadata) -> None:
        self.stats["committed" if metadata.state is m.TxnState.PREPARE_COMMIT else "aborted"] += 1

    async def _write_markers(self, shard: _Shard, metadata: m.TxnMetadata) -> bool:
        """Write the transaction's marker to each of its partitions, all at once (local ones appended here,
        the others by one WriteTxnMarkers per leader). True when every one is replicated."""
        commit = metadata.state is m.TxnState.PREPARE_COMMIT
        writes = []
        remote: dict[int, list[tuple[str, int]]] = {}
        for topic, index in sorted(metadata.partitions):
            partition = self.broker.replicas.get(topic, index)
            if partition is None or not partition.is_leader:
                state = self.broker.metadata.image.partition_state(topic, index)
                if state is None:
                    continue  # the topic was deleted: nothing left to mark
                remote.setdefault(state.leader, []).append((topic, index))
                continue
            writes.append(self._write_one(metadata, partition, commit, shard.leader_epoch))
        for leader, partitions in remote.items():
            writes.append(self._send_markers_remote(leader, metadata, commit, shard.leader_epoch, partitions))
        results = await asyncio.gather(*writes)
        return all(results)

    async def _write_one(self, metadata: m.TxnMetadata, partition, commit: bool, coordinator_epoch: int) -> bool:
        try:
            await self.write_local_marker(partition, metadata.producer_id, metadata.producer_epoch, commit,
                                          coordinator_epoch)
            return True
        except Exception as exc:
            code, message = error_for(exc)
            if code == ErrorCode.invalid_producer_epoch:
                return True  # a newer epoch is already there: this transaction's records were fenced by it
            log.info("transactional id %r: marker for %s-%d failed: %s %s", metadata.transactional_id,
                     partition.topic, partition.partition, code.name, message)
            return False

    async def write_local_marker(self, partition, producer_id: int, producer_epoch: int, commit: bool,
                                 coordinator_epoch: int) -> None:
        """One marker on a partition led here (WriteTxnMarkers' and the local coordinator's path); raises."""
        await partition.write_marker(producer_id, producer_epoch, commit, coordinator_epoch, WRITE_TIMEOUT_S)
        self.stats["markers"] += 1
        if partition.topic == OFFSETS_TOPIC and self.broker.groups is not None:
            self.broker.groups.complete_txn(partition.partition, producer_id, commit)

    async def _send_markers_remote(self, leader: int, metadata: m.TxnMetadata, commit: bool,
                                   coordinator_epoch: int, partitions: list[tuple[str, int]]) -> bool:
        """WriteTxnMarkers v1 to ``leader`` for ``partitions``. True when every marker is written (or fenced
        by a newer epoch, which aborted the transaction's records there already)."""
        from kio.schema.write_txn_markers.v1.request import (
            WritableTxnMarker,
            WritableTxnMarkerTopic,
            WriteTxnMarkersRequest,
        )
        from kio.schema.write_txn_markers.v1.response import WriteTxnMarkersResponse

        by_topic: dict[str, list[i32]] = {}
        for topic, index in partitions:
            by_topic.setdefault(topic, []).append(i32(index))
        # kio's checked types: once per transaction end and leader, so the checks cost nothing that matters.
        topics = tuple(WritableTxnMarkerTopic(name=TopicName(topic), partition_indexes=tuple(indexes))
                       for topic, indexes in by_topic.items())
        request = WriteTxnMarkersRequest(markers=(WritableTxnMarker(
            producer_id=ProducerId(metadata.producer_id), producer_epoch=i16(metadata.producer_epoch),
            transaction_result=commit, topics=topics, coordinator_epoch=i32(coordinator_epoch)),))
        try:
            connection = await self._connection_to(leader)
            response = await connection.request_kio(request, WriteTxnMarkersResponse)
        except Exception as exc:
            log.info("WriteTxnMarkers to node %d failed: %s", leader, exc)
            stale = self._connections.pop(leader, None)
            if stale is not None:
                stale.close()
            return False
        ok = True
        for marker in response.markers:
            for topic in marker.topics:
                for result in topic.partitions:
                    code = ErrorCode(result.error_code)
                    if code not in (ErrorCode.none, ErrorCode.invalid_producer_epoch):
                        log.info("transactional id %r: marker for %s-%d on node %d: %s", metadata.transactional_id,
                                 topic.name, result.partition_index, leader, code.name)
                        ok = False
                    else:
                        self.stats["markers"] += 1
        return ok

    async def _connection_to(self, node_id: int):
        """The inter-broker connection to ``node_id`` (one per broker, kept; the replica fetcher's listener)."""
        from copyless.client.conn import Connection

        connection = self._connections.get(node_id)
        if connection is not None and not connection.closed:
            return connection
        broker = self.broker.metadata.image.brokers.get(node_id)
        listener = self.broker.config.inter_broker_listener_name
        if broker is None or listener not in broker.endpoints:
            raise ConnectionError(f"node {node_id} is not registered (no {listener} endpoint)")
        host, port = broker.endpoints[listener]
        connection = await Connection.open(host, port, client_id=f"copyless-txn-{self.broker.node_id}",
                                           request_timeout_ms=int(WRITE_TIMEOUT_S * 1000) + 5_000,
                                           security=self.broker.security.inter_broker_client())
        self._connections[node_id] = connection
        return connection

    # --- timeouts -------------------------------------------------------------------------------------------

    async def _abort_timed_out(self) -> None:
        while True:
            await asyncio.sleep(self.cleanup_interval_ms / 1000)
            try:
                await self.abort_timed_out(now_ms())
            except Exception:
                log.exception("aborting timed-out transactions failed")

    async def abort_timed_out(self, now: int) -> int:
        """Abort every Ongoing transaction past its timeout (epoch + 1: its producer is fenced)."""
        count = 0
        for shard in list(self.shards.values()):
            if shard.status != "active":
                continue
            for transactional_id, metadata in list(shard.transactions.items()):
                if m.on_timeout(metadata, now) is None:
                    continue
                async with self._holding(transactional_id) as holder:
                    current = shard.transactions.get(transactional_id)
                    if current is None:
                        continue
                    fenced = m.on_timeout(current, now)
                    if fenced is None:
                        continue
                    try:
                        await self._persist(shard, fenced)
                    except Exception as exc:
                        log.warning("transactional id %r: cannot abort after its timeout: %s", transactional_id, exc)
                        continue
                    log.info("transactional id %r: transaction of producer %d open for more than %d ms aborted; "
                             "epoch %d fenced", transactional_id, fenced.producer_id, fenced.timeout_ms,
                             current.producer_epoch)
                    self.stats["timed_out"] += 1
                    count += 1
                    await self._complete(shard, fenced, holder, wait_s=WRITE_TIMEOUT_S)
        return count

    # --- transactional id expiration -------------------------------------------------------------------------

    async def _expire_ids(self) -> None:
        while True:
            await asyncio.sleep(self.expiry_interval_ms / 1000)
            try:
                await self.expire_ids(now_ms())
            except Exception:
                log.exception("removing expired transactional ids failed")

    async def expire_ids(self, now: int) -> int:
        """Forget every id idle past ``transactional.id.expiration.ms`` (``metadata.expired``): its tombstone
        is appended and replicated under the id's lock, then the id is dropped (unless it changed meanwhile)."""
        count = 0
        for shard in list(self.shards.values()):
            if shard.status != "active":
                continue
            for transactional_id, metadata in list(shard.transactions.items()):
                if not m.expired(metadata, now, self.id_expiration_ms):
                    continue
                async with self._holding(transactional_id):
                    current = shard.transactions.get(transactional_id)
                    if current is None or not m.expired(current, now, self.id_expiration_ms):
                        continue
                    try:
                        await self._store(shard, transactional_id, None)
                    except Exception as exc:
                        log.warning("transactional id %r: cannot remove it after its expiration: %s",
                                    transactional_id, exc)
                        continue
                    if shard.transactions.get(transactional_id) is current:
                        del shard.transactions[transactional_id]
                    log.info("transactional id %r (producer %d) idle since %d removed", transactional_id,
                             current.producer_id, current.update_ms)
                    self.stats["expired_ids"] += 1
                    count += 1
        return count


def _store_error(exc: BaseException) -> ErrorCode:
    """What a coordinator answers when its state could not be stored (Kafka's ``TransactionStateManager``)."""
    code = error_for(exc)[0]
    if code in (ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch, ErrorCode.not_coordinator,
                ErrorCode.kafka_storage_error):
        return ErrorCode.not_coordinator
    return ErrorCode.coordinator_not_available


def _replay_log(partition_log) -> TxnLogView:
    """Read one ``__transaction_state`` partition from its start (worker thread)."""
    view = TxnLogView()
    offset = partition_log.log_start_offset
    end = partition_log.log_end_offset
    while offset < end:
        result = partition_log.read(offset, LOAD_READ_BYTES, min_one_message=True)
        if result.slice is None:
            break
        with result.slice as region:
            data = region.read_bytes()
        next_offset = view.replay(data)
        if next_offset <= offset:
            break
        offset = next_offset
    return view
