"""Fixtures for the cluster tests: one real etcd per session, and clusters of real broker processes on it.

    etcd_server       an ``EtcdProcess`` shared by the session (each cluster works under its own root)
    cluster_factory   ``cluster_factory(size=3, config=None, extra_args=())`` -> a started ``Cluster``, stopped
                      at teardown (SIGCONT first, for a test that left a broker paused)
"""

from __future__ import annotations

import pytest

from tests.support.cluster import Cluster
from tests.support.etcd import EtcdProcess, require_etcd


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory):
    require_etcd()
    server = EtcdProcess(tmp_path_factory.mktemp("etcd")).start()
    yield server
    server.stop()


@pytest.fixture
def cluster_factory(etcd_server, tmp_path):
    clusters: list[Cluster] = []

    def make(size: int = 3, *, config: dict | None = None, extra_args: tuple[str, ...] = (), etcd=None,
             start: bool = True) -> Cluster:
        cluster = Cluster(tmp_path / f"cluster{len(clusters)}", etcd or etcd_server, size, config=config,
                          extra_args=extra_args)
        clusters.append(cluster)
        return cluster.start() if start else cluster

    yield make
    for cluster in clusters:
        cluster.stop()
