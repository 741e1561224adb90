"""Turning one request frame into (header, decoded body), with Kafka's rules for what gets an answer.

Decision table (Kafka ``SocketServer`` / ``RequestContext.parseRequest``):

- header unreadable, API key not served, version outside the served range (except ApiVersions), or a body
  kio cannot decode -> ``RemoteProtocolError``: the shell logs it and closes the connection;
- ApiVersions at a version above the served range -> ``ApiVersionsFallback``: answered with a v0 body,
  error UNSUPPORTED_VERSION (35) and the ApiVersions range, under response header v0, without parsing the
  body. kafka-python (v4) then retries at the advertised maximum; librdkafka (v3) fails to parse the v0 body
  with its flexible parser and retries at v0. Closing instead would make librdkafka assume a pre-0.10 broker.

Pure.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kio.schema.api_versions.v0.response import ApiVersion, ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer
from kio.static.primitive import i16

from copyless.broker.wire import produce_request
from copyless.broker.wire.codecs import API_VERSIONS_KEY, frame_response_body, request_codec
from copyless.broker.wire.headers import RemoteProtocolError, RequestHeader, parse_request_header, skip_tagged_fields

PRODUCE_KEY = 0

__all__ = ["DecodedRequest", "ApiVersionsFallback", "decode_request", "encode_api_versions_fallback"]


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    header: RequestHeader
    body: Any
    flexible: bool


@dataclass(frozen=True, slots=True)
class ApiVersionsFallback:
    """An ApiVersions request at a version the broker does not speak; answer with
    ``encode_api_versions_fallback``."""

    header: RequestHeader


def decode_request(frame: bytes | bytearray | memoryview,
                   served: Mapping[int, tuple[int, int]]) -> DecodedRequest | ApiVersionsFallback:
    """Decode a request frame (size prefix stripped).

    Args:
        served: api_key -> (min_version, max_version) the broker answers.

    Raises:
        RemoteProtocolError: the connection must be closed (reason in the message).
    """
    header = parse_request_header(frame)
    api_key, version, correlation_id = header.api_key, header.api_version, header.correlation_id
    versions = served.get(api_key)
    if versions is None:
        raise RemoteProtocolError(f"unknown API key {api_key} (version {version})", correlation_id)
    low, high = versions
    if version > high and api_key == API_VERSIONS_KEY:
        return ApiVersionsFallback(header)
    if not low <= version <= high:
        raise RemoteProtocolError(
            f"API key {api_key} version {version} is outside the served range {low}-{high}", correlation_id
        )
    offset = header.end_offset
    if api_key == PRODUCE_KEY and produce_request.MIN_VERSION <= version <= produce_request.MAX_VERSION:
        # Records stay views into the frame (see produce_request); v0-2 have no kio schema.
        return DecodedRequest(header, produce_request.decode_produce_request(frame, offset, correlation_id, version),
                              False)
    codec = request_codec(api_key, version)
    if codec is None:
        # A served version kio cannot decode is a broker bug (ApiVersions would advertise what dispatch
        # refuses); the ApiVersions walk in the tests keeps every served version decodable.
        raise RemoteProtocolError(f"API key {api_key} version {version} has no request codec", correlation_id)
    if codec.flexible:
        offset = skip_tagged_fields(frame, offset, correlation_id)
    try:
        body, _consumed = codec.reader(frame, offset)
    except Exception as exc:  # kio's native reader raises several types on malformed input
        raise RemoteProtocolError(
            f"malformed API key {api_key} v{version} request body: {type(exc).__name__}: {exc}", correlation_id
        ) from None
    return DecodedRequest(header, body, codec.flexible)


_FALLBACK_WRITER = entity_writer(ApiVersionsResponse)


def encode_api_versions_fallback(correlation_id: int, min_version: int, max_version: int) -> bytes:
    """The v0 ApiVersions response with UNSUPPORTED_VERSION and the ApiVersions range (a whole frame)."""
    response = ApiVersionsResponse(
        error_code=ErrorCode.unsupported_version,
        api_keys=(
            ApiVersion(api_key=i16(API_VERSIONS_KEY), min_version=i16(min_version), max_version=i16(max_version)),
        ),
    )
    buffer = io.BytesIO()
    _FALLBACK_WRITER(buffer, response)
    return frame_response_body(correlation_id, buffer.getvalue(), flexible_header=False)
