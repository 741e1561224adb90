"""InitProducerId (22) v0-4: producer ids for idempotent producers.

Each call without a transactional id hands out a fresh producer id with epoch 0 (ids are reserved on disk in
blocks and never reused after a restart, see ``broker.producer_state``). kafka-python's default producer
(idempotent, acks=all) needs this API (trap T2); aiokafka speaks only v0. A call with a transactional id goes
to the transaction coordinator (``handlers.transactions.init_producer_id``, ``broker.txn.service``): the
id's producer id, its epoch bumped (which fences the previous producer of that id).

v3+ carry the producer id and epoch of a producer asking for an epoch bump (KIP-360: librdkafka and
kafka-python inferring a broker >= 2.5 recover from a sequence error that way). Without a transactional id
Kafka 3.9 ignores them and hands out a new producer id with epoch 0 (``TransactionCoordinator
.handleInitProducerId``), and so does this handler: a bump starts the producer afresh, which is what the
client needs, the old id's sequences being useless to it. v2+ are flexible (kio's codecs).
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from copyless.broker.handlers.context import RequestContext
from copyless.broker.security import checks
from copyless.broker.security.checks import Operation
from copyless.broker.wire.codecs import NO_THROTTLE, build, response_module

log = logging.getLogger("copyless.producer_ids")

API_KEY = 22


async def handle(ctx: RequestContext, request):
    module = response_module(API_KEY, ctx.api_version)
    if request.transactional_id is not None:
        from copyless.broker.handlers.transactions import init_producer_id

        code, producer_id, epoch = await init_producer_id(ctx, request)
        return build(module.InitProducerIdResponse, throttle_time=NO_THROTTLE, error_code=code,
                     producer_id=producer_id, producer_epoch=epoch)
    # An idempotent producer needs IdempotentWrite on the cluster, or Write on some topic (KIP-679).
    if not (checks.cluster(ctx, Operation.IDEMPOTENT_WRITE) or checks.any_topic(ctx, Operation.WRITE)):
        return build(module.InitProducerIdResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.cluster_authorization_failed, producer_id=-1, producer_epoch=-1)
    producer_id = await ctx.broker.allocate_producer_id()
    return build(
        module.InitProducerIdResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        producer_id=producer_id,
        producer_epoch=0,
    )


HANDLERS = {API_KEY: (0, 4, handle)}
