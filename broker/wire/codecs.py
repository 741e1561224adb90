"""The (api_key, version) -> kio codec table, and response framing.

kio generates one dataclass module per API version from Kafka's JSON message specs
(``kio.schema.<api>.v<N>.request/response``); its native reader decodes a ProduceRequest v8 in about 5 us.
This module looks the codecs up once per (api_key, version) and caches them, and builds response entities
from keyword arguments so a handler can describe a response once for a range of versions: fields a
version lacks are dropped (``build``), the way Kafka's generated ``Message.write`` skips fields outside
their ``versions`` range.

Response frame: ``int32 size | response header | body`` (see ``headers``).

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import struct
from collections.abc import Callable
from types import ModuleType
from typing import Any

from kio.index import load_payload_module, load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from copyless.broker.wire.headers import response_header

__all__ = [
    "RequestCodec",
    "request_codec",
    "response_module",
    "response_writer",
    "build",
    "NO_THROTTLE",
    "encode_response",
    "frame_response_body",
]

_SIZE = struct.Struct(">i")
# throttle_time_ms is always 0 (T5: kafka-python pauses the connection for whatever a broker >= 2.0 says).
NO_THROTTLE = datetime.timedelta(0)
API_VERSIONS_KEY = 18


@dataclasses.dataclass(frozen=True, slots=True)
class RequestCodec:
    reader: Callable[[Any, int], tuple[Any, int]]
    flexible: bool


@functools.cache
def request_codec(api_key: int, api_version: int) -> RequestCodec | None:
    """The kio reader for a request body, or None when kio has no schema for that version."""
    try:
        schema = load_request_schema(api_key, api_version)
    except Exception:  # kio raises UnknownAPIKey / UnknownEntity / ImportError variants
        return None
    return RequestCodec(entity_reader(schema), bool(schema.__flexible__))


@functools.cache
def response_module(api_key: int, api_version: int) -> ModuleType:
    """The kio module holding the response dataclasses of one API version (e.g. ``PartitionProduceResponse``)."""
    return load_payload_module(api_key, api_version, EntityType.response)


@functools.cache
def response_writer(api_key: int, api_version: int) -> tuple[Callable[[Any, Any], None], bool]:
    schema = load_response_schema(api_key, api_version)
    return entity_writer(schema), bool(schema.__flexible__)


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(field.name for field in dataclasses.fields(cls))


def build(cls: type, **values: Any) -> Any:
    """Construct a kio entity from ``values``, dropping the keys this version's class does not have."""
    names = _field_names(cls)
    return cls(**{name: value for name, value in values.items() if name in names})


def frame_response_body(correlation_id: int, body: bytes, *, flexible_header: bool) -> bytes:
    """Prefix a response body with its header and the frame size."""
    header = response_header(correlation_id, flexible=flexible_header)
    return _SIZE.pack(len(header) + len(body)) + header + body


def encode_response(correlation_id: int, api_key: int, api_version: int, entity: Any) -> bytes:
    """Serialize ``entity`` (a kio response dataclass) into a complete response frame."""
    writer, flexible = response_writer(api_key, api_version)
    buffer = io.BytesIO()
    writer(buffer, entity)
    # ApiVersions answers always carry response header v0 (KIP-511), even for flexible versions.
    flexible_header = flexible and api_key != API_VERSIONS_KEY
    return frame_response_body(correlation_id, buffer.getvalue(), flexible_header=flexible_header)
