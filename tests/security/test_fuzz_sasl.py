"""The SASL exchange fuzzed as ``tests/integration/test_fuzz_frames.py`` fuzzes request frames: hostile
handshakes and tokens on raw sockets against a live broker's SASL_PLAINTEXT listener.

Hypothesis builds sequences of SaslHandshake (any mechanism name, v0 or v1), SaslAuthenticate frames
carrying mutated SCRAM and PLAIN messages (bit flips, truncations, inserted bytes, swapped attributes), bare
token frames, and other requests, all made with a wrong password or none, each sequence on its own
connection. The invariants: no sequence ever authenticates (a Metadata request sent after it is never
answered), every connection ends (answered and closed, never left hanging past the answers), the broker
never dies, and afterwards a correct client on a fresh connection authenticates and is served.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from copyless.protocol.scram import ScramClient
from tests.security.conftest import ALICE_PASSWORD, start_secure
from tests.support import wire

pytestmark = pytest.mark.timeout(600)

FUZZ_SETTINGS = settings(max_examples=150, deadline=None, database=None,
                         suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory, certs):
    # No delay after a failed authentication: 150 examples would otherwise wait most of a minute.
    setup = start_secure(tmp_path_factory.mktemp("fuzz-sasl"), certs,
                         config_overrides={"connection.failed.authentication.delay.ms": 0})
    try:
        yield setup
    finally:
        alive = setup.broker.process is not None and setup.broker.process.poll() is None
        assert alive, f"the broker died:\n{setup.broker.log_tail()}"
        assert setup.broker.stop() == 0


def _scram_messages(user: str, password: str, mechanism: str) -> list[bytes]:
    client = ScramClient(mechanism, user, password, "fuzznonce")
    # A plausible server-first to build a client-final from (the broker's real nonce differs, which is one
    # more thing the broker must refuse).
    server_first = b"r=fuzznonceSERVER,s=c2FsdHNhbHRzYWx0,i=4096"
    return [client.first(), client.final(server_first)]


SEED_TOKENS = [
    *_scram_messages("alice", "wrong-password", "SCRAM-SHA-512"),
    *_scram_messages("nobody", "x", "SCRAM-SHA-256"),
    b"\0alice\0wrong-password",
    b"alice\0alice\0wrong",
    b"n,a=bob,n=alice,r=abc",
    b"c=biws,r=abc,p=AAAA",
    b"",
]


@st.composite
def tokens(draw) -> bytes:
    token = bytearray(draw(st.sampled_from(SEED_TOKENS)))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "swap"]))
        at = draw(st.integers(0, max(0, len(token) - 1)))
        if kind == "flip" and token:
            token[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            token[at:at] = draw(st.sampled_from([b",", b"=", b"\0", b"p=", b",r=", b"\xff", b"n,,"]))
        elif kind == "delete":
            del token[at:at + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del token[at:]
        elif kind == "swap" and b"," in token:
            parts = bytes(token).split(b",")
            draw(st.randoms()).shuffle(parts)
            token = bytearray(b",".join(parts))
    return bytes(token)


step = st.one_of(
    st.tuples(st.just("handshake"), st.sampled_from(["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN", "GSSAPI",
                                                     "scram-sha-512", "", "X" * 300]), st.sampled_from([0, 1, 2])),
    st.tuples(st.just("authenticate"), tokens(), st.sampled_from([0, 1, 2])),
    st.tuples(st.just("bare"), tokens(), st.just(0)),
    st.tuples(st.just("request"), st.sampled_from(["metadata", "api_versions", "produce"]), st.just(0)),
    st.tuples(st.just("garbage"), st.binary(max_size=64), st.just(0)),
)


def _frame(kind: str, value, version: int, correlation_id: int) -> bytes:
    if kind == "handshake":
        return wire.sasl_handshake(correlation_id, value, version)
    if kind == "authenticate":
        return wire.sasl_authenticate(correlation_id, value, version)
    if kind == "bare":
        return wire.raw_token(value)
    if kind == "request":
        return {"metadata": wire.metadata_v1(correlation_id, None),
                "api_versions": wire.api_versions_v0(correlation_id),
                "produce": wire.produce_v3(correlation_id, "fuzz", 0, b"junk")}[value]
    return struct.pack(">i", len(value)) + value


@FUZZ_SETTINGS
@given(steps=st.lists(step, min_size=1, max_size=5))
def test_no_sequence_authenticates_and_the_broker_survives(fuzzed, steps):
    with wire.RawConnection("127.0.0.1", fuzzed.ports["SASL_PLAINTEXT"], timeout_s=5) as conn:
        try:
            for index, (kind, value, version) in enumerate(steps):
                conn.send(_frame(kind, value, version, 100 + index))
            # The sentinel: served only on an authenticated connection, which no step above can make.
            conn.send(wire.metadata_v1(999, []))
        except (BrokenPipeError, ConnectionResetError):
            return  # closed while we were still writing: fine
        seen = b""
        conn.sock.settimeout(5)
        while True:
            try:
                chunk = conn.sock.recv(1 << 16)
            except (ConnectionResetError, BrokenPipeError):
                break
            except TimeoutError:
                pytest.fail(f"the connection was neither closed nor done after {steps!r}")
            if not chunk:
                break
            seen += chunk
        # Walk the answers: none may be the sentinel's (correlation id 999).
        offset = 0
        while offset + 8 <= len(seen):
            (size,) = struct.unpack_from(">i", seen, offset)
            if size >= 4 and offset + 4 + size <= len(seen):
                (correlation_id,) = struct.unpack_from(">i", seen, offset + 4)
                assert correlation_id != 999, f"a fuzzed sequence authenticated: {steps!r}"
            offset += 4 + max(size, 0)


def test_a_correct_client_after_the_fuzzing(fuzzed):
    from copyless.client.admin_security import Acl
    from tests.support.security import produce, unique

    topic = unique("after-fuzz")
    fuzzed.admin_call("create_topics", [topic])
    fuzzed.grant(Acl("TOPIC", topic, "LITERAL", "User:alice", "*", "WRITE", "ALLOW"))
    identity = fuzzed.sasl("alice", ALICE_PASSWORD, protocol="SASL_PLAINTEXT")
    assert produce("kafka-python", fuzzed.bootstrap("SASL_PLAINTEXT"), identity, topic, [b"ok"]) == 0
