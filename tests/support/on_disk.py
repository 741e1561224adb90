"""What a data dir holds, as docs/on-disk.md names it: each file a broker wrote, reduced to the name the page
lists it under (``00000000000000000000.log`` for any segment, ``prepared-N.log`` for a prepared one,
``*.deleted`` for a retired one, ``__consumer_offsets-<n>/`` for that topic's partitions, ...), so a test can
walk a real data dir and name each file the page does not list."""

from __future__ import annotations

import re
from pathlib import Path

ON_DISK = Path(__file__).resolve().parents[2] / "docs" / "on-disk.md"

_SEGMENT = re.compile(r"^\d{20}\.(log|index|timeindex|txnindex|snapshot)$")
_PREPARED = re.compile(r"^prepared-(t?)\d+\.(log|index|timeindex)$")
_INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state")


def _partition_file(name: str) -> str:
    if name.endswith(".deleted"):
        return "*.deleted"
    if name.endswith(".cleaned"):
        return "*.cleaned"
    if name.endswith(".tmp"):
        return "*.tmp"
    if _SEGMENT.match(name):
        return "00000000000000000000." + name.split(".", 1)[1]
    prepared = _PREPARED.match(name)
    if prepared:
        return "prepared-tN" if prepared.group(1) else "prepared-N.log"
    return name


def listed_names(data_dir: Path) -> set[str]:
    """The names docs/on-disk.md must list for what ``data_dir`` holds now (files vanishing meanwhile are
    skipped: a running broker renames and deletes)."""
    names = set()
    for entry in data_dir.iterdir():
        if entry.is_dir():
            if entry.name.endswith("-delete"):
                names.add("-delete/")
                continue
            topic = entry.name.rsplit("-", 1)[0]
            if topic in _INTERNAL_TOPICS:
                names.add(f"{topic}-<n>/")
            try:
                names.update(_partition_file(child.name) for child in entry.iterdir())
            except FileNotFoundError:
                pass
        else:
            names.add("*.tmp" if entry.name.endswith(".tmp") else entry.name)
    return names


def unlisted(names: set[str]) -> set[str]:
    """Those of ``names`` (``listed_names``'s) that docs/on-disk.md's file tree does not mention."""
    [tree] = re.findall(r"```\n(copyless-data/.*?)```", ON_DISK.read_text(), re.S)
    return {name for name in names if name not in tree}
