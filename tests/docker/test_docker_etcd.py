"""The compose cluster's three etcd nodes on the real Docker engine (the brokers' metadata store).

Invariants: from a clean state `up etcd1 etcd2 etcd3` forms one cluster (every member lists the same three
started members, exactly one leader); with one node killed (SIGKILL, the leader, so an election must happen)
the other two keep serving linearizable reads and writes, and the killed node, started again, catches up on
what was written meanwhile; with two nodes down a write is refused (quorum lost), which is what makes the
one-node check mean something. A node cut off the network (`docker network disconnect`) serves no
linearizable read while the majority keeps writing, and catches up once reconnected.
"""

from __future__ import annotations

import json

import pytest

from tests.docker import docker_harness as harness
from tests.support.polling import wait_until

# The etcd cluster alone (the compose cluster tests kill one of its nodes too): slow, for CI's 45 minutes.
pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

ETCD = ("etcd1", "etcd2", "etcd3")


def _members(project: harness.ComposeProject, service: str) -> set[tuple[str, str, str]]:
    """(name, peer URL, status) of every member, as ``service`` sees them."""
    members = json.loads(project.etcdctl(service, "member", "list", "-w", "json").stdout)["members"]
    return {(m.get("name", ""), m["peerURLs"][0], "started" if m.get("name") else "unstarted") for m in members}


def _leader(project: harness.ComposeProject, services) -> str:
    endpoints = ",".join(f"http://{s}:2379" for s in services)
    statuses = json.loads(project.etcdctl(services[0], "endpoint", "status", "-w", "json", endpoints=endpoints).stdout)
    leaders = {s["Status"]["leader"] for s in statuses}
    assert len(leaders) == 1, statuses
    (leader_id,) = leaders
    by_id = {s["Status"]["header"]["member_id"]: s["Endpoint"] for s in statuses}
    return by_id[leader_id].removeprefix("http://").split(":")[0]


def test_etcd_cluster_forms_from_a_clean_state(compose_project):
    project = compose_project("cluster")
    assert project.volumes() == []

    project.timed_up(*ETCD, label="etcd cluster")

    expected = {(name, f"http://{name}:2380", "started") for name in ETCD}
    for service in ETCD:
        assert _members(project, service) == expected
    assert _leader(project, ETCD) in ETCD
    # Only what was asked for runs: the brokers are not started by `up etcd1 etcd2 etcd3`.
    assert {s: project.state(s).status for s in ("broker1", "broker2", "broker3")} == dict.fromkeys(
        ("broker1", "broker2", "broker3"), "missing"
    )
    # (compose creates every volume of the file on `up`, used or not)
    assert {f"{project.name}_{name}-data" for name in ETCD} <= set(project.volumes())


def test_etcd_keeps_serving_with_one_node_killed(compose_project):
    project = compose_project("cluster")
    project.timed_up(*ETCD, label="etcd cluster")
    project.etcdctl("etcd1", "put", "/copyless-test/before", "1")

    leader = _leader(project, ETCD)
    project.kill(leader)
    assert project.wait_state(leader, ("exited",)).status == "exited"
    survivors = [s for s in ETCD if s != leader]
    both = ",".join(f"http://{s}:2379" for s in survivors)

    # Each survivor answers on its own, and the pair takes writes and linearizable reads (a quorum of 2/3).
    for service in survivors:
        assert project.etcdctl(service, "endpoint", "health", check=False).returncode == 0
    assert project.etcdctl(survivors[0], "put", "/copyless-test/during", "2", endpoints=both).stdout.strip() == "OK"
    for service in survivors:
        got = project.etcdctl(service, "get", "--prefix", "/copyless-test/", "--print-value-only").stdout.split()
        assert got == ["1", "2"]
    assert _leader(project, survivors) in survivors

    # The killed node comes back with its volume and catches up on the write it missed.
    project.start(leader)
    wait_until(lambda: project.etcdctl(leader, "get", "/copyless-test/during", "--print-value-only",
                                       "--consistency=s").stdout.strip() == "2",
               what=f"{leader} to catch up on the write it missed", timeout_s=30, interval_s=0.5)

    # Two down of three: no quorum, so a write must fail (and is not applied).
    for service in survivors:
        project.kill(service)
    refused = project.etcdctl(leader, "put", "/copyless-test/without-quorum", "3", check=False, command_timeout_s=3)
    assert refused.returncode != 0, refused.stdout


def test_etcd_node_cut_off_the_network_and_back(compose_project):
    project = compose_project("cluster")
    project.timed_up(*ETCD, label="etcd cluster")
    project.etcdctl("etcd1", "put", "/copyless-test/before", "1")

    project.disconnect("etcd3")
    # Cut off: etcd3 reaches neither peer by name, and alone it cannot serve a linearizable read.
    assert project.etcdctl("etcd3", "endpoint", "health", endpoints="http://etcd1:2379", check=False,
                           command_timeout_s=2).returncode != 0
    assert project.etcdctl("etcd3", "get", "/copyless-test/before", check=False, command_timeout_s=2).returncode != 0
    # The majority side keeps serving.
    assert project.etcdctl("etcd1", "put", "/copyless-test/during", "2",
                           endpoints="http://etcd1:2379,http://etcd2:2379").stdout.strip() == "OK"

    project.connect("etcd3")
    last: list = []

    def caught_up() -> bool:
        got = project.etcdctl("etcd3", "get", "/copyless-test/during", "--print-value-only", check=False,
                              command_timeout_s=2)
        last[:] = [got]
        return got.returncode == 0 and got.stdout.strip() == "2"

    wait_until(caught_up, what="etcd3 to catch up after reconnecting", timeout_s=30, interval_s=0.5,
               detail=lambda: f"the last read: {last}")
    assert project.state("etcd3").health in ("healthy", "starting")
