"""The producer's accumulator: records appended into per-partition batches, and the memory they hold.

Owns (Kafka's ``RecordAccumulator``): one deque of batches per partition, oldest first, the open batch of
each partition that records are appended to, the sticky partition of unkeyed records (KIP-480), the
``buffer_memory`` budget and the delivery handles. It never touches a connection: the ``Sender`` takes
ready batches from ``batches`` and reports each batch's outcome back through ``complete``.

The per-record path is one call: ``continue_run`` appends a record without key and headers to the batch
appended to last when it continues that batch's open run (see its docstring); everything else goes
through ``append``. ``Producer.send`` calls ``continue_run`` first, so the accumulator being its own
object costs the hot path nothing (benchmarks.client, README).

Delivery results (the Java client's ``ProduceRequestResult`` design): ``append`` returns a
``DeliveryFuture``, a three-slot handle (batch, offset delta, timestamp); the batch owns the only asyncio
future, resolved once with its base offset or its error, and a handle's ``RecordMetadata`` is computed
when awaited.

Memory is bounded by ``buffer_memory``: every open or in-flight batch reserves 16 KiB when it is started
and its real size when it is closed (Kafka's ``BufferPool`` reserves ``batch.size`` per batch). When the
budget is spent ``append`` raises ``BufferFullError`` and ``Producer.send`` waits on ``memory_waiters``.
Loop thread only.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from typing import NamedTuple

from copyless.client.errors import BufferFullError, ClientError, KafkaError, ProducerClosedError
from copyless.protocol.batch_builder import BatchBuilder, BuiltBatch
from copyless.protocol.partitioner import partition_for_key
from copyless.protocol.records import NO_SEQUENCE

__all__ = ["RecordAccumulator", "ProducerBatch", "DeliveryFuture", "RecordMetadata", "NoMetadataError",
           "DEFAULT_BATCH_BYTES"]

_time_ns = time.time_ns
_time = time.time

log = logging.getLogger("copyless.client.producer")

UNKNOWN_TOPIC_OR_PARTITION = 3


class NoMetadataError(ClientError):
    """``send_nowait`` needs the topic's partition count, which has not been loaded yet."""


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


class ProducerBatch:
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
        # Open until the sender builds the batch; then closed, its records moved to ``built`` (build() empties
        # it, so keeping it costs only the object).
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
    _batch: ProducerBatch
    _offset_delta: int
    _timestamp: int

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


class RecordAccumulator:
    """Batches per partition (see the module docstring).

    Args:
        batch_size, codec, gather_min_bytes: how batches are built (``BatchBuilder``).
        buffer_memory: bytes of open and in-flight batches before ``append`` raises ``BufferFullError``.
        partitioner: ``f(key, partition_count) -> partition`` for keyed records (default murmur2).
        stats: the producer's counters (``batches``, ``records`` are counted here).
    """

    def __init__(self, *, batch_size: int, codec: int, gather_min_bytes: int, buffer_memory: int, partitioner,
                 stats: dict) -> None:
        self.batch_size = batch_size
        self.codec = codec
        self.gather_min_bytes = gather_min_bytes
        self.buffer_memory = buffer_memory
        self._partitioner = partitioner
        self.stats = stats
        # (topic, partition) -> deque of batches not yet acknowledged, oldest first
        self.batches: dict[tuple[str, int], collections.deque[ProducerBatch]] = {}
        self.open: dict[tuple[str, int], ProducerBatch] = {}  # the batch records are appended to
        self.last_batch: ProducerBatch | None = None  # the open batch appended to last (see continue_run)
        self.sticky: dict[str, int] = {}
        self.partition_counts: dict[str, int] = {}
        self.reserved_bytes = 0
        self.outstanding: set[asyncio.Future] = set()
        self.memory_waiters: collections.deque[asyncio.Future] = collections.deque()
        # Set when a batch becomes sendable: the sender's event from start() on (nothing waits on this one).
        self.wake = asyncio.Event()
        self.closing = False
        self.fatal: BaseException | None = None
        self.transactional = False  # batches carry the transactional attribute (a transactional producer)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, wake: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self.wake = wake

    def flush_nowait(self) -> None:
        """Close every open batch: all become ready to send now."""
        self.open.clear()
        self.last_batch = None
        self.wake.set()

    def fail_all(self, error: BaseException) -> None:
        """Complete every batch not yet acknowledged with ``error`` and drop them."""
        self.open.clear()
        self.last_batch = None
        for queue in self.batches.values():
            for batch in queue:
                self.complete(batch, error)
        self.batches.clear()

    def fail_unsent(self, predicate, error: BaseException) -> None:
        """Complete with ``error`` and drop every batch never sent whose partition ``predicate((topic,
        partition))`` holds (an aborted transaction's batches for partitions it never added)."""
        for tp, queue in self.batches.items():
            if not predicate(tp):
                continue
            for batch in [b for b in queue if not b.in_flight and b.attempts == 0]:
                queue.remove(batch)
                self.close_open(batch)
                self.complete(batch, error)

    def continue_run(self, topic: str, value, partition: int | None) -> DeliveryFuture | None:
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
        batch = self.last_batch
        if batch is None:
            return None
        if partition is None:
            partition = self.sticky.get(topic)
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

    def append(self, topic: str, value, key, partition: int | None, timestamp_ms: int | None,
               headers) -> DeliveryFuture:
        """Append a record to its partition's open batch, or to a new one; return its ``DeliveryFuture``.
        (``Producer.send_nowait`` tries ``continue_run`` first; this is every other record.)

        Raises:
            BufferFullError: ``buffer_memory`` is spent.
            NoMetadataError: no ``partition`` given and the topic's partition count is not known yet.
            KafkaError: UNKNOWN_TOPIC_OR_PARTITION for an explicit ``partition`` the topic does not have.
            ProducerClosedError: the producer is closing.
        """
        batch = self.last_batch
        # The last partition's batch (an explicit partition, or the sticky one) is checked against
        # _last_batch before the (topic, partition) lookup; a record without key and headers takes
        # BatchBuilder.append_value.
        if timestamp_ms is None:
            timestamp_ms = _time_ns() // 1_000_000
        if partition is None:
            partition = self.choose_partition(topic, key)
        elif batch is None or batch.partition != partition or batch.topic != topic:
            count = self.partition_counts.get(topic)
            if count is not None and not 0 <= partition < count:
                raise KafkaError(
                    UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r} has no partition {partition} (it has {count})"
                )
        if batch is None or batch.partition != partition or batch.topic != topic:
            batch = self.open.get((topic, partition))
        if batch is not None:
            if key is None and headers is None:
                offset_delta = batch.builder.append_value(timestamp_ms, value)
            else:
                offset_delta = batch.builder.append(timestamp_ms, key, value, headers)
            if offset_delta >= 0:
                self.last_batch = batch
                delivery = DeliveryFuture()
                delivery._batch = batch
                delivery._offset_delta = offset_delta
                delivery._timestamp = timestamp_ms
                return delivery
            # Full: close it (its reservation grows to its real size), wake the sender, and start a new
            # one (with a new sticky partition).
            self.close_open(batch)
            extra = batch.builder.size_bytes - batch.reserved_bytes
            if extra > 0:
                batch.reserved_bytes += extra
                self.reserved_bytes += extra
            self.wake.set()
            if key is None and self.sticky.get(topic) == partition and self.partition_counts.get(topic, 1) > 1:
                self.sticky[topic] = _next_sticky(topic, self.partition_counts[topic], partition)
        return self.append_to_new_batch((topic, partition), timestamp_ms, key, value, headers)

    def close_open(self, batch: ProducerBatch) -> None:
        """No more records go into ``batch`` (it is full, being sent, flushed or expired)."""
        tp = (batch.topic, batch.partition)
        if self.open.get(tp) is batch:
            del self.open[tp]
        if self.last_batch is batch:
            self.last_batch = None

    def choose_partition(self, topic: str, key) -> int:
        count = self.partition_counts.get(topic)
        if count is None:
            raise NoMetadataError(f"no metadata for topic {topic!r} yet: await send() or wait_for_topic() first")
        if key is not None:
            if self._partitioner is not None:
                return self._partitioner(key, count)
            return partition_for_key(key, count)
        partition = self.sticky.get(topic)
        if partition is None:
            partition = self.sticky[topic] = _next_sticky(topic, count, None)
        return partition

    def append_to_new_batch(self, tp, timestamp_ms: int, key, value, headers) -> DeliveryFuture:
        if self.closing:
            raise ProducerClosedError("producer is closed")
        if self.fatal is not None:
            raise self.fatal
        if self.reserved_bytes >= self.buffer_memory:
            raise BufferFullError(f"buffer_memory ({self.buffer_memory} bytes) is full")
        builder = BatchBuilder(batch_size=self.batch_size, codec=self.codec, gather_min_bytes=self.gather_min_bytes,
                               transactional=self.transactional)
        assert self._loop is not None  # start() ran: the producer starts its accumulator first
        future = self._loop.create_future()
        reservation = min(self.batch_size, _INITIAL_RESERVATION_BYTES)
        batch = ProducerBatch(tp[0], tp[1], builder, future, reservation)
        self.reserved_bytes += reservation
        if key is None and headers is None:
            offset_delta = builder.append_value(timestamp_ms, value)
        else:
            offset_delta = builder.append(timestamp_ms, key, value, headers)
        queue = self.batches.get(tp)
        if queue is None:
            queue = self.batches[tp] = collections.deque()
        queue.append(batch)
        self.open[tp] = batch
        self.last_batch = batch
        self.outstanding.add(future)
        future.add_done_callback(self.outstanding.discard)
        self.wake.set()
        delivery = DeliveryFuture()
        delivery._batch = batch
        delivery._offset_delta = offset_delta
        delivery._timestamp = timestamp_ms
        return delivery

    def complete(self, batch: ProducerBatch, outcome) -> None:
        if batch.future.done():
            return
        self.reserved_bytes -= batch.reserved_bytes
        if isinstance(outcome, BaseException):
            log.warning("batch of %d records for %s-%s failed: %s",
                        _record_count(batch), batch.topic, batch.partition, outcome)
            batch.future.set_exception(outcome)
            batch.future.exception()  # logged here once; callers awaiting their DeliveryFuture still get it
        else:
            self.stats["batches"] += 1
            self.stats["records"] += batch.built.record_count if batch.built is not None else 0
            batch.future.set_result(outcome)
        while self.memory_waiters and self.reserved_bytes < self.buffer_memory:
            waiter = self.memory_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)


def _record_count(batch: ProducerBatch) -> int:
    if batch.built is not None:
        return batch.built.record_count
    return batch.builder.record_count


def _next_sticky(topic: str, count: int, previous: int | None) -> int:
    if count <= 1:
        return 0
    choice = random.randrange(count - 1)
    if previous is not None and choice >= previous:
        choice += 1
    return choice
