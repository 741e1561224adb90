"""Transaction APIs: AddPartitionsToTxn (24) v0-3, AddOffsetsToTxn (25) v0-3, EndTxn (26) v0-3,
WriteTxnMarkers (27) v1, TxnOffsetCommit (28) v0-3, DescribeTransactions (65) v0, ListTransactions (66) v0
(the ids coordinated by the broker asked; an admin asks every broker, as Kafka's tools do). InitProducerId with a
transactional id and FindCoordinator with key type 1 come here from their own handlers (``init_producer_id``,
``find_coordinator``).

Each translates one kio request into a call on ``broker.transactions`` (``broker.txn.service``) or, for
TxnOffsetCommit, on ``broker.groups``. Kafka's rules (``KafkaApis``):

- PRODUCER_FENCED (90) is what the coordinator decides for an old epoch; versions that predate it (KIP-588:
  InitProducerId < 4, AddPartitionsToTxn / AddOffsetsToTxn / EndTxn < 2, TxnOffsetCommit < 3) get
  INVALID_PRODUCER_EPOCH (47) instead, which those clients know;
- AddPartitionsToTxn answers every partition with the same code; a partition of an unknown topic gets
  UNKNOWN_TOPIC_OR_PARTITION and the others OPERATION_NOT_ATTEMPTED (nothing is added);
- AddOffsetsToTxn adds the group's ``__consumer_offsets`` partition to the transaction;
- WriteTxnMarkers (a coordinator to a partition leader) needs ClusterAction; each partition is answered
  with the marker's outcome (NOT_LEADER_OR_FOLLOWER, INVALID_PRODUCER_EPOCH, ...);
- authorization: Write on the transactional id for every transactional API (TRANSACTIONAL_ID_AUTHORIZATION_
  FAILED, 53), Write on each topic added (TOPIC_AUTHORIZATION_FAILED), Read on the group for
  AddOffsetsToTxn / TxnOffsetCommit (GROUP_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import datetime
import logging

from kio.schema.errors import ErrorCode

from copyless.broker.errors import error_for
from copyless.broker.groups.offsets import MAX_METADATA_BYTES, OFFSETS_TOPIC, CommittedOffset
from copyless.broker.handlers.context import RequestContext
from copyless.broker.security import checks
from copyless.broker.security.checks import Operation
from copyless.broker.txn.metadata import TxnState
from copyless.broker.txn.service import TransactionService, now_ms
from copyless.broker.wire.codecs import NO_THROTTLE, build, response_module

__all__ = ["HANDLERS", "startup", "shutdown", "init_producer_id", "find_coordinator"]

log = logging.getLogger("copyless.transactions")

ADD_PARTITIONS, ADD_OFFSETS, END_TXN, WRITE_TXN_MARKERS, TXN_OFFSET_COMMIT = 24, 25, 26, 27, 28
INIT_PRODUCER_ID = 22
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66


async def startup(broker) -> None:
    broker.transactions = TransactionService(broker)
    await broker.transactions.start()


async def shutdown(broker) -> None:
    if getattr(broker, "transactions", None) is not None:
        await broker.transactions.stop()


def _fenced(code: ErrorCode, api_key: int, version: int) -> ErrorCode:
    """KIP-588: PRODUCER_FENCED only for the versions that know it."""
    if code != ErrorCode.producer_fenced:
        return code
    first = {INIT_PRODUCER_ID: 4, ADD_PARTITIONS: 2, ADD_OFFSETS: 2, END_TXN: 2, TXN_OFFSET_COMMIT: 3}[api_key]
    return code if version >= first else ErrorCode.invalid_producer_epoch


def _service(ctx: RequestContext):
    return getattr(ctx.broker, "transactions", None)


def _ms(value) -> int:
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


# --- InitProducerId with a transactional id, FindCoordinator key type 1 ----------------------------------------


async def init_producer_id(ctx: RequestContext, request) -> tuple[ErrorCode, int, int]:
    """(error, producer id, epoch) for InitProducerId carrying a transactional id."""
    service = _service(ctx)
    if not checks.transactional_id(ctx, Operation.WRITE, request.transactional_id):
        return ErrorCode.transactional_id_authorization_failed, -1, -1
    if service is None:
        return ErrorCode.coordinator_not_available, -1, -1
    code, producer_id, epoch = await service.init_producer_id(
        request.transactional_id, _ms(request.transaction_timeout),
        getattr(request, "producer_id", -1), getattr(request, "producer_epoch", -1))
    if code not in (ErrorCode.none, ErrorCode.concurrent_transactions, ErrorCode.coordinator_load_in_progress,
                    ErrorCode.not_coordinator):
        log.info("InitProducerId for %r from %s: %s", request.transactional_id, ctx.client_id, code.name)
    return _fenced(code, INIT_PRODUCER_ID, ctx.api_version), producer_id, epoch


def find_coordinator(ctx: RequestContext, key: str) -> tuple[ErrorCode, str | None, int, str, int]:
    if not checks.transactional_id(ctx, Operation.DESCRIBE, key):
        return ErrorCode.transactional_id_authorization_failed, None, -1, "", -1
    service = _service(ctx)
    if service is None:
        return ErrorCode.coordinator_not_available, "the transaction coordinator is not running", -1, "", -1
    return service.find_coordinator(key, ctx.listener)


# --- AddPartitionsToTxn ------------------------------------------------------------------------------------


async def add_partitions_to_txn(ctx: RequestContext, request):
    module = response_module(ADD_PARTITIONS, ctx.api_version)
    topics = request.v3_and_below_topics
    transactional_id = request.v3_and_below_transactional_id
    requested = [(t.name, p) for t in topics for p in t.partitions]
    per_partition: dict[tuple[str, int], ErrorCode] = {}
    service = _service(ctx)
    if not checks.transactional_id(ctx, Operation.WRITE, transactional_id):
        code = ErrorCode.transactional_id_authorization_failed
    elif service is None:
        code = ErrorCode.coordinator_not_available
    else:
        denied = checks.denied_topics(ctx, Operation.WRITE, (t.name for t in topics))
        for topic, index in requested:
            if topic in denied:
                per_partition[(topic, index)] = ErrorCode.topic_authorization_failed
            else:
                info = ctx.broker.topic(topic)
                if info is None or not 0 <= index < info.partitions:
                    per_partition[(topic, index)] = ErrorCode.unknown_topic_or_partition
        if per_partition:
            code = ErrorCode.operation_not_attempted
        else:
            code = await service.add_partitions(transactional_id, request.v3_and_below_producer_id,
                                                request.v3_and_below_producer_epoch, frozenset(requested))
            code = _fenced(code, ADD_PARTITIONS, ctx.api_version)
    by_topic: dict[str, list] = {}
    for topic, index in requested:
        by_topic.setdefault(topic, []).append(
            module.AddPartitionsToTxnPartitionResult(partition_index=index,
                                                     partition_error_code=per_partition.get((topic, index), code)))
    results = tuple(module.AddPartitionsToTxnTopicResult(name=name, results_by_partition=tuple(parts))
                    for name, parts in by_topic.items())
    return build(module.AddPartitionsToTxnResponse, throttle_time=NO_THROTTLE, results_by_topic_v3_and_below=results)


# --- AddOffsetsToTxn ---------------------------------------------------------------------------------------


async def add_offsets_to_txn(ctx: RequestContext, request):
    module = response_module(ADD_OFFSETS, ctx.api_version)
    service = _service(ctx)
    if not checks.transactional_id(ctx, Operation.WRITE, request.transactional_id):
        code = ErrorCode.transactional_id_authorization_failed
    elif not checks.group(ctx, Operation.READ, request.group_id):
        code = ErrorCode.group_authorization_failed
    elif service is None or ctx.broker.groups is None:
        code = ErrorCode.coordinator_not_available
    else:
        partition = ctx.broker.groups.partition_of(request.group_id)
        code = await service.add_partitions(request.transactional_id, request.producer_id, request.producer_epoch,
                                            frozenset({(OFFSETS_TOPIC, partition)}))
        code = _fenced(code, ADD_OFFSETS, ctx.api_version)
    return build(module.AddOffsetsToTxnResponse, throttle_time=NO_THROTTLE, error_code=code)


# --- EndTxn ------------------------------------------------------------------------------------------------


async def end_txn(ctx: RequestContext, request):
    module = response_module(END_TXN, ctx.api_version)
    service = _service(ctx)
    if not checks.transactional_id(ctx, Operation.WRITE, request.transactional_id):
        code = ErrorCode.transactional_id_authorization_failed
    elif service is None:
        code = ErrorCode.coordinator_not_available
    else:
        code = await service.end_txn(request.transactional_id, request.producer_id, request.producer_epoch,
                                     bool(request.committed))
        if code not in (ErrorCode.none, ErrorCode.concurrent_transactions, ErrorCode.not_coordinator):
            log.info("EndTxn(%s) for %r from %s: %s", "commit" if request.committed else "abort",
                     request.transactional_id, ctx.client_id, code.name)
        code = _fenced(code, END_TXN, ctx.api_version)
    return build(module.EndTxnResponse, throttle_time=NO_THROTTLE, error_code=code)


# --- WriteTxnMarkers ---------------------------------------------------------------------------------------


async def write_txn_markers(ctx: RequestContext, request):
    module = response_module(WRITE_TXN_MARKERS, ctx.api_version)
    allowed = checks.cluster(ctx, Operation.CLUSTER_ACTION)
    service = _service(ctx)
    results = []
    for marker in request.markers:
        topics = []
        for topic in marker.topics:
            partitions = []
            for index in topic.partition_indexes:
                code = ErrorCode.none
                if not allowed:
                    code = ErrorCode.cluster_authorization_failed
                else:
                    try:
                        partition = ctx.broker.replicas.leader(topic.name, index)
                        await service.write_local_marker(partition, marker.producer_id, marker.producer_epoch,
                                                         bool(marker.transaction_result), marker.coordinator_epoch)
                    except Exception as exc:
                        code = error_for(exc)[0]
                partitions.append(module.WritableTxnMarkerPartitionResult(partition_index=index, error_code=code))
            topics.append(module.WritableTxnMarkerTopicResult(name=topic.name, partitions=tuple(partitions)))
        results.append(module.WritableTxnMarkerResult(producer_id=marker.producer_id, topics=tuple(topics)))
    return build(module.WriteTxnMarkersResponse, markers=tuple(results))


# --- TxnOffsetCommit ---------------------------------------------------------------------------------------


async def txn_offset_commit(ctx: RequestContext, request):
    module = response_module(TXN_OFFSET_COMMIT, ctx.api_version)
    groups = ctx.broker.groups
    code = ErrorCode.none
    if not checks.transactional_id(ctx, Operation.WRITE, request.transactional_id):
        code = ErrorCode.transactional_id_authorization_failed
    elif not checks.group(ctx, Operation.READ, request.group_id):
        code = ErrorCode.group_authorization_failed
    elif groups is None:
        code = ErrorCode.coordinator_not_available
    per_partition: dict[tuple[str, int], ErrorCode] = {}
    commits: dict[tuple[str, int], CommittedOffset] = {}
    if code == ErrorCode.none and groups is not None:  # (a missing group service has set the code above)
        denied = checks.denied_topics(ctx, Operation.READ, (t.name for t in request.topics))
        timestamp = now_ms()
        for topic in request.topics:
            for item in topic.partitions:
                key = (topic.name, item.partition_index)
                if topic.name in denied:
                    per_partition[key] = ErrorCode.topic_authorization_failed
                elif item.committed_metadata is not None and len(item.committed_metadata.encode()) > MAX_METADATA_BYTES:
                    per_partition[key] = ErrorCode.offset_metadata_too_large
                else:
                    commits[key] = CommittedOffset(item.committed_offset,
                                                   getattr(item, "committed_leader_epoch", -1),
                                                   item.committed_metadata or "", timestamp)
        # v3 names the consumer's member and generation (KIP-447): a zombie whose consumer a rebalance
        # fenced is refused before anything is written.
        code = groups.validate_txn_commit(group_id=request.group_id,
                                          generation_id=getattr(request, "generation_id", -1),
                                          member_id=getattr(request, "member_id", "") or "",
                                          group_instance_id=getattr(request, "group_instance_id", None))
        if code == ErrorCode.none:
            try:
                await groups.txn_commit_offsets(request.group_id, request.producer_id, request.producer_epoch,
                                                commits)
            except Exception as exc:
                code = _fenced(_commit_error(error_for(exc)[0]), TXN_OFFSET_COMMIT, ctx.api_version)
        elif code not in (ErrorCode.not_coordinator, ErrorCode.coordinator_load_in_progress):
            log.info("TxnOffsetCommit for group %r from %s: %s", request.group_id, ctx.client_id, code.name)
    topics = []
    for topic in request.topics:
        topics.append(module.TxnOffsetCommitResponseTopic(name=topic.name, partitions=tuple(
            module.TxnOffsetCommitResponsePartition(partition_index=item.partition_index,
                                                    error_code=per_partition.get((topic.name, item.partition_index),
                                                                                 code))
            for item in topic.partitions)))
    return build(module.TxnOffsetCommitResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))


def _commit_error(code: ErrorCode) -> ErrorCode:
    """An append error as a TxnOffsetCommit answer (Kafka's ``GroupMetadataManager.storeOffsets``)."""
    if code == ErrorCode.invalid_producer_epoch:
        return ErrorCode.producer_fenced
    if code in (ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error, ErrorCode.fenced_leader_epoch):
        return ErrorCode.not_coordinator
    if code in (ErrorCode.unknown_topic_or_partition, ErrorCode.not_enough_replicas,
                ErrorCode.not_enough_replicas_after_append, ErrorCode.request_timed_out):
        return ErrorCode.coordinator_not_available
    return code


# --- DescribeTransactions, ListTransactions (KIP-664) ------------------------------------------------------


async def describe_transactions(ctx: RequestContext, request):
    module = response_module(DESCRIBE_TRANSACTIONS, ctx.api_version)
    service = _service(ctx)
    states = []
    for transactional_id in request.transactional_ids:
        txn = None
        if not checks.transactional_id(ctx, Operation.DESCRIBE, transactional_id):
            code = ErrorCode.transactional_id_authorization_failed
        elif service is None:
            code = ErrorCode.coordinator_not_available
        else:
            code, txn = service.describe(transactional_id)
        by_topic: dict[str, list[int]] = {}
        for topic, index in sorted(txn.partitions if txn is not None else ()):
            by_topic.setdefault(topic, []).append(index)
        states.append(module.TransactionState(
            error_code=code, transactional_id=transactional_id,
            transaction_state=txn.state.kafka_name if txn is not None else "",
            transaction_timeout=datetime.timedelta(milliseconds=txn.timeout_ms if txn else 0),
            transaction_start_time=_timestamp(txn.start_ms if txn is not None else -1),
            producer_id=txn.producer_id if txn is not None else -1,
            producer_epoch=txn.producer_epoch if txn is not None else -1,
            topics=tuple(module.TopicData(topic=t, partitions=tuple(p)) for t, p in by_topic.items())))
    return build(module.DescribeTransactionsResponse, throttle_time=NO_THROTTLE, transaction_states=tuple(states))


def _timestamp(ms: int):
    """kio writes datetimes as epoch milliseconds; -1 ("no transaction started", as Kafka sends) is the
    instant one millisecond before the epoch."""
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


async def list_transactions(ctx: RequestContext, request):
    module = response_module(LIST_TRANSACTIONS, ctx.api_version)

    service = _service(ctx)
    known = {state.kafka_name for state in TxnState}
    unknown = tuple(f for f in request.state_filters if f not in known)
    wanted_states = set(request.state_filters) - set(unknown)
    wanted_ids = set(request.producer_id_filters)
    listed = []
    code = ErrorCode.none if service is not None else ErrorCode.coordinator_not_available
    for txn in (service.list_transactions() if service is not None else ()):
        if request.state_filters and txn.state.kafka_name not in wanted_states:
            continue
        if wanted_ids and txn.producer_id not in wanted_ids:
            continue
        if not checks.transactional_id(ctx, Operation.DESCRIBE, txn.transactional_id):
            continue
        listed.append(module.TransactionState(transactional_id=txn.transactional_id,
                                              producer_id=txn.producer_id,
                                              transaction_state=txn.state.kafka_name))
    return build(module.ListTransactionsResponse, throttle_time=NO_THROTTLE, error_code=code,
                 unknown_state_filters=unknown, transaction_states=tuple(listed))


HANDLERS = {
    DESCRIBE_TRANSACTIONS: (0, 0, describe_transactions),
    LIST_TRANSACTIONS: (0, 0, list_transactions),
    ADD_PARTITIONS: (0, 3, add_partitions_to_txn),
    ADD_OFFSETS: (0, 3, add_offsets_to_txn),
    END_TXN: (0, 3, end_txn),
    WRITE_TXN_MARKERS: (1, 1, write_txn_markers),
    TXN_OFFSET_COMMIT: (0, 3, txn_offset_commit),
}
