"""OffsetForLeaderEpoch (23) v2-3: the end offset of a leader epoch (KIP-320 log truncation checks).

The leader epoch is 0 forever on this single node, across restarts, so the answers are:
requested epoch 0 -> (epoch 0, log end offset); any other epoch -> (-1, -1), Kafka's UNDEFINED_EPOCH_OFFSET
for an epoch the log never had; ``current_leader_epoch`` above 0 -> UNKNOWN_LEADER_EPOCH (75); unknown
partition -> UNKNOWN_TOPIC_OR_PARTITION (3). librdkafka sends v2 when a metadata epoch moves, which never
happens here, but consumers resuming with a committed epoch still validate against it.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from copyless.broker.handlers.context import RequestContext
from copyless.broker.state import LEADER_EPOCH
from copyless.broker.wire.codecs import NO_THROTTLE, build, response_module

API_KEY = 23


async def handle(ctx: RequestContext, request):
    broker = ctx.broker
    module = response_module(API_KEY, ctx.api_version)
    topics = []
    for topic in request.topics:
        partitions = []
        for item in topic.partitions:
            code, epoch, end_offset = ErrorCode.none, -1, -1
            partition_log = broker.get_log(topic.topic, item.partition)
            if partition_log is None:
                code = ErrorCode.unknown_topic_or_partition
            elif item.current_leader_epoch > LEADER_EPOCH:
                code = ErrorCode.unknown_leader_epoch
            elif item.leader_epoch == LEADER_EPOCH:
                epoch, end_offset = LEADER_EPOCH, partition_log.log_end_offset
            partitions.append(
                build(module.EpochEndOffset, error_code=code, partition=item.partition, leader_epoch=epoch, end_offset=end_offset)
            )
        topics.append(module.OffsetForLeaderTopicResult(topic=topic.topic, partitions=tuple(partitions)))
    return build(module.OffsetForLeaderEpochResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))


HANDLERS = {API_KEY: (2, 3, handle)}
