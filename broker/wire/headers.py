"""Kafka request and response headers: the part of every frame the broker reads before it knows the API.

Wire format (big-endian; the frame's int32 size prefix is already stripped by ``FrameBuffer``)::

    request header v1 (non-flexible APIs)      request header v2 (flexible APIs)
      int16  request_api_key                     same four fields, then
      int16  request_api_version                 tagged fields: uvarint count,
      int32  correlation_id                        [uvarint tag, uvarint size, bytes] * count
      int16  client_id length (-1 = null), bytes

``client_id`` is a *non-compact* nullable string even in header v2 (``RequestHeader.json`` marks it
``flexibleVersions: none``), so the four leading fields parse the same for every version of every API. That
is what lets the broker answer an ApiVersions request whose version it does not speak (v3/v4 from
kafka-python and librdkafka): it reads these fields and never parses the body.

    response header v0: int32 correlation_id
    response header v1: int32 correlation_id, tagged fields (one 0 byte: none)

ApiVersions responses always use header v0, whatever the request version (KIP-511; librdkafka reads the
ApiVersions response header without tagged fields).

Pure: bytes in, values out. Malformed input raises ``RemoteProtocolError``; the shell closes the connection.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

__all__ = [
    "RemoteProtocolError",
    "RequestHeader",
    "parse_request_header",
    "skip_tagged_fields",
    "response_header",
]

_FIXED = struct.Struct(">hhih")  # api_key, api_version, correlation_id, client_id length
_CORRELATION = struct.Struct(">i")


class RemoteProtocolError(ValueError):
    """The peer sent bytes that are not a valid Kafka request; the connection must be closed.

    ``correlation_id`` is set when the header was readable (for the log line).
    """

    def __init__(self, reason: str, correlation_id: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.correlation_id = correlation_id


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    # Where the fields after client_id begin (tagged fields for header v2, else the body).
    end_offset: int


def parse_request_header(frame: bytes | bytearray | memoryview) -> RequestHeader:
    """Read the four fields every request header version shares.

    Raises:
        RemoteProtocolError: the frame is shorter than the header says, or client_id is not UTF-8.
    """
    if len(frame) < _FIXED.size:
        raise RemoteProtocolError(f"request of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id, client_id_length = _FIXED.unpack_from(frame, 0)
    offset = _FIXED.size
    if client_id_length < 0:
        client_id = None
    else:
        end = offset + client_id_length
        if end > len(frame):
            raise RemoteProtocolError("client_id runs past the end of the request", correlation_id)
        try:
            client_id = bytes(frame[offset:end]).decode("utf-8")
        except UnicodeDecodeError:
            raise RemoteProtocolError("client_id is not valid UTF-8", correlation_id) from None
        offset = end
    return RequestHeader(api_key, api_version, correlation_id, client_id, offset)


def _read_uvarint(frame: bytes | bytearray | memoryview, offset: int, correlation_id: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if offset >= len(frame):
            raise RemoteProtocolError("truncated varint in tagged fields", correlation_id)
        byte = frame[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7
        if shift > 28:
            raise RemoteProtocolError("varint longer than 5 bytes in tagged fields", correlation_id)


def skip_tagged_fields(frame: bytes | bytearray | memoryview, offset: int, correlation_id: int = -1) -> int:
    """Skip a tagged-field section (request header v2); return the offset after it.

    The broker knows no header tags, so their values are ignored, as Kafka ignores unknown tags.
    """
    count, offset = _read_uvarint(frame, offset, correlation_id)
    for _ in range(count):
        _tag, offset = _read_uvarint(frame, offset, correlation_id)
        size, offset = _read_uvarint(frame, offset, correlation_id)
        offset += size
        if offset > len(frame):
            raise RemoteProtocolError("tagged field runs past the end of the request", correlation_id)
    return offset


def response_header(correlation_id: int, *, flexible: bool) -> bytes:
    """Encode response header v1 (flexible) or v0."""
    header = _CORRELATION.pack(correlation_id)
    return header + b"\x00" if flexible else header
