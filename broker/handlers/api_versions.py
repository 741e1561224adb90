"""ApiVersions (18) v0-2: the served-API table, straight from the handler registry.

Versions above 2 (kafka-python sends v4, librdkafka v3) never reach this handler: ``broker.wire.requests``
answers them with Kafka's v0-encoded UNSUPPORTED_VERSION fallback, and both clients retry at a version
listed here. Versions 0-2 are non-flexible, which aiokafka (v0 only) needs.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from copyless.broker.handlers.context import RequestContext
from copyless.broker.wire.codecs import NO_THROTTLE, build, response_module

API_KEY = 18
MIN_VERSION, MAX_VERSION = 0, 2


async def handle(ctx: RequestContext, request):
    module = response_module(API_KEY, ctx.api_version)
    api_keys = tuple(
        module.ApiVersion(api_key=key, min_version=low, max_version=high)
        for key, (low, high) in sorted(ctx.broker.handlers.served().items())
    )
    return build(module.ApiVersionsResponse, error_code=ErrorCode.none, api_keys=api_keys, throttle_time=NO_THROTTLE)


HANDLERS = {API_KEY: (MIN_VERSION, MAX_VERSION, handle)}
