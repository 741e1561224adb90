"""Small durable-file helper shared by the broker's metadata files (topic registry, producer-id block,
cluster id).

``write_atomically`` is the tmp + fsync + rename + directory fsync sequence: after a crash the file holds
either its old or its new contents, never a mix. Blocking: call it from a worker thread in async code.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_atomically"]


def write_atomically(path: str | Path, contents: bytes) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(contents)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
