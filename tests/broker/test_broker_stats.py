"""The serving-latency histograms: quantiles read back from buckets, and windows taken by subtraction."""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from copyless.broker.stats import BrokerStats, LatencyHistogram, histogram_quantile

durations = st.lists(st.floats(min_value=2e-6, max_value=600.0, allow_nan=False), min_size=1, max_size=300)
quantiles = st.sampled_from([0.0, 0.01, 0.5, 0.9, 0.99, 1.0])


def exact_quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


@given(durations, quantiles)
def test_quantile_is_the_bucket_bound_above_the_true_one(values, q):
    histogram = LatencyHistogram()
    for value in values:
        histogram.record(value)
    snapshot = histogram.snapshot()
    true_ms = exact_quantile(values, q) * 1000
    read_ms = histogram_quantile(json.loads(json.dumps(snapshot["buckets"])), q)
    # Never below the true value; at most a quarter power of two above it (plus rounding to 1 us).
    assert true_ms <= read_ms + 1e-3
    assert read_ms <= true_ms * 2 ** 0.25 + 1e-3
    assert snapshot["count"] == len(values) == sum(snapshot["buckets"].values())
    assert snapshot["max_ms"] == round(max(values) * 1000, 3)


@given(durations, durations)
def test_a_window_is_the_difference_of_two_snapshots(first, second):
    histogram = LatencyHistogram()
    for value in first:
        histogram.record(value)
    before = histogram.snapshot()["buckets"]
    for value in second:
        histogram.record(value)
    after = histogram.snapshot()["buckets"]
    window = {k: v - before.get(k, 0) for k, v in after.items()}
    alone = LatencyHistogram()
    for value in second:
        alone.record(value)
    for q in (0.5, 0.99, 1.0):
        assert histogram_quantile(window, q) == histogram_quantile(alone.snapshot()["buckets"], q)


def test_empty_and_tiny_durations():
    assert histogram_quantile({}, 0.5) is None
    assert histogram_quantile({"3": 0}, 0.99) is None
    histogram = LatencyHistogram()
    histogram.record(0.0)
    histogram.record(1e-9)
    assert histogram.snapshot()["buckets"] == {"0": 2}
    assert histogram.snapshot()["p99_ms"] == 0.001  # the first bucket's bound, about 1 us


def test_stats_snapshot_and_line_carry_the_histograms():
    stats = BrokerStats()
    assert "fetch_send_p99_ms=-" in stats.log_line()
    stats.fetch_send.record(0.002)
    stats.loop_lag.record(0.030)
    snapshot = json.loads(json.dumps(stats.snapshot()))
    assert snapshot["fetch_send"]["count"] == 1 and 2 <= snapshot["fetch_send"]["p99_ms"] < 2 * 2 ** 0.25
    assert snapshot["loop_lag"]["max_ms"] == 30.0
    assert "loop_lag_max_ms=30.0" in stats.log_line()
