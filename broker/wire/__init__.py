"""Sans-IO Kafka server side: request headers, kio codecs, request decoding and response encoding.

Nothing here touches a socket or a file. The shell (``broker.server``) feeds frames in and writes the
returned segments out.
"""

from copyless.broker.wire.codecs import build, encode_response, request_codec, response_module
from copyless.broker.wire.fetch_response import FetchPartitionResult, encode_fetch_response
from copyless.broker.wire.headers import RemoteProtocolError, RequestHeader, parse_request_header
from copyless.broker.wire.requests import ApiVersionsFallback, DecodedRequest, decode_request

__all__ = [
    "ApiVersionsFallback",
    "DecodedRequest",
    "FetchPartitionResult",
    "RemoteProtocolError",
    "RequestHeader",
    "build",
    "decode_request",
    "encode_fetch_response",
    "encode_response",
    "parse_request_header",
    "request_codec",
    "response_module",
]
