"""What every request handler receives and may return.

A handler is ``async def handle(ctx: RequestContext, request) -> response | None``:

- ``request`` is the kio request dataclass for ``ctx.api_version`` (already decoded);
- return a kio response dataclass of the same API and version (the shell encodes it), an
  ``EncodedResponse`` (segments already encoded, e.g. the zero-copy Fetch response), or ``None`` to write
  nothing (acks=0 Produce);
- raise ``CloseConnection`` to close the connection after logging the reason (Kafka closes on an acks=0
  produce error and on requests it cannot parse).

Handlers never touch sockets; they reach the broker's state through ``ctx.broker``, typed as the
``BrokerServices`` Protocol (broker/interfaces.py) so that this package does not import state.py, which
builds the handler table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from copyless.broker.interfaces import BrokerServices

__all__ = ["RequestContext", "EncodedResponse", "CloseConnection"]


@dataclass(slots=True)
class RequestContext:
    broker: BrokerServices  # what a handler may reach (broker/interfaces.py); the Broker of state.py
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    connection_id: int
    client_host: str
    listener: str = "PLAINTEXT"  # the name of the listener the request arrived on (Metadata answers with its addresses)
    principal: str = "User:ANONYMOUS"  # who the connection authenticated as (SASL, mTLS), for the ACL checks
    session: Any = None  # the connection's SaslSession (SASL listeners), for SaslHandshake/SaslAuthenticate
    close_reason: str | None = None  # set by a handler: close the connection after this response (logged)


@dataclass(slots=True)
class EncodedResponse:
    """A response already framed: ``bytes`` and FileSlice segments, size prefix included.

    The shell releases every FileSlice after writing (or on error)."""

    segments: list[Any]
    replica: bool = False  # a follower's fetch: its record bytes are counted as replication
    def release(self) -> None:
        for segment in self.segments:
            release = getattr(segment, "release", None)
            if release is not None:
                release()


class CloseConnection(Exception):
    """Close this client's connection after logging ``reason`` (no response is written)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
