"""TLS on the broker's raw non-blocking sockets: the handshake, and writing responses through TLS.

The handshake runs on the socket itself (``SSLContext.wrap_socket``, OpenSSL's socket BIO), not through
asyncio's SSL transport: that transport feeds OpenSSL from a memory BIO, so the kernel could never take the
session over (kTLS needs OpenSSL to own the socket), and uvloop refuses readiness callbacks on a transport's
fd anyway. ``do_handshake`` is retried on WANT_READ / WANT_WRITE from ``loop.add_reader`` /
``add_writer``, as every other read and write here.

After the handshake a connection writes one of two ways (``broker.security.tls`` says which engaged):

- kTLS: the kernel encrypts whatever is written to the fd, so ``transfer.send_segments`` runs unchanged on
  ``KernelTlsWriter`` (which writes to the fd, past OpenSSL): gathered ``sendmsg`` for bytes and
  ``os.sendfile`` for records, which never enter Python;
- copying (no kTLS, this machine's case): ``send_segments_tls`` reads each FileSlice into a reused buffer
  with ``preadv`` and ``SSL_write``s it in chunks, joining small runs of bytes so each becomes few TLS
  records. The copied record bytes are counted (``fetch_copied_bytes`` / ``replica_copied_bytes`` and the
  security counter ``tls_copied_bytes``), so the zero-copy proof shows what TLS costs.

OpenSSL's non-blocking write rule: after WANT_WRITE the same bytes must be offered again (Python sets
SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER, so the buffer may move but its content must not). ``_write`` retries
with the same view, so it always does. A write may also want to read (a TLS 1.3 post-handshake message
before the peer's next data): that waits for readability.
"""

from __future__ import annotations

import _socket
import asyncio
import os
import ssl

from copyless.broker.server.transfer import is_cached, wait_readable, wait_writable, warm

__all__ = ["handshake", "send_bytes_tls", "send_segments_tls", "KernelTlsWriter", "TLS_CHUNK_BYTES"]

# One SSL_write of at most this: 16 TLS records of 16 KiB. Larger writes do not cut the per-record cost
# and hold a bigger copy; smaller ones add calls. The same size is the read chunk of a FileSlice.
TLS_CHUNK_BYTES = 256 * 1024
# Runs of small response bytes are joined up to this before an SSL_write (one record instead of many).
_JOIN_BYTES = 64 * 1024


async def handshake(loop, sock, context: ssl.SSLContext, *, server_side: bool = True,
                    server_hostname: str | None = None) -> ssl.SSLSocket:
    """Wrap the connected non-blocking ``sock`` and run the handshake. ``sock`` is detached (its fd now
    belongs to the returned SSLSocket). Raises ssl.SSLError / OSError when the peer is not a TLS peer, is
    refused, or goes away."""
    tls = context.wrap_socket(sock, server_side=server_side, do_handshake_on_connect=False,
                              server_hostname=server_hostname)
    fd = tls.fileno()
    while True:
        try:
            tls.do_handshake()
            return tls
        except ssl.SSLWantReadError:
            await wait_readable(loop, fd)
        except ssl.SSLWantWriteError:
            await wait_writable(loop, fd)
        except BaseException:
            tls.close()
            raise


async def _write(loop, tls: ssl.SSLSocket, view: memoryview, stats) -> None:
    fd = tls.fileno()
    while view:
        chunk = view[:TLS_CHUNK_BYTES]
        try:
            sent = tls.send(chunk)
        except ssl.SSLWantWriteError:
            stats.write_eagain_waits += 1
            await wait_writable(loop, fd)
            continue
        except ssl.SSLWantReadError:
            await wait_readable(loop, fd)
            continue
        view = view[sent:]


async def send_bytes_tls(loop, tls: ssl.SSLSocket, data, stats) -> None:
    """Write one buffer completely through TLS."""
    await _write(loop, tls, memoryview(data), stats)
    stats.response_bytes += len(data)


async def send_segments_tls(loop, tls: ssl.SSLSocket, segments: list, stats, security_stats, *,
                            replica: bool = False) -> None:
    """Write ``bytes`` and FileSlice segments in order through TLS, copying the slices (module docstring).
    Does not release the slices."""
    pending = bytearray()
    buffer = None
    for segment in segments:
        if isinstance(segment, (bytes, bytearray, memoryview)):
            if len(pending) + len(segment) > _JOIN_BYTES and pending:
                await _write(loop, tls, memoryview(pending), stats)
                stats.response_bytes += len(pending)
                pending = bytearray()
            pending += segment
            continue
        if segment.length == 0:
            continue
        if pending:
            await _write(loop, tls, memoryview(pending), stats)
            stats.response_bytes += len(pending)
            pending = bytearray()
        if not is_cached(segment):
            stats.fetch_cold_warmups += 1
            await asyncio.to_thread(warm, segment)
        if buffer is None:
            buffer = bytearray(min(TLS_CHUNK_BYTES, segment.length))
        position, remaining = segment.position, segment.length
        while remaining:
            size = min(remaining, len(buffer))
            view = memoryview(buffer)[:size]
            read = os.preadv(segment.fd, [view], position)
            if read <= 0:
                raise OSError(f"segment read hit end of file at {position} with {remaining} bytes of the slice left")
            await _write(loop, tls, view[:read], stats)
            position += read
            remaining -= read
            if replica:
                stats.replica_copied_bytes += read
            else:
                stats.fetch_copied_bytes += read
            security_stats["tls_copied_bytes"] += read
    if pending:
        await _write(loop, tls, memoryview(pending), stats)
        stats.response_bytes += len(pending)


class KernelTlsWriter:
    """Writes to a kTLS socket's fd directly (the kernel encrypts), past OpenSSL's ``SSLSocket.send``, which
    refuses flags and gathered writes. Quacks like the socket ``transfer`` writes to."""

    __slots__ = ("_sock",)

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self._sock = sock

    def send(self, data, flags: int = 0) -> int:
        return _socket.socket.send(self._sock, data, flags)

    def sendmsg(self, buffers, ancdata=(), flags: int = 0) -> int:
        return _socket.socket.sendmsg(self._sock, buffers, ancdata, flags)

    def fileno(self) -> int:
        return self._sock.fileno()
