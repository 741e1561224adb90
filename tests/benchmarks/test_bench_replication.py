"""The replication and cluster-metadata benchmarks' own logic: the failover arithmetic, the proof of the
replica path, etcd calls charged to produce requests, the paired tables, ports and config files. Pure
functions and synthetic rows: the modules themselves run end to end in test_bench_modules."""

from __future__ import annotations

import socket

import pytest

from benchmarks._harness import Benchmark
from benchmarks._replication.clusters import PortPool, toml_text
from benchmarks._replication.failover import _no_gap
from benchmarks._replication.timeline import stall, summary
from benchmarks.cluster_metadata import etcd_delta
from benchmarks.replication import check_replica_path, paired, tables


def _steady(start: float, end: float, step: float = 0.005) -> list[float]:
    return [start + i * step for i in range(int(round((end - start) / step)) + 1)]


def test_the_stall_runs_from_the_kill_to_the_end_of_the_longest_silence():
    kill_at = 10.0
    acks = _steady(8.0, 9.99) + _steady(12.5, 14.0)
    measured = stall(acks, kill_at)
    assert measured.resumed_s == pytest.approx(2.5)
    assert measured.gap_s == pytest.approx(12.5 - 9.99)
    assert measured.acked_after == len(_steady(12.5, 14.0))


def test_a_response_still_in_flight_at_the_kill_is_not_a_one_millisecond_failover():
    # The dying leader's last acknowledgement lands 1 ms after the kill; the real silence follows it.
    acks = _steady(8.0, 10.0) + [10.001] + _steady(13.0, 14.0)
    measured = stall(acks, 10.0)
    assert measured.resumed_s == pytest.approx(3.0)
    assert measured.gap_s == pytest.approx(13.0 - 10.001)


def test_order_does_not_matter_and_a_stream_that_never_resumes_has_no_stall():
    acks = _steady(8.0, 10.0) + _steady(11.0, 12.0)
    assert stall(list(reversed(acks)), 10.0) == stall(acks, 10.0)
    never = stall(_steady(8.0, 10.0), 10.0)
    assert never.resumed_s is None and never.gap_s is None and never.acked_after == 0


def test_with_no_acknowledgement_before_the_kill_the_silence_starts_at_the_kill():
    measured = stall([12.0, 12.01, 12.02], 10.0)
    assert measured.resumed_s == pytest.approx(2.0) and measured.gap_s == pytest.approx(2.0)


def test_summary_counts_stalls_that_never_ended_apart():
    assert summary([3.0, None, 1.0, 2.0]) == {"n": 3, "missing": 1, "min": 1.0, "median": 2.0, "max": 3.0}
    assert summary([1.0, 4.0])["median"] == 2.5
    assert summary([None]) == {"n": 0, "missing": 1, "min": None, "median": None, "max": None}


def test_a_steady_window_has_no_gap_up_to_now():
    assert _no_gap([1.0, 1.1, 1.2], now=1.3, limit=0.2)
    assert not _no_gap([1.0, 1.5], now=1.6, limit=0.2)
    assert not _no_gap([1.0, 1.1], now=1.5, limit=0.2)  # silent since the last one


def test_the_replica_path_must_be_proven_by_the_counters():
    ok = {"side": "copyless", "record_bytes": 1000, "replica_sendfile_mb": 2.1, "replica_copied_mb": 0.0}
    check_replica_path(ok, 1_000_000, sendfile=True)
    with pytest.raises(RuntimeError, match="not the sendfile path"):
        check_replica_path({**ok, "replica_copied_mb": 0.001}, 1_000_000, sendfile=True)
    with pytest.raises(RuntimeError, match="not the sendfile path"):  # one follower's worth is not two
        check_replica_path({**ok, "replica_sendfile_mb": 1.5}, 1_000_000, sendfile=True)
    copied = {"side": "copyless --no-sendfile", "record_bytes": 1000, "replica_sendfile_mb": 0.0,
              "replica_copied_mb": 2.2}
    check_replica_path(copied, 1_000_000, sendfile=False)
    with pytest.raises(RuntimeError, match="not the copying path"):
        check_replica_path(ok, 1_000_000, sendfile=False)


def test_etcd_calls_are_charged_to_produce_requests_keepalives_apart():
    before = {"calls": {"LeaseKeepAlive": 10, "Range": 4, "Txn": 2}, "produce": 100, "fetch": 50, "at": 1.0}
    after = {"calls": {"LeaseKeepAlive": 16, "Range": 4, "Txn": 3, "Watch": 1}, "produce": 600, "fetch": 90,
             "at": 5.0}
    delta = etcd_delta(before, after)
    assert delta["etcd_calls_by_kind"] == {"LeaseKeepAlive": 6, "Txn": 1, "Watch": 1}
    assert delta["keepalives"] == 6 and delta["etcd_calls"] == 2
    assert delta["produce_requests"] == 500 and delta["fetch_requests"] == 40 and delta["window_s"] == 4.0
    assert delta["etcd_calls_per_produce_request"] == pytest.approx(2 / 500)
    idle = etcd_delta(before, {**before, "at": 2.0})
    assert idle["etcd_calls_per_produce_request"] is None  # no produce request: nothing to divide by


def _bench(tmp_path) -> Benchmark:
    return Benchmark("replication", "test", ["--tiny", "--out", str(tmp_path)])


def test_rounds_are_paired_within_each_round(tmp_path):
    bench = _bench(tmp_path)
    for number, ours, theirs in ((1, 100.0, 50.0), (2, 90.0, 100.0), (3, 120.0, 60.0)):
        bench.row(section="produce", side="copyless", record_bytes=1000, round=number, produce_mb_per_s=ours)
        bench.row(section="produce", side="kafka", record_bytes=1000, round=number, produce_mb_per_s=theirs)
    bench.row(section="produce-warmup", side="kafka", record_bytes=1000, round=None, produce_mb_per_s=1.0)
    line = paired(bench, "produce", "produce_mb_per_s", "copyless", "kafka", 1000)
    assert line["ratio_by_round"] == [2.0, 0.9, 2.0] and line["paired"] == 2.0
    assert line["copyless"] == 100.0 and line["kafka"] == 60.0 and line["rounds"] == 3
    assert line["interval"] is None  # three rounds cannot reach 90%: no verdict claimed


def test_tables_give_the_headline_ratios(tmp_path):
    bench = _bench(tmp_path)
    for kill, (copyless, kafka) in enumerate(((1.2, 9.5), (2.4, 14.0), (1.9, None)), start=1):
        bench.row(section="failover", side="copyless", kill=kill, stall_s=copyless, new_leader_s=1.0, rejoin_s=2.0)
        bench.row(section="failover", side="kafka", kill=kill, stall_s=kafka, new_leader_s=9.0, rejoin_s=5.0)
    for number in (1, 2):
        for side, cpu in (("copyless", 0.5), ("copyless --no-sendfile", 1.0)):
            bench.row(section="cpu", side=side, record_bytes=10_000, round=number, leader_cpu_s_per_gb=cpu,
                      produce_mb_per_s=100.0)
    bench.row(section="latency", side="copyless", record_bytes=1000, round=1, offered_per_s=500, achieved_per_s=499,
              produce_p99_ms=3.0, e2e_p50_ms=2.0, e2e_p99_ms=4.0, e2e_p999_ms=6.0)
    ratios = tables(bench, ["copyless", "kafka"])
    assert ratios["failover_stall_median_s_copyless"] == 1.9 and ratios["failover_stall_max_s_copyless"] == 2.4
    assert ratios["failover_stall_median_s_kafka"] == pytest.approx(11.75)  # the kill that never resumed apart
    assert ratios["leader_cpu_copyless_vs_no_sendfile_10000B"] == 0.5
    assert ratios["leader_cpu_s_per_gb_copyless_no_sendfile_10000B"] == 1.0
    assert ratios["e2e_p99_ms_copyless"] == 4.0 and "e2e_p99_ms_kafka" not in ratios
    titles = [t["title"] for t in bench.tables]
    assert any(t.startswith("Write stall") for t in titles) and any(t.startswith("Leader CPU") for t in titles)


def test_ports_are_taken_in_order_skipping_those_in_use():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        busy = held.getsockname()[1]
        pool = PortPool(range(busy, busy + 40))
        first = pool.take()
        assert first > busy
        assert pool.take() > first
        block = pool.take_block(3, span=10)
        assert block > first and pool.next == block + 13
    with pytest.raises(RuntimeError, match="no 3 free ports"):
        PortPool(range(busy, busy + 5)).take_block(3, span=10)


def test_broker_settings_render_as_the_config_files_toml():
    import tomllib

    text = toml_text({"log.segment.bytes": 16 << 20, "unclean.leader.election.enable": False, "a.b": 'say "x"'})
    assert tomllib.loads(text) == {"log.segment.bytes": 16 << 20, "unclean.leader.election.enable": False,
                                   "a.b": 'say "x"'}
