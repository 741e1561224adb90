"""A simulated power loss of one broker: its logs lose what was never flushed, and it comes back in another
boot of the machine.

``lose_unflushed(data_dir)`` cuts every log of a (stopped) broker's data dir back to its last flushed
offset, the recovery point checkpoint: the pages past it read as zeros, as never-written blocks of a
preallocated file do after a power loss. ``in_another_boot(broker, tmp_dir, base)`` makes the broker's
next start see a new ``/proc/sys/kernel/random/boot_id`` (bind-mounted in a mount namespace of its own,
``unshare --mount``), so its incarnation check (``broker.cluster.incarnation``) sees a reboot and does not
vouch for the page cache it lost. ``base`` is a command prefix to keep (``ip netns exec NS`` for a broker on
a host of a NetLab).
"""

from __future__ import annotations

import os
import shutil
import struct
import uuid
from pathlib import Path

import pytest

from copyless.broker.storage.checkpoint import read_checkpoint

__all__ = ["lose_unflushed", "in_another_boot", "UNSHARE"]

UNSHARE = shutil.which("unshare")


def lose_unflushed(data_dir: Path) -> int:
    """Every log of ``data_dir`` loses what lies past its last flushed offset (the recovery point
    checkpoint), its pages zeroed. Returns the number of bytes of whole batches lost (the zeroed tail of a
    preallocated segment was zeros already). The broker must be stopped."""
    recovery_points = read_checkpoint(data_dir / "recovery-point-offset-checkpoint")
    zeroed = 0
    for directory in sorted(p for p in data_dir.iterdir() if p.is_dir() and "-" in p.name):
        topic, _, index = directory.name.rpartition("-")
        if not index.isdigit():
            continue
        flushed = recovery_points.get((topic, int(index)), 0)
        for segment in sorted(directory.glob("*.log")):
            with open(segment, "r+b") as file:
                data = file.read()
                position = 0
                while position + 61 <= len(data):
                    base_offset, length = struct.unpack_from(">qi", data, position)
                    last_offset = base_offset + struct.unpack_from(">i", data, position + 23)[0]
                    if length <= 0 or last_offset >= flushed:
                        break
                    position += length + 12
                end = position
                while end + 61 <= len(data):
                    length = struct.unpack_from(">i", data, end + 8)[0]
                    if length <= 0:
                        break
                    end += length + 12
                # Past the last batch the file reads as zeros already (never written, or sparse): zeroing
                # only the batches keeps a sparse segment sparse on a small disk.
                end = min(end, len(data))
                file.seek(position)
                file.write(bytes(end - position))
                file.flush()
                os.fsync(file.fileno())
                zeroed += end - position
    return zeroed


def in_another_boot(broker, tmp_dir: Path, base: tuple[str, ...] = ()) -> None:
    """Run ``broker`` from its next start on as after a reboot: a new boot id, seen only by it."""
    if UNSHARE is None or os.geteuid() != 0:
        pytest.skip("a simulated reboot needs unshare(1) and root (a mount namespace)")
    boot_id = Path(tmp_dir) / f"boot_id-{uuid.uuid4().hex[:8]}"
    boot_id.write_text(f"{uuid.uuid4()}\n")
    broker.wrapper = (*base, UNSHARE, "--mount", "sh", "-c",
                      f'mount --bind {boot_id} /proc/sys/kernel/random/boot_id && exec "$@"', "sh")
