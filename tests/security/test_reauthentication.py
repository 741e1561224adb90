"""KIP-368 re-authentication with ``connections.max.reauth.ms`` = 1.5 s on the SASL_SSL listener: clients
that re-authenticate (copyless's, librdkafka's) keep one connection producing for several lifetimes with no
error; a client that does not (SaslAuthenticate v0, no lifetime) is closed at its next request after the
session expired, with a log line; SaslAuthenticate v1 tells the lifetime."""

from __future__ import annotations

import asyncio
import time

import pytest

from copyless.client.admin_security import Acl
from copyless.protocol.scram import ScramClient
from tests.security.conftest import ALICE_PASSWORD, start_secure
from tests.support import wire
from tests.support.security import unique

pytestmark = pytest.mark.timeout(300)

REAUTH_MS = 1500


@pytest.fixture(scope="module")
def reauth(tmp_path_factory, certs):
    setup = start_secure(tmp_path_factory.mktemp("reauth"), certs,
                         config_overrides={"listener.name.sasl_ssl.connections.max.reauth.ms": REAUTH_MS})
    topic = unique("reauth")
    setup.admin_call("create_topics", [topic])
    setup.grant(Acl("TOPIC", topic, "LITERAL", "User:alice", "*", "WRITE", "ALLOW"))
    setup.topic = topic
    try:
        yield setup
    finally:
        if setup.broker.process is not None and setup.broker.process.poll() is None:
            assert setup.broker.stop() == 0, setup.broker.log_tail()


def _reauthentications(setup) -> int:
    return setup.broker.stats_json()["security"].get("reauthentications", 0)


def test_copyless_client_reauthenticates_and_keeps_producing(reauth):
    from copyless import Producer

    before = _reauthentications(reauth)

    async def go():
        async with Producer(reauth.bootstrap("SASL_SSL"), **reauth.sasl().copyless()) as producer:
            deadline = time.monotonic() + 4 * REAUTH_MS / 1000
            sent = 0
            while time.monotonic() < deadline:
                await (await producer.send(reauth.topic, b"r"))
                sent += 1
                await asyncio.sleep(0.05)
            connections = list(producer._cluster._connections.values())
            return sent, max(c.reauthentications for c in connections)

    sent, reauthentications = asyncio.run(go())
    assert sent > 20
    assert reauthentications >= 2  # the producer's connection re-authenticated by itself
    assert _reauthentications(reauth) - before >= 2
    assert "expired" not in reauth.broker.log_text()


def test_librdkafka_reauthenticates(reauth):
    from confluent_kafka import Producer

    before = _reauthentications(reauth)
    producer = Producer({"bootstrap.servers": reauth.bootstrap("SASL_SSL"), **reauth.sasl().librdkafka()})
    errors = []
    deadline = time.monotonic() + 4 * REAUTH_MS / 1000
    while time.monotonic() < deadline:
        producer.produce(reauth.topic, b"r", on_delivery=lambda err, _m: errors.append(err))
        producer.poll(0.05)
    producer.flush(20)
    assert errors and not [e for e in errors if e is not None]
    assert _reauthentications(reauth) - before >= 2


def test_a_session_that_expires_is_closed_at_the_next_request(reauth):
    context = __import__("ssl").create_default_context(cafile=str(reauth.certs / "ca.pem"))
    with wire.RawConnection("127.0.0.1", reauth.ports["SASL_SSL"], ssl_context=context) as conn:
        assert wire.parse_sasl_handshake(conn.roundtrip(wire.sasl_handshake(1, "SCRAM-SHA-512")))[0] == 0
        client = ScramClient("SCRAM-SHA-512", "alice", ALICE_PASSWORD, "expiry")
        server_first = wire.parse_sasl_authenticate(conn.roundtrip(wire.sasl_authenticate(2, client.first())))[2]
        error, _m, _token, lifetime = wire.parse_sasl_authenticate(
            conn.roundtrip(wire.sasl_authenticate(3, client.final(server_first))))
        assert error == 0 and 0 < lifetime <= REAUTH_MS
        assert wire.parse_metadata_v1(conn.roundtrip(wire.metadata_v1(4, [])))[0]
        time.sleep(REAUTH_MS / 1000 + 0.3)
        before = reauth.broker.log_size()
        conn.send(wire.metadata_v1(5, []))
        assert conn.wait_closed(10)
    assert "SASL session expired" in reauth.broker.log_since(before)
