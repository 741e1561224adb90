"""Replication: a three-broker copyless cluster against the reference three-node Apache Kafka 3.9.1 cluster.

What runs (each side a cluster of three processes on this machine: copyless brokers on one etcd, Kafka's
KRaft nodes each broker and controller; every topic RF 3 with min.insync.replicas 2, created through the
admin API; products' defaults otherwise, so copyless's broker.session.timeout.ms is 2 s and Kafka's 9 s):

- ``failover``: the write stall after a SIGKILL of the partition leader. One producer of the project's own
  client (idempotent, acks=all, 200 records/s of 100 B into partition 0) writes for the whole section; the
  leader is killed ``--kills`` times (5; 2 with --quick), each time once the ISR is whole and the stream
  steady, and started again after (``_replication.failover``). Per kill: the stall (kill -> acks=all writes
  acknowledged again), the silence between acknowledgements, when Metadata first named the new leader, and
  how long the restarted node took to rejoin the ISR. copyless first, then Kafka the same way.
- ``produce``: replicated produce MB/s, one confluent-kafka producer (acks=all, linger 5 ms, as in
  ``benchmarks.throughput``) into a fresh 1-partition topic, at 100 B, 1 KB and 10 KB records, in
  ``--rounds`` rounds (5; 1 with --quick) that run every size on both clusters back to back, the first side
  alternating by round, after ``--warmup-rounds`` unmeasured rounds (3; 1 with --quick: Kafka's JIT). The log is read
  back once after each run and must hold what was acknowledged. Per size: medians, the copyless / Kafka ratio of each
  round, and their median with its sign-test interval and verdict (``throughput.ratio_verdict``). The leader's CPU
  seconds per GB produced come with each row.
- ``latency``: end-to-end latency (a record's scheduled send time -> a concurrent consumer has it) and
  produce latency at a fixed rate of 1 KB records: half the lower of the two clusters' median peak 1 KB
  rates from ``produce`` (``--latency-rate`` when that section does not run), ``--latency-rounds`` (3; 1
  with --quick) alternating rounds of ``LATENCY_SECONDS``, then the same at ``LOW_LATENCY_RATE`` (full runs);
  the first 20% of each (at most 2 s) is warm-up. The
  producer is confluent-kafka's, paced per record (``benchmarks.throughput``'s latency workload).
- ``cpu``: the leader's CPU per GB replicated, sendfile vs ``--no-sendfile``: a second copyless cluster
  whose brokers all run ``--no-sendfile`` (followers' fetches then copied through the leader's Python), the
  same produce runs on both, rounds alternating. Both leaders' ``stats-json`` must prove the path: with
  sendfile no replica byte copied and at least two replicas' worth sent by sendfile; with --no-sendfile the
  reverse. Kafka is stopped first.

Order: produce, latency, failover (copyless, then Kafka), then Kafka is stopped and cpu runs. Every run
writes to a fresh topic that has first acknowledged one acks=all record within 5 s
(``Cluster.create_ready_topic``; a fresh copyless topic can start with a follower waiting for metadata that
does not come, and is then replaced, with a note).

Without the reference Kafka (not found, ``--no-kafka``, or tiny test runs) copyless is measured alone and
the output says so. Every process started (etcd, brokers, JVMs) is stopped by pid, also on failure or
interrupt; all listen in 61000-61999.

Rows: ``section, side, record_bytes, round, kill`` and per section: failover ``killed, new_leader,
new_leader_s, stall_s, gap_s, rejoin_s, records_acked``; produce / cpu ``records, produce_mb_per_s,
produce_records_per_s, leader_cpu_s_per_gb, replica_sendfile_mb, replica_copied_mb``; latency
``offered_per_s, achieved_per_s, produce_p50_ms, produce_p99_ms, e2e_p50_ms, e2e_p99_ms, e2e_p999_ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks._harness import Benchmark
from benchmarks._replication.clusters import (
    DEFAULT_KAFKA_HOME,
    Cluster,
    CopylessCluster,
    EtcdServer,
    KafkaCluster,
    PortPool,
    keep_logs_on_failure,
)
from benchmarks._replication.failover import measure_failover
from benchmarks._replication.timeline import summary
from benchmarks._throughput.report import ratio_verdict
from benchmarks._throughput.workers import Workload
from benchmarks._throughput.workloads import delete_topic, run_workload

SECTIONS = ("failover", "produce", "latency", "cpu")
# copyless's defaults but one: the group-offsets topic gets 1 partition, not Kafka's 50. The Kafka clients'
# consumers look a coordinator up even with assign(), which creates it, and each of its partitions' replicas
# preallocates a 1 GiB segment: 150 GiB over three brokers, which filled this machine's disk mid-run
# (and etcd's with it). No measured path touches that topic.
COPYLESS_CONFIG = {"offsets.topic.num.partitions": 1}
SIZES = (100, 1000, 10_000)
TOPIC_CONFIGS = (("min.insync.replicas", "2"),)
FAILOVER_TARGET_S = 3.0
# Kafka's figure on this machine kind (shared/reference/replication.md section 6), for the table.
KAFKA_REFERENCE_STALL_S = (9.6, 14.9)
ROUNDS = 5
# Unmeasured produce rounds first, as in benchmarks.throughput: in a run with one, Kafka's JVM was still
# speeding up through measured rounds 1-2 (1 KB: 40 and 28 MB/s, then 57-70; 10 KB: 58-60, then 87-89).
WARMUP_ROUNDS = 3
# A second, fixed latency rate below half the peak: on a machine this loaded, half the peak measured minutes
# before left both clusters queueing (p99 of seconds on either side).
LOW_LATENCY_RATE = 5_000
LATENCY_ROUNDS = 3
CPU_ROUNDS = 3  # CPU per GB moved far less from round to round than MB/s did (one run: 0.2-0.3 s/GB spread)
LATENCY_SECONDS = 15.0
DEFAULT_LATENCY_RATE = 20_000  # records/s of 1 KB when the produce section did not run to set it


def _records(bench: Benchmark, record_bytes: int) -> int:
    # 128 MiB a run in full mode (at most 1M records): 1-10 s of replicated produce at the 15-100 MB/s an
    # RF-3 cluster of either product sustained on this loaded 2-core machine (every byte written three
    # times, fetched twice), so 5 rounds x 3 sizes x 2 clusters stay near ten minutes.
    budget = bench.pick(full=128 << 20, quick=32 << 20, tiny=1 << 20)
    cap = bench.pick(full=1_000_000, quick=300_000, tiny=2_000)
    return max(100, min(cap, budget // record_bytes))


def _workload(bench: Benchmark, section: str, record_bytes: int, **changes) -> Workload:
    work = Workload(section, record_bytes, _records(bench, record_bytes), acks="all", replication_factor=3,
                    topic_configs=TOPIC_CONFIGS, label=f"{section} {record_bytes} B")
    return replace(work, **changes)  # each run gets a fresh topic of its own (Run.produce)


class Run:
    """One benchmark run: the clusters, the forkserver the clients run in, and the rows measured."""

    def __init__(self, bench: Benchmark, ctx) -> None:
        self.bench = bench
        self.ctx = ctx

    # -- failover --------------------------------------------------------------------------------------------

    def failover(self, cluster: Cluster, kills: int, side: str) -> None:
        topic = cluster.create_ready_topic("bench-failover", 3, dict(TOPIC_CONFIGS), note=self.bench.note)
        self.bench.log(f"{side}: failover, {kills} kill(s) of the leader")
        rows = asyncio.run(measure_failover(cluster, topic, kills, progress=self.bench.log))
        for row in rows:
            self.bench.row(section="failover", side=side, record_bytes=100, round=None, **row)
            self.bench.log(f"{side}: kill {row['kill']}: stall {row['stall_s']:.2f} s, new leader named after "
                           f"{row['new_leader_s'] if row['new_leader_s'] is None else round(row['new_leader_s'], 2)} s")
        with contextlib.suppress(Exception):
            cluster.delete_topic(topic)

    # -- produce, cpu, latency -------------------------------------------------------------------------------

    def produce(self, cluster: Cluster, side: str, work: Workload, round_number: int | None,
                section: str) -> dict[str, Any]:
        """One run of ``work`` on ``cluster``: produce, read back, figures; the topic is deleted after."""
        work = replace(work, topic=cluster.create_ready_topic(f"bench-{section}-{work.record_bytes}", 3,
                                                              dict(TOPIC_CONFIGS), note=self.bench.note),
                       precreated=True)
        self.bench.settle()
        before = self._replica_bytes(cluster)
        leader_pid = lambda: cluster.pid_of(cluster.wait_isr(work.topic, 3)[0][0])  # noqa: E731
        try:
            figures = run_workload(self.ctx, cluster.bootstrap, work, broker_pid=leader_pid)
            after = self._replica_bytes(cluster)
        finally:
            with contextlib.suppress(Exception):
                delete_topic(cluster.bootstrap, work.topic)
        row = self.bench.row(
            section=section, side=side, record_bytes=work.record_bytes, round=round_number,
            records=figures.get("records"), produce_mb_per_s=figures.get("produce_mb_per_s"),
            produce_records_per_s=figures.get("produce_records_per_s"),
            leader_cpu_s_per_gb=figures.get("broker_produce_cpu_s_per_gb"),
            offered_per_s=work.rate_per_s, achieved_per_s=figures.get("achieved_per_s"),
            produce_p50_ms=figures.get("produce_p50_ms"), produce_p99_ms=figures.get("produce_p99_ms"),
            e2e_p50_ms=figures.get("e2e_p50_ms"), e2e_p99_ms=figures.get("e2e_p99_ms"),
            e2e_p999_ms=figures.get("e2e_p999_ms"))
        if before is not None and after is not None:
            row["replica_sendfile_mb"] = (after[0] - before[0]) / 1e6
            row["replica_copied_mb"] = (after[1] - before[1]) / 1e6
            if work.rate_per_s is None:
                check_replica_path(row, work.record_bytes * figures["records"],
                                   sendfile=side != "copyless --no-sendfile")
        return row

    @staticmethod
    def _replica_bytes(cluster: Cluster) -> tuple[int, int] | None:
        """Replica bytes every copyless node has sent by sendfile and by copying (None for Kafka): one
        partition is replicated at a time, so the sum is its leader's."""
        if not isinstance(cluster, CopylessCluster):
            return None
        stats = [cluster.stats(n) for n, node in cluster.nodes.items() if node.alive()]
        return (sum(s["replica_sendfile_bytes"] for s in stats), sum(s["replica_copied_bytes"] for s in stats))

    def rounds(self, sides: list[tuple[str, Cluster]], works: list[Workload], rounds: int, section: str,
               warmup: int = 0) -> None:
        """Every workload on every side, ``rounds`` times, the first side alternating by round, after
        ``warmup`` unmeasured rounds (JIT, page cache, connections)."""
        numbers = [0] * warmup + list(range(1, rounds + 1))
        with self.bench.progress(len(numbers) * len(works) * len(sides), "runs", section) as bar:
            for number in numbers:
                order = sides if number % 2 or len(sides) == 1 else sides[::-1]
                for work in works:
                    for side, cluster in order:
                        bar.describe(f"{side}: {work.label}, round {number or 'warm-up'}")
                        row = self.produce(cluster, side, work, number or None,
                                           section if number else f"{section}-warmup")
                        bar.advance(1)
                        self.bench.log(f"{side} {work.label} round {number or 'warm-up'}: "
                                       f"{row['produce_mb_per_s']:.1f} MB/s" + (
                                           f", e2e p99 {row['e2e_p99_ms']:.1f} ms" if row.get("e2e_p99_ms") else ""))


def check_replica_path(row: dict[str, Any], record_bytes: int, *, sendfile: bool) -> None:
    """The leader's counters prove which path served the followers: with sendfile nothing was copied and at
    least two followers' worth of the records went by sendfile; with --no-sendfile the reverse. Raises."""
    sent, copied = row["replica_sendfile_mb"] * 1e6, row["replica_copied_mb"] * 1e6
    used, unused = (sent, copied) if sendfile else (copied, sent)
    if unused != 0 or used < 2 * record_bytes:
        raise RuntimeError(f"{row['side']} {row['record_bytes']} B: followers fetched {sent:.0f} bytes by "
                           f"sendfile and {copied:.0f} copied for {record_bytes} bytes of records: not the "
                           f"{'sendfile' if sendfile else 'copying'} path")


# ----------------------------------------------------------------------------------------------------------
# Tables


def _rows(bench: Benchmark, **match) -> list[dict[str, Any]]:
    return [r for r in bench.rows if all(r.get(k) == v for k, v in match.items())]


def _median(values) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def paired(bench: Benchmark, section: str, key: str, ours: str, theirs: str, record_bytes: int) -> dict[str, Any]:
    """``ours`` / ``theirs`` within each round of ``section`` at ``record_bytes``, with the medians of each
    side and the per-round ratios' median, interval and verdict."""
    a = {r["round"]: r[key] for r in _rows(bench, section=section, side=ours, record_bytes=record_bytes)}
    b = {r["round"]: r[key] for r in _rows(bench, section=section, side=theirs, record_bytes=record_bytes)}
    ratios = [a[n] / b[n] for n in sorted(a) if n in b and a[n] is not None and b[n]]
    return {"record_bytes": record_bytes, ours: _median(a.values()), theirs: _median(b.values()),
            "rounds": len(ratios), "ratio_by_round": [round(r, 3) for r in ratios], **ratio_verdict(ratios)}


def tables(bench: Benchmark, sides: list[str]) -> dict[str, Any]:
    ratios: dict[str, Any] = {}
    failover = []
    for side in sides:
        kills = _rows(bench, section="failover", side=side)
        if kills:
            stalls = summary([r["stall_s"] for r in kills])
            leaders = summary([r["new_leader_s"] for r in kills])
            failover.append({"side": side, "kills": len(kills), "stall_min_s": stalls["min"],
                             "stall_median_s": stalls["median"], "stall_max_s": stalls["max"],
                             "new_leader_median_s": leaders["median"],
                             "rejoin_median_s": _median(r["rejoin_s"] for r in kills),
                             "target": f"<= {FAILOVER_TARGET_S:g} s" if side == "copyless" else ""})
            ratios[f"failover_stall_median_s_{side}"] = stalls["median"]
            ratios[f"failover_stall_max_s_{side}"] = stalls["max"]
    if failover:
        failover.append({"side": "kafka (reference, replication.md)", "stall_min_s": KAFKA_REFERENCE_STALL_S[0],
                         "stall_max_s": KAFKA_REFERENCE_STALL_S[1]})
        bench.table("Write stall after SIGKILL of the partition leader (acks=all, RF 3, min ISR 2)", failover)
    for section, ours, theirs, key, name in (
            ("produce", "copyless", "kafka", "produce_mb_per_s", "produce"),
            ("cpu", "copyless", "copyless --no-sendfile", "leader_cpu_s_per_gb", "leader_cpu")):
        lines = [paired(bench, section, key, ours, theirs, size) for size in SIZES
                 if _rows(bench, section=section, side=ours, record_bytes=size)]
        lines = [line for line in lines if line["rounds"]]
        for line in lines:
            versus = theirs.replace("copyless --no-", "no_")
            ratios[f"{name}_{ours.split()[0]}_vs_{versus}_{line['record_bytes']}B"] = line["paired"]
        if lines:
            title = ("Replicated produce MB/s, acks=all RF 3, one confluent-kafka producer: copyless / Kafka"
                     if section == "produce" else
                     "Leader CPU s per GB replicated: sendfile / --no-sendfile (lower is better)")
            bench.table(title, lines)
    for side in ("copyless", "kafka", "copyless --no-sendfile"):
        for size in SIZES:
            runs = _rows(bench, section="produce", side=side, record_bytes=size) + _rows(
                bench, section="cpu", side=side, record_bytes=size)
            cpu = _median(r["leader_cpu_s_per_gb"] for r in runs)
            if cpu is not None:
                ratios[f"leader_cpu_s_per_gb_{side.replace(' --no-sendfile', '_no_sendfile')}_{size}B"] = cpu
    latency = []
    rates = list(dict.fromkeys(r["offered_per_s"] for r in _rows(bench, section="latency")))
    for rate in rates:
        for side in sides:
            runs = _rows(bench, section="latency", side=side, offered_per_s=rate)
            if runs:
                latency.append({"side": side, "rounds": len(runs), "offered_per_s": rate,
                                "achieved_per_s": _median(r["achieved_per_s"] for r in runs),
                                "produce_p99_ms": _median(r["produce_p99_ms"] for r in runs),
                                "e2e_p50_ms": _median(r["e2e_p50_ms"] for r in runs),
                                "e2e_p99_ms": _median(r["e2e_p99_ms"] for r in runs),
                                "e2e_p999_ms": _median(r["e2e_p999_ms"] for r in runs)})
                # The first rate is the section's own (half the peak); any other is named by its rate.
                suffix = "" if rate == rates[0] else f"_at_{rate}"
                ratios[f"e2e_p99_ms_{side}{suffix}"] = latency[-1]["e2e_p99_ms"]
    if latency:
        bench.table("End-to-end latency, 1 KB acks=all: at half the peak replicated rate, then at a fixed lower "
                    "rate (medians over rounds)", latency)
    return ratios


def chart(bench: Benchmark, sides: list[str]):
    def draw(fig) -> None:
        axes = fig.subplots(2, 2)
        colors = {"copyless": "tab:blue", "kafka": "tab:orange", "copyless --no-sendfile": "tab:gray"}
        ax = axes[0][0]
        for i, side in enumerate(sides):
            stalls = [r["stall_s"] for r in _rows(bench, section="failover", side=side) if r["stall_s"] is not None]
            ax.scatter([i] * len(stalls), stalls, color=colors.get(side), label=side)
        ax.axhline(FAILOVER_TARGET_S, color="green", linestyle="--", linewidth=1, label="target")
        ax.set_xticks(range(len(sides)), sides)
        ax.set_ylabel("s")
        ax.set_title("write stall after SIGKILL of the leader", fontsize=9)
        for ax, section, key, title in ((axes[0][1], "produce", "produce_mb_per_s", "replicated produce MB/s"),
                                        (axes[1][0], "cpu", "leader_cpu_s_per_gb", "leader CPU s per GB")):
            names = [s for s in ("copyless", "kafka", "copyless --no-sendfile")
                     if _rows(bench, section=section, side=s)]
            width = 0.8 / max(1, len(names))
            for j, side in enumerate(names):
                values = [_median(r[key] for r in _rows(bench, section=section, side=side, record_bytes=s)) or 0
                          for s in SIZES]
                ax.bar([i + j * width for i in range(len(SIZES))], values, width, label=side, color=colors.get(side))
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(SIZES))], [f"{s} B" for s in SIZES])
            ax.set_title(title, fontsize=9)
            if names:
                ax.legend(fontsize=7)
        ax = axes[1][1]
        rates = list(dict.fromkeys(r["offered_per_s"] for r in _rows(bench, section="latency")))
        width = 0.8 / max(1, len(sides))
        for j, side in enumerate(sides):
            values = [_median(r["e2e_p99_ms"] for r in _rows(bench, section="latency", side=side, offered_per_s=rate))
                      or 0 for rate in rates]
            ax.bar([i + j * width for i in range(len(rates))], values, width, label=side, color=colors.get(side))
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rates))], [f"{rate}/s" for rate in rates])
        ax.set_yscale("log")
        ax.set_title("end-to-end p99 ms (1 KB, acks=all) by offered rate", fontsize=9)
    return draw


# ----------------------------------------------------------------------------------------------------------
# The campaign


def main(argv=None) -> dict[str, Any]:
    def arguments(parser) -> None:
        parser.add_argument("--sections", default=",".join(SECTIONS), help="subset of " + ",".join(SECTIONS))
        parser.add_argument("--kills", type=int, default=None,
                            help="leader kills per cluster (default 5; 2 with --quick)")
        parser.add_argument("--rounds", type=int, default=None,
                            help=f"measured rounds of produce and cpu (default {ROUNDS}; 1 with --quick)")
        parser.add_argument("--warmup-rounds", type=int, default=None,
                            help=f"unmeasured rounds before produce's (default {WARMUP_ROUNDS}; 1 with --quick)")
        parser.add_argument("--latency-rounds", type=int, default=None,
                            help=f"rounds of the latency section (default {LATENCY_ROUNDS}; 1 with --quick)")
        parser.add_argument("--latency-rate", type=int, default=None,
                            help="records/s for the latency section (default: half the lower peak at 1 KB "
                                 f"measured by produce, else {DEFAULT_LATENCY_RATE})")
        parser.add_argument("--kafka-home", type=Path, default=DEFAULT_KAFKA_HOME,
                            help="reference Apache Kafka (run-kafka-cluster.sh); default ../shared/anchors/kafka")
        parser.add_argument("--no-kafka", action="store_true", help="measure copyless alone")

    bench = Benchmark("replication", "replication: failover stall, replicated produce, leader CPU with and "
                      "without sendfile, end-to-end latency; copyless vs Apache Kafka, 3 brokers each", argv,
                      arguments=arguments)
    args = bench.args
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"unknown sections: {', '.join(sorted(unknown))}")
    kills = args.kills or bench.pick(full=5, quick=2, tiny=1)
    rounds = args.rounds or bench.pick(full=ROUNDS, quick=1)
    warmup_rounds = args.warmup_rounds if args.warmup_rounds is not None else bench.pick(full=WARMUP_ROUNDS, quick=1,
                                                                                          tiny=0)
    latency_rounds = args.latency_rounds or bench.pick(full=LATENCY_ROUNDS, quick=1)
    sizes = bench.pick(full=SIZES, quick=SIZES, tiny=(1000,))
    if bench.tiny:
        kafka_state = "skipped (tiny mode: test runs never depend on the reference Kafka)"
    elif args.no_kafka:
        kafka_state = "skipped (--no-kafka)"
    elif not KafkaCluster.available(args.kafka_home):
        kafka_state = f"not found at {args.kafka_home} (or no java): copyless measured alone"
    else:
        kafka_state = f"Apache Kafka 3.9.1, 3 KRaft nodes, from {args.kafka_home}"
    use_kafka = kafka_state.startswith("Apache")
    bench.note(f"reference Kafka: {kafka_state}")
    bench.note("every topic: 1 partition, replication factor 3, min.insync.replicas 2, created through the admin "
               "API; each product's default settings otherwise (copyless broker.session.timeout.ms 2 s, Kafka's "
               "9 s), but copyless's group-offsets topic has 1 partition (COPYLESS_CONFIG)")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["confluent_kafka"])
    run = Run(bench, ctx)
    sides = ["copyless"] + (["kafka"] if use_kafka else [])
    latency_rate = args.latency_rate
    failures: list[str] = []
    with bench.scratch_dir() as scratch, keep_logs_on_failure(scratch, bench.out / "replication-logs"), \
            contextlib.ExitStack() as stack:
        ports = PortPool()
        etcd = stack.enter_context(EtcdServer(scratch / "etcd", ports))
        copyless = stack.enter_context(CopylessCluster(scratch / "copyless", etcd, ports, config=COPYLESS_CONFIG))
        kafka = None
        if use_kafka and {"failover", "produce", "latency"} & set(sections):
            try:
                kafka = stack.enter_context(KafkaCluster(scratch / "kafka", ports, args.kafka_home))
                if kafka.delete_delay_kept:
                    bench.note(f"Kafka kept log.segment.delete.delay.ms 60 s (alter configs failed: "
                               f"{kafka.delete_delay_kept})")
            except Exception as exc:
                bench.note(f"reference Kafka cluster did not start: {exc}")
                sides = ["copyless"]
        clusters = [("copyless", copyless)] + ([("kafka", kafka)] if kafka is not None else [])
        if "produce" in sections:
            works = [_workload(bench, "produce", size) for size in sizes]
            run.rounds(clusters, works, rounds, "produce", warmup=warmup_rounds)
            if latency_rate is None and not bench.tiny:
                peaks = [_median(r["produce_records_per_s"] for r in _rows(bench, section="produce", side=s,
                                                                              record_bytes=1000)) for s, _ in clusters]
                if all(peaks):
                    latency_rate = int(min(peaks) / 2)
                    bench.note(f"latency: half the lower median peak at 1 KB ({min(peaks):.0f} records/s): "
                               f"{latency_rate} records/s")
        if "latency" in sections:
            latency_rate = latency_rate or bench.pick(full=DEFAULT_LATENCY_RATE, quick=5_000, tiny=500)
            seconds = bench.pick(full=LATENCY_SECONDS, quick=5.0, tiny=1.5)
            rates = [latency_rate] + ([LOW_LATENCY_RATE] if not bench.quick and latency_rate > LOW_LATENCY_RATE else [])
            works = [_workload(bench, "latency", 1000, records=int(rate * seconds), rate_per_s=rate, duration_s=seconds,
                               concurrent=True, label=f"latency 1000 B at {rate}/s") for rate in rates]
            run.rounds(clusters, works, latency_rounds, "latency")
        if "failover" in sections:
            # Last of the sections both clusters run: kills and restarts leave leadership moved and logs
            # recovered, a state the produce and latency figures should not start from.
            for side, cluster in clusters:
                section_failed(bench, failures, f"failover on {side}", run.failover, cluster, kills, side)
        if kafka is not None:
            kafka.stop()  # what follows measures copyless alone on the machine
        if "cpu" in sections:
            plain = stack.enter_context(CopylessCluster(scratch / "copyless-nosendfile", etcd, ports, sendfile=False,
                                                        config=COPYLESS_CONFIG, name="copyless --no-sendfile"))
            cpu_sizes = bench.pick(full=(1000, 10_000), quick=(10_000,), tiny=(1000,))
            works = [_workload(bench, "cpu", size) for size in cpu_sizes]
            section_failed(bench, failures, "cpu", run.rounds,
                           [("copyless", copyless), ("copyless --no-sendfile", plain)],
                           works, min(rounds, CPU_ROUNDS), "cpu")
    ratios = tables(bench, sides)
    columns = ["section", "side", "record_bytes", "round", "kill", "killed", "new_leader", "new_leader_s",
               "stall_s", "gap_s", "rejoin_s", "records", "produce_mb_per_s", "produce_records_per_s",
               "leader_cpu_s_per_gb", "replica_sendfile_mb", "replica_copied_mb", "offered_per_s",
               "achieved_per_s", "produce_p50_ms", "produce_p99_ms", "e2e_p50_ms", "e2e_p99_ms", "e2e_p999_ms"]
    document = bench.finish(ratios=ratios, extra={"kafka": kafka_state, "sides": sides, "sections": sections,
                                                  "failed": failures},
                            chart=chart(bench, sides + (["copyless --no-sendfile"] if "cpu" in sections else [])),
                            columns=columns)
    if failures:
        raise SystemExit(f"failed: {', '.join(failures)} (the other figures are written)")
    return document


def section_failed(bench: Benchmark, failures: list[str], what: str, measure, *args) -> None:
    """Run one late section; a failure is noted and the run goes on, so half an hour of figures before it
    is still written (the command then exits non-zero)."""
    try:
        measure(*args)
    except Exception as exc:
        failures.append(what)
        bench.note(f"{what} failed: {exc!r}"[:2000])


if __name__ == "__main__":
    main()
