"""Produce (0) v3-8 (advertised 0-8): validate each partition's batch, check idempotence, append as-is.

Validation is Kafka's header-only pass (``UnifiedLog.analyzeAndValidateRecords``,
``LogValidator.validateBatch``, ``ProduceRequest.validateRecords``), trap T10 in the protocol notes:

    exactly one batch per partition, magic 2 ........................ INVALID_RECORD (87)
    framing / CRC-32C .................................................. CORRUPT_MESSAGE (2)
    lastOffsetDelta + 1 == recordsCount > 0, baseOffset 0,
    no control batches, producerId >= 0 => baseSequence >= 0 ............ INVALID_RECORD (87)
    transactional batch without the request's transactional id ......... INVALID_RECORD (87)
    transactional batch outside its Ongoing transaction ................ INVALID_TXN_STATE (48), or
                                                                          INVALID_PRODUCER_EPOCH (47)
    batch size <= the topic's max.message.bytes ........................ MESSAGE_TOO_LARGE (10)
    batch size <= the topic's segment.bytes ............................. RECORD_LIST_TOO_LARGE (18)
    zstd only from Produce v7 ........................................... UNSUPPORTED_COMPRESSION_TYPE (76)
    acks in {-1, 0, 1} .................................................. INVALID_REQUIRED_ACKS (21)
    unknown topic or partition (never auto-created) .................... UNKNOWN_TOPIC_OR_PARTITION (3)
    this broker does not lead the partition ............................ NOT_LEADER_OR_FOLLOWER (6)
    acks=all and the ISR below min.insync.replicas ..................... NOT_ENOUGH_REPLICAS (19)
    disk full / I/O error on append .................................... KAFKA_STORAGE_ERROR (56)

Records are never decoded or recompressed: the batch bytes go to ``Partition.append_as_leader``, whose log
rewrites baseOffset and partitionLeaderEpoch in place (and maxTimestamp + CRC for LogAppendTime topics).

acks: 0 writes no response at all, and any error closes the connection (``KafkaApis`` does the same, so the
producer notices); 1 answers after the leader's append; -1 (all) answers once the partition's high
watermark passes the batch (every in-sync replica has it; on a single node at once), with
NOT_ENOUGH_REPLICAS_AFTER_APPEND (20), REQUEST_TIMED_OUT (7) or NOT_LEADER_OR_FOLLOWER as Kafka answers, and
under the ``sync`` flush mode also after the fdatasync that covers it (group commit).

Two kinds of batch are rewritten before the append instead (``broker.record_conversion``), as Kafka 3.9
does: a v0/v1 MessageSet, which Produce v0-2 may carry, becomes one v2 batch; and a batch whose codec differs
from the topic's ``compression.type`` (other than ``producer``) is recompressed. Both are counted in
``produce_rewritten_batches``. Produce v0-2 are served, not only advertised: librdkafka < 2.11.1 needs
Produce v0 in the advertised range to compress at all (KAFKA-18659), and it and kcat send v0-2 when told
``broker.version.fallback`` < 0.10 (docs/record-conversion.md says why converting beats not advertising).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from kio.schema.errors import ErrorCode

from copyless.broker.errors import BrokerError, RequestTimedOut, error_for
from copyless.broker.handlers.context import CloseConnection, EncodedResponse, RequestContext
from copyless.broker.record_conversion import convert_message_set, is_message_set, recompress_batch, target_codec
from copyless.broker.security import checks
from copyless.broker.security.checks import Operation
from copyless.broker.storage.compaction import first_keyless_offset_delta
from copyless.broker.wire.produce_response import encode_produce_response
from copyless.protocol.records import (
    CODEC_ZSTD,
    NO_PRODUCER_ID,
    BatchHeader,
    InvalidBatchError,
    read_header,
    validate_batch,
)

log = logging.getLogger("copyless.produce")

API_KEY = 0
MIN_VERSION, MAX_VERSION = 0, 8
_MAX_CODEC = CODEC_ZSTD


class ProduceError(BrokerError):
    """A produce-path check failed; ``code`` is what the client gets."""


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
        raise ProduceError(ErrorCode.invalid_record,
                           f"The baseOffset of the record batch must be 0, not {header.base_offset}")
    if header.is_control:
        raise ProduceError(ErrorCode.invalid_record, "Clients may not send control batches")
    if header.producer_id != NO_PRODUCER_ID and header.base_sequence < 0:
        raise ProduceError(
            ErrorCode.invalid_record,
            f"Invalid sequence number {header.base_sequence} for producer {header.producer_id}",
        )
    if header.codec > _MAX_CODEC:
        raise ProduceError(ErrorCode.corrupt_message, f"Unknown compression codec id {header.codec}")
    if header.codec == CODEC_ZSTD and api_version < 7:
        raise ProduceError(
            ErrorCode.unsupported_compression_type, "Produce requests with zstd compression need version 7 or later"
        )
    return header


def check_keys(records, header: BatchHeader, topic: str, partition: int) -> None:
    """A compacted topic takes only records with a key (Kafka's LogValidator, INVALID_RECORD since KIP-467).
    Decodes (and decompresses) the batch: the cost Kafka pays there too. Raises ProduceError."""
    try:
        delta = first_keyless_offset_delta(records, header)
    except InvalidBatchError as exc:
        raise ProduceError(ErrorCode.corrupt_message, f"Invalid record batch: {exc}") from None
    if delta is not None:
        raise ProduceError(ErrorCode.invalid_record, f"Compacted topic cannot accept message without key in topic "
                           f"partition {topic}-{partition} (record {delta} of the batch).")


async def _check_transactional(broker, transactional_id, header: BatchHeader, partition) -> None:
    """A transactional batch needs the request's transactional id, and, where this broker coordinates that
    id, an Ongoing transaction of the same producer and epoch that holds the partition (Kafka 3.9's
    partition verification: a stray batch would open a transaction no marker closes, holding the last
    stable offset back for good). Then the partition is made transactional (``ensure_transactional``).
    Raises ProduceError."""
    if transactional_id is None:
        raise ProduceError(ErrorCode.invalid_record, "Transactional batches need the request's transactional id")
    service = getattr(broker, "transactions", None)
    if service is not None:
        code = service.verify(transactional_id, header.producer_id, header.producer_epoch, partition.topic,
                              partition.partition)
        if code != ErrorCode.none:
            raise ProduceError(code, f"The batch of producer {header.producer_id} (epoch {header.producer_epoch}) is "
                                     f"not part of an ongoing transaction of {transactional_id!r} holding "
                                     f"{partition.topic}-{partition.partition}")
    await partition.ensure_transactional()


async def handle(ctx: RequestContext, request):
    broker = ctx.broker
    version = ctx.api_version
    acks = request.acks
    stats = broker.stats
    results: list[tuple[str, list]] = []  # topic -> [(partition, code, base_offset, log_append_ms, log_start, message)]
    waits: list = []  # (entry, partition, required offset): acks=all, and the sync flush mode
    first_error: str | None = None
    denied = checks.denied_topics(ctx, Operation.WRITE, (t.name for t in request.topic_data))
    txn_allowed = request.transactional_id is None or checks.transactional_id(ctx, Operation.WRITE,
                                                                              request.transactional_id)

    for topic_data in request.topic_data:
        name = topic_data.name
        partition_results: list[list[Any]] = []
        results.append((name, partition_results))
        for partition_data in topic_data.partition_data:
            index = partition_data.index
            code, message, base_offset, append_ms, log_start = ErrorCode.none, None, -1, -1, -1
            required = None
            try:
                if acks not in (-1, 0, 1):
                    raise ProduceError(ErrorCode.invalid_required_acks, f"Invalid required acks {acks}")
                if name in denied:
                    raise ProduceError(ErrorCode.topic_authorization_failed, f"Not authorized to write to topic {name}")
                if request.transactional_id is not None and not txn_allowed:
                    raise ProduceError(ErrorCode.transactional_id_authorization_failed,
                                       f"Not authorized to write as transactional id {request.transactional_id}")
                partition = broker.replicas.leader(name, index)
                config = partition.config
                records = partition_data.records
                rewritten = False
                if version < 3 and records is not None and is_message_set(records):
                    # In the producer's codec: compression.type applies below, as to any v2 batch.
                    records = convert_message_set(records, codec=None)
                    rewritten = True
                header = validate_produce_records(records, api_version=version,
                                                  max_message_bytes=config.max_message_bytes)
                codec = target_codec(config.compression_type, header.codec)
                if codec is not None:
                    records = recompress_batch(records, header, codec)
                    header = read_header(records)
                    rewritten = True
                    if header.size > config.max_message_bytes:
                        raise ProduceError(
                            ErrorCode.message_too_large,
                            f"The record batch size {header.size} after recompression exceeds the topic's "
                            f"max.message.bytes {config.max_message_bytes}")
                if config.compact:
                    check_keys(records, header, name, index)
                if header.size > config.segment_bytes:
                    # A batch never straddles segments (Kafka: RecordBatchTooLargeException).
                    raise ProduceError(
                        ErrorCode.record_list_too_large,
                        f"The record batch size {header.size} exceeds the topic's segment.bytes {config.segment_bytes}",
                    )
                if header.is_transactional:
                    await _check_transactional(broker, request.transactional_id, header, partition)
                append_time = int(time.time() * 1000) if config.message_timestamp_type == "LogAppendTime" else None
                info = await partition.append_as_leader(records, header, acks=acks, log_append_time_ms=append_time)
                base_offset, log_start = info.base_offset, info.log_start_offset
                append_ms = info.log_append_time_ms
                if info.duplicate:
                    stats.produce_duplicates += 1
                else:
                    stats.produce_batches += 1
                    stats.produce_rewritten_batches += rewritten
                    stats.produce_records += header.records_count
                    stats.produce_bytes += header.size
                    stats.topic_bytes_in[name] += len(partition_data.records)
                if acks == -1:
                    # A retry of an acknowledged batch waits too: the original may not be replicated yet.
                    required = (partition, info.last_offset + 1, info.leader_epoch)
            except Exception as exc:
                code, message = error_for(exc)
                stats.produce_errors += 1
                stats.request_errors[(API_KEY, int(code))] += 1
                if first_error is None:
                    first_error = f"{name}-{index}: {code.name}: {message}"
            entry = [index, int(code), base_offset, append_ms, log_start, message]
            partition_results.append(entry)
            if required is not None:
                waits.append((entry, *required))

    # acks=all: each partition's write completes once its high watermark passes the batch (the ISR has it),
    # and, under the sync flush mode, once an fdatasync covers it (group commit). The request's timeout
    # bounds the wait, as Kafka's DelayedProduce does (REQUEST_TIMED_OUT; the batch stays appended and a retry
    # is deduplicated for idempotent producers).
    if waits:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(request.timeout.total_seconds(), 0.0)
        for entry, partition, required_offset, leader_epoch in waits:
            try:
                await partition.wait_replicated(required_offset, deadline - loop.time(), leader_epoch)
                if partition.config.flush_mode == "sync":
                    await _wait_flushed(partition, required_offset, deadline - loop.time())
            except Exception as exc:
                code, message = error_for(exc)
                entry[1], entry[5] = int(code), message
                stats.produce_errors += 1
                stats.request_errors[(API_KEY, int(code))] += 1
                if first_error is None:
                    first_error = f"partition {entry[0]}: {code.name}: {message}"

    if acks == 0:
        if first_error is not None:
            raise CloseConnection(f"acks=0 produce failed ({first_error}); closing so the producer notices")
        return None
    if first_error is not None:
        log.info("produce from %s (%s) rejected: %s", ctx.client_id, ctx.client_host, first_error)

    encoded = encode_produce_response(version, ctx.correlation_id, results)
    return EncodedResponse([encoded])


async def _wait_flushed(partition, required_offset: int, timeout_s: float) -> None:
    """The sync flush mode: wait for the fdatasync that covers ``required_offset``. Raises RequestTimedOut,
    or the StorageError of a failed fdatasync (the batch is not durable)."""
    future = partition.log.wait_flushed(required_offset)
    if future.done():
        future.result()
        return
    try:
        # asyncio.timeout, not wait_for, which on 3.11 drops a cancellation (shutdown) that arrives in the
        # same step as the flush.
        async with asyncio.timeout(max(timeout_s, 0.0)):
            await asyncio.shield(asyncio.wrap_future(future))
    except TimeoutError:
        raise RequestTimedOut("Timed out waiting for the flush") from None


HANDLERS = {API_KEY: (MIN_VERSION, MAX_VERSION, handle)}
