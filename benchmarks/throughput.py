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

Code: this module owns the campaign: the plan of workloads per mode, the rounds and their order, which
brokers are up when, and the command line. Its parts live in ``benchmarks/_throughput/``: ``brokers``
(starting, observing and stopping copyless and Kafka), ``workers`` (the producer and consumer processes),
``workloads`` (one workload against one broker, and its figures) and ``report`` (the rows, the side tables,
the ratios and the chart).
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import os
import re
import shutil
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks._harness import Benchmark, cpu_seconds
from benchmarks._throughput.brokers import DEFAULT_KAFKA_HOME, BrokerHandle, start_copyless, start_kafka
from benchmarks._throughput.report import add_row, finish, ratio_verdict
from benchmarks._throughput.workers import FETCH_CLIENTS, Workload
from benchmarks._throughput.workloads import delete_files_at_once, delete_topic, run_workload

# What other benchmarks build on: benchmarks.prefault runs its workloads through these and judges its ratios
# with ratio_verdict.
__all__ = ["FETCH_CLIENTS", "Campaign", "Workload", "main", "plan", "ratio_verdict", "run_workload",
           "start_copyless"]

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
            variations += [dict(acks="all"), dict(record_bytes=100), dict(record_bytes=10_000), dict(acks="0"),
                           dict(partitions=4), dict(producers=4), dict(record_bytes=100_000),
                           dict(partitions=8, consumers=2)]
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
        add_row(self.bench, handle.name, work, figures, round_number)
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
        add_row(self.bench, handle.name, consume, figures, round_number)
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
    return True, f"Apache Kafka from {os.path.relpath(args.kafka_home, Path(__file__).resolve().parents[1])}"


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
    return finish(bench, campaign.brokers_run, kafka_state, clients, rounds)


if __name__ == "__main__":
    main()
