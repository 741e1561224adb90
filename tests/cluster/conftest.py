"""Fixtures for the cluster tests: clusters of real broker processes on the session's etcd (``etcd_server``,
tests/conftest.py).

    cluster_factory      ``cluster_factory(size=3, config=None, extra_args=())`` -> a started ``Cluster``,
                         stopped at teardown (SIGCONT first, for a test that left a broker paused)
    net_cluster_factory  the same, but every broker and a private etcd each run on a host of their own in a
                         ``NetLab`` (network namespaces on a bridge), so a test can cut a broker off etcd and
                         its peers; skips, saying why, where namespaces cannot be made (not root, no
                         iproute2). Returns ``(cluster, lab, etcd_host)``.
"""

from __future__ import annotations

import pytest

from tests.support.cluster import Cluster
from tests.support.etcd import EtcdProcess, require_etcd
from tests.support.netns import NetLab


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


@pytest.fixture
def net_cluster_factory(tmp_path):
    require_etcd()
    available, why = NetLab.available()
    if not available:
        pytest.skip(why)
    NetLab.remove_leftovers()
    made: list[tuple[Cluster, NetLab, EtcdProcess]] = []

    def make(size: int = 3, *, config: dict | None = None, extra_args: tuple[str, ...] = ()):
        lab = NetLab().start()
        etcd = cluster = None
        try:
            etcd_host = lab.add_host("etcd")
            etcd = EtcdProcess(tmp_path / f"netetcd{len(made)}", host=etcd_host.address,
                               wrapper=tuple(lab.command(etcd_host, [])))
            cluster = Cluster(tmp_path / f"netcluster{len(made)}", etcd, size, config=config,
                              extra_args=extra_args, lab=lab)
            made.append((cluster, lab, etcd))
            etcd.start()
            cluster.start()
        except BaseException:
            if not made or made[-1][1] is not lab:
                lab.close()
            raise
        return cluster, lab, etcd_host

    yield make
    for cluster, lab, etcd in made:
        try:
            lab.heal()
            cluster.stop()
            etcd.stop()
        finally:
            lab.close()
