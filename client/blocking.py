"""A minimal blocking Kafka client: one socket, one request at a time, kio codecs. For tools and tests.

Owns nothing but the framing: request header v1 (non-flexible), response header v0, correlation ids
checked, at most ``MAX_RESPONSE_BYTES`` per response. Every request waits for its response before the
next is sent, so responses come in order. The asyncio ``Admin`` is the client's admin API; this exists
for callers that must not run an event loop (test drivers that script a protocol exchange step by step).
"""

from __future__ import annotations

import io
import socket
import struct

from kio.serial import entity_reader, entity_writer

__all__ = ["BlockingClient", "BlockingClientError"]

_SIZE = struct.Struct(">i")
_HEADER = struct.Struct(">hhi")
CLIENT_ID = "copyless-blocking"
MAX_RESPONSE_BYTES = 100 * 1024 * 1024


class BlockingClientError(RuntimeError):
    """The broker closed the connection or sent a frame that does not answer the request."""


class BlockingClient:
    """One blocking connection; one request in flight at a time (responses therefore in order)."""

    def __init__(self, host: str, port: int, timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def request(self, request_entity, response_type):
        """Send a non-flexible request (header v1) and decode its response (header v0)."""
        self.correlation_id += 1
        body = io.BytesIO()
        entity_writer(type(request_entity))(body, request_entity)
        client_id = CLIENT_ID.encode()
        header = _HEADER.pack(request_entity.__api_key__, request_entity.__version__, self.correlation_id) \
            + struct.pack(">h", len(client_id)) + client_id
        frame = header + body.getvalue()
        self.sock.sendall(_SIZE.pack(len(frame)) + frame)
        (size,) = _SIZE.unpack(self._read_exactly(4))
        if not 4 <= size <= MAX_RESPONSE_BYTES:
            raise BlockingClientError(f"bad response size {size}")
        payload = self._read_exactly(size)
        (correlation_id,) = _SIZE.unpack_from(payload, 0)
        if correlation_id != self.correlation_id:
            raise BlockingClientError(f"response for request {correlation_id}, expected {self.correlation_id}")
        entity, _size = entity_reader(response_type)(payload[4:], 0)
        return entity

    def _read_exactly(self, size: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < size:
            chunk = self.sock.recv(size - len(chunks))
            if not chunk:
                raise BlockingClientError("the broker closed the connection")
            chunks += chunk
        return bytes(chunks)
