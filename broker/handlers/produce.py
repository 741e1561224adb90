"""Produce (0) v3-8 (advertised 0-8): validate each partition's batch, check idempotence, append as-is.

Validation is Kafka's header-only pass (``UnifiedLog.analyzeAndValidateRecords``,
``LogValidator.validateBatch``, ``ProduceRequest.validateRecords``), trap T10 in the protocol notes:

    exactly one batch per partition, magic 2 ........................ INVALID_RECORD (87)
    framing / CRC-32C .................................................. CORRUPT_MESSAGE (2)
    lastOffsetDelta + 1 == recordsCount > 0, baseOffset 0,
    no control batches, producerId >= 0 => baseSequence >= 0 ............ INVALID_RECORD (87)
    batch size <= the topic's max.message.bytes ........................ MESSAGE_TOO_LARGE (10)
    batch size <= the topic's segment.bytes ............................. RECORD_LIST_TOO_LARGE (18)
    zstd only from Produce v7 ........................................... UNSUPPORTED_COMPRESSION_TYPE (76)
    acks in {-1, 0, 1} .................................................. INVALID_REQUIRED_ACKS (21)
    unknown topic or partition (never auto-created) .................... UNKNOWN_TOPIC_OR_PARTITION (3)
    disk full / I/O error on append .................................... KAFKA_STORAGE_ERROR (56)

Records are never decoded or recompressed: the batch bytes go to ``PartitionLog.append``, which rewrites
baseOffset and partitionLeaderEpoch in place (and maxTimestamp + CRC for LogAppendTime topics).

acks: 0 writes no response at all, and any error closes the connection (``KafkaApis`` does the same, so the
producer notices); 1 answers after the append; -1 (all) on a single node is the same as 1, except under
the ``sync`` flush mode where it also waits for the fdatasync that covers the batch (group commit).

Produce v0-2 (message format v0/v1) are advertised only for librdkafka < 2.11.1 (KAFKA-18659, trap T1) and
closed on arrival by the request decoder, as Kafka 4 does.
"""

from __future__ import annotations

import asyncio
import logging
import time

from kio.schema.errors import ErrorCode

from copyless.broker.handlers.context import CloseConnection, EncodedResponse, RequestContext
from copyless.broker.state import LEADER_EPOCH
from copyless.broker.wire.produce_response import encode_produce_response
from copyless.client.protocol.records import (
    CODEC_ZSTD,
    NO_PRODUCER_ID,
    BatchHeader,
    InvalidBatchError,
    validate_batch,
)

log = logging.getLogger("copyless.produce")

API_KEY = 0
MIN_VERSION, MAX_VERSION = 0, 8
_MAX_CODEC = CODEC_ZSTD


class ProduceError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_CORRUPT_REASONS = frozenset({"truncated header", "bad length", "truncated batch", "bad crc"})


def validate_produce_records(records, *, api_version: int, max_message_bytes: int) -> BatchHeader:
    """Kafka's produce-path checks on one partition's records blob. Pure.

    Returns:
        The header of the single batch.

    Raises:
        ProduceError: with the error code the client expects.
    """
    if records is None or len(records) == 0:
        raise ProduceError(ErrorCode.invalid_record, "Produce requests must contain exactly one record batch")
    try:
        header = validate_batch(records, 0)
    except InvalidBatchError as exc:
        if exc.reason == "bad magic":
            raise ProduceError(
                ErrorCode.invalid_record, f"Produce requests with version {api_version} must use record batch magic 2"
            ) from None
        code = ErrorCode.corrupt_message if exc.reason in _CORRUPT_REASONS else ErrorCode.invalid_record
        raise ProduceError(code, f"Invalid record batch: {exc}") from None
    if header.size != len(records):
        raise ProduceError(
            ErrorCode.invalid_record,
            f"Produce requests with version {api_version} are only allowed to contain exactly one record batch",
        )
    if header.size > max_message_bytes:
        raise ProduceError(
            ErrorCode.message_too_large,
            f"The record batch size {header.size} exceeds the topic's max.message.bytes {max_message_bytes}",
        )
    if header.base_offset != 0:
        raise ProduceError(ErrorCode.invalid_record, f"The baseOffset of the record batch must be 0, not {header.base_offset}")
    if header.is_control:
        raise ProduceError(ErrorCode.invalid_record, "Clients may not send control batches")
    if header.producer_id != NO_PRODUCER_ID and header.base_sequence < 0:
        raise ProduceError(
            ErrorCode.invalid_record, f"Invalid sequence number {header.base_sequence} for producer {header.producer_id}"
        )
    if header.codec > _MAX_CODEC:
        raise ProduceError(ErrorCode.corrupt_message, f"Unknown compression codec id {header.codec}")
    if header.codec == CODEC_ZSTD and api_version < 7:
        raise ProduceError(
            ErrorCode.unsupported_compression_type, "Produce requests with zstd compression need version 7 or later"
        )
    if header.is_transactional:
        raise ProduceError(ErrorCode.invalid_record, "Transactional batches are not supported by this broker")
    return header


async def handle(ctx: RequestContext, request):
    broker = ctx.broker
    version = ctx.api_version
    acks = request.acks
    stats = broker.stats
    results: list[tuple[str, list]] = []  # topic -> [(partition, code, base_offset, log_append_ms, log_start, message)]
    flush_waits: list = []
    first_error: str | None = None

    for topic_data in request.topic_data:
        name = topic_data.name
        partition_results = []
        results.append((name, partition_results))
        topic = broker.topics.get(name)
        for partition_data in topic_data.partition_data:
            partition = partition_data.index
            code, message, base_offset, append_ms, log_start = ErrorCode.none, None, -1, -1, -1
            flush_future = None
            try:
                if acks not in (-1, 0, 1):
                    raise ProduceError(ErrorCode.invalid_required_acks, f"Invalid required acks {acks}")
                if request.transactional_id is not None:
                    raise ProduceError(
                        ErrorCode.transactional_id_authorization_failed, "Transactions are not supported by this broker"
                    )
                partition_log = broker.get_log(name, partition) if topic is not None else None
                if partition_log is None:
                    raise ProduceError(
                        ErrorCode.unknown_topic_or_partition, "This server does not host this topic-partition."
                    )
                config = partition_log.config
                header = validate_produce_records(
                    partition_data.records, api_version=version, max_message_bytes=config.max_message_bytes
                )
                if header.size > config.segment_bytes:
                    # A batch never straddles segments (Kafka: RecordBatchTooLargeException).
                    raise ProduceError(
                        ErrorCode.record_list_too_large,
                        f"The record batch size {header.size} exceeds the topic's segment.bytes {config.segment_bytes}",
                    )
                check = broker.producers.check(name, partition, header)
                if check.error != ErrorCode.none:
                    raise ProduceError(check.error, check.message or check.error.name)
                if check.duplicate_of is not None:
                    # A retry of an acknowledged batch: same answer, nothing appended.
                    base_offset = check.duplicate_of.first_offset
                    log_start = partition_log.log_start_offset
                    stats.produce_duplicates += 1
                    if acks == -1 and config.flush_mode == "sync":
                        # The original may still be waiting for its fdatasync: ack the retry no earlier.
                        flush_future = partition_log.wait_flushed(check.duplicate_of.last_offset + 1)
                else:
                    append_time = int(time.time() * 1000) if config.message_timestamp_type == "LogAppendTime" else None
                    try:
                        result = partition_log.append(
                            partition_data.records, leader_epoch=LEADER_EPOCH, log_append_time_ms=append_time
                        )
                    except _storage_error() as exc:
                        raise ProduceError(ErrorCode.kafka_storage_error, f"Append failed: {exc}") from None
                    broker.producers.update(name, partition, header, result.base_offset)
                    broker.appends.notify((name, partition))
                    base_offset = result.base_offset
                    append_ms = result.log_append_time_ms if result.log_append_time_ms is not None else -1
                    log_start = result.log_start_offset
                    stats.produce_batches += 1
                    stats.produce_records += header.records_count
                    stats.produce_bytes += header.size
                    if acks == -1 and config.flush_mode == "sync":
                        flush_future = partition_log.wait_flushed(result.last_offset + 1)
            except ProduceError as exc:
                code, message = exc.code, exc.message
                stats.produce_errors += 1
                if first_error is None:
                    first_error = f"{name}-{partition}: {exc.code.name}: {exc.message}"
            entry = [partition, int(code), base_offset, append_ms, log_start, message]
            partition_results.append(entry)
            if flush_future is not None:
                flush_waits.append((entry, flush_future))

    # acks=all under the sync flush mode: one fdatasync per partition covers every batch it reaches. The
    # request's timeout bounds the wait, as Kafka's DelayedProduce does (REQUEST_TIMED_OUT; the batch stays
    # appended and a retry is deduplicated for idempotent producers).
    deadline = asyncio.get_running_loop().time() + max(request.timeout.total_seconds(), 0.0)
    for entry, future in flush_waits:
        try:
            if future.done():
                future.result()
            else:
                remaining_s = max(deadline - asyncio.get_running_loop().time(), 0.0)
                # asyncio.timeout, not wait_for, which on 3.11 drops a cancellation (shutdown) that
                # arrives in the same step as the flush.
                async with asyncio.timeout(remaining_s):
                    await asyncio.shield(asyncio.wrap_future(future))
        except TimeoutError:
            entry[1], entry[5] = int(ErrorCode.request_timed_out), "Timed out waiting for the flush"
            if first_error is None:
                first_error = f"partition {entry[0]}: flush not done within the request timeout"
        except Exception as exc:  # the fdatasync failed: the batch is not durable
            entry[1], entry[5] = int(ErrorCode.kafka_storage_error), f"Flush failed: {exc}"
            if first_error is None:
                first_error = f"partition {entry[0]}: flush failed: {exc}"

    if acks == 0:
        if first_error is not None:
            raise CloseConnection(f"acks=0 produce failed ({first_error}); closing so the producer notices")
        return None
    if first_error is not None:
        log.info("produce from %s (%s) rejected: %s", ctx.client_id, ctx.client_host, first_error)

    encoded = encode_produce_response(version, ctx.correlation_id, results)
    return EncodedResponse([encoded])


def _storage_error():
    import copyless.broker.storage as storage

    return storage.StorageError


HANDLERS = {API_KEY: (MIN_VERSION, MAX_VERSION, handle)}
