"""``benchmarks.throughput --bootstrap`` measures a broker it did not start (any Kafka-protocol bootstrap)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from benchmarks._throughput.brokers import _find_listen_address
from tests.support.subprocesses import python_env


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
    env = python_env(COPYLESS_BENCH_TINY="1")
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.throughput", "--quick", "--out", str(out), "--bootstrap",
         broker.bootstrap, "--label", "under-test", "--sections", "targets,latency,sendfile",
         "--clients", "confluent-kafka", "--warmup-rounds", "0"],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    document = json.loads((out / "throughput.json").read_text())
    assert document["brokers"] == ["under-test"]
    assert {r["broker"] for r in document["rows"]} == {"under-test"}
    assert {r["section"] for r in document["rows"]} == {"targets", "latency"}  # --warmup-rounds 0: none
    assert {r["client"] for r in document["rows"]} == {"confluent-kafka"}
    assert any("sendfile section skipped" in n for n in document["notes"])
    # The consumer's own thread is timed over its consume window: a share of one core, never more.
    busy = [r["consumer_thread_busy"] for r in document["rows"] if r["section"] == "targets"]
    assert busy and all(0 < b <= 1.05 for b in busy), busy
    waited = [r["consumer_waited_share"] for r in document["rows"] if r["section"] == "targets"]
    assert waited and all(0.0 <= w <= 1.0 for w in waited), waited
    # A tiny targets consumer reads its topic twice: the seek back to offset 0 waits out the long poll it
    # parked at the log end (fetch.wait.max.ms, 100 ms), and that gap is timed and left out of the window.
    restarts = [r["consume_restart_s"] for r in document["rows"] if r["section"] == "targets"]
    assert restarts and all(0 < g < 5 for g in restarts), restarts
    assert {r["consume_passes"] for r in document["rows"] if r["section"] == "targets"} == {2}
    disk = [r["consume_disk_read_mb"] for r in document["rows"] if r["section"] == "targets"]
    assert disk and all(isinstance(d, float) and d >= 0 for d in disk), disk
    # A broker the benchmark did not start cannot be asked for its histograms or its CPU: the columns stay
    # empty. The producer's own CPU is the benchmark's, and is there.
    assert all(r["broker_fetch_send_p99_ms"] is None for r in document["rows"])
    assert all(r["broker_produce_cpu_s_per_gb"] is None and r["broker_consume_cpu_s_per_gb"] is None
               for r in document["rows"])
    busy = [r["producer_thread_busy"] for r in document["rows"] if r["section"] == "targets"]
    assert busy and all(0 < b <= 1.05 for b in busy), busy
    assert broker.alive(), "the benchmark must not stop a broker it did not start"


def test_a_matched_run_reads_the_first_brokers_pass_count(broker_factory):
    """Within a targets round, every broker after the first reads exactly as many passes as the first did
    in its time (``_same_passes``): the pass count, not the broker, used to decide a 100 B round's rate."""
    import multiprocessing

    from benchmarks._throughput.workers import Workload
    from benchmarks._throughput.workloads import run_workload
    from benchmarks.throughput import _same_passes

    broker = broker_factory()
    planned = Workload("targets", 100, 2_000, read_passes=10, read_seconds=120.0, label="100 B matched",
                       topic="bench-matched-passes")
    assert _same_passes(planned, None) is planned
    ctx = multiprocessing.get_context("forkserver")
    figures = run_workload(ctx, broker.bootstrap, _same_passes(planned, 3))
    # As planned it would read for two minutes (at most ten passes); matched, it stops after the third.
    assert figures["consume_passes"] == 3
    assert figures["consumed"] == 3 * figures["records"] == 6_000


def test_the_broker_and_the_producer_are_charged_their_cpu_per_window(broker_factory):
    """With the broker's pid, a workload whose consumers read after the producers are done gets the broker's
    CPU seconds per GB for each window; the producer's queuing thread and whole process are timed over its
    own. A tailing (concurrent) workload has one window for both, so no per-window broker figure."""
    import multiprocessing

    from benchmarks._throughput.workers import Workload
    from benchmarks._throughput.workloads import run_workload

    broker = broker_factory()
    ctx = multiprocessing.get_context("forkserver")
    # 50 MB produced, read twice: tens of milliseconds of broker CPU in each window, several clock ticks.
    work = Workload("targets", 1000, 50_000, read_passes=2, label="cpu", topic="bench-cpu-windows")
    figures = run_workload(ctx, broker.bootstrap, work, broker_pid=broker.pid)
    # Receiving, checking and appending 50 MB, then serving 100 MB, costs the broker something, and far less
    # than a minute per GB.
    assert 0 < figures["broker_produce_cpu_s_per_gb"] < 60, figures
    assert 0 < figures["broker_consume_cpu_s_per_gb"] < 60, figures
    # One queuing thread is at most one core; its process, with librdkafka's threads, at most this machine.
    assert 0 < figures["producer_thread_busy"] <= 1.05, figures
    assert figures["producer_thread_busy"] - 0.05 <= figures["producer_cores"] <= os.cpu_count() + 0.05, figures

    tailing = run_workload(ctx, broker.bootstrap, Workload("matrix", 1000, 5_000, concurrent=True, label="tail",
                                                           topic="bench-cpu-tailing"), broker_pid=broker.pid)
    assert "broker_produce_cpu_s_per_gb" not in tailing and "broker_consume_cpu_s_per_gb" not in tailing
    assert 0 < tailing["producer_thread_busy"] <= 1.05, tailing


def test_disk_reads_are_counted(tmp_path):
    """``_disk_read_kib`` (the consume rows' disk column) counts a real read from disk: a file dropped from
    the page cache and read back adds at least its size."""
    from benchmarks._throughput.workloads import _disk_read_kib

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
    code = "from benchmarks._throughput.workers import _tune_consumer_malloc as t; print(t())"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=python_env(),
                               timeout=60)
    assert completed.stdout.strip() == "True", completed.stderr


class _TricklingLink:
    """A TCP relay to a broker that passes what the broker sends at most 64 KiB per 10 ms (about 6 MB/s),
    and what the client sends unhindered: a broker behind it looks like one too slow to keep a consumer fed."""

    CHUNK = 64 * 1024
    PAUSE_S = 0.01

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target: tuple[str, int] | None = None
        self.sockets: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, 0.0), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self.PAUSE_S), daemon=True).start()

    def _pump(self, source, sink, pause_s: float) -> None:
        try:
            while data := source.recv(self.CHUNK):
                sink.sendall(data)
                time.sleep(pause_s)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        for s in [self.listener, *self.sockets]:
            try:
                s.close()
            except OSError:
                pass


@pytest.mark.slow
def test_a_consumer_starved_by_its_link_shows_it_waited(broker_factory):
    """``consumer_waited_share`` is the client waiting for records. Read through a link that trickles the
    broker's responses out (the broker advertises the link, so every connection goes through it), the
    consumer spends most of its window waiting; read straight from a broker, less."""
    import multiprocessing

    from benchmarks._throughput.workers import Workload
    from benchmarks._throughput.workloads import run_workload

    link = _TricklingLink()
    try:
        starved = broker_factory(extra_args=("--advertise", f"127.0.0.1:{link.port}"))
        host, port = starved.bootstrap.rsplit(":", 1)
        link.target = (host, int(port))
        direct = broker_factory()
        ctx = multiprocessing.get_context("forkserver")
        # 20 MB: several 4 MiB fetches per pass, each taking the link ~0.7 s to pass on while the client
        # drains it in a few hundredths of one.
        work = Workload("targets", 100, 200_000, read_passes=2, label="waited", topic="bench-waited")
        behind_link = run_workload(ctx, f"127.0.0.1:{link.port}", work)
        straight = run_workload(ctx, direct.bootstrap, work)
    finally:
        link.close()
    assert behind_link["consume_passes"] == straight["consume_passes"] == 2
    assert 0.5 < behind_link["consumer_waited_share"] <= 1.0, behind_link
    assert 0.0 <= straight["consumer_waited_share"] < behind_link["consumer_waited_share"], straight


def test_a_consumer_waits_only_when_a_call_comes_back_short_mid_pass():
    """``_Reading.count_wait``: only a short call after the first records, outside a restart gap and before
    the pass's last records counts as waiting for the broker."""
    import queue

    from benchmarks._throughput.workers import WorkerResult, Workload, _Reading

    result = WorkerResult(role="consumer", partitions=[0])
    ends = queue.Queue()
    ends.put({0: 100})
    reading = _Reading([0], ends, Workload("targets", 100, 100, read_passes=2), result)
    assert not reading.pass_ended()  # takes the end offsets: 100 records per pass
    reading.count_wait(10, 3, 0.5)
    assert result.waited_s == 0.0  # before the first records: outside the window
    result.first_at = 1.0
    reading.count_wait(10, 10, 0.5)
    assert result.waited_s == 0.0  # a full call did not wait
    reading.count_wait(10, 3, 0.25)
    assert result.waited_s == 0.25  # short, mid-pass: waited
    reading.next[0] = 100
    reading.count_wait(10, 3, 0.5)
    assert result.waited_s == 0.25  # the call that brought the pass's last records
    assert reading.pass_ended()
    reading.restarted()
    reading.count_wait(10, 0, 0.5)
    assert result.waited_s == 0.25  # inside the seek-back gap
    reading.received()
    reading.count_wait(10, 0, 0.125)
    assert result.waited_s == 0.375


def _targets_rows(broker: str, produce: list[float], consume: list[float]) -> list[dict]:
    return [{"section": "targets", "broker": broker, "client": "confluent-kafka", "record_bytes": 100,
             "round": number, "produce_mb_per_s": p, "consume_mb_per_s": c}
            for number, (p, c) in enumerate(zip(produce, consume, strict=True), start=1)]


def test_the_targets_line_says_whether_a_run_could_tell_the_brokers_apart():
    """Per-round ratios decide the verdict, not the ratio of the medians: copyless 20% ahead in every round is
    ``above``; rounds that fall either side of 1.0 are ``level`` even where the medians' ratio is above 1."""
    from benchmarks._throughput.report import _target_entry

    kafka = [100.0 + 10 * (n % 3) for n in range(15)]
    ahead = _targets_rows("copyless", [1.2 * k for k in kafka], [0.8 * k for k in kafka])
    entry = _target_entry(ahead + _targets_rows("kafka", kafka, kafka), "copyless", "confluent-kafka", 100)
    assert entry["produce_verdict"] == "above (96%)" and entry["produce_interval"] == [1.2, 1.2]
    assert entry["consume_verdict"] == "below (96%)" and entry["consume_paired"] == pytest.approx(0.8)

    # Alternating rounds 0.9x and 1.15x: the medians' ratio says 1.0-and-more, the paired interval cannot tell.
    mixed = [k * (0.9 if n % 2 else 1.15) for n, k in enumerate(kafka)]
    entry = _target_entry(_targets_rows("copyless", mixed, mixed) + _targets_rows("kafka", kafka, kafka),
                          "copyless", "confluent-kafka", 100)
    assert entry["produce_verdict"] == "level (96%)" and entry["produce_interval"] == [0.9, 1.15]
    assert entry["produce_ratio"] > 1.0 and entry["target_met"]

    # One round (the suite's tiny runs) gives no interval rather than a made-up one.
    one = _target_entry(_targets_rows("copyless", [90.0], [90.0]) + _targets_rows("kafka", [100.0], [100.0]),
                        "copyless", "confluent-kafka", 100)
    assert one["produce_interval"] is None and one["produce_verdict"] is None
    assert one["produce_paired"] == pytest.approx(0.9)


def _fetch_rows(broker: str, mb_s: list[float], cpu: float, client: str = "raw-fetch") -> list[dict]:
    rounds = range(1, len(mb_s) + 1) if len(mb_s) > 1 else [None]
    return [{"section": "sendfile", "broker": broker, "client": client, "record_bytes": 1000, "round": number,
             "consume_mb_per_s": m, "broker_cpu_s_per_gb": cpu} for number, m in zip(rounds, mb_s, strict=True)]


def test_the_fetch_path_line_judges_sendfile_against_its_target_round_by_round():
    """Sendfile 1.6-2.0x the copy path in every round is ``above`` the 1.5x target; rounds either side of 1.5
    are ``level`` although the medians' ratio passes; confluent-kafka's single runs give no interval."""
    from benchmarks._throughput.report import _fetch_entry

    copy = [3000.0, 3400.0, 2800.0, 3200.0, 3100.0]
    faster = [c * f for c, f in zip(copy, (1.6, 2.0, 1.7, 1.8, 1.9), strict=True)]
    rows = _fetch_rows("copyless", faster, 0.15) + _fetch_rows("copyless --no-sendfile", copy, 0.30)
    line = _fetch_entry(rows + _fetch_rows("kafka", [4000.0], 0.25), "raw-fetch", 1000)
    assert line["rounds"] == 5 and line["ratio_by_round"] == [1.6, 2.0, 1.7, 1.8, 1.9]
    assert line["paired"] == pytest.approx(1.8) and line["interval"] == [1.6, 2.0]
    assert line["verdict"] == "above (94%)" and line["target_1_5x_met"]
    assert line["cpu_ratio"] == pytest.approx(2.0) and line["kafka_mb_s"] == 4000.0

    # 1.3x and 1.9x alternating: the medians' ratio clears 1.5, the per-round interval cannot tell.
    mixed = [c * (1.3 if n % 2 else 1.9) for n, c in enumerate(copy)]
    line = _fetch_entry(_fetch_rows("copyless", mixed, 0.15) + _fetch_rows("copyless --no-sendfile", copy, 0.3),
                        "raw-fetch", 1000)
    assert line["verdict"] == "level (94%)" and line["interval"] == [1.3, 1.9]
    assert line["ratio"] > 1.5 and line["target_1_5x_met"]

    single = _fetch_entry(_fetch_rows("copyless", [1500.0], 0.3, "confluent-kafka")
                          + _fetch_rows("copyless --no-sendfile", [1400.0], 0.4, "confluent-kafka"),
                          "confluent-kafka", 1000)
    assert single["interval"] is None and single["verdict"] is None and single["target_1_5x_met"] is None
    assert single["ratio"] == pytest.approx(1500 / 1400)
    assert _fetch_entry(rows, "raw-fetch", 100) is None
