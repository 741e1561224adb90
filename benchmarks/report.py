"""Run every benchmark and regenerate ``benchmarks/RESULTS.md`` from their JSON results.

    python -m benchmarks.report [--quick] [--out benchmarks/results] [--only a,b] [--skip c]
                                [--quick-for d,e] [--no-run]

Each benchmark runs as its own process (``python -m benchmarks.<name> [--quick] --out DIR``), one after
the other, so no two measurements share the CPU. RESULTS.md is then written from every ``DIR/<name>.json``
present — including results of benchmarks not rerun this time (``--only``/``--skip``), so an expensive
one (``throughput`` against Apache Kafka) can be refreshed on its own. Charts are linked relative to
RESULTS.md. A benchmark that fails is reported in RESULTS.md with its exit code and the run continues;
the command then exits non-zero.

RESULTS.md format: a title, the machine (cores, CPU, memory, kernel, filesystem, Python, package
versions), a headline table (one line per benchmark: the figure it exists to show), then one section per
benchmark: description, mode and date, every side table (the article's figures beside today's), the main
result table, ratios, notes, and the chart.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._harness import format_bytes, format_table, format_value

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
# The articles first (in seed order), then the project's own layers, then the broker end to end.
ORDER = ("zero_copy", "file_copy", "writev", "poll", "mmap_warmup", "storage", "prefault", "compaction",
         "compaction_vs_kafka", "compaction_offsets", "compaction_produce",
         "client", "connections", "throughput", "replication", "cluster_metadata", "security", "transactions",
         "txn_startup", "nemesis")
TITLES = {
    "zero_copy": "Zero copy: read + send vs sendfile (IBM developerWorks, seeds 000/002)",
    "file_copy": "Copying a file four ways (seed 001)",
    "writev": "write() or writev()? (seed 004)",
    "poll": "poll vs epoll with idle connections (IBM pollset article, seed 003)",
    "mmap_warmup": "Warming an mmap'd segment (RocketMQ, seed 001)",
    "storage": "Storage engine",
    "prefault": "The broker's pre-fault: zeros first, pwrite past it, neither",
    "compaction": "The log cleaner",
    "compaction_vs_kafka": "Cleaning throughput: copyless's cleaner vs Kafka's",
    "compaction_offsets": "__consumer_offsets compacted: disk and load time",
    "compaction_produce": "Produce on a compacted topic beside the cleaner",
    "client": "copyless client",
    "connections": "Many connections against the broker",
    "throughput": "End to end: copyless vs Apache Kafka",
    "replication": "Replication: three brokers each, copyless vs Apache Kafka",
    "cluster_metadata": "Cluster metadata in etcd",
    "nemesis": "Overlapping faults: the nemesis soak and the checker",
    "transactions": "Transactions: transactional produce, commit latency, read_committed consume",
    "txn_startup": "Start-up of a long transactional partition: whole-log scan vs snapshots",
}


def available_benchmarks() -> list[str]:
    present = {p.stem for p in BENCH_DIR.glob("*.py") if not p.stem.startswith("_") and p.stem != "report"}
    ordered = [n for n in ORDER if n in present]
    return ordered + sorted(present - set(ordered))


def run_benchmark(name: str, out: Path, quick: bool) -> tuple[int, float]:
    command = [sys.executable, "-m", f"benchmarks.{name}", "--out", str(out)] + (["--quick"] if quick else [])
    print(f"\n### {' '.join(command)}", flush=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    started = time.perf_counter()
    completed = subprocess.run(command, env=env, cwd=str(REPO_ROOT))
    return completed.returncode, time.perf_counter() - started


# -- rendering -------------------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    return format_value(value)


def _ratio(document: dict, key: str) -> float | None:
    value = document.get("ratios", {}).get(key)
    return value if isinstance(value, (int, float)) else None


def _headline_zero_copy(d: dict) -> str:
    saved = _ratio(d, "time_saved_pct_median_rx4k")
    saved_big = _ratio(d, "time_saved_pct_median_rx256k")
    cpu = _ratio(d, "sender_cpu_sendfile_vs_read4k")
    return (f"sendfile takes {_fmt(saved)}% less time than read 4 KiB + send (median over sizes; "
            f"{_fmt(saved_big)}% with a 256 KiB receiver; article: ~65%); sender CPU per GB "
            f"x{_fmt(cpu)} of read 4 KiB + send")


def _headline_file_copy(d: dict) -> str:
    return (f"time relative to sendfile: mmap x{_fmt(_ratio(d, 'mmap_vs_sendfile'))} (article "
            f"x{_fmt(_ratio(d, 'article_mmap_vs_sendfile'))}), read+write 64 KiB "
            f"x{_fmt(_ratio(d, 'read_write_64k_vs_sendfile'))}, buffered 1 B "
            f"x{_fmt(_ratio(d, 'buffered_1b_vs_sendfile'))} "
            f"(article x{_fmt(_ratio(d, 'article_buffered_vs_sendfile'))}), "
            f"copy_file_range x{_fmt(_ratio(d, 'copy_file_range_vs_sendfile'))}")


def _headline_writev(d: dict) -> str:
    crossover = d.get("crossover_bytes", {})
    return (f"writev beats one joined write from {_fmt(crossover.get('file'))} B per buffer to a file and "
            f"{_fmt(crossover.get('socket'))} B to a TCP socket (article, 2001: ~200 B)")


def _headline_poll(d: dict) -> str:
    ratios = d.get("ratios", {})
    high = max(d.get("idle_counts", [0]) or [0])
    poll_vs_epoll = ratios.get(f"poll_vs_epoll_at_{high}")
    poll_drop = ratios.get(next((k for k in ratios if k.startswith(f"poll_{high}_vs_poll_")), ""), None)
    epoll_drop = ratios.get(next((k for k in ratios if k.startswith(f"epoll_{high}_vs_epoll_")), ""), None)
    return (f"with {high} idle connections poll serves x{_fmt(poll_vs_epoll)} of epoll's requests/s; poll keeps "
            f"{_fmt(100 * poll_drop if poll_drop else None)}% of its low-N throughput, epoll "
            f"{_fmt(100 * epoll_drop if epoll_drop else None)}% (article: +13.3% for pollset)")


def _headline_mmap_warmup(d: dict) -> str:
    ratios = d.get("ratios", {})
    parts = [f"{k.replace('_vs_sparse_', ' (')}): x{_fmt(v)}" for k, v in ratios.items() if "16KiB" in k]
    return "append MB/s vs a sparse segment — " + ", ".join(parts)


def _headline_prefault(d: dict) -> str:
    lines = next((t["rows"] for t in d.get("tables", []) if t["title"].startswith("Pairs of variants")), [])
    parts = [f"{line['pair']}, {line['record_bytes']} B: MB/s "
             + _verdict_cell(line["mb_per_s_ratio"], line["mb_per_s_interval"], line["mb_per_s_verdict"],
                             line["mb_per_s_ratio"])
             + ", CPU/GB " + _verdict_cell(line["cpu_ratio"], line["cpu_interval"], line["cpu_verdict"],
                                           line["cpu_ratio"])
             for line in lines]
    return "produce, per-round median — " + "; ".join(parts)


def _verdict_cell(paired, interval, verdict: str | None, ratio, against: str = "") -> str:
    """``median [low, high] verdict`` where a table line has a verdict, else ``x`` and the ratio of medians."""
    if verdict:
        low, high = interval
        return f"{_fmt(paired)} [{_fmt(low)}, {_fmt(high)}] {verdict.split()[0]}{against}"
    return f"x{_fmt(ratio)}"


def _headline_throughput(d: dict) -> str:
    ratios = d.get("ratios", {})
    sizes = (100, 1000, 10000)
    parts = []
    # The targets table's confluent-kafka lines: where they carry a verdict, the headline gives the per-round
    # ratios' median, its interval and the verdict, the same figures the README leads with; otherwise (runs
    # of one round, results from before verdicts) the ratio of the medians.
    targets = next((t["rows"] for t in d.get("tables", []) if t["title"].startswith("Issue-3 targets")), [])
    lines = {line["record_bytes"]: line for line in targets if line.get("client") == "confluent-kafka"}

    def cell(what: str, size: int) -> str:
        line = lines.get(size, {})
        return _verdict_cell(line.get(f"{what}_paired"), line.get(f"{what}_interval"), line.get(f"{what}_verdict"),
                             ratios.get(f"{what}_vs_kafka_{size}B"))

    if any(f"produce_vs_kafka_{s}B" in ratios for s in sizes):
        parts.append("copyless / Kafka at 100 B/1 KB/10 KB: " + ", ".join(
            f"{what} " + " / ".join(cell(what, s) for s in sizes) for what in ("produce", "consume")))
    # The fetch path likewise: the per-round sendfile / copy median, interval and verdict against 1.5 where
    # its table has them (runs of five rounds or more), else the ratio of the medians.
    fetch_table = next((t["rows"] for t in d.get("tables", []) if t["title"].startswith("Fetch path")), [])
    fetch_lines = {f"{line['record_bytes']}B": line for line in fetch_table if line.get("client") == "raw-fetch"}

    def fetch_cell(size: str, ratio: float) -> str:
        line = fetch_lines.get(size, {})
        return f"{size} " + _verdict_cell(line.get("paired"), line.get("interval"), line.get("verdict"), ratio,
                                          against=" 1.5")

    fetch = [(k, v) for k, v in ratios.items() if k.startswith("sendfile_vs_copy_raw-fetch_")]
    if fetch:
        parts.append("fetch path sendfile / copy (raw fetch): " + ", ".join(
            fetch_cell(k.rsplit('_', 1)[1], v) for k, v in fetch))
    return "; ".join(parts or ["see tables"]) + f" (Kafka: {d.get('kafka', '?')})"


def _headline_replication(d: dict) -> str:
    ratios = d.get("ratios", {})
    parts = []
    stall = ratios.get("failover_stall_median_s_copyless")
    if stall is not None:
        kafka = ratios.get("failover_stall_median_s_kafka")
        parts.append(f"write stall after SIGKILL of the leader: median {_fmt(stall)} s, max "
                     f"{_fmt(ratios.get('failover_stall_max_s_copyless'))} s (target 3 s)"
                     + (f"; Kafka median {_fmt(kafka)} s" if kafka is not None else ""))
    tables = {t["title"].split(",")[0]: t["rows"] for t in d.get("tables", [])}
    produce = tables.get("Replicated produce MB/s", [])
    if produce:
        parts.append("replicated produce copyless / Kafka at " + " / ".join(
            f"{line['record_bytes']} B " + _verdict_cell(line.get("paired"), line.get("interval"),
                                                          line.get("verdict"), line.get("paired"))
            for line in produce))
    cpu = [(k.rsplit("_", 1)[1], v) for k, v in ratios.items() if k.startswith("leader_cpu_copyless_vs_no_sendfile_")]
    if cpu:
        parts.append("leader CPU per GB, sendfile / --no-sendfile: " + ", ".join(f"{k} x{_fmt(v)}" for k, v in cpu))
    latency = next((rows for title, rows in tables.items() if title.startswith("End-to-end latency")), [])
    if latency:
        parts.append("end-to-end p99 (1 KB, acks=all): " + ", ".join(
            f"{line['side']} {_fmt(line['e2e_p99_ms'])} ms at {line['offered_per_s']}/s" for line in latency))
    return "; ".join(parts or ["see tables"]) + f" (Kafka: {d.get('kafka', '?')})"


def _headline_cluster_metadata(d: dict) -> str:
    ratios = d.get("ratios", {})
    return (f"controller failover: CreateTopics works again {_fmt(ratios.get('controller_create_ok_median_s'))} s "
            f"(median; max {_fmt(ratios.get('controller_create_ok_max_s'))} s) after SIGKILL of the controller; "
            f"CreateTopics p50 {_fmt(ratios.get('create_p50_ms_embedded'))} ms embedded, "
            f"{_fmt(ratios.get('create_p50_ms_etcd_rf1'))} ms etcd RF 1, {_fmt(ratios.get('create_p50_ms_etcd_rf3'))} "
            f"ms etcd RF 3; etcd calls per produce request {_fmt(ratios.get('etcd_calls_per_produce_request_acks_1'))} "
            f"(acks=1), {_fmt(ratios.get('etcd_calls_per_produce_request_acks_all'))} (acks=all)")


def _headline_nemesis(d: dict) -> str:
    faults = d.get("faults", {})
    anomalies = {k: v for k, v in d.get("anomaly_counts", {}).items() if v}
    acknowledged = next((r["count"] for r in d.get("rows", []) if r.get("kind") == "records acknowledged"), "?")
    return (f"{_fmt(d.get('minutes'))} min, seed {d.get('seed')}: {sum(faults.values())} faults "
            f"({len(faults)} kinds, overlapping), {acknowledged} records acknowledged, anomalies: "
            + (", ".join(f"{k} {v}" for k, v in anomalies.items()) if anomalies else "none"))


def _headline_security(d: dict) -> str:
    ratios = d.get("ratios", {})
    parts = []
    for size in (100, 1000, 10000):
        over_plaintext, over_kafka = "copyless SASL_SSL/PLAINTEXT", "copyless/kafka SASL_SSL"
        parts.append(f"{size} B: SASL_SSL/PLAINTEXT produce "
                     f"{_fmt(ratios.get(f'{over_plaintext} produce_mb_per_s {size}B'))}, "
                     f"consume {_fmt(ratios.get(f'{over_plaintext} consume_mb_per_s {size}B'))}; "
                     f"copyless/Kafka under SASL_SSL produce "
                     f"{_fmt(ratios.get(f'{over_kafka} produce_mb_per_s {size}B'))}, "
                     f"consume {_fmt(ratios.get(f'{over_kafka} consume_mb_per_s {size}B'))}")
    return "; ".join(parts) + f" (TLS path: {d.get('tls_path', '?')}; Kafka: {d.get('kafka', '?')})"


def _headline_compaction(d: dict) -> str:
    parts = [f"{record_bytes} B records, {keys:,} keys: "
             f"{_fmt(_ratio(d, f'mb_per_s_{record_bytes}B_{keys}keys'))} MB/s, "
             f"{_fmt(_ratio(d, f'cpu_s_per_gb_{record_bytes}B_{keys}keys'))} CPU s/GB"
             for record_bytes, keys in d.get("cases", [])]
    return f"one cleaning of a {_fmt(d.get('log_mb'))} MiB log (median) — " + "; ".join(parts)


def _headline_compaction_vs_kafka(d: dict) -> str:
    return (f"{_fmt(d.get('keys'))} keys x 1 KB at a dirty ratio of 0.9: copyless "
            f"{_fmt(_ratio(d, 'dirty_mb_per_s_copyless'))} MB/s of dirty log cleaned, Kafka "
            f"{_fmt(_ratio(d, 'dirty_mb_per_s_kafka'))}; copyless/Kafka "
            f"{_fmt(_ratio(d, 'copyless_over_kafka_dirty_mb_per_s'))} (median of rounds; target 1.0; "
            f"Kafka: {d.get('kafka', '?')})")


def _headline_compaction_offsets(d: dict) -> str:
    return (f"{_fmt(d.get('commits'))} commits of {_fmt(d.get('keys'))} keys: after one cleaning the log is "
            f"{_fmt(_ratio(d, 'bytes_after_over_live'))}x and its load {_fmt(_ratio(d, 'load_cpu_after_over_live'))}x "
            f"(CPU) a log of only the live keys; {_fmt(_ratio(d, 'bytes_before_over_after'))}x smaller than before")


def _headline_compaction_produce(d: dict) -> str:
    return (f"compact / delete: {_fmt(_ratio(d, 'mb_per_s_compact_over_delete'))}x the produce MB/s, "
            f"{_fmt(_ratio(d, 'cpu_s_per_gb_compact_over_delete'))}x the broker CPU per GB")


def _headline_transactions(d: dict) -> str:
    ratios = d.get("ratios", {})
    return (f"copyless/Kafka: transactional produce {_fmt(ratios.get('copyless/kafka produce_mb_per_s'))}, "
            f"commit p50 {_fmt(ratios.get('copyless/kafka commit_p50_ms'))}, "
            f"p99 {_fmt(ratios.get('copyless/kafka commit_p99_ms'))} (below 1: faster), read_committed consume "
            f"{_fmt(ratios.get('copyless/kafka consume_mb_per_s'))} (Kafka: {d.get('kafka', '?')})")


HEADLINES: dict[str, Callable[[dict], str]] = {
    "compaction_produce": _headline_compaction_produce,
    "compaction_offsets": _headline_compaction_offsets,
    "compaction_vs_kafka": _headline_compaction_vs_kafka,
    "zero_copy": _headline_zero_copy,
    "file_copy": _headline_file_copy,
    "writev": _headline_writev,
    "poll": _headline_poll,
    "mmap_warmup": _headline_mmap_warmup,
    "prefault": _headline_prefault,
    "throughput": _headline_throughput,
    "replication": _headline_replication,
    "cluster_metadata": _headline_cluster_metadata,
    "nemesis": _headline_nemesis,
    "security": _headline_security,
    "compaction": _headline_compaction,
    "transactions": _headline_transactions,
}


def headline(document: dict) -> str:
    render = HEADLINES.get(document["name"])
    try:
        if render is not None:
            return render(document)
    except Exception as exc:  # a headline must never stop the report: fall back to the raw ratios
        return f"(headline unavailable: {exc!r}) " + _generic_headline(document)
    return _generic_headline(document)


def _generic_headline(document: dict) -> str:
    ratios = document.get("ratios", {})
    items = list(ratios.items())[:4]
    return ", ".join(f"{k} {_fmt(v) if not isinstance(v, (dict, list)) else json.dumps(v)}" for k, v in items) \
        or document.get("description", "")


def machine_section(machine: dict) -> str:
    packages = ", ".join(f"{k} {v}" for k, v in sorted(machine.get("packages", {}).items()))
    filesystem = machine.get("filesystem") or {}
    lines = [
        "| | |", "|---|---|",
        f"| cores | {machine.get('cores')} ({machine.get('cores_usable')} usable), {machine.get('cpu_model')} |",
        f"| memory | {format_bytes(machine['memory_bytes']) if machine.get('memory_bytes') else '?'} |",
        f"| kernel | Linux {machine.get('kernel')} ({machine.get('platform')}) |",
        f"| filesystem | {filesystem.get('type', '?')} on {filesystem.get('device', '?')} |",
        f"| Python | {machine.get('python')} ({machine.get('python_implementation')}) |",
        f"| packages | {packages}; librdkafka {machine.get('librdkafka')} |",
    ]
    return "\n".join(lines)


def _where(machine: dict) -> str:
    """The CPU and kernel a result was measured on: results kept from earlier runs may come from another
    machine of the same size than the one the report is generated on."""
    return f"{machine.get('cpu_model', '?')} (kernel {machine.get('kernel', '?')})"


def benchmark_section(document: dict, results_dir_link: str) -> str:
    name = document["name"]
    parts = [f"## {TITLES.get(name, name)}", "",
             f"`python -m benchmarks.{name}{' --quick' if document.get('quick') else ''} --out DIR` — "
             f"{document.get('description', '')}. Mode: {document.get('mode', '?')}, run "
             f"{document.get('started_at', '?')} on {_where(document.get('machine', {}))}, "
             f"{_fmt(document.get('duration_s'))} s, load average at start "
             f"{document.get('machine', {}).get('loadavg_at_start')}.", ""]
    parts += [f"**Headline:** {headline(document)}", ""]
    for table in document.get("tables", []):
        parts += [f"**{table['title']}**", "",
                  format_table(table["rows"], table["columns"], headers=table.get("headers"), markdown=True), ""]
    if document.get("rows"):
        parts += ["**All results**", "",
                  format_table(document["rows"], document.get("columns"), headers=document.get("headers"),
                               markdown=True), ""]
    ratios = document.get("ratios", {})
    if ratios:
        parts += ["**Ratios:** " + ", ".join(
            f"`{k}` {_fmt(v) if not isinstance(v, (dict, list)) else json.dumps(v)}" for k, v in ratios.items()), ""]
    if document.get("notes"):
        parts += ["**Notes**", ""] + [f"- {n}" for n in document["notes"]] + [""]
    parts += [f"![{name}]({results_dir_link}/{name}.png)", ""]
    return "\n".join(parts)


def render(out: Path, results_path: Path, failures: dict[str, int], command: str) -> str:
    documents = []
    for name in available_benchmarks():
        path = out / f"{name}.json"
        if path.exists():
            documents.append(json.loads(path.read_text()))
    try:
        link = os.path.relpath(out.resolve(), results_path.resolve().parent)
    except ValueError:
        link = str(out.resolve())
    lines = ["# copyless benchmark results", "",
             "Generated by `python -m benchmarks.report` (do not edit by hand: rerun it). Each source article's "
             "measurement is reproduced on this machine and shown beside the article's own figures; every "
             "benchmark reruns alone with `python -m benchmarks.<name> [--quick] --out DIR`.", "",
             f"Last command: `{command}`", ""]
    if documents:
        lines += ["## Machine", "", machine_section(documents[-1]["machine"]), "",
                  "The machine is shared and has 2 cores: treat single figures as rough and read ratios "
                  "measured within one run. The table above is the machine this report was generated on; each "
                  "section names the CPU and kernel its own run had.", "",
                  "## Headlines", "", "| benchmark | mode | headline |", "|---|---|---|"]
        for document in documents:
            lines.append(f"| [{document['name']}](#{_anchor(TITLES.get(document['name'], document['name']))}) | "
                         f"{document.get('mode', '?')} | {headline(document).replace('|', '/')} |")
        lines.append("")
    if failures:
        lines += ["## Failed in the last run", ""] + [f"- `{n}` exited with {code}" for n, code in failures.items()]
        lines.append("")
    for document in documents:
        lines.append(benchmark_section(document, link))
    text = "\n".join(lines).rstrip() + "\n"
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(text, encoding="utf-8")
    return text


def _anchor(title: str) -> str:
    keep = "".join(ch for ch in title.lower() if ch.isalnum() or ch in " -_")
    return keep.replace(" ", "-")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="run every benchmark with --quick")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results",
                        help="JSON and PNG directory (default benchmarks/results)")
    parser.add_argument("--results", type=Path, default=BENCH_DIR / "RESULTS.md", help="the Markdown to write")
    parser.add_argument("--only", default="", help="comma-separated benchmarks to run (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated benchmarks not to run")
    parser.add_argument("--quick-for", default="",
                        help="comma-separated benchmarks run with --quick even in a full run")
    parser.add_argument("--no-run", action="store_true", help="only regenerate RESULTS.md from existing JSON")
    args = parser.parse_args(argv)
    names = available_benchmarks()
    only = [n for n in args.only.split(",") if n]
    skip = {n for n in args.skip.split(",") if n}
    quick_for = {n for n in args.quick_for.split(",") if n}
    unknown = (set(only) | skip | quick_for) - set(names)
    if unknown:
        parser.error(f"unknown benchmarks: {', '.join(sorted(unknown))}; available: {', '.join(names)}")
    selected = [n for n in names if (not only or n in only) and n not in skip]
    args.out.mkdir(parents=True, exist_ok=True)
    failures: dict[str, int] = {}
    if not args.no_run:
        for name in selected:
            code, seconds = run_benchmark(name, args.out, args.quick or name in quick_for)
            print(f"### {name}: exit {code} after {seconds:.0f} s", flush=True)
            if code != 0:
                failures[name] = code
    command = "python -m benchmarks.report " + " ".join(argv if argv is not None else sys.argv[1:])
    render(args.out, args.results, failures, command.strip())
    print(f"\nwrote {args.results}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
