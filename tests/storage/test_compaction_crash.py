"""kill -9 at every step of a cleaning's swap (cleaner.py's failpoints, in protocol order).

A subprocess builds a compacted log of many segments and cleans it once; a failpoint SIGKILLs it at one
step (at the first hit, and at later hits of the steps taken once per segment or group). The reopened log
must hold exactly the old segments' records or exactly the cleaned ones (what an uninterrupted run of the
same scenario leaves: the records and the clock are fixed), never a mix and never a gap; every record must
be the one written at its offset; no file of the interrupted cleaning may remain; and the log must take
appends and clean again.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from copyless.broker.storage import LogManager
from copyless.broker.storage._failpoints import COMPACTION_POINTS
from copyless.broker.storage.cleaner import clean_log
from copyless.protocol.records import decode_records, iter_batches, validate_batch
from tests.storage.storage_compaction_scenario import BATCHES, CONFIG, batch_for
from tests.support.blocking_appends import append_blocking

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def run(data_dir: Path, failpoint: str | None, skip: int = 0) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("COPYLESS_FAILPOINT", None)
    if failpoint is not None:
        env["COPYLESS_FAILPOINT"] = failpoint
        env["COPYLESS_FAILPOINT_SKIP"] = str(skip)
    completed = subprocess.run([sys.executable, str(HERE / "storage_compaction_scenario.py"), str(data_dir)],
                               capture_output=True, text=True, timeout=120, env=env)
    assert "Traceback" not in completed.stderr, completed.stderr
    return completed.returncode, completed.stdout


def original_records() -> dict[int, tuple]:
    out, offset = {}, 0
    for number in range(BATCHES):
        data = batch_for(number)
        for record in decode_records(data, 0):
            out[offset] = (record.key, record.value)
            offset += 1
    return out


def stored(data_dir: Path) -> tuple[dict[int, tuple], int, list[str]]:
    """The records the reopened log serves, its log end and any leftover files."""
    manager = LogManager(data_dir, default_config=CONFIG, background_interval_ms=None)
    manager.startup()
    try:
        partition_log = manager.get_log("table", 0)
        manager.wait_for_background()
        leftovers = [name for name in os.listdir(partition_log.directory)
                     if name.endswith((".deleted", ".tmp", ".cleaned", ".swap")) or name.startswith("prepared")]
        records = {}
        offset = partition_log.log_start_offset
        while offset < partition_log.log_end_offset:
            result = partition_log.read(offset, 1 << 20)
            if result.slice is None:
                break
            with result.slice as region:
                data = region.read_bytes()
            for position, header in iter_batches(data):
                validate_batch(data, position, cleaned=True)
                for record in decode_records(data, position):
                    records[record.offset] = (record.key, record.value)
                offset = header.next_offset
        return records, partition_log.log_end_offset, leftovers
    finally:
        manager.shutdown()


@pytest.fixture(scope="module")
def cleaned_reference(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("reference")
    code, output = run(data_dir, None)
    assert code == 0 and "DONE" in output, output
    segments_before, segments_after = map(int, output.split("DONE")[1].split())
    assert segments_after >= 2, "the scenario must swap more than one group"
    records, log_end, leftovers = stored(data_dir)
    assert not leftovers
    original = original_records()
    assert log_end == len(original) and len(records) < len(original) / 2
    return records


CASES = [(point, 0) for point in COMPACTION_POINTS] + [("clean.after_old_renamed", 3),
                                                       ("clean.after_cleaned_renamed", 1)]


@pytest.mark.parametrize("point,skip", CASES, ids=[f"{point}-{skip}" for point, skip in CASES])
def test_a_kill_at_any_step_leaves_the_old_log_or_the_cleaned_one(manager_factory, tmp_path, point, skip,
                                                                 cleaned_reference):
    code, output = run(tmp_path, point, skip)
    assert code == -9, f"the failpoint {point} (skip {skip}) was never reached: {output}"
    assert "PLAN" in output and "DONE" not in output
    original = original_records()
    records, log_end, leftovers = stored(tmp_path)
    assert not leftovers, leftovers
    assert log_end == len(original)
    for offset, record in records.items():
        assert original[offset] == record, f"offset {offset} holds a record never written there"
    if point in ("clean.after_cleaned_written",):
        assert records == original, "an uncommitted cleaning must leave the old segments"
    elif point in ("clean.after_swap_manifest", "clean.after_old_renamed", "clean.after_cleaned_renamed",
                   "clean.before_manifest_removed", "clean.after_checkpoint"):
        assert records == cleaned_reference, "a committed swap must be finished at start-up"
    # The log goes on: appends, then another cleaning over what start-up left.
    manager = manager_factory(CONFIG, directory=tmp_path)
    partition_log = manager.get_log("table", 0)
    for number in range(BATCHES, BATCHES + 60):
        append_blocking(partition_log, batch_for(number))
    partition_log.set_high_watermark(partition_log.log_end_offset)
    manager.wait_for_background()
    assert clean_log(partition_log, force=True) is not None
