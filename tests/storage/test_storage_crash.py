"""kill -9 at random moments and at every named failpoint of roll, seal, checkpoint and retention.

An appender subprocess writes records whose values are a function of their offsets and prints each
acknowledged offset. After each kill the log is reopened (recovery runs) and must keep its invariants:
every acknowledged record is there (kill -9 keeps the page cache, so nothing acknowledged may be lost),
every record has its expected value and a valid CRC, offsets are contiguous from the log start (a segment
base), no leftover of an interrupted operation remains, the checkpoint is never torn, and appends continue.
One test garbles the base offset of an unflushed batch after the kill: the log is cut there.
The seed is printed; COPYLESS_CRASH_SEED=<seed> replays a run.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from copyless.broker.storage import LogManager
from copyless.broker.storage._failpoints import POINTS
from copyless.broker.storage.checkpoint import read_checkpoint
from copyless.protocol.records import iter_batches, validate_batch
from tests.storage.storage_crash_appender import CONFIG, expected_value
from tests.support.batches import records_of

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SEED = int(os.environ.get("COPYLESS_CRASH_SEED", random.randrange(1 << 30)))


def run_appender(data_dir: Path, seed: int, *, failpoint: str | None = None, skip: int = 0,
                 kill_after_s: float | None = None, max_appends: int = 400,
                 zeros_racing: bool = False, outrun_pwrite: bool = True) -> tuple[int, int, int]:
    """Run the appender; return (exit status, last acknowledged offset or -1, last flushed offset or 0).
    ``outrun_pwrite``: appends past the pre-faulted pages write with pwrite (the default) or fault the pages
    in through the map (LogConfig.outrun_pwrite, set by the appender from COPYLESS_OUTRUN_PWRITE)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               COPYLESS_OUTRUN_PWRITE="1" if outrun_pwrite else "0")
    env.pop("COPYLESS_FAILPOINT", None)
    if failpoint is not None:
        env["COPYLESS_FAILPOINT"] = failpoint
        env["COPYLESS_FAILPOINT_SKIP"] = str(skip)
    arguments = [str(data_dir), str(seed), str(max_appends)] + (["zeros-racing"] if zeros_racing else [])
    process = subprocess.Popen([sys.executable, str(HERE / "storage_crash_appender.py"), *arguments],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    if kill_after_s is not None:
        # Wait until it is appending, then kill at a random moment.
        first = process.stdout.readline()
        assert first.startswith("START"), first + process.stderr.read()
        time.sleep(kill_after_s)
        process.send_signal(signal.SIGKILL)
    stdout, stderr = process.communicate(timeout=120)
    acked, flushed = -1, 0
    for line in stdout.splitlines():
        if line.startswith("ACK "):
            acked = int(line.split()[1])
        elif line.startswith("FLUSHED "):
            flushed = int(line.split()[1])
    assert "Traceback" not in stderr, stderr
    return process.returncode, acked, flushed


def check_log(data_dir: Path, acked: int, flushed: int) -> tuple[int, int]:
    """Reopen and check every invariant; return (log_start_offset, log_end_offset)."""
    checkpoint = data_dir / "recovery-point-offset-checkpoint"
    if checkpoint.exists():
        assert read_checkpoint(checkpoint), "a checkpoint file must never be torn"
    manager = LogManager(data_dir, default_config=CONFIG, background_interval_ms=None)
    manager.startup()
    try:
        partition_log = manager.get_log("crash", 0)
        assert partition_log is not None
        start, end = partition_log.log_start_offset, partition_log.log_end_offset
        assert end >= acked + 1, f"acknowledged offset {acked} lost: log end is {end}"
        assert end >= flushed
        assert start == partition_log.segment_base_offsets()[0]
        leftovers = [name for name in os.listdir(partition_log.directory)
                     if name.startswith("prepared") or name.endswith((".deleted", ".tmp"))]
        assert not leftovers, leftovers
        offset = start
        while offset < end:
            result = partition_log.read(offset, 1 << 20)
            with result.slice as region:
                data = region.read_bytes()
            for position, _ in iter_batches(data):
                validate_batch(data, position)
            records = records_of(data)
            assert records and records[0].offset <= offset
            for record in records:
                if record.offset >= offset:
                    assert record.offset == offset, f"gap at {offset}"
                    assert record.value == expected_value(offset), f"wrong value at {offset}"
                    offset += 1
        for index_suffix in (".index", ".timeindex"):
            for base in partition_log.segment_base_offsets():
                assert (partition_log.directory / f"{base:020d}{index_suffix}").exists()
        return start, end
    finally:
        manager.shutdown()


@pytest.mark.parametrize("failpoint", POINTS)
def test_kill_at_failpoint(tmp_path, failpoint):
    seed = SEED + POINTS.index(failpoint)
    print(f"crash test seed={SEED} failpoint={failpoint}")
    data_dir = tmp_path / "data"
    skip = random.Random(seed).randint(0, 2)
    status, acked, flushed = run_appender(data_dir, seed, failpoint=failpoint, skip=skip)
    assert status == -signal.SIGKILL, f"failpoint {failpoint} (skip {skip}) was never reached (status {status})"
    check_log(data_dir, acked, flushed)
    # The log keeps working after recovery, and survives a second crash at the same point.
    status, acked_again, flushed = run_appender(data_dir, seed + 1, failpoint=failpoint, skip=0)
    assert status == -signal.SIGKILL
    check_log(data_dir, max(acked, acked_again), flushed)


def test_kill_at_random_moments(tmp_path):
    print(f"crash test seed={SEED}")
    rng = random.Random(SEED)
    data_dir = tmp_path / "data"
    last_end = 0
    for round_number in range(4):
        status, acked, flushed = run_appender(data_dir, SEED + round_number, kill_after_s=rng.uniform(0.0, 0.4),
                                              max_appends=100_000)
        assert status == -signal.SIGKILL
        start, end = check_log(data_dir, acked, flushed)
        assert end >= last_end, "recovery lost data acknowledged in an earlier round"
        last_end = end


@pytest.mark.parametrize("outrun_pwrite", [False, True], ids=["copy", "pwrite"])
def test_kill_while_zeros_race_the_appends(tmp_path, outrun_pwrite):
    """The pre-fault's zeros claimed right behind the appends (margin 0): no acknowledged record may be wiped
    by zeros that landed after it was copied, whatever moment the kill hits; appends that outrun the
    pre-fault copy into the map or write with pwrite."""
    print(f"crash test seed={SEED}")
    rng = random.Random(SEED + 1000)
    data_dir = tmp_path / "data"
    last_end = 0
    for round_number in range(3):
        status, acked, flushed = run_appender(data_dir, SEED + round_number, kill_after_s=rng.uniform(0.0, 0.4),
                                              max_appends=100_000, zeros_racing=True, outrun_pwrite=outrun_pwrite)
        assert status == -signal.SIGKILL
        start, end = check_log(data_dir, acked, flushed)
        assert end >= last_end, "recovery lost data acknowledged in an earlier round"
        last_end = end


@pytest.mark.parametrize("outrun_pwrite", [False, True], ids=["copy", "pwrite"])
def test_kill_between_a_rolled_segments_first_copy_and_its_header_rewrites(tmp_path, outrun_pwrite):
    """A roll's segment keeps its prepared name until the io thread renames it, and its first append comes
    before that: killed once that append's bytes are in the file but before its headers are rewritten, with
    retention already past segment 0, start-up must not take the file for a segment at the client's base
    offset 0 (which cut every acknowledged segment as not following on from it)."""
    print(f"crash test seed={SEED}")
    rng = random.Random(SEED + 2000)
    # Segments of 24 KiB hold ~10 appends and retention keeps 96 KiB: by the sixth roll segment 0 is gone.
    for skip in sorted(rng.sample(range(6, 16), 2)):
        data_dir = tmp_path / f"data-{skip}"
        status, acked, flushed = run_appender(data_dir, SEED + skip, failpoint="append.first_copied", skip=skip,
                                              outrun_pwrite=outrun_pwrite)
        assert status == -signal.SIGKILL, f"roll {skip} was never reached (status {status})"
        start, end = check_log(data_dir, acked, flushed)
        assert start > 0, "retention never removed segment 0: the case under test did not arise"


def test_kill_then_a_garbled_base_offset_is_cut_not_trusted(tmp_path):
    # kill -9 mid-appends, then one byte inside the base offset (which the batch CRC does not cover) of an
    # unflushed batch that is not the log's last: recovery must cut the log at that batch, never let the log
    # end jump to the offset it now claims nor crash writing its index entry.
    print(f"crash test seed={SEED}")
    rng = random.Random(SEED)
    data_dir = tmp_path / "data"
    directory = data_dir / "crash-0"
    target = None
    for round_number in range(5):
        status, acked, flushed = run_appender(data_dir, SEED + round_number, kill_after_s=rng.uniform(0.1, 0.4),
                                              max_appends=100_000)
        assert status == -signal.SIGKILL
        batches = []  # (segment file, position, base offset) in log order
        for path in sorted(directory.glob("*.log")):
            data = path.read_bytes()
            batches.extend((path, position, header.base_offset) for position, header in iter_batches(data))
        candidates = [batch for batch in batches[:-1] if batch[2] >= flushed]
        if candidates:
            target = rng.choice(candidates)
            break
        check_log(data_dir, acked, flushed)
    assert target is not None, "no unflushed batch to garble in five rounds"
    path, position, base_offset = target
    with open(path, "r+b") as handle:
        handle.seek(position + 4)
        handle.write(b"\x3c")
    manager = LogManager(data_dir, default_config=CONFIG, background_interval_ms=None)
    manager.startup()
    try:
        partition_log = manager.get_log("crash", 0)
        assert partition_log.log_end_offset == base_offset
        offset = partition_log.log_start_offset
        while offset < base_offset:
            with partition_log.read(offset, 1 << 20).slice as region:
                records = [record for record in records_of(region.read_bytes()) if record.offset >= offset]
            for record in records:
                assert (record.offset, record.value) == (offset, expected_value(offset))
                offset += 1
    finally:
        manager.shutdown()
    check_log(data_dir, base_offset - 1, flushed)
