"""Metadata (3) v0-8: brokers, controller, cluster id and topic/partition leadership; Kafka's auto-create.

Rules (``KafkaApis.getTopicMetadata``, traps T7, T11, T12 in the protocol notes):

- "all topics" is an empty array in v0 and a null array in v1+; an empty array in v1+ asks for no topics
  (aiokafka bootstraps with it to get brokers only). All-topics requests never auto-create.
- a requested topic that does not exist is created when ``auto.create.topics.enable`` and the request
  allows it (``allow_auto_topic_creation`` from v4; implicitly true before) and its name is legal; that
  round answers LEADER_NOT_AVAILABLE (5) and the client's retry finds it. Otherwise
  UNKNOWN_TOPIC_OR_PARTITION (3), or INVALID_TOPIC_EXCEPTION (17) for an illegal name.
- ``controller_id`` (v1+) is this node: kafka-python's admin client loops while it is -1.
- leader epoch (v7+) is 0 forever; single node: replicas = isr = [node_id].
- internal topics (``__consumer_offsets``) carry ``is_internal`` (v1+) and are left out of v0 all-topics
  answers, which cannot mark them.
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from copyless.broker.handlers.context import RequestContext
from copyless.broker.state import LEADER_EPOCH
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

    if all_topics:
        names = [t.name for t in broker.topics if not (version == 0 and t.internal)]
        names.sort()
    else:
        names = []
        for item in requested:
            name = item.name if hasattr(item, "name") else item
            if name not in names:
                names.append(name)

    topics = []
    for name in names:
        topic = broker.topics.get(name)
        if topic is None and broker.is_creating(name):
            await broker.wait_created(name)
            topics.append(_topic_error(module, name, ErrorCode.leader_not_available))
            continue
        if topic is None:
            topics.append(await _missing_topic(ctx, module, name, all_topics, allow_auto_create))
            continue
        partitions = tuple(
            build(
                module.MetadataResponsePartition,
                error_code=ErrorCode.none,
                partition_index=partition,
                leader_id=broker.node_id,
                leader_epoch=LEADER_EPOCH,
                replica_nodes=(broker.node_id,),
                isr_nodes=(broker.node_id,),
                offline_replicas=(),
            )
            for partition in range(topic.partitions)
        )
        topics.append(
            build(
                module.MetadataResponseTopic,
                error_code=ErrorCode.none,
                name=name,
                is_internal=topic.internal,
                partitions=partitions,
                topic_authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED,
            )
        )

    config = broker.config
    brokers = (
        build(
            module.MetadataResponseBroker,
            node_id=broker.node_id,
            host=config.advertised_host,
            port=config.advertised_port,
            rack=None,
        ),
    )
    return build(
        module.MetadataResponse,
        throttle_time=NO_THROTTLE,
        brokers=brokers,
        cluster_id=broker.cluster_id,
        controller_id=broker.node_id,
        topics=tuple(topics),
        cluster_authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED,
    )


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
    try:
        await broker.create_topic(name)
        log.info("auto-created topic %s for client %s", name, ctx.client_id)
    except TopicError as exc:
        if exc.code != ErrorCode.topic_already_exists:
            log.warning("auto-create of %s refused: %s", name, exc.message)
            code = ErrorCode.invalid_topic_exception if exc.code == ErrorCode.invalid_topic_exception else ErrorCode.unknown_topic_or_partition
            return _topic_error(module, name, code)
    # Kafka answers the creating round with LEADER_NOT_AVAILABLE; every client retries the metadata.
    return _topic_error(module, name, ErrorCode.leader_not_available)


HANDLERS = {API_KEY: (MIN_VERSION, MAX_VERSION, handle)}
