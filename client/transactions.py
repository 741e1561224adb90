"""The transactional producer's state: its coordinator, the transaction's partitions, and how it ends.

Owns ``TransactionManager`` (Kafka's ``TransactionManager``, KIP-98): the transactional id's coordinator
(FindCoordinator key type 1), the producer id and epoch it hands out (InitProducerId, which also fences
every older producer of the id), the partitions added to the open transaction (AddPartitionsToTxn, sent
before the first batch to each partition: the sender holds a partition's batches until it is added), the
consumer offsets sent with it (AddOffsetsToTxn, then TxnOffsetCommit to the group's coordinator) and its
end (EndTxn, after every batch is acknowledged).

States, as the Java client's: UNINITIALIZED -> (init_transactions) READY -> (begin_transaction)
IN_TRANSACTION -> (commit_transaction / abort_transaction) READY. An error moves it to

- ABORTABLE_ERROR: a batch failed for good, a partition or the group could not be added (authorization,
  UNKNOWN_PRODUCER_ID): ``commit_transaction`` raises ``TransactionAbortableError`` and the application
  calls ``abort_transaction``, which leaves the producer READY again. Where the broker lost the producer's
  sequence state (a failed batch, UNKNOWN_PRODUCER_ID, OUT_OF_ORDER_SEQUENCE_NUMBER) the abort is followed
  by InitProducerId carrying the current producer id and epoch (KIP-360), which bumps the epoch, so the
  next transaction starts at sequence 0 instead of behind a gap;
- FATAL_ERROR: the producer was fenced (PRODUCER_FENCED, or INVALID_PRODUCER_EPOCH before KIP-588) by a
  newer producer with the same transactional id or by the coordinator's timeout abort, or an error no
  retry can mend (authorization of the transactional id, INVALID_TXN_STATE): every later call raises
  ``ProducerFencedError`` / ``TransactionFatalError``; the only way on is a new producer.

Coordinator requests are retried, the coordinator looked up again, on coordinator errors
(NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS), CONCURRENT_TRANSACTIONS (the
previous transaction's markers are still being written), lost connections and other retriable errors,
until ``max_block_ms``. Loop thread only.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time

from kio.schema.add_offsets_to_txn.v3.request import AddOffsetsToTxnRequest
from kio.schema.add_offsets_to_txn.v3.response import AddOffsetsToTxnResponse
from kio.schema.add_partitions_to_txn.v3.request import AddPartitionsToTxnRequest, AddPartitionsToTxnTopic
from kio.schema.add_partitions_to_txn.v3.response import AddPartitionsToTxnResponse
from kio.schema.end_txn.v3.request import EndTxnRequest
from kio.schema.end_txn.v3.response import EndTxnResponse
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.init_producer_id.v4.response import InitProducerIdResponse
from kio.schema.txn_offset_commit.v3.request import (
    TxnOffsetCommitRequest,
    TxnOffsetCommitRequestPartition,
    TxnOffsetCommitRequestTopic,
)
from kio.schema.txn_offset_commit.v3.response import TxnOffsetCommitResponse
from kio.schema.types import GroupId, ProducerId, TopicName, TransactionalId
from kio.static.primitive import i16, i32, i32Timedelta, i64

from copyless.client.cluster import COORDINATOR_ERRORS
from copyless.client.conn import Connection
from copyless.client.errors import (
    ClientError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionFatalError,
    TransactionStateError,
)

__all__ = ["TransactionManager"]

log = logging.getLogger("copyless.client.transactions")

UNINITIALIZED = "UNINITIALIZED"
READY = "READY"
IN_TRANSACTION = "IN_TRANSACTION"
COMMITTING = "COMMITTING"
ABORTING = "ABORTING"
ABORTABLE_ERROR = "ABORTABLE_ERROR"
FATAL_ERROR = "FATAL_ERROR"

OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
CONCURRENT_TRANSACTIONS = 51
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
UNKNOWN_PRODUCER_ID = 59
PRODUCER_FENCED = 90
TRANSACTION_ABORTABLE = 120
FENCED = frozenset({INVALID_PRODUCER_EPOCH, PRODUCER_FENCED})
# Answers no retry can mend: the producer is done.
FATAL = FENCED | {INVALID_TXN_STATE, INVALID_PRODUCER_ID_MAPPING, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, 31, 35}
# The broker lost the producer's sequences: after the abort the epoch is bumped (KIP-360).
NEEDS_EPOCH_BUMP = frozenset({UNKNOWN_PRODUCER_ID, OUT_OF_ORDER_SEQUENCE_NUMBER})
_RETRY = COORDINATOR_ERRORS | {CONCURRENT_TRANSACTIONS}


class TransactionManager:
    """One transactional id's state for a ``Producer`` (see the module docstring)."""

    def __init__(self, cluster, sender, accumulator, transactional_id: str, *, transaction_timeout_ms: int,
                 retry_backoff_ms: int, max_block_ms: int) -> None:
        if not transactional_id:
            raise ValueError("transactional_id must be a non-empty string")
        self._cluster = cluster
        self._sender = sender
        self._accumulator = accumulator
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.max_block_ms = max_block_ms
        self.state = UNINITIALIZED
        self.error: BaseException | None = None
        self.bump_epoch = False
        self.added: set[tuple[str, int]] = set()
        self._pending: set[tuple[str, int]] = set()
        self._adding: asyncio.Task | None = None
        self._offsets_added = False
        self._coordinator: Connection | None = None

    # --- states -------------------------------------------------------------------------------------------

    def check_can_send(self) -> None:
        if self.state == IN_TRANSACTION:
            return
        if self.state == ABORTABLE_ERROR:
            raise TransactionAbortableError(f"the transaction must be aborted: {self.error}", self.error)
        self._raise_if_fatal()
        raise TransactionStateError(f"send outside a transaction (state {self.state}): call begin_transaction()")

    def _raise_if_fatal(self) -> None:
        if self.state == FATAL_ERROR:
            if isinstance(self.error, TransactionFatalError):
                raise self.error
            raise TransactionFatalError(f"the producer cannot go on: {self.error}", self.error)

    def _require(self, *states: str, action: str) -> None:
        self._raise_if_fatal()
        if self.state not in states:
            raise TransactionStateError(f"cannot {action} in state {self.state}")

    def fail(self, error: BaseException, *, lost_sequence: bool = False) -> None:
        """A request of the transaction failed for good, or (``lost_sequence``, from the sender) a batch."""
        if self.state == FATAL_ERROR:
            return
        code = getattr(error, "code", None)
        if code in FATAL:
            self._fatal(error)
            return
        if lost_sequence or code in NEEDS_EPOCH_BUMP:
            # A batch lost for good leaves a gap in its partition's sequences (or the broker forgot the
            # producer): the next transaction would be out of order. Bump the epoch after the abort.
            self.bump_epoch = True
        if self.state in (IN_TRANSACTION, COMMITTING, ABORTABLE_ERROR):
            self.state = ABORTABLE_ERROR
            if self.error is None:
                self.error = error

    def _fatal(self, error: BaseException) -> None:
        self.state = FATAL_ERROR
        code = getattr(error, "code", None)
        if code in FENCED:
            error = ProducerFencedError(
                f"transactional id {self.transactional_id!r}: producer id {self._sender.producer_id} epoch "
                f"{self._sender.producer_epoch} was fenced by a newer producer (or the coordinator aborted its "
                f"transaction after transaction_timeout_ms); close this producer", error)
        elif not isinstance(error, TransactionFatalError):
            error = TransactionFatalError(f"transactional id {self.transactional_id!r}: {error}", error)
        self.error = error
        self._accumulator.fail_all(error)
        self._accumulator.wake.set()

    # --- coordinator requests -----------------------------------------------------------------------------

    async def _request(self, request, response_cls, code_of, what: str, deadline: float | None = None):
        """Send ``request`` to the coordinator; retried as the module docstring says. Returns the response
        with error code 0; raises KafkaError for any other final answer."""
        if deadline is None:
            deadline = time.monotonic() + self.max_block_ms / 1000
        backoff = self.retry_backoff_ms / 1000
        error: ClientError  # the last failure, reported once the deadline passes
        while True:
            try:
                if self._coordinator is None or self._coordinator.closed:
                    remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
                    self._coordinator = await self._cluster.coordinator(self.transactional_id, remaining_ms,
                                                                        key_type=1)
                response = await self._coordinator.request_kio(request, response_cls)
                code = code_of(response)
                if code == 0:
                    return response
                error = KafkaError(code, f"{what} for transactional id {self.transactional_id!r}")
                if code in COORDINATOR_ERRORS:
                    self._coordinator = None
                elif code not in _RETRY and not error.retriable:
                    raise error
            except (KafkaConnectionError, KafkaTimeoutError) as exc:
                error = exc
                self._coordinator = None
            if time.monotonic() + backoff > deadline:
                raise KafkaTimeoutError(f"{what}: not done within max_block_ms={self.max_block_ms}: {error}")
            await asyncio.sleep(backoff)
            # CONCURRENT_TRANSACTIONS is a short wait for markers (Kafka retries it every 20 ms): stay brief.
            backoff = min(backoff * 2, 0.5)

    async def _init_producer_id(self, producer_id: int = -1, producer_epoch: int = -1) -> None:
        timeout = i32Timedelta.parse(datetime.timedelta(milliseconds=self.transaction_timeout_ms))
        response = await self._request(
            InitProducerIdRequest(transactional_id=TransactionalId(self.transactional_id), transaction_timeout=timeout,
                                  producer_id=ProducerId(producer_id), producer_epoch=i16(producer_epoch)),
            InitProducerIdResponse, lambda r: int(r.error_code), "InitProducerId")
        self._sender.set_producer_id(int(response.producer_id), int(response.producer_epoch))
        self.bump_epoch = False

    async def init_transactions(self) -> None:
        self._require(UNINITIALIZED, action="init_transactions")
        try:
            await self._init_producer_id()
        except KafkaError as exc:
            if exc.code in FATAL:
                self._fatal(exc)
                self._raise_if_fatal()
            raise
        self.state = READY

    def begin_transaction(self) -> None:
        self._require(READY, action="begin_transaction")
        self.added.clear()
        self._pending.clear()
        self._offsets_added = False
        self.error = None
        self.state = IN_TRANSACTION

    # --- partitions ---------------------------------------------------------------------------------------

    def want_partition(self, tp: tuple[str, int]) -> None:
        """The sender has a batch for ``tp``, not yet in the transaction: add it (AddPartitionsToTxn, all
        partitions wanted meanwhile in one request). The sender is woken when it is added."""
        self._pending.add(tp)
        if self._adding is None or self._adding.done():
            self._adding = asyncio.get_running_loop().create_task(self._add_partitions())

    async def _add_partitions(self) -> None:
        while self._pending and self.state in (IN_TRANSACTION, COMMITTING):
            partitions, self._pending = self._pending, set()
            topics: dict[str, list[int]] = {}
            for topic, partition in sorted(partitions):
                topics.setdefault(topic, []).append(partition)
            request = AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=TransactionalId(self.transactional_id),
                v3_and_below_producer_id=self._sender.producer_id,
                v3_and_below_producer_epoch=self._sender.producer_epoch,
                v3_and_below_topics=tuple(AddPartitionsToTxnTopic(name=TopicName(t), partitions=tuple(map(i32, p)))
                                          for t, p in topics.items()))
            try:
                await self._request(request, AddPartitionsToTxnResponse, _add_partitions_code, "AddPartitionsToTxn")
            except Exception as exc:
                log.info("AddPartitionsToTxn %s failed: %s", sorted(partitions), exc)
                self.fail(exc)
            else:
                self.added |= partitions
            self._accumulator.wake.set()

    # --- offsets ------------------------------------------------------------------------------------------

    async def send_offsets(self, offsets: dict, group_id: str, generation_id: int, member_id: str,
                           group_instance_id: str | None) -> None:
        self._require(IN_TRANSACTION, action="send_offsets_to_transaction")
        try:
            if not self._offsets_added:
                await self._request(
                    AddOffsetsToTxnRequest(transactional_id=TransactionalId(self.transactional_id),
                                           producer_id=self._sender.producer_id,
                                           producer_epoch=self._sender.producer_epoch, group_id=GroupId(group_id)),
                    AddOffsetsToTxnResponse, lambda r: int(r.error_code), "AddOffsetsToTxn")
                self._offsets_added = True
            topics: dict[str, list] = {}
            for tp, offset in offsets.items():
                topic, partition = tp[0], int(tp[1])
                offset = getattr(offset, "offset", offset)
                topics.setdefault(topic, []).append(TxnOffsetCommitRequestPartition(
                    partition_index=i32(partition), committed_offset=i64(int(offset)), committed_metadata=""))
            request = TxnOffsetCommitRequest(
                transactional_id=TransactionalId(self.transactional_id), group_id=GroupId(group_id),
                producer_id=self._sender.producer_id,
                producer_epoch=self._sender.producer_epoch, generation_id=i32(generation_id), member_id=member_id,
                group_instance_id=group_instance_id,
                topics=tuple(TxnOffsetCommitRequestTopic(name=TopicName(t), partitions=tuple(p))
                             for t, p in topics.items()))
            await self._group_request(request, group_id)
        except KafkaError as exc:
            self.fail(exc)
            if self.state == FATAL_ERROR:
                self._raise_if_fatal()
            raise TransactionAbortableError(f"send_offsets_to_transaction failed: {exc}", exc) from exc

    async def _group_request(self, request, group_id: str) -> None:
        """TxnOffsetCommit to the group's coordinator, retried as ``_request`` retries."""
        deadline = time.monotonic() + self.max_block_ms / 1000
        backoff = self.retry_backoff_ms / 1000
        error: ClientError  # the last failure, reported once the deadline passes
        while True:
            try:
                connection = await self._cluster.coordinator(group_id)
                response = await connection.request_kio(request, TxnOffsetCommitResponse)
                codes = [int(p.error_code) for t in response.topics for p in t.partitions]
                code = next((c for c in codes if c), 0)
                if code == 0:
                    return
                error = KafkaError(code, f"TxnOffsetCommit for group {group_id!r}")
                if code not in _RETRY and not error.retriable:
                    raise error
            except (KafkaConnectionError, KafkaTimeoutError) as exc:
                error = exc
            if time.monotonic() + backoff > deadline:
                raise KafkaError(getattr(error, "code", 7), f"TxnOffsetCommit: {error}")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 0.5)

    # --- ending -------------------------------------------------------------------------------------------

    async def commit(self, flush) -> None:
        self._require(IN_TRANSACTION, action="commit_transaction")
        self.state = COMMITTING
        await flush()
        self._raise_if_fatal()
        if self.state == ABORTABLE_ERROR:
            raise TransactionAbortableError(
                f"the transaction cannot commit and must be aborted: {self.error}", self.error)
        await self._end(True)

    async def abort(self, flush) -> None:
        self._raise_if_fatal()
        if self.state not in (IN_TRANSACTION, ABORTABLE_ERROR, COMMITTING):
            raise TransactionStateError(f"cannot abort_transaction in state {self.state}")
        self.state = ABORTING
        # Batches not yet added can never be written: fail them now; the rest are awaited (their outcome
        # does not matter, but a batch still in flight must not land after the abort marker).
        self._accumulator.fail_unsent(lambda tp: tp not in self.added,
                                      TransactionAbortableError("the transaction was aborted", None))
        await flush()
        if self._adding is not None and not self._adding.done():
            # An AddPartitionsToTxn in flight may add a partition at the coordinator: the EndTxn below must
            # follow it (and know of it), or the coordinator keeps an open transaction that times out.
            await self._adding
        self._raise_if_fatal()
        await self._end(False)
        if self.bump_epoch:
            log.info("transactional id %r: bumping epoch %d of producer id %d after a lost sequence (KIP-360)",
                     self.transactional_id, self._sender.producer_epoch, self._sender.producer_id)
            try:
                await self._init_producer_id(self._sender.producer_id, self._sender.producer_epoch)
            except KafkaError as exc:
                if exc.code in FATAL:
                    self._fatal(exc)
                    self._raise_if_fatal()
                raise

    async def _end(self, commit: bool) -> None:
        if self.added or self._offsets_added:
            try:
                await self._request(
                    EndTxnRequest(transactional_id=TransactionalId(self.transactional_id),
                                  producer_id=self._sender.producer_id,
                                  producer_epoch=self._sender.producer_epoch, committed=commit),
                    EndTxnResponse, lambda r: int(r.error_code), "EndTxn")
            except KafkaError as exc:
                if exc.code in FATAL:
                    self._fatal(exc)
                    self._raise_if_fatal()
                # Unknown outcome (timeout): the application may retry commit/abort, as with Java's client.
                self.state = IN_TRANSACTION if commit else ABORTABLE_ERROR
                raise
        self.added.clear()
        self._offsets_added = False
        self.error = None
        self.state = READY


def _add_partitions_code(response) -> int:
    """The first partition error of an AddPartitionsToTxn v3 response (OPERATION_NOT_ATTEMPTED, 55, only
    says another partition failed)."""
    codes = [int(p.partition_error_code) for t in response.results_by_topic_v3_and_below
             for p in t.results_by_partition]
    return next((c for c in codes if c and c != 55), next((c for c in codes if c), 0))

