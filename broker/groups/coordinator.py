"""The classic consumer-group protocol as a pure, synchronous state machine (Kafka's GroupCoordinator).

This module owns group membership: who is in each group, which generation the group is at, which protocol it
runs, who leads it, and which assignment the leader handed to each member. It owns no sockets, no timers
and no storage: every call takes ``now_ms``, requests that Kafka parks (a JoinGroup waiting for the join
window, a SyncGroup waiting for the leader) are parked here against an opaque ``waiter`` token chosen by the
caller, and their answers come out of :meth:`GroupCoordinator.take_completions`. The asyncio shell
(``broker.handlers.groups``) calls :meth:`GroupCoordinator.tick` at :meth:`GroupCoordinator.next_deadline_ms`,
which is how the join window, the rebalance timeout and session expiry happen.

States (Kafka ``GroupState``)::

    Empty ──join──▶ PreparingRebalance ──all joined / window closes──▶ CompletingRebalance ──leader syncs──▶ Stable
      ▲                   ▲   │ (no member left)                              │                          │
      └───────────────────┼───┘                                               │                          │
                          └─────── join with new metadata, leave, expiry ─────┴──────────────────────────┘
    Dead: the group no longer exists (offsets expired); only ever reported, never stored.

Rules kept from Kafka (``GroupCoordinator.scala``, ``GroupMetadata.scala``, KIP-394, KIP-345):

- JoinGroup v4+ with an empty member id gets MEMBER_ID_REQUIRED and a fresh id; the member is *pending*
  until it joins with that id or its session timeout passes, and a pending member holds the join phase open.
- A new group waits ``initial_rebalance_delay_ms`` (3 s) for more members, extended by the same amount each
  time a member arrives, for at most the rebalance timeout. A rebalance of a running group completes as
  soon as every known member has rejoined, or at the rebalance timeout, when the silent ones are removed.
- The protocol is the one every member supports that most members prefer first; a member that shares no
  protocol with the group gets INCONSISTENT_GROUP_PROTOCOL.
- After the join phase every member must send SyncGroup within the rebalance timeout; one that does not is
  removed and the group rebalances again (Kafka 3.x ``pendingSyncMembers``).
- A member that is neither joining nor syncing must heartbeat within its session timeout, or it is removed and
  the group rebalances: a member that stopped heartbeating never holds partitions past its session timeout.
- Static members (KIP-345, ``group.instance.id``): one rejoining with no member id takes over its old
  member's place (a fresh member id) and, when the group is Stable and the protocol the group would select
  stays the same, its assignment, without a rebalance, even when it led the group or its metadata changed
  (Kafka ``updateStaticMemberAndRebalance``). The old member id is fenced: its parked requests and every
  later one naming the instance id get FENCED_INSTANCE_ID. In CompletingRebalance the rejoin starts a new
  rebalance (the leader may be assigning to the old id); in PreparingRebalance it is one more join. A static
  member is not removed when its client closes (librdkafka and the Java client send no LeaveGroup for it),
  only by its session timeout or a LeaveGroup naming it, as an admin's ``removeMembersFromConsumerGroup``
  does by instance id alone.
"""

from __future__ import annotations

import enum
import functools
import heapq
import uuid
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from kio.schema.errors import ErrorCode

__all__ = [
    "GroupConfig",
    "GroupState",
    "JoinResult",
    "SyncResult",
    "LeaveResult",
    "MemberSnapshot",
    "GroupSnapshot",
    "GroupCoordinator",
    "CONSUMER_PROTOCOL_TYPE",
]

CONSUMER_PROTOCOL_TYPE = "consumer"

# The caller's token for a parked request (the asyncio shell's futures; the pure tests' plain values): opaque
# here, handed back as it came in ``take_completions``.
W = TypeVar("W", bound=Hashable)


@dataclass(frozen=True)
class GroupConfig:
    """Coordinator settings, Kafka's broker config names in comments."""

    min_session_timeout_ms: int = 6_000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3_000  # group.initial.rebalance.delay.ms
    max_size: int | None = None  # group.max.size (None = unlimited)


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True)
class JoinResult:
    error: ErrorCode
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    # (member_id, group_instance_id, metadata) for the leader, empty for everyone else.
    members: tuple[tuple[str, str | None, bytes], ...] = ()


@dataclass(frozen=True)
class SyncResult:
    error: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True)
class LeaveResult:
    error: ErrorCode
    # (member_id, group_instance_id, error) per leaving member, in request order.
    members: tuple[tuple[str, str | None, ErrorCode], ...] = ()


@dataclass(frozen=True)
class MemberSnapshot:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    metadata: bytes  # the member's metadata for the group's protocol (b"" when none is chosen yet)
    assignment: bytes
    protocols: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class GroupSnapshot:
    """What DescribeGroups shows, and what the offsets store persists as a group metadata record."""

    group_id: str
    state: GroupState
    generation_id: int
    protocol_type: str | None
    protocol_name: str | None
    leader_id: str | None
    state_timestamp_ms: int
    members: tuple[MemberSnapshot, ...] = ()


class _Member(Generic[W]):
    __slots__ = (
        "member_id",
        "group_instance_id",
        "client_id",
        "client_host",
        "session_timeout_ms",
        "rebalance_timeout_ms",
        "protocol_type",
        "protocols",
        "assignment",
        "join_waiter",
        "sync_waiter",
        "heartbeat_deadline_ms",
    )

    def __init__(self, member_id, group_instance_id, client_id, client_host, session_timeout_ms,
                 rebalance_timeout_ms, protocol_type, protocols):
        self.member_id: str = member_id
        self.group_instance_id: str | None = group_instance_id
        self.client_id: str = client_id
        self.client_host: str = client_host
        self.session_timeout_ms: int = session_timeout_ms
        self.rebalance_timeout_ms: int = rebalance_timeout_ms
        self.protocol_type: str = protocol_type
        self.protocols: tuple[tuple[str, bytes], ...] = protocols
        self.assignment: bytes = b""
        self.join_waiter: W | None = None
        self.sync_waiter: W | None = None
        self.heartbeat_deadline_ms: int = 0

    @property
    def awaiting_join(self) -> bool:
        return self.join_waiter is not None

    def metadata_for(self, protocol_name: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol_name:
                return metadata
        return b""


class _Group(Generic[W]):
    __slots__ = (
        "group_id",
        "state",
        "state_timestamp_ms",
        "generation_id",
        "protocol_type",
        "protocol_name",
        "leader_id",
        "members",
        "pending_members",
        "static_members",
        "pending_sync",
        "join_deadline_ms",
        "join_remaining_ms",
        "initial_join",
        "new_member_added",
        "sync_deadline_ms",
        "scheduled_ms",
        "storing_generation",
    )

    def __init__(self, group_id: str, now_ms: int):
        self.group_id = group_id
        self.state = GroupState.EMPTY
        self.state_timestamp_ms = now_ms
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, _Member[W]] = {}
        # member id -> session deadline, for ids handed out with MEMBER_ID_REQUIRED and not yet used.
        self.pending_members: dict[str, int] = {}
        self.static_members: dict[str, str] = {}  # group.instance.id -> member id
        self.pending_sync: set[str] = set()
        self.join_deadline_ms: int | None = None
        self.join_remaining_ms = 0
        self.initial_join = False
        self.new_member_added = False
        self.sync_deadline_ms: int | None = None
        self.scheduled_ms: int | None = None  # the deadline this group has in the coordinator's heap
        # The generation whose assignment the shell is storing (the leader synced; the members wait).
        self.storing_generation: int | None = None

    def next_deadline_ms(self) -> int | None:
        """The earliest deadline of this group. O(members)."""
        deadlines = []
        if self.join_deadline_ms is not None:
            deadlines.append(self.join_deadline_ms)
        if self.sync_deadline_ms is not None and self.pending_sync:
            deadlines.append(self.sync_deadline_ms)
        deadlines.extend(self.pending_members.values())
        for member in self.members.values():
            if _session_applies(self, member):
                deadlines.append(member.heartbeat_deadline_ms)
        return min(deadlines, default=None)

    def transition(self, state: GroupState, now_ms: int) -> None:
        self.state = state
        self.state_timestamp_ms = now_ms

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def all_members_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def candidate_protocols(self) -> set[str] | None:
        """Protocols every member supports; None when there is no member."""
        candidates: set[str] | None = None
        for member in self.members.values():
            names = {name for name, _ in member.protocols}
            candidates = names if candidates is None else candidates & names
        return candidates

    def supports(self, protocol_type: str, protocols: tuple[tuple[str, bytes], ...]) -> bool:
        if not protocol_type or not protocols:
            return False
        if not self.members:
            return True
        candidates = self.candidate_protocols() or set()
        return protocol_type == self.protocol_type and bool(candidates & {name for name, _ in protocols})

    def select_protocol(self) -> str:
        # Every member votes for its most preferred protocol among those all support; most votes wins, and
        # ties go to the order of the first member's preferences (Kafka breaks them arbitrarily).
        candidates = self.candidate_protocols() or set()
        votes: dict[str, int] = {}
        for member in self.members.values():
            for name, _ in member.protocols:
                if name in candidates:
                    votes[name] = votes.get(name, 0) + 1
                    break
        first = next(iter(self.members.values()))
        order = [name for name, _ in first.protocols if name in candidates]
        return max(order, key=lambda name: (votes.get(name, 0), -order.index(name)))


def _session_applies(group: _Group[W], member: _Member[W]) -> bool:
    # A member waiting in JoinGroup is bounded by the join deadline, one waiting in SyncGroup by the sync
    # deadline or the leader's sync; every other member must heartbeat within its session timeout.
    if member.awaiting_join and group.state is GroupState.PREPARING_REBALANCE:
        return False
    return member.sync_waiter is None or group.state is not GroupState.COMPLETING_REBALANCE


def _reschedules(method):
    """Re-arm the group's deadline after a public operation on it, however the operation returns."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        finally:
            group = self._groups.get(kwargs["group_id"])
            if group is not None:
                self._schedule(group)

    return wrapper


def _default_member_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4()}"


class GroupCoordinator(Generic[W]):
    """Every group of this broker. Synchronous and single-threaded: call it from the loop thread only.

    Args:
        config: timeouts and limits.
        member_id_factory: makes a member id from a prefix (client id, or group.instance.id for static
            members); Kafka's is ``prefix-UUID``. Tests inject a deterministic one.
    """

    def __init__(self, config: GroupConfig = GroupConfig(),
                 member_id_factory: Callable[[str], str] = _default_member_id, *,
                 store_assignments: bool = False, wall_clock_ms: Callable[[], int] | None = None) -> None:
        self.config = config
        # With ``store_assignments``, a leader's SyncGroup completes the rebalance only once the shell has
        # stored the group's assignment (``assignment_stored``); without it, at once (the pure tests' model).
        self.store_assignments = store_assignments
        # ``now_ms`` arguments run on a monotonic clock (deadlines); the timestamps a group keeps (persisted,
        # compared across restarts) come from this wall clock when given, else from ``now_ms``.
        self._wall_clock_ms = wall_clock_ms
        self._groups: dict[str, _Group[W]] = {}
        self._completions: list[tuple[W, JoinResult | SyncResult]] = []
        self._changed: dict[str, None] = {}  # groups to persist (ordered set)
        self._new_member_id = member_id_factory
        self._heap: list[tuple[int, str]] = []
        # "inactive" until started (COORDINATOR_NOT_AVAILABLE), "loading" while committed state is read
        # back from __consumer_offsets (COORDINATOR_LOAD_IN_PROGRESS), then "active".
        self.status = "active"

    # --- outputs for the shell -----------------------------------------------------------------------

    def take_completions(self) -> list[tuple[W, JoinResult | SyncResult]]:
        """Answers for parked requests, as ``(waiter, result)``, in the order they were decided."""
        completions, self._completions = self._completions, []
        return completions

    def take_changed_groups(self) -> list[GroupSnapshot]:
        """Snapshots of groups that became Stable or Empty since the last call (to persist)."""
        changed, self._changed = self._changed, {}
        return [self.describe(group_id) for group_id in changed]

    def next_deadline_ms(self) -> int | None:
        """The earliest time :meth:`tick` has work to do, or None when nothing is scheduled.

        A heap of (deadline, group id) with lazy deletion: O(log groups) amortized, so a broker with many
        groups does not rescan every member after every request.
        """
        while self._heap:
            deadline_ms, group_id = self._heap[0]
            group = self._groups.get(group_id)
            if group is not None and group.scheduled_ms == deadline_ms:
                return deadline_ms
            heapq.heappop(self._heap)
        return None

    def _schedule(self, group: _Group[W]) -> None:
        """Recompute ``group``'s earliest deadline after a change to it. O(members of the group)."""
        deadline_ms = group.next_deadline_ms() if self._groups.get(group.group_id) is group else None
        if deadline_ms != group.scheduled_ms:
            group.scheduled_ms = deadline_ms
            if deadline_ms is not None:
                heapq.heappush(self._heap, (deadline_ms, group.group_id))

    def tick(self, now_ms: int) -> None:
        """Run every deadline that has passed: join windows, sync timeouts, session and pending expiries.

        Repeats until no deadline at or before ``now_ms`` is left (an expiry can start a rebalance whose
        deadline has passed too). Each round removes a deadline or moves it past ``now_ms``.
        """
        while True:
            deadline_ms = self.next_deadline_ms()
            if deadline_ms is None or deadline_ms > now_ms:
                return
            _, group_id = heapq.heappop(self._heap)
            group = self._groups[group_id]
            group.scheduled_ms = None
            self._tick_group(group, now_ms)
            self._schedule(group)

    def _tick_group(self, group: _Group[W], now_ms: int) -> None:
        for member_id, deadline_ms in list(group.pending_members.items()):
            if deadline_ms <= now_ms:
                del group.pending_members[member_id]
                if group.state is GroupState.PREPARING_REBALANCE:
                    self._maybe_complete_join(group, now_ms)
        if group.join_deadline_ms is not None and group.join_deadline_ms <= now_ms:
            self._on_join_deadline(group, group.join_deadline_ms, now_ms)
        if group.sync_deadline_ms is not None and group.sync_deadline_ms <= now_ms:
            group.sync_deadline_ms = None
            late, group.pending_sync = list(group.pending_sync), set()
            if late and group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
                for member_id in late:
                    self._remove_member(group, group.members[member_id], now_ms)
                self._after_member_removed(group, now_ms)
        expired = [m for m in group.members.values()
                   if _session_applies(group, m) and m.heartbeat_deadline_ms <= now_ms]
        for member in expired:
            self._remove_member(group, member, now_ms)
        if expired:
            self._after_member_removed(group, now_ms)

    # --- JoinGroup ------------------------------------------------------------------------------------

    @_reschedules
    def join_group(self, now_ms: int, *, group_id: str, member_id: str, group_instance_id: str | None,
                   protocol_type: str, protocols: Iterable[tuple[str, bytes]], session_timeout_ms: int,
                   rebalance_timeout_ms: int, require_known_member_id: bool, waiter: W,
                   client_id: str = "", client_host: str = "") -> JoinResult | None:
        """Handle JoinGroup. Returns the answer now, or None when the request is parked on ``waiter``.

        Args:
            require_known_member_id: True for JoinGroup v4+ (KIP-394): an empty member id gets
                MEMBER_ID_REQUIRED and a fresh id instead of joining.
            rebalance_timeout_ms: v0 has none; pass the session timeout as Kafka does.
        """
        protocols = tuple((str(name), bytes(metadata)) for name, metadata in protocols)
        error = self._status_error()
        if error is not None:
            return JoinResult(error, member_id)
        if not group_id:
            return JoinResult(ErrorCode.invalid_group_id, member_id)
        if not (max(self.config.min_session_timeout_ms, 1) <= session_timeout_ms
                <= self.config.max_session_timeout_ms):
            return JoinResult(ErrorCode.invalid_session_timeout, member_id)
        if not protocol_type or not protocols:
            return JoinResult(ErrorCode.inconsistent_group_protocol, member_id)
        group = self._groups.get(group_id)
        if group is None:
            if member_id:
                # Kafka: a member id can only come from this coordinator; the group is gone.
                return JoinResult(ErrorCode.unknown_member_id, member_id)
            group = self._groups[group_id] = _Group(group_id, self._stamp(now_ms))
        if not group.supports(protocol_type, protocols):
            return JoinResult(ErrorCode.inconsistent_group_protocol, member_id)

        if not member_id:
            if group_instance_id is not None and group_instance_id in group.static_members:
                return self._rejoin_static_member(group, now_ms, group_instance_id, protocols,
                                                  session_timeout_ms, rebalance_timeout_ms, waiter,
                                                  client_id, client_host)
            if self.config.max_size is not None and \
                    len(group.members) + len(group.pending_members) >= self.config.max_size:
                return JoinResult(ErrorCode.group_max_size_reached, member_id)
            new_member_id = self._new_member_id(group_instance_id or client_id or "member")
            if require_known_member_id and group_instance_id is None:
                group.pending_members[new_member_id] = now_ms + session_timeout_ms
                return JoinResult(ErrorCode.member_id_required, new_member_id)
            self._add_member_and_rebalance(group, now_ms, new_member_id, group_instance_id, protocol_type,
                                           protocols, session_timeout_ms, rebalance_timeout_ms, waiter, client_id,
                                           client_host)
            return None  # a new member always waits for the join phase to end

        if member_id in group.pending_members:
            del group.pending_members[member_id]
            self._add_member_and_rebalance(group, now_ms, member_id, group_instance_id, protocol_type, protocols,
                                           session_timeout_ms, rebalance_timeout_ms, waiter, client_id, client_host)
            return None
        fenced = self._fencing_error(group, member_id, group_instance_id)
        if fenced is not None:
            return JoinResult(fenced, member_id)
        member = group.members.get(member_id)
        if member is None:
            return JoinResult(ErrorCode.unknown_member_id, member_id)

        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.heartbeat_deadline_ms = now_ms + session_timeout_ms
        if group.state is GroupState.PREPARING_REBALANCE:
            self._update_member(group, member, protocols, waiter)
            self._maybe_complete_join(group, now_ms)
            return None
        if group.state is GroupState.COMPLETING_REBALANCE:
            if member.protocols == protocols:
                # A retried join of the current generation: answer it again (Kafka does the same).
                return self._join_result(group, member)
            self._update_member(group, member, protocols, waiter)
            self._prepare_rebalance(group, now_ms)
            return None
        if group.state is GroupState.STABLE:
            if member_id == group.leader_id or member.protocols != protocols:
                # The leader rejoining, or new subscriptions: everyone must learn the new metadata.
                self._update_member(group, member, protocols, waiter)
                self._prepare_rebalance(group, now_ms)
                return None
            return self._join_result(group, member)
        return JoinResult(ErrorCode.unknown_member_id, member_id)  # Empty: no member can be known

    def _add_member_and_rebalance(self, group: _Group[W], now_ms, member_id, group_instance_id, protocol_type,
                                  protocols, session_timeout_ms, rebalance_timeout_ms, waiter, client_id,
                                  client_host) -> None:
        """A member joins (a new one, or a pending one with its id): parked on ``waiter`` until the join phase
        of the rebalance it starts (or joins) ends."""
        member: _Member[W] = _Member(member_id, group_instance_id, client_id, client_host, session_timeout_ms,
                                     rebalance_timeout_ms, protocol_type, protocols)
        member.join_waiter = waiter
        member.heartbeat_deadline_ms = now_ms + session_timeout_ms
        if not group.members:
            group.protocol_type = protocol_type
        group.members[member_id] = member
        if group_instance_id is not None:
            group.static_members[group_instance_id] = member_id
        if group.leader_id is None:
            group.leader_id = member_id
        group.new_member_added = True
        if group.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group, now_ms)
        else:
            self._prepare_rebalance(group, now_ms)

    def _rejoin_static_member(self, group: _Group[W], now_ms, group_instance_id, protocols, session_timeout_ms,
                              rebalance_timeout_ms, waiter, client_id, client_host) -> JoinResult | None:
        old_member_id = group.static_members[group_instance_id]
        old = group.members[old_member_id]
        new_member_id = self._new_member_id(group_instance_id)
        # The old incarnation is fenced: whatever it had parked fails, and its id stops working.
        if old.join_waiter is not None:
            self._completions.append((old.join_waiter, JoinResult(ErrorCode.fenced_instance_id, old_member_id)))
            old.join_waiter = None
        if old.sync_waiter is not None:
            self._completions.append((old.sync_waiter, SyncResult(ErrorCode.fenced_instance_id)))
            old.sync_waiter = None
        del group.members[old_member_id]
        old.member_id = new_member_id
        old.client_id, old.client_host = client_id, client_host
        old.session_timeout_ms, old.rebalance_timeout_ms = session_timeout_ms, rebalance_timeout_ms
        old.heartbeat_deadline_ms = now_ms + session_timeout_ms
        group.members[new_member_id] = old
        group.static_members[group_instance_id] = new_member_id
        if group.pending_sync and old_member_id in group.pending_sync:
            group.pending_sync.discard(old_member_id)
            group.pending_sync.add(new_member_id)
        current_leader = group.leader_id
        if current_leader == old_member_id:
            group.leader_id = new_member_id
        if group.state is GroupState.STABLE:
            old.protocols = protocols
            if group.select_protocol() == group.protocol_name:
                # KIP-345: a static member's restart keeps the generation and its assignment; it syncs and
                # gets the assignment back without the group rebalancing, whatever its new metadata says (a
                # restarted consumer no longer lists the partitions it owned). Kafka answers with the leader
                # id from before the replacement, so a restarted leader does not see itself as leader and
                # compute an assignment that a Stable group would never hand out (JoinGroup < v9).
                self._changed[group.group_id] = None
                return JoinResult(ErrorCode.none, new_member_id, group.generation_id, group.protocol_type,
                                  group.protocol_name, current_leader or "", ())
        self._update_member(group, old, protocols, waiter)
        if group.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group, now_ms)
        else:
            self._prepare_rebalance(group, now_ms)
        return None

    def _update_member(self, group: _Group[W], member: _Member[W], protocols, waiter: W) -> None:
        member.protocols = protocols
        if member.join_waiter is not None and member.join_waiter != waiter:
            # The client retried (typically on a new connection after a timeout): the old request is moot.
            self._completions.append((member.join_waiter, JoinResult(ErrorCode.rebalance_in_progress,
                                                                     member.member_id)))
        member.join_waiter = waiter

    def _join_result(self, group: _Group[W], member: _Member[W]) -> JoinResult:
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        if member.member_id == group.leader_id:
            members = tuple((m.member_id, m.group_instance_id, m.metadata_for(group.protocol_name))
                            for m in group.members.values())
        return JoinResult(ErrorCode.none, member.member_id, group.generation_id, group.protocol_type,
                          group.protocol_name, group.leader_id or "", members)

    def _prepare_rebalance(self, group: _Group[W], now_ms: int) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:
            # The assignment being handed out is void: fail every parked SyncGroup so clients rejoin.
            for member in group.members.values():
                member.assignment = b""
                if member.sync_waiter is not None:
                    self._completions.append((member.sync_waiter, SyncResult(ErrorCode.rebalance_in_progress)))
                    member.sync_waiter = None
        group.pending_sync.clear()
        group.sync_deadline_ms = None
        if group.state is GroupState.EMPTY:
            # A new group: wait for more members to arrive (KIP-134) instead of rebalancing once per member.
            delay_ms = self.config.initial_rebalance_delay_ms
            group.initial_join = True
            group.join_remaining_ms = max(group.rebalance_timeout_ms() - delay_ms, 0)
            group.new_member_added = False
        else:
            delay_ms = group.rebalance_timeout_ms()
            group.initial_join = False
        group.join_deadline_ms = now_ms + delay_ms
        group.transition(GroupState.PREPARING_REBALANCE, self._stamp(now_ms))
        if not group.initial_join:
            self._maybe_complete_join(group, now_ms)

    def _maybe_complete_join(self, group: _Group[W], now_ms: int) -> None:
        if group.state is GroupState.PREPARING_REBALANCE and not group.initial_join and group.all_members_joined():
            self._complete_join(group, now_ms)

    def _on_join_deadline(self, group: _Group[W], deadline_ms: int, now_ms: int) -> None:
        """The join window ending at ``deadline_ms`` (at or before ``now_ms``) closed: extend it for a member
        that arrived during it (a new group's initial delay), or complete the join phase."""
        delay_ms = min(self.config.initial_rebalance_delay_ms, group.join_remaining_ms)
        if group.initial_join and group.new_member_added and delay_ms > 0:
            group.join_remaining_ms -= delay_ms
            group.new_member_added = False
            # From the window's end, not from when the timer ran, so a late tick does not stretch it.
            group.join_deadline_ms = deadline_ms + delay_ms
            return
        self._complete_join(group, now_ms)

    def _complete_join(self, group: _Group[W], now_ms: int) -> None:
        group.join_deadline_ms = None
        group.initial_join = False
        for member in [m for m in group.members.values() if not m.awaiting_join]:
            # Silent through the whole rebalance timeout: out (Kafka ``onCompleteJoin``).
            self._remove_member(group, member, now_ms)
        group.generation_id += 1
        if not group.members:
            # The protocol type stays: it tells offset expiry this group used group management.
            group.protocol_name = None
            group.leader_id = None
            group.transition(GroupState.EMPTY, self._stamp(now_ms))
            self._changed[group.group_id] = None
            return
        group.protocol_name = group.select_protocol()
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.storing_generation = None
        group.transition(GroupState.COMPLETING_REBALANCE, self._stamp(now_ms))
        for member in group.members.values():
            waiter, member.join_waiter = member.join_waiter, None
            # Every member left is parked in JoinGroup: the silent ones were removed above.
            assert waiter is not None
            member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
            self._completions.append((waiter, self._join_result(group, member)))
        group.pending_sync = set(group.members)
        group.sync_deadline_ms = now_ms + group.rebalance_timeout_ms()

    # --- SyncGroup ------------------------------------------------------------------------------------

    @_reschedules
    def sync_group(self, now_ms: int, *, group_id: str, generation_id: int, member_id: str,
                   group_instance_id: str | None, assignments: Iterable[tuple[str, bytes]],
                   waiter: W, protocol_type: str | None = None,
                   protocol_name: str | None = None) -> SyncResult | None:
        """Handle SyncGroup. Returns the answer now, or None when parked until the leader's assignment."""
        error = self._status_error()
        if error is not None:
            return SyncResult(error)
        if not group_id:
            return SyncResult(ErrorCode.invalid_group_id)
        group = self._groups.get(group_id)
        if group is None:
            return SyncResult(ErrorCode.unknown_member_id)
        error = self._member_generation_error(group, member_id, group_instance_id, generation_id)
        if error is not None:
            return SyncResult(error)
        member = group.members[member_id]
        if (protocol_type is not None and protocol_type != group.protocol_type) or \
                (protocol_name is not None and protocol_name != group.protocol_name):
            return SyncResult(ErrorCode.inconsistent_group_protocol)
        if group.state is GroupState.PREPARING_REBALANCE:
            return SyncResult(ErrorCode.rebalance_in_progress)
        group.pending_sync.discard(member_id)
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        if group.state is GroupState.STABLE:
            return self._sync_result(group, member)
        # CompletingRebalance.
        if member.sync_waiter is not None and member.sync_waiter != waiter:
            self._completions.append((member.sync_waiter, SyncResult(ErrorCode.rebalance_in_progress)))
        member.sync_waiter = waiter
        if member_id == group.leader_id and group.storing_generation != group.generation_id:
            given = {}
            for target, assignment in assignments:
                given[str(target)] = bytes(assignment)
            for m in group.members.values():
                # Members the leader left out get an empty assignment (Kafka does the same).
                m.assignment = given.get(m.member_id, b"")
            self._changed[group.group_id] = None
            if self.store_assignments:
                # Kafka's ``doSyncGroup``: the group stays CompletingRebalance, and every member's SyncGroup
                # waits, until the assignment is stored; a coordinator that cannot store it (cut off, deposed)
                # never hands it out, so a successor that loads the group never lacks an assignment members
                # act on.
                group.storing_generation = group.generation_id
                return None
            self._complete_sync(group, now_ms)
        return None

    def _complete_sync(self, group: _Group[W], now_ms: int) -> None:
        group.transition(GroupState.STABLE, self._stamp(now_ms))
        for m in group.members.values():
            if m.sync_waiter is not None:
                self._completions.append((m.sync_waiter, self._sync_result(group, m)))
                m.sync_waiter = None

    @_reschedules
    def assignment_stored(self, now_ms: int, *, group_id: str, generation_id: int,
                          error: ErrorCode = ErrorCode.none) -> None:
        """The shell's answer for the assignment of ``generation_id`` (``store_assignments``): stored (the
        group becomes Stable and every parked SyncGroup gets its assignment), or not (``error``: every
        parked SyncGroup gets it, and the group rebalances, as Kafka's ``resetAndPropagateAssignmentError``).
        An answer for a generation the group has left behind is ignored."""
        group = self._groups.get(group_id)
        if group is None or group.storing_generation != generation_id or group.generation_id != generation_id \
                or group.state is not GroupState.COMPLETING_REBALANCE:
            return
        group.storing_generation = None
        if error == ErrorCode.none:
            self._complete_sync(group, now_ms)
            return
        for m in group.members.values():
            m.assignment = b""
            if m.sync_waiter is not None:
                self._completions.append((m.sync_waiter, SyncResult(error)))
                m.sync_waiter = None
        self._prepare_rebalance(group, now_ms)

    def storing(self, group_id: str) -> int | None:
        """The generation whose assignment awaits ``assignment_stored``, if any."""
        group = self._groups.get(group_id)
        return group.storing_generation if group is not None else None

    def _sync_result(self, group: _Group[W], member: _Member[W]) -> SyncResult:
        return SyncResult(ErrorCode.none, member.assignment, group.protocol_type, group.protocol_name)

    # --- Heartbeat, LeaveGroup, OffsetCommit validation -------------------------------------------------

    @_reschedules
    def heartbeat(self, now_ms: int, *, group_id: str, generation_id: int, member_id: str,
                  group_instance_id: str | None = None) -> ErrorCode:
        """Handle Heartbeat; refreshes the member's session deadline when the member is known."""
        error = self._status_error()
        if error is not None:
            return error
        if not group_id:
            return ErrorCode.invalid_group_id
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        error = self._member_generation_error(group, member_id, group_instance_id, generation_id)
        if error is not None:
            return error
        member = group.members[member_id]
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    @_reschedules
    def leave_group(self, now_ms: int, *, group_id: str,
                    members: Iterable[tuple[str, str | None]]) -> LeaveResult:
        """Handle LeaveGroup (v3+ batch form; v0-2 pass one ``(member_id, None)``)."""
        members = list(members)
        error = self._status_error()
        if error is None and not group_id:
            error = ErrorCode.invalid_group_id
        if error is not None:
            return LeaveResult(error, tuple((m, i, error) for m, i in members))
        group = self._groups.get(group_id)
        if group is None:
            return LeaveResult(ErrorCode.none, tuple((m, i, ErrorCode.unknown_member_id) for m, i in members))
        results = []
        removed = False
        for requested_id, group_instance_id in members:
            # Each answer echoes the member id as requested (Kafka ``memberLeaveError``).
            member_id = requested_id
            if group_instance_id is not None and not member_id:
                # Admin removal by instance id (KIP-345 ``removeMembersFromConsumerGroup``).
                member_id = group.static_members.get(group_instance_id, "")
            if member_id in group.pending_members:
                del group.pending_members[member_id]
                results.append((requested_id, group_instance_id, ErrorCode.none))
                continue
            fenced = self._fencing_error(group, member_id, group_instance_id)
            member = group.members.get(member_id)
            if fenced is not None:
                results.append((requested_id, group_instance_id, fenced))
            elif member is None:
                results.append((requested_id, group_instance_id, ErrorCode.unknown_member_id))
            else:
                self._remove_member(group, member, now_ms)
                removed = True
                results.append((requested_id, group_instance_id, ErrorCode.none))
        if removed:
            self._after_member_removed(group, now_ms)
        elif group.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group, now_ms)
        return LeaveResult(ErrorCode.none, tuple(results))

    @_reschedules
    def validate_offset_commit(self, now_ms: int, *, group_id: str, generation_id: int, member_id: str,
                               group_instance_id: str | None = None) -> ErrorCode:
        """May this member commit offsets for this group now? Creates an Empty group for a standalone commit.

        Kafka ``handleCommitOffsets``: generation -1 with no member is a commit from outside group
        management, allowed while the group has no members; otherwise the member must be known and at the
        current generation, and not in the middle of receiving its assignment.
        """
        error = self._status_error()
        if error is not None:
            return error
        group = self._groups.get(group_id)
        if group is None:
            if generation_id < 0:
                self._groups[group_id] = _Group(group_id, self._stamp(now_ms))
                return ErrorCode.none
            return ErrorCode.illegal_generation
        if generation_id < 0 and not member_id and group.state is GroupState.EMPTY:
            return ErrorCode.none
        error = self._member_generation_error(group, member_id, group_instance_id, generation_id)
        if error is not None:
            return error
        member = group.members[member_id]
        if group.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        return ErrorCode.none

    def validate_txn_offset_commit(self, *, group_id: str, generation_id: int, member_id: str,
                                   group_instance_id: str | None = None) -> ErrorCode:
        """May a transactional producer commit offsets for this group (TxnOffsetCommit, KIP-447)?

        Kafka's ``validateOffsetCommit`` with ``isTransactional``: a request naming a member or a generation
        (v3, the consumer's ``groupMetadata()``) must name a current member at the current generation, so a
        zombie whose consumer was fenced by a rebalance cannot commit (FENCED_INSTANCE_ID, UNKNOWN_MEMBER_ID,
        ILLEGAL_GENERATION); one naming neither (v0-2, or a producer outside group management), or naming
        generation -1 while the group is Empty, is accepted. Nothing changes: a transactional commit does not
        count as a heartbeat.
        """
        error = self._status_error()
        if error is not None:
            return error
        group = self._groups.get(group_id)
        if group is not None and group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        # Kafka creates an unknown group Empty first; generation -1 on an Empty group is a commit from
        # outside group management, whatever member id it names.
        empty = group is None or group.state is GroupState.EMPTY
        if generation_id < 0 and (empty or (not member_id and group_instance_id is None)):
            return ErrorCode.none
        if group is None:
            return ErrorCode.unknown_member_id  # no member of an Empty group can be current
        return self._member_generation_error(group, member_id, group_instance_id, generation_id) or ErrorCode.none

    def deactivate(self, error: ErrorCode = ErrorCode.coordinator_not_available) -> None:
        """Stop coordinating: every parked request fails with ``error`` (COORDINATOR_NOT_AVAILABLE on broker
        shutdown, NOT_COORDINATOR when the groups' partition moved to another broker)."""
        self.status = "inactive"
        for group in self._groups.values():
            for member in group.members.values():
                if member.join_waiter is not None:
                    self._completions.append((member.join_waiter, JoinResult(error, member.member_id)))
                    member.join_waiter = None
                if member.sync_waiter is not None:
                    self._completions.append((member.sync_waiter, SyncResult(error)))
                    member.sync_waiter = None

    # --- introspection and persistence --------------------------------------------------------------------

    def group_ids(self) -> list[str]:
        return list(self._groups)

    def has_group(self, group_id: str) -> bool:
        return group_id in self._groups

    def describe(self, group_id: str) -> GroupSnapshot:
        """The group as DescribeGroups shows it; a group that does not exist is Dead (as in Kafka)."""
        group = self._groups.get(group_id)
        if group is None:
            return GroupSnapshot(group_id, GroupState.DEAD, -1, None, None, None, 0)
        members = tuple(
            MemberSnapshot(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.session_timeout_ms,
                           m.rebalance_timeout_ms, m.metadata_for(group.protocol_name), m.assignment,
                           m.protocols)
            for m in group.members.values()
        )
        return GroupSnapshot(group.group_id, group.state, group.generation_id, group.protocol_type,
                             group.protocol_name, group.leader_id, group.state_timestamp_ms, members)

    def remove_group(self, group_id: str) -> bool:
        """Drop an Empty group (its offsets expired or were deleted). False if it has members."""
        group = self._groups.get(group_id)
        if group is None:
            return True
        if group.state is not GroupState.EMPTY or group.pending_members:
            return False
        del self._groups[group_id]
        self._changed.pop(group_id, None)
        return True

    def load_group(self, snapshot: GroupSnapshot, now_ms: int) -> None:
        """Restore a group persisted in __consumer_offsets (loading phase only).

        A group with members comes back Stable at its generation; each member must heartbeat within its
        session timeout from now, as Kafka does after moving a coordinator.
        """
        group: _Group[W] = _Group(snapshot.group_id, snapshot.state_timestamp_ms)
        group.generation_id = snapshot.generation_id
        group.protocol_type = snapshot.protocol_type
        group.protocol_name = snapshot.protocol_name
        if snapshot.members and snapshot.protocol_name:
            group.leader_id = snapshot.leader_id
            group.transition(GroupState.STABLE, self._stamp(now_ms))
            for s in snapshot.members:
                protocols = s.protocols or ((snapshot.protocol_name, s.metadata),)
                member: _Member[W] = _Member(s.member_id, s.group_instance_id, s.client_id, s.client_host,
                                             s.session_timeout_ms, s.rebalance_timeout_ms,
                                             snapshot.protocol_type or "", protocols)
                member.assignment = s.assignment
                member.heartbeat_deadline_ms = now_ms + s.session_timeout_ms
                group.members[s.member_id] = member
                if s.group_instance_id is not None:
                    group.static_members[s.group_instance_id] = s.member_id
            if group.leader_id not in group.members:
                group.leader_id = next(iter(group.members))
        self._groups[snapshot.group_id] = group
        self._schedule(group)

    # --- internals -----------------------------------------------------------------------------------------

    def _stamp(self, now_ms: int) -> int:
        return self._wall_clock_ms() if self._wall_clock_ms is not None else now_ms

    def _status_error(self) -> ErrorCode | None:
        if self.status == "active":
            return None
        if self.status == "loading":
            return ErrorCode.coordinator_load_in_progress
        return ErrorCode.coordinator_not_available

    def _member_generation_error(self, group, member_id: str, group_instance_id: str | None,
                                 generation_id: int) -> ErrorCode | None:
        """The error for a request naming a member and a generation (SyncGroup, Heartbeat, OffsetCommit),
        in Kafka's order: a fenced static instance, an unknown member, a stale generation; None if valid."""
        fenced = self._fencing_error(group, member_id, group_instance_id)
        if fenced is not None:
            return fenced
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        return None

    @staticmethod
    def _fencing_error(group: _Group[W], member_id: str, group_instance_id: str | None) -> ErrorCode | None:
        """FENCED_INSTANCE_ID when a static member's id is not the one the instance id now maps to."""
        if group_instance_id is None:
            return None
        current = group.static_members.get(group_instance_id)
        if current is None:
            return ErrorCode.unknown_member_id
        if current != member_id:
            return ErrorCode.fenced_instance_id
        return None

    def _remove_member(self, group: _Group[W], member: _Member[W], now_ms: int) -> None:
        """Take a member out; its parked requests fail with UNKNOWN_MEMBER_ID. Leaves the state alone."""
        if member.join_waiter is not None:
            self._completions.append((member.join_waiter, JoinResult(ErrorCode.unknown_member_id,
                                                                     member.member_id)))
            member.join_waiter = None
        if member.sync_waiter is not None:
            self._completions.append((member.sync_waiter, SyncResult(ErrorCode.unknown_member_id)))
            member.sync_waiter = None
        del group.members[member.member_id]
        group.pending_sync.discard(member.member_id)
        if member.group_instance_id is not None and \
                group.static_members.get(member.group_instance_id) == member.member_id:
            del group.static_members[member.group_instance_id]
        if group.leader_id == member.member_id:
            group.leader_id = next((m.member_id for m in group.members.values() if m.awaiting_join),
                                   next(iter(group.members), None))

    def _after_member_removed(self, group: _Group[W], now_ms: int) -> None:
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, now_ms)
        elif group.state is GroupState.PREPARING_REBALANCE:
            if not group.members and not group.pending_members:
                self._complete_join(group, now_ms)
            else:
                self._maybe_complete_join(group, now_ms)
