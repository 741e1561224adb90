"""A group coordinator acts only while it may (issue: replication that survives overlapping faults, window 6;
``broker.groups.service``, "Acting only while entitled to" and "SyncGroup completes only once stored").

- cut off from etcd, a coordinator stops answering its groups before a successor can serve them: a member
  heartbeating the old coordinator is never told "fine" once the new one is handing out the partitions;
- a SyncGroup is answered only once the assignment is in the ISR of the group's offsets partition: a
  member never holds an assignment that the next coordinator, loading the group from that partition, does
  not know.

Members are raw protocol clients (``tests.support.raw_group``), so the test decides which broker each one
talks to and when.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from kio.schema.errors import ErrorCode

from copyless.broker.groups.offsets import partition_for
from copyless.client.blocking import BlockingClientError
from tests.support.polling import wait_until
from tests.support.raw_group import RawMember, describe_group, find_coordinator

OFFSETS_TOPIC = "__consumer_offsets"
# What a coordinator answers while it loads, or before it has taken the leadership others already see.
NOT_READY = (ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available, ErrorCode.not_coordinator)


def coordinator_of(cluster, group: str, *, asking: list[int] | None = None, excluding: int | None = None) -> int:
    """The node FindCoordinator names for ``group``, asked at the brokers ``asking`` (default: all live)."""
    def named():
        for node_id in asking or [n for n, b in cluster.brokers.items() if b.alive()]:
            try:
                code, node = find_coordinator(cluster.brokers[node_id].bootstrap, group)
            except OSError:
                continue
            if code == ErrorCode.none and node != excluding:
                return node
        return None
    return wait_until(named, what=f"a coordinator for {group}", timeout_s=60)


def stable_member(cluster, node_id: int, group: str) -> RawMember:
    """A member that joined at ``node_id`` (retrying while the coordinator loads), led, and synced."""
    def joined():
        member = RawMember(cluster.brokers[node_id].bootstrap, group)
        response = member.join()
        if response.error_code == ErrorCode.none:
            return member
        member.close()
        assert response.error_code in NOT_READY, response
        return None
    member = wait_until(joined, what=f"a member joined at node {node_id}", timeout_s=30)
    assert member.leader == member.member_id
    assert member.sync([(member.member_id, b"partitions 0-3")]) == ErrorCode.none
    assert member.assignment == b"partitions 0-3"
    return member


def test_a_coordinator_cut_off_from_etcd_stops_before_its_successor_serves(net_cluster_factory):
    cluster, lab, etcd_host = net_cluster_factory(3)
    group = "isolated-coordinator"
    old = coordinator_of(cluster, group)
    a = stable_member(cluster, old, group)
    assert a.heartbeat() == ErrorCode.none

    # A keeps heartbeating the old coordinator, as a client that has not been told otherwise does.
    answers: list[tuple[float, int]] = []
    stop = threading.Event()

    def heartbeats():
        while not stop.is_set():
            sent = time.monotonic()
            try:
                answers.append((sent, a.heartbeat()))
            except (OSError, BlockingClientError):
                answers.append((sent, -1))
            time.sleep(0.2)

    thread = threading.Thread(target=heartbeats, daemon=True)
    lab.cut(cluster.hosts[old], etcd_host)
    thread.start()
    try:
        others = [n for n in cluster.brokers if n != old]
        new = coordinator_of(cluster, group, asking=others, excluding=old)
        # B joins at the new coordinator (which loaded A as a member): it waits for A, who never comes, for
        # A's rebalance timeout, then leads the group alone and takes every partition.
        b = RawMember(cluster.brokers[new].bootstrap, group)
        served_from = time.monotonic()
        joined = wait_until(lambda: (lambda r: r if r.error_code not in NOT_READY else None)(b.join()),
                            what="B's JoinGroup at the new coordinator", timeout_s=30)
        assert joined.error_code == ErrorCode.none, joined
        assert b.sync([(b.member_id, b"partitions 0-3")]) == ErrorCode.none
        time.sleep(1.0)
    finally:
        stop.set()
        thread.join(10)
        lab.heal()
    # Whatever the old coordinator told A after the new one began serving the group, it was not "fine".
    late = [(round(t - served_from, 2), code) for t, code in answers if t >= served_from]
    assert late, "no heartbeat reached the old coordinator after the new one served"
    assert all(code != ErrorCode.none for _t, code in late), (
        f"the cut-off coordinator (node {old}) kept A in the group while node {new} handed its partitions to B: "
        f"{late[:10]}")
    # And it stopped at its lease, not later: the first refusal came within the lease of the cut.
    refused = [code for _t, code in answers if code != ErrorCode.none]
    assert refused and refused[0] == ErrorCode.not_coordinator, answers[:20]


def test_a_sync_group_answer_is_never_lost_by_a_coordinator_failover(cluster_factory):
    cluster = cluster_factory(3)
    group = "stored-assignment"
    old = coordinator_of(cluster, group)
    index = partition_for(group, 4)
    state = cluster.wait_for_isr(OFFSETS_TOPIC, 4, 3)[index]
    assert state.leader == old
    followers = [n for n in state.replicas if n != old]

    member = RawMember(cluster.brokers[old].bootstrap, group, timeout_s=10)
    joined = wait_until(lambda: (lambda r: r if r.error_code not in NOT_READY else None)(member.join()),
                        what="a JoinGroup at the coordinator", timeout_s=30)
    assert joined.error_code == ErrorCode.none and member.leader == member.member_id
    # The group's offsets partition cannot replicate anything now: both followers are paused (well within
    # their lease, so they stay in its ISR).
    for node_id in followers:
        os.kill(cluster.brokers[node_id].pid, signal.SIGSTOP)
    outcome: dict = {}

    def sync():
        try:
            outcome["code"] = member.sync([(member.member_id, b"partitions 0-3")])
        except (OSError, BlockingClientError) as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=sync, daemon=True)
    try:
        thread.start()
        thread.join(0.8)
        # The coordinator dies before the assignment could reach any follower.
        cluster.brokers[old].kill()
    finally:
        for node_id in followers:
            os.kill(cluster.brokers[node_id].pid, signal.SIGCONT)
    thread.join(15)
    new = coordinator_of(cluster, group, asking=followers, excluding=old)

    def described():
        found = describe_group(cluster.brokers[new].bootstrap, group)
        return found if found.error_code == ErrorCode.none else None
    found = wait_until(described, what="the group at the new coordinator", timeout_s=30)
    assignments = {m.member_id: bytes(m.member_assignment) for m in found.members}
    if outcome.get("code") == ErrorCode.none:
        # The member was told its assignment: the group its successor loaded must have it.
        assert assignments.get(member.member_id) == b"partitions 0-3", (
            f"SyncGroup answered {member.assignment!r} to {member.member_id}, but node {new} loaded "
            f"{found.group_state} {assignments}")
    # Either way it was not answered while nothing could store it.
    assert outcome.get("code") != ErrorCode.none, (
        f"SyncGroup was answered ({outcome}) while no follower could receive the group's assignment")
