"""DescribeCluster (60) v0-1 and ElectLeaders (43) v0-2: the cluster as admin tools see it, and preferred
leader election.

DescribeCluster (KIP-700, flexible from v0): the cluster id, the controller and every live broker at its
advertised address on the listener the request arrived on, as Metadata reports them. v1's ``endpoint_type``
2 (controllers) is refused with UNSUPPORTED_ENDPOINT_TYPE: copyless has no separate controller nodes.

ElectLeaders (KIP-460): ``election_type`` 0 (preferred) moves each named partition's leadership to the
first replica of its assignment when that replica is alive and in the ISR, through the controller
(forwarded there from another broker); per partition: done -> NONE, already led by it ->
ELECTION_NOT_NEEDED (84), it cannot lead now -> PREFERRED_LEADER_NOT_AVAILABLE (80), unknown ->
UNKNOWN_TOPIC_OR_PARTITION (3). A null partition list means every partition. On a single node every
partition already has its only replica as leader: ELECTION_NOT_NEEDED. Type 1 (unclean) is answered per
partition with ELECTION_NOT_NEEDED when the partition has a live leader and ELIGIBLE_LEADERS_NOT_AVAILABLE
(83) otherwise: the controller already elects an out-of-ISR replica when ``unclean.leader.election.enable``
says so, and never on request.
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from copyless.broker.handlers.context import RequestContext
from copyless.broker.security import checks
from copyless.broker.security.checks import Operation
from copyless.broker.topics import TopicError
from copyless.broker.wire.codecs import NO_THROTTLE, build, response_module

log = logging.getLogger("copyless.cluster")

ELECT_LEADERS, DESCRIBE_CLUSTER = 43, 60
PREFERRED, UNCLEAN = 0, 1
BROKER_ENDPOINTS = 1
_AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


async def describe_cluster(ctx: RequestContext, request):
    broker = ctx.broker
    module = response_module(DESCRIBE_CLUSTER, ctx.api_version)
    image = broker.metadata.image
    endpoint_type = getattr(request, "endpoint_type", BROKER_ENDPOINTS)
    code, message, brokers = ErrorCode.none, None, []
    if not checks.cluster(ctx, Operation.DESCRIBE):
        code, message = ErrorCode.cluster_authorization_failed, "Describe on the cluster is needed"
    elif endpoint_type != BROKER_ENDPOINTS:
        code, message = ErrorCode.unsupported_endpoint_type, "copyless has no separate controller endpoints"
    else:
        for node_id in sorted(image.brokers):
            endpoint = image.brokers[node_id].endpoints.get(ctx.listener)
            if endpoint is not None:
                brokers.append(build(module.DescribeClusterBroker, broker_id=node_id, host=endpoint[0],
                                     port=endpoint[1], rack=image.brokers[node_id].rack))
    return build(module.DescribeClusterResponse, throttle_time=NO_THROTTLE, error_code=code, error_message=message,
                 endpoint_type=endpoint_type, cluster_id=image.cluster_id or broker.cluster_id,
                 controller_id=image.controller_id, brokers=tuple(brokers),
                 cluster_authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED)


def _unclean_outcome(image, key) -> ErrorCode:
    state = image.partition_state(*key)
    if state is None:
        return ErrorCode.unknown_topic_or_partition
    return ErrorCode.election_not_needed if state.leader in image.brokers else ErrorCode.eligible_leaders_not_available


async def elect_leaders(ctx: RequestContext, request):
    broker = ctx.broker
    module = response_module(ELECT_LEADERS, ctx.api_version)
    election_type = getattr(request, "election_type", PREFERRED)
    image = broker.metadata.image
    keys = None
    if request.topic_partitions is not None:
        keys = list(dict.fromkeys((item.topic, int(p)) for item in request.topic_partitions for p in item.partitions))
    top_code = ErrorCode.none
    outcome: dict = {}
    if not checks.cluster(ctx, Operation.ALTER):
        top_code = ErrorCode.cluster_authorization_failed
    elif election_type == PREFERRED:
        try:
            known = None if keys is None else [key for key in keys if image.partition_state(*key) is not None]
            if known is None or known:
                outcome = dict(await broker.metadata.elect_preferred_leaders(known))
        except TopicError as exc:
            log.info("preferred leader election for %s failed: %s %s", ctx.client_id, exc.code.name, exc.message)
            top_code = exc.code
    elif election_type == UNCLEAN:
        outcome = {key: _unclean_outcome(image, key) for key in (keys if keys is not None else image.partitions)}
    else:
        top_code = ErrorCode.invalid_request
    if top_code != ErrorCode.none:
        return build(module.ElectLeadersResponse, throttle_time=NO_THROTTLE, error_code=top_code,
                     replica_election_results=())
    for key in keys or ():
        outcome.setdefault(key, ErrorCode.unknown_topic_or_partition)
    by_topic: dict[str, list] = {}
    for (topic, index), code in sorted(outcome.items()):
        message = None if code in (ErrorCode.none,) else code.name
        by_topic.setdefault(topic, []).append(build(module.PartitionResult, partition_id=index, error_code=code,
                                                    error_message=message))
    results = tuple(build(module.ReplicaElectionResult, topic=topic, partition_result=tuple(partitions))
                    for topic, partitions in by_topic.items())
    return build(module.ElectLeadersResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                 replica_election_results=results)


HANDLERS = {
    ELECT_LEADERS: (0, 2, elect_leaders),
    DESCRIBE_CLUSTER: (0, 1, describe_cluster),
}
