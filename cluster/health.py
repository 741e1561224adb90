#!/usr/bin/env python3
"""copyless-health: exits 0 when a broker answers an ApiVersions request, 1 otherwise.

The image's healthcheck, and usable from a host against a published port:

    copyless-health [--cafile CA.pem] [HOST:PORT]        (default 127.0.0.1:9092)
    python3 cluster/health.py 127.0.0.1:19092

With ``--cafile`` the probe speaks TLS first and trusts that CA (a SASL_SSL or SSL listener: ApiVersions
is answered before any authentication).

Standard library only, so it runs under any Python 3 (the image copies it to /usr/local/bin). The request is
ApiVersions v0, the one every Kafka-protocol broker must answer before anything else is negotiated:

    request   int32 size | int16 api_key=18 | int16 api_version=0 | int32 correlation_id | int16 client_id length
              | client_id bytes                                     (header v1, empty body)
    response  int32 size | int32 correlation_id | int16 error_code | int32 count | count x (int16 key, int16 min,
              int16 max)                                            (header v0 even in flexible versions)

Healthy means: the correlation id comes back, error_code is 0 and the broker lists at least one API. A broker
that accepts connections but does not answer within the timeout is unhealthy.
"""

from __future__ import annotations

import socket
import struct
import sys

API_VERSIONS_KEY = 18
CORRELATION_ID = 0x636C6573  # any value works; this one reads "cles"
CLIENT_ID = b"copyless-health"
TIMEOUT_S = 3.0
# An ApiVersions v0 response lists ~60 APIs at 6 bytes each; anything far above that is not a Kafka answer.
RESPONSE_BYTES_MAX = 64 * 1024


def probe(host: str, port: int, timeout_s: float = TIMEOUT_S, cafile: str | None = None) -> str | None:
    """One ApiVersions v0 round trip. Returns None when healthy, else the reason. Blocking (up to ~2 x timeout)."""
    header = struct.pack(">hhih", API_VERSIONS_KEY, 0, CORRELATION_ID, len(CLIENT_ID)) + CLIENT_ID
    try:
        with _connect(host, port, timeout_s, cafile) as sock:
            sock.sendall(struct.pack(">i", len(header)) + header)
            (size,) = struct.unpack(">i", _read_exactly(sock, 4))
            if not 10 <= size <= RESPONSE_BYTES_MAX:
                return f"response size {size} is not an ApiVersions response"
            body = _read_exactly(sock, size)
    except (OSError, EOFError) as exc:  # ssl.SSLError is an OSError
        return f"{host}:{port}: {exc or type(exc).__name__}"
    correlation_id, error_code, api_count = struct.unpack_from(">ihi", body)
    if correlation_id != CORRELATION_ID:
        return f"correlation id {correlation_id} answered {CORRELATION_ID}"
    if error_code != 0:
        return f"ApiVersions error code {error_code}"
    if api_count <= 0:
        return "the broker lists no APIs"
    return None


def _connect(host: str, port: int, timeout_s: float, cafile: str | None):
    sock = socket.create_connection((host, port), timeout=timeout_s)
    if cafile is None:
        return sock
    import ssl

    context = ssl.create_default_context(cafile=cafile)
    context.check_hostname = False  # the probe runs inside the container, against its own loopback
    try:
        return context.wrap_socket(sock)
    except BaseException:
        sock.close()
        raise


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise EOFError("connection closed mid-response")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def main(argv: list[str]) -> int:
    args = list(argv[1:])
    cafile = None
    if args[:1] == ["--cafile"] and len(args) >= 2:
        cafile, args = args[1], args[2:]
    address = args[0] if args else "127.0.0.1:9092"
    host, _, port = address.rpartition(":")
    reason = probe(host.strip("[]") or "127.0.0.1", int(port), cafile=cafile)
    if reason is not None:
        print(f"unhealthy: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
