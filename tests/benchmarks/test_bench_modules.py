"""Every benchmark module runs end to end in its tiny mode and writes the JSON and chart it promises.

Each ``benchmarks/<name>.py`` present when the suite runs is executed exactly as a user would run it,
``python -m benchmarks.<name> --quick --out DIR``, in a subprocess with ``COPYLESS_BENCH_TINY=1`` (the
smallest sizes, so the whole set takes seconds). The assertions are about shape, never about numbers: the
machine is shared and noisy, and performance lives in the benchmarks themselves. A module that exists but
cannot be imported yet is skipped with the import error as the reason.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from tests.support.subprocesses import REPO_ROOT, python_env

BENCH_DIR = REPO_ROOT / "benchmarks"
# Not benchmarks themselves: the harness and the runner that regenerates RESULTS.md (tested separately).
NOT_BENCHMARKS = {"report"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RUN_TIMEOUT_S = 240


def _benchmark_names() -> list[str]:
    return sorted(p.stem for p in BENCH_DIR.glob("*.py")
                  if not p.stem.startswith("_") and p.stem not in NOT_BENCHMARKS)


def _rows_with(document: dict, **match) -> list[dict]:
    return [r for r in document["rows"] if all(r.get(k) == v for k, v in match.items())]


# -- what each article benchmark must contain (keys and row combinations, not values) ------------------------


def _check_zero_copy(document: dict) -> None:
    from benchmarks import zero_copy

    sizes = document["sizes_mb"]
    assert sizes, "no sizes"
    for size in sizes:
        for receiver in zero_copy.RECEIVER_BUFFERS:
            for method in zero_copy.METHODS:
                rows = _rows_with(document, size_mb=size, receiver_buffer=f"{receiver // 1024} KiB",
                                  method=method)
                assert len(rows) == 1, (size, receiver, method, rows)
                row = rows[0]
                for key in ("time_ms", "mb_per_s", "sender_cpu_s_per_gb", "receiver_cpu_s_per_gb"):
                    assert isinstance(row[key], (int, float)) and row[key] > 0, (key, row)
                if method == zero_copy.TRADITIONAL:
                    assert row["saved_pct"] is None
                else:
                    assert isinstance(row["saved_pct"], (int, float))
    titles = [t["title"] for t in document["tables"]]
    assert any("Article Table 1" in t for t in titles), titles
    article = next(t for t in document["tables"] if "Article Table 1" in t["title"])
    assert {"article_traditional_ms", "article_transferTo_ms", "today_traditional_ms", "today_sendfile_ms",
            "today_saved_pct"} <= set(article["columns"])
    assert len(article["rows"]) == len(sizes)
    assert any("CPU seconds per GB" in t for t in titles), titles
    assert {"time_saved_pct_median_rx4k", "sender_cpu_sendfile_vs_read4k"} <= set(document["ratios"])


def _check_file_copy(document: dict) -> None:
    from benchmarks import file_copy

    for size in document["sizes_mb"]:
        methods = [r["method"] for r in _rows_with(document, size_mb=size)]
        assert methods == list(file_copy.METHODS), methods
        for row in _rows_with(document, size_mb=size):
            assert row["time_ms"] > 0 and row["mb_per_s"] > 0
            assert isinstance(row["extrapolated"], bool)
        sendfile = _rows_with(document, size_mb=size, method="sendfile")[0]
        assert sendfile["vs_sendfile"] == pytest.approx(1.0)
    article = document["tables"][0]
    assert [r["method"] for r in article["rows"]] == list(file_copy.METHODS)
    assert {"mmap_vs_sendfile", "stream_1b_vs_sendfile", "article_mmap_vs_sendfile"} <= set(document["ratios"])


def _check_writev(document: dict) -> None:
    from benchmarks import writev

    crossover = document["crossover_bytes"]
    assert set(crossover) == {"file", "socket"}
    for target, value in crossover.items():
        assert value is None or value in document["sizes"], (target, value)
    for target in writev.TARGETS:
        for size in document["sizes"]:
            methods = [r["method"] for r in _rows_with(document, target=target, elem_size=size)]
            assert methods == list(writev.METHODS), (target, size, methods)
            for row in _rows_with(document, target=target, elem_size=size):
                assert row["cpu_us_per_call"] > 0 and row["wall_us_per_call"] > 0 and row["rounds"] >= 1
    article = document["tables"][0]
    assert {"article_iov_ms", "article_buf_ms", "file_writev_ms", "socket_sendmsg_ms"} <= set(article["columns"])


def _check_poll(document: dict) -> None:
    servers = document["servers"]
    assert {"PollSelector", "EpollSelector", "asyncio"} <= set(servers)
    for server in servers:
        counts = [r["idle_connections"] for r in _rows_with(document, server=server)]
        assert counts == document["idle_counts"], (server, counts)
    for row in document["rows"]:
        assert row["requests_per_s"] > 0
        assert row["server_cpu_pct"] >= 0
    assert any(k.startswith("poll_vs_epoll_at_") for k in document["ratios"])


def _check_mmap_warmup(document: dict) -> None:
    from benchmarks import mmap_warmup

    for batch in document["batch_sizes"]:
        variants = [r["variant"] for r in _rows_with(document, batch_bytes=batch)]
        expected = [v for v in mmap_warmup.VARIANTS if v not in document["unsupported"]]
        assert variants == expected, variants
        for row in _rows_with(document, batch_bytes=batch):
            assert row["mb_per_s"] > 0 and row["prep_ms"] >= 0 and row["max_us"] >= row["p50_us"] > 0
    # The first-touch table prices the ways of filling page cache; only the mmap ways have a pre-fault part.
    if "MADV_POPULATE_WRITE" in document["unsupported"]:
        assert document["first_touch"] == []
        return
    ways = {r["way"]: r for r in document["first_touch"]}
    assert list(ways) == list(mmap_warmup.FIRST_TOUCH_WAYS)
    assert all(r["cpu_s_per_gib"] > 0 and len(r["by_round"]) == 2 for r in ways.values()), ways
    assert ways["write()"]["prefault_cpu_s_per_gib"] == ways["write() 4 MiB"]["prefault_cpu_s_per_gib"] == 0
    for way in ("MADV_POPULATE_WRITE + copy", "zeros by write() + MADV_POPULATE_WRITE + copy"):
        assert 0 < ways[way]["prefault_cpu_s_per_gib"] <= ways[way]["cpu_s_per_gib"], ways[way]
    assert document["ratios"]["populate_copy_vs_write_cpu"] > 0


def _check_prefault(document: dict) -> None:
    from benchmarks import prefault

    rounds = document["rounds"]
    probes = _rows_with(document, variant="memory probe")
    assert [r["round"] for r in probes] == list(range(1, rounds + 1)), probes
    assert all(r["populate_cpu_s_per_gib"] > 0 and r["zeros_cpu_s_per_gib"] > 0 for r in probes)
    variants = prefault.VARIANTS
    for size in document["sizes"]:
        runs = _rows_with(document, record_bytes=size)
        # One run per variant per round, the order rotating: round n starts with the n-th variant.
        assert [(r["round"], r["variant"]) for r in runs] == [
            (n, variants[(n - 1 + i) % len(variants)]) for n in range(1, rounds + 1) for i in range(len(variants))]
        for row in runs:
            assert row["produce_mb_per_s"] > 0 and row["consume_mb_per_s"] > 0, row
            # The wait counters agree: a longest wait exactly when some append waited.
            assert (row["append_waits"] > 0) == (row["append_wait_max_ms"] > 0), row
            # Each broker got its variant's environment: zeros unless "populate only", pwrite past the
            # pre-fault only in "default".
            assert (row["zeroed_mb"] > 0) == (row["variant"] != "populate only"), row
            assert row["outrun_mb"] == 0 or row["variant"] == "default", row
        for a, b in prefault.PAIRS:
            assert document["ratios"][f"{prefault._key(a)}_vs_{prefault._key(b)}_mb_per_s_{size // 1000}KB"] > 0
    table = next(t for t in document["tables"] if t["title"].startswith("Pairs of variants"))
    assert [(line["pair"], line["record_bytes"]) for line in table["rows"]] == [
        (f"{a} / {b}", size) for a, b in prefault.PAIRS for size in document["sizes"]]


def _check_throughput(document: dict) -> None:
    from benchmarks import throughput

    # Tiny runs never touch the reference Kafka: the suite must not depend on it.
    assert "kafka" not in document["brokers"] and "tiny" in document["kafka"]
    assert {"copyless", "copyless --no-sendfile"} <= set(document["brokers"])
    sections = {r["section"] for r in document["rows"]}
    assert sections == {"targets-warmup", "targets", "matrix", "latency", "sendfile"}, sections
    # One unmeasured warm-up round per broker, of the same workloads, before round 1 of the targets.
    warmup = _rows_with(document, section="targets-warmup")
    assert {(r["broker"], r["round"]) for r in warmup} == {("copyless", 1)}, warmup
    assert all(r["produce_mb_per_s"] > 0 and r["client"] == "confluent-kafka" for r in warmup)
    first_targets = min(i for i, r in enumerate(document["rows"]) if r["section"] == "targets")
    assert max(i for i, r in enumerate(document["rows"]) if r["section"] == "targets-warmup") < first_targets
    for row in _rows_with(document, section="targets"):
        assert row["produce_mb_per_s"] > 0 and row["consume_mb_per_s"] > 0 and row["records"] > 0
    matrix = _rows_with(document, section="matrix")
    assert any(r["producers"] > 1 and r["consumers"] > 1 and r["partitions"] > 1 for r in matrix)
    for row in _rows_with(document, section="latency"):
        for key in ("produce_p50_ms", "produce_p99_ms", "produce_p999_ms", "e2e_p50_ms", "e2e_p99_ms",
                    "e2e_p999_ms"):
            assert row[key] is not None and row[key] >= 0, (key, row)
        assert row["produce_p50_ms"] <= row["produce_p99_ms"] <= row["produce_p999_ms"]
        assert row["offered_per_s"] > 0
    for client in throughput.FETCH_CLIENTS:
        brokers = {r["broker"] for r in _rows_with(document, section="sendfile", client=client)}
        assert brokers == {"copyless", "copyless --no-sendfile"}, (client, brokers)
    # The raw Fetch loop runs in rounds on both copyless brokers, the first alternating: sendfile first in
    # round 1, --no-sendfile first in round 2; librdkafka once each.
    raw = [(r["round"], r["broker"]) for r in _rows_with(document, section="sendfile", client="raw-fetch")]
    assert raw == [(1, "copyless"), (1, "copyless --no-sendfile"), (2, "copyless --no-sendfile"),
                   (2, "copyless")], raw
    assert all(r["round"] is None for r in _rows_with(document, section="sendfile", client="confluent-kafka"))
    fetch_table = next(t for t in document["tables"] if t["title"].startswith("Fetch path"))
    raw_line = next(line for line in fetch_table["rows"] if line["client"] == "raw-fetch")
    assert raw_line["rounds"] == 2 and len(raw_line["ratio_by_round"]) == 2 and raw_line["verdict"] is None
    # Every copyless consume row carries the broker's own write times and loop lag over its window.
    for row in _rows_with(document, section="targets") + _rows_with(document, section="sendfile"):
        assert 0 < row["broker_fetch_send_p50_ms"] <= row["broker_fetch_send_p99_ms"] < 60_000, row
        assert 0 < row["broker_fetch_prepare_p99_ms"] < 60_000, row
        assert 0 <= row["broker_loop_lag_max_ms"] < 60_000, row
    # librdkafka consumers of a written log say how long they waited for records; other clients say nothing.
    for row in _rows_with(document, section="targets"):
        waited = row["consumer_waited_share"]
        assert (0.0 <= waited <= 1.0) if row["client"] == "confluent-kafka" else waited is None, row
    assert any(r["client"] == "confluent-kafka" for r in _rows_with(document, section="targets"))
    titles = [t["title"] for t in document["tables"]]
    assert any(t.startswith("Issue-3 targets") for t in titles) and any(t.startswith("Fetch path") for t in titles)
    # A tiny run has one round: no interval can reach 90% from one ratio, so its verdict is left empty.
    targets_table = next(t for t in document["tables"] if t["title"].startswith("Issue-3 targets"))
    for line in targets_table["rows"]:
        assert line["rounds"] == 1 and line["produce_interval"] is None and line["consume_verdict"] is None, line
    assert any(t.startswith("Targets warm-up") for t in titles)


def _check_replication(document: dict) -> None:
    # Tiny runs never touch the reference Kafka; copyless runs every section.
    assert document["sides"] == ["copyless"] and "tiny" in document["kafka"]
    assert {r["section"] for r in document["rows"]} == {"failover", "produce", "latency", "cpu"}
    for row in _rows_with(document, section="failover"):
        # Measured, not judged: a stall and a new leader other than the one killed.
        assert row["stall_s"] > 0 and row["gap_s"] > 0 and row["new_leader"] != row["killed"], row
        assert row["records_acked"] > 0
    for row in _rows_with(document, section="produce") + _rows_with(document, section="cpu"):
        # CPU is read in clock ticks (10 ms): a tiny run's leader may use less than one.
        assert row["produce_mb_per_s"] > 0 and row["leader_cpu_s_per_gb"] >= 0, row
    # Both sides of the cpu section ran, and each proved its replica path (or the run would have failed).
    cpu = _rows_with(document, section="cpu")
    assert {r["side"] for r in cpu} == {"copyless", "copyless --no-sendfile"}
    assert all((r["replica_copied_mb"] == 0) == (r["side"] == "copyless") for r in cpu), cpu
    for row in _rows_with(document, section="latency"):
        assert 0 < row["e2e_p50_ms"] <= row["e2e_p99_ms"] <= row["e2e_p999_ms"], row
    titles = [t["title"] for t in document["tables"]]
    assert any(t.startswith("Write stall") for t in titles)
    if all(r["leader_cpu_s_per_gb"] > 0 for r in cpu):
        # The paired CPU table needs a measurable CPU on both sides; a tiny run's may round to zero ticks.
        assert any(t.startswith("Leader CPU") for t in titles)


def _check_cluster_metadata(document: dict) -> None:
    assert {r["section"] for r in document["rows"]} == {"controller", "create", "etcd"}
    for row in _rows_with(document, section="controller"):
        assert row["new_controller"] not in (None, row["killed"]) and row["create_ok_s"] > 0, row
    sides = {r["side"] for r in _rows_with(document, section="create")}
    assert sides == {"embedded single node", "etcd cluster RF 1", "etcd cluster RF 3"}
    assert all(0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"] for r in _rows_with(document, section="create"))
    etcd = _rows_with(document, section="etcd")
    assert [r["acks"] for r in etcd] == ["1", "all"]
    assert all(r["produce_requests"] > 0 and r["etcd_calls_per_produce_request"] is not None for r in etcd), etcd


def _check_security(document: dict) -> None:
    from benchmarks import security

    assert document["tls_path"] in ("kTLS sendfile", "copying through OpenSSL")
    for protocol in security.PROTOCOLS:
        rows = _rows_with(document, broker="copyless", protocol=protocol)
        assert rows, protocol
        for row in rows:
            for key in ("produce_mb_per_s", "consume_mb_per_s", "broker_produce_cpu_s_per_gb",
                        "broker_consume_cpu_s_per_gb"):
                assert isinstance(row[key], (int, float)) and row[key] >= 0, (key, row)
    assert any(key.startswith("copyless SASL_SSL/PLAINTEXT consume_mb_per_s") for key in document["ratios"])


def _check_compaction(document: dict) -> None:
    cases = {tuple(case) for case in document["cases"]}
    assert cases and {(r["record_bytes"], r["keys"]) for r in document["rows"]} == cases
    for row in document["rows"]:
        assert row["log_mb"] > 0 and row["seconds"] > 0 and row["mb_per_s"] > 0, row
        # One pass of a first cleaning reads the log twice (the map's pass, the copy's) and writes less.
        assert abs(row["read_mb"] - 2 * row["log_mb"]) <= 0.2 and 0 < row["written_mb"] < row["log_mb"], row
        assert 0 < row["map_keys"] <= row["keys"] and row["records_removed"] > 0, row
    for record_bytes, keys in cases:
        assert f"mb_per_s_{record_bytes}B_{keys}keys" in document["ratios"]


def _check_compaction_vs_kafka(document: dict) -> None:
    # Tiny mode never starts Kafka: copyless alone, one cleaning of the workload's dirty ratio of about 0.9.
    rows = document["rows"]
    assert [r["broker"] for r in rows] == ["copyless"] and "tiny" in document["kafka"], document["kafka"]
    row = rows[0]
    assert row["seconds"] > 0 and row["dirty_mb_per_s"] > 0 and row["log_mb_per_s"] > 0, row
    # Nine dirty passes over one clean one (part of the clean pass may still have been in the active segment).
    assert 0.85 <= row["dirty_ratio"] < 1.0, row
    # What is left is about one 1 KB record per key: far below the log cleaned.
    assert 0 < row["end_mb"] < row["log_mb"] / 5, row
    assert document["ratios"]["dirty_mb_per_s_copyless"] == row["dirty_mb_per_s"]


def _check_compaction_offsets(document: dict) -> None:
    rows = {row["log"]: row for row in document["rows"]}
    assert set(rows) == {"before cleaning", "after cleaning", "live keys only"}, rows
    keys = document["keys"]
    assert rows["before cleaning"]["records"] == document["commits"] and rows["live keys only"]["records"] == keys
    # A cleaning of a log whose every segment is sealed leaves one record per key.
    assert rows["after cleaning"]["records"] == keys
    assert rows["after cleaning"]["log_mb"] < rows["before cleaning"]["log_mb"]
    for key in ("bytes_after_over_live", "load_cpu_after_over_live", "bytes_before_over_after"):
        assert document["ratios"][key] > 0, key


def _check_compaction_produce(document: dict) -> None:
    assert {row["policy"] for row in document["rows"]} == {"compact", "delete"}
    for row in document["rows"]:
        assert row["records"] == document["records_per_round"] and row["mb_per_s"] > 0, row
    assert document["ratios"]["mb_per_s_compact_over_delete"] > 0


def _check_transactions(document: dict) -> None:
    from benchmarks import transactions

    rows = _rows_with(document, broker="copyless")
    assert rows
    for row in rows:
        assert row["records"] == row["transactions"] * transactions.RECORDS_PER_TXN > 0, row
        for key in transactions.METRICS:
            assert isinstance(row[key], (int, float)) and row[key] > 0, (key, row)
        assert row["commit_p99_ms"] >= row["commit_p50_ms"], row


def _check_nemesis(document: dict) -> None:
    from tests.support.checker import KINDS as ANOMALY_KINDS
    from tests.support.nemesis import KINDS

    assert [r["kind"] for r in _rows_with(document, table="faults")] == list(KINDS)
    assert sum(document["faults"].values()) >= 1, "the tiny run injected no fault"
    assert [r["kind"] for r in _rows_with(document, table="anomalies")] == list(ANOMALY_KINDS)
    assert document["anomaly_counts"] == dict.fromkeys(ANOMALY_KINDS, 0), document["anomalies"]
    acknowledged = _rows_with(document, table="records", kind="records acknowledged")
    assert acknowledged and acknowledged[0]["count"] > 0
    assert document["timeline"] and isinstance(document["seed"], int)


CHECKS = {
    "zero_copy": _check_zero_copy,
    "file_copy": _check_file_copy,
    "writev": _check_writev,
    "poll": _check_poll,
    "mmap_warmup": _check_mmap_warmup,
    "prefault": _check_prefault,
    "throughput": _check_throughput,
    "replication": _check_replication,
    "cluster_metadata": _check_cluster_metadata,
    "security": _check_security,
    "compaction": _check_compaction,
    "compaction_offsets": _check_compaction_offsets,
    "compaction_vs_kafka": _check_compaction_vs_kafka,
    "compaction_produce": _check_compaction_produce,
    "transactions": _check_transactions,
    "nemesis": _check_nemesis,
}


def test_article_benchmarks_are_present():
    """The five article reproductions exist (a benchmark deleted by mistake would otherwise pass silently)."""
    assert set(CHECKS) <= set(_benchmark_names())


# Each runs a benchmark module end to end (brokers, Kafka clients): 5-40 s apiece, about 5 minutes in all.
@pytest.mark.slow
@pytest.mark.parametrize("name", _benchmark_names())
def test_benchmark_quick_mode_writes_json_and_chart(name, tmp_path):
    try:
        importlib.import_module(f"benchmarks.{name}")
    except Exception as exc:  # another part's module still being written: report, don't fail this suite
        pytest.skip(f"benchmarks.{name} does not import: {exc!r}")
    out = tmp_path / "out"
    completed = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", "--quick", "--out", str(out)],
        cwd=str(tmp_path), env=python_env(COPYLESS_BENCH_TINY="1", PYTHONUNBUFFERED="1"), capture_output=True,
        text=True, timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL,
    )
    assert completed.returncode == 0, (
        f"exit {completed.returncode}\n{completed.stdout[-4000:]}\n{completed.stderr[-4000:]}")

    document = json.loads((out / f"{name}.json").read_text())
    assert document["name"] == name
    assert document["quick"] is True and document["tiny"] is True
    assert isinstance(document["description"], str) and document["description"]
    machine = document["machine"]
    for key in ("cores", "memory_bytes", "kernel", "python", "packages"):
        assert machine.get(key), key
    assert document["rows"], "no result rows"
    assert all(isinstance(r, dict) and r for r in document["rows"])
    assert set(document["columns"]) <= {k for r in document["rows"] for k in r}
    assert isinstance(document["ratios"], dict) and isinstance(document["notes"], list)
    for table in document["tables"]:
        assert table["title"] and table["columns"] and isinstance(table["rows"], list)

    png = (out / f"{name}.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 5000, "chart missing or empty"

    # The printed report carries the main table's header.
    assert all(c in completed.stdout for c in document["columns"][:2]), completed.stdout[-2000:]
    # Scratch files are always removed.
    assert not [p for p in out.iterdir() if p.name.startswith(".scratch-")]

    check = CHECKS.get(name)
    if check is not None:
        check(document)
