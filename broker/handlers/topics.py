"""CreateTopics (19) v2-4, DeleteTopics (20) v1-3 and CreatePartitions (37) v0-3.

CreateTopics, per topic (Kafka's ``ControllerApis`` / ``ReplicationControlManager`` checks, in
``broker.cluster.backend.plan_topic``): illegal or colliding name -> INVALID_TOPIC_EXCEPTION (17); exists ->
TOPIC_ALREADY_EXISTS (36); partitions < 1 (-1 = broker default, v4+) -> INVALID_PARTITIONS (37); a
replication factor above the live broker count -> INVALID_REPLICATION_FACTOR (38); manual assignments naming
brokers that are not registered, or uneven -> INVALID_REPLICA_ASSIGNMENT (39); unknown or unsupported
config -> INVALID_CONFIG (40); a name twice in one request -> INVALID_REQUEST (42) for each.
``validate_only`` runs every check and creates nothing. The metadata backend carries it out: locally on a
single node, by the controller in a cluster (a broker that is not the controller forwards the request).

DeleteTopics: unknown -> UNKNOWN_TOPIC_OR_PARTITION (3); internal topics -> INVALID_TOPIC_EXCEPTION (17).

CreatePartitions, per topic (``broker.cluster.backend.plan_partitions``): unknown -> UNKNOWN_TOPIC_OR_PARTITION;
a count not above the current one -> INVALID_PARTITIONS (37); assignments of the wrong number, size or
brokers -> INVALID_REPLICA_ASSIGNMENT (39); internal topics -> INVALID_TOPIC_EXCEPTION; a topic twice ->
INVALID_REQUEST. New partitions are placed by Kafka's rules unless assigned, by the controller in a cluster
(forwarded there), and answered once this broker's metadata shows them. Producers and consumers learn of
them from their next metadata refresh.
"""

from __future__ import annotations

import logging
from collections import Counter

from kio.schema.errors import ErrorCode

from copyless.broker.cluster.backend import is_inter_broker
from copyless.broker.handlers.context import RequestContext
from copyless.broker.security import checks
from copyless.broker.security.checks import Operation
from copyless.broker.topics import INTERNAL_TOPICS, TopicError
from copyless.broker.wire.codecs import NO_THROTTLE, build, response_module

log = logging.getLogger("copyless.topics")

CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS = 19, 20, 37


async def handle_create_topics(ctx: RequestContext, request):
    broker = ctx.broker
    module = response_module(CREATE_TOPICS, ctx.api_version)
    counts = Counter(topic.name for topic in request.topics)
    results = []
    # Create on the cluster covers every topic; otherwise Create on each topic.
    denied = frozenset() if checks.cluster(ctx, Operation.CREATE) else \
        checks.denied_topics(ctx, Operation.CREATE, (t.name for t in request.topics))
    for topic in request.topics:
        code, message = ErrorCode.none, None
        if counts[topic.name] > 1:
            code = ErrorCode.invalid_request
            message = f"Create topics request from client contains a duplicate topic {topic.name}"
        elif topic.name in denied:
            code, message = ErrorCode.topic_authorization_failed, "Authorization failed."
        else:
            try:
                if not topic.assignments and ctx.api_version < 4 and topic.num_partitions < 1:
                    raise TopicError(ErrorCode.invalid_partitions, "Number of partitions must be larger than 0.")
                await broker.create_topic(
                    topic.name,
                    topic.num_partitions,
                    {config.name: config.value for config in topic.configs},
                    replication_factor=topic.replication_factor,
                    assignments={a.partition_index: list(a.broker_ids) for a in topic.assignments} or None,
                    # A broker forwarding its own internal topic's creation to the controller (the groups'
                    # __consumer_offsets); a client may not create internal topics.
                    internal=topic.name in INTERNAL_TOPICS and is_inter_broker(ctx.client_id)
                    and checks.cluster(ctx, Operation.CLUSTER_ACTION),
                    validate_only=request.validate_only,
                )
            except TopicError as exc:
                code, message = exc.code, exc.message
        if code != ErrorCode.none:
            log.info("create topic %r for %s refused: %s %s", topic.name, ctx.client_id, code.name, message)
        results.append(build(module.CreatableTopicResult, name=topic.name, error_code=code, error_message=message))
    return build(module.CreateTopicsResponse, throttle_time=NO_THROTTLE, topics=tuple(results))


async def handle_delete_topics(ctx: RequestContext, request):
    broker = ctx.broker
    module = response_module(DELETE_TOPICS, ctx.api_version)
    results = []
    denied = checks.denied_topics(ctx, Operation.DELETE, request.topic_names)
    for name in dict.fromkeys(request.topic_names):
        code = ErrorCode.none
        try:
            if name in denied:
                raise TopicError(ErrorCode.topic_authorization_failed, "Authorization failed.")
            await broker.delete_topic(name)
        except TopicError as exc:
            code = exc.code
            log.info("delete topic %r for %s refused: %s %s", name, ctx.client_id, code.name, exc.message)
        results.append(build(module.DeletableTopicResult, name=name, error_code=code))
    return build(module.DeleteTopicsResponse, throttle_time=NO_THROTTLE, responses=tuple(results))


async def handle_create_partitions(ctx: RequestContext, request):
    broker = ctx.broker
    module = response_module(CREATE_PARTITIONS, ctx.api_version)
    counts = Counter(topic.name for topic in request.topics)
    results = []
    denied = checks.denied_topics(ctx, Operation.ALTER, (t.name for t in request.topics))
    for topic in request.topics:
        code, message = ErrorCode.none, None
        if counts[topic.name] > 1:
            code, message = ErrorCode.invalid_request, f"Duplicate topic in request: {topic.name}"
        elif topic.name in denied:
            code, message = ErrorCode.topic_authorization_failed, "Authorization failed."
        else:
            assignments = None if topic.assignments is None else [list(a.broker_ids) for a in topic.assignments]
            try:
                await broker.create_partitions(topic.name, topic.count, assignments,
                                               validate_only=request.validate_only)
            except TopicError as exc:
                code, message = exc.code, exc.message
        if code != ErrorCode.none:
            log.info("create partitions of %r for %s refused: %s %s", topic.name, ctx.client_id, code.name, message)
        results.append(build(module.CreatePartitionsTopicResult, name=topic.name, error_code=code,
                             error_message=message))
    return build(module.CreatePartitionsResponse, throttle_time=NO_THROTTLE, results=tuple(results))


HANDLERS = {
    CREATE_TOPICS: (2, 4, handle_create_topics),
    DELETE_TOPICS: (1, 3, handle_delete_topics),
    CREATE_PARTITIONS: (0, 3, handle_create_partitions),
}
