"""Full-disk tests: a private tmpfs (a real filesystem of a chosen size that really runs out: ENOSPC), and
the one helper that takes every byte left on a filesystem."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted_tmpfs(mount_point: Path, size_mib: int) -> Iterator[Path]:
    """Mount a ``size_mib`` MiB tmpfs at ``mount_point`` (created if missing) and unmount it afterwards.

    Mounting needs root with CAP_SYS_ADMIN: elsewhere the calling test is skipped, with the reason.
    """
    mount_point.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(mount_point)],
                            capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a {size_mib} MiB tmpfs: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)


def take_every_free_byte(path: Path) -> None:
    """Append to ``path`` until the filesystem refuses a single byte more (4 KiB writes, then 1-byte ones for
    the last partial block). Called again on the same file, it takes what was freed since."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for chunk in (b"f" * 4096, b"f"):
            try:
                while True:
                    os.write(fd, chunk)
            except OSError:
                pass
    finally:
        os.close(fd)
