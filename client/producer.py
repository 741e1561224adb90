"""The asyncio producer: per-partition batching, idempotent retries, gathered writes, back-pressure.

Owns the producer's public API and its sender task. The pieces it drives:
- ``BatchBuilder`` (pure) encodes records into a batch whose large values stay separate buffers;
- the accumulator here keeps one deque of batches per partition (Kafka ``RecordAccumulator``);
- the sender task drains ready batches - full, or older than ``linger_ms``, or flushing - one batch per
  partition per request (Kafka rejects more for magic 2), grouped by leader, at most
  ``max_in_flight_requests_per_connection`` requests per broker, each request one gathered ``sendmsg``;
  each acknowledgement, handled in the connection's read handler, refills the in-flight window at once.

Idempotence (on by default, as in Kafka >= 3.0): the producer gets a producer id with InitProducerId,
numbers each partition's batches with sequences, and retries a failed batch with the *same* sequence, so a
retry after a lost response is deduplicated by the broker instead of written twice. Batches of a partition
are retried in sequence order; a batch that fails for good resets the producer id (Kafka's
"reset producer id" path) so later batches are not stuck behind a sequence gap.

Without idempotence (acks 0/1, or ``enable_idempotence=False``) retries are still made, but with up to
``max_in_flight_requests_per_connection`` requests in flight a retried batch may land after a newer one
and a lost acknowledgement may duplicate a batch, exactly as with the Java client.

Delivery results (the Java client's ``ProduceRequestResult`` design): ``send`` returns a
``DeliveryFuture``, a three-slot handle (batch, offset delta, timestamp); the batch owns the only asyncio
future, resolved once with its base offset or its error, and a handle's ``RecordMetadata`` is computed
when awaited. ``await producer.send(...)`` appends and returns the handle without suspending when the
partition's batch has room (it waits only for metadata or ``buffer_memory``); ``await handle`` (or
``send_and_wait``) waits for the acknowledgement. The per-record path - the last partition's open batch
cached, ``BatchBuilder.append_value``'s fast case inlined for records without key and headers, the
handle - is ~0.8 us of CPU per 100-byte record with its share of the sender, against ~1.0-1.2 us when it
called ``append_value``, ~1.9 us for the design before, and ~5.6-6.3 us for aiokafka's ``send``
(benchmarks/client.py --quick, this machine).

Memory is bounded by ``buffer_memory``: every open or in-flight batch reserves 16 KiB when it is started
and its real size when it is closed (Kafka's ``BufferPool`` reserves ``batch.size`` per batch). When the
budget is spent ``send`` waits (back-pressure from a slow broker reaches the caller) and ``send_nowait``
raises ``BufferFullError``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import NamedTuple

from kio.schema.init_producer_id.v1.request import InitProducerIdRequest
from kio.schema.init_producer_id.v1.response import InitProducerIdResponse

from copyless.client.cluster import LEADER_ERRORS, Cluster
from copyless.client.conn import DEFAULT_REQUEST_TIMEOUT_MS
from copyless.client.errors import (
    BufferFullError,
    ClientError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    ProducerClosedError,
)
from copyless.client.protocol.batch_builder import CODECS, GATHER_MIN_VALUE_BYTES, BatchBuilder, BuiltBatch
from copyless.client.protocol.messages import ApiKey, decode_produce_response, encode_produce_request
from copyless.client.protocol.partitioner import partition_for_key
from copyless.client.protocol.records import CODEC_ZSTD, NO_PRODUCER_ID, NO_SEQUENCE

__all__ = ["Producer", "RecordMetadata", "DeliveryFuture", "NoMetadataError"]

_time_ns = time.time_ns
_time = time.time


class NoMetadataError(ClientError):
    """``send_nowait`` needs the topic's partition count, which has not been loaded yet."""

log = logging.getLogger("copyless.client.producer")

DUPLICATE_SEQUENCE_NUMBER = 46
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
UNKNOWN_PRODUCER_ID = 59
INVALID_PRODUCER_EPOCH = 47
NOT_LEADER_OR_FOLLOWER = 6
LEADER_NOT_AVAILABLE = 5
UNKNOWN_TOPIC_OR_PARTITION = 3
# Errors after which the partition's leader may have moved: refresh metadata before retrying.
_METADATA_ERRORS = LEADER_ERRORS

# Default batch.size. Kafka's Java default is 16 KiB; librdkafka's is 1 MB. A produce request costs the
# client and the broker a fixed ~0.3-0.5 ms of CPU on this 2-core machine whatever its size, so with
# 100-byte records (~140 per 16 KiB batch) requests, not bytes, set the rate. Measured against the
# reference Kafka, one partition, acks=1: 16 KiB 122-163k rec/s, 64 KiB 235k, 256 KiB 284-421k, 1 MiB
# 220-372k (fewer, larger requests pipeline worse). linger_ms still bounds the latency of a slow stream:
# a batch goes out after linger_ms whether or not it is full.
DEFAULT_BATCH_BYTES = 256 * 1024
# A new batch reserves this much of buffer_memory up front and the rest of its real size when it is
# closed, so a large batch_size does not make every half-empty batch of a many-partition producer
# count as full (Kafka reserves batch.size per batch).
_INITIAL_RESERVATION_BYTES = 16 * 1024


class RecordMetadata(NamedTuple):
    """Where a record was written."""

    topic: str
    partition: int
    offset: int  # -1 when the broker reported a duplicate without an offset
    timestamp: int  # create time, or the broker's log-append time
    log_start_offset: int


class _ProducerBatch:
    """One batch of one partition, from the first record to the broker's answer."""

    __slots__ = (
        "topic",
        "partition",
        "builder",
        "built",
        "future",
        "created",
        "attempts",
        "sequence",
        "reserved_bytes",
        "retry_at",
        "timestamps",
        "in_flight",
    )

    def __init__(self, topic: str, partition: int, builder: BatchBuilder, future, reserved_bytes: int) -> None:
        self.topic = topic
        self.partition = partition
        self.builder = builder
        self.built: BuiltBatch | None = None
        self.future = future  # resolves to (base_offset, log_append_time_ms, log_start_offset)
        self.created = time.monotonic()
        self.attempts = 0
        self.sequence = NO_SEQUENCE
        self.reserved_bytes = reserved_bytes
        self.retry_at = 0.0
        self.in_flight = False


class DeliveryFuture:
    """The outcome of one ``send``: ``await`` it for ``RecordMetadata``.

    The Java client's design (``ProduceRequestResult`` + ``FutureRecordMetadata``): one asyncio future per
    batch, resolved once with the batch's base offset (or its error), and per record only this handle - the
    batch, the record's offset delta and its timestamp - whose offset is ``base_offset + offset_delta``,
    computed when asked. No per-record future or callback. The class has no ``__init__``: a handle is
    ``DeliveryFuture()`` and three slot stores (~0.09 us, against ~0.12 us through ``object.__new__`` and
    ~0.16-0.17 us for a tuple subclass or a class with ``__init__``; measured on this machine, where the
    whole ``await send`` is ~0.8 us). Handles are made by the producer, not by applications.
    """

    __slots__ = ("_batch", "_offset_delta", "_timestamp")

    def done(self) -> bool:
        return self._batch.future.done()

    def _metadata(self, outcome) -> RecordMetadata:
        base_offset, append_time, log_start = outcome
        batch = self._batch
        return RecordMetadata(
            batch.topic,
            batch.partition,
            base_offset + self._offset_delta if base_offset >= 0 else -1,
            append_time if append_time >= 0 else self._timestamp,
            log_start,
        )

    def result(self) -> RecordMetadata:
        return self._metadata(self._batch.future.result())

    def exception(self):
        return self._batch.future.exception()

    def add_done_callback(self, callback) -> None:
        """``callback(self)`` when the record's batch completes."""
        self._batch.future.add_done_callback(lambda _f: callback(self))

    def __await__(self):
        outcome = yield from self._batch.future.__await__()
        return self._metadata(outcome)

    def __repr__(self) -> str:
        batch = self._batch
        return f"<DeliveryFuture {batch.topic}-{batch.partition} record {self._offset_delta} done={self.done()}>"


class Producer:
    """An asyncio Kafka producer.

    Args:
        bootstrap_servers: ``"host:port[,host:port]"``.
        acks: 0, 1 or "all"/-1 (Kafka ``acks``; default "all").
        batch_size: bytes per partition batch (Kafka ``batch.size``; default 256 KiB, see below).
        linger_ms: wait this long for a batch to fill before sending it (Kafka 4 default: 5).
        compression_type: None/"none", "gzip", "snappy", "lz4", "zstd".
        enable_idempotence: default on when acks is "all"; turned off when acks is set otherwise (as the
            Java and kafka-python clients do); True with acks != all raises ``ValueError``.
        retries: attempts after the first for retriable errors (bounded by ``delivery_timeout_ms``).
        max_in_flight_requests_per_connection: pipelined produce requests per broker (<= 5 with idempotence).
        buffer_memory: bytes of batches buffered or in flight before ``send`` waits.
        gather_min_bytes: values at or above this are sent as their own buffer (the writev crossover).
        partitioner: ``f(key, partition_count) -> partition``; default Kafka's murmur2 for keyed records
            and a sticky partition (KIP-480) for unkeyed ones.
    """

    def __init__(
        self,
        bootstrap_servers,
        *,
        client_id: str = "copyless-producer",
        acks="all",
        batch_size: int = DEFAULT_BATCH_BYTES,
        linger_ms: float = 5,
        compression_type: str | None = None,
        enable_idempotence: bool | None = None,
        retries: int = 2_147_483_647,
        retry_backoff_ms: int = 100,
        delivery_timeout_ms: int = 120_000,
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        max_in_flight_requests_per_connection: int = 5,
        buffer_memory: int = 32 * 1024 * 1024,
        max_request_size: int = 1024 * 1024,
        gather_min_bytes: int = GATHER_MIN_VALUE_BYTES,
        partitioner=None,
    ) -> None:
        self.acks = -1 if acks in ("all", -1, "-1") else int(acks)
        if self.acks not in (-1, 0, 1):
            raise ValueError(f"acks must be 0, 1 or 'all', not {acks!r}")
        if enable_idempotence is None:
            enable_idempotence = self.acks == -1
        elif enable_idempotence and self.acks != -1:
            raise ValueError("enable_idempotence requires acks='all'")
        self.enable_idempotence = enable_idempotence
        if enable_idempotence and max_in_flight_requests_per_connection > 5:
            raise ValueError("idempotence allows at most 5 in-flight requests per connection")
        codec_name = (compression_type or "none").lower()
        if codec_name not in CODECS:
            raise ValueError(f"unknown compression_type {compression_type!r}; use one of {sorted(CODECS)}")
        self.codec = CODECS[codec_name]
        self.batch_size = batch_size
        self.linger_ms = linger_ms
        self.retries = retries
        self.retry_backoff_ms = retry_backoff_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.request_timeout_ms = request_timeout_ms
        self.max_in_flight = max_in_flight_requests_per_connection
        self.buffer_memory = buffer_memory
        self.max_request_size = max_request_size
        self.gather_min_bytes = gather_min_bytes
        self._partitioner = partitioner
        self._cluster = Cluster(
            bootstrap_servers,
            client_id=client_id,
            request_timeout_ms=request_timeout_ms,
            gather_min_bytes=gather_min_bytes,
            retry_backoff_ms=retry_backoff_ms,
        )
        # (topic, partition) -> deque of batches not yet acknowledged-and-not-in-flight, oldest first
        self._batches: dict[tuple[str, int], collections.deque[_ProducerBatch]] = {}
        self._open: dict[tuple[str, int], _ProducerBatch] = {}  # the batch records are appended to
        self._last_batch: _ProducerBatch | None = None  # the open batch appended to last (see send_nowait)
        self._sticky: dict[str, int] = {}
        self._partition_counts: dict[str, int] = {}
        self._in_flight_partitions: dict[tuple[str, int], int] = collections.defaultdict(int)
        self._retrying: set[tuple[str, int]] = set()
        self._next_sequence: dict[tuple[str, int], int] = collections.defaultdict(int)
        self._producer_id = NO_PRODUCER_ID
        self._producer_epoch = -1
        self._need_producer_id = enable_idempotence
        self._reserved_bytes = 0
        self._outstanding: set[asyncio.Future] = set()
        self._memory_waiters: collections.deque[asyncio.Future] = collections.deque()
        self._wake: asyncio.Event | None = None
        self._sender: asyncio.Task | None = None
        self._flushing = 0
        self._closing = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fatal: BaseException | None = None
        self._connecting_nodes: set[int] = set()
        self.stats = {"requests": 0, "batches": 0, "records": 0, "retries": 0, "connect_failures": 0}

    # --- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, load metadata and (with idempotence) get a producer id."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        await self._cluster.start()
        if self.codec == CODEC_ZSTD:
            connection = await self._cluster.any_connection()
            if not connection.supports(ApiKey.PRODUCE, 7):
                raise ClientError("zstd needs Produce v7, which the broker does not support")
        if self.enable_idempotence:
            await self._init_producer_id()
        self._sender = self._loop.create_task(self._run_sender(), name="copyless-producer-sender")

    async def __aenter__(self) -> "Producer":
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def _init_producer_id(self) -> None:
        connection = await self._cluster.any_connection()
        deadline = time.monotonic() + self.request_timeout_ms / 1000
        while True:
            response = await connection.request_kio(
                InitProducerIdRequest(transactional_id=None, transaction_timeout=_ms(60_000)), InitProducerIdResponse
            )
            code = int(response.error_code)
            if code == 0:
                break
            error = KafkaError(code, "InitProducerId")
            if not error.retriable or time.monotonic() > deadline:
                raise error
            await asyncio.sleep(self.retry_backoff_ms / 1000)
        self._producer_id = int(response.producer_id)
        self._producer_epoch = int(response.producer_epoch)
        self._next_sequence.clear()
        self._need_producer_id = False

    async def wait_for_topic(self, topic: str, timeout_ms: int = 60_000) -> int:
        """Load ``topic``'s metadata (so ``send_nowait`` can partition for it); return its partition count."""
        count = await self._cluster.wait_for_topic(topic, timeout_ms)
        self._partition_counts[topic] = count
        return count

    async def partitions_for(self, topic: str) -> list[int]:
        return list(range(await self.wait_for_topic(topic)))

    # --- sending ------------------------------------------------------------------------------------------

    def _continue_run(self, topic: str, value, partition: int | None) -> DeliveryFuture | None:
        """The hot path of ``send`` and ``send_nowait`` for a record without key, headers or timestamp:
        when it goes to the partition of the batch appended to last and continues that batch's open run
        (same millisecond, same value length, room left; see BatchBuilder.append_value), it is one list
        append, a count and the handle. None: the record takes the general path.

        It is append_value's fast case inlined: the builder's fields read directly (no call), the
        time.time() reading compared with the run's millisecond bounds (exact, see
        batch_builder._clock_seconds; ``time_ns() // 1_000_000`` costs ~0.05 us more, the division of a
        3-digit int) and the handle's timestamp taken from the run. Positional arguments only: a call with
        keywords costs ~0.1 us more, a seventh of a record's CPU here.
        """
        batch = self._last_batch
        if batch is None:
            return None
        if partition is None:
            partition = self._sticky.get(topic)
        builder = batch.builder
        count = builder._count
        if (
            batch.partition == partition
            and batch.topic == topic
            and builder._run_from_s < _time() < builder._run_until_s
            and count < builder._run_limit
            and type(value) is bytes
            and len(value) == builder._run_value_bytes
        ):
            builder._run_values.append(value)
            builder._count = count + 1
            delivery = DeliveryFuture()
            delivery._batch = batch
            delivery._offset_delta = count
            delivery._timestamp = builder._run_timestamp
            return delivery
        return None

    def send_nowait(
        self,
        topic: str,
        value=None,
        key=None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers=None,
    ) -> DeliveryFuture:
        """Append a record to its partition's batch without waiting; return its ``DeliveryFuture``.

        Raises:
            BufferFullError: ``buffer_memory`` is spent (use ``await send`` to wait instead).
            KafkaError: UNKNOWN_TOPIC_OR_PARTITION for an explicit ``partition`` the topic does not have.
            NoMetadataError: the topic's metadata is not loaded (``await send`` or ``wait_for_topic`` first).
            ProducerClosedError: the producer is closing.
        """
        if key is None and headers is None and timestamp_ms is None:
            delivery = self._continue_run(topic, value, partition)
            if delivery is not None:
                return delivery
        batch = self._last_batch
        # The last partition's batch (an explicit partition, or the sticky one) is checked against
        # _last_batch before the (topic, partition) lookup; a record without key and headers takes
        # BatchBuilder.append_value.
        if timestamp_ms is None:
            timestamp_ms = _time_ns() // 1_000_000
        if partition is None:
            partition = self._choose_partition(topic, key)
        elif batch is None or batch.partition != partition or batch.topic != topic:
            count = self._partition_counts.get(topic)
            if count is not None and not 0 <= partition < count:
                raise KafkaError(
                    UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r} has no partition {partition} (it has {count})"
                )
        if batch is None or batch.partition != partition or batch.topic != topic:
            batch = self._open.get((topic, partition))
        if batch is not None:
            if key is None and headers is None:
                offset_delta = batch.builder.append_value(timestamp_ms, value)
            else:
                offset_delta = batch.builder.append(timestamp_ms, key, value, headers)
            if offset_delta >= 0:
                self._last_batch = batch
                delivery = DeliveryFuture()
                delivery._batch = batch
                delivery._offset_delta = offset_delta
                delivery._timestamp = timestamp_ms
                return delivery
            # Full: close it (its reservation grows to its real size), wake the sender, and start a new
            # one (with a new sticky partition).
            self._close_open(batch)
            extra = batch.builder.size_bytes - batch.reserved_bytes
            if extra > 0:
                batch.reserved_bytes += extra
                self._reserved_bytes += extra
            self._wake.set()
            if key is None and self._sticky.get(topic) == partition and self._partition_counts.get(topic, 1) > 1:
                self._sticky[topic] = _next_sticky(topic, self._partition_counts[topic], partition)
        return self._append_to_new_batch((topic, partition), timestamp_ms, key, value, headers)

    def _close_open(self, batch: _ProducerBatch) -> None:
        """No more records go into ``batch`` (it is full, being sent, flushed or expired)."""
        tp = (batch.topic, batch.partition)
        if self._open.get(tp) is batch:
            del self._open[tp]
        if self._last_batch is batch:
            self._last_batch = None

    def _choose_partition(self, topic: str, key) -> int:
        count = self._partition_counts.get(topic)
        if count is None:
            raise NoMetadataError(f"no metadata for topic {topic!r} yet: await send() or wait_for_topic() first")
        if key is not None:
            if self._partitioner is not None:
                return self._partitioner(key, count)
            return partition_for_key(key, count)
        partition = self._sticky.get(topic)
        if partition is None:
            partition = self._sticky[topic] = _next_sticky(topic, count, None)
        return partition

    def _append_to_new_batch(self, tp, timestamp_ms: int, key, value, headers) -> DeliveryFuture:
        if self._closing:
            raise ProducerClosedError("producer is closed")
        if self._fatal is not None:
            raise self._fatal
        if self._reserved_bytes >= self.buffer_memory:
            raise BufferFullError(f"buffer_memory ({self.buffer_memory} bytes) is full")
        builder = BatchBuilder(batch_size=self.batch_size, codec=self.codec, gather_min_bytes=self.gather_min_bytes)
        future = self._loop.create_future()
        reservation = min(self.batch_size, _INITIAL_RESERVATION_BYTES)
        batch = _ProducerBatch(tp[0], tp[1], builder, future, reservation)
        self._reserved_bytes += reservation
        if key is None and headers is None:
            offset_delta = builder.append_value(timestamp_ms, value)
        else:
            offset_delta = builder.append(timestamp_ms, key, value, headers)
        queue = self._batches.get(tp)
        if queue is None:
            queue = self._batches[tp] = collections.deque()
        queue.append(batch)
        self._open[tp] = batch
        self._last_batch = batch
        self._outstanding.add(future)
        future.add_done_callback(self._outstanding.discard)
        self._wake.set()
        delivery = DeliveryFuture()
        delivery._batch = batch
        delivery._offset_delta = offset_delta
        delivery._timestamp = timestamp_ms
        return delivery

    async def send(
        self,
        topic: str,
        value=None,
        key=None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers=None,
    ) -> DeliveryFuture:
        """Append a record, waiting for metadata and for buffer space if needed; return its
        ``DeliveryFuture``.

        ``await producer.send(...)`` returns as soon as the record is in a batch (no suspension when the
        batch has room); ``await (await producer.send(...))`` gives the ``RecordMetadata``.
        """
        # The hot path first (see _continue_run): a loop of ``await send`` of 100-byte records without a
        # broker (batches built on the side) took ~0.70 us of CPU per record with it written out here,
        # against ~0.95 us when every record called append_value (~0.2 us of both is the loop and the
        # coroutine); the call to the shared copy adds ~0.05 us (benchmarks.client, README).
        if key is None and headers is None and timestamp_ms is None:
            delivery = self._continue_run(topic, value, partition)
            if delivery is not None:
                return delivery
        if partition is not None and topic not in self._partition_counts:
            await self.wait_for_topic(topic)
        refreshed = False
        while True:
            try:
                return self.send_nowait(
                    topic, value, key, partition=partition, timestamp_ms=timestamp_ms, headers=headers
                )
            except KafkaError as exc:
                # A partition past the known count: the topic may have grown since; look once more.
                if exc.code != UNKNOWN_TOPIC_OR_PARTITION or refreshed:
                    raise
                refreshed = True
                await self._cluster.refresh_metadata([topic], allow_auto_create=False)
                count = self._cluster.metadata.partition_count(topic)
                if count is not None:
                    self._partition_counts[topic] = count
            except BufferFullError:
                waiter = self._loop.create_future()
                self._memory_waiters.append(waiter)
                await waiter
            except NoMetadataError:
                await self.wait_for_topic(topic)

    async def send_and_wait(self, topic: str, value=None, key=None, **kwargs) -> RecordMetadata:
        """Send one record and wait for its acknowledgement."""
        delivery = await self.send(topic, value, key, **kwargs)
        self.flush_nowait()
        return await delivery

    def flush_nowait(self) -> None:
        """Make every open batch ready now (without waiting for the acknowledgements)."""
        self._open.clear()
        self._last_batch = None
        if self._wake is not None:
            self._wake.set()

    async def flush(self) -> None:
        """Send every buffered record now and wait until all are acknowledged (or failed)."""
        self._flushing += 1
        try:
            self.flush_nowait()
            while self._outstanding:
                await asyncio.wait(list(self._outstanding))
                if self._sender is None or self._sender.done():
                    break
        finally:
            self._flushing -= 1

    async def close(self, timeout_s: float | None = None) -> None:
        """Flush, then stop the sender and close connections. Records still unsent fail with
        ``ProducerClosedError`` if the flush does not finish within ``timeout_s``."""
        if self._closed:
            return
        self._closing = True
        try:
            if self._sender is not None:
                async with asyncio.timeout(timeout_s):
                    await self.flush()
        except TimeoutError:
            pass
        finally:
            self._closed = True
            if self._sender is not None:
                self._sender.cancel()
                try:
                    await self._sender
                except (asyncio.CancelledError, Exception):
                    pass
            for queue in self._batches.values():
                for batch in queue:
                    self._complete(batch, ProducerClosedError("producer closed before the batch was sent"))
            self._batches.clear()
            await self._cluster.close()

    # --- the sender ------------------------------------------------------------------------------------------

    async def _run_sender(self) -> None:
        wake = self._wake
        try:
            while True:
                timeout = self._send_ready()
                if timeout is None:
                    wake.clear()
                    await wake.wait()
                elif timeout > 0:
                    wake.clear()
                    # asyncio.timeout, not wait_for: on 3.11, wait_for drops a cancellation (close) that
                    # arrives in the same step as the wake-up.
                    try:
                        async with asyncio.timeout(timeout):
                            await wake.wait()
                    except TimeoutError:
                        pass
                else:
                    # Something is sendable but blocked on in-flight limits or a connection: yield.
                    wake.clear()
                    try:
                        async with asyncio.timeout(0.05):
                            await wake.wait()
                    except TimeoutError:
                        pass
                if self._need_producer_id:
                    await self._reset_producer_id()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: fail everything loudly rather than hang
            log.exception("producer sender failed")
            self._fatal = ClientError(f"producer sender failed: {exc!r}")
            self._open.clear()
            self._last_batch = None
            for queue in self._batches.values():
                for batch in queue:
                    self._complete(batch, self._fatal)

    async def _reset_producer_id(self) -> None:
        try:
            await self._init_producer_id()
        except Exception as exc:
            log.warning("InitProducerId failed: %s", exc)
            self._need_producer_id = True
            await asyncio.sleep(self.retry_backoff_ms / 1000)
            return
        # Renumber every batch not yet acknowledged, partition by partition, in order.
        for tp, queue in self._batches.items():
            sequence = 0
            for batch in queue:
                if batch.built is not None and not batch.in_flight:
                    batch.sequence = sequence
                    batch.built.set_producer_state(self._producer_id, self._producer_epoch, sequence)
                    sequence += batch.built.record_count
            self._next_sequence[tp] = sequence

    def _send_ready(self) -> float | None:
        """Drain ready batches into produce requests. Returns seconds until the next batch is due (None:
        nothing pending; 0: something is ready but blocked).

        A request carries at most one batch per partition (magic 2), so a partition with several ready
        batches - a producer that fills batches faster than the broker acknowledges them, or a flush -
        needs several requests: passes repeat while one sends something, up to the in-flight limits, so
        they are pipelined now instead of one per wake-up (one per response). Measured with
        benchmarks.client's workload (200k records of 100 B, 256 KiB batches, an event-loop yield every
        8192 records): with one pass per wake-up, 62 of 84 batches were still queued when the send loop
        ended and the flush took ~45 ms of the ~230 ms run, one round trip per batch; with this and
        _on_produce_response's refill, ~5-10 are queued and the flush takes 1-7 ms.
        """
        while True:
            sent, blocked, next_due = self._send_ready_pass()
            if not sent:
                break
        # Responses, new full batches and new connections all set the wake event; only blocked work (an
        # unknown leader, a full in-flight window) needs a poll.
        if blocked:
            return 0.0
        return next_due

    def _send_ready_pass(self) -> tuple[bool, bool, float | None]:
        """One pass of ``_send_ready``: at most one request per broker. Returns (whether a request was
        sent, whether ready work is blocked, seconds until the next batch is due)."""
        now = time.monotonic()
        linger_s = self.linger_ms / 1000
        flushing = bool(self._flushing) or self._closing
        delivery_timeout_s = self.delivery_timeout_ms / 1000
        by_node: dict[int, list[_ProducerBatch]] = {}
        next_due: float | None = None
        blocked = False
        metadata = self._cluster.metadata
        for tp, queue in self._batches.items():
            if not queue:
                continue
            batch = queue[0]
            if batch.in_flight:
                # Idempotent pipelining: a partition's next batch may go while earlier ones are in flight,
                # unless the partition is retrying (then strictly one at a time, in sequence order).
                if tp in self._retrying:
                    continue
                batch = next((b for b in queue if not b.in_flight), None)
                if batch is None or self._in_flight_partitions[tp] >= self.max_in_flight:
                    continue
            if now - batch.created > delivery_timeout_s:
                self._expire(tp, batch)
                continue
            ready = flushing or batch is not self._open.get(tp)
            if not ready:
                due = batch.created + linger_s - now
                if due <= 0:
                    ready = True
                else:
                    next_due = due if next_due is None else min(next_due, due)
                    continue
            if batch.retry_at > now:
                due = batch.retry_at - now
                next_due = due if next_due is None else min(next_due, due)
                continue
            leader = metadata.leader(tp[0], tp[1])
            if leader < 0:
                self._cluster.request_update([tp[0]])
                blocked = True
                continue
            by_node.setdefault(leader, []).append(batch)
        sent = False
        for node_id, batches in by_node.items():
            if self._send_to_node(node_id, batches):
                sent = True
            else:
                blocked = True
        return sent, blocked, next_due

    def _send_to_node(self, node_id: int, batches: list[_ProducerBatch]) -> bool:
        connection = self._cluster.connection_nowait(node_id)
        if connection is None:
            if node_id not in self._connecting_nodes:
                self._connecting_nodes.add(node_id)
                self._loop.create_task(self._connect_node(node_id))
            return False
        if connection.in_flight_count >= self.max_in_flight:
            return False
        topics: dict[str, list] = {}
        request_bytes = 0
        sent: list[_ProducerBatch] = []
        for batch in batches:
            tp = (batch.topic, batch.partition)
            if batch.built is None:
                self._close_open(batch)
                if self.enable_idempotence:
                    batch.sequence = self._next_sequence[tp]
                    self._next_sequence[tp] = (batch.sequence + batch.builder.record_count) % (1 << 31)
                    batch.built = batch.builder.build(self._producer_id, self._producer_epoch, batch.sequence)
                else:
                    batch.built = batch.builder.build()
                batch.builder = None
                if batch.built.size_bytes > batch.reserved_bytes:
                    self._reserved_bytes += batch.built.size_bytes - batch.reserved_bytes
                    batch.reserved_bytes = batch.built.size_bytes
            if sent and request_bytes + batch.built.size_bytes > self.max_request_size:
                continue
            request_bytes += batch.built.size_bytes
            topics.setdefault(batch.topic, []).append((batch.partition, batch.built.buffers, batch.built.size_bytes))
            batch.in_flight = True
            batch.attempts += 1
            self._in_flight_partitions[tp] += 1
            sent.append(batch)
        body = encode_produce_request(self.acks, self.request_timeout_ms, topics)
        try:
            if self.acks == 0:
                connection.send(ApiKey.PRODUCE, body, expect_response=False)
            else:
                # A callback, not a future: the connection calls it from its read handler as soon as the
                # response is decoded (see _on_produce_response for why that matters).
                connection.send(
                    ApiKey.PRODUCE,
                    body,
                    decode_produce_response,
                    on_response=lambda result, error, sent=sent: self._on_produce_response(sent, result, error),
                )
        except KafkaConnectionError as exc:
            self._on_produce_failed(sent, exc)
            return False
        self.stats["requests"] += 1
        if self.acks == 0:  # done once written; offsets unknown
            for batch in sent:
                self._finish_in_flight(batch)
                self._complete(batch, (-1, -1, -1))
        return True

    async def _connect_node(self, node_id: int) -> None:
        try:
            await self._cluster.connection(node_id)
        except Exception as exc:
            self.stats["connect_failures"] += 1
            log.info("cannot connect to broker %s (batches wait, up to delivery_timeout_ms): %s", node_id, exc)
            await asyncio.sleep(self.retry_backoff_ms / 1000)
            self._cluster.request_update(list({tp[0] for tp in self._batches}))
        finally:
            self._connecting_nodes.discard(node_id)
        if self._wake is not None:
            self._wake.set()

    def _finish_in_flight(self, batch: _ProducerBatch) -> None:
        tp = (batch.topic, batch.partition)
        batch.in_flight = False
        self._in_flight_partitions[tp] -= 1
        queue = self._batches.get(tp)
        if queue is not None:
            try:
                queue.remove(batch)
            except ValueError:
                pass

    def _on_produce_response(self, sent: list[_ProducerBatch], response, error: BaseException | None) -> None:
        """The outcome of a produce request: ``response`` (decoded partitions) or the ``error`` that failed
        it (connection closed or timed out). Called by the connection, from its read handler."""
        if error is not None:
            self._on_produce_failed(sent, error)
            return
        results = {(r.topic, r.partition): r for r in response}
        retry_topics = set()
        for batch in sent:
            result = results.get((batch.topic, batch.partition))
            if result is None:
                self._retry_or_fail(batch, KafkaError(-1, "partition missing from the produce response"))
                continue
            code = result.error_code
            if code == 0 or code == DUPLICATE_SEQUENCE_NUMBER:
                tp = (batch.topic, batch.partition)
                self._retrying.discard(tp)
                self._finish_in_flight(batch)
                base_offset = result.base_offset if code == 0 else -1
                self._complete(batch, (base_offset, result.log_append_time_ms, result.log_start_offset))
                continue
            error = KafkaError(code, f"producing to {batch.topic}-{batch.partition}")
            if code in _METADATA_ERRORS:
                retry_topics.add(batch.topic)
            if code in (UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_EPOCH) and self.enable_idempotence:
                self._need_producer_id = True
                error.retriable = True
            elif code == OUT_OF_ORDER_SEQUENCE_NUMBER:
                # An earlier batch of the partition failed: this one is retried after it, same sequence.
                error.retriable = True
            self._retry_or_fail(batch, error)
        if retry_topics:
            self._cluster.request_update(retry_topics)
        elif self._sender is not None and not self._sender.done() and not self._need_producer_id:
            # Fill the in-flight window this acknowledgement opened now, from the read handler, rather than
            # when the sender task next runs. Behind an application that yields to the event loop rarely
            # (benchmarks.client: every 8192 records, ~7 ms) every trip through the loop's ready queue - a
            # future's done-callback, the sender task's wake-up - waits for the application's next yield,
            # so the window of 5 requests was refilled every other yield only, slower than 256 KiB batches
            # filled (~3.4 per yield there): measured, ~2.5 requests per yield and up to buffer_memory
            # (~120 batches) queued by the end of a 1M-record run; refilled here, every batch is sent at
            # the yield after it fills and ~5-10 are queued at the end.
            self._send_ready()
        self._wake.set()

    def _on_produce_failed(self, sent: list[_ProducerBatch], exc: BaseException) -> None:
        for batch in sent:
            self._retry_or_fail(batch, exc)
        if not self._closed:  # (connections closed by close() fail their requests from inside it)
            self._cluster.request_update({batch.topic for batch in sent})
        if self._wake is not None:
            self._wake.set()

    def _retry_or_fail(self, batch: _ProducerBatch, error: BaseException) -> None:
        tp = (batch.topic, batch.partition)
        batch.in_flight = False
        self._in_flight_partitions[tp] -= 1
        retriable = getattr(error, "retriable", False)
        expired = time.monotonic() - batch.created > self.delivery_timeout_ms / 1000
        if retriable and batch.attempts <= self.retries and not expired and not self._closed:
            self.stats["retries"] += 1
            batch.retry_at = time.monotonic() + self.retry_backoff_ms / 1000
            self._retrying.add(tp)
            # Keep the partition's batches in sequence order: this one goes back before newer ones.
            queue = self._batches.get(tp)
            if queue is not None and batch in queue:
                ordered = sorted(queue, key=lambda b: (b.built is None, b.sequence if b.built else 0))
                queue.clear()
                queue.extend(ordered)
            return
        self._finish_in_flight_failed(batch)
        if self.enable_idempotence and isinstance(error, KafkaError):
            # A sequence was lost for good: later batches would be out of order. Start a new producer id.
            self._need_producer_id = True
        if expired and retriable:
            error = KafkaTimeoutError(f"delivery_timeout_ms expired for {tp[0]}-{tp[1]}: {error}")
        self._complete(batch, error)

    def _finish_in_flight_failed(self, batch: _ProducerBatch) -> None:
        tp = (batch.topic, batch.partition)
        queue = self._batches.get(tp)
        if queue is not None:
            try:
                queue.remove(batch)
            except ValueError:
                pass
        self._retrying.discard(tp)

    def _expire(self, tp, batch: _ProducerBatch) -> None:
        queue = self._batches[tp]
        queue.remove(batch)
        self._close_open(batch)
        if batch.built is not None and self.enable_idempotence:
            self._need_producer_id = True  # its sequence numbers will never be written: start over
        self._retrying.discard(tp)
        self._complete(
            batch,
            KafkaTimeoutError(f"batch for {tp[0]}-{tp[1]} not delivered within delivery_timeout_ms={self.delivery_timeout_ms}"),
        )

    def _complete(self, batch: _ProducerBatch, outcome) -> None:
        if batch.future.done():
            return
        self._reserved_bytes -= batch.reserved_bytes
        if isinstance(outcome, BaseException):
            log.warning("batch of %d records for %s-%s failed: %s", _record_count(batch), batch.topic, batch.partition, outcome)
            batch.future.set_exception(outcome)
            batch.future.exception()  # logged here once; callers awaiting their DeliveryFuture still get it
        else:
            self.stats["batches"] += 1
            self.stats["records"] += batch.built.record_count if batch.built is not None else 0
            batch.future.set_result(outcome)
        while self._memory_waiters and self._reserved_bytes < self.buffer_memory:
            waiter = self._memory_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)


def _record_count(batch: _ProducerBatch) -> int:
    if batch.built is not None:
        return batch.built.record_count
    return batch.builder.record_count if batch.builder is not None else 0


def _next_sticky(topic: str, count: int, previous: int | None) -> int:
    import random

    if count <= 1:
        return 0
    choice = random.randrange(count - 1)
    if previous is not None and choice >= previous:
        choice += 1
    return choice


def _ms(value: int):
    import datetime

    return datetime.timedelta(milliseconds=value)
