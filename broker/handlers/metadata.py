"""Metadata (3) v0-8: brokers, controller, cluster id and topic/partition leadership; Kafka's auto-create.

Rules (``KafkaApis.getTopicMetadata``, traps T7, T11, T12 in the protocol notes):

- "all topics" is an empty array in v0 and a null array in v1+; an empty array in v1+ asks for no topics
  (aiokafka bootstraps with it to get brokers only). All-topics requests never auto-create.
- a requested topic that does not exist is created when ``auto.create.topics.enable`` and the request
  allows it (``allow_auto_topic_creation`` from v4; implicitly true before) and its name is legal; that
  round answers LEADER_NOT_AVAILABLE (5) and the client's retry finds it. Otherwise
  UNKNOWN_TOPIC_OR_PARTITION (3), or INVALID_TOPIC_EXCEPTION (17) for an illegal name.
- brokers: every live broker, at the advertised address of the listener this request arrived on (named
  listeners: containers reach each other by service name while the host uses published ports);
- ``controller_id`` (v1+): the controller (a single node is its own; kafka-python's admin client loops
  while it is -1);
- per partition: leader, leader epoch (v7+), replicas, ISR and offline replicas (v5+) from the metadata
  image, which only moves forward, so a broker never reports an older leader epoch than it did before
  (librdkafka drops such answers). A leader that is not live, or this broker while its lease may have
  expired, is reported as -1 with LEADER_NOT_AVAILABLE; clients retry with fresh metadata.
- internal topics (``__consumer_offsets``) carry ``is_internal`` (v1+) and are left out of v0 all-topics
  answers, which cannot mark them.
- authorization: an all-topics answer lists only the topics the principal may Describe; a named topic it
  may not Describe answers TOPIC_AUTHORIZATION_FAILED (29), and so does a missing one it could have
  auto-created without Create on the cluster or the topic. ``*_authorized_operations`` (v8) are filled in
  when asked for.
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from copyless.broker.handlers.context import RequestContext
from copyless.broker.security import checks
from copyless.broker.security.acl import CLUSTER_NAME, SUPPORTED_OPERATIONS, ResourceType
from copyless.broker.security.checks import Operation
from copyless.broker.topics import TopicError, validate_topic_name
from copyless.broker.wire.codecs import NO_THROTTLE, build, response_module

log = logging.getLogger("copyless.metadata")

API_KEY = 3
MIN_VERSION, MAX_VERSION = 0, 8
# Kafka's sentinel for "authorized operations not requested" (Integer.MIN_VALUE).
_AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


async def handle(ctx: RequestContext, request):
    broker = ctx.broker
    version = ctx.api_version
    module = response_module(API_KEY, version)
    requested = request.topics
    all_topics = requested is None or (version == 0 and len(requested) == 0)
    allow_auto_create = getattr(request, "allow_auto_topic_creation", True)

    image = broker.metadata.image
    if all_topics:
        names = sorted(t.name for t in image.topics.values() if not (version == 0 and t.internal))
        hidden = checks.denied_topics(ctx, Operation.DESCRIBE, names)
        names = [name for name in names if name not in hidden]
    else:
        names = []
        for item in requested:
            name = item.name if hasattr(item, "name") else item
            if name not in names:
                names.append(name)
    denied = frozenset() if all_topics else checks.denied_topics(ctx, Operation.DESCRIBE, names)
    topic_operations = getattr(request, "include_topic_authorized_operations", False)

    topics = []
    for name in names:
        if name in denied:
            topics.append(_topic_error(module, name, ErrorCode.topic_authorization_failed))
            continue
        info = broker.metadata.image.topic(name)
        if info is None and broker.is_creating(name):
            await broker.wait_created(name)
            topics.append(_topic_error(module, name, ErrorCode.leader_not_available))
            continue
        if info is None:
            topics.append(await _missing_topic(ctx, module, name, all_topics, allow_auto_create))
            continue
        topics.append(
            build(
                module.MetadataResponseTopic,
                error_code=ErrorCode.none,
                name=name,
                is_internal=info.internal,
                partitions=_partitions(broker, module, broker.metadata.image, info),
                topic_authorized_operations=authorized_operations(ctx, ResourceType.TOPIC, name)
                if topic_operations else _AUTHORIZED_OPERATIONS_OMITTED,
            )
        )

    image = broker.metadata.image
    brokers = []
    for node_id in sorted(image.brokers):
        endpoint = image.brokers[node_id].endpoints.get(ctx.listener)
        if endpoint is None:
            continue  # a broker without this listener is not reachable by this client (Kafka omits it)
        brokers.append(build(module.MetadataResponseBroker, node_id=node_id, host=endpoint[0], port=endpoint[1],
                             rack=image.brokers[node_id].rack))
    return build(
        module.MetadataResponse,
        throttle_time=NO_THROTTLE,
        brokers=tuple(brokers),
        cluster_id=image.cluster_id or broker.cluster_id,
        controller_id=image.controller_id,
        topics=tuple(topics),
        cluster_authorized_operations=authorized_operations(ctx, ResourceType.CLUSTER, CLUSTER_NAME)
        if getattr(request, "include_cluster_authorized_operations", False) else _AUTHORIZED_OPERATIONS_OMITTED,
    )


def authorized_operations(ctx: RequestContext, resource_type: ResourceType, name: str) -> int:
    """Kafka's bit field of the operations the principal may do on the resource (bit = operation code)."""
    security = ctx.broker.security
    bits = 0
    for operation in SUPPORTED_OPERATIONS[resource_type]:
        if security.authorize(ctx.principal, ctx.client_host, operation, resource_type, name):
            bits |= 1 << int(operation)
    return bits


def _partitions(broker, module, image, info) -> tuple:
    """Each partition's leader, epoch, replicas and ISR as the image says, with Kafka's cache rules: a leader
    that is not a live broker is reported as -1 with LEADER_NOT_AVAILABLE (5), the epoch kept; so is this
    broker, for the partitions it leads, while its metadata lease may have expired (a cut-off broker must
    not present itself as leader)."""
    live = image.brokers
    lease_valid = broker.metadata.lease_valid()
    partitions = []
    for index in range(info.partitions):
        state = image.partition_state(info.name, index)
        replicas = info.assignment[index]
        if state is None:
            leader, epoch, isr = -1, -1, ()
        else:
            leader, epoch, isr = state.leader, state.leader_epoch, state.isr
        code = ErrorCode.none
        if leader not in live or (leader == broker.node_id and not lease_valid):
            leader, code = -1, ErrorCode.leader_not_available
        partitions.append(build(
            module.MetadataResponsePartition,
            error_code=code,
            partition_index=index,
            leader_id=leader,
            leader_epoch=epoch,
            replica_nodes=tuple(replicas),
            isr_nodes=tuple(isr),
            offline_replicas=tuple(r for r in replicas if r not in live),
        ))
    return tuple(partitions)


def _topic_error(module, name: str, code: ErrorCode):
    return build(
        module.MetadataResponseTopic,
        error_code=code,
        name=name,
        is_internal=False,
        partitions=(),
        topic_authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED,
    )


async def _missing_topic(ctx: RequestContext, module, name: str, all_topics: bool, allow_auto_create: bool):
    try:
        validate_topic_name(name)
    except TopicError:
        return _topic_error(module, name, ErrorCode.invalid_topic_exception)
    broker = ctx.broker
    if all_topics or not allow_auto_create or not broker.config.auto_create_topics or broker.closing:
        return _topic_error(module, name, ErrorCode.unknown_topic_or_partition)
    if not (checks.cluster(ctx, Operation.CREATE) or checks.topic(ctx, Operation.CREATE, name)):
        return _topic_error(module, name, ErrorCode.topic_authorization_failed)
    try:
        await broker.create_topic(name)
        log.info("auto-created topic %s for client %s", name, ctx.client_id)
    except TopicError as exc:
        if exc.code != ErrorCode.topic_already_exists:
            log.warning("auto-create of %s refused: %s", name, exc.message)
            code = (ErrorCode.invalid_topic_exception if exc.code == ErrorCode.invalid_topic_exception
                    else ErrorCode.unknown_topic_or_partition)
            return _topic_error(module, name, code)
    # Kafka answers the creating round with LEADER_NOT_AVAILABLE; every client retries the metadata.
    return _topic_error(module, name, ErrorCode.leader_not_available)


HANDLERS = {API_KEY: (MIN_VERSION, MAX_VERSION, handle)}
