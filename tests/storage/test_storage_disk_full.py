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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def run_scenario(data_dir: Path, *extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(REPO), os.environ.get("PYTHONPATH", "")]))
    completed = subprocess.run([sys.executable, str(HERE / "storage_disk_full_scenario.py"), str(data_dir), *extra],
                               capture_output=True, text=True, timeout=240, env=env)
    assert completed.returncode == 0, (
        f"scenario died with status {completed.returncode} (-7 = SIGBUS)\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.fixture
def small_filesystem(tmp_path):
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        yield None, f"mount failed: {result.stderr.strip() or result.returncode}"
        return
    try:
        yield mount_point, None
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def check_report(report: dict, expected_errnos: tuple[int, ...], *, freed_by_retention: bool) -> None:
    assert report["appended"] > 0
    assert report["error"] is not None, "the filesystem never filled up"
    assert report["error"]["errno"] in expected_errnos and report["error"]["disk_full"]
    assert report["error"]["path"] and report["error"]["numbers"].get("bytes_needed") == 512 << 10
    assert report["log_end_offset_after_error"] == report["appended"]
    assert report["second_append"].startswith("StorageError")
    assert report["read_back_ok"] and report["restart_read_back_ok"] and report["restart_clean"]
    # Space back (old segments retired on the tmpfs; the limit lifted otherwise): appends work again.
    assert (report["segments_deleted"] > 0) == freed_by_retention
    assert report["append_after_retention"] == report["appended"]


def test_disk_full_on_a_real_small_filesystem(small_filesystem):
    mount_point, reason = small_filesystem
    if mount_point is None:
        pytest.skip(f"cannot mount a tmpfs here ({reason}); test_disk_full_with_rlimit_fsize covers the limit")
    report = run_scenario(mount_point / "data")
    check_report(report, (errno.ENOSPC, errno.EDQUOT), freed_by_retention=True)
    assert report["error"]["numbers"]["bytes_free"] < 512 << 10


def test_disk_full_with_rlimit_fsize(tmp_path):
    # RLIMIT_FSIZE caps each file: preallocating the next segment beyond it fails with EFBIG, and so does
    # re-preallocating the active segment at restart (the log then opens read-only). Works without root.
    report = run_scenario(tmp_path / "data", "--rlimit-bytes", str(256 << 10))
    check_report(report, (errno.EFBIG,), freed_by_retention=False)
