"""One TCP connection to a Kafka-protocol broker: the client's asyncio shell over the pure wire pieces.

Owns: the non-blocking socket, gathered writes (``socket.sendmsg`` of ``SendQueue.iov()``; partial writes
and EAGAIN resume from ``loop.add_writer``), reads straight into the ``ReceiveBuffer``'s reusable buffers
(``recv_into`` from a ``loop.add_reader`` callback: no per-read coroutine, no intermediate ``bytes``), the
FIFO of in-flight requests matched by correlation id, request timeouts, and the ApiVersions handshake.

The handshake also tells a Kafka broker from anything else listening on the port: the answer must come
within ``HANDSHAKE_TIMEOUT_MS`` and start like a Kafka response (a size of at most
``MAX_HANDSHAKE_RESPONSE_BYTES``, then the request's correlation id); otherwise ``NotKafkaError`` names what
answered (``HTTP/1.1 400 Bad Request``: an HTTP server; a TLS alert: a TLS port) or that nothing did.

Security (``client.security.ClientSecurity``): on SSL and SASL_SSL the TLS handshake runs on the socket
itself after the TCP connect; writes then go through ``SSLSocket.send`` (which takes no iovec: each write
joins up to ``TLS_WRITE_BYTES`` of the queue, a copy TLS makes anyway) and reads through ``recv_into`` on the
SSLSocket, draining OpenSSL's buffer (``pending()``) before waiting on the fd again. On SASL_PLAINTEXT and
SASL_SSL, after ApiVersions: SaslHandshake v1 and SaslAuthenticate v1 with PLAIN or SCRAM-SHA-256/512
(``protocol.scram``); a refusal raises ``KafkaError(SASL_AUTHENTICATION_FAILED)`` and is not
retried. When the broker bounds the session (KIP-368's ``session_lifetime_ms``) the connection
re-authenticates by itself at 85% of the lifetime, between requests like any other request.

A raw socket rather than an asyncio transport: transports do not expose partial-write control, and
stdlib 3.11's ``writelines`` joins the buffers into one copy (reference §3.5), which is what gathering
avoids. Works under the stdlib loop and uvloop (both implement ``add_reader``/``add_writer``).

Responses arrive in request order (Kafka processes one request per connection at a time); a correlation
id that does not match the oldest in-flight request means the stream is broken and the connection closes,
failing every in-flight request with ``KafkaConnectionError`` (as aiokafka and kafka-python do).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import socket
import ssl
import struct
import time

from copyless.client.errors import (
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    NotKafkaError,
    UnsupportedVersionError,
)
from copyless.client.security import PLAINTEXT, ClientSecurity
from copyless.protocol.batch_builder import GATHER_MIN_VALUE_BYTES
from copyless.protocol.framing import FrameTooLargeError
from copyless.protocol.gather import SendQueue
from copyless.protocol.messages import API_VERSIONS, api_name, encode_request_header, kio_decoder
from copyless.protocol.receive import LeasedFrame, ReceiveBuffer

__all__ = ["Connection", "DEFAULT_REQUEST_TIMEOUT_MS"]

log = logging.getLogger("copyless.client.conn")

DEFAULT_REQUEST_TIMEOUT_MS = 30_000
_CORRELATION = struct.Struct(">i")
_SIZE = struct.Struct(">i")
# Queued-but-unsent bytes above which writers should await ``drain()`` (back-pressure to the producer).
WRITE_HIGH_WATER_BYTES = 4 * 1024 * 1024
# A Kafka broker answers ApiVersions from its network thread at once (copyless and Kafka 3.9 here: under
# 10 ms); a port that has said nothing in 5 s is not a serving broker.
HANDSHAKE_TIMEOUT_MS = 5000
# Kafka 3.9's ApiVersions answer is under 1 KB; any broker's fits in 1 MiB, while the first four bytes of
# "HTTP/1.1" announce 1.2 GB and a TLS alert 352 MB.
MAX_HANDSHAKE_RESPONSE_BYTES = 1 << 20
# How much of a non-Kafka answer the error shows.
GREETING_BYTES = 48
# One SSL_write offers at most this much of the queue (16 TLS records).
TLS_WRITE_BYTES = 256 * 1024
# Re-authenticate when this share of the broker's session lifetime has passed (Kafka's client picks a
# random point in 85-95%).
REAUTH_AT = 0.85
SASL_HANDSHAKE_API_KEY, SASL_AUTHENTICATE_API_KEY = 17, 36


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _join(iov: list, limit: int):
    """The first ``limit`` bytes of ``iov`` as one buffer (what one SSL_write offers)."""
    if len(iov[0]) >= limit or len(iov) == 1:
        return memoryview(iov[0])[:limit]
    parts, total = [], 0
    for buffer in iov:
        if total + len(buffer) > limit:
            parts.append(buffer[:limit - total])
            break
        parts.append(buffer)
        total += len(buffer)
    return b"".join(parts)


class _InFlight:
    """One request awaiting its response: its ``future``, or (``Connection.send(on_response=...)``) its
    ``callback``, which the connection calls itself."""

    __slots__ = ("correlation_id", "future", "callback", "decoder", "wants_lease", "deadline", "api_key")

    def __init__(self, correlation_id, future, callback, decoder, wants_lease, deadline, api_key):
        self.correlation_id = correlation_id
        self.future = future
        self.callback = callback
        self.decoder = decoder
        self.wants_lease = wants_lease
        self.deadline = deadline
        self.api_key = api_key

    def settle(self, result, error: BaseException | None, *, mark_retrieved: bool = False) -> None:
        """Deliver the outcome once: to the callback, or to the future if it is still pending
        (``mark_retrieved``: an error set on the future counts as retrieved)."""
        callback = self.callback
        if callback is not None:
            self.callback = None
            try:
                callback(result, error)
            except Exception:  # the caller's bug: report it like an event-loop callback, keep reading
                log.exception("response callback for api %s failed", self.api_key)
            return
        future = self.future
        if future is None or future.done():
            return
        if error is not None:
            future.set_exception(error)
            if mark_retrieved:
                future.exception()
        else:
            future.set_result(result)


class Connection:
    """A connection to ``host:port``. Create with ``await Connection.open(...)``.

    All methods: loop thread only.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str = "copyless",
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        connect_timeout_ms: int | None = None,
        gather_min_bytes: int = GATHER_MIN_VALUE_BYTES,
        node_id: int | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        self.host = host
        self.security = security or PLAINTEXT
        self.connect_timeout_ms = connect_timeout_ms if connect_timeout_ms is not None else request_timeout_ms
        self.port = port
        self.node_id = node_id
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self._loop = asyncio.get_running_loop()
        self._sock: socket.socket | None = None
        self._send_queue = SendQueue(gather_min_bytes)
        self._receive = ReceiveBuffer()
        self._in_flight: collections.deque[_InFlight] = collections.deque()
        self._correlation_id = 0
        self._writer_registered = False
        self._drain_waiters: list[asyncio.Future] = []
        self._timeout_handle: asyncio.TimerHandle | None = None
        self.closed_error: BaseException | None = None
        self.api_versions: dict[int, tuple[int, int]] = {}
        # The first bytes the peer sent, kept until the handshake's answer is checked (None afterwards).
        self._greeting: bytearray | None = None
        self._tls = False
        self._reauth_handle: asyncio.TimerHandle | None = None
        self.reauthentications = 0

    @classmethod
    async def open(cls, host: str, port: int, **kwargs) -> Connection:
        """Connect and run the ApiVersions v0 handshake.

        Raises:
            KafkaConnectionError: the connection failed or the handshake did not complete.
        """
        connection = cls(host, port, **kwargs)
        await connection._connect()
        return connection

    async def _connect(self) -> None:
        loop = self._loop
        try:
            infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise KafkaConnectionError(f"cannot resolve {self.host}:{self.port}: {exc}") from exc
        last: OSError | None = None
        for family, kind, proto, _name, address in infos:
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                async with asyncio.timeout(self.connect_timeout_ms / 1000):
                    await loop.sock_connect(sock, address)
            except (OSError, TimeoutError) as exc:
                sock.close()
                last = exc if isinstance(exc, OSError) else OSError(str(exc) or "connect timed out")
                continue
            self._sock = sock
            break
        if self._sock is None:
            raise KafkaConnectionError(f"cannot connect to {self.host}:{self.port}: {last}")
        sock = self._sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Large socket buffers let one sendmsg take a whole produce request and one recv_into a large part
        # of a fetch response (the kernel doubles the value and caps it at net.core.*mem_max).
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, 4 * 1024 * 1024)
            except OSError:
                pass
        if self.security.tls:
            await self._tls_handshake()
            sock = self._sock
        loop.add_reader(sock.fileno(), self._on_readable)
        from kio.schema.api_versions.v0.request import ApiVersionsRequest
        from kio.schema.api_versions.v0.response import ApiVersionsResponse

        self._greeting = bytearray()
        timeout_ms = min(self.request_timeout_ms, HANDSHAKE_TIMEOUT_MS)
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                response = await self.request_kio(ApiVersionsRequest(), ApiVersionsResponse, check_version=False)
        except TimeoutError:
            error = NotKafkaError(
                f"{self.host}:{self.port} accepted the connection but did not answer ApiVersions (API 18) within "
                f"{timeout_ms} ms: is it a Kafka broker's port? (a stopped or overloaded broker is as silent)")
            self.close(error)
            raise error from None
        except NotKafkaError:
            raise
        except Exception as exc:
            self.close(KafkaConnectionError(f"ApiVersions handshake with {self.host}:{self.port} failed: {exc}"))
            raise
        finally:
            self._greeting = None
        if response.error_code != 0:
            self.close()
            raise KafkaError(int(response.error_code), "ApiVersions")
        self.api_versions = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys}
        if self.security.sasl:
            try:
                await self.authenticate()
            except BaseException as exc:
                self.close(exc if isinstance(exc, KafkaError) else
                           KafkaConnectionError(f"SASL authentication with {self.host}:{self.port} failed: {exc}"))
                raise

    async def _tls_handshake(self) -> None:
        """TLS on the connected socket (module docstring). Raises KafkaConnectionError."""
        loop = self._loop
        context, sock = self.security.ssl_context, self._sock
        # ClientSecurity.check() refuses TLS without a context; connect() made the socket.
        assert context is not None and sock is not None
        try:
            tls = context.wrap_socket(sock, server_side=False, do_handshake_on_connect=False, server_hostname=self.host)
        except (ssl.SSLError, OSError, ValueError) as exc:
            sock.close()
            self._sock = None
            raise KafkaConnectionError(f"TLS with {self.host}:{self.port} failed: {exc}") from exc
        self._sock = tls
        self._tls = True
        fd = tls.fileno()
        try:
            async with asyncio.timeout(self.connect_timeout_ms / 1000):
                while True:
                    try:
                        tls.do_handshake()
                        return
                    except ssl.SSLWantReadError:
                        waiter = loop.create_future()
                        loop.add_reader(fd, _resolve, waiter)
                        try:
                            await waiter
                        finally:
                            loop.remove_reader(fd)
                    except ssl.SSLWantWriteError:
                        waiter = loop.create_future()
                        loop.add_writer(fd, _resolve, waiter)
                        try:
                            await waiter
                        finally:
                            loop.remove_writer(fd)
        except (ssl.SSLError, OSError, TimeoutError) as exc:
            error = KafkaConnectionError(f"TLS handshake with {self.host}:{self.port} failed: "
                                         f"{getattr(exc, 'reason', None) or exc or 'timed out'}")
            self.close(error)
            raise error from exc

    async def authenticate(self) -> None:
        """SaslHandshake v1 then SaslAuthenticate v1 with the configured mechanism (also the
        re-authentication). Raises KafkaError (UNSUPPORTED_SASL_MECHANISM, SASL_AUTHENTICATION_FAILED...)."""
        from kio.schema.sasl_authenticate.v1.request import SaslAuthenticateRequest
        from kio.schema.sasl_authenticate.v1.response import SaslAuthenticateResponse
        from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
        from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse

        security = self.security
        mechanism, username, password = security.mechanism, security.username, security.password
        # ClientSecurity.check() refuses a SASL protocol without all three.
        assert mechanism is not None and username is not None and password is not None
        handshake = await self.request_kio(SaslHandshakeRequest(mechanism=mechanism), SaslHandshakeResponse,
                                           check_version=False)
        if handshake.error_code != 0:
            raise KafkaError(int(handshake.error_code), f"{mechanism} (the broker offers "
                                                        f"{', '.join(handshake.mechanisms) or 'none'})")

        async def step(token: bytes) -> SaslAuthenticateResponse:
            response = await self.request_kio(SaslAuthenticateRequest(auth_bytes=token), SaslAuthenticateResponse,
                                              check_version=False)
            if response.error_code != 0:
                raise KafkaError(int(response.error_code), response.error_message or "")
            return response

        if mechanism == "PLAIN":
            response = await step(f"\0{username}\0{password}".encode())
        else:
            from copyless.protocol.scram import ScramClient, ScramError

            client = ScramClient(mechanism, username, password, secrets.token_urlsafe(24))
            server_first = (await step(client.first())).auth_bytes
            try:
                # PBKDF2 (4096+ HMACs, a few ms): off the event loop.
                final = await asyncio.to_thread(client.final, server_first)
                response = await step(final)
                client.verify(response.auth_bytes)
            except ScramError as exc:
                raise KafkaError(58, str(exc)) from None
        lifetime_ms = int(response.session_lifetime.total_seconds() * 1000)
        if self._reauth_handle is not None:
            self._reauth_handle.cancel()
            self._reauth_handle = None
        if lifetime_ms > 0 and self.closed_error is None:
            self._reauth_handle = self._loop.call_later(lifetime_ms / 1000 * REAUTH_AT, self._start_reauthentication)

    def _start_reauthentication(self) -> None:
        self._reauth_handle = None
        if self.closed_error is not None:
            return

        async def reauthenticate() -> None:
            try:
                await self.authenticate()
                self.reauthentications += 1
            except Exception as exc:
                self.close(exc if isinstance(exc, KafkaError)
                           else KafkaConnectionError(f"re-authentication failed: {exc}"))

        self._loop.create_task(reauthenticate(), name=f"copyless-reauth-{self.host}:{self.port}")

    def _not_kafka(self, why: str) -> NotKafkaError:
        """The error for a handshake answered by something that is not a Kafka broker."""
        greeting = bytes(self._greeting or b"")
        guess = ""
        if greeting.startswith(b"HTTP/"):
            guess = " (an HTTP server)"
        elif greeting[:1] in (b"\x15", b"\x16") and greeting[1:2] == b"\x03":
            guess = " (a TLS server: is it a TLS listener?)"
        elif greeting.startswith(b"SSH-"):
            guess = " (an SSH server)"
        shown = greeting.split(b"\r\n")[0] if greeting.startswith(b"HTTP/") else greeting
        return NotKafkaError(f"{self.host}:{self.port} is not a Kafka broker{guess}: it answered ApiVersions with "
                             f"{shown!r}{why}")

    def _closed_in_handshake(self, what: str) -> NotKafkaError:
        return NotKafkaError(f"{self.host}:{self.port} {what} without answering ApiVersions: is it a Kafka broker's "
                             f"port? (a TLS listener does this to a plaintext client)")

    def _check_greeting(self) -> bool:
        """During the handshake: does the answer so far start like a Kafka response? Closes the connection
        with ``NotKafkaError`` and returns False when it cannot be one."""
        greeting = self._greeting
        assert greeting is not None  # the caller checks: the handshake is still on
        if len(greeting) < 8:
            return True
        size, correlation_id = struct.unpack_from(">ii", greeting)
        if not 6 <= size <= MAX_HANDSHAKE_RESPONSE_BYTES:
            self.close(self._not_kafka(f", which announces a {size}-byte response"))
            return False
        if self._in_flight and correlation_id != self._in_flight[0].correlation_id:
            self.close(self._not_kafka(", which does not carry the request's correlation id"))
            return False
        return True

    # --- state ----------------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.closed_error is not None

    @property
    def in_flight_count(self) -> int:
        return len(self._in_flight)

    @property
    def queued_bytes(self) -> int:
        return self._send_queue.queued_bytes

    def supports(self, api_key: int, version: int) -> bool:
        low_high = self.api_versions.get(api_key)
        return low_high is not None and low_high[0] <= version <= low_high[1]

    def _unsupported(self, api_key: int, version: int) -> str:
        versions = self.api_versions.get(api_key)
        have = f"it supports v{versions[0]}-v{versions[1]}" if versions else "it does not have this API"
        return (f"UNSUPPORTED_VERSION: broker {self.host}:{self.port} does not support "
                f"{api_name(api_key)} (API {api_key}) v{version} ({have})")

    def check_version(self, api_key: int) -> int:
        version = API_VERSIONS[api_key]
        if self.api_versions and not self.supports(api_key, version):
            raise UnsupportedVersionError(self._unsupported(api_key, version))
        return version

    # --- sending ----------------------------------------------------------------------------------------

    def send(
        self,
        api_key: int,
        body: list,
        decoder=None,
        *,
        expect_response: bool = True,
        wants_lease: bool = False,
        check_version: bool = True,
        on_response=None,
        version: int | None = None,
    ) -> asyncio.Future | None:
        """Queue one request (``body`` = list of buffers) and try to write it now.

        ``version``: the header's API version (default: the one the client speaks, ``API_VERSIONS``).

        Returns a future resolved with ``decoder(frame, 4)`` (``frame`` is bytes, or a ``LeasedFrame``
        when ``wants_lease``; the decoder then owns the lease), or None when no response is expected
        (Produce with acks=0) or ``on_response`` is given.

        ``on_response(result, error)``, instead of a future: called exactly once, with the decoded
        response and None, or None and the error that failed the request (the connection closed, timed
        out, or sent something undecodable), from inside the connection's read handler (or ``close``,
        which ``send`` itself may call when the write fails), without the event loop's extra round through
        its ready queue that a future's done-callbacks take. It must not raise.

        Raises:
            KafkaConnectionError: the connection is closed.
        """
        if self.closed_error is not None:
            raise KafkaConnectionError(f"connection to {self.host}:{self.port} is closed: {self.closed_error}")
        if version is None:
            version = self.check_version(api_key) if check_version else API_VERSIONS[api_key]
        elif check_version and self.api_versions and not self.supports(api_key, version):
            raise UnsupportedVersionError(self._unsupported(api_key, version))
        self._correlation_id = correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        header = encode_request_header(api_key, version, correlation_id, self.client_id)
        size = len(header)
        for buffer in body:
            size += len(buffer)
        queue = self._send_queue
        queue.extend((_SIZE.pack(size) + header,))
        queue.extend(body)
        future = None
        if expect_response:
            if on_response is None:
                future = self._loop.create_future()
            deadline = time.monotonic() + self.request_timeout_ms / 1000
            self._in_flight.append(
                _InFlight(correlation_id, future, on_response, decoder, wants_lease, deadline, api_key)
            )
            if self._timeout_handle is None:
                self._timeout_handle = self._loop.call_later(
                    self.request_timeout_ms / 1000 + 0.05, self._check_timeouts
                )
        if not self._writer_registered:
            self._flush()
        return future

    async def request(self, api_key: int, body: list, decoder, **kwargs):
        """Send a request and await its decoded response."""
        future = self.send(api_key, body, decoder, **kwargs)
        assert future is not None  # a response is expected, and no callback takes it
        return await future

    async def request_kio(self, request, response_cls, *, check_version: bool = True):
        """Send a kio request entity and await the decoded kio response entity."""
        from copyless.protocol.messages import encode_kio

        api_key = int(request.__api_key__)
        body = encode_kio(request)
        flexible = bool(getattr(request, "__flexible__", False))
        if flexible:
            # Request header v2 = v1 + an empty tagged-field section; the response header v1 likewise
            # carries one after the correlation id (KIP-482). ApiVersions is the exception both ways, and
            # the client never sends it flexible.
            body = b"\x00" + body
        # The entity's own version goes in the header: it is the version its fields were encoded for.
        return await self.request(api_key, [body], kio_decoder(response_cls, skip_tagged_header=flexible),
                                  check_version=check_version, version=int(request.__version__))

    async def drain(self) -> None:
        """Wait until queued bytes fall below the high-water mark (back-pressure for big producers)."""
        while self._send_queue.queued_bytes > WRITE_HIGH_WATER_BYTES and self.closed_error is None:
            waiter = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter
        if self.closed_error is not None:
            raise KafkaConnectionError(str(self.closed_error))

    def _flush(self) -> None:
        queue = self._send_queue
        sock = self._sock
        assert sock is not None  # send() refuses a closed connection, and _on_writable checks
        while queue.queued_bytes:
            iov = queue.iov()
            try:
                if self._tls:
                    offered = _join(iov, TLS_WRITE_BYTES)
                    try:
                        sent = sock.send(offered)
                    except ssl.SSLWantReadError:
                        sent = 0
                    partial = sent < len(offered)
                else:
                    sent = sock.sendmsg(iov)
                    partial = len(iov) < queue.iov_max
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                sent, partial = 0, True
            except OSError as exc:
                self.close(KafkaConnectionError(f"write to {self.host}:{self.port} failed: {exc}"))
                return
            queue.advance(sent)
            if queue.queued_bytes and (sent == 0 or partial):
                # Partial write or EAGAIN: the socket buffer is full; resume when it is writable.
                if not self._writer_registered:
                    self._loop.add_writer(sock.fileno(), self._on_writable)
                    self._writer_registered = True
                return
        if self._writer_registered:
            self._loop.remove_writer(sock.fileno())
            self._writer_registered = False
        self._wake_drain_waiters()

    def _on_writable(self) -> None:
        if self._sock is None:
            return
        self._flush()
        if self._send_queue.queued_bytes <= WRITE_HIGH_WATER_BYTES:
            self._wake_drain_waiters()

    def _wake_drain_waiters(self) -> None:
        if self._drain_waiters:
            waiters, self._drain_waiters = self._drain_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    # --- receiving --------------------------------------------------------------------------------------

    def _on_readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        receive = self._receive
        try:
            while True:
                target = receive.get_buffer()
                wanted = len(target)
                try:
                    count = sock.recv_into(target)
                    if self._greeting is not None and count and len(self._greeting) < GREETING_BYTES:
                        self._greeting += target[:min(count, GREETING_BYTES - len(self._greeting))]
                except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    break
                finally:
                    target.release()
                if count == 0:
                    if self._greeting:
                        self.close(self._not_kafka(" and closed the connection"))
                    elif self._greeting is not None:
                        self.close(self._closed_in_handshake("closed the connection"))
                    else:
                        self.close(KafkaConnectionError(f"{self.host}:{self.port} closed the connection"))
                    return
                if self._greeting is not None and not self._check_greeting():
                    return
                receive.buffer_updated(count)
                while (frame := receive.next_frame()) is not None:
                    self._dispatch(frame)
                    if self._sock is None:
                        return
                if count < wanted and not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                    break
        except FrameTooLargeError as exc:
            self.close(KafkaConnectionError(f"{self.host}:{self.port}: {exc}"))
        except OSError as exc:
            if self._greeting is not None:
                self.close(self._not_kafka(f" and then {exc.strerror or exc}") if self._greeting
                           else self._closed_in_handshake(f"closed the connection ({exc.strerror or exc})"))
            else:
                self.close(KafkaConnectionError(f"read from {self.host}:{self.port} failed: {exc}"))

    def _dispatch(self, frame) -> None:
        leased = isinstance(frame, LeasedFrame)
        data = frame.view if leased else frame
        if len(data) < 4:
            if leased:
                frame.release()
            self.close(KafkaConnectionError(f"{self.host}:{self.port} sent a {len(data)}-byte response"))
            return
        (correlation_id,) = _CORRELATION.unpack_from(data, 0)
        if not self._in_flight or self._in_flight[0].correlation_id != correlation_id:
            if leased:
                frame.release()
            expected = self._in_flight[0].correlation_id if self._in_flight else None
            self.close(
                KafkaConnectionError(
                    f"{self.host}:{self.port} answered correlation id {correlation_id}, expected {expected}"
                )
            )
            return
        entry = self._in_flight.popleft()
        try:
            if entry.wants_lease:
                result = entry.decoder(frame, 4)
            else:
                try:
                    result = entry.decoder(data, 4) if entry.decoder is not None else data
                finally:
                    if leased:
                        del data
                        frame.release()
        except Exception as exc:  # a response we cannot decode: the stream is unusable
            log.warning("undecodable response to api %s from %s:%s: %r", entry.api_key, self.host, self.port, exc)
            entry.settle(None, KafkaConnectionError(f"undecodable response: {exc!r}"))
            self.close(KafkaConnectionError(f"undecodable response: {exc!r}"))
            return
        if entry.future is not None and entry.future.done():
            if entry.wants_lease and hasattr(result, "release"):
                result.release()
            return
        entry.settle(result, None)

    def _check_timeouts(self) -> None:
        self._timeout_handle = None
        if not self._in_flight or self._sock is None:
            return
        now = time.monotonic()
        head = self._in_flight[0]
        if head.deadline <= now:
            self.close(
                KafkaTimeoutError(
                    f"{api_name(head.api_key)} (API {head.api_key}) request to {self.host}:{self.port} timed out "
                    f"after {self.request_timeout_ms} ms"
                )
            )
            return
        self._timeout_handle = self._loop.call_later(head.deadline - now + 0.05, self._check_timeouts)

    # --- closing ----------------------------------------------------------------------------------------

    def close(self, error: BaseException | None = None) -> None:
        """Close the socket; fail every in-flight request with ``error`` (default KafkaConnectionError)."""
        if self.closed_error is not None:
            return
        self.closed_error = error or KafkaConnectionError(f"connection to {self.host}:{self.port} closed")
        if self._reauth_handle is not None:
            self._reauth_handle.cancel()
            self._reauth_handle = None
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                self._loop.remove_reader(sock.fileno())
                if self._writer_registered:
                    self._loop.remove_writer(sock.fileno())
            except (ValueError, OSError, RuntimeError):
                pass
            sock.close()
        self._writer_registered = False
        if self._timeout_handle is not None:
            self._timeout_handle.cancel()
            self._timeout_handle = None
        in_flight, self._in_flight = self._in_flight, collections.deque()
        for entry in in_flight:
            # Mark retrieved: callers that stopped waiting must not trigger "exception never retrieved".
            entry.settle(None, self.closed_error, mark_retrieved=True)
        self._wake_drain_waiters()

