"""``GET /metrics`` over HTTP/1.1 on ``--metrics-listen HOST:PORT``, served by the broker's own event loop.

A dozen lines of HTTP are all Prometheus needs: it sends ``GET /metrics`` with a few headers and reads a
``Content-Length`` body, keeping the connection alive between scrapes. Hand-written rather than
``prometheus_client``: its server runs on a thread of its own, which would read the loop thread's counters
and partitions while they change, and its registry would mean keeping every counter twice.

Per connection: a request head of at most ``MAX_HEAD_BYTES`` arriving within ``READ_TIMEOUT_S``; ``GET`` or
``HEAD`` of ``/metrics`` (a query string ignored) -> 200 with the exposition (``broker.metrics``); another
path -> 404; another method -> 405; a head that does not parse, is too long or too slow -> 400 or a closed
connection, with one log line. ``Connection: close`` (or HTTP/1.0) closes after the answer. Nothing a
client sends reaches the Kafka listeners or the broker's state.

Loop thread. A scrape renders O(partitions) lines on the loop: about 1 us per line.
"""

from __future__ import annotations

import asyncio
import logging

from copyless.broker.metrics import CONTENT_TYPE, collect, render

__all__ = ["MetricsServer"]

log = logging.getLogger("copyless.metrics")

MAX_HEAD_BYTES = 8192
READ_TIMEOUT_S = 30.0


class MetricsServer:
    def __init__(self, broker) -> None:
        self.broker = broker
        self.server: asyncio.AbstractServer | None = None
        self.address: tuple[str, int] | None = None
        self.scrapes = 0

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Bind and serve. Returns the bound (host, port). Raises OSError when the address cannot be bound."""
        self.server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD_BYTES)
        bound = self.server.sockets[0].getsockname()
        self.address = (bound[0], bound[1])
        log.info("serving Prometheus metrics on http://%s:%d/metrics", *self.address)
        return self.address

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            # Idle keep-alive connections are not waited for (asyncio 3.11 waits only for the listener).
            await self.server.wait_closed()
            self.server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
                except asyncio.IncompleteReadError:
                    return  # the client closed between requests
                except asyncio.LimitOverrunError:
                    await self._answer(writer, 400, b"request head too long\n", close=True)
                    log.info("metrics request from %s refused: head over %d bytes", peer, MAX_HEAD_BYTES)
                    return
                except TimeoutError:
                    return
                keep_open = await self._handle(writer, head, peer)
                if not keep_open:
                    return
        except (ConnectionError, OSError):
            return
        finally:
            writer.close()

    async def _handle(self, writer: asyncio.StreamWriter, head: bytes, peer) -> bool:
        try:
            text = head.decode("latin-1")
            request_line, *header_lines = text.split("\r\n")
            method, target, version = request_line.split(" ")
            if not version.startswith("HTTP/1."):
                raise ValueError(version)
            headers = {}
            for line in header_lines:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip().lower()
        except ValueError:
            log.info("metrics request from %s refused: malformed request line", peer)
            await self._answer(writer, 400, b"malformed request\n", close=True)
            return False
        close = headers.get("connection") == "close" or version == "HTTP/1.0"
        if method not in ("GET", "HEAD"):
            await self._answer(writer, 405, b"only GET\n", close=close, extra=b"Allow: GET, HEAD\r\n")
        elif target.split("?", 1)[0] != "/metrics":
            await self._answer(writer, 404, b"not found: the metrics are at /metrics\n", close=close)
        else:
            self.scrapes += 1
            body = render(collect(self.broker)).encode()
            await self._answer(writer, 200, body, close=close, content_type=CONTENT_TYPE, head_only=method == "HEAD")
        return not close

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, status: int, body: bytes, *, close: bool,
                      content_type: str = "text/plain; charset=utf-8", extra: bytes = b"",
                      head_only: bool = False) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}[status]
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                f"{'Connection: close' + chr(13) + chr(10) if close else ''}").encode() + extra + b"\r\n"
        writer.write(head if head_only else head + body)
        await writer.drain()
