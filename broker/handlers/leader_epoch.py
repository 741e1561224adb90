"""OffsetForLeaderEpoch (23) v2-3: where a leader epoch ends (KIP-101/279 truncation, KIP-320 validation).

Asked of the partition's leader: for the requested epoch, the largest epoch at or below it that the
leader's log has, and the offset where that epoch ends (the next epoch's start offset, or the log end for
the latest epoch); (-1, -1), Kafka's UNDEFINED_EPOCH_OFFSET, when the log has no epoch at or below it.
A follower that starts following a new leader truncates to ``min(its own end of that epoch, this answer)``;
a consumer resuming from a committed epoch checks its position the same way.

Errors: unknown partition -> UNKNOWN_TOPIC_OR_PARTITION (3); not the leader -> NOT_LEADER_OR_FOLLOWER (6);
``current_leader_epoch`` older / newer than the leader's -> FENCED_LEADER_EPOCH (74) / UNKNOWN_LEADER_EPOCH
(75). On a single node the epoch is 0 forever: epoch 0 ends at the log end.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from copyless.broker.errors import BrokerError, error_for
from copyless.broker.handlers.context import RequestContext
from copyless.broker.security import checks
from copyless.broker.security.checks import Operation
from copyless.broker.wire.codecs import NO_THROTTLE, build, response_module

API_KEY = 23


async def handle(ctx: RequestContext, request):
    broker = ctx.broker
    module = response_module(API_KEY, ctx.api_version)
    topics = []
    # A follower's request (replica_id >= 0) needs ClusterAction; a consumer's, Describe on each topic.
    if getattr(request, "replica_id", -1) >= 0:
        everything_denied = not checks.cluster(ctx, Operation.CLUSTER_ACTION)
        denied = frozenset(t.topic for t in request.topics) if everything_denied else frozenset()
        refusal = ErrorCode.cluster_authorization_failed
    else:
        denied = checks.denied_topics(ctx, Operation.DESCRIBE, (t.topic for t in request.topics))
        refusal = ErrorCode.topic_authorization_failed
    for topic in request.topics:
        partitions = []
        for item in topic.partitions:
            code, epoch, end_offset = ErrorCode.none, -1, -1
            try:
                if topic.topic in denied:
                    raise BrokerError(refusal, "Not authorized")
                partition = broker.replicas.leader(topic.topic, item.partition, item.current_leader_epoch)
                epoch, end_offset = partition.end_offset_for_epoch(item.leader_epoch)
            except Exception as exc:
                code, _message = error_for(exc)
            partitions.append(
                build(module.EpochEndOffset, error_code=code, partition=item.partition, leader_epoch=epoch,
                      end_offset=end_offset)
            )
        topics.append(module.OffsetForLeaderTopicResult(topic=topic.topic, partitions=tuple(partitions)))
    return build(module.OffsetForLeaderEpochResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))


HANDLERS = {API_KEY: (2, 3, handle)}
