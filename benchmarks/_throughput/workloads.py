"""Running one workload against one broker: the orchestration between the campaign and the workers.

Owns ``run_workload`` (create the topic, fork the producer and consumer workers, start their clocks
together, hand the consumers the end offsets, gather what they measured and turn it into the row's
figures: MB/s over each window, latency percentiles past the warm-up, the broker's CPU per GB when its pid
is known, its serving histograms over the consume window, the disk reads of the machine) and the admin
calls a run makes through confluent-kafka (create and delete topics, end offsets, Kafka's delete delay).
It checks every run: a consumer must read exactly the records of its full passes, and the log must hold
what was sent; anything else raises.
"""

from __future__ import annotations

import queue
import statistics
import time
import uuid
from typing import Any

from benchmarks._harness import cpu_seconds, percentile
from benchmarks._throughput.workers import WORKER_TIMEOUT_S, WorkerResult, Workload, worker_main
from copyless.broker.stats import histogram_quantile


def _admin(bootstrap: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})


def create_topic(bootstrap: str, topic: str, partitions: int, replication_factor: int = 1,
                 configs: dict[str, str] | None = None) -> None:
    from confluent_kafka.admin import NewTopic

    admin = _admin(bootstrap)  # keep a reference: a collected AdminClient fails its pending futures
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor,
                                            config=dict(configs or {}))], request_timeout=30)
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
                 broker_pid=None) -> dict[str, Any]:
    """Run one workload against ``bootstrap``; returns the measured figures (raises on client errors).

    ``serving_stats``: the broker's ``BrokerHandle.serving_stats``, read when the consumers start and when
    they are done, for the ``broker_*`` figures of that window. ``broker_pid``: the broker's process, whose
    CPU seconds over the produce window and over the consume window (when the two are apart) are charged
    per GB moved in each; or a callable returning it once the topic exists (a cluster's partition leader,
    known only then)."""
    serving_stats = serving_stats or (lambda: None)

    def broker_cpu() -> float | None:
        return cpu_seconds(broker_pid) if broker_pid else None

    if not (work.consume_only or work.precreated):
        create_topic(bootstrap, work.topic, work.partitions, work.replication_factor, dict(work.topic_configs))
    if callable(broker_pid):
        broker_pid = broker_pid()
    ready = ctx.Queue()
    results = ctx.Queue()
    processes = []

    def spawn(role: str, records: int, partitions: list[int], start_event, ends_queue) -> None:
        process = ctx.Process(target=worker_main, args=(role, bootstrap, work, records, partitions, ready,
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
