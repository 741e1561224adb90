"""The results of ``benchmarks.throughput``: its rows, side tables, ratios and chart.

Owns the row schema (``add_row``: one row per measured run, every column the module docstring of
``benchmarks.throughput`` lists) and ``finish``, which reads the rows back into the side tables (issue-3
targets with per-round ratios and their sign-test verdicts, the warm-up rounds, the fetch path, copyless /
Kafka per matrix and latency workload, latency), the headline ratios that ``benchmarks.report`` puts in
RESULTS.md, and the four-panel chart, then writes ``throughput.json`` and ``throughput.png`` through the
harness. It measures nothing.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks._harness import Benchmark, median_interval
from benchmarks._throughput.workers import FETCH_CLIENTS, Workload

# Issue-3 reference figures for Kafka on a machine of this size (README of the anchors), MB/s.
KAFKA_README_MB_S = {100: (44, 20), 1000: (237, 193), 10000: (276, 293)}
# The fetch path's target: sendfile serves at least 1.5x what the same broker does copying through Python.
FETCH_TARGET = 1.5


def add_row(bench: Benchmark, broker: str, work: Workload, figures: dict[str, Any],
            round_number: int | None = None) -> dict[str, Any]:
    """Record one measured run of ``work`` on ``broker``: every column, None where the run has no figure."""
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


def finish(bench: Benchmark, brokers_run: list[str], kafka_state: str, clients: list[str],
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
