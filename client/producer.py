"""The asyncio producer: per-partition batching, idempotent retries, gathered writes, back-pressure.

Owns the public ``Producer`` API and composes the two halves of the work, one idea each:
- ``accumulator.RecordAccumulator``: records appended into per-partition batches (``BatchBuilder``, pure,
  encodes them with large values kept as separate buffers), the sticky partition, ``buffer_memory``;
- ``sender.Sender``: the task that sends ready batches to each partition's leader and settles them,
  with idempotent sequences, retries across leader moves, and ``delivery_timeout_ms``.

``await producer.send(...)`` appends and returns the record's ``DeliveryFuture`` without suspending when
the partition's batch has room (it waits only for metadata or ``buffer_memory``); ``await handle`` (or
``send_and_wait``) waits for the acknowledgement. The per-record path - the accumulator's
``continue_run``, the last partition's open batch with ``BatchBuilder.append_value``'s fast case inlined
for records without key and headers, the handle - is one call from ``send``: ~0.8 us of CPU per 100-byte
record with its share of the sender, against ~1.0-1.2 us when it called ``append_value``, ~1.9 us for the
design before, and ~5.6-6.3 us for aiokafka's ``send`` (benchmarks/client.py --quick, this machine).
"""

from __future__ import annotations

import asyncio
import logging

from copyless.client.accumulator import (
    DEFAULT_BATCH_BYTES,
    DeliveryFuture,
    NoMetadataError,
    RecordAccumulator,
    RecordMetadata,
)
from copyless.client.cluster import Cluster
from copyless.client.conn import DEFAULT_REQUEST_TIMEOUT_MS
from copyless.client.errors import (
    BufferFullError,
    ClientError,
    KafkaError,
    ProducerClosedError,
    TransactionStateError,
)
from copyless.client.security import resolve as resolve_security
from copyless.client.sender import Sender
from copyless.client.transactions import TransactionManager
from copyless.protocol.batch_builder import CODECS, GATHER_MIN_VALUE_BYTES
from copyless.protocol.messages import ApiKey
from copyless.protocol.records import CODEC_ZSTD

__all__ = ["Producer", "RecordMetadata", "DeliveryFuture", "NoMetadataError"]

log = logging.getLogger("copyless.client.producer")

UNKNOWN_TOPIC_OR_PARTITION = 3


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
        transactional_id: makes the producer transactional (``init_transactions``, ``begin_transaction``,
            ``send_offsets_to_transaction``, ``commit_transaction``, ``abort_transaction``; see
            ``client.transactions``); implies idempotence and acks=all.
        transaction_timeout_ms: the coordinator aborts (and fences) a transaction open longer than this.
        max_block_ms: how long a transactional call retries its coordinator before ``KafkaTimeoutError``.
        security, or security_protocol / sasl_mechanism / sasl_plain_username / sasl_plain_password /
            ssl_cafile / ssl_certfile / ssl_keyfile / ssl_password / ssl_check_hostname / ssl_context: TLS and
            SASL (``client.security``).
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
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
        max_block_ms: int = 60_000,
        security=None,
        **security_options,
    ) -> None:
        if transactional_id is not None:
            # Kafka's rules: a transactional producer is idempotent, and so acks=all.
            if enable_idempotence is False:
                raise ValueError("a transactional producer needs enable_idempotence")
            if acks not in ("all", -1, "-1"):
                raise ValueError("a transactional producer needs acks='all'")
            enable_idempotence = True
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
        self._cluster = Cluster(
            bootstrap_servers,
            client_id=client_id,
            request_timeout_ms=request_timeout_ms,
            gather_min_bytes=gather_min_bytes,
            retry_backoff_ms=retry_backoff_ms,
            security=resolve_security(security, security_options),
        )
        self.stats = {"requests": 0, "batches": 0, "records": 0, "retries": 0, "connect_failures": 0}
        self._accumulator = RecordAccumulator(
            batch_size=batch_size,
            codec=self.codec,
            gather_min_bytes=gather_min_bytes,
            buffer_memory=buffer_memory,
            partitioner=partitioner,
            stats=self.stats,
        )
        # The per-record call, bound once: ``send`` reaches it with one instance-dict lookup.
        self._continue_run = self._accumulator.continue_run
        self._sender = Sender(
            self._cluster,
            self._accumulator,
            acks=self.acks,
            linger_ms=linger_ms,
            retries=retries,
            retry_backoff_ms=retry_backoff_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            request_timeout_ms=request_timeout_ms,
            max_in_flight=max_in_flight_requests_per_connection,
            max_request_size=max_request_size,
            enable_idempotence=enable_idempotence,
            stats=self.stats,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._txn: TransactionManager | None = None
        if transactional_id is not None:
            self._accumulator.transactional = True
            self._txn = TransactionManager(
                self._cluster, self._sender, self._accumulator, transactional_id,
                transaction_timeout_ms=transaction_timeout_ms, retry_backoff_ms=retry_backoff_ms,
                max_block_ms=max_block_ms)
            self._sender.txn = self._txn
            self._sender.need_producer_id = False
            # The state check goes on the transactional producer's own send methods only: the
            # non-transactional per-record path stays as it is.
            self._check_can_send = self._txn.check_can_send
            # Instance attributes over the methods, on purpose (the non-transactional path keeps no check).
            self.send = self._send_in_transaction  # type: ignore[method-assign]
            self.send_nowait = self._send_nowait_in_transaction  # type: ignore[method-assign]

    # --- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, load metadata and (with idempotence) get a producer id."""
        self._loop = asyncio.get_running_loop()
        self._accumulator.start(asyncio.Event())
        await self._cluster.start()
        if self.codec == CODEC_ZSTD:
            connection = await self._cluster.any_connection()
            if not connection.supports(ApiKey.PRODUCE, 7):
                raise ClientError("zstd needs Produce v7, which the broker does not support")
        if self.enable_idempotence and self._txn is None:
            await self._sender.init_producer_id()
        self._sender.start()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def wait_for_topic(self, topic: str, timeout_ms: int = 60_000) -> int:
        """Load ``topic``'s metadata (so ``send_nowait`` can partition for it); return its partition count.

        Raises:
            KafkaError: the topic's error (INVALID_TOPIC_EXCEPTION at once), or UNKNOWN_TOPIC_OR_PARTITION
                when it does not appear (nor is created) within ``timeout_ms``.
        """
        count = await self._cluster.wait_for_topic(topic, timeout_ms)
        self._accumulator.partition_counts[topic] = count
        return count

    async def partitions_for(self, topic: str) -> list[int]:
        return list(range(await self.wait_for_topic(topic)))

    # --- sending ------------------------------------------------------------------------------------------

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
        return self._accumulator.append(topic, value, key, partition, timestamp_ms, headers)

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
        if partition is not None and topic not in self._accumulator.partition_counts:
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
                    self._accumulator.partition_counts[topic] = count
            except BufferFullError:
                assert self._loop is not None  # start() ran before any send
                waiter = self._loop.create_future()
                self._accumulator.memory_waiters.append(waiter)
                await waiter
            except NoMetadataError:
                await self.wait_for_topic(topic)

    # --- transactions -------------------------------------------------------------------------------------

    def _transactions(self) -> TransactionManager:
        if self._txn is None:
            raise TransactionStateError("not a transactional producer: pass transactional_id")
        return self._txn

    async def init_transactions(self) -> None:
        """Get the transactional id's producer id and a new epoch (InitProducerId), fencing every older
        producer of the id; an open transaction of theirs is aborted first. Call once, after ``start``."""
        await self._transactions().init_transactions()

    def begin_transaction(self) -> None:
        """Start a transaction: records sent from now on commit or abort together."""
        self._transactions().begin_transaction()

    async def send_offsets_to_transaction(self, offsets: dict, group_id, *, generation_id: int = -1,
                                          member_id: str = "", group_instance_id: str | None = None) -> None:
        """Commit ``offsets`` (``{(topic, partition): next offset to consume}``) for ``group_id`` as part of
        the transaction: the group sees them only if it commits. ``group_id`` may be a group ``Consumer``,
        whose group id, generation and member id are then checked by the coordinator (KIP-447)."""
        if not isinstance(group_id, str):
            consumer = group_id
            group_id = consumer.group_id
            membership = getattr(consumer, "_membership", None)
            if membership is not None and membership.generation >= 0:
                generation_id, member_id = membership.generation, membership.member_id
        await self._transactions().send_offsets(offsets, group_id, generation_id, member_id, group_instance_id)

    async def commit_transaction(self) -> None:
        """Flush, then commit (EndTxn). Raises ``TransactionAbortableError`` when the transaction cannot
        commit (call ``abort_transaction``), ``ProducerFencedError`` when a newer producer took over."""
        await self._transactions().commit(self.flush)

    async def abort_transaction(self) -> None:
        """Abort: records not yet sent are dropped, the rest are never seen by read_committed consumers."""
        await self._transactions().abort(self.flush)

    def _send_nowait_in_transaction(self, topic: str, value=None, key=None, **kwargs) -> DeliveryFuture:
        self._check_can_send()
        return Producer.send_nowait(self, topic, value, key, **kwargs)

    async def _send_in_transaction(self, topic: str, value=None, key=None, **kwargs) -> DeliveryFuture:
        self._check_can_send()
        return await Producer.send(self, topic, value, key, **kwargs)

    async def send_and_wait(self, topic: str, value=None, key=None, **kwargs) -> RecordMetadata:
        """Send one record and wait for its acknowledgement."""
        delivery = await self.send(topic, value, key, **kwargs)
        self.flush_nowait()
        return await delivery

    def flush_nowait(self) -> None:
        """Make every open batch ready now (without waiting for the acknowledgements)."""
        self._accumulator.flush_nowait()

    async def flush(self) -> None:
        """Send every buffered record now and wait until all are acknowledged (or failed)."""
        sender = self._sender
        outstanding = self._accumulator.outstanding
        sender.flushing += 1
        try:
            self.flush_nowait()
            while outstanding:
                await asyncio.wait(list(outstanding))
                if sender.task is None or sender.task.done():
                    break
        finally:
            sender.flushing -= 1

    async def close(self, timeout_s: float | None = None) -> None:
        """Flush, then stop the sender and close connections. Records still unsent fail with
        ``ProducerClosedError`` if the flush does not finish within ``timeout_s``."""
        if self._closed:
            return
        self._accumulator.closing = True
        try:
            if self._sender.task is not None:
                async with asyncio.timeout(timeout_s):
                    await self.flush()
        except TimeoutError:
            pass
        finally:
            self._closed = True
            await self._sender.stop()
            self._accumulator.fail_all(ProducerClosedError("producer closed before the batch was sent"))
            await self._cluster.close()
