"""DeleteRecords (21) v0-2: move partitions' log start offsets forward (``AdminClient.delete_records``).

Per partition (Kafka's ``ReplicaManager.deleteRecords``): the leader moves its log start offset to the
requested offset (-1: the high watermark) through ``Partition.delete_records_before``, which retires whole
segments below it and checkpoints the new start; fetches below it answer OFFSET_OUT_OF_RANGE and
ListOffsets(earliest) answers it. The answer's ``low_watermark`` is the new log start offset. Errors: an
offset past the high watermark or negative -> OFFSET_OUT_OF_RANGE (1); not the leader ->
NOT_LEADER_OR_FOLLOWER (6); unknown -> UNKNOWN_TOPIC_OR_PARTITION (3); a storage failure ->
KAFKA_STORAGE_ERROR (56). The new start is the leader's: followers keep their copies below it until their
own retention removes them (Kafka's followers also take the leader's log start from fetch responses; the
replica fetcher does so only for a fetch out of range), and the answer does not wait for them.
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from copyless.broker.errors import BrokerError, error_for
from copyless.broker.handlers.context import RequestContext
from copyless.broker.security import checks
from copyless.broker.security.checks import Operation
from copyless.broker.wire.codecs import NO_THROTTLE, build, response_module

log = logging.getLogger("copyless.delete_records")

API_KEY = 21
NO_LOW_WATERMARK = -1


async def handle(ctx: RequestContext, request):
    broker = ctx.broker
    module = response_module(API_KEY, ctx.api_version)
    topics = []
    denied = checks.denied_topics(ctx, Operation.DELETE, (t.name for t in request.topics))
    for topic in request.topics:
        partitions = []
        for item in topic.partitions:
            code, low_watermark = ErrorCode.none, NO_LOW_WATERMARK
            try:
                if topic.name in denied:
                    raise BrokerError(ErrorCode.topic_authorization_failed, "Not authorized to delete records")
                partition = broker.replicas.leader(topic.name, item.partition_index)
                low_watermark = await partition.delete_records_before(item.offset)
                log.info("%s-%d: records before offset %d deleted for %s (log start offset %d)", topic.name,
                         item.partition_index, item.offset, ctx.client_id, low_watermark)
            except Exception as exc:
                code, message = error_for(exc)
                log.info("delete records of %s-%d before %d for %s refused: %s %s", topic.name,
                         item.partition_index, item.offset, ctx.client_id, code.name, message)
            partitions.append(build(module.DeleteRecordsPartitionResult, partition_index=item.partition_index,
                                    low_watermark=low_watermark, error_code=code))
        topics.append(build(module.DeleteRecordsTopicResult, name=topic.name, partitions=tuple(partitions)))
    return build(module.DeleteRecordsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))


HANDLERS = {API_KEY: (0, 2, handle)}
