"""SCRAM: the RFC test vectors replay exactly, an independent client (kafka-python's) authenticates against
the server, and no malformed message gets anything but a ScramError."""

from __future__ import annotations

import base64
import hashlib
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copyless.protocol import scram
from copyless.protocol.scram import (
    ScramClient,
    ScramCredential,
    ScramError,
    ScramServer,
    credential_from_password,
    credential_from_salted_password,
    decode_saslname,
    encode_saslname,
)

# RFC 7677 section 3: SCRAM-SHA-256, user "user", password "pencil".
RFC7677 = {
    "client_first": b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
    "server_first": b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
    "client_final": b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
    "server_final": b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
}
# RFC 5802 section 5: the same exchange with SHA-1 (the math is the hash's parameter; SHA-1 is no mechanism).
RFC5802 = {
    "client_first": b"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL",
    "server_first": b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096",
    "client_final": b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=",
    "server_final": b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ=",
}


def _replay(monkeypatch, mechanism, vector, client_nonce, server_nonce):
    salt = base64.b64decode(vector["server_first"].split(b",s=")[1].split(b",")[0])
    credential = credential_from_password(mechanism, "pencil", salt, 4096)
    client = ScramClient(mechanism, "user", "pencil", client_nonce)
    assert client.first() == vector["client_first"]
    server = ScramServer(mechanism, lambda user: credential if user == "user" else None, server_nonce)
    assert server.first(client.first()) == vector["server_first"]
    assert client.final(vector["server_first"]) == vector["client_final"]
    assert server.final(vector["client_final"]) == vector["server_final"]
    client.verify(vector["server_final"])
    assert server.username == "user"


def test_rfc7677_sha256_vector(monkeypatch):
    _replay(monkeypatch, "SCRAM-SHA-256", RFC7677, "rOprNGfwEbeRWgbNEkqO", "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")


def test_rfc5802_sha1_vector(monkeypatch):
    monkeypatch.setitem(scram.MECHANISMS, "SCRAM-SHA-1", "sha1")
    _replay(monkeypatch, "SCRAM-SHA-1", RFC5802, "fyko+d2lbbFgONRv9qkxdawL", "3rfcNHYJY1ZVvWVs7j")


def test_rfc7677_credential_is_what_the_server_stores():
    """Only StoredKey and ServerKey are kept; they are the hashes the RFC defines over SaltedPassword."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", salt, 4096)
    from_password = credential_from_password("SCRAM-SHA-256", "pencil", salt, 4096)
    assert from_password == credential_from_salted_password("SCRAM-SHA-256", salt, salted, 4096)
    assert salted not in (from_password.stored_key, from_password.server_key)
    assert b"pencil" not in repr(from_password).encode()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_python_client_authenticates_against_the_server(mechanism):
    """An implementation written independently of this one (kafka-python's) agrees on every byte."""
    from kafka.net.sasl.scram import ScramClient as KafkaPythonClient

    salt = os.urandom(16)
    credential = credential_from_password(mechanism, "s3cret-pässword", salt, 8192)
    theirs = KafkaPythonClient("al,ice=", "s3cret-pässword", mechanism)
    # kafka-python sends the user name unescaped; a name without ',' or '=' is the same either way.
    theirs.user = encode_saslname("al,ice=").encode()
    server = ScramServer(mechanism, lambda user: credential if user == "al,ice=" else None, "snonce")
    server_first = server.first(theirs.first_message())
    theirs.process_server_first_message(server_first)
    server_final = server.final(theirs.final_message())
    theirs.process_server_final_message(server_final)
    assert server.username == "al,ice="


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_wrong_password_fails_and_server_signature_is_checked(mechanism):
    credential = credential_from_password(mechanism, "right", b"salt-salt", 4096)
    server = ScramServer(mechanism, lambda user: credential, "snonce")
    client = ScramClient(mechanism, "bob", "wrong", "cnonce")
    client_final = client.final(server.first(client.first()))
    with pytest.raises(ScramError, match="invalid credentials"):
        server.final(client_final)
    # A server without the credential cannot forge the final signature either.
    impostor = ScramServer(mechanism, lambda user: credential_from_password(mechanism, "wrong", b"salt-salt", 4096),
                           "snonce")
    honest = ScramClient(mechanism, "bob", "right", "cnonce2")
    final = honest.final(impostor.first(honest.first()))
    with pytest.raises(ScramError):
        impostor.final(final)  # the impostor's stored key does not match the right password either


def test_tampered_messages_are_refused():
    credential = credential_from_password("SCRAM-SHA-512", "pw", b"0123456789abcdef", 4096)

    def exchange():
        server = ScramServer("SCRAM-SHA-512", lambda user: credential, "snonce")
        client = ScramClient("SCRAM-SHA-512", "u", "pw", "cnonce")
        return server, client, client.final(server.first(client.first()))

    server, _client, final = exchange()
    with pytest.raises(ScramError, match="nonce"):
        server.final(final.replace(b"cnoncesnonce", b"cnonceXnonce"))
    server, _client, final = exchange()
    with pytest.raises(ScramError, match="channel binding"):
        server.final(final.replace(b"c=biws", b"c=eSws"))
    server, _client, final = exchange()
    with pytest.raises(ScramError):
        server.final(final + b",x=1")  # the proof must come last
    server, client, final = exchange()
    with pytest.raises(ScramError, match="does not match"):
        client.verify(b"v=" + base64.b64encode(b"\0" * 64))


def test_iterations_bounds_and_unknown_mechanism():
    with pytest.raises(ScramError):
        credential_from_salted_password("SCRAM-SHA-256", b"s", b"x" * 32, 4095)
    with pytest.raises(ScramError):
        credential_from_salted_password("SCRAM-SHA-256", b"s", b"x" * 32, 16385)
    with pytest.raises(ScramError):
        credential_from_password("SCRAM-SHA-1", "pw", b"s")
    client = ScramClient("SCRAM-SHA-256", "u", "pw", "abc")
    with pytest.raises(ScramError, match="iteration"):
        client.final(b"r=abcdef,s=c2FsdA==,i=1000")


@given(st.text(max_size=40))
def test_saslname_round_trip(name):
    assert decode_saslname(encode_saslname(name)) == name
    assert "," not in encode_saslname(name)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=200))
def test_server_raises_only_scram_error_on_garbage(first, final):
    """The h11 fuzz invariant for the server: any bytes parse or raise ScramError, never anything else."""
    credential = ScramCredential(b"salt", b"k" * 64, b"s" * 64, 4096)
    server = ScramServer("SCRAM-SHA-512", lambda user: credential, "snonce")
    try:
        server.first(first)
    except ScramError:
        return
    try:
        server.final(final)
    except ScramError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["n", "y", "a=u", "n=u", "r=x", "c=biws", "p=AAAA", "m=1", "=", "", ",", "s=1"]),
                max_size=8))
def test_server_first_on_structured_garbage(parts):
    credential = ScramCredential(b"salt", b"k" * 64, b"s" * 64, 4096)
    server = ScramServer("SCRAM-SHA-512", lambda user: credential, "snonce")
    try:
        server.first(",".join(parts).encode())
    except ScramError:
        pass


def test_librdkafka_repeated_client_nonce_is_accepted_and_nothing_else():
    """librdkafka before 2.1 sends r=<cnonce><cnonce><snonce> in client-final (Kafka accepts a nonce that
    ends with the server's): that one form passes, other prefixes do not, and the proof still decides."""
    import hmac as hmac_module

    credential = credential_from_password("SCRAM-SHA-512", "pw", b"saltsaltsaltsalt", 4096)
    salted = hashlib.pbkdf2_hmac("sha512", b"pw", b"saltsaltsaltsalt", 4096)

    def attempt(prefix: bytes):
        server = ScramServer("SCRAM-SHA-512", lambda user: credential, "SNONCE")
        server_first = server.first(b"n,,n=u,r=CNONCE")
        without_proof = b"c=biws,r=" + prefix + b"CNONCESNONCE"
        auth_message = b"n=u,r=CNONCE," + server_first + b"," + without_proof
        client_key = hmac_module.new(salted, b"Client Key", "sha512").digest()
        signature = hmac_module.new(hashlib.sha512(client_key).digest(), auth_message, "sha512").digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        return server.final(without_proof + b",p=" + base64.b64encode(proof))

    assert attempt(b"").startswith(b"v=")
    assert attempt(b"CNONCE").startswith(b"v=")
    with pytest.raises(ScramError, match="nonce"):
        attempt(b"XX")
