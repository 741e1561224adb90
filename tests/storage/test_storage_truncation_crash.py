"""kill -9 at every step of a truncation (truncation.py's failpoints, in protocol order).

A subprocess builds a log of several segments and leader epochs, then truncates it: to a point inside the
active segment, inside an older (sealed) one, or fully (restarting past its end). A failpoint SIGKILLs it at
one step. The reopened log must be a prefix of the original one at least as long as the truncation's result
(never garbage, never a hole), or, for a full truncation, that prefix or the empty log at the new start; its
leader epoch cache must agree with the batches it holds; nothing an interrupted step left may remain; and the
log must take appends and truncate again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from copyless.broker.storage import LogManager
from copyless.broker.storage._failpoints import TRUNCATION_POINTS
from copyless.protocol.records import iter_batches, validate_batch
from tests.storage.storage_truncation_scenario import BATCHES, CONFIG, FULL_TARGET, batch_for
from tests.support.batches import records_of
from tests.support.blocking_appends import append_blocking

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def original_batches() -> list[tuple[int, int, list]]:
    """(base offset, epoch, records' values) of the log the scenario builds."""
    out, offset = [], 0
    for number in range(BATCHES):
        data, epoch = batch_for(number)
        values = [record.value for record in records_of(data)]
        out.append((offset, epoch, values))
        offset += len(values)
    return out


def run(data_dir: Path, mode: str, failpoint: str | None, skip: int = 0) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("COPYLESS_FAILPOINT", None)
    if failpoint is not None:
        env["COPYLESS_FAILPOINT"] = failpoint
        env["COPYLESS_FAILPOINT_SKIP"] = str(skip)
    completed = subprocess.run([sys.executable, str(HERE / "storage_truncation_scenario.py"), str(data_dir), mode],
                               capture_output=True, text=True, timeout=120, env=env)
    assert "Traceback" not in completed.stderr, completed.stderr
    return completed.returncode, completed.stdout


def stored_batches(partition_log) -> list[tuple[int, int, list]]:
    out = []
    offset = partition_log.log_start_offset
    while offset < partition_log.log_end_offset:
        with partition_log.read(offset, 1 << 20).slice as region:
            data = region.read_bytes()
        for position, header in iter_batches(data):
            validate_batch(data, position)
            out.append((header.base_offset, header.partition_leader_epoch,
                        [r.value for r in records_of(data[position:position + header.size])]))
        offset = out[-1][0] + len(out[-1][2])
    return out


def check(data_dir: Path, mode: str, old_end: int, target: int) -> None:
    manager = LogManager(data_dir, default_config=CONFIG, background_interval_ms=None)
    manager.startup()
    try:
        partition_log = manager.get_log("cut", 0)
        start, end = partition_log.log_start_offset, partition_log.log_end_offset
        manager.wait_for_background()  # start-up's own removals (a full truncation it completes) are done
        leftovers = [name for name in os.listdir(partition_log.directory)
                     if name.endswith((".deleted", ".tmp")) or name.startswith("prepared")]
        assert not leftovers, leftovers
        stored = stored_batches(partition_log)
        original = original_batches()
        if mode == "fully" and start == FULL_TARGET:
            assert end == FULL_TARGET and stored == [], "an emptied log holds nothing"
        else:
            assert start == 0
            assert stored == original[:len(stored)], "the recovered log is not a prefix of the original"
            # The truncation's own result ends at the start of the batch holding the target.
            cut_end = max((base for base, _, _ in original if base <= target), default=0) if mode != "fully" else 0
            assert cut_end <= end <= old_end, (cut_end, end, old_end)
        cache = partition_log.leader_epochs
        for base_offset, epoch, _ in stored:
            assert cache.epoch_for(base_offset) == epoch, (base_offset, epoch, cache.entries())
        assert all(start <= entry_start < max(end, start + 1) for _, entry_start in cache.entries()), cache.entries()
        assert start <= partition_log.high_watermark <= end
        # The log keeps working: appends at its end, then a truncation back to where it was.
        data, _epoch = batch_for(7)
        append_blocking(partition_log, data, leader_epoch=99)
        partition_log.truncate_to(end)
        assert partition_log.log_end_offset == end and stored_batches(partition_log) == stored
        assert cache.entries() == [entry for entry in cache.entries() if entry.start_offset < end]
    finally:
        manager.shutdown()


CASES = [(mode, point, skip) for mode in ("to-active", "to-older", "fully") for point in TRUNCATION_POINTS
         for skip in ((0, 1) if point == "truncate.after_segment_rename" else (0,))
         if not (point.startswith("truncate_fully.") and mode != "fully")
         and not (point == "truncate.after_log_cut" and mode == "fully")
         and not (point == "truncate.after_segment_rename" and mode == "to-active")]


@pytest.mark.parametrize(("mode", "point", "skip"), CASES, ids=[f"{m}-{p}-{s}" for m, p, s in CASES])
def test_kill_at_each_step_of_a_truncation_recovers_a_prefix(tmp_path, mode, point, skip):
    status, stdout = run(tmp_path / "data", mode, point, skip)
    assert status == -signal.SIGKILL, f"{point} (skip {skip}) was never reached in mode {mode}: {stdout}"
    _, old_end, target = next(line for line in stdout.splitlines() if line.startswith("PLAN")).split()
    check(tmp_path / "data", mode, int(old_end), int(target))


@pytest.mark.parametrize("mode", ["to-active", "to-older", "fully"])
def test_an_uninterrupted_truncation_survives_the_restart(manager_factory, tmp_path, mode):
    status, stdout = run(tmp_path / "data", mode, None)
    assert status == 0, stdout
    lines = dict(line.split(" ", 1) for line in stdout.splitlines())
    old_end, target = map(int, lines["PLAN"].split())
    done = int(lines["DONE"])
    check(tmp_path / "data", mode, old_end, target)
    assert manager_factory(CONFIG).get_log("cut", 0).log_end_offset == done
