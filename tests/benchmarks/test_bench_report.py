"""``python -m benchmarks.report`` runs benchmarks and writes RESULTS.md from their JSON results."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _run_report(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COPYLESS_BENCH_TINY="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
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


def test_the_throughput_headline_gives_each_ratio_with_its_verdict():
    from benchmarks.report import _headline_throughput

    figures = (("produce", (0.96, 1.16, 1.32)), ("consume", (0.97, 1.0, 1.16)))
    ratios = {f"{w}_vs_kafka_{s}B": r for w, row in figures for s, r in zip((100, 1000, 10000), row)}
    verdicts = {"produce_vs_kafka_100B": "level (96%)", "produce_vs_kafka_1000B": "above (96%)",
                "consume_vs_kafka_10000B": "below (96%)"}
    line = _headline_throughput({"ratios": ratios, "verdicts": verdicts, "kafka": "Apache Kafka"})
    assert "produce x0.96 (level)/1.16 (above)/1.32," in line, line
    assert "consume x0.97/1.00/1.16 (below)" in line, line
    # A document from before verdicts existed still reads.
    assert "produce x0.96/1.16/1.32" in _headline_throughput({"ratios": ratios, "kafka": "k"})
