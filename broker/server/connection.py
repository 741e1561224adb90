"""One client connection: read frames, run one request at a time, write responses in request order.

Kafka mutes a channel while one of its requests is in flight; this loop does the same by simply not
reading the next frame until the response to the current one is written. That keeps responses in order
(kafka-python and aiokafka close on a correlation-id mismatch, trap T4) and bounds memory per connection to
one frame (at most ``socket.request.max.bytes``, 100 MiB) plus what the kernel buffers.

The connection is closed, with one log line naming the client and the reason, when the peer:
announces a frame over the limit or a negative size; sends a header or body that does not parse; uses an
API key or version that is not served (ApiVersions excepted, see ``broker.wire.requests``); or hits an
error on an acks=0 produce. An unexpected exception in a handler is logged with its traceback and closes
only that connection. Nothing a client sends can stop the broker.

Security (the listener's protocol, ``broker.security``): on SSL and SASL_SSL the TLS handshake runs first,
on this socket (``tls_io``); a peer that is not speaking TLS, or whose certificate is refused, is closed
with one log line naming why. Responses then go out by kTLS (the same gathered writes and sendfile, the
kernel encrypting) or by copying through OpenSSL (``tls_io.send_segments_tls``). An SSL listener's principal
is the client certificate's mapped subject (``ssl.principal.mapping.rules``), or ``User:ANONYMOUS``.
On SASL_PLAINTEXT and SASL_SSL the connection's ``SaslSession`` decides what may come: until the exchange
succeeds only ApiVersions, SaslHandshake and SaslAuthenticate are served, any other request closes the
connection with a log line, and frames are capped at ``sasl.server.max.receive.size`` (512 KiB) instead
of ``socket.request.max.bytes``; after a v0 handshake the tokens arrive as bare frames and are answered
here. A failed authentication is answered after ``connection.failed.authentication.delay.ms`` and closes.
A TLS ClientHello on a PLAINTEXT listener reads as a ~370 MB frame size and closes the connection with a
log line saying so.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import struct
import threading
import time

from copyless.broker.handlers.context import CloseConnection, EncodedResponse, RequestContext
from copyless.broker.security.manager import ANONYMOUS
from copyless.broker.security.sasl import StepKind
from copyless.broker.server.transfer import Writable, send_bytes, send_segments, wait_readable, wait_writable
from copyless.broker.stats import response_error_codes
from copyless.broker.wire.codecs import encode_response
from copyless.broker.wire.headers import RemoteProtocolError
from copyless.broker.wire.requests import ApiVersionsFallback, decode_request, encode_api_versions_fallback
from copyless.protocol.framing import FrameBuffer, FrameTooLargeError

__all__ = ["Connection"]

log = logging.getLogger("copyless.connection")

# The receive buffer shared by every connection of an event-loop thread. It is only written and read inside
# one synchronous step (recv_into, then feed), so sharing it is safe on that thread; a process running
# several brokers on several loop threads (tests) gets one per thread. 256 KiB lets a 1 MiB produce arrive
# in four recv calls.
RECV_BUFFER_BYTES = 256 * 1024
_thread_buffers = threading.local()
_SIZE = struct.Struct(">i")
# A TLS ClientHello starts 0x16 0x03 0x0N: read as a Kafka frame size, 0x1603xxxx (~370 MB).
_TLS_RECORD_PREFIX = 0x1603


def _recv_view() -> memoryview:
    view = getattr(_thread_buffers, "view", None)
    if view is None:
        view = _thread_buffers.view = memoryview(bytearray(RECV_BUFFER_BYTES))
    return view


class Connection:
    def __init__(self, server, sock: socket.socket, address, connection_id: int, listener: str = "PLAINTEXT") -> None:
        self.server = server
        self.broker = server.broker
        self.sock = sock
        self.fd = sock.fileno()
        self.client_host = address[0] if isinstance(address, tuple) else str(address)
        self.peer = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
        self.connection_id = connection_id
        self.listener = listener
        self.frames = FrameBuffer(self.broker.config.max_request_bytes)
        self.busy = False
        self.client_id: str | None = None
        security = self.broker.security
        self.runtime = security.listener(listener)
        self.sasl = security.new_sasl_session(listener)
        self.principal = ANONYMOUS
        self.tls: ssl.SSLSocket | None = None
        # What responses are written to: the socket itself (PLAINTEXT, SASL_PLAINTEXT), a KernelTlsWriter
        # (kTLS: the kernel encrypts), or None (copying through OpenSSL).
        self.writer: Writable | None = sock
        if self.sasl is not None:
            # Until authenticated, frames are capped at sasl.server.max.receive.size.
            self.frames.max_frame_bytes = min(self.frames.max_frame_bytes, security.max_receive_bytes())
        # Loop time of the last request (or of the accept): the idle reaper closes connections quiet for
        # longer than connections.max.idle.ms.
        self.last_active = asyncio.get_running_loop().time()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        stats = self.broker.stats
        recv_view = _recv_view()
        try:
            if self.runtime.context is not None and not await self._tls_handshake(loop):
                return
            while True:
                try:
                    frame: bytes | bytearray | None = self.frames.next_frame()
                except FrameTooLargeError as exc:
                    if exc.size < 0:
                        self._close_reason(f"invalid frame size {exc.size}")
                    elif exc.size >> 16 == _TLS_RECORD_PREFIX:
                        self._close_reason(f"a TLS handshake arrived on {self.runtime.protocol} listener "
                                           f"{self.listener} (the client is configured for SSL)")
                    elif self.sasl is not None and not self.sasl.authenticated:
                        self._close_reason(f"frame of {exc.size} bytes before authentication exceeds "
                                           f"sasl.server.max.receive.size={exc.limit}")
                    else:
                        self._close_reason(f"frame of {exc.size} bytes exceeds socket.request.max.bytes={exc.limit}")
                    return
                if frame is None:
                    if self.server.closing:
                        return
                    partial = self.frames.take_partial()
                    if partial is None:
                        received = await self._recv_into(loop, recv_view)
                        if received == 0:
                            return  # orderly close by the client
                        # A large frame's first chunk goes straight into the frame, anything else is fed.
                        partial = self.frames.take_partial_of(recv_view[:received])
                        if partial is None:
                            self.frames.feed(recv_view[:received])
                            continue
                    frame = await self._receive_rest(loop, *partial)
                    if frame is None:
                        return  # closed by the client mid-frame
                self.busy = True
                try:
                    keep_open = await self._handle_frame(loop, frame)
                finally:
                    self.busy = False
                    self.last_active = loop.time()
                if not keep_open or self.server.closing:
                    return
        except (ConnectionError, OSError) as exc:
            log.debug("connection %s (%s) dropped: %s", self.peer, self.client_id, exc)
        except asyncio.CancelledError:
            pass
        finally:
            stats.connections_open -= 1
            try:
                self.sock.close()
            except OSError:
                pass

    async def _receive_rest(self, loop, frame: bytearray, filled: int) -> bytearray | None:
        """Receive the rest of a large frame straight into it (see FrameBuffer.take_partial); None if the
        client closed the connection first."""
        with memoryview(frame) as view:
            while filled < len(frame):
                received = await self._recv_into(loop, view[filled:])
                if received == 0:
                    return None
                filled += received
        return frame

    async def _recv_into(self, loop, view) -> int:
        """One recv_into ``view``, waiting for the socket to be readable; 0 once the client closed. Through
        TLS the first attempt may return what OpenSSL already holds without the fd being readable."""
        while True:
            try:
                return self.sock.recv_into(view)
            except (BlockingIOError, ssl.SSLWantReadError):
                await wait_readable(loop, self.fd)
            except ssl.SSLWantWriteError:
                await wait_writable(loop, self.fd)
            except InterruptedError:
                pass

    async def _tls_handshake(self, loop) -> bool:
        """TLS on this socket; the principal of an SSL listener's client. False when the connection is
        closed instead (logged)."""
        from copyless.broker.security.principal import MappingError
        from copyless.broker.security.tls import ktls_engaged
        from copyless.broker.server.tls_io import KernelTlsWriter, handshake

        security = self.broker.security
        try:
            tls = await handshake(loop, self.sock, self.runtime.context)
        except (ssl.SSLError, OSError) as exc:
            security.stats["tls_handshake_failures"] += 1
            reason = getattr(exc, "reason", None) or exc.__class__.__name__
            hint = " (a plaintext client on a TLS listener?)" if reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST",
                                                                            "UNSUPPORTED_PROTOCOL") else ""
            self._close_reason(f"TLS handshake on listener {self.listener} failed: {reason}{hint}")
            return False
        self.sock = self.tls = tls
        self.fd = tls.fileno()
        if self.runtime.ktls and ktls_engaged(tls):
            self.writer = KernelTlsWriter(tls)
            security.stats["ktls_sessions"] += 1
        else:
            self.writer = None
            security.stats["tls_copy_sessions"] += 1
        if self.sasl is None:
            try:
                self.principal = security.tls_principal(self.listener, tls)
            except MappingError as exc:
                self._close_reason(f"TLS client refused: {exc}")
                return False
        return True

    async def _send_bytes(self, loop, data) -> None:
        if self.writer is None:
            from copyless.broker.server.tls_io import send_bytes_tls

            assert self.tls is not None  # no writer: a TLS session copying through OpenSSL
            await send_bytes_tls(loop, self.tls, data, self.broker.stats)
        else:
            await send_bytes(loop, self.writer, data, self.broker.stats)

    async def _send_segments(self, loop, segments, replica: bool) -> None:
        stats = self.broker.stats
        if self.writer is None:
            from copyless.broker.server.tls_io import send_segments_tls

            assert self.tls is not None  # no writer: a TLS session copying through OpenSSL
            await send_segments_tls(loop, self.tls, segments, stats, self.broker.security.stats, replica=replica)
            return
        ktls = self.tls is not None
        sendfile_before = stats.fetch_sendfile_bytes + stats.replica_sendfile_bytes
        await send_segments(loop, self.writer, segments, stats, use_sendfile=self.server.use_sendfile,
                            replica=replica)
        if ktls:
            self.broker.security.stats["ktls_sendfile_bytes"] += (stats.fetch_sendfile_bytes
                                                                  + stats.replica_sendfile_bytes - sendfile_before)

    async def _raw_sasl_token(self, loop, frame) -> bool:
        """A bare SASL token after a v0 SaslHandshake: answered with a bare frame; a failure closes (after
        the delay) with nothing written, as Kafka does for v0 clients."""
        from copyless.broker.handlers.sasl import run_step

        step = await run_step(self.broker, self.sasl, bytes(frame))
        if step.kind == StepKind.FAILURE:
            await asyncio.sleep(self.broker.security.failed_authentication_delay_s())
            self._close_reason(f"SASL authentication failed: {step.error}")
            return False
        await self._send_bytes(loop, _SIZE.pack(len(step.response)) + step.response)
        self._after_authentication_step()
        return True

    def _after_authentication_step(self) -> None:
        """Once authenticated, the connection takes requests of any size and carries the principal."""
        if self.sasl is not None and self.sasl.authenticated:
            self.principal = self.sasl.principal
            self.frames.max_frame_bytes = self.broker.config.max_request_bytes

    def _close_reason(self, reason: str) -> None:
        self.broker.stats.connections_closed_on_error += 1
        log.warning("closing connection from %s (client_id=%s): %s", self.peer, self.client_id, reason)

    async def _handle_frame(self, loop, frame) -> bool:
        broker = self.broker
        sasl = self.sasl
        if sasl is not None and sasl.expects_raw_token:
            return await self._raw_sasl_token(loop, frame)
        try:
            decoded = decode_request(frame, broker.handlers.served())
        except RemoteProtocolError as exc:
            self._close_reason(exc.reason)
            return False
        header = decoded.header
        self.client_id = header.client_id
        broker.stats.requests[header.api_key] += 1
        if sasl is not None:
            refusal = sasl.refusal(header.api_key)
            if refusal is not None:
                broker.security.stats["unauthenticated_requests"] += 1
                self._close_reason(refusal)
                return False
        if isinstance(decoded, ApiVersionsFallback):
            low, high = broker.handlers.served()[header.api_key]
            await self._send_bytes(loop, encode_api_versions_fallback(header.correlation_id, low, high))
            return True
        ctx = RequestContext(
            broker=broker,
            api_key=header.api_key,
            api_version=header.api_version,
            correlation_id=header.correlation_id,
            client_id=header.client_id,
            connection_id=self.connection_id,
            client_host=self.client_host,
            listener=self.listener,
            principal=self.principal,
            session=sasl,
        )
        handler = broker.handlers.handler(header.api_key)
        started = time.perf_counter()
        try:
            response = await handler(ctx, decoded.body)
        except CloseConnection as exc:
            self._close_reason(exc.reason)
            return False
        except asyncio.CancelledError:
            raise
        except Exception:
            self.broker.stats.connections_closed_on_error += 1
            log.exception(
                "handler for API key %d v%d failed (client %s, correlation id %d); closing the connection",
                header.api_key, header.api_version, self.peer, header.correlation_id,
            )
            return False
        stats = broker.stats
        if response is None:
            stats.record_request(header.api_key, time.perf_counter() - started)
            return True
        if isinstance(response, EncodedResponse):
            # More than one segment: a response with records (a fetch's head, FileSlices, tail), whose write
            # time goes into the fetch_send histogram; one segment is an all-bytes response. Its handler
            # counted its errors.
            send_started = time.perf_counter() if len(response.segments) > 1 else None
            try:
                await self._send_segments(loop, response.segments, response.replica)
            finally:
                response.release()
            done = time.perf_counter()
            if send_started is not None:
                stats.fetch_send.record(done - send_started)
            stats.record_request(header.api_key, done - started)
            return True
        try:
            data = encode_response(header.correlation_id, header.api_key, header.api_version, response)
        except Exception:
            log.exception("encoding the response to API key %d v%d failed; closing", header.api_key, header.api_version)
            return False
        for code in response_error_codes(response):
            stats.request_errors[(header.api_key, code)] += 1
        await self._send_bytes(loop, data)
        stats.record_request(header.api_key, time.perf_counter() - started)
        if ctx.close_reason is not None:
            self._close_reason(ctx.close_reason)
            return False
        self._after_authentication_step()
        return True
