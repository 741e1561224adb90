"""The broker's counters as Prometheus metrics: ``collect(broker)`` gathers them, ``render`` writes the text
exposition format (version 0.0.4) that ``GET /metrics`` serves (``broker.server.metrics_http``).

Nothing here counts: every value is read, at scrape time, from what the broker already keeps
(``BrokerStats``, the hosted ``Partition``s, the replica manager's ISR counters, the metadata backend and
its etcd client), so a scrape costs O(partitions) on the loop thread and the hot paths pay nothing for it.

Metrics (all prefixed ``copyless_``; ``api`` is the Kafka API name, ``error`` Kafka's error name):

    requests_total{api}                         requests decoded
    request_errors_total{api,error}             non-zero error codes in responses (per partition where the
                                                response has partitions)
    request_duration_seconds{api}               histogram: decoded to last byte sent (long polls included)
    topic_bytes_in_total{topic}                 batch bytes appended from producers
    topic_bytes_out_total{topic}                record bytes sent to consumers
    fetch_bytes_total{reader,path}              record bytes sent, reader consumer|replica, path
                                                sendfile|copied (the zero-copy proof)
    produced_records_total, produced_batches_total, connections_open, connections_accepted_total,
    uptime_seconds, loop_lag_seconds (histogram: how late a 100 ms timer fires)
    partition_log_start_offset, partition_log_end_offset, partition_high_watermark {topic,partition}
    partition_last_stable_offset{topic,partition}   for partitions led here (read_committed reads below it)
    transactions_total{outcome}, transaction_markers_total   what this broker's transaction coordinator ended
    open_transactions                           transactions open on the partitions hosted here
    partition_leader{topic,partition}           1 where this broker leads the partition
    partition_producers{topic,partition}        producers whose state the partition keeps (until
                                                producer.id.expiration.ms)
    under_replicated_partitions                 partitions led here with an ISR smaller than the replicas
    isr_shrinks_total, isr_expands_total        ISR changes this broker (as leader) had recorded: a follower
                                                that fell behind; a dead broker is removed by the controller
    follower_lag_records{topic,partition,follower}   leader's log end minus the follower's (leader side)
    controller_active, controller_epoch         whether this broker is the controller, and the epoch
    controller_leader_elections_total, controller_isr_removals_total   what it did as controller (cluster)
    etcd_calls_total{method}                    etcd RPCs by method (cluster only)
    log_cleaner_cleanings_total, log_cleaner_failures_total   cleanings finished (swapped in) and failed
    log_cleaner_bytes_read_total, log_cleaner_bytes_written_total   segment bytes the cleaner read (the map's
                                                pass and the copy's) and wrote (the cleaned segments)
    log_cleaner_records_removed_total           records (tombstones included) cleaned away
    log_cleaner_last_duration_seconds           the last cleaning's wall time (Kafka's max-clean-time-secs
                                                is the max of its last cleanings' times; this is the last)
    log_cleaner_busy_seconds_total              wall time the cleaner threads spent cleaning
    log_cleaner_max_dirty_ratio                 the largest dirty ratio of the compacted logs, as of the
                                                cleaner's last look (Kafka's max-dirty-percent, as a ratio)
    partition_cleanings_total{topic,partition}  cleanings swapped into each hosted compacted log (a follower's
                                                own too)

Pure except for reading the broker's state; loop thread.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kio.index import api_key_map
from kio.schema.errors import ErrorCode

from copyless.broker.stats import LatencyHistogram, bucket_upper_s

__all__ = ["Family", "collect", "render", "CONTENT_TYPE", "BUCKETS_S"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "copyless_"
# Histogram bounds, in seconds: the latency histograms keep 121 quarter-power-of-two buckets; a scrape folds
# them into these (each fine bucket into the first bound at or above its upper edge, so every count is
# below its le).
BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
             10.0, 30.0)


@dataclass
class Family:
    """One metric family: ``samples`` are (name suffix, labels, value)."""

    name: str
    kind: str  # counter | gauge | histogram
    help: str
    samples: list[tuple[str, dict, float]] = field(default_factory=list)

    def add(self, value: float, suffix: str = "", **labels) -> None:
        self.samples.append((suffix, labels, value))


def api_name(api_key: int) -> str:
    name = api_key_map.get(api_key)
    return "".join(part.capitalize() for part in name.split("_")) if name else f"api_{api_key}"


def error_name(code: int) -> str:
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"ERROR_{code}"


def _histogram(family: Family, histogram: LatencyHistogram, **labels) -> None:
    cumulative = [0] * len(BUCKETS_S)
    for index, count in enumerate(histogram.counts):
        if not count:
            continue
        upper = bucket_upper_s(index)
        for slot, bound in enumerate(BUCKETS_S):
            if upper <= bound:
                cumulative[slot] += count
                break
    running = 0
    for bound, count in zip(BUCKETS_S, cumulative, strict=True):
        running += count
        family.add(running, "_bucket", **labels, le=repr(bound))
    family.add(histogram.count, "_bucket", **labels, le="+Inf")
    family.add(histogram.sum_s, "_sum", **labels)
    family.add(histogram.count, "_count", **labels)


def collect(broker: Any) -> list[Family]:
    """Every family, read from ``broker`` now. Loop thread; O(partitions + APIs + topics)."""
    stats = broker.stats
    families: list[Family] = []

    def family(name: str, kind: str, text: str) -> Family:
        created = Family(PREFIX + name, kind, text)
        families.append(created)
        return created

    requests = family("requests_total", "counter", "Requests decoded, by API.")
    for api_key, count in sorted(stats.requests.items()):
        requests.add(count, api=api_name(api_key))
    errors = family("request_errors_total", "counter", "Error codes in responses, by API and error.")
    for (api_key, code), count in sorted(stats.request_errors.items()):
        errors.add(count, api=api_name(api_key), error=error_name(code))
    duration = family("request_duration_seconds", "histogram",
                      "Time from a request's decoding to its response's last byte, by API.")
    for api_key, histogram in sorted(stats.request_latency.items()):
        _histogram(duration, histogram, api=api_name(api_key))

    bytes_in = family("topic_bytes_in_total", "counter", "Batch bytes appended from producers, by topic.")
    for topic, count in sorted(stats.topic_bytes_in.items()):
        bytes_in.add(count, topic=topic)
    bytes_out = family("topic_bytes_out_total", "counter", "Record bytes sent to consumers, by topic.")
    for topic, count in sorted(stats.topic_bytes_out.items()):
        bytes_out.add(count, topic=topic)
    fetched = family("fetch_bytes_total", "counter",
                     "Record bytes sent by fetches, by reader (consumer, replica) and path (sendfile, copied).")
    fetched.add(stats.fetch_sendfile_bytes, reader="consumer", path="sendfile")
    fetched.add(stats.fetch_copied_bytes, reader="consumer", path="copied")
    fetched.add(stats.replica_sendfile_bytes, reader="replica", path="sendfile")
    fetched.add(stats.replica_copied_bytes, reader="replica", path="copied")
    family("produced_records_total", "counter", "Records appended from producers.").add(stats.produce_records)
    family("produced_batches_total", "counter", "Batches appended from producers.").add(stats.produce_batches)
    family("connections_open", "gauge", "Client connections open.").add(stats.connections_open)
    family("connections_accepted_total", "counter", "Client connections accepted.").add(stats.connections_accepted)
    family("uptime_seconds", "gauge", "Seconds since the broker started.").add(
        round(time.monotonic() - stats.started_monotonic, 3))
    _histogram(family("loop_lag_seconds", "histogram", "How late a 100 ms timer on the event loop fires."),
               stats.loop_lag)

    replicas = broker.replicas
    start = family("partition_log_start_offset", "gauge", "First offset of each hosted partition's log.")
    end = family("partition_log_end_offset", "gauge", "Log end offset of each hosted partition.")
    high = family("partition_high_watermark", "gauge", "High watermark of each hosted partition.")
    stable = family("partition_last_stable_offset", "gauge",
                    "Last stable offset of each partition led here: its first open transaction, or the high "
                    "watermark.")
    leader = family("partition_leader", "gauge", "1 where this broker leads the partition, else 0.")
    producers = family("partition_producers", "gauge",
                       "Idempotent and transactional producers whose state each hosted partition keeps.")
    lag = family("follower_lag_records", "gauge",
                 "For partitions led here: the leader's log end offset minus each follower's.")
    under = 0
    for (topic, index), partition in sorted(replicas.partitions.items()):
        labels = {"topic": topic, "partition": str(index)}
        start.add(partition.log_start_offset, **labels)
        end.add(partition.log_end_offset, **labels)
        high.add(partition.high_watermark, **labels)
        leader.add(1 if partition.is_leader else 0, **labels)
        producers.add(broker.producers.producer_count(topic, index), **labels)
        if partition.is_leader:
            stable.add(partition.last_stable_offset, **labels)
            under += partition.under_replicated
            for follower, view in sorted(partition.followers.items()):
                behind = partition.log_end_offset - view.log_end_offset if view.log_end_offset >= 0 \
                    else partition.log_end_offset
                lag.add(max(0, behind), **labels, follower=str(follower))
    family("under_replicated_partitions", "gauge",
           "Partitions led here whose ISR is smaller than their replica set.").add(under)
    isr = getattr(replicas, "stats", {})
    family("isr_shrinks_total", "counter", "ISR shrinks recorded by this broker as leader.").add(
        isr.get("isr_shrinks", 0))
    family("isr_expands_total", "counter", "ISR expansions recorded by this broker as leader.").add(
        isr.get("isr_expands", 0))

    _cleaner_families(family, broker, replicas)

    metadata = broker.metadata
    family("controller_active", "gauge", "1 when this broker is the controller.").add(
        1 if metadata.is_controller else 0)
    controller = getattr(metadata, "controller", None)
    family("controller_epoch", "gauge", "The controller epoch (elections so far) this broker knows.").add(
        controller.epoch if controller is not None and controller.active else 0)
    if controller is not None:
        controller_stats = controller.stats
        family("controller_leader_elections_total", "counter",
               "Leader elections this broker made as controller (failover, preferred).").add(
            controller_stats.get("leader_elections", 0))
        family("controller_isr_removals_total", "counter",
               "Dead brokers this broker removed from ISRs as controller.").add(controller_stats.get("isr_removals", 0))
    client = getattr(metadata, "client", None)
    if client is not None:
        calls = family("etcd_calls_total", "counter", "etcd RPCs, by method.")
        for method, count in sorted(dict(client.calls).items()):
            calls.add(count, method=method)
    transactions = getattr(broker, "transactions", None)
    if transactions is not None:
        ended = family("transactions_total", "counter",
                       "Transactions this broker coordinated to their end, by outcome (timed_out: aborted by "
                       "their timeout, also counted as aborted).")
        for outcome in ("committed", "aborted", "timed_out"):
            ended.add(transactions.stats[outcome], outcome=outcome)
        family("transaction_markers_total", "counter", "COMMIT/ABORT markers this coordinator had written.").add(
            transactions.stats["markers"])
    family("open_transactions", "gauge", "Transactions open on the partitions hosted here.").add(
        broker.txn_partitions.open_transactions())
    security = getattr(broker, "security", None)
    if security is not None:
        security.metric_families(family)
    return families


def _cleaner_families(family, broker: Any, replicas: Any) -> None:
    """The log cleaner's counters (``LogCleaner.metrics``, written by its threads: each value is one int or
    float read, and ``per_log`` is replaced whole, never mutated). Absent when the cleaner is disabled."""
    log_manager = getattr(broker, "log_manager", None)
    cleaner = getattr(log_manager, "cleaner", None)
    if cleaner is None:
        return
    metrics = cleaner.metrics
    family("log_cleaner_cleanings_total", "counter", "Log cleanings finished (swapped in).").add(metrics.cleanings)
    family("log_cleaner_failures_total", "counter", "Log cleanings that failed (retried after the backoff).").add(
        metrics.failures)
    family("log_cleaner_bytes_read_total", "counter", "Segment bytes read by the log cleaner.").add(metrics.bytes_read)
    family("log_cleaner_bytes_written_total", "counter", "Cleaned segment bytes written by the log cleaner.").add(
        metrics.bytes_written)
    family("log_cleaner_records_removed_total", "counter", "Records the log cleaner removed.").add(
        metrics.records_dropped)
    family("log_cleaner_last_duration_seconds", "gauge", "Wall time of the last log cleaning.").add(
        round(metrics.last_seconds, 6))
    family("log_cleaner_busy_seconds_total", "counter", "Wall time the cleaner threads spent cleaning.").add(
        round(metrics.busy_seconds, 6))
    ratios = metrics.per_log
    family("log_cleaner_max_dirty_ratio", "gauge",
           "The largest dirty ratio (dirty / cleanable bytes) of the compacted logs at the cleaner's last look.").add(
        round(max(ratios.values(), default=0.0), 6))
    cleanings = family("partition_cleanings_total", "counter", "Cleanings swapped into each hosted compacted log.")
    for (topic, index), partition in sorted(replicas.partitions.items()):
        partition_log = partition.log
        if partition_log is not None and "compact" in partition_log.config.cleanup_policy:
            cleanings.add(partition_log.stats.get("cleanings", 0), topic=topic, partition=str(index))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def render(families: Iterable[Family]) -> str:
    """The text exposition format: HELP and TYPE lines, then one line per sample."""
    lines = []
    for item in families:
        lines.append(f"# HELP {item.name} {item.help}")
        lines.append(f"# TYPE {item.name} {item.kind}")
        for suffix, labels, value in item.samples:
            if labels:
                text = ",".join(f'{key}="{_escape(str(label))}"' for key, label in labels.items())
                lines.append(f"{item.name}{suffix}{{{text}}} {_number(value)}")
            else:
                lines.append(f"{item.name}{suffix} {_number(value)}")
    return "\n".join(lines) + "\n"
