"""Bad input and abuse against a secured broker, on raw sockets (the SASL frames encoded by hand in
``tests.support.wire``), each ending one connection and nothing else:

- a wrong password (and an unknown user, the same way) answers SASL_AUTHENTICATION_FAILED no earlier than
  ``connection.failed.authentication.delay.ms``, and the connection closes;
- a request other than ApiVersions / SaslHandshake before authentication closes the connection, with a log
  line naming the API;
- an oversized or malformed SASL frame, a TLS ClientHello on a PLAINTEXT listener and plaintext on a TLS
  listener each close that connection, with a log line saying why;
- a v0 SaslHandshake's bare tokens authenticate, and a bad one closes after the delay;
- meanwhile a client on another connection keeps producing, and afterwards no password appears in the
  broker's log, its ``/metrics`` or its ``stats-json``.
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading
import time
import urllib.request

import pytest

from copyless.client.admin_security import Acl
from copyless.protocol.scram import ScramClient
from tests.security.conftest import ALICE_PASSWORD, FAILED_AUTH_DELAY_MS, start_secure
from tests.support import wire
from tests.support.metrics import metrics_address
from tests.support.polling import wait_until
from tests.support.security import ADMIN_PASSWORD, produce, unique

pytestmark = pytest.mark.timeout(300)

SASL_AUTHENTICATION_FAILED = 58
WRONG_PASSWORD = "not-the-password-Q3x"


@pytest.fixture(scope="module")
def abuse(tmp_path_factory, certs):
    setup = start_secure(tmp_path_factory.mktemp("abuse"), certs, extra_args=("--metrics-listen", "127.0.0.1:0"))
    try:
        yield setup
    finally:
        if setup.broker.process is not None and setup.broker.process.poll() is None:
            assert setup.broker.stop() == 0, setup.broker.log_tail()


class Background:
    """A well-behaved producer on its own connection for the length of a test: it must never fail."""

    def __init__(self, abuse) -> None:
        self.abuse, self.failures, self.rounds = abuse, [], 0
        self.topic = unique("abuse-bg")
        abuse.admin_call("create_topics", [self.topic])
        abuse.grant(Acl("TOPIC", self.topic, "LITERAL", "User:alice", "*", "WRITE", "ALLOW"))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            code = produce("confluent-kafka", self.abuse.bootstrap("SASL_SSL"), self.abuse.sasl(), self.topic, [b"bg"])
            if code != 0:
                self.failures.append(code)
            self.rounds += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)
        assert self.rounds >= 1 and not self.failures, f"the other client failed: {self.failures}"


def _wait_logged(abuse, before: int, text: str) -> None:
    """The broker logs ``text`` after ``before`` (its log line may follow the close the client saw)."""
    wait_until(lambda: text in abuse.broker.log_since(before), what=f"the broker to log {text!r}", timeout_s=10,
               detail=lambda: abuse.broker.log_since(before)[-2000:])


def _raw(abuse, listener: str = "SASL_PLAINTEXT", tls: bool = False) -> wire.RawConnection:
    context = None
    if tls:
        context = ssl.create_default_context(cafile=str(abuse.certs / "ca.pem"))
    return wire.RawConnection("127.0.0.1", abuse.ports[listener], ssl_context=context)


def _scram(conn, user: str, password: str, *, mechanism: str = "SCRAM-SHA-512", version: int = 1):
    """A SCRAM exchange in SaslAuthenticate frames: (error, message, lifetime, seconds the last answer took)."""
    error, mechanisms = wire.parse_sasl_handshake(conn.roundtrip(wire.sasl_handshake(1, mechanism)))
    assert error == 0, (error, mechanisms)
    client = ScramClient(mechanism, user, password, "rawclientnonce")
    error, _message, server_first, _ = wire.parse_sasl_authenticate(
        conn.roundtrip(wire.sasl_authenticate(2, client.first(), version), timeout_s=30), version)
    assert error == 0
    final = client.final(server_first)
    started = time.monotonic()
    error, message, server_final, lifetime = wire.parse_sasl_authenticate(
        conn.roundtrip(wire.sasl_authenticate(3, final, version), timeout_s=30), version)
    took = time.monotonic() - started
    if error == 0:
        client.verify(server_final)
    return error, message, lifetime, took


def test_wrong_password_and_unknown_user_fail_alike_after_the_delay(abuse):
    with Background(abuse):
        answers = []
        for user, password in (("alice", WRONG_PASSWORD), ("nobody-at-all", WRONG_PASSWORD)):
            with _raw(abuse) as conn:
                error, message, _lifetime, took = _scram(conn, user, password)
                assert error == SASL_AUTHENTICATION_FAILED
                assert took >= FAILED_AUTH_DELAY_MS / 1000 * 0.95, f"answered after {took:.3f} s"
                assert conn.wait_closed(10), "the connection stayed open after a failed authentication"
                answers.append(message)
        # Same words for both: an unknown user cannot be told from a wrong password.
        assert answers[0] == answers[1] and "invalid credentials" in answers[0]
        assert WRONG_PASSWORD not in answers[0]
        with _raw(abuse) as conn:
            error, _message, _lifetime, took = _scram(conn, "alice", ALICE_PASSWORD)
            assert error == 0 and took < FAILED_AUTH_DELAY_MS / 1000
            brokers, _controller, _topics = wire.parse_metadata_v1(conn.roundtrip(wire.metadata_v1(9, [])))
            assert brokers


def test_requests_before_authentication_close_the_connection(abuse):
    with Background(abuse):
        for frame in (wire.metadata_v1(1, None), wire.produce_v3(1, "t", 0, b"x"), wire.sasl_authenticate(1, b"n,,")):
            before = abuse.broker.log_size()
            with _raw(abuse) as conn:
                error, _versions = wire.parse_api_versions_v0(conn.roundtrip(wire.api_versions_v0(7)))
                assert error == 0  # ApiVersions is served before authentication
                conn.send(frame)
                assert conn.wait_closed(10)
            api_key = struct.unpack_from(">h", frame, 4)[0]
            line = abuse.broker.log_since(before)
            expected = "without a SaslHandshake" if api_key == 36 else f"API key {api_key} before SASL authentication"
            assert expected in line, line


def test_oversized_and_malformed_sasl_frames(abuse):
    with Background(abuse):
        before = abuse.broker.log_size()
        with _raw(abuse) as conn:
            conn.send(struct.pack(">i", 600 * 1024) + b"\0" * 1024)  # over sasl.server.max.receive.size
            assert conn.wait_closed(10)
        _wait_logged(abuse, before, "sasl.server.max.receive.size")
        for token in (b"\xff\xfe garbage", b"n,,n=,r=", b"p=tls-unique,,n=alice,r=abc", b"n,,n=alice"):
            with _raw(abuse) as conn:
                assert wire.parse_sasl_handshake(conn.roundtrip(wire.sasl_handshake(1, "SCRAM-SHA-256")))[0] == 0
                error, message, _token, _ = wire.parse_sasl_authenticate(
                    conn.roundtrip(wire.sasl_authenticate(2, token), timeout_s=30))
                assert error == SASL_AUTHENTICATION_FAILED and message
                assert conn.wait_closed(10)
        # PLAIN with no NULs, and a mechanism the listener does not offer.
        with _raw(abuse) as conn:
            assert wire.parse_sasl_handshake(conn.roundtrip(wire.sasl_handshake(1, "PLAIN")))[0] == 0
            assert wire.parse_sasl_authenticate(conn.roundtrip(wire.sasl_authenticate(2, b"x" * 900),
                                                               timeout_s=30))[0] == SASL_AUTHENTICATION_FAILED
            assert conn.wait_closed(10)
        with _raw(abuse) as conn:
            error, mechanisms = wire.parse_sasl_handshake(conn.roundtrip(wire.sasl_handshake(1, "GSSAPI")))
            assert error == 33 and set(mechanisms) == {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}
            assert conn.wait_closed(10)


def test_tls_hello_on_plaintext_and_plaintext_on_tls(abuse):
    with Background(abuse):
        before = abuse.broker.log_size()
        context = ssl.create_default_context(cafile=str(abuse.certs / "ca.pem"))
        with (socket.create_connection(("127.0.0.1", abuse.ports["PLAINTEXT"]), timeout=10) as raw,
              pytest.raises((ssl.SSLError, OSError))):
            context.wrap_socket(raw, server_hostname="127.0.0.1")
        _wait_logged(abuse, before, "a TLS handshake arrived on PLAINTEXT listener PLAINTEXT")
        for listener in ("SSL", "SASL_SSL"):
            before = abuse.broker.log_size()
            with wire.RawConnection("127.0.0.1", abuse.ports[listener]) as conn:
                conn.send(wire.api_versions_v0(1))
                assert conn.wait_closed(10)
            _wait_logged(abuse, before, "(a plaintext client on a TLS listener?)")
        # mTLS: no client certificate is refused at the handshake.
        before = abuse.broker.log_size()
        with (socket.create_connection(("127.0.0.1", abuse.ports["SSL"]), timeout=10) as raw,
              context.wrap_socket(raw, server_hostname="127.0.0.1") as tls):
            try:
                tls.sendall(wire.api_versions_v0(1))
                assert tls.recv(100) == b""
            except (ssl.SSLError, OSError):
                pass  # TLS 1.3 reports the refusal on the first read or write
        _wait_logged(abuse, before, "PEER_DID_NOT_RETURN_A_CERTIFICATE")


def test_v0_handshake_bare_tokens(abuse):
    """SaslHandshake v0: the tokens follow as bare frames; a good exchange authenticates the connection, a
    bad one closes it after the delay with nothing written."""
    with _raw(abuse, "SASL_SSL", tls=True) as conn:
        assert wire.parse_sasl_handshake(conn.roundtrip(wire.sasl_handshake(1, "SCRAM-SHA-256", version=0)))[0] == 0
        client = ScramClient("SCRAM-SHA-256", "alice", ALICE_PASSWORD, "v0nonce")
        conn.send(wire.raw_token(client.first()))
        (size,) = struct.unpack(">i", conn.recv_exact(4, time.monotonic() + 10))
        server_first = conn.recv_exact(size, time.monotonic() + 10)
        conn.send(wire.raw_token(client.final(server_first)))
        (size,) = struct.unpack(">i", conn.recv_exact(4, time.monotonic() + 10))
        client.verify(conn.recv_exact(size, time.monotonic() + 10))
        brokers, _controller, _topics = wire.parse_metadata_v1(conn.roundtrip(wire.metadata_v1(5, [])))
        assert brokers
    with _raw(abuse) as conn:
        assert wire.parse_sasl_handshake(conn.roundtrip(wire.sasl_handshake(1, "PLAIN", version=0)))[0] == 0
        started = time.monotonic()
        conn.send(wire.raw_token(f"\0alice\0{WRONG_PASSWORD}".encode()))
        assert conn.wait_closed(10)
        assert time.monotonic() - started >= FAILED_AUTH_DELAY_MS / 1000 * 0.95


def test_a_client_without_a_valid_certificate_of_this_ca(abuse, tmp_path):
    """A certificate from another CA is refused at the TLS handshake (CERTIFICATE_VERIFY_FAILED)."""
    from tests.support.security import make_certs

    other = make_certs(tmp_path / "other", "carol")
    context = ssl.create_default_context(cafile=str(abuse.certs / "ca.pem"))
    context.load_cert_chain(str(other / "carol-cert.pem"), str(other / "carol-key.pem"))
    before = abuse.broker.log_size()
    with socket.create_connection(("127.0.0.1", abuse.ports["SSL"]), timeout=10) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(wire.api_versions_v0(1))
                assert tls.recv(100) == b""
        except (ssl.SSLError, OSError):
            pass
    _wait_logged(abuse, before, "CERTIFICATE_VERIFY_FAILED")


def test_no_secret_in_log_metrics_or_stats(abuse):
    """Runs last in the module: whatever the tests above did, no password is in anything the broker
    wrote or serves (its log, /metrics, stats-json), nor in security.json."""
    host, port = metrics_address(abuse.broker)
    metrics = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
    assert "copyless_sasl_authentications_total" in metrics and "copyless_ktls_available" in metrics
    stats = abuse.broker.stats_json()
    assert stats["security"]["sasl"].get("SCRAM-SHA-512:failed", 0) >= 2
    stored = (abuse.broker.data_dir / "security.json").read_text()
    # The harness writes each start's command line (with --add-scram's passwords) into the log file itself:
    # those lines are the test's, not the broker's.
    log_text = "\n".join(line for line in abuse.broker.log_text().splitlines() if not line.startswith("==== start:"))
    texts = {"log": log_text, "metrics": metrics, "stats": str(stats), "security.json": stored}
    for name, text in texts.items():
        for secret in (ADMIN_PASSWORD, ALICE_PASSWORD, WRONG_PASSWORD):
            assert secret not in text, f"a password appears in the broker's {name}"
    assert (abuse.broker.data_dir / "security.json").stat().st_mode & 0o077 == 0
