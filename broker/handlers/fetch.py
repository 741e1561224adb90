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
- unknown partition -> UNKNOWN_TOPIC_OR_PARTITION (3); offset outside [log_start, LEO] ->
  OFFSET_OUT_OF_RANGE (1) with the log's bounds, and clients reset per ``auto.offset.reset``;
  ``current_leader_epoch`` (v9+) above 0 -> UNKNOWN_LEADER_EPOCH (75);
- ``session_id`` is always 0 (no fetch sessions): kafka-python's "create session" request gets a full
  response and it stays on full fetches.

The records are never read into Python: ``PartitionLog.read`` returns a pinned FileSlice and
``encode_fetch_response`` places it between the encoded fields; the shell sends it with sendfile and
releases it.
"""

from __future__ import annotations

import asyncio
import time

from kio.schema.errors import ErrorCode

from copyless.broker.handlers.context import EncodedResponse, RequestContext
from copyless.broker.state import LEADER_EPOCH
from copyless.broker.wire.fetch_response import MAX_VERSION, MIN_VERSION, FetchPartitionResult, encode_fetch_response

API_KEY = 1


def _storage():
    import copyless.broker.storage as storage

    return storage


def read_partitions(broker, request, response_max_bytes: int):
    """One pass over the requested partitions. Loop thread.

    Returns:
        (topics, total_record_bytes, has_error) where topics is [(name, [FetchPartitionResult])].
    """
    storage = _storage()
    topics = []
    remaining = response_max_bytes
    min_one_message = True
    total = 0
    has_error = False
    for fetch_topic in request.topics:
        name = fetch_topic.topic
        results = []
        topics.append((name, results))
        for fetch_partition in fetch_topic.partitions:
            partition = fetch_partition.partition
            result = FetchPartitionResult(partition)
            results.append(result)
            partition_log = broker.get_log(name, partition)
            if partition_log is None:
                result.error_code = ErrorCode.unknown_topic_or_partition
                has_error = True
                continue
            if getattr(fetch_partition, "current_leader_epoch", -1) > LEADER_EPOCH:
                result.error_code = ErrorCode.unknown_leader_epoch
                has_error = True
                continue
            offset = fetch_partition.fetch_offset
            limit = max(0, min(fetch_partition.partition_max_bytes, remaining))
            try:
                if limit == 0 and not min_one_message:
                    # Budget spent: report positions only, but still check the offset as Kafka does.
                    start, end = partition_log.log_start_offset, partition_log.log_end_offset
                    if not start <= offset <= end:
                        raise storage.OffsetOutOfRangeError(offset, start, end)
                    result.high_watermark = partition_log.high_watermark
                    result.log_start_offset = start
                else:
                    read = partition_log.read(offset, limit, min_one_message=min_one_message)
                    result.high_watermark = read.high_watermark
                    result.log_start_offset = read.log_start_offset
                    if read.slice is not None and read.slice.length > 0:
                        result.records = read.slice
                        size = read.slice.length
                        total += size
                        remaining -= size
                        min_one_message = False
                    elif read.slice is not None:
                        read.slice.release()
            except storage.OffsetOutOfRangeError:
                result.error_code = ErrorCode.offset_out_of_range
                result.high_watermark = partition_log.high_watermark
                result.log_start_offset = partition_log.log_start_offset
                has_error = True
            except storage.StorageError:
                result.error_code = ErrorCode.kafka_storage_error
                has_error = True
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
    keys = [(t.topic, p.partition) for t in request.topics for p in t.partitions]
    deadline = loop.time() + max_wait_s
    while True:
        started = time.perf_counter()
        topics, total, has_error = read_partitions(broker, request, response_max_bytes)
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
    broker.stats.fetch_responses += 1
    if total:
        # The last pass's lookups, reads and encoding; a long poll's parked time is not in it.
        broker.stats.fetch_prepare.record(time.perf_counter() - started)
    return EncodedResponse(segments)


HANDLERS = {API_KEY: (MIN_VERSION, MAX_VERSION, handle)}
