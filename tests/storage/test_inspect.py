"""``copyless inspect`` on logs a real broker wrote: a clean data dir checks out (exit 0) and its segments
print every batch and index entry; a flipped byte in a record, a wrong index entry and a missing segment
each give exit status 1 and a line naming the file, the position and what is wrong.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys

import pytest

from tests.support.clients import ConfluentDriver, Rec, now_ms
from tests.support.subprocesses import python_env
from tests.support.topics import unique_topic

RECORDS_PER_ROUND, ROUNDS = 10, 12


def inspect(*args) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "copyless", "inspect", *map(str, args)], capture_output=True,
                          text=True, timeout=120, env=python_env())
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A data dir a broker wrote and shut down cleanly: one topic with 16 KiB segments and an index entry
    every 512 bytes, 12 produce rounds of ten 500-byte records (one batch per round)."""
    from tests.support.broker_process import TEST_BROKER_CONFIG, BrokerProcess

    base = tmp_path_factory.mktemp("inspect")
    proc = BrokerProcess(data_dir=base / "data", log_path=base / "broker.log", config=dict(TEST_BROKER_CONFIG))
    proc.start()
    topic = unique_topic("dump")
    try:
        driver = ConfluentDriver()
        driver.create_topic(proc.bootstrap, topic, 1, {"segment.bytes": "16384", "index.interval.bytes": "512"})
        for round_ in range(ROUNDS):
            records = [Rec(f"k{round_}-{i}".encode(), bytes([65 + round_]) * 500, now_ms())
                       for i in range(RECORDS_PER_ROUND)]
            driver.produce(proc.bootstrap, topic, records, acks="all", codec="none")
    finally:
        assert proc.stop() == 0
    return base / "data", topic


def copy_of(written, tmp_path):
    data, topic = written
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    segments = sorted((copy / f"{topic}-0").glob("0*.log"))
    return copy, topic, segments


def test_a_clean_data_dir_checks_out(written):
    data, topic = written
    code, output = inspect("--data-dir", data)
    assert code == 0, output
    assert f"{topic}-0: " in output and f"{ROUNDS} batch(es), offsets 0..{ROUNDS * RECORDS_PER_ROUND}: ok" in output
    assert "0 error(s)" in output


def test_a_segment_prints_its_batches_and_indexes(written):
    data, topic = written
    segments = sorted((data / f"{topic}-0").glob("0*.log"))
    assert len(segments) >= 2, segments  # 12 batches of ~5 KB in 16 KiB segments
    code, output = inspect("--indexes", *segments)
    assert code == 0, output
    batches = [line for line in output.splitlines() if line.startswith("baseOffset: ")]
    assert len(batches) == ROUNDS
    assert batches[0].startswith(f"baseOffset: 0 lastOffset: {RECORDS_PER_ROUND - 1} count: {RECORDS_PER_ROUND} ")
    assert all("isvalid: true" in line and "compresscodec: none" in line for line in batches)
    assert "producerId: " in batches[0] and "CreateTime: " in batches[0]
    entries = [line for line in output.splitlines() if line.startswith("offset: ")]
    assert entries, output  # one per 512 bytes of log: every batch after a segment's first


def test_a_flipped_byte_is_a_crc_error(written, tmp_path):
    copy, topic, segments = copy_of(written, tmp_path)
    with open(segments[0], "r+b") as handle:
        handle.seek(61 + 3000)  # inside the first batch's records
        byte = handle.read(1)
        handle.seek(61 + 3000)
        handle.write(bytes([byte[0] ^ 0xFF]))
    code, output = inspect("--data-dir", copy)
    assert code == 1, output
    assert f"ERROR {segments[0]}: batch at position 0 (offsets 0..{RECORDS_PER_ROUND - 1}): bad crc" in output
    code, output = inspect(segments[0])
    assert code == 1 and "isvalid: false" in output


def test_a_wrong_index_entry_is_reported(written, tmp_path):
    copy, topic, segments = copy_of(written, tmp_path)
    index = segments[0].with_suffix(".index")
    assert index.stat().st_size >= 8
    with open(index, "r+b") as handle:
        relative, position = struct.unpack(">II", handle.read(8))
        handle.seek(0)
        handle.write(struct.pack(">II", relative, position + 1))
    code, output = inspect("--indexes", segments[0])
    assert code == 1, output
    assert f"position {position + 1} (offset {relative}) is not a batch start" in output


def test_a_missing_segment_breaks_the_chain(written, tmp_path):
    copy, topic, segments = copy_of(written, tmp_path)
    assert len(segments) >= 3, segments
    for suffix in (".log", ".index", ".timeindex"):
        segments[1].with_suffix(suffix).unlink()
    code, output = inspect("--data-dir", copy)
    assert code == 1, output
    assert f"ERROR {segments[2]}: starts at offset {int(segments[2].stem)}, but the previous segment ends " \
           f"before offset {int(segments[1].stem)}" in output


def test_garbage_after_the_last_batch_is_reported(written, tmp_path):
    copy, topic, segments = copy_of(written, tmp_path)
    last = segments[-1]
    size = last.stat().st_size
    with open(last, "ab") as handle:
        handle.write(b"\x00" * 100 + b"junk")
    code, output = inspect(last)
    assert code == 1, output
    assert f"bytes at position {size + 100} after the last whole batch (which ends at {size}) are not a batch" in output


def test_a_running_brokers_data_dir_checks_out_with_a_warning(broker_factory):
    proc = broker_factory()
    topic = unique_topic("live")
    driver = ConfluentDriver()
    driver.create_topic(proc.bootstrap, topic, 2)
    for partition in (0, 1):
        driver.produce(proc.bootstrap, topic, [Rec(b"k", b"v" * 200, now_ms())] * 5, acks="all", codec="none",
                       partition=partition)
    # Active segments preallocated (zero tails), indexes not yet trimmed: still no error.
    code, output = inspect("--data-dir", proc.data_dir)
    assert code == 0, output
    assert f"WARNING {proc.data_dir}: a broker is running on this data dir" in output
    assert f"{topic}-1: 1 segment(s), 1 batch(es), offsets 0..5: ok" in output


# Run in a child that reports what it read: /proc/self/io's rchar counts every byte read(2)/pread(2) returned.
_INSPECT_COUNTING_READS = """
import contextlib, io, sys
from copyless.broker.inspect_log import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(sys.argv[1:])
sys.stdout.write(out.getvalue())
rchar = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())["rchar"]
print(f"rchar {rchar}")
sys.exit(code)
"""


def test_a_data_dir_of_idle_partitions_is_read_only_to_each_last_batch(broker_factory):
    """Segments are 1 GiB files from their first batch (preallocated, mostly holes) and indexes 10 MiB: a
    check reads each one to its last batch or entry (and a short probe past it), not the zero tail. 21
    partitions with one batch each, after a kill -9 (nothing trimmed): 21 GiB of logical size, a few MB read."""
    proc = broker_factory(config={"log.segment.bytes": 1 << 30})
    topic = unique_topic("idle")
    driver = ConfluentDriver()
    driver.create_topic(proc.bootstrap, topic, 21)
    for partition in range(21):
        driver.produce(proc.bootstrap, topic, [Rec(b"k", b"v" * 100, now_ms())], acks="all", codec="none",
                       partition=partition)
    proc.kill()
    logs = sorted(proc.data_dir.glob(f"{topic}-*/0*.log"))
    assert len(logs) == 21 and all(log.stat().st_size == 1 << 30 for log in logs)
    done = subprocess.run([sys.executable, "-c", _INSPECT_COUNTING_READS, "--data-dir", str(proc.data_dir)],
                          capture_output=True, text=True, timeout=120, env=python_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(f"{topic}-{p}: 1 segment(s), 1 batch(es), offsets 0..1: ok" in done.stdout for p in range(21))
    read = int(done.stdout.rsplit("rchar ", 1)[1])
    # The interpreter's own imports are most of it; one segment's tail alone would be 1 GiB.
    assert read < 32 << 20, f"read {read} bytes"
