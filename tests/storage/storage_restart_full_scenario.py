"""A log killed on a full filesystem must restart degraded, then resume appends once space is freed (run as
subprocesses, so a SIGBUS or a kill -9 shows as an exit status, not a dead test runner).

Usage: python storage_restart_full_scenario.py fill DATA_DIR    # fill until ENOSPC, print JSON, kill -9 self
       python storage_restart_full_scenario.py restart DATA_DIR # restart on the full disk, free space, append
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from copyless.broker.storage import LogConfig, LogManager, StorageError
from tests.support.batches import build_batch
from tests.support.blocking_appends import append_blocking
from tests.support.log_reads import read_records
from tests.support.tmpfs import take_every_free_byte

CONFIG = LogConfig(segment_bytes=512 << 10, segment_index_bytes=64 << 10, index_interval_bytes=4096,
                   retention_ms=None, file_delete_delay_ms=0)
BALLAST_BYTES = 1 << 20


def value_of(number: int) -> bytes:
    return f"{number:08d}".encode() * 512  # 4 KiB per record


def fill(data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    # Space that the restart frees later (an operator deleting something else on the disk).
    with open(data_dir.parent / "ballast", "wb") as ballast:
        ballast.write(b"b" * BALLAST_BYTES)
    manager = LogManager(data_dir, default_config=CONFIG, background_interval_ms=None)
    manager.startup()
    partition_log = manager.create_log("full", 0)
    appended = 0
    error = None
    for number in range(5000):
        try:
            append_blocking(partition_log, build_batch([value_of(number)], [1_000 + number]))
        except StorageError as exc:
            error = exc
            break
        appended += 1
    print(json.dumps({"appended": appended, "disk_full": error is not None and error.is_disk_full,
                      "segments": len(partition_log.segment_base_offsets())}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no flush, no checkpoint, no marker


def restart(data_dir: Path) -> None:
    report: dict = {}
    take_every_free_byte(data_dir.parent / "ballast-2")
    report["free_before_restart"] = os.statvfs(data_dir).f_bavail
    manager = LogManager(data_dir, default_config=CONFIG, background_interval_ms=None)
    manager.startup()  # must not raise on the full disk
    partition_log = manager.get_log("full", 0)
    report["clean"] = manager.startup_stats["clean"]
    report["log_end_offset"] = partition_log.log_end_offset
    report["read_back_ok"] = read_all(partition_log) == [value_of(n) for n in range(partition_log.log_end_offset)]
    found = partition_log.offset_for_timestamp(1_000 + partition_log.log_end_offset - 1)
    report["timestamp_lookup"] = None if found is None else list(found)
    # The reopened active segment may still have preallocated room (recovery gave back its zero tail):
    # appends fill it, then the disk is full again and every append is refused.
    # A refusal is not final: a seal's trim on the io thread may hand back a few KiB a moment later, so the
    # appends that went in are tracked one by one (each acknowledged, so each must read back).
    accepted = []
    errors = []
    for number in range(report["log_end_offset"], report["log_end_offset"] + 1000):
        try:
            append_blocking(partition_log, build_batch([value_of(number)], [1_000 + number]))
            accepted.append(value_of(number))
        except StorageError as exc:
            errors.append({"errno": exc.errno, "disk_full": exc.is_disk_full})
            if len(errors) == 3:
                break
    report["accepted_on_full_disk"] = len(accepted)
    report["appends_on_full_disk"] = errors
    os.unlink(data_dir.parent / "ballast")
    os.unlink(data_dir.parent / "ballast-2")
    # Appends resume by themselves: the retry runs in the background; a producer keeps retrying.
    deadline = time.monotonic() + 30
    attempts = 0
    report["append_after_free"] = None
    while time.monotonic() < deadline:
        attempts += 1
        try:
            result = append_blocking(partition_log, build_batch([b"after-free"], [2]))
            report["append_after_free"] = result.base_offset
            break
        except StorageError:
            time.sleep(0.01)
    report["attempts_after_free"] = attempts
    report["rolls_unprepared"] = partition_log.stats["rolls_unprepared"]
    manager.shutdown()
    manager = LogManager(data_dir, default_config=CONFIG, background_interval_ms=None)
    manager.startup()
    partition_log = manager.get_log("full", 0)
    values = read_all(partition_log)
    expected = [value_of(n) for n in range(report["log_end_offset"])] + accepted + [b"after-free"]
    report["after_second_restart_ok"] = values == expected
    manager.shutdown()
    print(json.dumps(report))


def read_all(partition_log) -> list[bytes]:
    return [record.value for record in read_records(partition_log)]


if __name__ == "__main__":
    {"fill": fill, "restart": restart}[sys.argv[1]](Path(sys.argv[2]))
