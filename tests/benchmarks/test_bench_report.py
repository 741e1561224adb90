"""``python -m benchmarks.report`` runs benchmarks and writes RESULTS.md from their JSON results."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.support.subprocesses import python_env


def _run_report(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = python_env(COPYLESS_BENCH_TINY="1")
    return subprocess.run([sys.executable, "-m", "benchmarks.report", *args], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)


def test_report_runs_the_selected_benchmarks_and_writes_results_md(tmp_path):
    out = tmp_path / "results"
    results = tmp_path / "docs" / "RESULTS.md"
    completed = _run_report(tmp_path, "--quick", "--out", str(out), "--results", str(results),
                            "--only", "writev,mmap_warmup")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert sorted(p.name for p in out.glob("*.json")) == ["mmap_warmup.json", "writev.json"]
    text = results.read_text()
    assert text.startswith("# copyless benchmark results")
    machine = json.loads((out / "writev.json").read_text())["machine"]
    assert "## Machine" in text and f"Linux {machine['kernel']}" in text and machine["python"] in text
    # One headline per benchmark, each section with its side tables and chart.
    headlines = re.findall(r"^\| \[(\w+)\]", text, flags=re.M)
    assert headlines == ["writev", "mmap_warmup"]
    crossover = json.loads((out / "writev.json").read_text())["crossover_bytes"]
    assert f"from {crossover['file'] if crossover['file'] is not None else '-'} B per buffer" in text
    assert "The article's table" in text and "**All results**" in text
    for name in ("writev", "mmap_warmup"):
        link = re.search(rf"!\[{name}\]\(([^)]+)\)", text)
        assert link, f"no chart link for {name}"
        assert (results.parent / link.group(1)).resolve() == (out / f"{name}.png").resolve()
        assert (out / f"{name}.png").exists()


def test_report_no_run_keeps_existing_results_and_flags_unknown_names(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    document = {"name": "writev", "description": "d", "quick": True, "mode": "quick", "machine": {
        "cores": 2, "memory_bytes": 1 << 30, "kernel": "k", "python": "3.11.0", "packages": {}},
        "columns": ["a"], "rows": [{"a": 1}], "ratios": {}, "notes": ["kept"], "tables": [],
        "crossover_bytes": {"file": 512, "socket": 2048}}
    (out / "writev.json").write_text(json.dumps(document))
    results = tmp_path / "RESULTS.md"
    completed = _run_report(tmp_path, "--no-run", "--out", str(out), "--results", str(results))
    assert completed.returncode == 0, completed.stderr
    text = results.read_text()
    assert "from 512 B per buffer to a file and 2048 B to a TCP socket" in text
    assert "- kept" in text
    bad = _run_report(tmp_path, "--no-run", "--only", "no_such_benchmark", "--out", str(out))
    assert bad.returncode != 0 and "unknown benchmarks" in bad.stderr


def test_the_throughput_headline_gives_each_verdict_with_its_interval():
    """Where the targets table has a verdict, the headline gives the per-round median, its interval and the
    verdict (the README's figures); where it has none (one round, or older results), the ratio of medians."""
    from benchmarks.report import _headline_throughput

    figures = (("produce", (0.92, 1.11, 1.16)), ("consume", (1.03, 1.28, 1.05)))
    ratios = {f"{w}_vs_kafka_{s}B": r for w, row in figures for s, r in zip((100, 1000, 10000), row, strict=True)}
    lines = [{"client": "confluent-kafka", "record_bytes": 100, "produce_paired": 0.961,
              "produce_interval": [0.845, 0.983], "produce_verdict": "below (96%)", "consume_paired": 0.914,
              "consume_interval": [0.822, 1.034], "consume_verdict": "level (96%)"},
             {"client": "confluent-kafka", "record_bytes": 1000, "produce_verdict": None, "consume_verdict": None},
             {"client": "copyless", "record_bytes": 10000, "produce_paired": 0.5, "produce_interval": [0.4, 0.6],
              "produce_verdict": "below (96%)"}]
    document = {"ratios": ratios, "kafka": "Apache Kafka",
                "tables": [{"title": "Issue-3 targets: ...", "rows": lines}]}
    line = _headline_throughput(document)
    assert "produce 0.961 [0.845, 0.983] below / x1.11 / x1.16," in line, line
    assert "consume 0.914 [0.822, 1.03] level / x1.28 / x1.05" in line, line
    # Results without a targets table still read, as ratios of the medians.
    assert "produce x0.92 / x1.11 / x1.16" in _headline_throughput({"ratios": ratios, "kafka": "k"})


def test_the_throughput_headline_gives_the_fetch_paths_verdict_against_its_target():
    """The fetch path's cells read its table the same way: per-round median, interval, and the verdict against
    1.5 where the table has one; the ratio of medians where it has not."""
    from benchmarks.report import _headline_throughput

    ratios = {"sendfile_vs_copy_raw-fetch_100B": 1.45, "sendfile_vs_copy_raw-fetch_1000B": 2.1}
    lines = [{"client": "raw-fetch", "record_bytes": 100, "paired": 1.62, "interval": [1.41, 1.9],
              "verdict": "level (94%)"},
             {"client": "raw-fetch", "record_bytes": 1000, "paired": 2.0, "interval": None, "verdict": None},
             {"client": "confluent-kafka", "record_bytes": 100, "paired": 1.0, "interval": [0.9, 1.1],
              "verdict": "below (94%)"}]
    line = _headline_throughput({"ratios": ratios, "kafka": "k",
                                 "tables": [{"title": "Fetch path: ...", "rows": lines}]})
    assert "fetch path sendfile / copy (raw fetch): 100B 1.62 [1.41, 1.90] level 1.5, 1000B x2.10" in line, line
