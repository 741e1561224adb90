"""Consumer-group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
OffsetFetch, DescribeGroups, ListGroups, and the admin pair DeleteGroups (42) v0-2 and OffsetDelete (47) v0.

Each handler translates one kio request into a call on ``broker.groups`` (``broker.groups.service``), which
owns the coordinator and the offsets store, and builds the response for the request's version. Versions
(``kafka-protocol.md`` §1.2/1.4): JoinGroup 0-5 and SyncGroup 0-3 include aiokafka's {0,1,2,5} / {0,1,3};
everything stays below the first flexible version but OffsetFetch, served to v8 for KIP-447's require_stable
(v7) and several groups a request (v8). kafka-python's inference of the broker's version comes from other
APIs (ListOffsets v7: 3.0, see ``handlers.producer_ids``), not from OffsetFetch.

A JoinGroup or SyncGroup that the coordinator parks keeps its connection busy until it completes, as in
Kafka (requests on one connection are answered in order; clients give the coordinator its own connection).

Authorization (``broker.security.checks``, Kafka's rules): Read on the group to join, sync, heartbeat,
leave and commit; Describe to find its coordinator, fetch its offsets and describe it; Delete to delete it or
its offsets (GROUP_AUTHORIZATION_FAILED). Committing needs Read on each topic, fetching and describing
offsets Describe (TOPIC_AUTHORIZATION_FAILED, or left out of an all-topics OffsetFetch); ListGroups lists
every group with Describe on the cluster, else the groups the principal may Describe.
"""

from __future__ import annotations

import datetime
import logging

from kio.schema.errors import ErrorCode

from copyless.broker.errors import error_for
from copyless.broker.groups.coordinator import GroupSnapshot, GroupState
from copyless.broker.groups.offsets import MAX_METADATA_BYTES, CommittedOffset
from copyless.broker.groups.service import GroupService, now_ms
from copyless.broker.handlers.context import RequestContext
from copyless.broker.security import checks
from copyless.broker.security.checks import Operation
from copyless.broker.wire.codecs import NO_THROTTLE, build, response_module

__all__ = ["HANDLERS", "startup", "shutdown"]

log = logging.getLogger("copyless.groups")

FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 10, 11, 12, 13, 14
OFFSET_COMMIT, OFFSET_FETCH, DESCRIBE_GROUPS, LIST_GROUPS = 8, 9, 15, 16
DELETE_GROUPS, OFFSET_DELETE = 42, 47
# DescribeGroups v3+: "authorized operations not requested" (Kafka's Integer.MIN_VALUE sentinel).
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)
KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1


def _ms(value) -> int:
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


async def startup(broker) -> None:
    broker.groups = GroupService(broker)
    await broker.groups.start()


async def shutdown(broker) -> None:
    if broker.groups is not None:
        await broker.groups.stop()


def _groups(ctx: RequestContext) -> GroupService:
    """``broker.groups``, for the handlers that need it: this module's startup hook sets it before the
    listener accepts, so a request here finds it set. Not finding it is a start-up bug, said plainly (the
    connection closes, as after any failed handler) rather than as an attribute error on None."""
    groups = ctx.broker.groups
    if groups is None:
        raise RuntimeError("the group coordinator is not running: the groups handlers' startup hook has not run")
    return groups


# --- FindCoordinator ---------------------------------------------------------------------------------------


async def find_coordinator(ctx: RequestContext, request):
    module = response_module(FIND_COORDINATOR, ctx.api_version)
    broker = ctx.broker
    key_type = getattr(request, "key_type", KEY_TYPE_GROUP)
    if key_type == KEY_TYPE_GROUP and not checks.group(ctx, Operation.DESCRIBE, request.key):
        return build(module.FindCoordinatorResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.group_authorization_failed, error_message=None, node_id=-1, host="",
                     port=-1)
    if key_type == KEY_TYPE_TRANSACTION:
        from copyless.broker.handlers.transactions import find_coordinator as find_transaction_coordinator

        code, message, node_id, host, port = find_transaction_coordinator(ctx, request.key)
        return build(module.FindCoordinatorResponse, throttle_time=NO_THROTTLE, error_code=code,
                     error_message=message, node_id=node_id, host=host, port=port)
    if key_type != KEY_TYPE_GROUP:
        return build(module.FindCoordinatorResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.invalid_request,
                     error_message=f"unknown coordinator key type {key_type}", node_id=-1, host="", port=-1)
    if broker.groups is None:
        return build(module.FindCoordinatorResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.coordinator_not_available,
                     error_message="the group coordinator is not running", node_id=-1, host="", port=-1)
    code, message, node_id, host, port = broker.groups.find_coordinator(request.key, ctx.listener)
    return build(module.FindCoordinatorResponse, throttle_time=NO_THROTTLE, error_code=code,
                 error_message=message, node_id=node_id, host=host, port=port)


# --- JoinGroup / SyncGroup / Heartbeat / LeaveGroup ---------------------------------------------------------


async def join_group(ctx: RequestContext, request):
    module = response_module(JOIN_GROUP, ctx.api_version)
    if not checks.group(ctx, Operation.READ, request.group_id):
        return build(module.JoinGroupResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.group_authorization_failed,
                     generation_id=-1, protocol_name="", leader="", member_id="", members=())
    session_timeout_ms = _ms(request.session_timeout)
    rebalance_timeout_ms = _ms(getattr(request, "rebalance_timeout", request.session_timeout))
    if ctx.api_version == 0 or rebalance_timeout_ms < 0:
        rebalance_timeout_ms = session_timeout_ms  # v0 has none: Kafka uses the session timeout
    result = await _groups(ctx).join_group(
        group_id=request.group_id,
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
        protocol_type=request.protocol_type,
        protocols=[(p.name, p.metadata) for p in request.protocols],
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout_ms,
        require_known_member_id=ctx.api_version >= 4,
        client_id=ctx.client_id or "",
        client_host=ctx.client_host,
    )
    members = tuple(
        build(module.JoinGroupResponseMember, member_id=member_id, group_instance_id=instance_id, metadata=metadata)
        for member_id, instance_id, metadata in result.members
    )
    return build(module.JoinGroupResponse, throttle_time=NO_THROTTLE, error_code=result.error,
                 generation_id=result.generation_id, protocol_name=result.protocol_name or "",
                 leader=result.leader_id, member_id=result.member_id, members=members)


async def sync_group(ctx: RequestContext, request):
    module = response_module(SYNC_GROUP, ctx.api_version)
    if not checks.group(ctx, Operation.READ, request.group_id):
        return build(module.SyncGroupResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.group_authorization_failed, assignment=b"")
    result = await _groups(ctx).sync_group(
        group_id=request.group_id,
        generation_id=request.generation_id,
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
        assignments=[(a.member_id, a.assignment) for a in request.assignments],
    )
    return build(module.SyncGroupResponse, throttle_time=NO_THROTTLE, error_code=result.error,
                 assignment=result.assignment)


async def heartbeat(ctx: RequestContext, request):
    module = response_module(HEARTBEAT, ctx.api_version)
    if not checks.group(ctx, Operation.READ, request.group_id):
        return build(module.HeartbeatResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.group_authorization_failed)
    error = _groups(ctx).heartbeat(
        group_id=request.group_id,
        generation_id=request.generation_id,
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
    )
    return build(module.HeartbeatResponse, throttle_time=NO_THROTTLE, error_code=error)


async def leave_group(ctx: RequestContext, request):
    module = response_module(LEAVE_GROUP, ctx.api_version)
    if not checks.group(ctx, Operation.READ, request.group_id):
        return build(module.LeaveGroupResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.group_authorization_failed, members=())
    if ctx.api_version >= 3:
        leaving = [(m.member_id, m.group_instance_id) for m in request.members]
    else:
        leaving = [(request.member_id, None)]
    result = _groups(ctx).leave_group(group_id=request.group_id, members=leaving)
    if ctx.api_version >= 3:
        members = tuple(
            build(module.MemberResponse, member_id=member_id, group_instance_id=instance_id, error_code=error)
            for member_id, instance_id, error in result.members
        )
        return build(module.LeaveGroupResponse, throttle_time=NO_THROTTLE, error_code=result.error,
                     members=members)
    # v0-2: one member; its error is the response's.
    error = result.error if result.error != ErrorCode.none else result.members[0][2]
    return build(module.LeaveGroupResponse, throttle_time=NO_THROTTLE, error_code=error)


# --- OffsetCommit / OffsetFetch ------------------------------------------------------------------------------


# Kafka's mapping of append errors to OffsetCommit errors (GroupMetadataManager.storeOffsets).
_COMMIT_ERRORS = {
    ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator,
    ErrorCode.not_enough_replicas: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas_after_append: ErrorCode.coordinator_not_available,
    ErrorCode.request_timed_out: ErrorCode.coordinator_not_available,
    ErrorCode.not_coordinator: ErrorCode.not_coordinator,
    ErrorCode.coordinator_load_in_progress: ErrorCode.coordinator_load_in_progress,
}


async def offset_commit(ctx: RequestContext, request):
    module = response_module(OFFSET_COMMIT, ctx.api_version)
    broker = ctx.broker
    groups = _groups(ctx)
    error = groups.validate_commit(
        group_id=request.group_id,
        generation_id=request.generation_id_or_member_epoch,
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
    )
    if not checks.group(ctx, Operation.READ, request.group_id):
        error = ErrorCode.group_authorization_failed
    denied = checks.denied_topics(ctx, Operation.READ, (t.name for t in request.topics))
    errors: dict[tuple[str, int], ErrorCode] = {}
    commits: dict[tuple[str, int], CommittedOffset] = {}
    timestamp_ms = now_ms()
    for topic in request.topics:
        for partition in topic.partitions:
            key = (topic.name, partition.partition_index)
            if error != ErrorCode.none:
                errors[key] = error
            elif topic.name in denied:
                errors[key] = ErrorCode.topic_authorization_failed
            elif not _partition_exists(broker, topic.name, partition.partition_index):
                errors[key] = ErrorCode.unknown_topic_or_partition
            elif partition.committed_metadata is not None and \
                    len(partition.committed_metadata.encode("utf-8")) > MAX_METADATA_BYTES:
                errors[key] = ErrorCode.offset_metadata_too_large
            else:
                commits[key] = CommittedOffset(
                    partition.committed_offset, getattr(partition, "committed_leader_epoch", -1),
                    partition.committed_metadata or "", timestamp_ms)
                errors[key] = ErrorCode.none
    if commits:
        try:
            await groups.commit_offsets(request.group_id, commits)
        except Exception as exc:
            # Not replicated in time, leadership lost, disk full: the client retries (Kafka maps these to
            # retriable coordinator errors the same way).
            code, message = error_for(exc)
            log.warning("offset commit of group %s failed: %s: %s", request.group_id, code.name, message)
            answer = _COMMIT_ERRORS.get(code, ErrorCode.coordinator_not_available)
            for key in commits:
                errors[key] = answer
    topics = tuple(
        build(module.OffsetCommitResponseTopic, name=topic.name, partitions=tuple(
            build(module.OffsetCommitResponsePartition, partition_index=p.partition_index,
                  error_code=errors[(topic.name, p.partition_index)])
            for p in topic.partitions))
        for topic in request.topics
    )
    return build(module.OffsetCommitResponse, throttle_time=NO_THROTTLE, topics=topics)


def _partition_exists(broker, topic: str, partition: int) -> bool:
    info = broker.metadata.image.topic(topic)
    return info is not None and 0 <= partition < info.partitions


async def offset_fetch(ctx: RequestContext, request):
    """v1-7 ask for one group, v8 for several (KIP-709), each answered on its own. v7+ carry require_stable
    (KIP-447): a partition whose offset an open transaction holds (or a commit not yet replicated) is
    answered UNSTABLE_OFFSET_COMMIT, offset -1, and the client asks again, so a read_committed consumer
    taking a partition over mid-transaction starts from the offset the transaction commits, not before it."""
    module = response_module(OFFSET_FETCH, ctx.api_version)
    require_stable = bool(getattr(request, "require_stable", False))
    if ctx.api_version >= 8:
        groups = tuple(_fetch_group(ctx, module, group.group_id, group.topics, require_stable)
                       for group in request.groups)
        return build(module.OffsetFetchResponse, throttle_time=NO_THROTTLE, groups=groups)
    group_error, topics = _fetch_offsets(ctx, module, request.group_id, request.topics, require_stable)
    return build(module.OffsetFetchResponse, throttle_time=NO_THROTTLE, topics=topics, error_code=group_error)


def _fetch_group(ctx: RequestContext, module, group_id: str, requested, require_stable: bool):
    group_error, topics = _fetch_offsets(ctx, module, group_id, requested, require_stable)
    return build(module.OffsetFetchResponseGroup, group_id=group_id, topics=topics, error_code=group_error)


def _fetch_offsets(ctx: RequestContext, module, group_id: str, requested, require_stable: bool):
    """(group error, response topics) for one group; ``requested`` None means every committed partition."""
    v8 = ctx.api_version >= 8
    groups = _groups(ctx)
    committed: dict[tuple[str, int], CommittedOffset]
    if not checks.group(ctx, Operation.DESCRIBE, group_id):
        group_error, committed = ErrorCode.group_authorization_failed, {}
    else:
        group_error, committed = groups.committed(group_id)
    if v8 and group_error != ErrorCode.none:
        return group_error, ()  # Kafka answers a failed group with its error and no topics
    denied = checks.denied_topics(ctx, Operation.DESCRIBE, (topic for topic, _p in committed) if requested is None
                                  else (t.name for t in requested))
    if requested is None:
        wanted: dict[str, list[int]] = {}
        for topic, partition in sorted(committed):
            if topic not in denied:  # an all-topics fetch leaves out what the principal may not describe
                wanted.setdefault(topic, []).append(partition)
    else:
        wanted = {t.name: list(t.partition_indexes) for t in requested}
    # v1 has no top-level error: the group's error goes on every partition.
    partition_error = group_error if ctx.api_version < 2 else ErrorCode.none
    topic_entity = module.OffsetFetchResponseTopics if v8 else module.OffsetFetchResponseTopic
    partition_entity = module.OffsetFetchResponsePartitions if v8 else module.OffsetFetchResponsePartition
    topics = []
    for topic, partitions in wanted.items():
        items = []
        for partition in partitions:
            found = None if topic in denied else committed.get((topic, partition))
            error = ErrorCode.topic_authorization_failed if topic in denied else partition_error
            if require_stable and error == ErrorCode.none and groups.unstable(group_id, topic, partition):
                found, error = None, ErrorCode.unstable_offset_commit
            items.append(build(
                partition_entity, partition_index=partition,
                committed_offset=found.offset if found else -1,
                committed_leader_epoch=found.leader_epoch if found else -1,
                metadata=found.metadata if found else "",
                error_code=error))
        topics.append(build(topic_entity, name=topic, partitions=tuple(items)))
    return group_error, tuple(topics)


# --- DescribeGroups / ListGroups -------------------------------------------------------------------------------


async def describe_groups(ctx: RequestContext, request):
    module = response_module(DESCRIBE_GROUPS, ctx.api_version)
    groups = _groups(ctx)
    described = []
    for group_id in request.groups:
        if not checks.group(ctx, Operation.DESCRIBE, group_id):
            described.append(build(module.DescribedGroup, error_code=ErrorCode.group_authorization_failed,
                                   group_id=group_id, group_state="", protocol_type="", protocol_data="", members=(),
                                   authorized_operations=AUTHORIZED_OPERATIONS_OMITTED))
            continue
        status_error, snapshot = groups.describe(group_id)
        if snapshot is None:
            snapshot = GroupSnapshot(group_id, GroupState.DEAD, -1, None, None, None, 0)
        stable = snapshot.state is GroupState.STABLE
        members = tuple(
            build(module.DescribedGroupMember, member_id=m.member_id, group_instance_id=m.group_instance_id,
                  client_id=m.client_id, client_host=m.client_host,
                  # Kafka shows metadata and assignment only for a Stable group (``GroupMetadata.summary``).
                  member_metadata=m.metadata if stable else b"",
                  member_assignment=m.assignment if stable else b"")
            for m in snapshot.members
        )
        described.append(build(
            module.DescribedGroup, error_code=status_error, group_id=group_id,
            group_state=snapshot.state.value if status_error == ErrorCode.none else "",
            protocol_type=snapshot.protocol_type or "",
            protocol_data=(snapshot.protocol_name or "") if stable else "",
            members=members if status_error == ErrorCode.none else (),
            authorized_operations=AUTHORIZED_OPERATIONS_OMITTED))
    return build(module.DescribeGroupsResponse, throttle_time=NO_THROTTLE, groups=tuple(described))


async def list_groups(ctx: RequestContext, request):
    module = response_module(LIST_GROUPS, ctx.api_version)
    code, listed = _groups(ctx).list_groups()
    if not checks.cluster(ctx, Operation.DESCRIBE):
        listed = [(group_id, kind) for group_id, kind in listed if checks.group(ctx, Operation.DESCRIBE, group_id)]
    groups = tuple(build(module.ListedGroup, group_id=group_id, protocol_type=protocol_type)
                   for group_id, protocol_type in listed)
    return build(module.ListGroupsResponse, throttle_time=NO_THROTTLE, error_code=code, groups=groups)


# --- DeleteGroups / OffsetDelete -------------------------------------------------------------------------------


async def delete_groups(ctx: RequestContext, request):
    module = response_module(DELETE_GROUPS, ctx.api_version)
    groups: GroupService | None = ctx.broker.groups
    names = list(dict.fromkeys(request.groups_names))
    refused = {name: ErrorCode.group_authorization_failed for name in names
               if not checks.group(ctx, Operation.DELETE, name)}
    allowed = [name for name in names if name not in refused]
    if groups is None:
        outcome = {name: ErrorCode.coordinator_not_available for name in allowed}
    else:
        outcome = await groups.delete_groups(allowed) if allowed else {}
    outcome.update(refused)
    for name, code in outcome.items():
        if code != ErrorCode.none:
            log.info("delete group %r for %s refused: %s", name, ctx.client_id, code.name)
    results = tuple(build(module.DeletableGroupResult, group_id=name, error_code=outcome[name]) for name in names)
    return build(module.DeleteGroupsResponse, throttle_time=NO_THROTTLE, results=results)


async def offset_delete(ctx: RequestContext, request):
    module = response_module(OFFSET_DELETE, ctx.api_version)
    groups: GroupService | None = ctx.broker.groups
    denied = checks.denied_topics(ctx, Operation.READ, (t.name for t in request.topics))
    wanted = [(topic.name, int(p.partition_index)) for topic in request.topics for p in topic.partitions
              if topic.name not in denied]
    outcome: dict[tuple[str, int], ErrorCode]
    if not checks.group(ctx, Operation.DELETE, request.group_id):
        code, outcome = ErrorCode.group_authorization_failed, {}
    elif groups is None:
        code, outcome = ErrorCode.coordinator_not_available, {}
    else:
        code, outcome = await groups.delete_offsets(request.group_id, wanted)
        outcome.update({(topic.name, int(p.partition_index)): ErrorCode.topic_authorization_failed
                        for topic in request.topics if topic.name in denied for p in topic.partitions})
        wanted += [key for key in outcome if key[0] in denied]
    topics = []
    if code == ErrorCode.none:
        by_topic: dict[str, list] = {}
        for (topic, partition) in dict.fromkeys(wanted):
            by_topic.setdefault(topic, []).append(build(module.OffsetDeleteResponsePartition,
                                                        partition_index=partition,
                                                        error_code=outcome[(topic, partition)]))
        topics = [build(module.OffsetDeleteResponseTopic, name=topic, partitions=tuple(partitions))
                  for topic, partitions in by_topic.items()]
    else:
        log.info("delete offsets of group %r for %s refused: %s", request.group_id, ctx.client_id, code.name)
    return build(module.OffsetDeleteResponse, error_code=code, throttle_time=NO_THROTTLE, topics=tuple(topics))


HANDLERS = {
    DELETE_GROUPS: (0, 2, delete_groups),
    OFFSET_DELETE: (0, 0, offset_delete),
    OFFSET_COMMIT: (2, 7, offset_commit),
    OFFSET_FETCH: (1, 8, offset_fetch),
    FIND_COORDINATOR: (0, 2, find_coordinator),
    JOIN_GROUP: (0, 5, join_group),
    HEARTBEAT: (0, 3, heartbeat),
    LEAVE_GROUP: (0, 3, leave_group),
    SYNC_GROUP: (0, 3, sync_group),
    DESCRIBE_GROUPS: (0, 4, describe_groups),
    LIST_GROUPS: (0, 2, list_groups),
}
