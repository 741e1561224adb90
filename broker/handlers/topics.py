"""CreateTopics (19) v2-4 and DeleteTopics (20) v1-3.

CreateTopics, per topic (Kafka's ``ControllerApis`` / ``ReplicationControlManager`` checks):
illegal or colliding name -> INVALID_TOPIC_EXCEPTION (17); exists -> TOPIC_ALREADY_EXISTS (36);
partitions < 1 (-1 = broker default, v4+) -> INVALID_PARTITIONS (37); replication factor other than 1 or -1
-> INVALID_REPLICATION_FACTOR (38); manual assignments naming another broker -> INVALID_REPLICA_ASSIGNMENT
(39); unknown or unsupported config -> INVALID_CONFIG (40); a name twice in one request -> INVALID_REQUEST
(42) for each. ``validate_only`` runs every check and creates nothing.

DeleteTopics: unknown -> UNKNOWN_TOPIC_OR_PARTITION (3); internal topics -> INVALID_TOPIC_EXCEPTION (17).
"""

from __future__ import annotations

import logging
from collections import Counter

from kio.schema.errors import ErrorCode

from copyless.broker.handlers.context import RequestContext
from copyless.broker.topics import TopicError
from copyless.broker.wire.codecs import NO_THROTTLE, build, response_module

log = logging.getLogger("copyless.topics")

CREATE_TOPICS, DELETE_TOPICS = 19, 20


async def handle_create_topics(ctx: RequestContext, request):
    broker = ctx.broker
    module = response_module(CREATE_TOPICS, ctx.api_version)
    counts = Counter(topic.name for topic in request.topics)
    results = []
    for topic in request.topics:
        code, message = ErrorCode.none, None
        if counts[topic.name] > 1:
            code, message = ErrorCode.invalid_request, f"Create topics request from client contains a duplicate topic {topic.name}"
        else:
            partitions = topic.num_partitions
            replication_factor = topic.replication_factor
            try:
                if topic.assignments:
                    partitions, replication_factor = _check_assignments(broker.node_id, topic)
                elif ctx.api_version < 4 and partitions < 1:
                    raise TopicError(ErrorCode.invalid_partitions, "Number of partitions must be larger than 0.")
                await broker.create_topic(
                    topic.name,
                    partitions,
                    {config.name: config.value for config in topic.configs},
                    replication_factor=replication_factor,
                    validate_only=request.validate_only,
                )
            except TopicError as exc:
                code, message = exc.code, exc.message
        if code != ErrorCode.none:
            log.info("create topic %r for %s refused: %s %s", topic.name, ctx.client_id, code.name, message)
        results.append(build(module.CreatableTopicResult, name=topic.name, error_code=code, error_message=message))
    return build(module.CreateTopicsResponse, throttle_time=NO_THROTTLE, topics=tuple(results))


def _check_assignments(node_id: int, topic) -> tuple[int, int]:
    indexes = sorted(assignment.partition_index for assignment in topic.assignments)
    if topic.num_partitions != -1 or topic.replication_factor != -1:
        raise TopicError(
            ErrorCode.invalid_request,
            "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be used at the same time.",
        )
    if indexes != list(range(len(indexes))):
        raise TopicError(ErrorCode.invalid_replica_assignment, "Partitions should be a consecutive 0-based integer sequence")
    for assignment in topic.assignments:
        if list(assignment.broker_ids) != [node_id]:
            raise TopicError(
                ErrorCode.invalid_replica_assignment,
                f"Replica assignment {list(assignment.broker_ids)} for partition {assignment.partition_index} "
                f"names brokers other than the only one, {node_id}",
            )
    return len(indexes), 1


async def handle_delete_topics(ctx: RequestContext, request):
    broker = ctx.broker
    module = response_module(DELETE_TOPICS, ctx.api_version)
    results = []
    for name in dict.fromkeys(request.topic_names):
        code = ErrorCode.none
        try:
            await broker.delete_topic(name)
        except TopicError as exc:
            code = exc.code
            log.info("delete topic %r for %s refused: %s %s", name, ctx.client_id, code.name, exc.message)
        results.append(build(module.DeletableTopicResult, name=name, error_code=code))
    return build(module.DeleteTopicsResponse, throttle_time=NO_THROTTLE, responses=tuple(results))


HANDLERS = {
    CREATE_TOPICS: (2, 4, handle_create_topics),
    DELETE_TOPICS: (1, 3, handle_delete_topics),
}
