"""ListOffsets (2) v1-7: earliest (-2), latest (-1), max timestamp (-3) and first offset at or after a timestamp.

- -1 -> the high watermark (= log end offset on a single node; also the last stable offset, as there are
  no open transactions), timestamp -1; OFFSET_NOT_AVAILABLE (78) while a new leader's high watermark is
  below its epoch's start offset;
- -2 -> the log start offset, timestamp -1;
- -3 (v7+, KIP-734) -> the first record carrying the partition's largest timestamp, with that timestamp
  (Kafka 3.9's answer: the first segment whose max timestamp is the largest, then the first record there
  with it); an empty partition -> offset -1, timestamp -1. Below v7, -3 is INVALID_REQUEST (42);
- t >= 0 -> the first record whose timestamp is >= t, resolved per record as Kafka's
  ``FileRecords.searchForTimestamp`` does (storage's ``offset_for_timestamp``), with that record's
  timestamp; none -> offset -1, timestamp -1;
- leader epoch (v4+) is the partition's for a found offset; unknown partition -> UNKNOWN_TOPIC_OR_PARTITION
  (3); not the leader -> NOT_LEADER_OR_FOLLOWER (6); ``current_leader_epoch`` older / newer than the
  leader's -> FENCED_LEADER_EPOCH (74) / UNKNOWN_LEADER_EPOCH (75); any other negative timestamp ->
  INVALID_REQUEST (42); a lookup that lands on a batch whose records do not decode (produce checks headers
  and CRCs only) -> CORRUPT_MESSAGE (2).

v6 is the first flexible version (tagged fields, compact strings); kio's codecs read and write it like the
others. v8 (-4/-5, tiered storage, KIP-1005) is not served: there is no remote tier.

Timestamp lookups read (and may decompress) one batch of at most max.message.bytes from disk; storage's
contract puts them on the loop thread (they race appends to the time index otherwise), which costs at most
a few milliseconds per lookup, and clients issue them once per partition at assignment.
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from copyless.broker.errors import BrokerError, OffsetNotAvailable, error_for
from copyless.broker.handlers.context import RequestContext
from copyless.broker.security import checks
from copyless.broker.security.checks import Operation
from copyless.broker.wire.codecs import NO_THROTTLE, build, response_module

log = logging.getLogger("copyless.list_offsets")

API_KEY = 2
MIN_VERSION, MAX_VERSION = 1, 7
LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3
READ_COMMITTED = 1  # isolation_level: latest is the last stable offset
MAX_TIMESTAMP_VERSION = 7


async def handle(ctx: RequestContext, request):
    broker = ctx.broker
    module = response_module(API_KEY, ctx.api_version)
    topics = []
    denied = checks.denied_topics(ctx, Operation.DESCRIBE, (t.name for t in request.topics))
    for list_topic in request.topics:
        partitions = []
        for item in list_topic.partitions:
            code, offset, timestamp, epoch = ErrorCode.none, -1, -1, -1
            try:
                if list_topic.name in denied:
                    raise BrokerError(ErrorCode.topic_authorization_failed, "Not authorized to describe the topic")
                partition = broker.replicas.leader(list_topic.name, item.partition_index,
                                                   getattr(item, "current_leader_epoch", -1))
                if item.timestamp == LATEST:
                    if partition.high_watermark < partition.epoch_start_offset:
                        # A new leader whose high watermark has not reached its epoch's start yet: the
                        # latest offset it would give could still grow backwards (KIP-207).
                        raise OffsetNotAvailable(f"{list_topic.name}-{item.partition_index}: the new leader's high "
                                                 f"watermark has not reached its epoch start yet")
                    offset, epoch = partition.high_watermark, partition.leader_epoch
                    if getattr(request, "isolation_level", 0) == READ_COMMITTED:
                        offset = partition.last_stable_offset
                elif item.timestamp == EARLIEST:
                    offset, epoch = partition.log_start_offset, partition.leader_epoch
                elif item.timestamp >= 0 or (item.timestamp == MAX_TIMESTAMP
                                             and ctx.api_version >= MAX_TIMESTAMP_VERSION):
                    if item.timestamp == MAX_TIMESTAMP:
                        found = partition.offset_for_max_timestamp()
                    else:
                        found = partition.offset_for_timestamp(item.timestamp)
                    if found is not None:
                        offset, timestamp = found
                        epoch = partition.leader_epoch
                else:
                    code = ErrorCode.invalid_request
            except Exception as exc:
                code, message = error_for(exc)
                if code == ErrorCode.corrupt_message:
                    # Produce validates batch headers and CRCs but never decodes records, so a producer can
                    # store a batch whose records do not parse; its partition stays readable, and a lookup
                    # that lands on it says so instead of failing the connection.
                    log.warning("timestamp lookup in %s-%d: %s", list_topic.name, item.partition_index, message)
                offset, timestamp, epoch = -1, -1, -1
            partitions.append(
                build(
                    module.ListOffsetsPartitionResponse,
                    partition_index=item.partition_index,
                    error_code=code,
                    timestamp=timestamp,
                    offset=offset,
                    leader_epoch=epoch,
                    old_style_offsets=(offset,) if offset >= 0 else (),
                )
            )
        topics.append(module.ListOffsetsTopicResponse(name=list_topic.name, partitions=tuple(partitions)))
    return build(module.ListOffsetsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))


HANDLERS = {API_KEY: (MIN_VERSION, MAX_VERSION, handle)}
