"""``<data_dir>/meta.properties``: which cluster and node a data dir belongs to.

Kafka's file and keys: ``version``, ``cluster.id``, ``node.id`` (and, in a cluster, ``directory.id``), one
``key=value`` a line. The embedded node creates it on first start; a clustered broker stamps it with the
cluster id it finds in etcd, and a data dir whose file names another cluster or node refuses to start
(``ClusterMismatchError``). Written whole with tmp + fsync + rename (``write_atomically``), so a crash leaves
the old file or the new one. Blocking (file I/O): start-up only.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["META_FILE", "ClusterMismatchError", "read_meta"]

META_FILE = "meta.properties"


class ClusterMismatchError(ValueError):
    """The data dir belongs to another cluster (its ``meta.properties`` names another cluster id)."""


def read_meta(path: Path) -> dict[str, str]:
    """``meta.properties`` as a dict ({} when missing). Blocking."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    return {key.strip(): value.strip() for key, _, value in
            (line.partition("=") for line in text.splitlines() if "=" in line and not line.startswith("#"))}
