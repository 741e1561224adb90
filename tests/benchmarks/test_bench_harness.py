"""The benchmark harness: options, progress output, tables, disk scaling, the JSON document and the chart."""

from __future__ import annotations

import io
import json
import math
import os
import random
import statistics
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks._harness import (
    TINY_ENV,
    Benchmark,
    MedianInterval,
    Progress,
    cpu_seconds,
    format_table,
    format_value,
    machine_description,
    median_interval,
    percentile,
)
from tests.support.polling import wait_until


@pytest.fixture
def no_tiny(monkeypatch):
    monkeypatch.delenv(TINY_ENV, raising=False)


def test_options_and_modes(tmp_path, no_tiny, monkeypatch):
    full = Benchmark("demo", "a demo", ["--out", str(tmp_path / "a")])
    assert (full.quick, full.tiny, full.mode) == (False, False, "full")
    assert full.pick(1, 2, 3) == 1
    assert (tmp_path / "a").is_dir()
    quick = Benchmark("demo", "a demo", ["--quick", "--out", str(tmp_path)])
    assert (quick.quick, quick.mode, quick.pick(1, 2, 3), quick.pick(1, 2)) == (True, "quick", 2, 2)
    monkeypatch.setenv(TINY_ENV, "1")
    tiny = Benchmark("demo", "a demo", ["--out", str(tmp_path)])
    assert (tiny.quick, tiny.tiny, tiny.pick(1, 2, 3), tiny.pick(1, 2)) == (True, True, 3, 2)


def test_extra_arguments(tmp_path, no_tiny):
    bench = Benchmark("demo", "a demo", ["--out", str(tmp_path), "--bootstrap", "h:1"],
                      arguments=lambda p: p.add_argument("--bootstrap"))
    assert bench.args.bootstrap == "h:1"
    with pytest.raises(SystemExit):
        Benchmark("demo", "a demo", ["--out", str(tmp_path), "--nonsense"])


def test_finish_writes_the_documented_json_and_a_png(tmp_path, no_tiny, capsys):
    bench = Benchmark("demo", "a demo", ["--quick", "--out", str(tmp_path)])
    bench.row(size=1, method="a", mb_per_s=1.5)
    bench.row(size=2, method="b", mb_per_s=float("nan"), extra_field=True)
    bench.note("scaled something")
    bench.table("article vs today", [{"x": 1, "article": 2.0}])
    drawn = []

    def chart(fig):
        drawn.append(fig)
        fig.add_subplot().plot([1, 2], [3, 4])

    document = bench.finish(ratios={"r": 2.0}, extra={"crossover_bytes": {"file": 10}}, chart=chart,
                            columns=["size", "method", "mb_per_s"])
    assert drawn, "chart callback not called"
    on_disk = json.loads((tmp_path / "demo.json").read_text())
    assert on_disk == document
    for key in ("name", "description", "quick", "machine", "rows", "ratios", "notes", "tables", "columns"):
        assert key in on_disk
    assert on_disk["rows"][1]["mb_per_s"] is None  # NaN is not JSON
    assert on_disk["crossover_bytes"] == {"file": 10}
    assert on_disk["notes"] == ["scaled something"]
    assert on_disk["columns"] == ["size", "method", "mb_per_s"]
    assert (tmp_path / "demo.png").read_bytes().startswith(b"\x89PNG")
    printed = capsys.readouterr().out
    assert "article vs today" in printed and "mb_per_s" in printed and "scaled something" in printed


def test_finish_without_chart_still_draws_the_table(tmp_path, no_tiny):
    bench = Benchmark("plain", "no chart", ["--out", str(tmp_path)])
    bench.row(a=1)
    bench.finish()
    assert (tmp_path / "plain.png").stat().st_size > 1000


def test_extra_may_not_overwrite_standard_fields(tmp_path, no_tiny):
    bench = Benchmark("demo", "a demo", ["--out", str(tmp_path)])
    with pytest.raises(ValueError):
        bench.finish(extra={"rows": []})


def test_machine_description_has_what_results_md_needs(tmp_path):
    machine = machine_description(tmp_path)
    assert machine["cores"] >= 1 and machine["memory_bytes"] > 0
    assert machine["kernel"] and machine["python"].count(".") == 2
    assert "matplotlib" in machine["packages"]
    assert machine["filesystem"]["free_bytes"] > 0


def test_disk_scale_fits_or_scales_with_a_note(tmp_path, no_tiny):
    bench = Benchmark("demo", "a demo", ["--out", str(tmp_path)])
    assert bench.disk_scale(1024) == 1.0
    assert bench.notes == []
    scale = bench.disk_scale(bench.free_bytes() * 10, what="huge files")
    assert 0.0 <= scale < 0.1
    assert len(bench.notes) == 1 and "huge files" in bench.notes[0]


def test_scratch_dir_is_removed_even_on_error(tmp_path, no_tiny):
    bench = Benchmark("demo", "a demo", ["--out", str(tmp_path)])
    with pytest.raises(RuntimeError), bench.scratch_dir() as scratch:
        (scratch / "big").write_bytes(b"x" * 100)
        kept = scratch
        raise RuntimeError("boom")
    assert not kept.exists()


def test_progress_plain_lines_when_not_a_terminal():
    stream = io.StringIO()
    with Progress(100, "items", label="work", stream=stream, tty=False) as bar:
        for _ in range(100):
            bar.advance(1)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("work: 0/100 items")
    assert lines[-1].startswith("work: 100/100 items done")
    assert 3 <= len(lines) <= 6  # milestones, not one line per advance
    assert "\r" not in stream.getvalue()


def test_progress_bar_on_a_terminal():
    stream = io.StringIO()
    with Progress(10, "items", stream=stream, tty=True) as bar:
        bar.set(10)
    text = stream.getvalue()
    assert "\r" in text and "[" + "#" * 30 + "]" in text and text.endswith("\n")


def test_cpu_seconds_of_self_and_another_process():
    import subprocess
    import sys

    before = cpu_seconds()
    sum(i * i for i in range(300_000))
    assert cpu_seconds() > before
    child = subprocess.Popen([sys.executable, "-c", "import sys; sum(i*i for i in range(3_000_000)); "
                              "sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        wait_until(lambda: cpu_seconds(child.pid) >= 0.05, what="the child to use 50 ms of CPU", timeout_s=30.0)
    finally:
        child.stdin.close()
        child.wait(10)
    with pytest.raises(ProcessLookupError):
        cpu_seconds(child.pid)
    assert os.getpid() > 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=-1e9, max_value=1e9, allow_nan=False), min_size=1, max_size=50),
       st.floats(min_value=0, max_value=100))
def test_percentile_is_bounded_monotonic_and_matches_the_median(values, q):
    p = percentile(values, q)
    assert min(values) - 1e-6 <= p <= max(values) + 1e-6
    assert percentile(values, 0) == min(values) and percentile(values, 100) == max(values)
    assert math.isclose(percentile(values, 50), statistics.median(values), rel_tol=1e-9, abs_tol=1e-6)
    if q < 100:
        assert percentile(values, q) <= percentile(values, min(100.0, q + 1)) + 1e-6


def _below_rank(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) < k), summed independently of the implementation's running tail."""
    return sum(math.comb(n, i) for i in range(k)) / 2 ** n


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=1e-3, max_value=1e3, allow_nan=False), min_size=1, max_size=60),
       st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_median_interval_is_the_widest_rank_pair_that_reaches_the_confidence(values, confidence):
    interval = median_interval(values, confidence)
    ordered = sorted(values)
    n = len(ordered)
    reachable = [k for k in range(1, (n + 1) // 2 + 1) if 1 - 2 * _below_rank(n, k) >= confidence]
    if not reachable:
        assert interval is None
        return
    k = max(reachable)  # the narrowest interval that still covers: its ends are the k-th values from each end
    assert interval.low == ordered[k - 1] and interval.high == ordered[n - k]
    assert interval.low <= interval.median <= interval.high
    assert interval.median == statistics.median(ordered)
    assert math.isclose(interval.confidence, 1 - 2 * _below_rank(n, k)) and interval.confidence >= confidence
    scaled = median_interval([v * 3.5 for v in values], confidence)
    assert math.isclose(scaled.low, 3.5 * interval.low) and math.isclose(scaled.high, 3.5 * interval.high)


def test_median_interval_needs_five_values_at_ninety_percent():
    assert median_interval([1.0, 2.0, 3.0, 4.0]) is None
    five = median_interval([5.0, 1.0, 4.0, 2.0, 3.0])
    assert (five.low, five.median, five.high, five.confidence) == (1.0, 3.0, 5.0, 1 - 2 / 32)
    fifteen = median_interval([float(v) for v in range(15)])
    assert (fifteen.low, fifteen.high) == (3.0, 11.0) and math.isclose(fifteen.confidence, 1 - 2 * 576 / 2 ** 15)
    with pytest.raises(ValueError):
        median_interval([1.0] * 10, confidence=1.0)


@pytest.mark.parametrize("draw", [lambda r: math.exp(r.gauss(0.0, 0.15)),       # median 1.0
                                  lambda r: r.expovariate(1.0) / math.log(2),   # skewed, median 1.0
                                  lambda r: 1.0 + r.paretovariate(1.5) - 2 ** (1 / 1.5)])  # long tail, median 1.0
def test_median_interval_covers_the_true_median_as_often_as_it_says(draw):
    """Drawn 4,000 times, 15 values each, from distributions whose median is 1.0: the interval holds 1.0 in
    96.5% of draws, its stated coverage, whatever the shape (the sign test assumes none)."""
    rng = random.Random(20261123)
    trials, covered, stated = 4000, 0, None
    for _ in range(trials):
        interval = median_interval([draw(rng) for _ in range(15)])
        stated = interval.confidence
        covered += interval.low <= 1.0 <= interval.high
    # The binomial spread of 4,000 trials at 0.965 is 0.003: 0.015 is five of them.
    assert abs(covered / trials - stated) < 0.015, (covered / trials, stated)


def test_median_interval_verdicts():
    assert MedianInterval(1.2, 1.05, 1.3, 0.96).verdict() == "above"
    assert MedianInterval(0.9, 0.8, 0.97, 0.96).verdict() == "below"
    assert MedianInterval(1.02, 0.95, 1.1, 0.96).verdict() == "level"
    assert MedianInterval(1.0, 1.0, 1.1, 0.96).verdict() == "level"  # an end on the line cannot tell
    assert MedianInterval(2.0, 1.6, 2.2, 0.96).verdict(against=1.5) == "above"


def test_percentile_rejects_nonsense():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_format_table_aligns_numbers_right_and_text_left():
    text = format_table([{"name": "a", "n": 1.0}, {"name": "long name", "n": 123.456}], ["name", "n"])
    lines = text.splitlines()
    assert lines[0].split() == ["name", "n"]
    assert lines[2].startswith("a ") and lines[2].endswith("1.00")
    assert lines[3].endswith("123")
    markdown = format_table([{"a": "x", "b": 2}], markdown=True)
    assert markdown.splitlines()[1] == "|---|---:|"
    assert format_value(None) == "-" and format_value(True) == "yes" and format_value(0.000123) == "0.000123"


def test_settle_memory_waits_until_the_reporter_counter_is_quiet(tmp_path, monkeypatch):
    from benchmarks import _harness

    counter = tmp_path / "reported_kib"
    counter.write_text("0\n")

    def write(text: str) -> None:  # whole values only, as sysfs shows them
        (tmp_path / "next").write_text(text)
        os.replace(tmp_path / "next", counter)

    monkeypatch.setattr(_harness, "_REPORTED_KIB", counter)

    def settle_while(reporter, timeout_s: float) -> float:
        """settle_memory's wait while ``reporter(stop)`` runs on a thread."""
        stop = threading.Event()
        thread = threading.Thread(target=reporter, args=(stop,))
        thread.start()
        try:
            return _harness.settle_memory(timeout_s=timeout_s)
        finally:
            stop.set()
            thread.join()

    def reporter(stop) -> None:  # the kernel's reporter: a batch every 0.5 s for 2 s, then idle
        for batch in range(1, 5):
            if stop.wait(0.5):
                return
            write(f"{batch * 262144}\n")

    started = time.monotonic()
    waited = settle_while(reporter, timeout_s=30)
    # Quiet for one reporting period (2 s) after the last batch (at ~2 s), and not before.
    assert counter.read_text() == "1048576\n"
    assert 4.4 <= waited <= 30 and time.monotonic() - started >= 4.4

    def busy_reporter(stop) -> None:  # a counter that never settles: the wait gives up at the timeout
        batch = 0
        while not stop.wait(0.2):
            batch += 1
            write(f"{batch}\n")

    assert 1.0 <= settle_while(busy_reporter, timeout_s=1.0) < 2.0


def test_settle_memory_returns_at_once_without_a_reporter(tmp_path, monkeypatch):
    from benchmarks import _harness

    monkeypatch.setattr(_harness, "_REPORTED_KIB", tmp_path / "absent")
    assert _harness.settle_memory() == 0.0
