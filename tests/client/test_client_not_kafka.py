"""A client pointed at a port that is not a Kafka broker fails within the handshake timeout, saying what
answered: a silent listener, Python's own HTTP server, a server that answers HTTP 400 and closes, a TLS
server. Before, the first two took the whole 30 s request timeout and named "api 18"; the third failed on
a 1.2 GB frame size. Real sockets and servers; the client's own Admin, Producer and the ``copyless`` CLI."""

from __future__ import annotations

import asyncio
import http.server
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from copyless.client import Admin, NotKafkaError, Producer
from copyless.client.conn import HANDSHAKE_TIMEOUT_MS, Connection
from copyless.client.errors import KafkaConnectionError, KafkaTimeoutError

COPYLESS = str(Path(sys.executable).parent / "copyless")
# The handshake timeout plus what a loaded 2-core machine takes to run the rest (the whole request timeout,
# 30 s, is what the client waited before).
LIMIT_S = HANDSHAKE_TIMEOUT_MS / 1000 + 2.5


class _Server:
    """A TCP listener on 127.0.0.1 whose connections ``handle(sock)`` serves in threads."""

    def __init__(self, handle) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.handle = handle
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def _silent(conn: socket.socket) -> None:
    """Reads what comes and never answers."""
    while conn.recv(4096):
        pass


def _http_400(conn: socket.socket) -> None:
    conn.recv(4096)
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    conn.close()


@pytest.fixture
def http_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def tls_server(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (needed to make the TLS server's certificate)")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    def handle(conn: socket.socket) -> None:
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(4096)
        except (ssl.SSLError, OSError):
            pass  # the plaintext ApiVersions request: the TLS stack answers with an alert and closes

    server = _Server(handle)
    yield server.port
    server.close()


@pytest.fixture
def servers():
    made: list[_Server] = []

    def make(handle) -> int:
        made.append(_Server(handle))
        return made[-1].port

    yield make
    for server in made:
        server.close()


async def _start_admin(port: int) -> None:
    async with Admin(f"127.0.0.1:{port}"):
        pass


def _fails_fast(coroutine_factory, port: int) -> str:
    started = time.monotonic()
    with pytest.raises(NotKafkaError) as failure:
        asyncio.run(coroutine_factory(port))
    took = time.monotonic() - started
    assert took < LIMIT_S, f"took {took:.1f} s to fail"
    return str(failure.value)


def test_a_silent_port_fails_within_the_handshake_timeout_naming_apiversions(servers):
    port = servers(_silent)
    message = _fails_fast(_start_admin, port)
    assert f"127.0.0.1:{port}" in message and "did not answer ApiVersions" in message
    assert "api 18" not in message


def test_pythons_http_server_fails_within_the_handshake_timeout(http_server):
    # It waits for a request line that never ends: as silent as a closed door, for the client.
    message = _fails_fast(lambda port: Producer(f"127.0.0.1:{port}").start(), http_server)
    assert "did not answer ApiVersions" in message


def test_a_server_answering_http_is_named_at_once(servers):
    port = servers(_http_400)
    started = time.monotonic()
    message = _fails_fast(_start_admin, port)
    assert time.monotonic() - started < HANDSHAKE_TIMEOUT_MS / 1000, "waited for the timeout despite an answer"
    assert "not a Kafka broker (an HTTP server)" in message and "HTTP/1.1 400 Bad Request" in message


def test_a_tls_port_is_named(tls_server):
    message = _fails_fast(_start_admin, tls_server)
    assert "TLS" in message and f"127.0.0.1:{tls_server}" in message


def test_the_cli_says_so_and_exits_1(servers):
    port = servers(_silent)
    started = time.monotonic()
    done = subprocess.run([COPYLESS, "topics", "list", "-b", f"127.0.0.1:{port}"], capture_output=True, text=True,
                          timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 1
    assert f"copyless topics list: error: 127.0.0.1:{port} accepted the connection but did not answer ApiVersions" \
        in done.stderr
    # The process's own start (imports: about 2 s on a loaded machine) comes on top of the client's wait.
    assert took < LIMIT_S + 3, f"took {took:.1f} s"


def test_the_cli_names_an_http_server(servers):
    port = servers(_http_400)
    done = subprocess.run([COPYLESS, "produce", "orders", "-b", f"127.0.0.1:{port}"], input="one\n",
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert f"copyless produce: error: 127.0.0.1:{port} is not a Kafka broker (an HTTP server)" in done.stderr


def test_a_request_timeout_names_its_api_by_name_and_key(broker_factory):
    """A broker that answered the handshake and then stops (SIGSTOP): the request that times out is named as
    Kafka names it, with its key."""
    from kio.schema.metadata.v5 import request as metadata_request
    from kio.schema.metadata.v5 import response as metadata_response

    proc = broker_factory()

    async def stall() -> str:
        connection = await Connection.open(proc.host, proc.port, request_timeout_ms=1000)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(KafkaTimeoutError) as failure:
                request = metadata_request.MetadataRequest(topics=None, allow_auto_topic_creation=False)
                await connection.request_kio(request, metadata_response.MetadataResponse)
            return str(failure.value)
        finally:
            os.kill(proc.pid, signal.SIGCONT)

    message = asyncio.run(stall())
    assert message == f"Metadata (API 3) request to {proc.host}:{proc.port} timed out after 1000 ms"


def test_a_stopped_brokers_address_is_waited_on_once(broker_factory):
    """A client that knows its cluster retries a silent broker, but does not wait on the same address twice
    in one attempt (its bootstrap address is the broker's): the error names it once, with ApiVersions."""
    proc = broker_factory()

    async def stall() -> str:
        async with Admin(proc.bootstrap, request_timeout_ms=2000) as admin:
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                with pytest.raises(KafkaConnectionError) as failure:
                    await admin.list_topics()
                return str(failure.value)
            finally:
                os.kill(proc.pid, signal.SIGCONT)

    message = asyncio.run(stall())
    assert message.count(f"{proc.host}:{proc.port}") == 1, message
    assert "did not answer ApiVersions (API 18) within 2000 ms" in message


def test_a_real_broker_still_answers(broker):
    async def describe():
        async with Admin(broker.bootstrap) as admin:
            return await admin.describe_cluster()

    assert asyncio.run(describe()).brokers
