"""Fetch (1) v4-11: long poll, Kafka's byte limits, and a response whose records are FileSlices.

Per request (``ReplicaManager.fetchMessages`` / ``readFromLog``, KIP-74):

- partitions are read in request order, each with ``min(partition_max_bytes, bytes left in the response)``;
  the response budget is ``min(max_bytes, fetch.max.bytes)``;
- until some partition has returned records, the first batch of the next one is returned whole even if it
  is larger than both limits (``min_one_message``), so a consumer never stalls on a big batch (trap T9);
  after that the limits are hard and a batch that does not fit is left for the next fetch;
- a region ends on a batch boundary (``PartitionLog.read``), where Kafka cuts at the byte limit and the
  client drops the partial trailing batch and downloads it again with its next fetch;
- the answer waits until ``min_bytes`` of records are available or ``max_wait_ms`` passes, woken by appends
  through ``broker.appends`` (no polling); any partition error answers at once;
- unknown partition -> UNKNOWN_TOPIC_OR_PARTITION (3); a partition this broker does not lead ->
  NOT_LEADER_OR_FOLLOWER (6); ``current_leader_epoch`` (v9+) older than the leader's -> FENCED_LEADER_EPOCH
  (74), newer -> UNKNOWN_LEADER_EPOCH (75) (KIP-320); offset outside [log_start, LEO] -> OFFSET_OUT_OF_RANGE
  (1) with the log's bounds, and clients reset per ``auto.offset.reset``;
- a consumer reads below the high watermark; a follower (``replica_id`` >= 0) reads up to the log end, and
  its fetch offset tells the leader its log end offset (which moves the ISR and the high watermark). A
  consumer's long poll wakes when the high watermark moves, a follower's when the log end does;
- authorization (``broker.security.checks``): a consumer needs Read on each topic, a follower ClusterAction
  on the cluster (``replica_id`` is not taken on trust); a refused topic answers TOPIC_AUTHORIZATION_FAILED
  (29) without being read or moving any follower state;
- ``isolation_level`` 1 (read_committed, KIP-98): the consumer reads below the partition's last stable
  offset (its first open transaction, or the high watermark), and the response carries the aborted
  transactions (producer id, first offset) that begin below the end of the records sent (the LSO, or
  Kafka's ``fetchUpperBoundOffset``: the first indexed offset past them) and end at or after the fetch
  offset, so the client drops their records; the records still go out by sendfile. The response's
  ``last_stable_offset`` is the LSO for every consumer (librdkafka computes read_committed lag from it);
- ``session_id`` is always 0 (no fetch sessions): kafka-python's "create session" request gets a full
  response and it stays on full fetches.

The records are never read into Python, for consumers and followers alike: the partition's read returns a
pinned FileSlice and ``encode_fetch_response`` places it between the encoded fields; the shell sends it
with sendfile and releases it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kio.schema.errors import ErrorCode

from copyless.broker.cluster.backend import replica_epoch_of
from copyless.broker.errors import BrokerError, error_for
from copyless.broker.handlers.context import EncodedResponse, RequestContext
from copyless.broker.security import checks
from copyless.broker.security.checks import Operation
from copyless.broker.storage.errors import OffsetOutOfRangeError
from copyless.broker.wire.fetch_response import MAX_VERSION, MIN_VERSION, FetchPartitionResult, encode_fetch_response

API_KEY = 1
READ_COMMITTED = 1


def read_partitions(broker, request, response_max_bytes: int, replica_epoch: int = -1,
                    denied: frozenset = frozenset()):
    """One pass over the requested partitions. Loop thread. ``denied``: topics answered
    TOPIC_AUTHORIZATION_FAILED without being read.

    A follower's fetch (``replica_id`` >= 0) reads up to the log end and first records the fetch offset as
    that follower's log end offset; a consumer's reads below the high watermark. ``replica_epoch`` is the
    broker epoch a follower's fetch names (its client id), under which it may join an ISR.

    Returns:
        (topics, total_record_bytes, has_error) where topics is [(name, [FetchPartitionResult])].
    """
    replicas = broker.replicas
    replica_id = getattr(request, "replica_id", -1)
    read_committed = replica_id < 0 and getattr(request, "isolation_level", 0) == READ_COMMITTED
    topics = []
    remaining = response_max_bytes
    min_one_message = True
    total = 0
    has_error = False
    for fetch_topic in request.topics:
        name = fetch_topic.topic
        results: list[FetchPartitionResult] = []
        topics.append((name, results))
        for fetch_partition in fetch_topic.partitions:
            result = FetchPartitionResult(fetch_partition.partition)
            results.append(result)
            partition = None
            offset = fetch_partition.fetch_offset
            try:
                if name in denied:
                    raise BrokerError(ErrorCode.topic_authorization_failed, "Not authorized")
                partition = replicas.leader(name, fetch_partition.partition,
                                            getattr(fetch_partition, "current_leader_epoch", -1))
                limit = max(0, min(fetch_partition.partition_max_bytes, remaining))
                if replica_id >= 0:
                    read = partition.read_for_follower(replica_id, offset, limit, min_one_message=min_one_message)
                    replicas.after_follower_fetch(partition, replica_id, replica_epoch)
                elif limit == 0 and not min_one_message:
                    # Budget spent: report positions only, but still check the offset as Kafka does.
                    start, end = partition.log_start_offset, partition.log_end_offset
                    if not start <= offset <= end:
                        raise OffsetOutOfRangeError(offset, start, end)
                    read = None
                elif read_committed:
                    read = partition.read_committed(offset, limit, min_one_message=min_one_message)
                    if read.slice is not None and read.slice.length > 0:
                        aborted = partition.aborted_transactions(offset, partition.last_stable_offset, read.slice)
                        result.aborted = [(a.producer_id, a.first_offset) for a in aborted]
                else:
                    read = partition.read_for_consumer(offset, limit, min_one_message=min_one_message)
                result.high_watermark = partition.high_watermark
                result.last_stable_offset = partition.last_stable_offset
                result.log_start_offset = partition.log_start_offset
                if read is not None and read.slice is not None:
                    if read.slice.length > 0:
                        result.records = read.slice
                        size = read.slice.length
                        total += size
                        remaining -= size
                        min_one_message = False
                    else:
                        read.slice.release()
            except Exception as exc:
                result.error_code, _message = error_for(exc)
                if partition is not None and result.error_code == ErrorCode.offset_out_of_range:
                    result.high_watermark = partition.high_watermark
                    result.log_start_offset = partition.log_start_offset
                has_error = True
            if result.last_stable_offset < 0:
                result.last_stable_offset = result.high_watermark
    return topics, total, has_error


def release_all(topics) -> None:
    for _name, results in topics:
        for result in results:
            if result.records is not None and hasattr(result.records, "release"):
                result.records.release()
                result.records = None


async def handle(ctx: RequestContext, request):
    broker = ctx.broker
    loop = asyncio.get_running_loop()
    max_wait_s = max(request.max_wait.total_seconds(), 0.0)
    min_bytes = request.min_bytes
    response_max_bytes = max(0, min(request.max_bytes, broker.config.fetch_max_bytes))
    # A follower must hold ClusterAction (replica_id is not taken on trust); a consumer, Read on each topic.
    if getattr(request, "replica_id", -1) >= 0 and not checks.cluster(ctx, Operation.CLUSTER_ACTION):
        denied = frozenset(t.topic for t in request.topics)
    else:
        denied = checks.denied_topics(ctx, Operation.READ, (t.topic for t in request.topics))
    # Consumers wait for a partition's high watermark to move; followers for its log end.
    if getattr(request, "replica_id", -1) >= 0:
        keys: list[tuple[Any, ...]] = [(t.topic, p.partition, "log_end") for t in request.topics for p in t.partitions]
    else:
        keys = [(t.topic, p.partition) for t in request.topics for p in t.partitions]
    replica_epoch = replica_epoch_of(ctx.client_id)
    deadline = loop.time() + max_wait_s
    while True:
        started = time.perf_counter()
        topics, total, has_error = read_partitions(broker, request, response_max_bytes, replica_epoch, denied)
        remaining_s = deadline - loop.time()
        if total >= min_bytes or has_error or remaining_s <= 0 or broker.closing or not keys:
            break
        # Not enough yet: give the slices back and park until an append on one of these partitions.
        release_all(topics)
        await broker.appends.wait(keys, remaining_s)
    try:
        segments = encode_fetch_response(ctx.api_version, ctx.correlation_id, topics)
    except BaseException:
        release_all(topics)
        raise
    stats = broker.stats
    stats.fetch_responses += 1
    if has_error or (total and getattr(request, "replica_id", -1) < 0):
        # Per topic bytes out (consumers only: followers' bytes are the replica counters) and errors by code.
        for name, results in topics:
            for result in results:
                if result.error_code:
                    stats.request_errors[(API_KEY, int(result.error_code))] += 1
                elif result.records is not None and getattr(request, "replica_id", -1) < 0:
                    stats.topic_bytes_out[name] += result.records_bytes
    if total:
        # The last pass's lookups, reads and encoding; a long poll's parked time is not in it.
        stats.fetch_prepare.record(time.perf_counter() - started)
    return EncodedResponse(segments, replica=getattr(request, "replica_id", -1) >= 0)


HANDLERS = {API_KEY: (MIN_VERSION, MAX_VERSION, handle)}
