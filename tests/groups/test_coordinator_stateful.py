"""Hypothesis drives the group state machine with clients that join, sync, heartbeat, commit, leave, crash and
restart while the clock moves, and checks Kafka's promises after every step:

- members the coordinator considers current (Stable, present, at the generation they synced) hold exactly the
  assignment the leader gave them, and no two hold the same partition;
- a client that stopped talking while not parked in JoinGroup/SyncGroup is gone once its session timeout has
  passed, and one that stopped while parked is gone within session + 2 x rebalance timeout;
- every parked request is answered exactly once; generations never go back; the state agrees with the
  membership (Empty has no member, Stable has no member waiting to join, the leader is a member);
- static members (KIP-345; two of the four clients have a group.instance.id): one whose process restarts and
  rejoins a Stable group is answered at once, in the same generation, with no rebalance, even with changed
  metadata (a restarted consumer owns nothing), and its sync gives back the old member's assignment; an
  older process of the same instance id still running (a zombie) never gets a successful answer once the
  newer one has joined, only FENCED_INSTANCE_ID (or UNKNOWN_MEMBER_ID once the instance is gone); an
  admin's LeaveGroup naming only the instance id removes whichever member holds it.
"""

from __future__ import annotations

import itertools

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from kio.schema.errors import ErrorCode

from copyless.broker.groups.coordinator import GroupConfig, GroupCoordinator, GroupState, JoinResult

GROUP = "g"
PARTITIONS = 6
SESSION_MS = 10_000
REBALANCE_MS = 15_000
PROTOCOLS = (("range", b"sub"),)
# The same protocol with other metadata: a consumer that owns partitions says so in its subscription.
METADATA = (b"sub", b"sub+owned-0", b"sub+owned-1,2")


def assign(member_ids: list[str]) -> list[tuple[str, bytes]]:
    """Round-robin of PARTITIONS over the members, encoded as the partition numbers' bytes."""
    owned: dict[str, bytearray] = {m: bytearray() for m in member_ids}
    for partition in range(PARTITIONS):
        owned[member_ids[partition % len(member_ids)]].append(partition)
    return [(m, bytes(p)) for m, p in owned.items()]


class Client:
    def __init__(self, name: str, instance_id: str | None):
        self.name = name
        self.instance_id = instance_id
        self.member_id = ""
        self.generation = -1
        self.leader = False
        self.join_members: list[str] = []
        self.owned: tuple[int, str, bytes] | None = None  # (generation, member id, partitions)
        self.parked: object | None = None
        self.alive = True
        self.crashed_at_ms: int | None = None
        self.crashed_parked = False
        self.last_request_ms = 0


class GroupMachine(RuleBasedStateMachine):
    @initialize(delay_ms=st.sampled_from([0, 100, 3000]), version=st.sampled_from([3, 5]))
    def setup(self, delay_ms, version):
        counter = itertools.count()
        self.coordinator = GroupCoordinator(
            GroupConfig(initial_rebalance_delay_ms=delay_ms), member_id_factory=lambda p: f"{p}-{next(counter)}"
        )
        self.require_known = version >= 4
        self.now_ms = 0
        self.clients = [Client("c0", None), Client("c1", None), Client("c2", "static-2"), Client("c3", "static-3")]
        self.zombies: list[Client] = []
        self.waiters = itertools.count()
        self.outstanding: dict[int, Client] = {}
        self.last_generation = 0

    # --- plumbing --------------------------------------------------------------------------------------

    def park(self, client: Client) -> int:
        waiter = next(self.waiters)
        self.outstanding[waiter] = client
        client.parked = waiter
        return waiter

    def drain(self):
        # The asyncio shell's timer fires as soon as a deadline is due; a due-now deadline runs at once.
        self.coordinator.tick(self.now_ms)
        for waiter, result in self.coordinator.take_completions():
            assert waiter in self.outstanding, f"waiter {waiter} answered twice or never parked"
            client = self.outstanding.pop(waiter)
            if client.parked == waiter:
                client.parked = None
                # Answering a parked request restarts the member's session, as in Kafka.
                client.last_request_ms = self.now_ms
            if client.alive and client.parked is None:
                self.apply(client, result)

    def apply(self, client: Client, result):
        if isinstance(result, JoinResult):
            if result.error == ErrorCode.none:
                client.member_id = result.member_id
                client.generation = result.generation_id
                client.leader = result.leader_id == result.member_id
                client.join_members = [m for m, _, _ in result.members]
                if client.leader:
                    assert {m for m, _, _ in result.members} >= {client.member_id}
            elif result.error == ErrorCode.member_id_required:
                client.member_id = result.member_id
            elif result.error in (ErrorCode.unknown_member_id, ErrorCode.fenced_instance_id):
                client.member_id, client.owned = "", None
        else:
            if result.error == ErrorCode.none:
                client.owned = (client.generation, client.member_id, result.assignment)
            else:
                client.owned = None
                if result.error in (ErrorCode.unknown_member_id, ErrorCode.illegal_generation,
                                    ErrorCode.fenced_instance_id):
                    client.member_id = ""

    def idle(self, client: Client) -> bool:
        return client.alive and client.parked is None

    def touch(self, client: Client):
        client.last_request_ms = self.now_ms

    # --- rules -----------------------------------------------------------------------------------------

    @rule(data=st.data())
    def join(self, data):
        client = data.draw(st.sampled_from([c for c in self.clients if self.idle(c)] or [None]))
        if client is None:
            return
        metadata = data.draw(st.sampled_from(METADATA))
        before = self.coordinator.describe(GROUP)
        holder = self.static_holder(before, client.instance_id)
        # KIP-345: a restarted static member rejoining a Stable group (no member id yet, its instance id
        # held by a member) keeps its place: no rebalance, whatever metadata it now sends.
        static_restart = (client.instance_id is not None and not client.member_id and holder is not None
                          and before.state is GroupState.STABLE)
        self.touch(client)
        waiter = self.park(client)
        result = self.coordinator.join_group(
            self.now_ms, group_id=GROUP, member_id=client.member_id, group_instance_id=client.instance_id,
            protocol_type="consumer", protocols=(("range", metadata),), session_timeout_ms=SESSION_MS,
            rebalance_timeout_ms=REBALANCE_MS, require_known_member_id=self.require_known, waiter=waiter,
            client_id=client.name,
        )
        if static_restart:
            assert result is not None and result.error == ErrorCode.none, result
            assert result.generation_id == before.generation_id and result.members == ()
            after = self.coordinator.describe(GROUP)
            assert after.state is GroupState.STABLE and after.generation_id == before.generation_id
            assert self.static_holder(after, client.instance_id).assignment == holder.assignment
        if result is not None:
            self.outstanding.pop(waiter)
            client.parked = None
            self.apply(client, result)
        self.drain()

    @staticmethod
    def static_holder(snapshot, instance_id):
        """The member holding ``instance_id`` in ``snapshot``, or None."""
        if instance_id is None:
            return None
        return next((m for m in snapshot.members if m.group_instance_id == instance_id), None)

    @rule(data=st.data())
    def start_duplicate(self, data):
        """A second process starts with a live static member's instance id; the first keeps running."""
        client = data.draw(st.sampled_from(
            [c for c in self.clients if c.instance_id and self.idle(c) and c.member_id] or [None]))
        if client is None:
            return
        self.zombies.append(client)
        fresh = Client(client.name + "+", client.instance_id)
        fresh.last_request_ms = self.now_ms
        self.clients[self.clients.index(client)] = fresh

    @rule(data=st.data())
    def zombie_heartbeat(self, data):
        zombie = data.draw(st.sampled_from([z for z in self.zombies if z.parked is None] or [None]))
        if zombie is None:
            return
        holder = self.static_holder(self.coordinator.describe(GROUP), zombie.instance_id)
        error = self.coordinator.heartbeat(self.now_ms, group_id=GROUP, generation_id=zombie.generation,
                                           member_id=zombie.member_id, group_instance_id=zombie.instance_id)
        if holder is None:
            assert error == ErrorCode.unknown_member_id, error
        elif holder.member_id != zombie.member_id:
            assert error == ErrorCode.fenced_instance_id, error
        else:
            zombie.last_request_ms = self.now_ms  # not replaced yet: still the member, and alive
        self.drain()

    @rule(data=st.data())
    def admin_remove(self, data):
        """``removeMembersFromConsumerGroup``: LeaveGroup naming only an instance id."""
        instance_id = data.draw(st.sampled_from(["static-2", "static-3"]))
        holder = self.static_holder(self.coordinator.describe(GROUP), instance_id)
        result = self.coordinator.leave_group(self.now_ms, group_id=GROUP, members=[("", instance_id)])
        expected = ErrorCode.none if holder is not None else ErrorCode.unknown_member_id
        assert result.members == (("", instance_id, expected),)
        assert self.static_holder(self.coordinator.describe(GROUP), instance_id) is None
        self.drain()

    @rule(data=st.data())
    def sync(self, data):
        client = data.draw(st.sampled_from([c for c in self.clients if self.idle(c) and c.member_id] or [None]))
        if client is None:
            return
        self.touch(client)
        assignments = assign(client.join_members) if client.leader and client.join_members else []
        waiter = self.park(client)
        result = self.coordinator.sync_group(
            self.now_ms, group_id=GROUP, generation_id=client.generation, member_id=client.member_id,
            group_instance_id=client.instance_id, assignments=assignments, waiter=waiter,
        )
        if result is not None:
            self.outstanding.pop(waiter)
            client.parked = None
            self.apply(client, result)
        self.drain()

    @rule(data=st.data())
    def heartbeat(self, data):
        client = data.draw(st.sampled_from([c for c in self.clients if self.idle(c) and c.member_id] or [None]))
        if client is None:
            return
        self.touch(client)
        error = self.coordinator.heartbeat(self.now_ms, group_id=GROUP, generation_id=client.generation,
                                           member_id=client.member_id, group_instance_id=client.instance_id)
        if error != ErrorCode.none:
            # Eager rebalance: any error means the client gives its partitions up.
            client.owned = None
            if error in (ErrorCode.unknown_member_id, ErrorCode.illegal_generation, ErrorCode.fenced_instance_id):
                client.member_id = ""
        self.drain()

    @rule(data=st.data())
    def commit(self, data):
        client = data.draw(st.sampled_from([c for c in self.clients if self.idle(c)] or [None]))
        if client is None:
            return
        self.touch(client)
        error = self.coordinator.validate_offset_commit(
            self.now_ms, group_id=GROUP, generation_id=client.generation, member_id=client.member_id,
            group_instance_id=client.instance_id,
        )
        snapshot = self.coordinator.describe(GROUP)
        if error == ErrorCode.none and client.member_id:
            assert any(m.member_id == client.member_id for m in snapshot.members)
            assert snapshot.generation_id == client.generation
        self.drain()

    @rule(data=st.data())
    def leave(self, data):
        client = data.draw(st.sampled_from([c for c in self.clients if self.idle(c) and c.member_id] or [None]))
        if client is None:
            return
        self.touch(client)
        result = self.coordinator.leave_group(self.now_ms, group_id=GROUP,
                                              members=[(client.member_id, client.instance_id)])
        assert len(result.members) == 1
        client.member_id, client.owned, client.generation = "", None, -1
        self.drain()
        assert all(m.member_id != result.members[0][0] for m in self.coordinator.describe(GROUP).members) \
            or result.members[0][2] != ErrorCode.none

    @rule(data=st.data())
    def crash(self, data):
        client = data.draw(st.sampled_from([c for c in self.clients if c.alive] or [None]))
        if client is None:
            return
        client.alive = False
        client.crashed_at_ms = client.last_request_ms
        client.crashed_parked = client.parked is not None

    @rule(data=st.data())
    def restart(self, data):
        """A crashed process comes back: a fresh client, with the same group.instance.id if it had one."""
        client = data.draw(st.sampled_from([c for c in self.clients if not c.alive] or [None]))
        if client is None:
            return
        self.ghosts = getattr(self, "ghosts", [])
        self.ghosts.append(client)
        fresh = Client(client.name + "'", client.instance_id)
        fresh.last_request_ms = self.now_ms
        self.clients[self.clients.index(client)] = fresh

    @rule(ms=st.sampled_from([1, 50, 500, 2_000, 6_000, 11_000, 16_000]))
    def advance(self, ms):
        # The shell's timer fires at each deadline in turn, not once at the end of the interval.
        target = self.now_ms + ms
        while True:
            deadline = self.coordinator.next_deadline_ms()
            if deadline is None or deadline > target:
                break
            self.now_ms = max(self.now_ms, deadline)
            self.drain()
        self.now_ms = target
        self.drain()

    # --- invariants ------------------------------------------------------------------------------------

    @invariant()
    def current_members_hold_leader_assignment(self):
        if not hasattr(self, "coordinator"):
            return
        snapshot = self.coordinator.describe(GROUP)
        if snapshot.state is not GroupState.STABLE:
            return
        by_id = {m.member_id: m for m in snapshot.members}
        seen: set[int] = set()
        for client in self.clients:
            if client.owned is None:
                continue
            generation, member_id, partitions = client.owned
            if member_id in by_id and generation == snapshot.generation_id:
                assert by_id[member_id].assignment == partitions
                assert not (seen & set(partitions)), "a partition owned twice in one generation"
                seen |= set(partitions)

    @invariant()
    def silent_members_leave(self):
        if not hasattr(self, "coordinator"):
            return
        present = {m.member_id for m in self.coordinator.describe(GROUP).members}
        for client in self.clients + getattr(self, "ghosts", []):
            if client.alive or not client.member_id:
                continue
            bound = SESSION_MS + (2 * REBALANCE_MS if client.crashed_parked else 0)
            if self.now_ms >= client.crashed_at_ms + bound:
                assert client.member_id not in present, (
                    f"{client.name} silent since {client.crashed_at_ms} still a member at {self.now_ms}"
                )

    @invariant()
    def state_agrees_with_membership(self):
        if not hasattr(self, "coordinator"):
            return
        snapshot = self.coordinator.describe(GROUP)
        assert snapshot.generation_id >= self.last_generation or snapshot.state is GroupState.DEAD
        self.last_generation = max(self.last_generation, snapshot.generation_id)
        if snapshot.state is GroupState.EMPTY:
            assert not snapshot.members
        if snapshot.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            assert snapshot.members
            assert snapshot.leader_id in {m.member_id for m in snapshot.members}
        deadline = self.coordinator.next_deadline_ms()
        assert deadline is None or deadline > self.now_ms, "tick left a deadline in the past"

    def teardown(self):
        if not hasattr(self, "coordinator"):
            return
        # Everyone stops: within the longest bound every parked request is answered and the group empties.
        for client in self.clients + self.zombies:
            client.alive = False
        for _ in range(10):
            self.advance(SESSION_MS + 2 * REBALANCE_MS)
        assert not self.outstanding, f"parked requests never answered: {sorted(self.outstanding)}"
        snapshot = self.coordinator.describe(GROUP)
        assert snapshot.state in (GroupState.EMPTY, GroupState.DEAD)
        assert self.coordinator.next_deadline_ms() is None


GroupMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestGroupStateMachine = GroupMachine.TestCase
