"""The broker end to end: throughput and latency of Kafka clients against copyless, and against Apache Kafka.

What runs (every workload on every broker under test, one workload at a time so two never share the CPU;
each broker first gets one unmeasured warm-up workload — JIT, page cache, connections):

- ``targets``: the issue-3 table. One producer then one consumer, acks=1, one partition, confluent-kafka
  (librdkafka), records of 100 B, 1 KB and 10 KB: produce MB/s (send N records, ``flush``) then consume
  MB/s (read them back from offset 0), as Kafka's own perf tools measure. copyless's own client (client/)
  runs the same produce and consume when it is installed. Method: copyless and Kafka are both running
  (one idle while the other is measured) for ``--rounds`` rounds (9; 1 with ``--quick``), after
  ``--warmup-rounds`` unmeasured rounds of the confluent-kafka workloads (3; 1 with ``--quick``: Kafka's JVM
  keeps speeding up through its first few GB, ``WARMUP_ROUNDS``; rows ``targets-warmup``); each round runs
  every workload (record size x client) on copyless and then on Kafka, or Kafka first in even rounds, each
  run on a fresh topic that is deleted once measured (the last round's confluent-kafka topics are kept
  for ``sendfile``). A ratio within a round compares two runs seconds apart, so it cancels the drift of a
  shared machine (other tenants' load, page cache, thermal state) that a broker-after-broker run turns
  into a difference between brokers; the median over rounds resists one run hit by a scheduler hiccup.
  Tables give per workload the median MB/s of each broker, the ratio of the medians (the headline
  ``ratios``), the copyless/Kafka ratio of each round, and the median of those with its sign-test interval
  and a verdict: ``above`` or ``below`` 1.0 when the whole interval is, ``level`` when this run cannot tell
  the brokers apart (``median_interval``). Every run starts from the same memory state:
  dirty pages written back, and (on a VM with free page reporting) the pages freed by the last deleted
  topic handed back to the hypervisor, so no broker writes into pages its predecessor just freed, which
  cost a tenth as much to touch as fresh ones (``settle_memory``). Kafka is set to unlink deleted topics
  at once, as copyless does, instead of 60 s later in some other broker's run.
- ``sendfile``: the same topics read again from Kafka, and from two copyless brokers up at once on two
  copies of copyless's data dir: one serving fetches with ``os.sendfile``, one with ``--no-sendfile``
  (record bytes copied through Python). Two consumers: ``raw-fetch`` (a Fetch v4 loop that reads batch
  headers and drops the record bytes in the kernel with MSG_TRUNC, so it copies nothing: the broker's
  serving rate) and confluent-kafka (every record handed to Python). On the copyless pair the raw loop
  runs ``--fetch-rounds`` rounds (5; 1 with ``--quick``), both brokers back to back in each, the first
  alternating, for a per-round sendfile / copy ratio with its interval and a verdict against the 1.5x
  target; confluent-kafka and Kafka run once. Each topic is first read once, unmeasured, back into the
  page cache: the VM may have paged it out while it sat idle (``_proactive_reclaim``), and the copyless
  copies start evicted, each read back by its own broker.
- ``matrix``: producers x consumers x record size x acks x partitions, one factor at a time around a base
  (1 producer, 1 consumer, 1 KB, acks=1, 1 partition); producers and consumers run concurrently, each in
  its own process.
- ``latency``: a fixed offered rate (records/s, 1 KB records) for a fixed time, acks=1 and acks=all:
  produce latency (send -> delivery report) and end-to-end latency (send -> consumer) at p50/p99/p99.9.
  Latency is measured from each record's *scheduled* send time, so a stalled producer cannot hide queueing
  delay (no coordinated omission); the first 20% of each run (at most 2 s) is warm-up and not counted.

Order: targets first; then matrix, latency and the fetch path on Kafka, which is then stopped; then matrix
and latency on copyless, which is then stopped; then the fetch path on copyless's data dir restarted with
sendfile and on a copy of it with ``--no-sendfile``.

Brokers: ``--bootstrap HOST:PORT`` measures any Kafka-protocol broker already running (never stopped by
this benchmark). Otherwise (compare mode) the benchmark starts ``copyless serve --data-dir D --listen
127.0.0.1:0`` (reading the bound address from its startup line), later the same data dir again and a
copy of it with ``--no-sendfile``, and, when ``../shared/anchors/kafka`` (or ``--kafka-home``) holds the
reference Apache Kafka, ``run-kafka.sh PORT DATA_DIR`` on a free port pair from 19292 up; every broker it
started is stopped by pid, also when the run fails, is interrupted or terminated. Without Kafka it says so and still
runs; tiny (test) runs never use it. Workers are separate processes forked from a clean forkserver, so
the GIL of one client never limits another.

Rows: ``section, broker, client, workload, round, producers, consumers, record_bytes, acks, partitions,
records, produce_mb_per_s, produce_records_per_s, consume_mb_per_s, consume_records_per_s`` and, for
latency rows, ``offered_per_s, achieved_per_s, produce_p50_ms, produce_p99_ms, produce_p999_ms, e2e_p50_ms,
e2e_p99_ms, e2e_p999_ms``; ``round`` (from 1) only on targets and targets-warmup rows, and on the copyless pair's
raw-fetch rows of the fetch path;
``consumer_thread_busy`` on consuming rows (CPU seconds of each consumer's Python thread over its consume
window, mean over consumers);
``consumer_waited_share`` on confluent-kafka rows reading a log already written (the share of that window
spent in ``consume`` calls that came back short mid-pass: the client waiting for the broker);
``producer_thread_busy`` and ``producer_cores`` on producing rows (CPU seconds of the producers' queuing
threads, and of their whole processes with the client library's threads, over the produce window);
``broker_produce_cpu_s_per_gb`` and ``broker_consume_cpu_s_per_gb`` on rows whose consumers read after the
producers are done, from a broker this benchmark started (its CPU seconds over each window per GB moved);
``consume_restart_s`` (the seconds between passes left out of that window); ``consume_passes`` (how many
times the consumer read the log: every broker of a targets round reads as many as the first read in its
time, ``_same_passes``, and every broker of the fetch path as many as the first one there);
``consume_disk_read_mb`` (what the machine read from disk while the consumers ran: pages the VM's reclaim
took, ``_disk_read_kib``); on copyless's rows, ``broker_fetch_prepare_p99_ms`` (looking up, pinning and
encoding a fetch response with records), ``broker_fetch_send_p50_ms`` / ``_p99_ms`` (how long the broker
took to write it, EAGAIN waits included) and ``broker_loop_lag_max_ms`` (the latest its event loop's 100 ms
probe woke), all over the same window, from the broker's own histograms (``BrokerHandle.serving_stats``).
MB/s counts record values (1 MB = 10^6 bytes). Side tables: the issue-3 targets (medians over rounds), the
fetch path, copyless/Kafka ratios per matrix and latency workload, latency.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import multiprocessing
import os
import queue
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks._harness import Benchmark, cpu_seconds, median_interval, percentile
from copyless.broker.server.app import M_MMAP_THRESHOLD, M_TOP_PAD, M_TRIM_THRESHOLD, apply_mallopt
from copyless.broker.stats import histogram_quantile

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_KAFKA_HOME = REPO_ROOT.parent / "shared" / "anchors" / "kafka"
KAFKA_PORTS = range(19292, 19392, 2)  # run-kafka.sh also takes PORT+1 for its controller
STARTUP_TIMEOUT_S = 90.0
WORKER_TIMEOUT_S = 300.0
_TIMESTAMP = struct.Struct("!q")  # scheduled send time (monotonic ns) at the head of latency payloads
# Issue-3 reference figures for Kafka on a machine of this size (README of the anchors), MB/s.
# Consumers for the fetch-path comparison: a raw Fetch loop (the broker's serving rate) and librdkafka.
FETCH_CLIENTS = ("raw-fetch", "confluent-kafka")
KAFKA_README_MB_S = {100: (44, 20), 1000: (237, 193), 10000: (276, 293)}
_ADDRESS_RE = re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}|localhost):(\d{1,5})\b")
# Rounds of the targets section in a full run. Nine, not five: the per-round ratios' median gets a
# sign-test interval from (x_(2), x_(8)) at 96% (``median_interval``); five give only (min, max), so one bad
# round on either side leaves every cell "level". In a 15-round run, per-round ratios spread 0.71-1.26 at
# 1 KB produce and 0.73-1.38 at 1 KB consume.
ROUNDS = 9
# Unmeasured rounds before them. Kafka's JVM kept getting faster for its first three or four rounds of
# 1.5 GB runs after the old 128 MB warm-up (1 KB produce: 265, 310, 375, 469 MB/s, then 437-579; 10 KB:
# 288, 406, 453, 519, then 416-570), so those rounds measured its JIT, and copyless's early leads with them.
WARMUP_ROUNDS = 3
# Raw-fetch rounds of the fetch path, each a run of 5 s on the sendfile broker and on the --no-sendfile one:
# five give the (min, max) interval at 94%, enough for ratios that sat between 1.4 and 2.3 from run to run
# against a 1.5 target, and add about five minutes.
FETCH_ROUNDS = 5
# The fetch path's target: sendfile serves at least 1.5x what the same broker does copying through Python.
FETCH_TARGET = 1.5


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


# ----------------------------------------------------------------------------------------------------------
# Workers (run in spawned processes; keep them importable without side effects)


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

    try:
        import uvloop

        uvloop.run(run())
    except ImportError:
        asyncio.run(run())
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
            last = dict(zip(map(Message.partition, messages), map(Message.offset, messages)))
            for partition, offset in last.items():
                reading.next[partition] = offset + 1
            if not (latency or work.concurrent or in_gap):
                reading.count_wait(CONSUME_BATCH, len(messages), time.monotonic() - called_at)
            if latency:
                for value in values:
                    scheduled = _TIMESTAMP.unpack_from(value)[0]
                    result.e2e_ms.append((scheduled, (received_at - scheduled) / 1e6))
            if not result.first_at:
                result.first_at, thread_cpu_from = called_at, cpu_at_call
            result.finished = time.monotonic()
            result.thread_cpu_s = time.thread_time() - thread_cpu_from
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
                if not result.first_at:
                    result.first_at, thread_cpu_from = called_at, cpu_at_call
                result.finished = time.monotonic()
                result.thread_cpu_s = time.thread_time() - thread_cpu_from
            else:
                result.error_text = reading.timed_out()
        finally:
            await consumer.close()

    try:
        import uvloop

        uvloop.run(run())
    except ImportError:
        asyncio.run(run())


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
    from copyless.client.protocol.records import RECORD_BATCH_OVERHEAD, read_header

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


def _worker_main(role: str, bootstrap: str, work: Workload, records: int, partitions: list[int],
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


# ----------------------------------------------------------------------------------------------------------
# Brokers


class BrokerHandle:
    """A broker under test: its bootstrap and, when this benchmark started it, the process to stop."""

    def __init__(self, name: str, bootstrap: str, *, pid: int | None = None, process=None, log_path=None):
        self.name = name
        self.bootstrap = bootstrap
        self.pid = pid
        self.process = process
        self.log_path = log_path
        self.stopped = False

    @property
    def cpu_pid(self) -> int | None:
        """The process whose CPU seconds are the broker's: the one this benchmark started (copyless, or the
        JVM run-kafka.sh reported); None for a broker given with --bootstrap."""
        return self.pid or (self.process.pid if self.process is not None else None)

    def serving_stats(self, timeout_s: float = 10.0) -> dict[str, Any] | None:
        """The counters of a copyless this benchmark started, now: SIGUSR1 makes it print one ``stats-json``
        line to the log. None for any other broker (Kafka keeps its metrics in JMX) or if none came."""
        if self.process is None or self.log_path is None or self.process.poll() is not None:
            return None
        offset = self.log_path.stat().st_size
        self.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                for line in log.read().decode("utf-8", "replace").splitlines():
                    if line.startswith("stats-json "):
                        try:
                            return json.loads(line[len("stats-json "):])
                        except ValueError:
                            break  # caught mid-write: read again
            time.sleep(0.02)
        return None

    def stop(self) -> None:
        """Stop the broker this benchmark started; later calls do nothing (its pid may be reused by then)."""
        if self.stopped:
            return
        self.stopped = True
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=30)
        elif self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    os.kill(self.pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.2)
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _find_listen_address(text: str) -> tuple[str, int] | None:
    for line in text.splitlines():
        if "listen" not in line.lower():
            continue
        match = _ADDRESS_RE.search(line)
        if match and int(match.group(2)) != 0:
            host = "127.0.0.1" if match.group(1) in ("0.0.0.0", "localhost") else match.group(1)
            return host, int(match.group(2))
    return None


def start_copyless(data_dir: Path, log_path: Path, *, sendfile: bool = True, extra_args: tuple[str, ...] = (),
                   env: dict[str, str] | None = None) -> BrokerHandle:
    """``copyless serve --data-dir D --listen 127.0.0.1:0``, with ``env`` added to this process's environment;
    returns once its startup line names the port."""
    command = [sys.executable, "-m", "copyless.broker", "serve", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0"]
    if not sendfile:
        command.append("--no-sendfile")
    command += list(extra_args)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    log_file = open(log_path, "ab")
    offset = log_path.stat().st_size
    process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               env=env, cwd=str(data_dir.parent))
    log_file.close()
    try:
        host, port = _await_listen_address(process, log_path, offset)
    except BaseException:  # also an interrupt while it starts: no handle exists yet to stop it later
        if process.poll() is None:
            process.kill()
            process.wait(30)
        raise
    return BrokerHandle("copyless" if sendfile else "copyless --no-sendfile", f"{host}:{port}",
                        process=process, log_path=log_path)


def _await_listen_address(process, log_path: Path, offset: int) -> tuple[str, int]:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        with open(log_path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
        found = _find_listen_address(text)
        if found is not None:
            return found
        if process.poll() is not None:
            raise RuntimeError(f"copyless exited with {process.returncode} before listening:\n{text[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"copyless printed no listening address in {STARTUP_TIMEOUT_S:.0f} s:\n{text[-3000:]}")
        time.sleep(0.05)


def _port_free(port: int) -> bool:
    for candidate in (port, port + 1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", candidate))
            except OSError:
                return False
    return True


def start_kafka(kafka_home: Path, data_dir: Path) -> BrokerHandle:
    """``run-kafka.sh PORT DATA_DIR`` on the first free port pair from 19292; it prints the broker's pid."""
    port = next((p for p in KAFKA_PORTS if _port_free(p)), None)
    if port is None:
        raise RuntimeError(f"no free port pair in {KAFKA_PORTS.start}..{KAFKA_PORTS.stop}")
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        completed = subprocess.run([str(kafka_home / "run-kafka.sh"), str(port), str(data_dir)],
                                   capture_output=True, text=True, timeout=STARTUP_TIMEOUT_S + 30)
    except BaseException:  # timeout or interrupt: the JVM may be up without its pid printed yet
        _stop_kafka_in(data_dir)
        raise
    if completed.returncode != 0:
        raise RuntimeError(f"run-kafka.sh failed: {completed.stderr.strip()[-2000:]}")
    pid = int(completed.stdout.strip().split()[-1])
    return BrokerHandle("kafka", f"127.0.0.1:{port}", pid=pid, log_path=data_dir / "kafka.out")


def _stop_kafka_in(data_dir: Path) -> None:
    """Stop the JVM that run-kafka.sh launched for ``data_dir``: the only process whose command line names
    ``data_dir/server.properties`` (a scratch path unique to this run)."""
    config = str(data_dir / "server.properties")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            arguments = (entry / "cmdline").read_bytes().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        if config in arguments:
            BrokerHandle("kafka", "", pid=int(entry.name)).stop()


# ----------------------------------------------------------------------------------------------------------
# Orchestration


def _admin(bootstrap: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import NewTopic

    admin = _admin(bootstrap)  # keep a reference: a collected AdminClient fails its pending futures
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)],
                                  request_timeout=30)
    futures[topic].result(60)
    # Wait until metadata shows every partition with a leader (Kafka creates them asynchronously).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        metadata = admin.list_topics(topic, timeout=10)
        described = metadata.topics.get(topic)
        if described is not None and described.error is None and len(described.partitions) == partitions and all(
                p.leader >= 0 for p in described.partitions.values()):
            return
        time.sleep(0.1)
    raise TimeoutError(f"topic {topic} not ready")


def delete_files_at_once(bootstrap: str) -> None:
    """Kafka unlinks a deleted topic's files ``log.segment.delete.delay.ms`` (60 s) after the delete; copyless
    does it at once. Set Kafka's delay to 0 (a dynamic broker config, set per broker id: librdkafka rejects
    the cluster-wide default resource) so neither broker's freed pages land in the middle of a later run.
    The produce and fetch paths are untouched."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = _admin(bootstrap)
    entry = ConfigEntry("log.segment.delete.delay.ms", "0", incremental_operation=AlterConfigOpType.SET)
    resources = [ConfigResource(ResourceType.BROKER, str(broker), incremental_configs=[entry])
                 for broker in admin.list_topics(timeout=30).brokers]
    for future in admin.incremental_alter_configs(resources, request_timeout=30).values():
        future.result(60)


def delete_topic(bootstrap: str, topic: str) -> None:
    admin = _admin(bootstrap)  # keep a reference: a collected AdminClient fails its pending futures
    admin.delete_topics([topic], request_timeout=30)[topic].result(60)


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-ends-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "log_level": 4})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in range(partitions)}
    finally:
        consumer.close()


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _steady(work: Workload, samples: list) -> list[float]:
    """Latencies of records scheduled after the warm-up (the first 20% of the run, at most 2 s)."""
    if not samples:
        return []
    warmup_ns = int(min(2.0, 0.2 * (work.duration_s or 0)) * 1e9)
    first = min(scheduled for scheduled, _ in samples)
    return [latency for scheduled, latency in samples if scheduled >= first + warmup_ns]


def _disk_read_kib() -> int | None:
    """KiB the whole machine has read from block devices so far (``pgpgin``); None where there is no
    /proc/vmstat.

    A consume is meant to be served from the page cache, and on this VM it is not always. DAMON's pageout
    scheme works on physical memory regions, so the pages of a topic written seconds ago can sit in a region
    it has seen idle for a minute: in a side run, a 1.5 GB topic lost 8 MB of its pages 5 s after it was
    produced, 57 MB after 20 s and 458 MB after 55 s, with no memory pressure. A consumer that meets those
    pages waits for the disk, whichever broker serves it, so each consume row says how much was read."""
    try:
        with open("/proc/vmstat") as vmstat:
            for line in vmstat:
                if line.startswith("pgpgin "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _serving_figures(before: dict | None, after: dict | None) -> dict[str, Any]:
    """The broker's fetch prepare and write times and its loop lag between two ``serving_stats`` snapshots."""
    if not before or not after:
        return {}

    def window(name: str) -> dict[str, int]:
        earlier = before.get(name, {}).get("buckets", {})
        return {k: v - earlier.get(k, 0) for k, v in after.get(name, {}).get("buckets", {}).items()}

    prepares, sends, lag = window("fetch_prepare"), window("fetch_send"), window("loop_lag")
    return {"broker_fetch_prepare_p99_ms": histogram_quantile(prepares, 0.99),
            "broker_fetch_send_p50_ms": histogram_quantile(sends, 0.50),
            "broker_fetch_send_p99_ms": histogram_quantile(sends, 0.99),
            "broker_loop_lag_max_ms": histogram_quantile(lag, 1.0)}


def run_workload(ctx, bootstrap: str, work: Workload, serving_stats=None,
                 broker_pid: int | None = None) -> dict[str, Any]:
    """Run one workload against ``bootstrap``; returns the measured figures (raises on client errors).

    ``serving_stats``: the broker's ``BrokerHandle.serving_stats``, read when the consumers start and when
    they are done, for the ``broker_*`` figures of that window. ``broker_pid``: the broker's process, whose
    CPU seconds over the produce window and over the consume window (when the two are apart) are charged
    per GB moved in each."""
    serving_stats = serving_stats or (lambda: None)

    def broker_cpu() -> float | None:
        return cpu_seconds(broker_pid) if broker_pid else None

    if not work.consume_only:
        create_topic(bootstrap, work.topic, work.partitions)
    ready = ctx.Queue()
    results = ctx.Queue()
    processes = []

    def spawn(role: str, records: int, partitions: list[int], start_event, ends_queue) -> None:
        process = ctx.Process(target=_worker_main, args=(role, bootstrap, work, records, partitions, ready,
                                                         start_event, ends_queue, results), daemon=True)
        process.start()
        processes.append(process)

    def gather(count: int) -> list[WorkerResult]:
        gathered = []
        for _ in range(count):
            try:
                gathered.append(WorkerResult(**results.get(timeout=WORKER_TIMEOUT_S + 60)))
            except queue.Empty:
                raise TimeoutError(f"{work.section}: a worker did not report") from None
        failed = [r for r in gathered if r.error_text and (r.role == "consumer" or r.errors or not r.records)]
        if failed:
            raise RuntimeError(f"{work.section} {work.label}: {failed[0].role}: {failed[0].error_text}")
        return gathered

    def consumer_partitions() -> list[list[int]]:
        assignment: list[list[int]] = [[] for _ in range(min(work.consumers, work.partitions))]
        for p in range(work.partitions):
            assignment[p % len(assignment)].append(p)
        return assignment

    figures: dict[str, Any] = {}
    cpu_marks: dict[str, float | None] = {}
    try:
        producer_results: list[WorkerResult] = []
        consumer_results: list[WorkerResult] = []
        producer_count = 0 if work.consume_only else work.producers
        records_each = _split(work.records, max(producer_count, 1))
        produce_start = ctx.Event()
        consume_start = produce_start if (work.concurrent or work.consume_only) else ctx.Event()
        ends_queues = []
        assignment = consumer_partitions()
        for i in range(producer_count):
            spawn("producer", records_each[i], [], produce_start, None)
        if work.concurrent or work.consume_only:
            for partitions in assignment:
                ends_queues.append(ctx.Queue())
                spawn("consumer", 0, partitions, consume_start, ends_queues[-1])
        for _ in processes:  # each worker is connected (and consumers assigned) before the clock starts
            ready.get(timeout=120)
        disk_from = _disk_read_kib() if consume_start is produce_start else None
        serving_from = serving_stats() if consume_start is produce_start else None
        cpu_marks["produce_from"] = broker_cpu()
        produce_start.set()
        if producer_count:
            producer_results = gather(producer_count)
            cpu_marks["produce_to"] = broker_cpu()
        ends = end_offsets(bootstrap, work.topic, work.partitions)
        produced = sum(r.records for r in producer_results)
        settle_deadline = time.monotonic() + 15
        # With acks=0 a producer's flush returns before the broker has appended everything it was sent.
        while sum(ends.values()) < produced and time.monotonic() < settle_deadline:
            time.sleep(0.1)
            ends = end_offsets(bootstrap, work.topic, work.partitions)
        if not (work.concurrent or work.consume_only):
            for partitions in assignment:
                ends_queues.append(ctx.Queue())
                spawn("consumer", 0, partitions, consume_start, ends_queues[-1])
            for _ in assignment:
                ready.get(timeout=120)
            disk_from = _disk_read_kib()
            serving_from = serving_stats()
            cpu_marks["consume_from"] = broker_cpu()
            consume_start.set()
        for q in ends_queues:
            q.put(ends)
        consumer_results = gather(len(assignment))
        cpu_marks["consume_to"] = broker_cpu()
        disk_to = _disk_read_kib()
        serving_to = serving_stats()
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join(10)

    if producer_results:
        produced = sum(r.records for r in producer_results)
        seconds = max(r.finished for r in producer_results) - min(r.started for r in producer_results)
        produced_bytes = sum(r.bytes for r in producer_results)
        figures.update(records=produced, produce_records_per_s=produced / seconds,
                       produce_mb_per_s=produced_bytes / seconds / 1e6)
        # The producers' CPU over the same window: the thread queuing records (busy near 1.0: that thread
        # set the rate) and the whole process with the client library's own threads, in cores.
        figures.update(producer_thread_busy=sum(r.thread_cpu_s for r in producer_results) / seconds,
                       producer_cores=sum(r.process_cpu_s for r in producer_results) / seconds)
        if not work.concurrent and produced_bytes and None not in (cpu_marks.get("produce_from"),
                                                                    cpu_marks.get("produce_to")):
            figures["broker_produce_cpu_s_per_gb"] = (
                (cpu_marks["produce_to"] - cpu_marks["produce_from"]) / (produced_bytes / 1e9))
        latencies = _steady(work, [x for r in producer_results for x in r.latencies_ms])
        if work.rate_per_s is not None and latencies:
            figures.update(produce_p50_ms=percentile(latencies, 50), produce_p99_ms=percentile(latencies, 99),
                           produce_p999_ms=percentile(latencies, 99.9), achieved_per_s=produced / seconds)
    consumed = sum(r.records for r in consumer_results)
    if consumed:
        # From the fetch that returned the first record to the last record: connection set-up and the
        # offset lookup are not consume throughput (kafka-consumer-perf-test's fetch.MB.sec likewise), nor
        # are the restarts between passes (_Reading.restarted). Only single-consumer workloads read more
        # than one pass; with several consumers the gap they all had (the least) comes off the shared window.
        reading = [r for r in consumer_results if r.records]
        restart = min(r.restart_s for r in reading)
        seconds = max(r.finished for r in reading) - min(r.first_at for r in reading) - restart
        figures.update(consumed=consumed, consume_records_per_s=consumed / seconds,
                       consume_mb_per_s=sum(r.bytes for r in consumer_results) / seconds / 1e6,
                       consume_restart_s=restart, consume_passes=min(r.passes for r in reading))
        if disk_from is not None and disk_to is not None:
            figures["consume_disk_read_mb"] = (disk_to - disk_from) * 1024 / 1e6
        figures.update(_serving_figures(serving_from, serving_to))
        busy = [(r.thread_cpu_s - r.restart_cpu_s) / (r.finished - r.first_at - r.restart_s) for r in reading
                if r.thread_cpu_s and r.finished - r.first_at > r.restart_s]
        if busy:
            figures["consumer_thread_busy"] = statistics.mean(busy)
        if not work.concurrent and work.client == "confluent-kafka":
            figures["consumer_waited_share"] = sum(r.waited_s for r in reading) / seconds
        consumed_bytes = sum(r.bytes for r in consumer_results)
        if not work.concurrent and None not in (cpu_marks.get("consume_from"), cpu_marks.get("consume_to")):
            figures["broker_consume_cpu_s_per_gb"] = (
                (cpu_marks["consume_to"] - cpu_marks["consume_from"]) / (consumed_bytes / 1e9))
        e2e = _steady(work, [x for r in consumer_results for x in r.e2e_ms])
        if work.rate_per_s is not None and e2e:
            figures.update(e2e_p50_ms=percentile(e2e, 50), e2e_p99_ms=percentile(e2e, 99),
                           e2e_p999_ms=percentile(e2e, 99.9))
    # Each consumer read its partitions in full ``passes`` times: exactly that many records, no more, no less.
    expected = sum(ends.get(p, 0) * r.passes for r in consumer_results for p in r.partitions)
    if consumed != expected or not all(r.passes for r in consumer_results):
        passes = sorted(r.passes for r in consumer_results)
        raise RuntimeError(f"{work.section} {work.label}: consumed {consumed} records in {passes} full pass(es) "
                           f"over a log of {sum(ends.values())}, expected {expected}")
    if not work.consume_only and sum(ends.values()) < work.records:
        raise RuntimeError(f"{work.section} {work.label}: {work.records} sent, the log holds {sum(ends.values())}")
    return figures


# ----------------------------------------------------------------------------------------------------------
# Plans


def _records_for(record_bytes: int, budget_bytes: int, cap: int) -> int:
    return max(50, min(cap, budget_bytes // record_bytes))


def plan(bench: Benchmark, clients: list[str]) -> dict[str, list[Workload]]:
    # Per run of a targets workload (every round, every broker): produce windows of 3-6 s at the rates seen
    # here (70 MB/s at 100 B, 300-1400 MB/s above), so a scheduler hiccup is a small share of each; a
    # round of confluent-kafka and copyless clients on two brokers takes about 4 minutes with the memory
    # settling before each run (settle_memory). A full run wants five rounds at least, and takes nine
    # (ROUNDS, for the verdict's interval): on this VM one run's rate can halve when its pages are memory the
    # hypervisor has to back first (copyless, 10 KB produce: 0.4-0.6 GB/s then, 0.9-1.4 GB/s on recycled
    # memory; Kafka's moved between 0.2 and 0.75 GB/s), and a median of five shrugs off two such runs.
    target_budget = bench.pick(full=1536 << 20, quick=24 << 20, tiny=1 << 20)
    target_cap = bench.pick(full=3_000_000, quick=100_000, tiny=2_000)
    # The consumer then reads the topic from offset 0 again until it has read for this long: one pass of
    # 1.5 GiB of 10 KB records takes 0.7-1.5 s (1.1-2.1 GB/s on either broker). Tiny runs read exactly
    # twice, so the tests cover the seek back.
    read_seconds = bench.pick(full=5.0, quick=1.0, tiny=0.0)
    read_passes = bench.pick(full=10, quick=3, tiny=2)
    targets = []
    for client in clients:
        # The project's client is measured at every size in full runs, at 100 B (its target) otherwise.
        sizes = (100,) if bench.tiny or (bench.quick and client != "confluent-kafka") else (100, 1000, 10_000)
        for record_bytes in sizes:
            records = _records_for(record_bytes, target_budget, target_cap)
            targets.append(Workload("targets", record_bytes, records, client=client, read_passes=read_passes,
                                    read_seconds=read_seconds, label=f"{record_bytes} B {client}"))
    matrix_budget = bench.pick(full=128 << 20, quick=12 << 20, tiny=1 << 19)
    cap = bench.pick(full=1_000_000, quick=100_000, tiny=2_000)
    base = Workload("matrix", 1000, _records_for(1000, matrix_budget, cap), concurrent=True, label="base")
    if bench.tiny:
        variations = [dict(producers=2, consumers=2, partitions=2, acks="all")]
    else:
        variations = [dict(producers=2), dict(consumers=2, partitions=2)]
        if not bench.quick:
            variations += [dict(acks="all"), dict(record_bytes=100), dict(record_bytes=10_000), dict(acks="0"), dict(partitions=4),
                           dict(producers=4), dict(record_bytes=100_000), dict(partitions=8, consumers=2)]
    # Tiny (test) runs take only the variation: it exercises every code path the base does, and more.
    matrix = [] if bench.tiny else [base]
    for change in variations:
        work = replace(base, **change)
        work = replace(work, records=_records_for(work.record_bytes, matrix_budget, cap),
                       label=", ".join(f"{k}={v}" for k, v in change.items()))
        matrix.append(work)
    rates = bench.pick(full=[1_000, 10_000, 30_000], quick=[5_000], tiny=[500])
    duration = bench.pick(full=15.0, quick=3.0, tiny=0.6)
    latency = []
    for acks in (("1",) if bench.tiny else ("1", "all")):
        for rate in rates:
            latency.append(Workload("latency", 1000, int(rate * duration), acks=acks, rate_per_s=rate,
                                    duration_s=duration, concurrent=True, label=f"{rate}/s acks={acks}"))
    # One unmeasured produce+consume per broker first: JIT (Kafka's JVM), page cache, connections.
    warmup = [] if bench.tiny else [Workload("warmup", 1000, _records_for(1000, matrix_budget, cap),
                                             concurrent=True, label="warm-up")]
    return {"targets": targets, "matrix": matrix, "latency": latency, "warmup": warmup}


def _row(bench: Benchmark, broker: str, work: Workload, figures: dict[str, Any],
         round_number: int | None = None) -> dict[str, Any]:
    return bench.row(section=work.section, broker=broker, client=work.client, workload=work.label,
                     round=round_number,
                     producers=work.producers if not work.consume_only else 0, consumers=work.consumers,
                     record_bytes=work.record_bytes, acks=work.acks, partitions=work.partitions,
                     records=figures.get("records", figures.get("consumed")),
                     produce_mb_per_s=figures.get("produce_mb_per_s"),
                     produce_records_per_s=figures.get("produce_records_per_s"),
                     consume_mb_per_s=figures.get("consume_mb_per_s"),
                     consume_records_per_s=figures.get("consume_records_per_s"),
                     offered_per_s=work.rate_per_s, achieved_per_s=figures.get("achieved_per_s"),
                     produce_p50_ms=figures.get("produce_p50_ms"), produce_p99_ms=figures.get("produce_p99_ms"),
                     produce_p999_ms=figures.get("produce_p999_ms"), e2e_p50_ms=figures.get("e2e_p50_ms"),
                     e2e_p99_ms=figures.get("e2e_p99_ms"), e2e_p999_ms=figures.get("e2e_p999_ms"),
                     broker_cpu_s_per_gb=figures.get("broker_cpu_s_per_gb"),
                     broker_produce_cpu_s_per_gb=figures.get("broker_produce_cpu_s_per_gb"),
                     broker_consume_cpu_s_per_gb=figures.get("broker_consume_cpu_s_per_gb"),
                     producer_thread_busy=figures.get("producer_thread_busy"),
                     producer_cores=figures.get("producer_cores"),
                     consumer_thread_busy=figures.get("consumer_thread_busy"),
                     consumer_waited_share=figures.get("consumer_waited_share"),
                     consume_restart_s=figures.get("consume_restart_s"),
                     consume_passes=figures.get("consume_passes"),
                     consume_disk_read_mb=figures.get("consume_disk_read_mb"),
                     broker_fetch_prepare_p99_ms=figures.get("broker_fetch_prepare_p99_ms"),
                     broker_fetch_send_p50_ms=figures.get("broker_fetch_send_p50_ms"),
                     broker_fetch_send_p99_ms=figures.get("broker_fetch_send_p99_ms"),
                     broker_loop_lag_max_ms=figures.get("broker_loop_lag_max_ms"))


def _topic(broker: str, work: Workload) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{work.section}-{work.label}").strip("-")
    return f"bench-{safe}-{uuid.uuid4().hex[:6]}"[:200]


def _proactive_reclaim() -> str | None:
    """A DAMON scheme that pages out idle memory, when one runs (it then decides what stays cached)."""
    for scheme in Path("/sys/kernel/mm/damon/admin/kdamonds").glob("*/contexts/*/schemes/*"):
        try:
            state = (scheme.parents[3] / "state").read_text().strip()
            action = (scheme / "action").read_text().strip()
            age = int((scheme / "access_pattern/age/min").read_text())
            aggregation_us = int((scheme.parents[1] / "monitoring_attrs/intervals/aggr_us").read_text())
        except (OSError, ValueError):
            continue
        if state == "on" and action == "pageout":
            return f"DAMON pages out memory idle for {age * aggregation_us / 1e6:g} s"
    return None


def _copyless_client_available() -> bool:
    return importlib.util.find_spec("copyless.client.producer") is not None


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"{value} < 1")
    return value


def _natural_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"{value} < 0")
    return value


class Campaign:
    """One run's measurements: the planned workloads, the brokers measured (in order) and, per broker, the
    targets topics kept for the fetch-path section."""

    def __init__(self, bench: Benchmark, ctx, plans: dict[str, list[Workload]], rounds: int,
                 sendfile_plan: list[Workload], warmup_rounds: int = 0, fetch_rounds: int = 1) -> None:
        self.bench = bench
        self.ctx = ctx
        self.plans = plans
        self.rounds = rounds
        self.warmup_rounds = warmup_rounds
        self.fetch_rounds = fetch_rounds  # raw-fetch rounds of the copyless pair (fetch_path_paired)
        self.sendfile_plan = sendfile_plan  # the targets workloads whose topics the fetch path reads again
        self.brokers_run: list[str] = []
        self.kept: dict[str, list[Workload]] = {}
        # The fetch path's passes per (record size, client), set by the first broker to read them there.
        self.fetch_passes: dict[tuple[int, str], int] = {}
        self.bar = None  # the progress bar of the workloads being run
        self._undeletable: set[str] = set()

    def workload_count(self, sections: list[str], brokers: int) -> int:
        """Measured runs: every section on each of ``brokers``; the fetch path once per client on Kafka (any
        of ``brokers`` but copyless) and, on the copyless pair, confluent-kafka once and raw-fetch
        ``fetch_rounds`` times on each."""
        targets = (self.rounds * len(self.plans["targets"]) + self.warmup_rounds * len(self._warmup_plan())
                   if "targets" in sections else 0)
        others = sum(len(self.plans.get(s, [])) for s in _other_sections(sections))
        fetch = 0
        if "sendfile" in sections:
            once = len(FETCH_CLIENTS)
            fetch = once * (brokers - 1) + 2 * (once - 1 + self.fetch_rounds)
        return (targets + others) * brokers + len(self.sendfile_plan) * fetch

    def _enter(self, handle: BrokerHandle) -> None:
        if handle.name not in self.brokers_run:
            self.brokers_run.append(handle.name)

    def _measure(self, handle: BrokerHandle, work: Workload,
                 round_number: int | None = None) -> tuple[Workload, dict[str, Any]]:
        """Run ``work`` on a fresh topic and record its row; returns it with that topic, and its figures."""
        work = replace(work, topic=_topic(handle.name, work))
        of = self.warmup_rounds if work.section == "targets-warmup" else self.rounds
        where = f" (round {round_number}/{of})" if round_number else ""
        self.bar.describe(f"{handle.name}: {work.section} {work.label}{where}")
        # The previous run's 1.5 GiB written back now, not in this run's window, and its freed pages handed
        # back to the hypervisor, whichever broker runs next.
        self.bench.settle()
        figures = run_workload(self.ctx, handle.bootstrap, work, handle.serving_stats, handle.cpu_pid)
        _row(self.bench, handle.name, work, figures, round_number)
        self.bar.advance(1)
        return work, figures

    def warm_up(self, handle: BrokerHandle) -> None:
        self._enter(handle)
        for work in self.plans["warmup"]:
            self.bar.describe(f"{handle.name}: warm-up")
            run_workload(self.ctx, handle.bootstrap, replace(work, topic=_topic(handle.name, work)))

    def targets(self, handles: list[BrokerHandle], keep_for_fetch: bool) -> None:
        """Every round runs each targets workload on every broker back to back, the first broker alternating
        by round: the runs a per-round ratio compares are seconds apart, whatever the machine does later.
        The first broker of a round reads for the workload's time; the others then read exactly as many
        passes (``_same_passes``). The rounds are preceded by ``warmup_rounds`` of the same workloads, kept
        as ``targets-warmup`` rows and left out of the targets table."""
        for handle in handles:
            self._enter(handle)
        warmup = self._warmup_plan()
        for number in range(1, self.warmup_rounds + 1):
            self._round(handles, warmup, number, keep=False)
        for number in range(1, self.rounds + 1):
            self._round(handles, self.plans["targets"], number, keep=keep_for_fetch and number == self.rounds)

    def _warmup_plan(self) -> list[Workload]:
        # The brokers warm up, not the clients (each run spawns its own): confluent-kafka's workloads suffice.
        return [replace(work, section="targets-warmup") for work in self.plans["targets"]
                if work.client == "confluent-kafka"]

    def _round(self, handles: list[BrokerHandle], plan: list[Workload], number: int, keep: bool) -> None:
        order = handles if number % 2 else handles[::-1]
        for work in plan:
            passes = None
            for handle in order:
                measured, figures = self._measure(handle, _same_passes(work, passes), number)
                passes = passes or figures.get("consume_passes")
                if keep and work in self.sendfile_plan:
                    self.kept.setdefault(handle.name, []).append(replace(work, topic=measured.topic))
                else:
                    self._drop(handle, measured)

    def _drop(self, handle: BrokerHandle, work: Workload) -> None:
        # copyless preallocates whole segments: without this, rounds of topics would hold tens of GB, and
        # their dirty pages would be written back during later rounds' measurements.
        if handle.name in self._undeletable:
            return
        try:
            delete_topic(handle.bootstrap, work.topic)
        except Exception as exc:  # a broker that cannot delete topics is still measured
            self._undeletable.add(handle.name)
            self.bench.note(f"{handle.name}: measured topics not deleted ({exc}); they stay until the run ends")

    def sections(self, handle: BrokerHandle, wanted: list[str]) -> None:
        """The once-per-broker sections (matrix, latency), one workload at a time."""
        self._enter(handle)
        for section in wanted:
            for work in self.plans.get(section, []):
                self._measure(handle, work)

    def fetch_topics(self, handle: BrokerHandle) -> list[Workload]:
        """The targets topics kept on ``handle`` or, when targets did not run, the same topics filled unmeasured."""
        if handle.name not in self.kept:
            filled = []
            for work in self.sendfile_plan:
                work = replace(work, topic=_topic(handle.name, work))
                self.bar.describe(f"{handle.name}: filling {work.label} for the fetch path")
                run_workload(self.ctx, handle.bootstrap, work)
                filled.append(work)
            self.kept[handle.name] = filled
        return self.kept[handle.name]

    def fetch_path(self, handle: BrokerHandle, topics: list[Workload]) -> None:
        """Read ``topics`` again with each fetch client, once each (the sendfile section, on Kafka)."""
        self._enter(handle)
        for work in topics:
            self._fetch_warm_up(handle, work)
            for client in FETCH_CLIENTS:
                self._fetch_run(handle, work, client)

    def fetch_path_paired(self, handles: list[BrokerHandle], topics: list[Workload]) -> None:
        """The sendfile section on copyless: ``handles`` are two brokers up at once, with sendfile and with
        ``--no-sendfile``, on two copies of one data dir. Per topic: each reads it once with confluent-kafka,
        then ``fetch_rounds`` rounds of the raw Fetch loop on both back to back, the first alternating by
        round, as the targets rounds do: a per-round ratio compares two runs seconds apart. One pair of runs
        minutes apart measured the machine as much as the path: the same raw loop on a fresh sendfile broker
        read 4,933-5,550 MB/s in one run and 6,356-7,059 in the next, while the copy path held at
        2,800-3,500 (benchmarks/NOTES.md)."""
        for handle in handles:
            self._enter(handle)
        for work in topics:
            for handle in handles:
                self._fetch_warm_up(handle, work)
            for client in FETCH_CLIENTS:
                if client != "raw-fetch":
                    for handle in handles:
                        self._fetch_run(handle, work, client)
            for number in range(1, self.fetch_rounds + 1):
                for handle in (handles if number % 2 else handles[::-1]):
                    self._fetch_run(handle, work, "raw-fetch", number)

    def _fetch_warm_up(self, handle: BrokerHandle, work: Workload) -> None:
        # The kept topics sat idle through the matrix and latency runs, and this VM pages out memory it
        # judges idle (DAMON's pageout scheme, up to 128 MiB/s; _proactive_reclaim, _disk_read_kib): in one
        # full run the section read them from disk, copyless's raw fetch of 1 KB records at 294 MB/s
        # against 3,648 in the run before, Kafka's 100 B at 778 against 3,482. One unmeasured raw pass
        # reads the topic back into the page cache through the broker under test, every broker alike;
        # the section is about serving from the page cache.
        self.bar.describe(f"{handle.name}: fetch path {work.record_bytes} B, warming the page cache")
        run_workload(self.ctx, handle.bootstrap, replace(
            work, section="sendfile", consume_only=True, client="raw-fetch", read_passes=1,
            read_seconds=0.0, label=f"{work.record_bytes} B warm-up"))

    def _fetch_run(self, handle: BrokerHandle, work: Workload, client: str,
                   round_number: int | None = None) -> None:
        # The same reading time as the targets consumers; the raw loop reads a pass of 1.5 GiB in
        # well under a second, so it may take more passes for it.
        passes = 50 if client == "raw-fetch" and work.read_seconds else work.read_passes
        consume = replace(work, section="sendfile", consume_only=True, client=client, read_passes=passes,
                          label=f"{work.record_bytes} B {client}")
        consume = _same_passes(consume, self.fetch_passes.get((work.record_bytes, client)))
        where = f" (round {round_number}/{self.fetch_rounds})" if round_number else ""
        self.bar.describe(f"{handle.name}: fetch path {consume.label}{where}")
        self.bench.settle()
        pid = handle.cpu_pid
        before = cpu_seconds(pid) if pid else None
        figures = run_workload(self.ctx, handle.bootstrap, consume, handle.serving_stats)
        if before is not None:
            # What zero copy saves the sender: a receiver-bound loop can hide it in the MB/s.
            served_gb = figures["consumed"] * work.record_bytes / 1e9
            figures["broker_cpu_s_per_gb"] = (cpu_seconds(pid) - before) / served_gb
        self.fetch_passes.setdefault((work.record_bytes, client), figures["consume_passes"])
        _row(self.bench, handle.name, consume, figures, round_number)
        self.bar.advance(1)


def _evict_page_cache(*dirs: Path) -> None:
    """Write back and drop the page cache of every file under ``dirs``: each copy of the fetch path's data is
    then read back by its own broker's warm-up pass, through the same readahead, rather than one being the
    pages the other broker wrote through mmap and the other the pages a file copy wrote."""
    os.sync()
    for root in dirs:
        for path in root.rglob("*"):
            if path.is_file():
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def _same_passes(work: Workload, passes: int | None) -> Workload:
    """``work`` reading exactly ``passes`` passes (None: as planned, for its time).

    A consumer that reads "for 5 s" stops after the pass that crosses 5 s, and on this VM a first pass is
    slower than the ones after it: it grows the client's heap into memory the hypervisor has to back first.
    Where one pass takes about the window, the pass count decides the rate. In one full run the 100 B
    confluent-kafka consumer read 51-60 MB/s in the rounds where it stopped after one pass and 74-79 MB/s in
    those where it went on to a second, and copyless happened to get three one-pass rounds out of five,
    Kafka one: a 0.79x that said nothing about either broker. So within a round every broker reads the
    number of passes the first one read, the same records in the same order."""
    if passes is None:
        return work
    return replace(work, read_passes=passes, read_seconds=0.0)


def _other_sections(sections: list[str]) -> list[str]:
    return [s for s in sections if s not in ("targets", "sendfile")]


def _started(stack: contextlib.ExitStack, start, *args, **kwargs) -> BrokerHandle:
    """Start a broker and have ``stack`` stop it, whatever happens afterwards."""
    handle = start(*args, **kwargs)
    stack.callback(handle.stop)
    return handle


def _reference_kafka(bench: Benchmark, args) -> tuple[bool, str]:
    """Whether compare mode starts the reference Kafka, and what the results say about it."""
    if bench.tiny:
        return False, "skipped (tiny mode: test runs never depend on the reference Kafka)"
    if args.no_kafka:
        return False, "skipped (--no-kafka)"
    if not (args.kafka_home / "run-kafka.sh").exists() or shutil.which("java") is None:
        return False, f"not found at {args.kafka_home} (or no java): copyless measured alone"
    return True, f"Apache Kafka from {args.kafka_home}"


def _measure_external(campaign: Campaign, handle: BrokerHandle, sections: list[str]) -> None:
    """``--bootstrap``: the targets rounds, then the other sections, on a broker this benchmark did not start."""
    measured = [s for s in sections if s != "sendfile"]  # skipped: see below
    with campaign.bench.progress(campaign.workload_count(measured, 1), "workloads") as bar:
        campaign.bar = bar
        campaign.warm_up(handle)
        if "targets" in sections:
            campaign.targets([handle], keep_for_fetch=False)
        campaign.sections(handle, _other_sections(sections))
    if "sendfile" in sections:
        campaign.bench.note("sendfile section skipped: it needs a copyless broker this benchmark starts")


def _compare(campaign: Campaign, args, sections: list[str], scratch: Path) -> str:
    """Compare mode: copyless and Kafka both up for the targets rounds; then the other sections on Kafka,
    which is then stopped, and on copyless; then copyless's data dir again with --no-sendfile for the fetch
    path. Returns what the results say about Kafka."""
    bench = campaign.bench
    use_kafka, kafka_state = _reference_kafka(bench, args)
    bench.note(f"reference Kafka: {kafka_state}")
    with_sendfile = "sendfile" in sections
    total = campaign.workload_count(sections, 2 if use_kafka else 1)
    with bench.progress(total, "workloads") as bar, contextlib.ExitStack() as stack:
        campaign.bar = bar
        data_dir = scratch / "copyless-data"
        data_dir.mkdir()
        copyless = _started(stack, start_copyless, data_dir, scratch / "copyless.log")
        kafka = None
        if use_kafka:
            try:
                kafka = _started(stack, start_kafka, args.kafka_home, scratch / "kafka-data")
            except Exception as exc:
                bench.note(f"reference Kafka did not start: {exc}")
                kafka_state = f"failed to start: {exc}"
            if kafka is not None:
                try:
                    delete_files_at_once(kafka.bootstrap)
                except Exception as exc:  # still measured, with its deletions 60 s late
                    bench.note(f"Kafka kept log.segment.delete.delay.ms (alter configs failed: {exc})")
        handles = [h for h in (copyless, kafka) if h is not None]
        for handle in handles:
            campaign.warm_up(handle)
        if "targets" in sections:
            campaign.targets(handles, keep_for_fetch=with_sendfile)
        if kafka is not None:
            campaign.sections(kafka, _other_sections(sections))
            if with_sendfile:
                campaign.fetch_path(kafka, campaign.fetch_topics(kafka))
            kafka.stop()  # what follows measures copyless alone on the machine
        campaign.sections(copyless, _other_sections(sections))
        if with_sendfile:
            topics = campaign.fetch_topics(copyless)
            copyless.stop()  # flushed, closed cleanly: its data dir can be copied
            # The same topics on two brokers up at once: the data dir restarted with sendfile, and a copy
            # of it with fetches copied through Python. Both processes start fresh, so neither carries the
            # hour of workloads the other did not.
            bar.describe("copying copyless's data dir for --no-sendfile")
            copy_dir = scratch / "copyless-data-copy"
            shutil.copytree(data_dir, copy_dir)
            _evict_page_cache(data_dir, copy_dir)
            with_sendfile_handle = _started(stack, start_copyless, data_dir, scratch / "copyless-fetch.log")
            no_sendfile = _started(stack, start_copyless, copy_dir, scratch / "copyless-nosendfile.log",
                                   sendfile=False)
            campaign.fetch_path_paired([with_sendfile_handle, no_sendfile], topics)
    return kafka_state


def main(argv=None) -> dict[str, Any]:
    def arguments(parser) -> None:
        parser.add_argument("--bootstrap", help="measure this running Kafka-protocol broker (HOST:PORT) "
                            "instead of starting copyless and Kafka")
        parser.add_argument("--label", default="external", help="name of the --bootstrap broker in tables")
        parser.add_argument("--kafka-home", type=Path, default=DEFAULT_KAFKA_HOME,
                            help="reference Apache Kafka (run-kafka.sh); default ../shared/anchors/kafka")
        parser.add_argument("--no-kafka", action="store_true", help="compare mode without the reference Kafka")
        parser.add_argument("--clients", default="auto",
                            help="confluent-kafka,copyless (default: both when client/ has a producer)")
        parser.add_argument("--sections", default="targets,sendfile,matrix,latency",
                            help="subset of targets,sendfile,matrix,latency")
        parser.add_argument("--rounds", type=_positive_int, default=None,
                            help="rounds of the targets section, each running every workload on every broker "
                                 "(default 9; 1 with --quick)")
        parser.add_argument("--fetch-rounds", type=_positive_int, default=None,
                            help="rounds of the fetch path's raw Fetch loop on the sendfile and --no-sendfile "
                                 "brokers (default 5; 1 with --quick, 2 in tiny runs)")
        parser.add_argument("--warmup-rounds", type=_natural_int, default=None,
                            help="unmeasured rounds of the confluent-kafka targets workloads first "
                                 "(default 3; 1 with --quick)")

    bench = Benchmark("throughput", "end to end: Kafka clients against copyless and Apache Kafka "
                      "(throughput, latency at a fixed rate)", argv, arguments=arguments)
    args = bench.args
    sections = [s for s in args.sections.split(",") if s]
    rounds = args.rounds or bench.pick(full=ROUNDS, quick=1, tiny=1)
    warmup_rounds = args.warmup_rounds if args.warmup_rounds is not None else bench.pick(full=WARMUP_ROUNDS, quick=1)
    # Tiny runs take two rounds: the suite then sees the order alternate.
    fetch_rounds = args.fetch_rounds or bench.pick(full=FETCH_ROUNDS, quick=1, tiny=2)
    if args.clients == "auto":
        clients = ["confluent-kafka"] + (["copyless"] if _copyless_client_available() else [])
        if "copyless" not in clients:
            bench.note("copyless's own client (client/producer.py) is not available: confluent-kafka only")
    else:
        clients = [c for c in args.clients.split(",") if c]
    if "copyless" in clients:
        bench.note("copyless's own client (producer and consumer) runs the targets section; every other "
                   "workload uses confluent-kafka; consumers use assign() from offset 0, no group")
    plans = plan(bench, clients)
    if "targets" in sections:
        bench.note(f"targets: {rounds} round(s) after {warmup_rounds} unmeasured warm-up round(s); each runs "
                   "every workload on each broker back to back on a fresh topic, the first broker alternating by "
                   "round; tables give the median over rounds, the ratio of the medians, the ratio within each "
                   "round, and the median of those with its sign-test interval")
    bench.note("latency percentiles are measured from each record's scheduled send time and exclude the first "
               "20% of each run (at most 2 s) as warm-up; consume MB/s runs from the fetch that returned the "
               "first record to the last record, less the restarts between passes (from the seek to offset 0 "
               "until that pass's first records are in hand: consume_restart_s)")
    reclaim = _proactive_reclaim()
    if reclaim and "sendfile" in sections:
        bench.note(f"{reclaim}: the fetch path first reads each topic once, unmeasured, into the page cache")
    if "targets" in sections and plans["targets"]:
        first = plans["targets"][0]
        reread = (f"until it has read for {first.read_seconds:g} s (at most {first.read_passes} passes)"
                  if first.read_seconds else f"{first.read_passes} times")
        bench.note(f"a targets consumer reads its topic from offset 0 {reread}: one pass can take a second; "
                   "the other brokers of its round then read as many passes (consume_passes)")
    # Workers fork from a clean single-threaded server that has already imported the Kafka client: no
    # librdkafka threads are ever forked, and each worker starts in milliseconds instead of a second.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["confluent_kafka"])
    sendfile_plan = [w for w in plans["targets"] if w.client == "confluent-kafka"
                     and (not bench.quick or bench.tiny or w.record_bytes == 10_000)]
    campaign = Campaign(bench, ctx, plans, rounds, sendfile_plan, warmup_rounds if "targets" in sections else 0,
                        fetch_rounds)
    with bench.scratch_dir() as scratch:
        if args.bootstrap:
            kafka_state = "not used"
            _measure_external(campaign, BrokerHandle(args.label, args.bootstrap), sections)
        else:
            kafka_state = _compare(campaign, args, sections, scratch)
    return _finish(bench, campaign.brokers_run, kafka_state, clients, rounds)


def _value(rows: list[dict[str, Any]], key: str, **match) -> float | None:
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()):
            return row.get(key)
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _median(values) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _target_runs(rows: list[dict[str, Any]], broker: str, client: str, record_bytes: int) -> dict[int, dict]:
    """One targets workload's rows on one broker, by round."""
    return {r["round"]: r for r in rows if r["section"] == "targets" and r["broker"] == broker
            and r["client"] == client and r["record_bytes"] == record_bytes}


def _paired_ratios(ours: dict[int, dict], kafka: dict[int, dict], key: str) -> list[float]:
    """ours / Kafka within each round, in round order: each compares two runs seconds apart."""
    ratios = [_ratio(ours[n][key], kafka[n][key]) for n in sorted(ours) if n in kafka]
    return [r for r in ratios if r is not None]


def ratio_verdict(ratios: list[float], against: float = 1.0) -> dict[str, Any]:
    """The per-round ratios' median with its sign-test interval (``median_interval``), and where that interval
    lies: ``above`` ``against`` (1.0: copyless measurably faster than Kafka; for the fetch path, 1.5:
    sendfile measurably over its target), ``below`` (measurably under) or ``level`` (this run cannot tell).
    The ratio of two medians can land either side of 1.0 from run to run when the brokers are level; the
    interval says whether a run could tell."""
    interval = median_interval(ratios)
    if interval is None:
        return {"paired": _median(ratios), "interval": None, "verdict": None}
    return {"paired": interval.median, "interval": [round(interval.low, 3), round(interval.high, 3)],
            "verdict": f"{interval.verdict(against)} ({interval.confidence:.0%})"}


def _target_entry(rows: list[dict[str, Any]], ours: str, client: str, record_bytes: int) -> dict[str, Any]:
    """The targets table's line for one workload: medians over rounds, their ratio, the per-round ratios and
    their median with its interval."""
    mine = _target_runs(rows, ours, client, record_bytes)
    kafka = _target_runs(rows, "kafka", client, record_bytes)
    entry: dict[str, Any] = {"client": client, "record_bytes": record_bytes, "rounds": len(mine)}
    for what in ("produce", "consume"):
        key = f"{what}_mb_per_s"
        median, kafka_median = _median(r[key] for r in mine.values()), _median(r[key] for r in kafka.values())
        entry.update({f"copyless_{what}_mb_s": median, f"kafka_{what}_mb_s": kafka_median,
                      f"{what}_ratio": _ratio(median, kafka_median)})
        ratios = _paired_ratios(mine, kafka, key)
        entry[f"{what}_ratio_by_round"] = [round(r, 3) for r in ratios] or None
        entry.update({f"{what}_{name}": value for name, value in ratio_verdict(ratios).items()})
    # How busy the consumer's own Python thread was (CPU seconds over wall seconds) and how long it waited for
    # records (share of the window), medians over rounds: busy near 1.0 and waited near 0 on both brokers
    # mean the client, not the broker, set the consume rate.
    # The same for the producer (its queuing thread, and its whole process in cores with librdkafka's
    # threads), and each broker's own CPU per GB produced and per GB consumed: on two shared cores, a broker
    # that spends less leaves more to the client.
    for key, column in (("consumer_thread_busy", "consumer_thread_busy"), ("consumer_waited_share", "consumer_waited"),
                        ("producer_thread_busy", "producer_thread_busy"), ("producer_cores", "producer_cores"),
                        ("broker_produce_cpu_s_per_gb", "produce_cpu_s_per_gb"),
                        ("broker_consume_cpu_s_per_gb", "consume_cpu_s_per_gb")):
        for broker, runs in (("copyless", mine), ("kafka", kafka)):
            entry[f"{broker}_{column}"] = _median(r.get(key) for r in runs.values())
    readme = KAFKA_README_MB_S.get(record_bytes) if client == "confluent-kafka" else None
    entry["kafka_readme_produce_mb_s"], entry["kafka_readme_consume_mb_s"] = readme or (None, None)
    figures = [entry[k] for k in ("copyless_produce_mb_s", "kafka_produce_mb_s", "copyless_consume_mb_s",
                                  "kafka_consume_mb_s")]
    entry["target_met"] = (figures[0] >= figures[1] and figures[2] >= figures[3]) if None not in figures else None
    return entry


def _fetch_entry(rows: list[dict[str, Any]], client: str, record_bytes: int) -> dict[str, Any] | None:
    """The fetch-path table's line for one client and record size: each broker's MB/s and CPU per GB
    (medians over its rounds, or its one run), sendfile / copy, and for rounds run in pairs the per-round
    ratios with their median, interval and verdict against the 1.5x target."""
    def runs(broker: str) -> dict[Any, dict]:
        return {r["round"]: r for r in rows if r["section"] == "sendfile" and r["broker"] == broker
                and r["client"] == client and r["record_bytes"] == record_bytes}

    mine, copy, kafka = runs("copyless"), runs("copyless --no-sendfile"), runs("kafka")
    if not mine and not copy:
        return None

    def median(of: dict[Any, dict], key: str) -> float | None:
        return _median(r.get(key) for r in of.values())

    on, off = median(mine, "consume_mb_per_s"), median(copy, "consume_mb_per_s")
    cpu_on, cpu_off = median(mine, "broker_cpu_s_per_gb"), median(copy, "broker_cpu_s_per_gb")
    # Only the pair's rounds pair up; a single run (round None) has nothing seconds away to compare with.
    paired = _paired_ratios({n: r for n, r in mine.items() if n is not None}, copy, "consume_mb_per_s")
    verdict = ratio_verdict(paired, FETCH_TARGET)
    kafka_mb_s = median(kafka, "consume_mb_per_s")
    return {"client": client, "record_bytes": record_bytes, "rounds": len(paired) or None,
            "sendfile_mb_s": on, "no_sendfile_mb_s": off, "ratio": _ratio(on, off),
            "ratio_by_round": [round(r, 3) for r in paired] or None, **verdict,
            # The target is the broker's serving rate; librdkafka tops out near 2 GB/s handing records to
            # Python on either path, so its row shows the client, and the broker's saving only in its CPU
            # per GB.
            "target_1_5x_met": (on / off >= FETCH_TARGET) if on and off and client == "raw-fetch" else None,
            "sendfile_cpu_s_per_gb": cpu_on, "no_sendfile_cpu_s_per_gb": cpu_off,
            "cpu_ratio": _ratio(cpu_off, cpu_on),
            "kafka_mb_s": kafka_mb_s, "copyless_vs_kafka": _ratio(on, kafka_mb_s),
            "kafka_cpu_s_per_gb": median(kafka, "broker_cpu_s_per_gb")}


def _finish(bench: Benchmark, brokers_run: list[str], kafka_state: str, clients: list[str],
            rounds: int) -> dict[str, Any]:
    rows = bench.rows
    have_kafka = "kafka" in brokers_run
    ours = "copyless" if "copyless" in brokers_run else (brokers_run[0] if brokers_run else "copyless")

    # Issue-3 targets: produce/consume MB/s at 100 B, 1 KB, 10 KB, acks=1, one partition, per client.
    workloads = dict.fromkeys((r["client"], r["record_bytes"]) for r in rows
                              if r["section"] == "targets" and r["broker"] == ours)
    target_rows = [_target_entry(rows, ours, client, record_bytes) for client, record_bytes in workloads]
    if target_rows:
        bench.table(f"Issue-3 targets: copyless >= Kafka, acks=1, one partition (MB/s, median of {rounds} "
                    "round(s); ratio = copyless / Kafka of the medians; by round = copyless / Kafka within each "
                    "round; paired = the median of those, interval = its sign-test confidence interval, "
                    "verdict = where the interval lies against 1.0 (above, below, or level: this run cannot tell "
                    "the brokers apart) and its exact coverage; consumer_thread_busy = the consumer's Python "
                    "thread's CPU seconds per wall second, median: near 1.0 the client set the consume rate; "
                    "consumer_waited = the share of "
                    "that window the client spent waiting for records, median; producer_thread_busy = the same "
                    "for the producer's queuing thread, producer_cores = its whole process's CPU seconds per "
                    "wall second, librdkafka's threads included; produce_cpu_s_per_gb / consume_cpu_s_per_gb = "
                    "the broker's CPU seconds over the produce / consume window per GB moved in it, median; "
                    "README = Kafka figures noted earlier on this machine, confluent-kafka)", target_rows)

    warmup_rows = []
    for broker in brokers_run:
        for record_bytes in dict.fromkeys(r["record_bytes"] for r in rows if r["section"] == "targets-warmup"):
            runs = sorted((r for r in rows if r["section"] == "targets-warmup" and r["broker"] == broker
                           and r["record_bytes"] == record_bytes), key=lambda r: r["round"])
            if runs:
                warmup_rows.append({"broker": broker, "record_bytes": record_bytes,
                                    **{f"{what}_mb_s_by_round": [round(r[f"{what}_mb_per_s"]) for r in runs]
                                       for what in ("produce", "consume")}})
    if warmup_rows:
        bench.table("Targets warm-up: the unmeasured rounds before the targets rounds (MB/s per round, "
                    "confluent-kafka): a broker still speeding up here would have been measured warming up",
                    warmup_rows)

    sendfile_rows = [_fetch_entry(rows, client, record_bytes) for client in FETCH_CLIENTS
                     for record_bytes in (100, 1000, 10_000)]
    sendfile_rows = [line for line in sendfile_rows if line is not None]
    if sendfile_rows:
        bench.table("Fetch path: copyless with sendfile vs --no-sendfile (and Kafka), consume MB/s of the same "
                    "topics and the broker's CPU seconds per GB served (cpu_ratio = --no-sendfile / sendfile); "
                    "raw-fetch = a Fetch loop that reads batch headers and drops record bytes in the kernel (the "
                    "broker's serving rate: target >= 1.5x), median over rounds, both brokers up at once, by "
                    "round = sendfile / copy within each round, paired = the median of those with its sign-test "
                    "interval, verdict = where the interval lies against 1.5; confluent-kafka = librdkafka "
                    "handing every record to Python (bound by the client), one run each", sendfile_rows)

    comparisons = []
    if have_kafka:
        for row in rows:
            # targets are compared above, as medians over rounds
            if row["broker"] != ours or row["section"] not in ("matrix", "latency"):
                continue
            kafka_row = next((r for r in rows if r["broker"] == "kafka" and r["section"] == row["section"]
                              and r["workload"] == row["workload"] and r["client"] == row["client"]), None)
            if kafka_row is None:
                continue
            comparisons.append({
                "section": row["section"], "workload": row["workload"], "client": row["client"],
                "produce_ratio": _ratio(row["produce_mb_per_s"], kafka_row["produce_mb_per_s"]),
                "consume_ratio": _ratio(row["consume_mb_per_s"], kafka_row["consume_mb_per_s"]),
                "produce_p99_ratio": _ratio(row["produce_p99_ms"], kafka_row["produce_p99_ms"]),
                "e2e_p99_ratio": _ratio(row["e2e_p99_ms"], kafka_row["e2e_p99_ms"]),
            })
        if comparisons:
            bench.table("copyless / Kafka, same workload, same client (throughput ratio > 1: copyless faster; "
                        "latency ratio < 1: copyless faster)", comparisons)

    latency_rows = [r for r in rows if r["section"] == "latency"]
    if latency_rows:
        bench.table("Latency at a fixed offered rate (1 KB records; ms from the scheduled send time)", [
            {k: r[k] for k in ("broker", "acks", "offered_per_s", "achieved_per_s", "produce_p50_ms",
                               "produce_p99_ms", "produce_p999_ms", "e2e_p50_ms", "e2e_p99_ms", "e2e_p999_ms")}
            for r in latency_rows])

    ratios: dict[str, Any] = {}
    for t in target_rows:
        if t["client"] == "confluent-kafka" and t["produce_ratio"] is not None:
            for what in ("produce", "consume"):
                ratios[f"{what}_vs_kafka_{t['record_bytes']}B"] = t[f"{what}_ratio"]
    for t in sendfile_rows:
        if t["ratio"] is not None:
            ratios[f"sendfile_vs_copy_{t['client']}_{t['record_bytes']}B"] = t["ratio"]
        if t["cpu_ratio"] is not None:
            ratios[f"copy_cpu_over_sendfile_{t['client']}_{t['record_bytes']}B"] = t["cpu_ratio"]
    if not have_kafka:
        bench.note("no Kafka figures in this run: ratio tables against Kafka are absent")

    def chart(fig) -> None:
        axes = fig.subplots(2, 2)
        fig.set_size_inches(12, 9)
        brokers = [b for b in dict.fromkeys(r["broker"] for r in rows if r["section"] == "targets")]
        ax = axes[0][0]
        sizes = [100, 1000, 10_000]
        width = 0.8 / max(1, 2 * len(brokers))
        for i, broker in enumerate(brokers):
            for j, (key, hatch) in enumerate((("produce_mb_per_s", ""), ("consume_mb_per_s", "//"))):
                values = [_median(r[key] for r in _target_runs(rows, broker, "confluent-kafka", s).values()) or 0
                          for s in sizes]
                offset = (2 * i + j - (2 * len(brokers) - 1) / 2) * width
                ax.bar([k + offset for k in range(len(sizes))], values, width, hatch=hatch,
                       label=f"{broker} {'produce' if j == 0 else 'consume'}")
        ax.set_xticks(range(len(sizes)), [f"{s} B" for s in sizes])
        ax.set_ylabel("MB/s")
        ax.set_title(f"targets: acks=1, 1 partition, confluent-kafka (median of {rounds} round(s))")
        ax.legend(fontsize=7)
        ax = axes[0][1]
        if sendfile_rows:
            x = range(len(sendfile_rows))
            ax.bar([k - 0.27 for k in x], [r["sendfile_mb_s"] or 0 for r in sendfile_rows], 0.27, label="sendfile")
            ax.bar(list(x), [r["no_sendfile_mb_s"] or 0 for r in sendfile_rows], 0.27, label="--no-sendfile")
            if any(r["kafka_mb_s"] for r in sendfile_rows):
                ax.bar([k + 0.27 for k in x], [r["kafka_mb_s"] or 0 for r in sendfile_rows], 0.27, label="Kafka")
            ax.set_xticks(list(x), [f"{r['record_bytes']} B\n{r['client']}" for r in sendfile_rows], fontsize=7)
            ax.legend(fontsize=7)
        ax.set_ylabel("consume MB/s")
        ax.set_title("copyless fetch path: sendfile vs copy")
        ax = axes[1][0]
        for number, broker in enumerate(dict.fromkeys(r["broker"] for r in latency_rows)):
            color = f"C{number}"
            for acks, style in (("1", "-"), ("all", "--")):
                chosen = [r for r in latency_rows if r["broker"] == broker and r["acks"] == acks]
                if chosen:
                    ax.plot([r["offered_per_s"] for r in chosen], [r["e2e_p99_ms"] for r in chosen], style,
                            color=color, marker="o", label=f"{broker} e2e p99 acks={acks}")
                    ax.plot([r["offered_per_s"] for r in chosen], [r["produce_p99_ms"] for r in chosen], style,
                            color=color, marker="x", alpha=0.5, label=f"{broker} produce p99 acks={acks}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("offered records/s (1 KB)")
        ax.set_ylabel("ms")
        ax.set_title("latency at a fixed rate")
        ax.legend(fontsize=6)
        ax = axes[1][1]
        matrix_rows = [r for r in rows if r["section"] == "matrix"]
        labels = list(dict.fromkeys(r["workload"] for r in matrix_rows))
        matrix_brokers = list(dict.fromkeys(r["broker"] for r in matrix_rows))
        width = 0.8 / max(1, len(matrix_brokers))
        for i, broker in enumerate(matrix_brokers):
            values = [_value(matrix_rows, "produce_mb_per_s", broker=broker, workload=label) or 0 for label in labels]
            ax.barh([k + (i - (len(matrix_brokers) - 1) / 2) * width for k in range(len(labels))], values, width,
                    label=broker)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_xlabel("produce MB/s (consumers running)")
        ax.set_title("matrix: one factor at a time around the base")
        ax.legend(fontsize=7)
        fig.suptitle("copyless end to end" + (" vs Apache Kafka" if have_kafka else ""), fontsize=11)

    return bench.finish(
        ratios=ratios, chart=chart,
        extra={"brokers": brokers_run, "kafka": kafka_state, "clients": clients, "rounds": rounds},
        columns=["section", "broker", "client", "workload", "round", "record_bytes", "acks", "partitions", "producers",
                 "consumers", "records", "produce_mb_per_s", "consume_mb_per_s", "produce_p99_ms", "e2e_p99_ms"])


if __name__ == "__main__":
    main()
