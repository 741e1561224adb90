"""A transactional id's state and the transaction coordinator's rules, as a pure state machine.

Owns ``TxnMetadata`` (transactional id -> producer id, epoch, timeout, state, partitions, times) and the
decisions of Kafka 3.9's ``TransactionCoordinator`` / ``TransactionMetadata`` on it. Each ``on_*`` function
takes the current metadata (None: never seen) and a request, and returns a ``Decision``: the error to
answer, or the metadata to persist (and answer with once it is stored). No I/O, no clock: the caller
passes ``now_ms``.

States (Kafka's ids, persisted)::

    Empty(0) --AddPartitions--> Ongoing(1) --EndTxn(commit)--> PrepareCommit(2) --markers--> CompleteCommit(4)
                                           --EndTxn(abort) / timeout--> PrepareAbort(3) --markers--> CompleteAbort(5)
    Complete* --AddPartitions--> Ongoing;  Empty / Complete* --InitProducerId--> Empty at epoch + 1

Fencing: InitProducerId on a known id bumps the epoch (a new producer id once the epoch would pass
32766), so every request of the previous incarnation (a zombie) carries an older epoch and gets
PRODUCER_FENCED; its open transaction is aborted first, at the bumped epoch, so its markers fence its
batches on every partition too (INVALID_PRODUCER_EPOCH there). A transaction past its timeout is aborted
the same way (``on_timeout``: epoch + 1), so its producer is fenced as well, as Kafka does.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import NamedTuple

from kio.schema.errors import ErrorCode

__all__ = ["TxnState", "TxnMetadata", "Decision", "on_init", "on_add_partitions", "on_end", "on_complete",
           "on_timeout", "expired", "MAX_EPOCH"]

# Kafka's Short.MaxValue - 1: the last epoch a producer id is used with before a new id is handed out.
MAX_EPOCH = 32766


class TxnState(enum.IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        return "".join(part.capitalize() for part in self.name.split("_"))


PREPARING = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


@dataclass(frozen=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[tuple[str, int]]  # of (topic, partition)
    start_ms: int = -1
    update_ms: int = -1


class Decision(NamedTuple):
    error: ErrorCode
    metadata: TxnMetadata | None = None  # to persist (None: nothing to write)
    # InitProducerId on an Ongoing transaction: persist ``metadata`` (PrepareAbort at a bumped epoch), write
    # its markers, and answer CONCURRENT_TRANSACTIONS so the client retries (and bumps the epoch again).
    abort_first: bool = False


def _current(metadata: TxnMetadata | None, producer_id: int, producer_epoch: int) -> TxnMetadata | ErrorCode:
    """The metadata, when the request's producer id and epoch are its current ones; else the error to answer
    (an unknown id or another producer's: INVALID_PRODUCER_ID_MAPPING; an older epoch: PRODUCER_FENCED)."""
    if metadata is None or metadata.producer_id != producer_id:
        return ErrorCode.invalid_producer_id_mapping
    if metadata.producer_epoch != producer_epoch:
        return ErrorCode.producer_fenced
    return metadata


def on_init(metadata: TxnMetadata | None, *, transactional_id: str, timeout_ms: int, new_producer_id: int,
            expected_producer_id: int = -1, expected_epoch: int = -1, now_ms: int) -> Decision:
    """InitProducerId with a transactional id. ``new_producer_id``: an id to use if one is needed (a new
    transactional id, or an exhausted epoch)."""
    if metadata is None:
        return Decision(ErrorCode.none, TxnMetadata(transactional_id, new_producer_id, 0, timeout_ms,
                                                    TxnState.EMPTY, frozenset(), -1, now_ms))
    if expected_producer_id >= 0 and (expected_producer_id != metadata.producer_id
                                      or expected_epoch != metadata.producer_epoch):
        # KIP-360: a producer asking to bump an epoch that is no longer current has been fenced.
        return Decision(ErrorCode.producer_fenced)
    if metadata.state in PREPARING or metadata.state is TxnState.PREPARE_EPOCH_FENCE:
        return Decision(ErrorCode.concurrent_transactions)
    if metadata.state is TxnState.ONGOING:
        return Decision(ErrorCode.concurrent_transactions, _fence_and_abort(metadata, now_ms), abort_first=True)
    if metadata.producer_epoch >= MAX_EPOCH:
        producer_id, epoch = new_producer_id, 0
    else:
        producer_id, epoch = metadata.producer_id, metadata.producer_epoch + 1
    return Decision(ErrorCode.none, replace(metadata, producer_id=producer_id, producer_epoch=epoch,
                                            timeout_ms=timeout_ms, state=TxnState.EMPTY, partitions=frozenset(),
                                            start_ms=-1, update_ms=now_ms))


def _fence_and_abort(metadata: TxnMetadata, now_ms: int) -> TxnMetadata:
    epoch = metadata.producer_epoch + 1 if metadata.producer_epoch < MAX_EPOCH else metadata.producer_epoch
    return replace(metadata, producer_epoch=epoch, state=TxnState.PREPARE_ABORT, update_ms=now_ms)


def on_add_partitions(metadata: TxnMetadata | None, *, producer_id: int, producer_epoch: int,
                      partitions: frozenset[tuple[str, int]], now_ms: int) -> Decision:
    """AddPartitionsToTxn (and AddOffsetsToTxn, with the group's offsets partition)."""
    checked = _current(metadata, producer_id, producer_epoch)
    if isinstance(checked, ErrorCode):
        return Decision(checked)
    metadata = checked
    if metadata.state in PREPARING or metadata.state is TxnState.PREPARE_EPOCH_FENCE:
        return Decision(ErrorCode.concurrent_transactions)
    if metadata.state is TxnState.ONGOING and partitions <= metadata.partitions:
        return Decision(ErrorCode.none)
    if metadata.state is TxnState.DEAD:
        return Decision(ErrorCode.invalid_txn_state)
    start = metadata.start_ms if metadata.state is TxnState.ONGOING else now_ms
    current = metadata.partitions if metadata.state is TxnState.ONGOING else frozenset()
    return Decision(ErrorCode.none, replace(metadata, state=TxnState.ONGOING, partitions=current | partitions,
                                            start_ms=start, update_ms=now_ms))


def on_end(metadata: TxnMetadata | None, *, producer_id: int, producer_epoch: int, commit: bool,
           now_ms: int) -> Decision:
    """EndTxn: Ongoing moves to PrepareCommit/PrepareAbort; a retry of a completed end succeeds."""
    checked = _current(metadata, producer_id, producer_epoch)
    if isinstance(checked, ErrorCode):
        return Decision(checked)
    metadata = checked
    state = metadata.state
    if state is TxnState.ONGOING:
        target = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        return Decision(ErrorCode.none, replace(metadata, state=target, update_ms=now_ms))
    if (state is TxnState.COMPLETE_COMMIT and commit) or (state is TxnState.COMPLETE_ABORT and not commit):
        return Decision(ErrorCode.none)
    if (state is TxnState.PREPARE_COMMIT and commit) or (state is TxnState.PREPARE_ABORT and not commit):
        return Decision(ErrorCode.concurrent_transactions)
    return Decision(ErrorCode.invalid_txn_state)


def on_complete(metadata: TxnMetadata, now_ms: int) -> TxnMetadata:
    """Every marker of a Prepare* transaction is written: Complete*, no partitions."""
    target = TxnState.COMPLETE_COMMIT if metadata.state is TxnState.PREPARE_COMMIT else TxnState.COMPLETE_ABORT
    return replace(metadata, state=target, partitions=frozenset(), update_ms=now_ms)


def on_timeout(metadata: TxnMetadata, now_ms: int) -> TxnMetadata | None:
    """An Ongoing transaction past its timeout: PrepareAbort at epoch + 1 (its producer is fenced), else None."""
    if metadata.state is not TxnState.ONGOING or now_ms < metadata.start_ms + metadata.timeout_ms:
        return None
    return _fence_and_abort(metadata, now_ms)


def expired(metadata: TxnMetadata, now_ms: int, expiration_ms: int) -> bool:
    """Has the id been idle past ``transactional.id.expiration.ms``? Only with no transaction in progress
    (Empty, CompleteCommit, CompleteAbort), counted from its last state change, as Kafka's
    ``TransactionStateManager`` decides; the coordinator then forgets it by a tombstone."""
    return (metadata.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
            and 0 <= metadata.update_ms <= now_ms - expiration_ms)
