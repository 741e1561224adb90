"""The client side of ``benchmarks.throughput``: what each worker process runs, and what it reports.

Owns ``Workload`` (what one measured run asks for), ``WorkerResult`` (what one producer or consumer worker
measured, sent back as a dict), and the producers and consumers themselves: confluent-kafka (librdkafka),
copyless's own client, and ``raw-fetch``, a Fetch v4 loop that reads batch headers and drops record bytes in
the kernel. ``worker_main`` is the entry point of a worker process (``workloads.run_workload`` forks them
from a clean forkserver): everything here must import without side effects, and a worker never touches the
broker except through its client.

A worker signals "connected" once on the ready queue, waits for the start event (so every worker's clock
starts together), and consumers learn the end offsets to reach from their own queue once the producers are
done.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import socket
import struct
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks._harness import cpu_seconds
from copyless.broker.server.app import M_MMAP_THRESHOLD, M_TOP_PAD, M_TRIM_THRESHOLD, apply_mallopt

WORKER_TIMEOUT_S = 300.0
_TIMESTAMP = struct.Struct("!q")  # scheduled send time (monotonic ns) at the head of latency payloads
# Consumers for the fetch-path comparison: a raw Fetch loop (the broker's serving rate) and librdkafka.
FETCH_CLIENTS = ("raw-fetch", "confluent-kafka")


@dataclass(frozen=True)
class Workload:
    section: str
    record_bytes: int = 1000
    records: int = 10_000
    producers: int = 1
    consumers: int = 1
    acks: str = "1"
    partitions: int = 1
    client: str = "confluent-kafka"
    rate_per_s: int | None = None       # latency workloads: offered records/s per producer
    duration_s: float | None = None     # latency workloads: how long the rate is offered
    concurrent: bool = False            # consumers run while producers produce
    consume_only: bool = False          # re-read an existing topic (sendfile section)
    read_passes: int = 1                # consumers read the topic this many times (a longer window) ...
    read_seconds: float = 0.0           # ... or, when set, until this long (at most read_passes times)
    topic: str = ""
    label: str = ""
    replication_factor: int = 1         # a cluster's topics: replicas per partition ...
    topic_configs: tuple[tuple[str, str], ...] = ()  # ... and topic settings (min.insync.replicas)
    precreated: bool = False            # the topic exists already (created and checked by the caller)


@dataclass
class WorkerResult:
    role: str
    records: int = 0
    bytes: int = 0
    started: float = 0.0      # monotonic seconds
    first_at: float = 0.0     # consumers: when the fetch that returned the first record was asked for
    finished: float = 0.0
    errors: int = 0
    # (scheduled send time ns, latency ms): the orchestrator drops the warm-up seconds by schedule
    latencies_ms: list[tuple[int, float]] = field(default_factory=list)
    e2e_ms: list[tuple[int, float]] = field(default_factory=list)
    end_offsets: dict[int, int] = field(default_factory=dict)
    partitions: list[int] = field(default_factory=list)  # consumers: the partitions read ...
    passes: int = 0                                       # ... and how many times each was read in full
    # Consumers: CPU seconds of the Python thread that takes the records from the client library, from the
    # first record's fetch to the last record; less ``restart_cpu_s`` and divided by the MB/s window, it says
    # whether the consumer itself was the limit (1.0: its thread never waited for the broker).
    thread_cpu_s: float = 0.0
    # Producers: CPU seconds of the whole worker process over its produce window (``thread_cpu_s`` is then
    # the thread queuing the records): librdkafka builds and sends the batches on threads of its own.
    process_cpu_s: float = 0.0
    # Consumers: seconds from each seek back to offset 0 until that pass's first records are in hand, left
    # out of the consume window (see _Reading.restarted).
    restart_s: float = 0.0
    restart_cpu_s: float = 0.0  # ... and the Python thread's CPU seconds in those gaps
    # Consumers of a log already written (not concurrent workloads): seconds spent in library calls that
    # came back with fewer records than asked while the pass still had records to come, outside the restart
    # gaps. Over the window it says whether the client ever waited for the broker (0: it never did).
    waited_s: float = 0.0
    error_text: str = ""


def _confluent_producer_config(bootstrap: str, acks: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "acks": acks,
        "linger.ms": 5,                     # the anchors README's setting: Kafka 4's default
        "enable.idempotence": False,        # acks 0/1 cannot be idempotent; keep every run alike
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "message.max.bytes": 2_000_000,
        "compression.type": "none",
    }


def _payload(record_bytes: int) -> bytes:
    # Incompressible and non-zero so nothing on the way can take a shortcut.
    return os.urandom(max(record_bytes, _TIMESTAMP.size))


class _ProduceClock:
    """A producer's window: wall time (``WorkerResult.started``/``finished``) and the CPU its queuing thread
    and its whole process used in it. Set against the broker's CPU over the same window (``run_workload``),
    it tells a producer that had the cores from one that waited for them."""

    def __init__(self, result: WorkerResult) -> None:
        self.result = result
        result.started = time.monotonic()
        self.thread_from = time.thread_time()
        self.process_from = cpu_seconds()

    def stop(self) -> None:
        self.result.finished = time.monotonic()
        self.result.thread_cpu_s = time.thread_time() - self.thread_from
        self.result.process_cpu_s = cpu_seconds() - self.process_from


# A throughput producer queues records PRODUCE_BATCH at a time with ``produce_batch`` and asks for delivery
# reports of failures only: with one ``produce()`` call and one success callback per record, the Python loop
# was the limit (100 B: 32 MB/s against either broker, 73 MB/s batched, on this machine). Latency
# workloads keep ``produce()``: they need each record's own send time and delivery report.
PRODUCE_BATCH = 1000


def _produce_confluent(bootstrap: str, work: Workload, ready, start_event, result: WorkerResult,
                       records: int) -> None:
    from confluent_kafka import Producer

    latency = work.rate_per_s is not None
    config = _confluent_producer_config(bootstrap, work.acks)
    if not latency:
        config["delivery.report.only.error"] = True
    producer = Producer(config)
    base = _payload(work.record_bytes)
    tail = base[_TIMESTAMP.size: work.record_bytes]
    now_ns = time.monotonic_ns

    def on_delivery(err, message) -> None:
        if err is not None:
            result.errors += 1
            if not result.error_text:
                result.error_text = str(err)
            return
        result.records += 1
        if latency:
            scheduled = _TIMESTAMP.unpack_from(message.value())[0]
            result.latencies_ms.append((scheduled, (now_ns() - scheduled) / 1e6))

    # Connect and load metadata before the clock starts (a cold first request is not steady-state latency).
    producer.list_topics(work.topic, timeout=30)
    ready.put("producer")
    start_event.wait()
    clock = _ProduceClock(result)
    if not latency:
        _produce_batched(producer, work, base[: work.record_bytes], records, on_delivery, result)
        clock.stop()
        return
    interval_ns = int(1e9 / work.rate_per_s)
    start_ns = now_ns()
    produce = producer.produce
    for i in range(records):
        scheduled = start_ns + i * interval_ns
        # Wait inside poll(): delivery reports are served (and their latency taken) while pacing.
        while True:
            delay = scheduled - now_ns()
            if delay <= 0:
                break
            producer.poll(min(delay / 1e9, 0.001))
        value = _TIMESTAMP.pack(scheduled) + tail
        while True:
            try:
                produce(work.topic, value, on_delivery=on_delivery)
                break
            except BufferError:  # local queue full: serve delivery reports, then retry
                producer.poll(0.001)
        producer.poll(0)
    _flush(producer, result)
    clock.stop()
    result.bytes = result.records * work.record_bytes


def _produce_batched(producer, work: Workload, value: bytes, records: int, on_delivery,
                     result: WorkerResult) -> None:
    """Queue ``records`` copies of ``value`` PRODUCE_BATCH at a time; only failures are reported, so the
    delivered count is what was queued less the failures and what is still undelivered after flush."""
    messages = [{"value": value} for _ in range(PRODUCE_BATCH)]
    queued = 0
    while queued < records:
        pending = messages[: min(PRODUCE_BATCH, records - queued)]
        while pending:
            queued += producer.produce_batch(work.topic, pending, on_delivery=on_delivery)
            # A full local queue fails the rest with _QUEUE_FULL (no delivery report): serve delivery
            # reports, then queue those again.
            pending = [m for m in pending if m.pop("_error", None) is not None]
            if pending:
                producer.poll(0.001)
        producer.poll(0)
    _flush(producer, result)
    result.records = queued - result.errors
    result.bytes = result.records * work.record_bytes


def _flush(producer, result: WorkerResult) -> None:
    """Wait for every delivery report; what is still queued after two minutes counts as an error."""
    remaining = producer.flush(120)
    if remaining:
        result.errors += remaining
        result.error_text = result.error_text or f"{remaining} records undelivered after flush"


def _run_on_uvloop(main) -> None:
    """Run the coroutine function ``main`` on uvloop, the loop copyless's client is measured on; on asyncio's
    own loop where uvloop is not installed."""
    import asyncio

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


def _produce_copyless(bootstrap: str, work: Workload, ready, start_event, result: WorkerResult,
                      records: int) -> None:
    import asyncio

    from copyless.client.producer import Producer  # the project's own client

    latency = work.rate_per_s is not None

    async def run() -> None:
        producer = Producer(bootstrap, acks=work.acks if work.acks != "all" else "all", linger_ms=5,
                            batch_size=256 * 1024, buffer_memory=64 << 20)
        await producer.start()
        try:
            await producer.wait_for_topic(work.topic)
            base = _payload(work.record_bytes)
            tail = base[_TIMESTAMP.size: work.record_bytes]
            value_plain = base[: work.record_bytes]
            now_ns = time.monotonic_ns

            def delivered(future, scheduled=None) -> None:
                if future.exception() is not None:
                    result.errors += 1
                    result.error_text = result.error_text or repr(future.exception())
                    return
                result.records += 1
                if scheduled is not None:
                    result.latencies_ms.append((scheduled, (now_ns() - scheduled) / 1e6))

            ready.put("producer")
            await asyncio.get_running_loop().run_in_executor(None, start_event.wait)
            clock = _ProduceClock(result)
            start_ns = now_ns()
            interval_ns = int(1e9 / work.rate_per_s) if latency else 0
            for i in range(records):
                scheduled = None
                if latency:
                    scheduled = start_ns + i * interval_ns
                    delay = scheduled - now_ns()
                    if delay > 0:
                        await asyncio.sleep(delay / 1e9)
                    value = _TIMESTAMP.pack(scheduled) + tail
                else:
                    value = value_plain
                future = await producer.send(work.topic, value)
                future.add_done_callback(lambda f, s=scheduled: delivered(f, s))
                if i % 512 == 0:
                    await asyncio.sleep(0)
            await producer.flush()
            clock.stop()
        finally:
            await producer.close()

    _run_on_uvloop(run)
    result.bytes = result.records * work.record_bytes


class _Reading:
    """A consumer worker's progress through its partitions: the end offsets to reach (sent by the
    orchestrator once the producers are done), the next offset wanted per partition, and the passes read.
    A consumer may read its topic from offset 0 again (``Workload.read_passes``, ``read_seconds``): one pass
    can be too short a window to time."""

    def __init__(self, partitions: list[int], ends_queue, work: Workload, result: WorkerResult) -> None:
        self.partitions = partitions
        self.ends_queue = ends_queue
        self.max_passes = max(1, work.read_passes)
        self.min_seconds = work.read_seconds
        self.result = result  # its ``passes`` tells the orchestrator how many records to expect
        self.ends: dict[int, int] | None = None
        self.next = {p: 0 for p in partitions}
        self.restarted_at: float | None = None
        self.restarted_cpu = 0.0
        self.thread_cpu_from = 0.0

    def pass_ended(self) -> bool:
        """True when every partition has reached its end offset; ``next`` then points at offset 0 again."""
        if self.ends is None:
            try:
                self.ends = self.ends_queue.get_nowait()
            except queue.Empty:
                return False
        if any(self.next[p] < self.ends.get(p, 0) for p in self.partitions):
            return False
        self.result.passes += 1
        self.next = {p: 0 for p in self.partitions}
        return True

    def done(self, first_at: float) -> bool:
        """After a pass: stop here, or seek back to offset 0 for another? ``first_at``: the first record's
        fetch. With ``read_seconds`` the passes go on until that long has been read (at most ``read_passes``);
        without, exactly ``read_passes`` are read."""
        if self.result.passes >= self.max_passes:
            return True
        return bool(self.min_seconds) and time.monotonic() - first_at >= self.min_seconds

    def restarted(self) -> None:
        """The consumer has just sought back to offset 0. A library consumer then first waits out the long
        poll it parked at the log end (up to its fetch max wait, 100 ms here), then fetches offset 0: 58-196
        ms per restart on either broker, 3-9% of a 5 s window of 10 KB records. That wait is this benchmark's
        loop, not consume throughput (a consumer reading a log once never has it), so it is timed here and
        left out of the window, as the first pass leaves out what comes before its first fetch. The gap
        also holds the pass's first fetch, a few milliseconds (a 4 MiB response takes 2-10 ms here)."""
        self.restarted_at = time.monotonic()
        self.restarted_cpu = time.thread_time()

    def received(self) -> None:
        """Records have just been handed over; closes a restart gap if one is open. The gap ends when the
        pass's first records are in hand, not when the call that brought them began: a library's poll call
        blocks through the long poll too."""
        if self.restarted_at is not None:
            self.result.restart_s += time.monotonic() - self.restarted_at
            self.result.restart_cpu_s += time.thread_time() - self.restarted_cpu
            self.restarted_at = None

    def in_gap(self) -> bool:
        """True between a seek back to offset 0 and that pass's first records (left out of the window)."""
        return self.restarted_at is not None

    def at_end(self) -> bool:
        """True once every partition has reached its end offset (the pass's last records are in hand)."""
        return self.ends is not None and all(self.next[p] >= self.ends.get(p, 0) for p in self.partitions)

    def count_wait(self, asked: int, got: int, seconds: float) -> None:
        """A library call that asked for ``asked`` records, returned ``got`` and took ``seconds``: when it
        came back short in the middle of a pass, after the first records and outside a restart gap, the
        client waited for the broker for (at most) that long. A call whose records closed a restart gap is
        the caller's to leave out: read ``in_gap`` before ``received`` closes it."""
        if got < asked and self.result.first_at and not self.in_gap() and not self.at_end():
            self.result.waited_s += seconds

    def took(self, called_at: float, cpu_at_call: float) -> None:
        """Records are in hand from a library call made at ``called_at`` (monotonic), when the thread had used
        ``cpu_at_call`` CPU seconds: the first such call opens the consume window, each one extends it."""
        result = self.result
        if not result.first_at:
            result.first_at, self.thread_cpu_from = called_at, cpu_at_call
        result.finished = time.monotonic()
        result.thread_cpu_s = time.thread_time() - self.thread_cpu_from

    def timed_out(self) -> str:
        return f"consumer timed out at {self.next} in pass {self.result.passes + 1}, ends {self.ends}"


# Records a throughput consumer asks librdkafka for per call: a call that returns fewer, before the pass's end,
# found the client's queue empty and waited for a fetch (WorkerResult.waited_s).
CONSUME_BATCH = 10_000


def _consume_confluent(bootstrap: str, work: Workload, partitions: list[int], ready, start_event, ends_queue,
                       result: WorkerResult) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        # librdkafka insists on a group id even for assign(); nothing is committed or joined.
        "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "fetch.max.bytes": 52_428_800,
        "max.partition.fetch.bytes": 1_048_576 * 4,
        "queued.max.messages.kbytes": 262_144,
        # librdkafka stops fetching once 100,000 records are queued (queued.min.messages) and then waits
        # fetch.queue.backoff.ms (1 s) before it looks again, even though the application drains those
        # 10 MB of 100 B records in about 0.15 s: with the defaults a 100 B consume measured that timer,
        # 15-17 MB/s on either broker, against 80-90 MB/s with the queue bounded by bytes alone (256 MiB
        # above) and re-checked every 10 ms. The same settings go to both brokers.
        "queued.min.messages": 10_000_000,
        "fetch.queue.backoff.ms": 10,
        "fetch.wait.max.ms": 100,
    })
    latency = work.rate_per_s is not None
    reading = _Reading(partitions, ends_queue, work, result)
    now_ns = time.monotonic_ns
    try:
        consumer.assign([TopicPartition(work.topic, p, OFFSET_BEGINNING) for p in partitions])
        # Ask for metadata so the connection exists before the clock starts.
        consumer.list_topics(work.topic, timeout=30)
        ready.put("consumer")
        start_event.wait()
        result.started = time.monotonic()
        deadline = result.started + WORKER_TIMEOUT_S
        while time.monotonic() < deadline:
            if reading.pass_ended():
                if reading.done(result.first_at):
                    break
                for p in partitions:
                    consumer.seek(TopicPartition(work.topic, p, 0))
                reading.restarted()
            called_at = time.monotonic()
            cpu_at_call = time.thread_time()
            if latency:
                # poll() returns as soon as one record is there; consume(n) would wait for n or the timeout
                # and add that wait to every end-to-end latency.
                message = consumer.poll(0.05)
                messages = [message] if message is not None else []
            else:
                messages = consumer.consume(num_messages=CONSUME_BATCH, timeout=0.05)
            if not messages:
                if not work.concurrent:
                    reading.count_wait(CONSUME_BATCH, 0, time.monotonic() - called_at)
                continue
            received_at = now_ns()
            if any(map(Message.error, messages)):
                messages = [message for message in messages if message.error() is None]
            in_gap = reading.in_gap()
            reading.received()
            # Counted with map() over the batch: a Python loop of five calls per record held a 100 B consumer
            # to 40-56 MB/s on either broker, against 70-75 MB/s this way (librdkafka's own limit here).
            values = list(map(Message.value, messages))
            result.records += len(values)
            result.bytes += sum(map(len, values))
            # Each partition's records arrive in offset order: the last one seen is where it stands.
            last = dict(zip(map(Message.partition, messages), map(Message.offset, messages), strict=True))
            for partition, offset in last.items():
                reading.next[partition] = offset + 1
            if not (latency or work.concurrent or in_gap):
                reading.count_wait(CONSUME_BATCH, len(messages), time.monotonic() - called_at)
            if latency:
                for value in values:
                    scheduled = _TIMESTAMP.unpack_from(value)[0]
                    if scheduled:  # 0: a record written before the run to check the topic (not timed)
                        result.e2e_ms.append((scheduled, (received_at - scheduled) / 1e6))
            reading.took(called_at, cpu_at_call)
        else:
            result.error_text = reading.timed_out()
    finally:
        consumer.close()


def _consume_copyless(bootstrap: str, work: Workload, partitions: list[int], ready, start_event, ends_queue,
                      result: WorkerResult) -> None:
    """The project's own asyncio consumer (manual assignment from offset 0, every record fully decoded)."""
    import asyncio

    from copyless.client.consumer import Consumer

    async def run() -> None:
        consumer = Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100,
                            max_partition_fetch_bytes=4 << 20)
        await consumer.start()
        try:
            assigned = [(work.topic, p) for p in partitions]
            consumer.assign(assigned)
            consumer.seek_to_beginning(*assigned)
            reading = _Reading(partitions, ends_queue, work, result)
            ready.put("consumer")
            await asyncio.get_running_loop().run_in_executor(None, start_event.wait)
            result.started = time.monotonic()
            deadline = result.started + WORKER_TIMEOUT_S
            while time.monotonic() < deadline:
                if reading.pass_ended():
                    if reading.done(result.first_at):
                        break
                    for tp in assigned:
                        consumer.seek(tp, 0)
                    reading.restarted()
                called_at = time.monotonic()
                cpu_at_call = time.thread_time()
                batches = await consumer.getmany(timeout_ms=50)
                if not batches:
                    continue
                reading.received()
                for tp, records in batches.items():
                    for record in records:
                        result.records += 1
                        result.bytes += len(record.value)
                    reading.next[tp[1]] = records[-1].offset + 1
                reading.took(called_at, cpu_at_call)
            else:
                result.error_text = reading.timed_out()
        finally:
            await consumer.close()

    _run_on_uvloop(run)


_FETCH_V4_PARTITION = struct.Struct("!iqi")       # partition, fetch_offset, partition_max_bytes
_FETCH_V4_HEAD = struct.Struct("!hhi")             # api_key, api_version, correlation_id (header v1)
_FETCH_V4_BODY = struct.Struct("!iiiib")           # replica_id, max_wait_ms, min_bytes, max_bytes, isolation
_FETCH_V4_PARTITION_HEAD = struct.Struct("!ihqq")  # partition, error_code, high_watermark, last_stable_offset


def _encode_fetch_v4(correlation_id: int, topic: str, offsets: dict[int, int], max_bytes: int) -> bytes:
    """A Fetch v4 request (header v1), the oldest version that carries v2 record batches."""
    client_id = b"copyless-bench-raw"
    name = topic.encode()
    parts = [_FETCH_V4_HEAD.pack(1, 4, correlation_id), struct.pack("!h", len(client_id)), client_id,
             _FETCH_V4_BODY.pack(-1, 500, 1, max_bytes, 0), struct.pack("!i", 1),
             struct.pack("!h", len(name)), name, struct.pack("!i", len(offsets))]
    parts += [_FETCH_V4_PARTITION.pack(p, offset, max_bytes) for p, offset in sorted(offsets.items())]
    body = b"".join(parts)
    return struct.pack("!i", len(body)) + body


class _FetchStream:
    """The reading side of ``raw-fetch``: exact reads of the few bytes it parses, and ``discard`` for the rest.

    ``discard`` is ``recv`` with MSG_TRUNC, which on TCP drops the bytes in the kernel without copying them
    to user space. A reader that copies each response out (``recv_into``) tops out near 5 GB/s on this
    machine, the same for every broker and path: it measured itself, not the fetch path.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray(1 << 16)
        self.view = memoryview(self.buffer)
        self.sink = memoryview(bytearray(8 << 20))  # never written: MSG_TRUNC copies nothing into it
        self.consumed = 0

    def read(self, count: int) -> memoryview:
        """The next ``count`` (<= 64 KiB) bytes, in the stream's buffer until the next read."""
        got = 0
        while got < count:
            n = self.sock.recv_into(self.view[got:count])
            if n == 0:
                raise ConnectionError("broker closed the connection")
            got += n
        self.consumed += count
        return self.view[:count]

    def unpack(self, layout: struct.Struct) -> tuple:
        return layout.unpack_from(self.read(layout.size))

    def discard(self, count: int) -> None:
        self.consumed += count
        while count:
            n = self.sock.recv_into(self.sink, min(count, len(self.sink)), socket.MSG_TRUNC)
            if n == 0:
                raise ConnectionError("broker closed the connection")
            count -= n


_INT32 = struct.Struct("!i")
_INT16 = struct.Struct("!h")


def _consume_raw(bootstrap: str, work: Workload, partitions: list[int], ready, start_event, ends_queue,
                 result: WorkerResult) -> None:
    """A consumer that measures the broker's fetch path, not a client library's record handling.

    One Fetch v4 in flight at a time (like a consumer), 8 MiB per partition per fetch. Of each response it
    reads the fields and every batch's 61-byte header (to count records and find the next fetch offset) and
    drops the record bytes in the kernel (``_FetchStream.discard``): the reader copies nothing, so the
    broker's serving cost is what limits it. A trailing partial batch (Kafka cuts at the byte limit) is
    dropped and fetched again, as clients do.
    """
    from copyless.protocol.records import RECORD_BATCH_OVERHEAD, read_header

    host, _, port = bootstrap.rpartition(":")
    max_bytes = 8 << 20
    reading = _Reading(partitions, ends_queue, work, result)
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream = _FetchStream(sock)
        ready.put("consumer")
        start_event.wait()
        result.started = time.monotonic()
        deadline = result.started + WORKER_TIMEOUT_S
        correlation_id = 0
        while time.monotonic() < deadline:
            if reading.pass_ended() and reading.done(result.first_at):
                break
            correlation_id += 1
            called_at = time.monotonic()
            sock.sendall(_encode_fetch_v4(correlation_id, work.topic, reading.next, max_bytes))
            (size,) = stream.unpack(_INT32)
            stream.consumed = 0
            stream.read(8)  # correlation_id, throttle_time_ms
            records_before = result.records
            for _ in range(stream.unpack(_INT32)[0]):  # topics
                stream.read(stream.unpack(_INT16)[0])  # name
                for _ in range(stream.unpack(_INT32)[0]):  # partitions
                    partition, error_code, _hw, _lso = stream.unpack(_FETCH_V4_PARTITION_HEAD)
                    (aborted,) = stream.unpack(_INT32)
                    stream.discard(max(aborted, 0) * 16)
                    (remaining,) = stream.unpack(_INT32)
                    if error_code:
                        raise RuntimeError(f"fetch error {error_code} on partition {partition}")
                    while remaining >= RECORD_BATCH_OVERHEAD:
                        header = read_header(stream.read(RECORD_BATCH_OVERHEAD))
                        remaining -= RECORD_BATCH_OVERHEAD
                        rest = header.size - RECORD_BATCH_OVERHEAD
                        if rest > remaining:  # a partial trailing batch
                            break
                        stream.discard(rest)
                        remaining -= rest
                        result.records += header.records_count
                        reading.next[partition] = header.next_offset
                    stream.discard(max(remaining, 0))
            if stream.consumed != size:
                raise RuntimeError(f"fetch response of {size} bytes parsed as {stream.consumed}")
            if result.records > records_before:
                if not result.first_at:
                    result.first_at = called_at
                result.finished = time.monotonic()
        else:
            result.error_text = reading.timed_out()
    result.bytes = result.records * work.record_bytes


class _Ready:
    """The worker's "connected, waiting for the start" signal; sent exactly once, even when it fails."""

    def __init__(self, queue_) -> None:
        self.queue = queue_
        self.sent = False

    def put(self, role: str) -> None:
        if not self.sent:
            self.sent = True
            self.queue.put(role)


# glibc malloc settings of every consumer process: big blocks from the heap, and freed heap memory kept for
# reuse instead of handed back to the kernel. librdkafka allocates each fetch response (4 MiB here) on its
# broker thread and frees it from the application's thread once the records are consumed, up to 256 MiB
# queued; with glibc's defaults that memory went back to the kernel and was faulted in and zeroed again.
# Consuming 1 KB records right after the produce, three rounds per broker: 17-95k page faults/s in the
# consumer (one perf pair: librdkafka's thread in clear_page for 10.7% of the machine's samples against
# copyless, 1.5% against Kafka); with these settings 16-20k/s, and consume rose from 677-859 to 853-943 MB/s
# against Kafka and from 700-923 to 977-1,110 against copyless. At 10 KB (two rounds) 1,243-1,407 ->
# 1,448-1,545 from Kafka and 1,439-1,481 -> 1,411-1,900 from copyless; at 100 B within the noise (74-111 ->
# 87-104 and 79-90 -> 95-102). It measured the client's allocator, not the broker. Every broker's consumers
# get the same settings; producers keep glibc's defaults.
_CONSUMER_MALLOPT = ((M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 1 << 30), (M_TOP_PAD, 64 << 20))


def _tune_consumer_malloc() -> bool:
    """Apply ``_CONSUMER_MALLOPT`` to this process (glibc only); True when every setting took."""
    return apply_mallopt(_CONSUMER_MALLOPT)


def worker_main(role: str, bootstrap: str, work: Workload, records: int, partitions: list[int],
                 ready_queue, start_event, ends_queue, results) -> None:
    result = WorkerResult(role=role, partitions=partitions)
    ready = _Ready(ready_queue)
    if role == "consumer":
        _tune_consumer_malloc()
    try:
        if role == "producer":
            produce = _produce_copyless if work.client == "copyless" else _produce_confluent
            produce(bootstrap, work, ready, start_event, result, records)
        elif work.client == "copyless" and importlib.util.find_spec("copyless.client.consumer") is not None:
            _consume_copyless(bootstrap, work, partitions, ready, start_event, ends_queue, result)
        elif work.client == "raw-fetch":
            _consume_raw(bootstrap, work, partitions, ready, start_event, ends_queue, result)
        else:
            _consume_confluent(bootstrap, work, partitions, ready, start_event, ends_queue, result)
    except BaseException as exc:  # reported to the orchestrator, which fails the workload
        result.error_text = f"{type(exc).__name__}: {exc}"
        ready.put("failed")  # never leave the orchestrator waiting for a worker that died early
    results.put(asdict(result))
