"""Partition: one (topic, partition) replica on this broker: its log, its role and everything replication
decides about it.

Owns, per partition: the role (leader, follower, or none while this broker hosts the log but the partition
has no usable state), the leader epoch and leader id, the replica list, the in-sync replica set (ISR), the
high watermark, the leader's view of each follower (log end offset, last caught-up time), the acks=all
requests waiting for the high watermark, and the checks every request handler needs. Handlers never touch
a ``PartitionLog``: they go through a Partition.

It does not own: where the state comes from (the metadata backend: ``topics.json`` on a single node, etcd
in a cluster), writing ISR changes (``ReplicaManager`` sends the change this module proposes and reports the
outcome back), fetching from a leader (``broker.replication.fetcher``), or bytes on disk (storage).

Rules (Kafka's, ``Partition.scala`` and KIPs 101, 279, 320, 497):

- Leader epoch fencing (KIP-320), for Produce, Fetch, ListOffsets and OffsetForLeaderEpoch: a request's
  ``current_leader_epoch`` of -1 skips the check; lower than ours is FENCED_LEADER_EPOCH (74), higher is
  UNKNOWN_LEADER_EPOCH (75): the client knows of an epoch we have not seen yet. A request for a partition
  this broker does not lead is NOT_LEADER_OR_FOLLOWER (6).
- The high watermark is the smallest log end offset over the ISR, counting a follower being added while its
  change is in flight (KIP-497's "maximal ISR"), and never moves back. Consumers read below it,
  ListOffsets(latest) answers it, long polls wake when it moves (not on append), acks=all completes when it
  passes the batch.
- A follower is caught up when its fetch reached the leader's log end offset; its last caught-up time moves
  to this fetch's time then, or to the previous fetch's time if that one reached the log end as it was
  then. The ISR shrinks by the followers not caught up within ``replica.lag.time.max.ms``; it grows by a
  follower whose fetch offset reached both the high watermark and this epoch's start offset.
- acks=all: below ``min.insync.replicas`` in the ISR, NOT_ENOUGH_REPLICAS (19) before appending; once the
  high watermark passes the batch, NOT_ENOUGH_REPLICAS_AFTER_APPEND (20) if the ISR fell below the minimum
  meanwhile, else success; leadership lost while waiting: NOT_LEADER_OR_FOLLOWER.

Safety (why a leader that has been replaced cannot acknowledge a lost write, the argument for the ISR rule):
the controller elects a new leader only from the ISR it has recorded, and the ISR a leader uses for its high
watermark is the recorded one plus followers being added, never minus followers being removed until the
removal is recorded by a conditional write that the controller's own change makes fail. So while a replaced
leader still believes it leads, every member of the recorded ISR, the new leader among them, counts in its
high watermark. The new leader stopped fetching from it when it learned of its election, so the old
leader's high watermark can no longer pass what the new leader holds: whatever the old leader acknowledges
after that is below that point, and therefore in the new leader's log, which a new leader never truncates.
A broker also refuses writes once its metadata lease may have expired (``lease_valid``), which bounds how
long a cut-off leader keeps answering at all. The ISR rule needs the leader to count a member being added
until the store's answer is definite: a write that timed out may have committed, and then the controller
may elect that member, so an unknown outcome keeps the maximal ISR (``end_isr_change`` is only called with a
definite answer; a newer state of the same epoch is one, ``make_leader``). A follower's fetch offset is
checked against the log before it is credited (``update_follower_fetch_state``): a position past the log end
would count records that replica does not have.

Serialization (docs/partition-serialization.md): every change of the partition's role and every mutation
of its log goes through this object, one at a time, and every await re-checks the epoch it started under:

- log mutations that await (an append waiting for storage, a follower's append, a truncation, a follower's
  log start move) hold ``_log_lock``; the synchronous fast paths run only while it is free, so they never
  interleave with one that awaits;
- a follower's truncation and log start move run on a worker thread through ``mutate_as_follower``, only
  if the replica is still a follower at the epoch the step was decided under; while one runs, role changes
  wait (``defer_role_change``; the replica manager applies the latest when it ends), so a replica is never
  made leader while a cut it started as a follower can still remove what it acknowledges as leader;
- after each await an append checks again that the replica is leader (follower) at the epoch the request
  (the fetch) started under: a leader's append that waited for storage is not written under a later
  epoch, and records fetched from an old leader never land after the switch to a new one.

Loop thread only, except the blocking callables given to ``mutate_as_follower`` (a worker thread).
"""

from __future__ import annotations

import asyncio
import enum
import heapq
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from kio.schema.errors import ErrorCode

from copyless.broker.errors import (
    BrokerError,
    FencedLeaderEpoch,
    NotEnoughReplicas,
    NotEnoughReplicasAfterAppend,
    NotLeaderOrFollower,
    RequestTimedOut,
    UnknownLeaderEpoch,
)
from copyless.broker.partition_interfaces import AppendNotifications, PartitionStore, ProducerStates
from copyless.broker.storage.errors import AppendNotReady, OffsetOutOfRangeError
from copyless.broker.txn_partition import TXN_MARKER_FILE, PartitionTxns, build_marker
from copyless.protocol.records import NO_SEQUENCE

__all__ = ["Partition", "Role", "PartitionState", "AppendInfo", "ReplicaView", "NO_EPOCH_CHECK"]

log = logging.getLogger("copyless.partition")

NO_EPOCH_CHECK = -1
NO_LEADER = -1
# How long an append may await its log's worker threads (a segment or a step of blocks being prepared: a
# few ms normally) before the request fails with REQUEST_TIMED_OUT, which producers retry.
STORAGE_WAIT_TIMEOUT_S = 30.0


class Role(enum.Enum):
    LEADER = "leader"
    FOLLOWER = "follower"
    NONE = "none"


@dataclass(frozen=True)
class PartitionState:
    """What the metadata says about one partition: Kafka's ``LeaderAndIsr`` plus the assignment.

    ``version`` is the state's version in the metadata store (etcd's mod_revision of the partition key):
    the token an ISR change must present, so a change made on an outdated state is refused.
    """

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    version: int = 0


class AppendInfo(NamedTuple):
    base_offset: int
    last_offset: int
    log_append_time_ms: int  # -1: CreateTime
    log_start_offset: int
    duplicate: bool
    leader_epoch: int = -1  # the epoch it was appended at (acks=all waits check it is still this broker's)


@dataclass
class ReplicaView:
    """The leader's view of one follower (Kafka's ``Replica`` state)."""

    log_end_offset: int = -1
    last_caught_up_ms: float = 0.0
    last_fetch_leader_log_end_offset: int = -1
    last_fetch_ms: float = 0.0


def _now_ms() -> float:
    return time.monotonic() * 1000.0


class Partition:
    """One partition replica. See the module docstring for the rules; loop thread only."""

    def __init__(self, topic: str, partition: int, log_: PartitionStore, *, node_id: int, producers: ProducerStates,
                 notifier: AppendNotifications,
                 lease_valid: Callable[[], bool] = lambda: True, clock: Callable[[], float] = _now_ms,
                 txns: PartitionTxns | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self.log = log_
        self.node_id = node_id
        self._producers = producers
        self._notifier = notifier
        self._lease_valid = lease_valid
        self._clock = clock
        self.role = Role.NONE
        self.leader_id = NO_LEADER
        self.leader_epoch = -1
        self.replicas: tuple[int, ...] = ()
        self.isr: tuple[int, ...] = ()
        self.state_version = -1
        # Where this broker's leadership of the current epoch began: followers join the ISR only once they
        # reached it (KIP-101), and ListOffsets(latest) waits for the high watermark to reach it.
        self.epoch_start_offset = 0
        # The log's checkpointed high watermark (clamped to the log by storage); a leader moves it on.
        self.high_watermark = log_.high_watermark
        self.min_insync_replicas = 1
        self.replica_lag_time_max_ms = 30_000
        self.configs: Any = None  # the topic configs last applied (the replica manager's bookkeeping)
        self.followers: dict[int, ReplicaView] = {}
        # An ISR change sent to the metadata store and not answered yet (KIP-497's pending state), the state
        # version it was made from, and its number (an answer to an older change must not end a newer one).
        self.pending_isr: tuple[int, ...] | None = None
        self._isr_change_from = -1
        self._isr_change_number = 0
        self._waiters: list[tuple[int, int, asyncio.Future]] = []  # (required offset, sequence, future)
        self._waiter_sequence = 0
        # Serializes the mutations of the log that await: an append waiting for its log's worker threads
        # (later appends queue behind it, in order), a follower's append, a truncation. The synchronous
        # fast paths run only while it is free (module docstring, "Serialization").
        self._log_lock = asyncio.Lock()
        # A follower's log mutation on a worker thread (a truncation, a log start move): while it runs, role
        # changes wait in ``deferred_state`` (the latest one wins) and are applied when it ends.
        self.mutating = False
        self.deferred_state: PartitionState | None = None
        # Called when such a mutation ends with a role change waiting: the replica manager applies it.
        self.on_mutation_end: Callable[[Partition], None] = lambda partition: None
        self.key = (topic, partition)
        # Open and aborted transactions (``broker.txn_partition``); rebuilt from the log at load.
        self.txns = txns if txns is not None else PartitionTxns()
        # Where the producer state goes on disk (broker.partition_state_files); None: kept in memory only.
        self.state_files: Any = None
        self._snapshot_segment = -1  # the active segment's base when the last snapshot was captured
        self._snapshot_offset = -1  # the log end of the last snapshot captured
        # Long-poll keys: consumers wait for the high watermark, followers for the log end.
        self.follower_key = (topic, partition, "log_end")

    def __repr__(self) -> str:
        return (f"Partition({self.topic}-{self.partition}, {self.role.value}, epoch={self.leader_epoch}, "
                f"leader={self.leader_id}, isr={list(self.isr)}, hw={self.high_watermark}, "
                f"leo={self.log.log_end_offset})")

    # --- properties -------------------------------------------------------------------------------------------

    @property
    def config(self):
        """The log's LogConfig (the topic's settings)."""
        return self.log.config

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The committed ISR plus any member a pending change adds (KIP-497): what the high watermark uses."""
        if self.pending_isr is None:
            return self.isr
        return tuple(dict.fromkeys((*self.isr, *self.pending_isr)))

    @property
    def under_replicated(self) -> bool:
        return self.is_leader and len(self.isr) < len(self.replicas)

    # --- checks -----------------------------------------------------------------------------------------------

    def check_epoch(self, current_leader_epoch: int) -> None:
        """KIP-320 fencing. Raises FencedLeaderEpoch / UnknownLeaderEpoch."""
        if current_leader_epoch == NO_EPOCH_CHECK or current_leader_epoch == self.leader_epoch:
            return
        if current_leader_epoch < self.leader_epoch:
            raise FencedLeaderEpoch(
                f"{self.topic}-{self.partition}: request epoch {current_leader_epoch} is older than the "
                f"leader epoch {self.leader_epoch}")
        raise UnknownLeaderEpoch(
            f"{self.topic}-{self.partition}: request epoch {current_leader_epoch} is newer than the leader "
            f"epoch {self.leader_epoch} this broker knows")

    def check_leader(self, current_leader_epoch: int = NO_EPOCH_CHECK) -> None:
        """This broker leads the partition for the request's epoch, and may act on it (its metadata lease is
        valid). Raises NotLeaderOrFollower, FencedLeaderEpoch, UnknownLeaderEpoch."""
        self.check_epoch(current_leader_epoch)
        if self.role is not Role.LEADER:
            raise NotLeaderOrFollower(f"this broker (node {self.node_id}) is not the leader of "
                                      f"{self.topic}-{self.partition} (leader: {self.leader_id})")
        if not self._lease_valid():
            raise NotLeaderOrFollower(f"node {self.node_id} may have lost its metadata lease; it refuses to act "
                                      f"as leader of {self.topic}-{self.partition} until it registers again")

    # --- the leader's append path ------------------------------------------------------------------------------

    async def append_as_leader(self, records, header, *, acks: int,
                               log_append_time_ms: int | None = None) -> AppendInfo:
        """Validate against producer state, append, update producer state, move the high watermark and wake
        whoever waits. The one append path: client produce and the internal writers (committed offsets) both
        come here. Loop thread.

        Usually returns without suspending (a memcpy into the mapped segment). When the log needs what its
        worker threads are still preparing (the next segment at a roll, the next step of blocks), the
        append awaits it, never blocking the loop, and so do the appends to this partition that arrive
        meanwhile, in their order: a producer's pipelined batches keep their sequence.

        Args:
            records: one or more whole v2 batches (already validated by the caller when they come from a
                client). ``header`` is the first batch's header (producer id and sequence checks use it).
            acks: the producer's acks (-1 checks ``min.insync.replicas`` before appending).

        Raises:
            BrokerError subclasses (not leader, not enough replicas, sequence errors, a request timed out
            waiting for the storage), StorageError.
        """
        epoch = self.leader_epoch
        if not self._log_lock.locked():
            try:
                return self._append_nowait(records, header, acks, log_append_time_ms, epoch)
            except AppendNotReady as exc:
                not_ready = exc
        else:
            not_ready = None
        first_offset = None
        # Acquiring a free asyncio.Lock does not suspend: no other append can slip in before this one.
        async with self._log_lock:
            while True:
                if not_ready is not None:
                    if not_ready.appended is not None and first_offset is None:
                        first_offset = not_ready.appended[0]
                    records = await self._wait_storage(not_ready, records)
                try:
                    # After every await: still the leader, of the epoch the request started under.
                    info = self._append_nowait(records, header, acks, log_append_time_ms, epoch)
                except AppendNotReady as exc:
                    not_ready = exc
                    continue
                return info if first_offset is None else info._replace(base_offset=first_offset)

    async def _wait_storage(self, not_ready: AppendNotReady, records):
        """Await what the log said it needs; returns the records still to append."""
        if not_ready.appended is not None:
            # Only internal multi-batch writes span segments; their first batches are in and stay in.
            records = memoryview(records)[not_ready.appended[2]:]
        started = time.monotonic()
        try:
            async with asyncio.timeout(STORAGE_WAIT_TIMEOUT_S):
                await asyncio.wrap_future(not_ready.ready)
        except TimeoutError:
            raise RequestTimedOut(f"{self.topic}-{self.partition}: the log's {not_ready} for "
                                  f"{STORAGE_WAIT_TIMEOUT_S:.0f} s") from None
        not_ready.waited(time.monotonic() - started)
        return records

    def _append_nowait(self, records, header, acks: int, log_append_time_ms: int | None,
                       epoch: int) -> AppendInfo:
        """The append itself (see append_as_leader), at leader epoch ``epoch`` only. Raises AppendNotReady
        with nothing appended."""
        self.check_leader()
        if self.leader_epoch != epoch:
            raise NotLeaderOrFollower(f"{self.topic}-{self.partition}: leadership moved (epoch {epoch} -> "
                                      f"{self.leader_epoch}) while the write waited for the storage")
        if acks == -1 and len(self.isr) < self.min_insync_replicas:
            raise NotEnoughReplicas(
                f"{self.topic}-{self.partition}: the ISR {list(self.isr)} has fewer members than "
                f"min.insync.replicas={self.min_insync_replicas}")
        if header.is_control:
            return self._append_marker_nowait(records, header)
        if header.is_transactional and header.base_sequence == NO_SEQUENCE:
            # A transactional offset commit (the group coordinator's own batch): fenced by epoch only.
            return self._append_unsequenced_nowait(records, header)
        check = self._producers.check(self.topic, self.partition, header)
        if check.error != ErrorCode.none:
            raise BrokerError(check.error, check.message or check.error.name)
        if check.duplicate_of is not None:
            # A retry of a batch already appended: the same answer, nothing appended.
            original = check.duplicate_of
            return AppendInfo(original.first_offset, original.last_offset, -1, self.log.log_start_offset, True,
                              self.leader_epoch)
        if header.is_transactional and not self.txns.persisted:
            raise BrokerError(ErrorCode.unknown_server_error, "ensure_transactional() first")
        result = self.log.append(records, leader_epoch=self.leader_epoch, log_append_time_ms=log_append_time_ms)
        # A LogAppendTime topic's batch carries the broker's stamp as appended (what a replay reads back).
        self._producers.update(self.topic, self.partition, header, result.base_offset,
                               result.log_append_time_ms if result.log_append_time_ms >= 0 else None)
        if header.is_transactional:
            self.txns.on_batch(header, result.base_offset)
        self._snapshot_if_rolled()
        self._notifier.notify(self.follower_key)
        self.maybe_advance_high_watermark()
        return AppendInfo(result.base_offset, result.last_offset, result.log_append_time_ms,
                          result.log_start_offset, False, self.leader_epoch)

    def _append_marker_nowait(self, records, header) -> AppendInfo:
        """A transaction marker (one control batch built by ``txn_partition.build_marker``): fenced by the
        producer's epoch, never deduplicated (markers carry no sequence), then it closes the producer's
        open transaction here."""
        from copyless.broker.txn_partition import read_marker

        check = self._producers.check_marker(self.topic, self.partition, header.producer_id, header.producer_epoch)
        if check.error != ErrorCode.none:
            raise BrokerError(check.error, check.message or check.error.name)
        marker = read_marker(records)
        if marker is None:
            raise BrokerError(ErrorCode.corrupt_message, "unreadable transaction marker")
        newer = self.txns.coordinator_fenced(header.producer_id, marker.coordinator_epoch)
        if newer is not None:
            # A deposed coordinator's late marker: the transaction it ends was decided again by a newer one.
            raise BrokerError(ErrorCode.transaction_coordinator_fenced,
                              f"{self.topic}-{self.partition}: coordinator epoch {marker.coordinator_epoch} of "
                              f"producer {header.producer_id}'s marker is older than {newer}")
        result = self.log.append(records, leader_epoch=self.leader_epoch)
        self._producers.update_marker(self.topic, self.partition, header.producer_id, header.producer_epoch,
                                      header.max_timestamp)
        aborted = self.txns.on_marker(header.producer_id, result.base_offset, marker.control_type,
                                      self.high_watermark, marker.coordinator_epoch)
        if aborted is not None and self.state_files is not None:
            self.state_files.append_aborted(self.log, aborted)
        self._snapshot_if_rolled()
        self._notifier.notify(self.follower_key)
        self.maybe_advance_high_watermark()
        return AppendInfo(result.base_offset, result.last_offset, -1, result.log_start_offset, False,
                          self.leader_epoch)

    def _append_unsequenced_nowait(self, records, header) -> AppendInfo:
        check = self._producers.check_marker(self.topic, self.partition, header.producer_id, header.producer_epoch)
        if check.error != ErrorCode.none:
            raise BrokerError(check.error, check.message or check.error.name)
        if not self.txns.persisted:
            raise BrokerError(ErrorCode.unknown_server_error, "ensure_transactional() first")
        result = self.log.append(records, leader_epoch=self.leader_epoch)
        self._producers.update_marker(self.topic, self.partition, header.producer_id, header.producer_epoch,
                                      header.max_timestamp)
        self.txns.on_batch(header, result.base_offset)
        self._snapshot_if_rolled()
        self._notifier.notify(self.follower_key)
        self.maybe_advance_high_watermark()
        return AppendInfo(result.base_offset, result.last_offset, -1, result.log_start_offset, False,
                          self.leader_epoch)

    async def write_marker(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                           timeout_s: float) -> AppendInfo:
        """Append a COMMIT or ABORT marker for the producer's transaction and wait until the ISR has it
        (the coordinator completes a transaction only once every marker is replicated). Loop thread.

        Raises:
            BrokerError (NOT_LEADER_OR_FOLLOWER, INVALID_PRODUCER_EPOCH, ...), StorageError.
        """
        import time as _time

        marker = build_marker(producer_id, producer_epoch, commit, coordinator_epoch, int(_time.time() * 1000))
        from copyless.protocol.records import read_header

        info = await self.append_as_leader(marker, read_header(marker), acks=-1)
        await self.wait_replicated(info.last_offset + 1, timeout_s, info.leader_epoch)
        return info

    async def ensure_transactional(self) -> None:
        """Before the first transactional batch: create ``TXN_MARKER_FILE`` (fsync'd with its directory, on
        a worker thread) so a restart that finds no usable snapshot replays this partition's whole log."""
        if self.txns.persisted:
            return
        from copyless.broker.storage.checkpoint import fsync_directory

        directory = self.log.directory

        def create() -> None:
            path = directory / TXN_MARKER_FILE
            with open(path, "ab") as handle:
                os.fsync(handle.fileno())
            fsync_directory(directory)

        await asyncio.to_thread(create)
        self.txns.persisted = True

    # --- producer state on disk -------------------------------------------------------------------------------

    def keep_state_in(self, state_files: Any, snapshot_at_end: bool = False) -> None:
        """Persist this partition's producer state with ``state_files`` from now on (the replica manager, once
        the state is loaded; ``snapshot_at_end``: the load left a snapshot at the log end)."""
        self.state_files = state_files
        self._snapshot_segment = self.log.segments[-1].base_offset
        self._snapshot_offset = self.log.log_end_offset if snapshot_at_end else -1

    def _snapshot_if_rolled(self) -> None:
        """After an append: a new active segment means a roll, and a roll a snapshot (Kafka takes one at
        each roll), taken at the log end. Loop thread; the write is queued."""
        if self.state_files is None:
            return
        active = self.log.segments[-1].base_offset
        if active != self._snapshot_segment:
            self._snapshot_segment = active
            self.snapshot_state()
            # The rolled segment's aborted transactions are read from its .txnindex from now on, and the maps
            # of files retention deleted are let go (each holds a descriptor).
            self.txns.drop_before(self.log.log_start_offset)
            self.state_files.seal(self.log, self.txns)

    def snapshot_state(self):
        """Queue a snapshot of the producer state at the log end (at a roll, and at a clean shutdown), unless
        one was taken there. Loop thread: O(producers) to capture, nothing written here."""
        from copyless.broker.partition_state_files import capture_snapshot

        if self.state_files is None or self.log.log_end_offset == self._snapshot_offset:
            return None
        self._snapshot_offset = self.log.log_end_offset
        return self.state_files.snapshot(
            self.log, capture_snapshot(self.log, self._producers, self.topic, self.partition, self.txns))

    def expire_producers(self, now_ms: int, expiration_ms: int) -> int:
        """Forget the producers idle past ``producer.id.expiration.ms`` with no transaction open here
        (``ProducerStateManager.remove_expired``), leader or follower alike, as Kafka's periodic check does;
        return how many. The next snapshot (a roll, a clean shutdown) is written without them, even at the
        log end of the last one. Loop thread: O(producers of the partition)."""
        removed = self._producers.remove_expired(self.topic, self.partition, now_ms, expiration_ms,
                                                 self.txns.ongoing)
        if removed:
            self._snapshot_offset = -1
        return len(removed)

    # --- transactions: the last stable offset ----------------------------------------------------------------

    @property
    def last_stable_offset(self) -> int:
        """min(first unstable offset, high watermark): what read_committed consumers read below. Never below
        the log start: retention and DeleteRecords are bounded by the high watermark only, as in Kafka, so
        they may remove the first records of an open transaction; the first unstable offset is then the log
        start (Kafka's ``maybeIncrementFirstUnstableOffset``), and the LSO stays within the log."""
        txns = self.txns
        if not txns.ongoing and not txns.completing:
            return self.high_watermark
        return max(txns.lso(self.high_watermark), min(self.log.log_start_offset, self.high_watermark))

    def read_committed(self, offset: int, max_bytes: int, *, min_one_message: bool):
        """Records from ``offset`` below the last stable offset (read_committed consumers)."""
        return self._read(offset, max_bytes, min_one_message, self.last_stable_offset)

    def aborted_transactions(self, fetch_offset: int, upper_offset: int, records=None):
        """The aborted transactions a read_committed fetch of [fetch_offset, upper_offset) must carry; with
        ``records`` (the FileSlice it sends), only those its records overlap, as Kafka bounds them
        (``FileSlice.upper_bound_offset``)."""
        txns = self.txns
        if not txns.has_aborted:
            return []
        txns.drop_before(self.log.log_start_offset)
        bound = None if records is None else records.upper_bound_offset()
        return txns.aborted_between(fetch_offset, upper_offset if bound is None else min(upper_offset, bound))

    async def wait_replicated(self, required_offset: int, timeout_s: float, leader_epoch: int | None = None) -> None:
        """Wait until the high watermark reaches ``required_offset`` (acks=all; Kafka's DelayedProduce).

        A waiting request costs one future in a heap keyed by offset; the high watermark's moves resolve them.
        ``leader_epoch``: the epoch the batch was appended at. If this broker's epoch is another one when
        the wait ends, the answer is NOT_LEADER_OR_FOLLOWER even if the high watermark passed the offset: a
        broker that lost leadership, truncated and was elected again holds other records at those offsets.

        Raises:
            NotEnoughReplicasAfterAppend, NotLeaderOrFollower, RequestTimedOut.
        """
        if self.high_watermark < required_offset:
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            self._waiter_sequence += 1
            heapq.heappush(self._waiters, (required_offset, self._waiter_sequence, future))
            try:
                async with asyncio.timeout(max(timeout_s, 0.0)):
                    await future
            except TimeoutError:
                raise RequestTimedOut(
                    f"{self.topic}-{self.partition}: offset {required_offset - 1} not replicated to the ISR "
                    f"within the request timeout (high watermark {self.high_watermark})") from None
            finally:
                if not future.done():
                    future.cancel()
        if self.role is not Role.LEADER or (leader_epoch is not None and leader_epoch != self.leader_epoch):
            raise NotLeaderOrFollower(f"{self.topic}-{self.partition}: leadership moved while the write waited "
                                      f"for replication")
        if len(self.isr) < self.min_insync_replicas:
            raise NotEnoughReplicasAfterAppend(
                f"{self.topic}-{self.partition}: written, but the ISR {list(self.isr)} shrank below "
                f"min.insync.replicas={self.min_insync_replicas}")

    def _complete_waiters(self) -> None:
        waiters = self._waiters
        while waiters and waiters[0][0] <= self.high_watermark:
            _offset, _sequence, future = heapq.heappop(waiters)
            if not future.done():
                future.set_result(None)

    def _fail_waiters(self) -> None:
        """Leadership lost: every waiting acks=all request answers now (``wait_replicated`` sees the role)."""
        waiters, self._waiters = self._waiters, []
        for _offset, _sequence, future in waiters:
            if not future.done():
                future.set_result(None)

    # --- the high watermark -----------------------------------------------------------------------------------

    def maybe_advance_high_watermark(self) -> bool:
        """Leader: move the high watermark to the smallest log end over the maximal ISR. True if it moved."""
        if self.role is not Role.LEADER:
            return False
        new_high_watermark = self.log.log_end_offset
        for replica in self.maximal_isr:
            if replica == self.node_id:
                continue
            view = self.followers.get(replica)
            new_high_watermark = min(new_high_watermark, view.log_end_offset if view is not None else -1)
        return self._set_high_watermark(new_high_watermark)

    def _set_high_watermark(self, value: int) -> bool:
        if value <= self.high_watermark:
            return False
        self.high_watermark = value
        self.log.set_high_watermark(value)
        self._notifier.notify(self.key)
        self._complete_waiters()
        return True

    def update_follower_high_watermark(self, leader_high_watermark: int) -> bool:
        """Follower: the leader's high watermark from a fetch response, capped at our own log end."""
        return self._set_high_watermark(min(leader_high_watermark, self.log.log_end_offset))

    # --- reads ------------------------------------------------------------------------------------------------

    def read_for_consumer(self, offset: int, max_bytes: int, *, min_one_message: bool):
        """Records from ``offset`` below the high watermark (a pinned FileSlice; see storage ``read``).

        An offset between the high watermark and the log end reads nothing (Kafka answers such a fetch with
        no records, not an error); past the log end it is OFFSET_OUT_OF_RANGE (raised by storage).
        """
        return self._read(offset, max_bytes, min_one_message, self.high_watermark)

    def read_for_follower(self, replica_id: int, offset: int, max_bytes: int, *, min_one_message: bool):
        """Records from ``offset`` up to the log end, for follower ``replica_id``'s fetch; first records the
        fetch offset as that follower's log end (which may grow the ISR and move the high watermark)."""
        self.update_follower_fetch_state(replica_id, offset)
        return self._read(offset, max_bytes, min_one_message, None)

    def _read(self, offset: int, max_bytes: int, min_one_message: bool, max_offset: int | None):
        log_ = self.log
        if max_offset is None or max_offset >= log_.log_end_offset:
            return log_.read(offset, max_bytes, min_one_message=min_one_message)
        return log_.read(offset, max_bytes, min_one_message=min_one_message, max_offset=max_offset)

    async def delete_records_before(self, offset: int) -> int:
        """DeleteRecords on the leader: move the log start offset up to ``offset`` (-1: the high watermark),
        so the records below it are no longer served and their whole segments are retired. Returns the new
        log start offset (the low watermark). Loop thread; the log's part (which writes the log start
        checkpoint before it returns) runs on a worker thread.

        Kafka's rule: only records every ISR member has (below the high watermark) may be deleted.

        Raises:
            NotLeaderOrFollower, BrokerError(OFFSET_OUT_OF_RANGE) (negative, or past the high watermark),
            StorageError.
        """
        self.check_leader()
        if offset == -1:
            offset = self.high_watermark
        if offset < 0 or offset > self.high_watermark:
            raise BrokerError(ErrorCode.offset_out_of_range,
                              f"{self.topic}-{self.partition}: cannot delete records before offset {offset}: it is "
                              f"not in [0, {self.high_watermark}] (the high watermark)")
        return await asyncio.to_thread(self.log.delete_records_before, offset)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after ``timestamp_ms`` below the high watermark, or
        None. Raises StorageError, InvalidBatchError (a stored batch that does not decode)."""
        found = self.log.offset_for_timestamp(timestamp_ms)
        if found is None or found[0] >= self.high_watermark:
            return None
        return found

    def offset_for_max_timestamp(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record carrying the log's largest timestamp, below the high
        watermark, or None (ListOffsets -3, KIP-734; Kafka ``UnifiedLog.fetchOffsetByTimestamp``: the first
        segment with the largest max timestamp, its first batch reaching it, that batch's first record with
        it). Raises StorageError, InvalidBatchError."""
        return self.offset_for_timestamp(self.log.max_timestamp())

    def end_offset_for_epoch(self, leader_epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: (the largest epoch <= ``leader_epoch`` this log has, the offset where it
        ends: the next epoch's start, or the log end for the latest), or (-1, -1) when the log has no epoch
        at or below it (KIP-101, KIP-279)."""
        return self.log.leader_epochs.end_offset_for(leader_epoch, self.log.log_end_offset)

    # --- followers, as the leader sees them -------------------------------------------------------------------

    def update_follower_fetch_state(self, replica_id: int, fetch_offset: int) -> None:
        """Kafka's ``Replica.updateFetchState``: the fetch offset is the follower's log end offset.

        Checked before it is credited: an offset outside this log ([log start, log end]) is no position
        a follower of this leader can hold (a follower that has not truncated yet, or a confused or forged
        request), and counting it would move the high watermark over records that replica does not have.

        Raises:
            NotLeaderOrFollower: ``replica_id`` is not an assigned replica of this partition.
            OffsetOutOfRangeError: ``fetch_offset`` lies outside the leader's log (the follower truncates,
                or restarts at the log start, on OFFSET_OUT_OF_RANGE); nothing is credited.
        """
        view = self.followers.get(replica_id)
        if view is None:
            raise NotLeaderOrFollower(f"node {replica_id} is not a replica of {self.topic}-{self.partition}")
        leader_end = self.log.log_end_offset
        if not self.log.log_start_offset <= fetch_offset <= leader_end:
            raise OffsetOutOfRangeError(fetch_offset, self.log.log_start_offset, leader_end,
                                        f"{self.topic}-{self.partition} (fetch by replica {replica_id})")
        now = self._clock()
        if fetch_offset >= leader_end:
            view.last_caught_up_ms = max(view.last_caught_up_ms, now)
        elif fetch_offset >= view.last_fetch_leader_log_end_offset:
            view.last_caught_up_ms = max(view.last_caught_up_ms, view.last_fetch_ms)
        view.log_end_offset = fetch_offset
        view.last_fetch_leader_log_end_offset = leader_end
        view.last_fetch_ms = now
        self.maybe_advance_high_watermark()

    def isr_expansion(self, replica_id: int) -> tuple[int, ...] | None:
        """The ISR with ``replica_id``, whose fetch has just reached the high watermark and this epoch's
        start, or None when it is in the ISR already, has not caught up, or a change is in flight.

        Only the follower that is fetching is judged, never a view left from an earlier fetch: a dead
        follower's last offset can still equal an idle partition's high watermark, and adding it back
        would have the controller remove it again, round after round."""
        if self.role is not Role.LEADER or self.pending_isr is not None or replica_id in self.isr:
            return None
        view = self.followers.get(replica_id)
        if view is None or view.log_end_offset < self.high_watermark or view.log_end_offset < self.epoch_start_offset:
            return None
        return (*self.isr, replica_id)

    def isr_shrink(self) -> tuple[int, ...] | None:
        """The ISR without the followers that have not caught up within ``replica.lag.time.max.ms``, or None."""
        if self.role is not Role.LEADER or self.pending_isr is not None:
            return None
        now = self._clock()
        lagging = {replica for replica in self.isr if replica != self.node_id and
                   now - self.followers.get(replica, ReplicaView()).last_caught_up_ms > self.replica_lag_time_max_ms}
        if not lagging:
            return None
        return tuple(replica for replica in self.isr if replica not in lagging)

    def begin_isr_change(self, proposed: tuple[int, ...]) -> int:
        """An ISR change was sent to the metadata store; until it is answered the high watermark counts the
        union of both sets. Returns the change's number, for ``end_isr_change``."""
        self.pending_isr = proposed
        self._isr_change_from = self.state_version
        self._isr_change_number += 1
        return self._isr_change_number

    def isr_change_pending(self, number: int) -> bool:
        """Change ``number`` is still the one in flight (no answer, no newer state, same leadership)."""
        return self.pending_isr is not None and number == self._isr_change_number and self.role is Role.LEADER

    def end_isr_change(self, state: PartitionState | None, number: int | None = None) -> None:
        """A definite answer from the store: the state it holds now, or None when the change was refused (the
        state had moved from the one it was made from, so it cannot commit: the next metadata update brings
        the new one). Never call it on an unknown outcome (a timed-out write may have committed): the
        maximal ISR stays until a definite answer (KIP-497). An answer to a change that is no longer the
        one in flight (``number``) is ignored, except for a newer state it carries."""
        if number is None or number == self._isr_change_number:
            self.pending_isr = None
        if state is not None and state.leader_epoch == self.leader_epoch and state.version > self.state_version:
            self._apply_isr(state)

    def _apply_isr(self, state: PartitionState) -> None:
        if state.isr != self.isr:
            log.info("%s-%d: ISR %s -> %s (epoch %d)", self.topic, self.partition, list(self.isr), list(state.isr),
                     state.leader_epoch)
        self.isr = state.isr
        self.state_version = state.version
        self.maybe_advance_high_watermark()
        self._complete_waiters()

    # --- role changes -------------------------------------------------------------------------------------------

    def make_leader(self, state: PartitionState, *, epoch_start_offset: int | None = None) -> bool:
        """Become (or stay) leader with ``state``. Returns True when the leader epoch changed.

        A new epoch starts at the current log end: followers must reach it before they join the ISR.
        The high watermark stays where it is (it never moves back) and advances as followers fetch.
        """
        new_epoch = state.leader_epoch != self.leader_epoch or self.role is not Role.LEADER
        self.replicas = state.replicas
        self.leader_id = self.node_id
        if new_epoch:
            self.leader_epoch = state.leader_epoch
            self.epoch_start_offset = self.log.log_end_offset if epoch_start_offset is None else epoch_start_offset
            # The epoch starts at the log end (KIP-101): recorded before the first append of this epoch, so
            # OffsetForLeaderEpoch answers where the previous one ended (the file follows in the background).
            self.log.leader_epochs.assign(state.leader_epoch, self.log.log_end_offset)
            now = self._clock()
            # Followers start unknown; one already in the ISR is given the benefit of a fresh start (Kafka
            # resets lastCaughtUpTime to now on leadership), so it is not shrunk before its first fetch.
            self.followers = {replica: ReplicaView(last_caught_up_ms=now if replica in state.isr else 0.0)
                              for replica in state.replicas if replica != self.node_id}
            self.pending_isr = None
            self.role = Role.LEADER
            log.info("%s-%d: leader at epoch %d from offset %d, ISR %s", self.topic, self.partition,
                     state.leader_epoch, self.epoch_start_offset, list(state.isr))
        else:
            for replica in state.replicas:
                if replica != self.node_id and replica not in self.followers:
                    self.followers[replica] = ReplicaView()
            for replica in list(self.followers):
                if replica not in state.replicas:
                    del self.followers[replica]
            if self.pending_isr is not None and state.version > self._isr_change_from:
                # The store's state moved past the one the change was made from: the change has either
                # committed (this is its state, or a later one) or can no longer commit. A definite answer.
                self.pending_isr = None
        self.isr = state.isr
        self.state_version = state.version
        self.maybe_advance_high_watermark()
        self._complete_waiters()
        return new_epoch

    def make_follower(self, state: PartitionState) -> bool:
        """Become (or stay) a follower of ``state.leader``. Returns True when the leader or epoch changed
        (the fetcher must then truncate by epoch before it fetches)."""
        changed = (self.role is not Role.FOLLOWER or state.leader_epoch != self.leader_epoch
                   or state.leader != self.leader_id)
        was_leader = self.role is Role.LEADER
        self.role = Role.FOLLOWER if state.leader >= 0 else Role.NONE
        self.leader_id = state.leader
        self.leader_epoch = state.leader_epoch
        self.replicas = state.replicas
        self.isr = state.isr
        self.state_version = state.version
        self.followers = {}
        self.pending_isr = None
        if was_leader:
            log.info("%s-%d: no longer leader (epoch %d, new leader %d)", self.topic, self.partition,
                     state.leader_epoch, state.leader)
            self._fail_waiters()
        return changed

    def make_offline(self) -> None:
        """The partition is closing or being deleted here: waiting writes answer NOT_LEADER_OR_FOLLOWER."""
        was_leader = self.role is Role.LEADER
        self.role = Role.NONE
        self.leader_id = NO_LEADER
        self.followers = {}
        self.pending_isr = None
        if was_leader:
            self._fail_waiters()
        self._notifier.notify(self.key)
        self._notifier.notify(self.follower_key)

    # --- the follower's append path ----------------------------------------------------------------------------

    def follows(self, leader_epoch: int) -> bool:
        """This replica is a follower at ``leader_epoch`` (what a fetch or truncation started under), and no
        worker thread is changing its log (only after a cancelled await can one still be running while
        the lock is free)."""
        return self.role is Role.FOLLOWER and self.leader_epoch == leader_epoch and not self.mutating

    async def append_as_follower(self, records, leader_epoch: int) -> int | None:
        """Append the leader's batches as they are (offsets, epochs and timestamps kept, CRC checked by
        storage) and rebuild producer state from their headers, so a follower that becomes leader
        deduplicates retries as the old leader would have. Returns the new log end offset, or None when this
        replica is no longer a follower at ``leader_epoch`` (the epoch the fetch was sent under): the
        records, or what is left of them after an await, are then not appended. Loop thread; awaits
        (never blocks) when the log needs a segment or blocks its worker threads are preparing, or while
        another mutation of the log runs."""
        # One pass over the batch headers (about 1 us a batch: 64 us for a 1 MiB fetch of 16 KiB batches)
        # finds transactional batches, which need the partition's transactional file first.
        control_types = _control_types(records)
        if control_types is not None:
            await self.ensure_transactional()
        not_ready = None
        if not self._log_lock.locked():
            if not self.follows(leader_epoch):
                return None
            try:
                return self._append_as_follower_nowait(records, control_types)
            except AppendNotReady as exc:
                not_ready = exc
        async with self._log_lock:
            while True:
                if not_ready is not None:
                    for base_offset, header in not_ready.follower_headers or ():
                        self._follower_applied(header, base_offset, control_types)
                    records = await self._wait_storage(not_ready, records)
                # After every await: still a follower of the epoch the fetch was sent under.
                if not self.follows(leader_epoch):
                    return None
                try:
                    return self._append_as_follower_nowait(records, control_types)
                except AppendNotReady as exc:
                    not_ready = exc

    def _append_as_follower_nowait(self, records, control_types: dict | None) -> int:
        result = self.log.append_as_follower(records)
        for base_offset, header in result.headers:
            self._follower_applied(header, base_offset, control_types)
        self._snapshot_if_rolled()
        return self.log.log_end_offset

    async def mutate_as_follower(self, leader_epoch: int, blocking: Callable[[], Any],
                                 then: Callable[[Any], None]) -> bool:
        """Run ``blocking`` (a truncation, a move of the log start) on a worker thread, then ``then`` with its
        result on the loop thread, as one step of this partition: after every other mutation of the log,
        and only if this replica is still a follower at ``leader_epoch`` when its turn comes. Returns False
        when it is not (nothing was run).

        While it runs, role changes wait (``defer_role_change``): a replica cutting its log is not made
        leader until the cut and ``then`` are done, so it never acknowledges a write the cut would remove.
        That holds even if the awaiting task is cancelled (the thread cannot be stopped): the end of the
        thread, not of the await, ends the step. Raises what ``blocking`` raises (the step still ends)."""
        async with self._log_lock:
            if not self.follows(leader_epoch):
                return False
            self.mutating = True
            future = asyncio.ensure_future(asyncio.to_thread(blocking))

            def done(finished: asyncio.Future) -> None:
                self.mutating = False
                try:
                    if not finished.cancelled() and finished.exception() is None:
                        then(finished.result())
                finally:
                    if self.deferred_state is not None:
                        self.on_mutation_end(self)

            future.add_done_callback(done)
            await asyncio.shield(future)
            return True

    def defer_role_change(self, state: PartitionState) -> bool:
        """While a follower's log mutation runs: keep ``state`` to apply when it ends (a later one replaces
        it) and return True; otherwise False (apply it now)."""
        if not self.mutating:
            return False
        if self.deferred_state is None:
            log.info("%s-%d: leader %d at epoch %d waits for the truncation in progress", self.topic,
                     self.partition, state.leader, state.leader_epoch)
        self.deferred_state = state
        return True

    def take_deferred_role_change(self) -> PartitionState | None:
        state, self.deferred_state = self.deferred_state, None
        return state

    def _follower_applied(self, header, base_offset: int, control_types: dict | None) -> None:
        """A replicated batch: producer state and, for transactional ones, this partition's transactions
        (so a follower that becomes leader knows the open transactions and the LSO)."""
        if header.is_control:
            if header.producer_id >= 0:
                self._producers.update_marker(self.topic, self.partition, header.producer_id,
                                              header.producer_epoch, header.max_timestamp)
                marker = (control_types or {}).get(base_offset)
                if marker is not None:
                    aborted = self.txns.on_marker(header.producer_id, base_offset, marker.control_type,
                                                  self.high_watermark, marker.coordinator_epoch)
                    if aborted is not None and self.state_files is not None:
                        self.state_files.append_aborted(self.log, aborted)
            return
        self._producers.update(self.topic, self.partition, header, base_offset)
        if header.is_transactional:
            self.txns.on_batch(header, base_offset)


def _control_types(records) -> dict | None:
    """base offset -> ``Marker`` (control type, coordinator epoch) of each control batch in ``records`` ({}
    when there are transactional batches but no markers), or None when no batch is transactional. Reads
    headers and markers' keys and values only."""
    from copyless.broker.txn_partition import CONTROL_KEY_READ, read_marker
    from copyless.protocol.records import RECORD_BATCH_OVERHEAD, iter_batches

    found = None
    for position, header in iter_batches(records, 0, None):
        if not header.is_transactional:
            continue
        if found is None:
            found = {}
        if header.is_control:
            end = min(position + header.size, position + RECORD_BATCH_OVERHEAD + CONTROL_KEY_READ)
            found[header.base_offset] = read_marker(bytes(records[position:end]))
    return found
