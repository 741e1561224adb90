"""The group state machine, scenario by scenario, with an injected clock (no sockets, no asyncio)."""

from __future__ import annotations

import itertools

import pytest
from kio.schema.errors import ErrorCode

from copyless.broker.groups.coordinator import GroupConfig, GroupCoordinator, GroupState

PROTOCOLS = (("range", b"r"), ("roundrobin", b"rr"))
SESSION_MS, REBALANCE_MS, DELAY_MS = 10_000, 20_000, 3_000


@pytest.fixture
def coordinator():
    counter = itertools.count()
    return GroupCoordinator(GroupConfig(initial_rebalance_delay_ms=DELAY_MS),
                            member_id_factory=lambda prefix: f"{prefix}-{next(counter)}")


def join(c, now, member_id="", *, waiter=None, protocols=PROTOCOLS, v4=True, instance=None, client="c",
         session=SESSION_MS, group="g"):
    return c.join_group(now, group_id=group, member_id=member_id, group_instance_id=instance,
                        protocol_type="consumer", protocols=protocols, session_timeout_ms=session,
                        rebalance_timeout_ms=REBALANCE_MS, require_known_member_id=v4,
                        waiter=waiter or object(), client_id=client)


def join_new(c, now, waiter, **kwargs):
    """The v4+ round trip: MEMBER_ID_REQUIRED, then the real join (parked)."""
    first = join(c, now, **kwargs)
    assert first.error == ErrorCode.member_id_required
    assert join(c, now, first.member_id, waiter=waiter, **kwargs) is None
    return first.member_id


def completions(c):
    return dict(c.take_completions())


def sync(c, now, member_id, generation, assignments=(), waiter=None, instance=None):
    return c.sync_group(now, group_id="g", generation_id=generation, member_id=member_id,
                        group_instance_id=instance, assignments=assignments, waiter=waiter or object())


def test_member_id_required_then_join_window_then_generation_one(coordinator):
    a = join_new(coordinator, 0, "wa", client="a")
    assert coordinator.describe("g").state is GroupState.PREPARING_REBALANCE
    assert coordinator.next_deadline_ms() == DELAY_MS
    coordinator.tick(DELAY_MS - 1)
    assert completions(coordinator) == {}
    coordinator.tick(DELAY_MS)
    result = completions(coordinator)["wa"]
    assert result.error == ErrorCode.none and result.generation_id == 1 and result.leader_id == a
    assert result.protocol_name == "range" and result.members == ((a, None, b"r"),)
    assert coordinator.describe("g").state is GroupState.COMPLETING_REBALANCE


def test_join_window_extends_for_each_new_member_up_to_rebalance_timeout(coordinator):
    join_new(coordinator, 0, "w0", client="a")
    join_new(coordinator, 2_000, "w1", client="b")
    coordinator.tick(3_000)  # a member arrived during the window: wait another window
    assert completions(coordinator) == {}
    coordinator.tick(6_000)
    done = completions(coordinator)
    assert set(done) == {"w0", "w1"} and {r.generation_id for r in done.values()} == {1}
    leader = [r for r in done.values() if r.members]
    assert len(leader) == 1 and len(leader[0].members) == 2


def test_v3_join_without_member_id_joins_directly(coordinator):
    assert join(coordinator, 0, waiter="w", v4=False) is None
    coordinator.tick(DELAY_MS)
    assert completions(coordinator)["w"].error == ErrorCode.none


def stable_group(c, clients=("a", "b")):
    ids = [join_new(c, 0, f"w-{name}", client=name) for name in clients]
    c.tick(DELAY_MS * (len(clients) + 1))
    done = completions(c)
    leader = next(r for r in done.values() if r.members)
    generation = leader.generation_id
    assignments = [(m, f"P{i}".encode()) for i, (m, _, _) in enumerate(leader.members)]
    followers = [m for m in ids if m != leader.member_id]
    for m in followers:
        assert sync(c, DELAY_MS * 4, m, generation, waiter=f"s-{m}") is None
    assert sync(c, DELAY_MS * 4, leader.member_id, generation, assignments, waiter="s-leader") is None
    synced = completions(c)
    assert all(r.error == ErrorCode.none for r in synced.values()) and len(synced) == len(ids)
    assert c.describe("g").state is GroupState.STABLE
    return ids, leader.member_id, generation, dict(assignments)


def test_sync_hands_each_member_the_leaders_assignment(coordinator):
    ids, leader, generation, assignments = stable_group(coordinator)
    for m in ids:
        assert sync(coordinator, 13_000, m, generation).assignment == assignments[m]
    assert sync(coordinator, 13_000, ids[0], generation - 1).error == ErrorCode.illegal_generation


def test_new_member_triggers_rebalance_seen_by_heartbeats(coordinator):
    ids, leader, generation, _ = stable_group(coordinator)
    c_id = join_new(coordinator, 13_000, "w-c", client="c")
    assert coordinator.heartbeat(13_001, group_id="g", generation_id=generation, member_id=ids[0]) \
        == ErrorCode.rebalance_in_progress
    # Commits of the current generation are still accepted while members rejoin.
    assert coordinator.validate_offset_commit(13_001, group_id="g", generation_id=generation,
                                              member_id=ids[0]) == ErrorCode.none
    for m in ids:
        assert join(coordinator, 13_002, m, waiter=f"re-{m}") is None
    done = completions(coordinator)  # everyone known has rejoined: no need to wait for the timeout
    assert {r.generation_id for r in done.values()} == {generation + 1} and c_id in {r.member_id for r in done.values()}


def test_session_expiry_removes_a_silent_member_and_rebalances(coordinator):
    ids, leader, generation, _ = stable_group(coordinator)
    live, silent = ids[0], ids[1]
    now = 12_000
    for step in range(1, 4):
        assert coordinator.heartbeat(now + step * 3_000, group_id="g", generation_id=generation,
                                     member_id=live) == ErrorCode.none
    # The silent member last spoke at 12,000 (its SyncGroup): gone at 22,000.
    coordinator.tick(12_000 + SESSION_MS)
    snapshot = coordinator.describe("g")
    assert silent not in {m.member_id for m in snapshot.members}
    assert snapshot.state is GroupState.PREPARING_REBALANCE
    assert join(coordinator, 22_001, live, waiter="again") is None
    result = completions(coordinator)["again"]
    assert result.generation_id == generation + 1 and result.leader_id == live


def test_rebalance_timeout_removes_members_that_do_not_rejoin(coordinator):
    ids, leader, generation, _ = stable_group(coordinator)
    c_id = join_new(coordinator, 12_000, "w-c", client="c")
    # Nobody else rejoins, but they keep heartbeating (so only the rebalance timeout can decide).
    for t in range(13_000, 12_000 + REBALANCE_MS, 3_000):
        for m in ids:
            coordinator.heartbeat(t, group_id="g", generation_id=generation, member_id=m)
    coordinator.tick(12_000 + REBALANCE_MS)
    result = completions(coordinator)["w-c"]
    assert result.error == ErrorCode.none and result.members == ((c_id, None, b"r"),)
    assert {m.member_id for m in coordinator.describe("g").members} == {c_id}


def test_member_that_never_syncs_is_removed_after_the_rebalance_timeout(coordinator):
    join_new(coordinator, 0, "wa", client="a")
    b = join_new(coordinator, 0, "wb", client="b")
    coordinator.tick(2 * DELAY_MS)
    done = completions(coordinator)
    leader = next(r for r in done.values() if r.members)
    assert sync(coordinator, 6_100, leader.member_id, 1, [(m, b"x") for m, _, _ in leader.members]) is None
    completions(coordinator)
    other = b if leader.member_id != b else next(r.member_id for r in done.values() if r.member_id != b)
    # The other member heartbeats but never sends SyncGroup: it cannot have its assignment, so it goes.
    for t in range(7_000, 6_000 + REBALANCE_MS, 2_000):
        coordinator.heartbeat(t, group_id="g", generation_id=1, member_id=other)
        coordinator.heartbeat(t, group_id="g", generation_id=1, member_id=leader.member_id)
    coordinator.tick(6_000 + REBALANCE_MS)
    assert other not in {m.member_id for m in coordinator.describe("g").members}
    assert coordinator.describe("g").state is GroupState.PREPARING_REBALANCE


def test_leave_group_batch_and_last_member_leaving_empties_the_group(coordinator):
    ids, leader, generation, _ = stable_group(coordinator)
    result = coordinator.leave_group(13_000, group_id="g", members=[(ids[0], None), ("nobody", None)])
    assert [e for _, _, e in result.members] == [ErrorCode.none, ErrorCode.unknown_member_id]
    assert coordinator.describe("g").state is GroupState.PREPARING_REBALANCE
    coordinator.leave_group(13_001, group_id="g", members=[(ids[1], None)])
    snapshot = coordinator.describe("g")
    assert snapshot.state is GroupState.EMPTY and not snapshot.members
    assert snapshot.generation_id == generation + 1 and snapshot.protocol_type == "consumer"
    assert coordinator.take_changed_groups()[-1].state is GroupState.EMPTY


def test_inconsistent_protocol_and_session_bounds(coordinator):
    join_new(coordinator, 0, "wa", client="a")
    other = join(coordinator, 1, protocols=(("cooperative-sticky", b""),))
    assert other.error == ErrorCode.inconsistent_group_protocol
    assert join(coordinator, 1, session=5_999).error == ErrorCode.invalid_session_timeout
    assert join(coordinator, 1, session=1_800_001).error == ErrorCode.invalid_session_timeout
    assert join(coordinator, 1, protocols=()).error == ErrorCode.inconsistent_group_protocol


def test_protocol_every_member_supports_wins(coordinator):
    join_new(coordinator, 0, "wa", protocols=(("range", b""), ("roundrobin", b"")))
    join_new(coordinator, 0, "wb", protocols=(("roundrobin", b""),))
    coordinator.tick(2 * DELAY_MS)
    assert {r.protocol_name for r in completions(coordinator).values()} == {"roundrobin"}


def test_sync_and_heartbeat_before_join_are_unknown_members(coordinator):
    assert sync(coordinator, 0, "x", 1).error == ErrorCode.unknown_member_id
    assert coordinator.heartbeat(0, group_id="g", generation_id=1, member_id="x") == ErrorCode.unknown_member_id
    pending = join(coordinator, 0)
    # A member id handed out with MEMBER_ID_REQUIRED is not a member until it joins with it.
    assert sync(coordinator, 1, pending.member_id, 0).error == ErrorCode.unknown_member_id
    assert join(coordinator, 1, "forged").error == ErrorCode.unknown_member_id


def test_standalone_commits_need_an_empty_group(coordinator):
    assert coordinator.validate_offset_commit(0, group_id="solo", generation_id=-1, member_id="") == ErrorCode.none
    assert coordinator.validate_offset_commit(0, group_id="ghost", generation_id=3, member_id="m") \
        == ErrorCode.illegal_generation
    ids, _, generation, _ = stable_group(coordinator)
    assert coordinator.validate_offset_commit(13_000, group_id="g", generation_id=-1, member_id="") \
        == ErrorCode.unknown_member_id


def test_transactional_commits_name_a_current_member_or_none(coordinator):
    """TxnOffsetCommit (KIP-447), Kafka's validateOffsetCommit with isTransactional."""
    check = coordinator.validate_txn_offset_commit
    assert check(group_id="ghost", generation_id=-1, member_id="") == ErrorCode.none
    assert check(group_id="ghost", generation_id=-1, member_id="m") == ErrorCode.none  # an Empty group
    assert check(group_id="ghost", generation_id=3, member_id="m") == ErrorCode.unknown_member_id
    ids, _, generation, _ = stable_group(coordinator)
    assert check(group_id="g", generation_id=-1, member_id="") == ErrorCode.none  # v0-2: no member named
    assert check(group_id="g", generation_id=generation, member_id=ids[0]) == ErrorCode.none
    assert check(group_id="g", generation_id=generation - 1, member_id=ids[0]) == ErrorCode.illegal_generation
    assert check(group_id="g", generation_id=generation, member_id="gone") == ErrorCode.unknown_member_id
    assert check(group_id="g", generation_id=-1, member_id=ids[0]) == ErrorCode.illegal_generation


def test_commit_during_completing_rebalance_is_refused(coordinator):
    a = join_new(coordinator, 0, "wa")
    coordinator.tick(DELAY_MS)
    completions(coordinator)
    assert coordinator.validate_offset_commit(DELAY_MS, group_id="g", generation_id=1, member_id=a) \
        == ErrorCode.rebalance_in_progress


def test_static_member_restart_keeps_assignment_without_rebalance(coordinator):
    waiters = {}
    ids = []
    for name, instance in (("a", None), ("s", "static-s")):
        waiters[name] = f"w-{name}"
        if instance is None:
            ids.append(join_new(coordinator, 0, waiters[name], client=name))
        else:
            assert join(coordinator, 0, waiter=waiters[name], instance=instance, client=name) is None
    coordinator.tick(2 * DELAY_MS)
    done = completions(coordinator)
    leader = next(r for r in done.values() if r.members)
    static_old = done["w-s"].member_id
    assert leader.member_id != static_old
    assert sync(coordinator, 6_001, static_old, 1, waiter="ss", instance="static-s") is None
    assert sync(coordinator, 6_001, leader.member_id, 1, [(leader.member_id, b"A"), (static_old, b"S")]) is None
    completions(coordinator)
    # The static member's process restarts: it joins with no member id and the same instance id.
    rejoined = join(coordinator, 7_000, instance="static-s", client="s2")
    assert rejoined.error == ErrorCode.none and rejoined.generation_id == 1 and rejoined.member_id != static_old
    assert coordinator.describe("g").state is GroupState.STABLE
    assert sync(coordinator, 7_001, rejoined.member_id, 1, instance="static-s").assignment == b"S"
    # The old incarnation is fenced.
    assert coordinator.heartbeat(7_002, group_id="g", generation_id=1, member_id=static_old,
                                 group_instance_id="static-s") == ErrorCode.fenced_instance_id
    assert coordinator.heartbeat(7_002, group_id="g", generation_id=1, member_id=leader.member_id) == ErrorCode.none


def _two_static_members_stable(coordinator):
    """Static members s1 (joins first: the leader) and s2, Stable at generation 1 with assignments b"1" and
    b"2". Returns (s1 member id, s2 member id)."""
    for name in ("s1", "s2"):
        assert join(coordinator, 0, waiter=f"w-{name}", instance=name, client=name) is None
    coordinator.tick(2 * DELAY_MS)
    done = completions(coordinator)
    s1, s2 = done["w-s1"].member_id, done["w-s2"].member_id
    assert done["w-s1"].leader_id == s1
    assert sync(coordinator, 6_001, s2, 1, waiter="x2", instance="s2") is None
    assert sync(coordinator, 6_001, s1, 1, [(s1, b"1"), (s2, b"2")], waiter="x1", instance="s1") is None
    assert {w: r.assignment for w, r in completions(coordinator).items()} == {"x1": b"1", "x2": b"2"}
    return s1, s2


def test_static_member_rejoining_with_new_metadata_keeps_its_assignment(coordinator):
    # A restarted consumer's subscription metadata differs (it no longer owns partitions; librdkafka 0102):
    # the group would still select the same protocol, so Kafka does not rebalance.
    s1, s2 = _two_static_members_stable(coordinator)
    changed = (("range", b"r-after-restart"), ("roundrobin", b"rr-after-restart"))
    rejoined = join(coordinator, 7_000, instance="s2", client="s2b", protocols=changed)
    assert rejoined.error == ErrorCode.none and rejoined.generation_id == 1
    assert rejoined.leader_id == s1 and rejoined.members == ()
    assert coordinator.describe("g").state is GroupState.STABLE
    assert sync(coordinator, 7_001, rejoined.member_id, 1, instance="s2").assignment == b"2"
    # Its new metadata is what the next rebalance's leader will see.
    member = next(m for m in coordinator.describe("g").members if m.member_id == rejoined.member_id)
    assert member.protocols == changed
    assert coordinator.heartbeat(7_002, group_id="g", generation_id=1, member_id=s1,
                                 group_instance_id="s1") == ErrorCode.none


def test_static_leader_rejoining_is_told_the_old_leader_id_and_nobody_rebalances(coordinator):
    s1, s2 = _two_static_members_stable(coordinator)
    rejoined = join(coordinator, 7_000, instance="s1", client="s1b")
    assert rejoined.error == ErrorCode.none and rejoined.generation_id == 1
    # The old id, so the restarted leader does not compute an assignment a Stable group would not hand out.
    assert rejoined.leader_id == s1 != rejoined.member_id and rejoined.members == ()
    assert coordinator.describe("g").state is GroupState.STABLE
    assert coordinator.describe("g").leader_id == rejoined.member_id
    assert sync(coordinator, 7_001, rejoined.member_id, 1, instance="s1").assignment == b"1"
    assert coordinator.heartbeat(7_002, group_id="g", generation_id=1, member_id=s2,
                                 group_instance_id="s2") == ErrorCode.none
    # The next rebalance (s2 changes its subscription) is led by the new incarnation.
    assert join(coordinator, 8_000, s2, waiter="j2", instance="s2", protocols=(("range", b"other"),)) is None
    assert join(coordinator, 8_001, rejoined.member_id, waiter="j1", instance="s1") is None
    done = completions(coordinator)
    assert done["j1"].generation_id == 2 and done["j1"].leader_id == rejoined.member_id and done["j1"].members


def test_static_member_rejoining_with_a_protocol_the_group_cannot_keep_rebalances(coordinator):
    s1, s2 = _two_static_members_stable(coordinator)
    assert join(coordinator, 7_000, instance="s2", client="s2b", waiter="j2", protocols=(("roundrobin", b""),)) is None
    assert coordinator.describe("g").state is GroupState.PREPARING_REBALANCE
    assert join(coordinator, 7_001, s1, waiter="j1", instance="s1") is None
    done = completions(coordinator)
    assert done["j1"].generation_id == 2 and done["j1"].protocol_name == "roundrobin"


def test_duplicate_instance_id_fences_the_older_process(coordinator):
    s1, s2 = _two_static_members_stable(coordinator)
    newer = join(coordinator, 7_000, instance="s2", client="zombie-replacement")
    assert newer.error == ErrorCode.none
    # The old process is still alive: each of its requests names the instance id with its old member id.
    assert coordinator.heartbeat(7_001, group_id="g", generation_id=1, member_id=s2,
                                 group_instance_id="s2") == ErrorCode.fenced_instance_id
    assert sync(coordinator, 7_001, s2, 1, instance="s2").error == ErrorCode.fenced_instance_id
    assert join(coordinator, 7_001, s2, instance="s2").error == ErrorCode.fenced_instance_id
    assert coordinator.validate_offset_commit(7_001, group_id="g", generation_id=1, member_id=s2,
                                              group_instance_id="s2") == ErrorCode.fenced_instance_id
    left = coordinator.leave_group(7_002, group_id="g", members=[(s2, "s2")])
    assert left.members == ((s2, "s2", ErrorCode.fenced_instance_id),)
    assert coordinator.describe("g").state is GroupState.STABLE


def test_leave_group_removes_static_members_by_instance_id(coordinator):
    s1, s2 = _two_static_members_stable(coordinator)
    # KIP-345's admin removal: the member id left empty, the instance ids named; one unknown.
    left = coordinator.leave_group(7_000, group_id="g", members=[("", "s2"), ("", "nobody")])
    assert left.members == (("", "s2", ErrorCode.none), ("", "nobody", ErrorCode.unknown_member_id))
    assert [m.member_id for m in coordinator.describe("g").members] == [s1]
    assert coordinator.describe("g").state is GroupState.PREPARING_REBALANCE


def test_loading_and_inactive_coordinator_answer_retriable_errors(coordinator):
    coordinator.status = "loading"
    assert join(coordinator, 0).error == ErrorCode.coordinator_load_in_progress
    assert coordinator.heartbeat(0, group_id="g", generation_id=1, member_id="m") \
        == ErrorCode.coordinator_load_in_progress
    coordinator.status = "inactive"
    assert sync(coordinator, 0, "m", 1).error == ErrorCode.coordinator_not_available
    assert coordinator.validate_offset_commit(0, group_id="g", generation_id=-1, member_id="") \
        == ErrorCode.coordinator_not_available


def test_deactivate_answers_parked_requests(coordinator):
    join_new(coordinator, 0, "parked")
    coordinator.deactivate()
    assert completions(coordinator)["parked"].error == ErrorCode.coordinator_not_available


def test_persisted_group_comes_back_stable_and_expires_silent_members(coordinator):
    ids, leader, generation, assignments = stable_group(coordinator)
    snapshot = coordinator.describe("g")
    counter = itertools.count()
    restored = GroupCoordinator(GroupConfig(), member_id_factory=lambda p: f"{p}-r{next(counter)}")
    restored.load_group(snapshot, 100_000)
    again = restored.describe("g")
    assert again.state is GroupState.STABLE and again.generation_id == generation
    assert {m.member_id: m.assignment for m in again.members} == assignments
    assert restored.heartbeat(100_001, group_id="g", generation_id=generation, member_id=ids[0]) == ErrorCode.none
    restored.tick(100_000 + SESSION_MS)  # ids[1] never came back
    assert {m.member_id for m in restored.describe("g").members} == {ids[0]}


def test_empty_group_id_is_invalid_for_membership_but_not_for_commits(coordinator):
    assert join(coordinator, 0, group="").error == ErrorCode.invalid_group_id
    assert coordinator.heartbeat(0, group_id="", generation_id=1, member_id="m") == ErrorCode.invalid_group_id
    assert coordinator.sync_group(0, group_id="", generation_id=1, member_id="m", group_instance_id=None,
                                  assignments=(), waiter="w").error == ErrorCode.invalid_group_id
    assert coordinator.leave_group(0, group_id="", members=[("m", None)]).error == ErrorCode.invalid_group_id
    # Kafka keeps accepting commits for the empty group id (old clients without a group use it).
    assert coordinator.validate_offset_commit(0, group_id="", generation_id=-1, member_id="") == ErrorCode.none


# --- SyncGroup completes once the assignment is stored (store_assignments) ------------------------------------

def storing_coordinator():
    counter = itertools.count()
    return GroupCoordinator(GroupConfig(initial_rebalance_delay_ms=DELAY_MS),
                            member_id_factory=lambda prefix: f"{prefix}-{next(counter)}", store_assignments=True,
                            wall_clock_ms=lambda: 1_700_000_000_000)


def two_members_joined(c):
    a = join_new(c, 0, "wa", client="a")
    b = join_new(c, 0, "wb", client="b")
    c.tick(2 * DELAY_MS)  # the second arrival extended the join window once
    done = completions(c)
    leader = next(r.member_id for r in done.values() if r.members)
    return leader, (b if leader == a else a)


def test_members_get_their_assignment_only_once_it_is_stored():
    c = storing_coordinator()
    leader, other = two_members_joined(c)
    assert sync(c, 10, other, 1, waiter="s-other") is None
    assert sync(c, 20, leader, 1, [(leader, b"L"), (other, b"O")], waiter="s-leader") is None
    assert completions(c) == {}
    assert c.storing("g") == 1
    # The snapshot to store carries the assignment (the group is still CompletingRebalance).
    [snapshot] = c.take_changed_groups()
    assert {m.member_id: m.assignment for m in snapshot.members} == {leader: b"L", other: b"O"}
    assert c.heartbeat(30, group_id="g", generation_id=1, member_id=other) == ErrorCode.none
    c.assignment_stored(40, group_id="g", generation_id=1)
    done = completions(c)
    assert (done["s-leader"].error, done["s-leader"].assignment) == (ErrorCode.none, b"L")
    assert (done["s-other"].error, done["s-other"].assignment) == (ErrorCode.none, b"O")
    assert c.describe("g").state is GroupState.STABLE
    # Its timestamps come from the wall clock, its deadlines from the monotonic one.
    assert c.describe("g").state_timestamp_ms == 1_700_000_000_000


def test_an_assignment_that_could_not_be_stored_is_never_handed_out():
    c = storing_coordinator()
    leader, other = two_members_joined(c)
    assert sync(c, 10, other, 1, waiter="s-other") is None
    assert sync(c, 20, leader, 1, [(leader, b"L"), (other, b"O")], waiter="s-leader") is None
    c.assignment_stored(40, group_id="g", generation_id=1, error=ErrorCode.not_coordinator)
    done = completions(c)
    assert {w: r.error for w, r in done.items()} == {"s-leader": ErrorCode.not_coordinator,
                                                     "s-other": ErrorCode.not_coordinator}
    assert all(r.assignment == b"" for r in done.values())
    assert c.describe("g").state is GroupState.PREPARING_REBALANCE
    assert all(m.assignment == b"" for m in c.describe("g").members)
    # A late answer for that generation changes nothing.
    c.assignment_stored(50, group_id="g", generation_id=1)
    assert completions(c) == {} and c.describe("g").state is GroupState.PREPARING_REBALANCE
