"""Small durable-file helper shared by the broker's metadata files (topic registry, producer-id block,
cluster id).

``write_atomically`` is storage's ``replace_durably`` (broker/storage/checkpoint.py): tmp + fsync + rename +
directory fsync, so after a crash the file holds either its old or its new contents, never a mix. Blocking:
call it from a worker thread in async code.
"""

from __future__ import annotations

from pathlib import Path

from copyless.broker.storage.checkpoint import replace_durably

__all__ = ["write_atomically"]


def write_atomically(path: str | Path, contents: bytes) -> None:
    replace_durably(Path(path), contents)
