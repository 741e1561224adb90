"""The producer's sender: ready batches into Produce requests to each partition's leader, and their outcome.

Owns the sender task (Kafka's ``Sender``): it drains ready batches - full, older than ``linger_ms``, or
flushing - from the ``RecordAccumulator``, one batch per partition per request (Kafka rejects more for
magic 2), grouped by leader, at most ``max_in_flight_requests_per_connection`` requests per broker, each
request one gathered ``sendmsg``; each acknowledgement, handled in the connection's read handler, refills
the in-flight window at once. It also owns the idempotent producer's state: the producer id and epoch
(InitProducerId) and each partition's next sequence.

Idempotence (on by default, as in Kafka >= 3.0): batches are numbered with sequences and a failed batch is
retried with the *same* sequence, so a retry after a lost response is deduplicated by the broker instead of
written twice. Batches of a partition are retried in sequence order; a batch that fails for good resets
the producer id (Kafka's "reset producer id" path) so later batches are not stuck behind a sequence gap.
Without idempotence (acks 0/1) retries are still made, but a retried batch may land after a newer one and
a lost acknowledgement may duplicate a batch, exactly as with the Java client.

Failures: a lost connection, a timeout and the retriable errors (NOT_LEADER_OR_FOLLOWER, the leader-epoch
errors, LEADER_NOT_AVAILABLE, NOT_ENOUGH_REPLICAS(_AFTER_APPEND), REQUEST_TIMED_OUT, ...) put the batch
back at the head of its partition after ``retry_backoff_ms``; the leader errors and lost connections also
refresh metadata, so the retry goes to the partition's new leader. ``delivery_timeout_ms`` bounds a batch
from its first record to its outcome, retries included, as Kafka's producer does. Loop thread only.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import logging
import time
from typing import TYPE_CHECKING

from kio.schema.init_producer_id.v1.request import InitProducerIdRequest
from kio.schema.init_producer_id.v1.response import InitProducerIdResponse
from kio.static.primitive import i32Timedelta

from copyless.client.accumulator import ProducerBatch, RecordAccumulator
from copyless.client.cluster import LEADER_ERRORS, Cluster
from copyless.client.errors import ClientError, KafkaConnectionError, KafkaError, KafkaTimeoutError
from copyless.protocol.messages import ApiKey, decode_produce_response, encode_produce_request
from copyless.protocol.records import NO_PRODUCER_ID

if TYPE_CHECKING:
    from copyless.client.transactions import TransactionManager

__all__ = ["Sender"]

log = logging.getLogger("copyless.client.producer")

DUPLICATE_SEQUENCE_NUMBER = 46
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
UNKNOWN_PRODUCER_ID = 59
INVALID_PRODUCER_EPOCH = 47
PRODUCER_FENCED = 90
# Errors after which the partition's leader may have moved: refresh metadata before retrying.
_METADATA_ERRORS = LEADER_ERRORS


class Sender:
    """Sends the accumulator's batches (see the module docstring). Create, then ``start()``.

    Args: the ``Producer``'s settings of the same names, its ``Cluster``, ``RecordAccumulator`` and
    ``stats`` counters.
    """

    def __init__(
        self,
        cluster: Cluster,
        accumulator: RecordAccumulator,
        *,
        acks: int,
        linger_ms: float,
        retries: int,
        retry_backoff_ms: int,
        delivery_timeout_ms: int,
        request_timeout_ms: int,
        max_in_flight: int,
        max_request_size: int,
        enable_idempotence: bool,
        stats: dict,
    ) -> None:
        self._cluster = cluster
        self._accumulator = accumulator
        self.acks = acks
        self.linger_ms = linger_ms
        self.retries = retries
        self.retry_backoff_ms = retry_backoff_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.request_timeout_ms = request_timeout_ms
        self.max_in_flight = max_in_flight
        self.max_request_size = max_request_size
        self.enable_idempotence = enable_idempotence
        self.stats = stats
        self._in_flight_partitions: dict[tuple[str, int], int] = collections.defaultdict(int)
        self._retrying: set[tuple[str, int]] = set()
        self._next_sequence: dict[tuple[str, int], int] = collections.defaultdict(int)
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = -1
        self.need_producer_id = enable_idempotence
        # A transactional producer's TransactionManager: batches wait for their partition to be added to
        # the transaction, and failures go to it (the producer id is its business, never reset here).
        self.txn: TransactionManager | None = None
        self._connecting_nodes: set[int] = set()
        self.flushing = 0
        self.closed = False
        self.task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.task = self._loop.create_task(self.run(), name="copyless-producer-sender")

    async def stop(self) -> None:
        self.closed = True
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):
                pass

    async def init_producer_id(self) -> None:
        connection = await self._cluster.any_connection()
        deadline = time.monotonic() + self.request_timeout_ms / 1000
        while True:
            response = await connection.request_kio(
                InitProducerIdRequest(transactional_id=None,
                                      transaction_timeout=i32Timedelta.parse(_ms(60_000))), InitProducerIdResponse
            )
            code = int(response.error_code)
            if code == 0:
                break
            error = KafkaError(code, "InitProducerId")
            if not error.retriable or time.monotonic() > deadline:
                raise error
            await asyncio.sleep(self.retry_backoff_ms / 1000)
        self.set_producer_id(int(response.producer_id), int(response.producer_epoch))

    def set_producer_id(self, producer_id: int, producer_epoch: int) -> None:
        """A new producer id or epoch: every partition's sequences start again at 0."""
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self._next_sequence.clear()
        self.need_producer_id = False

    async def run(self) -> None:
        acc = self._accumulator
        wake = acc.wake
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
                if self.need_producer_id:
                    await self._reset_producer_id()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: fail everything loudly rather than hang
            log.exception("producer sender failed")
            acc.fatal = ClientError(f"producer sender failed: {exc!r}")
            acc.open.clear()
            acc.last_batch = None
            for queue in acc.batches.values():
                for batch in queue:
                    acc.complete(batch, acc.fatal)

    async def _reset_producer_id(self) -> None:
        acc = self._accumulator
        try:
            await self.init_producer_id()
        except Exception as exc:
            log.warning("InitProducerId failed: %s", exc)
            self.need_producer_id = True
            await asyncio.sleep(self.retry_backoff_ms / 1000)
            return
        # Renumber every batch not yet acknowledged, partition by partition, in order.
        for tp, queue in acc.batches.items():
            sequence = 0
            for batch in queue:
                if batch.built is not None and not batch.in_flight:
                    batch.sequence = sequence
                    batch.built.set_producer_state(self.producer_id, self.producer_epoch, sequence)
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
        acc = self._accumulator
        now = time.monotonic()
        linger_s = self.linger_ms / 1000
        flushing = bool(self.flushing) or acc.closing
        delivery_timeout_s = self.delivery_timeout_ms / 1000
        by_node: dict[int, list[ProducerBatch]] = {}
        next_due: float | None = None
        blocked = False
        metadata = self._cluster.metadata
        for tp, queue in acc.batches.items():
            if not queue:
                continue
            batch = queue[0]
            if batch.in_flight:
                # Idempotent pipelining: a partition's next batch may go while earlier ones are in flight,
                # unless the partition is retrying (then strictly one at a time, in sequence order).
                if tp in self._retrying:
                    continue
                waiting = next((b for b in queue if not b.in_flight), None)
                if waiting is None or self._in_flight_partitions[tp] >= self.max_in_flight:
                    continue
                batch = waiting
            if now - batch.created > delivery_timeout_s:
                self._expire(tp, batch)
                continue
            ready = flushing or batch is not acc.open.get(tp)
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
            txn = self.txn
            if txn is not None and tp not in txn.added:
                if txn.error is not None:
                    self._fail_queue(tp, txn.error)
                else:
                    txn.want_partition(tp)  # wakes the sender once added
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

    def _send_to_node(self, node_id: int, batches: list[ProducerBatch]) -> bool:
        acc = self._accumulator
        connection = self._cluster.connection_nowait(node_id)
        if connection is None:
            if node_id not in self._connecting_nodes:
                self._connecting_nodes.add(node_id)
                assert self._loop is not None  # start() ran: it runs this loop's task
                self._loop.create_task(self._connect_node(node_id))
            return False
        if connection.in_flight_count >= self.max_in_flight:
            return False
        topics: dict[str, list] = {}
        request_bytes = 0
        sent: list[ProducerBatch] = []
        for batch in batches:
            tp = (batch.topic, batch.partition)
            if batch.built is None:
                acc.close_open(batch)
                if self.enable_idempotence:
                    batch.sequence = self._next_sequence[tp]
                    self._next_sequence[tp] = (batch.sequence + batch.builder.record_count) % (1 << 31)
                    batch.built = batch.builder.build(self.producer_id, self.producer_epoch, batch.sequence)
                else:
                    batch.built = batch.builder.build()
                if batch.built.size_bytes > batch.reserved_bytes:
                    acc.reserved_bytes += batch.built.size_bytes - batch.reserved_bytes
                    batch.reserved_bytes = batch.built.size_bytes
            if sent and request_bytes + batch.built.size_bytes > self.max_request_size:
                continue
            request_bytes += batch.built.size_bytes
            topics.setdefault(batch.topic, []).append((batch.partition, batch.built.buffers, batch.built.size_bytes))
            batch.in_flight = True
            batch.attempts += 1
            self._in_flight_partitions[tp] += 1
            sent.append(batch)
        transactional_id = self.txn.transactional_id if self.txn is not None else None
        body = encode_produce_request(self.acks, self.request_timeout_ms, topics, transactional_id)
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
                acc.complete(batch, (-1, -1, -1))
        return True

    async def _connect_node(self, node_id: int) -> None:
        acc = self._accumulator
        try:
            await self._cluster.connection(node_id)
        except Exception as exc:
            self.stats["connect_failures"] += 1
            log.info("cannot connect to broker %s (batches wait, up to delivery_timeout_ms): %s", node_id, exc)
            await asyncio.sleep(self.retry_backoff_ms / 1000)
            self._cluster.request_update(list({tp[0] for tp in acc.batches}))
        finally:
            self._connecting_nodes.discard(node_id)
        if acc.wake is not None:
            acc.wake.set()

    def _finish_in_flight(self, batch: ProducerBatch) -> None:
        acc = self._accumulator
        tp = (batch.topic, batch.partition)
        batch.in_flight = False
        self._in_flight_partitions[tp] -= 1
        queue = acc.batches.get(tp)
        if queue is not None:
            try:
                queue.remove(batch)
            except ValueError:
                pass

    def _on_produce_response(self, sent: list[ProducerBatch], response, error: BaseException | None) -> None:
        """The outcome of a produce request: ``response`` (decoded partitions) or the ``error`` that failed
        it (connection closed or timed out). Called by the connection, from its read handler."""
        acc = self._accumulator
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
                acc.complete(batch, (base_offset, result.log_append_time_ms, result.log_start_offset))
                continue
            error = KafkaError(code, f"producing to {batch.topic}-{batch.partition}")
            if code in _METADATA_ERRORS:
                retry_topics.add(batch.topic)
            if self.txn is not None and code in (UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_EPOCH, PRODUCER_FENCED):
                pass  # the transaction's to handle: fenced (fatal) or lost by the broker (abortable, KIP-360)
            elif code in (UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_EPOCH) and self.enable_idempotence:
                self.need_producer_id = True
                error.retriable = True
            elif code == OUT_OF_ORDER_SEQUENCE_NUMBER:
                # An earlier batch of the partition failed: this one is retried after it, same sequence.
                error.retriable = True
            self._retry_or_fail(batch, error)
        if retry_topics:
            self._cluster.request_update(retry_topics)
        elif self.task is not None and not self.task.done() and not self.need_producer_id:
            # Fill the in-flight window this acknowledgement opened now, from the read handler, rather than
            # when the sender task next runs. Behind an application that yields to the event loop rarely
            # (benchmarks.client: every 8192 records, ~7 ms) every trip through the loop's ready queue - a
            # future's done-callback, the sender task's wake-up - waits for the application's next yield,
            # so the window of 5 requests was refilled every other yield only, slower than 256 KiB batches
            # filled (~3.4 per yield there): measured, ~2.5 requests per yield and up to buffer_memory
            # (~120 batches) queued by the end of a 1M-record run; refilled here, every batch is sent at
            # the yield after it fills and ~5-10 are queued at the end.
            self._send_ready()
        acc.wake.set()

    def _on_produce_failed(self, sent: list[ProducerBatch], exc: BaseException) -> None:
        acc = self._accumulator
        for batch in sent:
            self._retry_or_fail(batch, exc)
        if not self.closed:  # (connections closed by close() fail their requests from inside it)
            self._cluster.request_update({batch.topic for batch in sent})
        if acc.wake is not None:
            acc.wake.set()

    def _retry_or_fail(self, batch: ProducerBatch, error: BaseException) -> None:
        acc = self._accumulator
        tp = (batch.topic, batch.partition)
        batch.in_flight = False
        self._in_flight_partitions[tp] -= 1
        retriable = getattr(error, "retriable", False)
        expired = time.monotonic() - batch.created > self.delivery_timeout_ms / 1000
        if retriable and batch.attempts <= self.retries and not expired and not self.closed:
            self.stats["retries"] += 1
            batch.retry_at = time.monotonic() + self.retry_backoff_ms / 1000
            self._retrying.add(tp)
            # Keep the partition's batches in sequence order: this one goes back before newer ones.
            queue = acc.batches.get(tp)
            if queue is not None and batch in queue:
                ordered = sorted(queue, key=lambda b: (b.built is None, b.sequence if b.built else 0))
                queue.clear()
                queue.extend(ordered)
            return
        self._finish_in_flight_failed(batch)
        if self.txn is not None:
            self.txn.fail(error, lost_sequence=True)
        elif self.enable_idempotence and isinstance(error, KafkaError):
            # A sequence was lost for good: later batches would be out of order. Start a new producer id.
            self.need_producer_id = True
        if expired and retriable:
            error = KafkaTimeoutError(f"delivery_timeout_ms expired for {tp[0]}-{tp[1]}: {error}")
        acc.complete(batch, error)

    def _finish_in_flight_failed(self, batch: ProducerBatch) -> None:
        acc = self._accumulator
        tp = (batch.topic, batch.partition)
        queue = acc.batches.get(tp)
        if queue is not None:
            try:
                queue.remove(batch)
            except ValueError:
                pass
        self._retrying.discard(tp)

    def _fail_queue(self, tp, error: BaseException) -> None:
        """Fail every unsent batch of ``tp`` (its partition could not join the transaction)."""
        acc = self._accumulator
        queue = acc.batches[tp]
        for batch in [b for b in queue if not b.in_flight]:
            queue.remove(batch)
            acc.close_open(batch)
            acc.complete(batch, error)
        self._retrying.discard(tp)

    def _expire(self, tp, batch: ProducerBatch) -> None:
        acc = self._accumulator
        queue = acc.batches[tp]
        queue.remove(batch)
        acc.close_open(batch)
        if self.txn is not None:
            lost = batch.built is not None
            self.txn.fail(KafkaTimeoutError(f"batch for {tp[0]}-{tp[1]} expired"), lost_sequence=lost)
        elif batch.built is not None and self.enable_idempotence:
            self.need_producer_id = True  # its sequence numbers will never be written: start over
        self._retrying.discard(tp)
        acc.complete(
            batch,
            KafkaTimeoutError(f"batch for {tp[0]}-{tp[1]} not delivered within "
                              f"delivery_timeout_ms={self.delivery_timeout_ms}"),
        )


def _ms(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)
