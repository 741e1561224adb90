"""``benchmarks.throughput --bootstrap`` measures a broker it did not start (any Kafka-protocol bootstrap)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.throughput import _find_listen_address

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_listen_line_parsing():
    line = ("copyless listening on 127.0.0.1:40047 advertised=127.0.0.1:40047 data_dir=/tmp/d loop=uvloop "
            "sendfile=on")
    assert _find_listen_address("INFO storage started\n" + line) == ("127.0.0.1", 40047)
    assert _find_listen_address("listening on 0.0.0.0:9092") == ("127.0.0.1", 9092)
    assert _find_listen_address("started in 0.1 s; data_dir=/x:1") is None
    assert _find_listen_address("listening on 127.0.0.1:0") is None


def test_bootstrap_mode_against_a_running_broker(broker_factory, tmp_path):
    broker = broker_factory()
    out = tmp_path / "out"
    env = dict(os.environ, COPYLESS_BENCH_TINY="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.throughput", "--quick", "--out", str(out), "--bootstrap",
         broker.bootstrap, "--label", "under-test", "--sections", "targets,latency,sendfile",
         "--clients", "confluent-kafka"],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    document = json.loads((out / "throughput.json").read_text())
    assert document["brokers"] == ["under-test"]
    assert {r["broker"] for r in document["rows"]} == {"under-test"}
    assert {r["section"] for r in document["rows"]} == {"targets", "latency"}
    assert {r["client"] for r in document["rows"]} == {"confluent-kafka"}
    assert any("sendfile section skipped" in n for n in document["notes"])
    # The consumer's own thread is timed over its consume window: a share of one core, never more.
    busy = [r["consumer_thread_busy"] for r in document["rows"] if r["section"] == "targets"]
    assert busy and all(0 < b <= 1.05 for b in busy), busy
    # A tiny targets consumer reads its topic twice: the seek back to offset 0 waits out the long poll it
    # parked at the log end (fetch.wait.max.ms, 100 ms), and that gap is timed and left out of the window.
    restarts = [r["consume_restart_s"] for r in document["rows"] if r["section"] == "targets"]
    assert restarts and all(0 < g < 5 for g in restarts), restarts
    assert {r["consume_passes"] for r in document["rows"] if r["section"] == "targets"} == {2}
    disk = [r["consume_disk_read_mb"] for r in document["rows"] if r["section"] == "targets"]
    assert disk and all(isinstance(d, float) and d >= 0 for d in disk), disk
    # A broker the benchmark did not start cannot be asked for its histograms: the columns stay empty.
    assert all(r["broker_fetch_send_p99_ms"] is None for r in document["rows"])
    assert broker.alive(), "the benchmark must not stop a broker it did not start"


def test_a_matched_run_reads_the_first_brokers_pass_count(broker_factory):
    """Within a targets round, every broker after the first reads exactly as many passes as the first did
    in its time (``_same_passes``): the pass count, not the broker, used to decide a 100 B round's rate."""
    import multiprocessing

    from benchmarks.throughput import Workload, _same_passes, run_workload

    broker = broker_factory()
    planned = Workload("targets", 100, 2_000, read_passes=10, read_seconds=120.0, label="100 B matched",
                       topic="bench-matched-passes")
    assert _same_passes(planned, None) is planned
    ctx = multiprocessing.get_context("forkserver")
    figures = run_workload(ctx, broker.bootstrap, _same_passes(planned, 3))
    # As planned it would read for two minutes (at most ten passes); matched, it stops after the third.
    assert figures["consume_passes"] == 3
    assert figures["consumed"] == 3 * figures["records"] == 6_000


def test_disk_reads_are_counted(tmp_path):
    """``_disk_read_kib`` (the consume rows' disk column) counts a real read from disk: a file dropped from
    the page cache and read back adds at least its size."""
    from benchmarks.throughput import _disk_read_kib

    path = tmp_path / "cold.bin"
    path.write_bytes(os.urandom(8 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # clean pages, so the advice can drop them
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        before = _disk_read_kib()
        if before is None:
            pytest.skip("no /proc/vmstat")
        while os.read(fd, 1 << 20):
            pass
        read_kib = _disk_read_kib() - before
    finally:
        os.close(fd)
    if read_kib == 0:
        pytest.skip("the page cache kept the file (the advice is best effort)")
    assert read_kib >= (8 << 20) // 1024 * 0.9, read_kib


def test_consumer_malloc_settings_take():
    """Each consumer worker keeps freed heap memory for reuse (``_CONSUMER_MALLOPT``); glibc accepts every
    setting, here in a child process so the test runner's own allocator is left alone."""
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    code = "from benchmarks.throughput import _tune_consumer_malloc as t; print(t())"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert completed.stdout.strip() == "True", completed.stderr
