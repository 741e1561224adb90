"""Disk full, for real: a 4 MiB tmpfs (as root) or, where mounting is impossible, RLIMIT_FSIZE.

Invariant: when the filesystem fills, appends fail with StorageError carrying the errno, path and numbers;
nothing acknowledged is lost; reads keep working; the process never dies of SIGBUS (segments are
preallocated, never sparse); after space is freed, appends work again.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tmpfs import mounted_tmpfs, take_every_free_byte

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def run_scenario(data_dir: Path, *extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    completed = subprocess.run([sys.executable, str(HERE / "storage_disk_full_scenario.py"), str(data_dir), *extra],
                               capture_output=True, text=True, timeout=240, env=env)
    assert completed.returncode == 0, (
        f"scenario died with status {completed.returncode} (-7 = SIGBUS)\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.fixture
def small_filesystem(tmp_path):
    with mounted_tmpfs(tmp_path / "tmpfs", size_mib=4) as mount_point:
        yield mount_point


def check_report(report: dict, expected_errnos: tuple[int, ...], *, freed_by_retention: bool) -> None:
    assert report["appended"] > 0
    assert report["error"] is not None, "the filesystem never filled up"
    assert report["error"]["errno"] in expected_errnos and report["error"]["disk_full"]
    # Needed: a whole 512 KiB segment (a roll) or the allocation step of the active one (stepped allocation).
    assert report["error"]["path"] and 0 < report["error"]["numbers"].get("bytes_needed", 0) <= 512 << 10
    assert report["log_end_offset_after_error"] == report["appended"]
    # Once background work is done, what a seal's trims handed back (at most a 512 KiB segment's worth of
    # 4 KiB records) goes in, then appends are refused again.
    assert report["second_append"].startswith("StorageError")
    assert 0 <= report["appended_after_background"] < 128
    assert report["read_back_ok"] and report["restart_read_back_ok"] and report["restart_clean"]
    # Space back (old segments retired on the tmpfs; the limit lifted otherwise): appends work again.
    assert (report["segments_deleted"] > 0) == freed_by_retention
    assert report["append_after_retention"] == report["appended"] + report["appended_after_background"]


def test_disk_full_on_a_real_small_filesystem(small_filesystem):
    # Where no tmpfs can be mounted this skips, saying why; test_disk_full_with_rlimit_fsize covers the limit.
    report = run_scenario(small_filesystem / "data")
    check_report(report, (errno.ENOSPC, errno.EDQUOT), freed_by_retention=True)
    assert report["error"]["numbers"]["bytes_free"] < 512 << 10


def test_disk_full_with_rlimit_fsize(tmp_path):
    # RLIMIT_FSIZE caps each file: preallocating the next segment beyond it fails with EFBIG, and so does
    # re-preallocating the active segment at restart (the log then opens read-only). Works without root.
    report = run_scenario(tmp_path / "data", "--rlimit-bytes", str(256 << 10))
    check_report(report, (errno.EFBIG,), freed_by_retention=False)


def test_killed_on_a_full_filesystem_restarts_degraded_and_resumes(small_filesystem):
    """kill -9 with the disk full, restart on the still-full disk: start-up needs no new space (recovery
    rebuilds the indexes even when they cannot be preallocated), every acknowledged record reads back,
    appends fail with a disk-full StorageError, and resume by themselves once space is freed."""
    mount_point = small_filesystem
    data_dir = mount_point / "data"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    script = str(HERE / "storage_restart_full_scenario.py")
    filled = subprocess.run([sys.executable, script, "fill", str(data_dir)], capture_output=True, text=True,
                            timeout=240, env=env)
    assert filled.returncode == -9, filled.stderr[-3000:]
    fill_report = json.loads(filled.stdout.strip().splitlines()[-1])
    assert fill_report["disk_full"] and fill_report["appended"] > 0 and fill_report["segments"] > 1
    restarted = subprocess.run([sys.executable, script, "restart", str(data_dir)], capture_output=True, text=True,
                               timeout=240, env=env)
    assert restarted.returncode == 0, f"restart died with {restarted.returncode}\n{restarted.stderr[-3000:]}"
    report = json.loads(restarted.stdout.strip().splitlines()[-1])
    appended = fill_report["appended"]
    assert not report["clean"] and report["free_before_restart"] == 0
    assert report["log_end_offset"] == appended and report["read_back_ok"]
    assert report["timestamp_lookup"] == [appended - 1, 1_000 + appended - 1]
    refused = report["appends_on_full_disk"]
    assert len(refused) == 3 and all(error["disk_full"] for error in refused), report
    # At most what one preallocated 512 KiB segment holds (4 KiB records) went in before the refusals.
    assert report["accepted_on_full_disk"] < 128, report
    assert report["append_after_free"] == appended + report["accepted_on_full_disk"], report
    assert report["after_second_restart_ok"]


def test_index_rebuild_on_a_full_filesystem_needs_no_new_space(small_filesystem):
    """Recovery rebuilds indexes; on a full disk their preallocation fails, so the entries are kept in memory
    and written out at seal: into the space the old index gave back, or, when not even that is left, the
    index stays empty (valid: lookups scan the segment from position 0, the next recovery rebuilds it)."""
    from copyless.broker.storage.index import OffsetIndex

    mount_point = small_filesystem
    path = mount_point / "00000000000000000000.index"
    index = OffsetIndex.create(path, 4096)
    take_every_free_byte(mount_point / "filler")
    index.reset(64 << 10)  # gives back 4 KiB, needs 64 KiB: ENOSPC
    assert index.in_memory and index.writable and os.path.getsize(path) == 0
    for number in range(100):
        index.maybe_append(number, number * 100)
    assert index.floor_position(50) == (50, 5_000)
    index.seal_readers()  # 800 bytes fit in the 4 KiB the old index gave back
    assert not index.in_memory and os.path.getsize(path) == 800 and index.entries == 100
    assert index.floor_position(50) == (50, 5_000)
    index.close()

    os.unlink(mount_point / "filler")
    second = OffsetIndex.create(mount_point / "00000000000000000100.index", 4096)
    take_every_free_byte(mount_point / "filler")
    second.reset(64 << 10)
    take_every_free_byte(mount_point / "filler")  # now not a byte left, not even the freed 4 KiB
    for number in range(100):
        second.maybe_append(number, number * 100)
    second.seal_readers()
    assert not second.in_memory and second.entries == 0 and os.path.getsize(second.path) == 0
    assert second.floor_position(50) == (0, 0)  # an empty index: scan from the segment's start
    second.close()
