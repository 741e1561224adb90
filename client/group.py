"""The consumer's group membership: finding the coordinator, joining, syncing, heartbeats and leaving.

Owns ``GroupCoordinator`` (the connection to the group's coordinator, found with FindCoordinator and found
again when it moves: NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS or a lost
connection, as happens when the broker leading the group's ``__consumer_offsets`` partition dies) and
``GroupMembership`` (Kafka's classic protocol: JoinGroup v5, SyncGroup v3, Heartbeat v1, LeaveGroup v1).

The member runs a heartbeat task; a rebalance (REBALANCE_IN_PROGRESS, or a new member) makes it call
``before_rejoin`` (the consumer commits there), rejoin, and hand the new assignment to ``on_assigned``.
The group leader computes the assignment with the first strategy every member supports ("range" or
"roundrobin", Kafka's ConsumerProtocol, so Java/librdkafka/Python members can share the group). It does
not fetch and does not commit. Loop thread only.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time

from kio.schema.heartbeat.v1.request import HeartbeatRequest
from kio.schema.heartbeat.v1.response import HeartbeatResponse
from kio.schema.join_group.v5.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.join_group.v5.response import JoinGroupResponse
from kio.schema.leave_group.v1.request import LeaveGroupRequest
from kio.schema.leave_group.v1.response import LeaveGroupResponse
from kio.schema.sync_group.v3.request import SyncGroupRequest, SyncGroupRequestAssignment
from kio.schema.sync_group.v3.response import SyncGroupResponse
from kio.schema.types import GroupId
from kio.static.primitive import i32, i32Timedelta

from copyless.client.assignors import (
    ASSIGNORS,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from copyless.client.cluster import COORDINATOR_ERRORS, Cluster
from copyless.client.conn import Connection
from copyless.client.errors import ClientError, KafkaConnectionError, KafkaError, KafkaTimeoutError

__all__ = ["GroupCoordinator", "GroupMembership"]

log = logging.getLogger("copyless.client.consumer")

ILLEGAL_GENERATION = 22
UNKNOWN_MEMBER_ID = 25
REBALANCE_IN_PROGRESS = 27
MEMBER_ID_REQUIRED = 79


def _ms(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


class GroupCoordinator:
    """The connection to ``group_id``'s coordinator. Loop thread only."""

    def __init__(self, cluster: Cluster, group_id: str, retry_backoff_ms: int) -> None:
        self._cluster = cluster
        self.group_id = group_id
        self.retry_backoff_ms = retry_backoff_ms
        self._connection: Connection | None = None
        self.closed = False

    async def connection(self):
        """The coordinator's connection, looked up (FindCoordinator, retried) when unknown or lost."""
        if self._connection is None or self._connection.closed:
            self._connection = await self._cluster.coordinator(self.group_id)
        return self._connection

    def forget(self) -> None:
        """The coordinator moved or its connection failed: look it up again next time."""
        self._connection = None

    async def request(self, request, response_cls, check):
        """Send ``request`` to the coordinator and ``check(response)`` (raising ``KafkaError``).

        On a lost connection, a timeout or a coordinator error (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
        COORDINATOR_LOAD_IN_PROGRESS: the group's ``__consumer_offsets`` partition moved or is loading) the
        coordinator is looked up again and the request retried with backoff, for up to the request timeout
        (the Java consumer's commitSync retries the same way until default.api.timeout.ms). Other errors
        raise at once.
        """
        deadline = time.monotonic() + self._cluster.request_timeout_ms / 1000
        backoff = self.retry_backoff_ms / 1000
        error: ClientError  # the last failure, reported once the deadline passes
        while True:
            try:
                coordinator = await self.connection()
                response = await coordinator.request_kio(request, response_cls)
                check(response)
                return response
            except (KafkaConnectionError, KafkaTimeoutError) as exc:
                error = exc
            except KafkaError as exc:
                if exc.code not in COORDINATOR_ERRORS:
                    raise
                error = exc
            self.forget()
            if time.monotonic() + backoff > deadline or self.closed:
                raise error
            log.info("group %s: %s; finding the coordinator again", self.group_id, error)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)


# TOPIC_, GROUP_, CLUSTER_AUTHORIZATION_FAILED and SASL_AUTHENTICATION_FAILED: retrying cannot help.
FATAL_ERRORS = frozenset({29, 30, 31, 58})


class GroupMembership:
    """One member of a consumer group (see the module docstring).

    Args:
        cluster, coordinator: the consumer's ``Cluster`` and ``GroupCoordinator``.
        strategies: assignor names, preferred first.
        on_assigned: ``f([TopicPartition])``, called with each new assignment.
        before_rejoin: ``async f()`` called before rejoining a generation this member was part of, or None.
        session_timeout_ms, rebalance_timeout_ms, heartbeat_interval_ms, retry_backoff_ms: Kafka's settings.
    """

    def __init__(
        self,
        cluster: Cluster,
        coordinator: GroupCoordinator,
        *,
        strategies: tuple[str, ...],
        on_assigned,
        before_rejoin,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        heartbeat_interval_ms: int,
        retry_backoff_ms: int,
    ) -> None:
        self._cluster = cluster
        self.coordinator = coordinator
        self.group_id = coordinator.group_id
        self.strategies = strategies
        self._on_assigned = on_assigned
        self._before_rejoin = before_rejoin
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.subscription: set[str] = set()
        self.member_id = ""
        self.generation = -1
        self.rejoin_needed = False
        self.assignment_ready = asyncio.Event()
        self._joining: asyncio.Task | None = None
        self._heartbeat_task: asyncio.Task | None = None
        self._loop = asyncio.get_running_loop()
        self.closed = False
        # An error no retry can cure (GROUP_/TOPIC_AUTHORIZATION_FAILED, SASL_AUTHENTICATION_FAILED): the join
        # loop stops and the consumer raises it, as the Java consumer does.
        self.fatal_error: KafkaError | None = None
        self.failed = asyncio.Event()

    def subscribe(self, topics) -> None:
        self.subscription = set(topics)
        self.rejoin_needed = True
        self.ensure_joining()

    def ensure_joining(self) -> None:
        """Start the join loop if a (re)join is due and none is running."""
        if self.rejoin_needed and not self.closed and self.fatal_error is None and \
                (self._joining is None or self._joining.done()):
            self._joining = self._loop.create_task(self._join_loop())

    def close(self) -> None:
        self.closed = True
        self.coordinator.closed = True
        for task in (self._joining, self._heartbeat_task):
            if task is not None:
                task.cancel()

    async def _join_loop(self) -> None:
        backoff = self.retry_backoff_ms / 1000
        while self.rejoin_needed and not self.closed:
            try:
                await self._join_once()
                backoff = self.retry_backoff_ms / 1000
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if isinstance(exc, KafkaError) and exc.code in FATAL_ERRORS:
                    log.warning("joining group %s failed: %s", self.group_id, exc)
                    self.fatal_error = exc
                    self.failed.set()
                    return
                log.info("joining group %s failed: %s; retrying", self.group_id, exc)
                if isinstance(exc, KafkaError) and exc.code in COORDINATOR_ERRORS | {UNKNOWN_MEMBER_ID}:
                    self.coordinator.forget()
                if isinstance(exc, (KafkaConnectionError, KafkaTimeoutError)):
                    self.coordinator.forget()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _join_once(self) -> None:
        if self.generation >= 0 and self._before_rejoin is not None:
            await self._before_rejoin()
        self.assignment_ready.clear()
        topics = sorted(self.subscription)
        for topic in topics:
            try:
                await self._cluster.wait_for_topic(topic, timeout_ms=5000, allow_auto_create=True)
            except KafkaError:
                pass  # an unknown topic simply gets no partitions
        coordinator = await self.coordinator.connection()
        metadata = encode_subscription(topics)
        protocols = tuple(JoinGroupRequestProtocol(name=name, metadata=metadata) for name in self.strategies)
        while True:
            response = await coordinator.request_kio(
                JoinGroupRequest(
                    group_id=GroupId(self.group_id),
                    session_timeout=i32Timedelta.parse(_ms(self.session_timeout_ms)),
                    rebalance_timeout=i32Timedelta.parse(_ms(self.rebalance_timeout_ms)),
                    member_id=self.member_id,
                    group_instance_id=None,
                    protocol_type="consumer",
                    protocols=protocols,
                ),
                JoinGroupResponse,
            )
            code = int(response.error_code)
            if code == MEMBER_ID_REQUIRED:
                self.member_id = response.member_id
                continue
            if code in (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION):
                self.member_id = ""
                self.generation = -1
            if code != 0:
                raise KafkaError(code, f"JoinGroup {self.group_id}")
            break
        self.member_id = response.member_id
        generation = int(response.generation_id)
        assignments = ()
        if response.leader == response.member_id:
            assignments = await self._leader_assign(response)
        sync = await coordinator.request_kio(
            SyncGroupRequest(
                group_id=GroupId(self.group_id),
                generation_id=i32(generation),
                member_id=self.member_id,
                group_instance_id=None,
                assignments=assignments,
            ),
            SyncGroupResponse,
        )
        code = int(sync.error_code)
        if code != 0:
            if code in (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION):
                self.member_id = ""
            raise KafkaError(code, f"SyncGroup {self.group_id}")
        self.generation = generation
        self.rejoin_needed = False
        assigned = decode_assignment(sync.assignment)
        for topic in {tp.topic for tp in assigned}:
            if self._cluster.metadata.partition_count(topic) is None:
                await self._cluster.wait_for_topic(topic, allow_auto_create=False)
        self._on_assigned(assigned)
        self.assignment_ready.set()
        log.info("joined group %s generation %s as %s: %s", self.group_id, generation, self.member_id, assigned)
        if self._heartbeat_task is None or self._heartbeat_task.done():
            self._heartbeat_task = self._loop.create_task(self._heartbeat_loop())

    async def _leader_assign(self, response: JoinGroupResponse) -> tuple:
        subscriptions: dict[str, Subscription] = {}
        for member in response.members:
            try:
                subscriptions[member.member_id] = decode_subscription(member.metadata)
            except Exception as exc:
                log.warning("member %s sent unreadable subscription: %s", member.member_id, exc)
                subscriptions[member.member_id] = Subscription(())
        counts: dict[str, int] = {}
        for topic in sorted({t for s in subscriptions.values() for t in s.topics}):
            count = self._cluster.metadata.partition_count(topic)
            if count is None:
                try:
                    count = await self._cluster.wait_for_topic(topic, timeout_ms=5000, allow_auto_create=False)
                except KafkaError:
                    count = 0
            counts[topic] = count
        assignor = ASSIGNORS[response.protocol_name]
        plan = assignor(subscriptions, counts)
        return tuple(
            SyncGroupRequestAssignment(member_id=member, assignment=encode_assignment(partitions))
            for member, partitions in plan.items()
        )

    async def _heartbeat_loop(self) -> None:
        while not self.closed:
            await asyncio.sleep(self.heartbeat_interval_ms / 1000)
            if self.rejoin_needed or self.generation < 0:
                continue
            try:
                coordinator = await self.coordinator.connection()
                response = await coordinator.request_kio(
                    HeartbeatRequest(group_id=GroupId(self.group_id), generation_id=i32(self.generation),
                                     member_id=self.member_id),
                    HeartbeatResponse,
                )
                code = int(response.error_code)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("heartbeat failed: %s", exc)
                self.coordinator.forget()
                continue
            if code == 0:
                continue
            if code == REBALANCE_IN_PROGRESS:
                self.rejoin_needed = True
            elif code in (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION):
                self.member_id = "" if code == UNKNOWN_MEMBER_ID else self.member_id
                self.generation = -1
                self.rejoin_needed = True
            elif code in COORDINATOR_ERRORS:
                self.coordinator.forget()
                continue
            else:
                log.warning("heartbeat error %s", KafkaError(code))
                continue
            self.ensure_joining()

    async def leave(self) -> None:
        """LeaveGroup (best effort, at most 5 s), so the group rebalances now rather than after the session
        timeout."""
        try:
            async with asyncio.timeout(5):  # a coordinator that is gone must not hold up close()
                coordinator = await self.coordinator.connection()
                await coordinator.request_kio(
                    LeaveGroupRequest(group_id=GroupId(self.group_id), member_id=self.member_id), LeaveGroupResponse
                )
        except Exception as exc:
            log.info("LeaveGroup failed: %s", exc)
        self.generation = -1
