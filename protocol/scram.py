"""SCRAM (RFC 5802) with SHA-256 and SHA-512 (RFC 7677): the credential math, the client and the server.

Pure: bytes and values in, values out; no sockets, no clocks, no randomness of its own (nonces and salts
are passed in, so the RFC test vectors replay exactly). Shared by the client (``client.conn``) and the broker
(``broker.security.sasl``), as framing and RecordBatch are.

The exchange, as Kafka carries it in SaslAuthenticate frames::

    client-first   n,,n=<user>,r=<cnonce>                       gs2 header "n,," + client-first-bare
    server-first   r=<cnonce><snonce>,s=<base64 salt>,i=<iterations>
    client-final   c=biws,r=<cnonce><snonce>,p=<base64 proof>   "biws" = base64("n,,")
    server-final   v=<base64 server signature>

    SaltedPassword  = PBKDF2-HMAC-H(password, salt, iterations)
    ClientKey       = HMAC(SaltedPassword, "Client Key")        StoredKey = H(ClientKey)
    ServerKey       = HMAC(SaltedPassword, "Server Key")
    AuthMessage     = client-first-bare + "," + server-first + "," + client-final-without-proof
    ClientProof     = ClientKey XOR HMAC(StoredKey, AuthMessage)
    ServerSignature = HMAC(ServerKey, AuthMessage)

The server keeps only (salt, iterations, StoredKey, ServerKey): a stolen credential store cannot log in
(the proof needs ClientKey, which StoredKey only hashes) nor impersonate the server to a client that never
gave its password to it. The proof is checked with ``hmac.compare_digest``.

Passwords are UTF-8 without SASLprep, as Kafka's ``ScramFormatter`` does, so a credential made here
verifies a Java client and the other way round. Usernames travel as RFC 5802 ``saslname`` (``,`` as ``=2C``,
``=`` as ``=3D``).

Limits: iterations 4096..16384 (Kafka's ``ScramMechanism`` bounds), nonces of printable ASCII without
``,``, every message at most ``MAX_MESSAGE_BYTES``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "MECHANISMS",
    "MIN_ITERATIONS",
    "MAX_ITERATIONS",
    "MAX_MESSAGE_BYTES",
    "ScramError",
    "ScramCredential",
    "salted_password",
    "credential_from_password",
    "credential_from_salted_password",
    "ScramClient",
    "ScramServer",
    "encode_saslname",
    "decode_saslname",
]

# Mechanism name -> hashlib name. Kafka's ScramMechanism enum has exactly these two.
MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MIN_ITERATIONS, MAX_ITERATIONS = 4096, 16384
# No honest SCRAM message comes near this (a 255-byte user name and 64-byte nonces make ~600 bytes).
MAX_MESSAGE_BYTES = 4096
_GS2_HEADER = "n,,"


class ScramError(ValueError):
    """A malformed or failed exchange. ``str()`` is safe to log and to send: it never holds a secret."""


@dataclass(frozen=True)
class ScramCredential:
    """What the server stores for one user and mechanism (Kafka's ``ScramCredential``)."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def _digest(mechanism: str) -> str:
    try:
        return MECHANISMS[mechanism]
    except KeyError:
        raise ScramError(f"unsupported SCRAM mechanism {mechanism!r}") from None


def _hmac(hash_name: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hash_name).digest()


def salted_password(hash_name: str, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi() of RFC 5802: PBKDF2-HMAC. Costs ``iterations`` HMACs (4096 x SHA-512 ~ 3 ms): call it off the
    event loop."""
    return hashlib.pbkdf2_hmac(hash_name, password.encode("utf-8"), salt, iterations)


def credential_from_salted_password(mechanism: str, salt: bytes, salted: bytes, iterations: int) -> ScramCredential:
    """The stored credential from a salted password (AlterUserScramCredentials carries salt and salted
    password, never the password). Cheap: three HMACs and a hash."""
    hash_name = _digest(mechanism)
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ScramError(f"iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}, not {iterations}")
    client_key = _hmac(hash_name, salted, b"Client Key")
    return ScramCredential(salt=bytes(salt), stored_key=hashlib.new(hash_name, client_key).digest(),
                           server_key=_hmac(hash_name, salted, b"Server Key"), iterations=iterations)


def credential_from_password(mechanism: str, password: str, salt: bytes, iterations: int = MIN_ITERATIONS
                             ) -> ScramCredential:
    """The stored credential for ``password``. Runs PBKDF2: off the event loop."""
    hash_name = _digest(mechanism)
    return credential_from_salted_password(mechanism, salt, salted_password(hash_name, password, salt, iterations),
                                           iterations)


def encode_saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def decode_saslname(text: str) -> str:
    """RFC 5802 saslname: '=' only as '=2C' or '=3D'."""
    out = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "=":
            code = text[i + 1:i + 3]
            if code == "2C":
                out.append(",")
            elif code == "3D":
                out.append("=")
            else:
                raise ScramError("invalid escape in user name")
            i += 3
            continue
        if char == ",":
            raise ScramError("unescaped ',' in user name")
        out.append(char)
        i += 1
    return "".join(out)


def _attributes(message: str, expected: tuple[str, ...]) -> dict[str, str]:
    """Split ``a=x,b=y`` and check the attribute letters come in ``expected`` order (extensions, lower-case
    letters Kafka allows after the required ones, are kept under their own names)."""
    parts = message.split(",")
    values: dict[str, str] = {}
    for index, part in enumerate(parts):
        if len(part) < 2 or part[1] != "=":
            raise ScramError("malformed SCRAM attribute")
        key, value = part[0], part[2:]
        if index < len(expected) and key != expected[index]:
            raise ScramError(f"expected attribute {expected[index]!r}, got {key!r}")
        if key in values:
            raise ScramError(f"attribute {key!r} repeated")
        values[key] = value
    missing = [key for key in expected if key not in values]
    if missing:
        raise ScramError(f"missing SCRAM attribute(s) {', '.join(missing)}")
    return values


def _check_nonce(nonce: str) -> None:
    if not nonce or any(not 0x21 <= ord(c) <= 0x7E or c == "," for c in nonce):
        raise ScramError("nonce must be printable ASCII without ','")


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ScramError(f"{what} is not base64") from None


def _decode_message(data: bytes) -> str:
    if len(data) > MAX_MESSAGE_BYTES:
        raise ScramError(f"SCRAM message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError("SCRAM message is not UTF-8") from None


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


class ScramClient:
    """The client side: ``first()``, then ``final(server_first)``, then ``verify(server_final)``.

    Args:
        mechanism: "SCRAM-SHA-256" or "SCRAM-SHA-512".
        username, password: the credentials (the password is used in ``final`` and then dropped).
        nonce: the client nonce (printable, no ','; the caller draws it from ``secrets``).
    """

    def __init__(self, mechanism: str, username: str, password: str, nonce: str) -> None:
        self.hash_name = _digest(mechanism)
        _check_nonce(nonce)
        self.username = username
        self._password: str | None = password
        self.nonce = nonce
        self._first_bare = f"n={encode_saslname(username)},r={nonce}"
        self._server_signature: bytes | None = None

    def first(self) -> bytes:
        return (_GS2_HEADER + self._first_bare).encode("utf-8")

    def final(self, server_first: bytes, *, max_iterations: int = MAX_ITERATIONS) -> bytes:
        """The client-final message for ``server_first``. Runs PBKDF2 (call it off the event loop when the
        iteration count is high). Raises ScramError."""
        text = _decode_message(server_first)
        if text.startswith("e="):
            raise ScramError(f"server refused: {text[2:]}")
        values = _attributes(text, ("r", "s", "i"))
        nonce = values["r"]
        if not nonce.startswith(self.nonce) or len(nonce) == len(self.nonce):
            raise ScramError("server nonce does not extend the client nonce")
        _check_nonce(nonce)
        salt = _b64decode(values["s"], "salt")
        try:
            iterations = int(values["i"])
        except ValueError:
            raise ScramError("iteration count is not a number") from None
        if not MIN_ITERATIONS <= iterations <= max_iterations:
            raise ScramError(f"iteration count {iterations} outside {MIN_ITERATIONS}..{max_iterations}")
        if self._password is None:
            raise ScramError("final() called twice")
        salted = salted_password(self.hash_name, self._password, salt, iterations)
        self._password = None
        without_proof = f"c={base64.b64encode(_GS2_HEADER.encode()).decode()},r={nonce}"
        auth_message = f"{self._first_bare},{text},{without_proof}".encode()
        client_key = _hmac(self.hash_name, salted, b"Client Key")
        stored_key = hashlib.new(self.hash_name, client_key).digest()
        proof = _xor(client_key, _hmac(self.hash_name, stored_key, auth_message))
        server_key = _hmac(self.hash_name, salted, b"Server Key")
        self._server_signature = _hmac(self.hash_name, server_key, auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        """Check the server's signature (it proves the server held this user's ServerKey). Raises ScramError."""
        text = _decode_message(server_final)
        if text.startswith("e="):
            raise ScramError(f"server refused: {text[2:]}")
        values = _attributes(text, ("v",))
        if self._server_signature is None:
            raise ScramError("verify() before final()")
        if not hmac.compare_digest(_b64decode(values["v"], "server signature"), self._server_signature):
            raise ScramError("server signature does not match: the server does not hold this credential")


class ScramServer:
    """The server side of one exchange: ``first(client_first) -> server_first``, then
    ``final(client_final) -> server_final`` (raises ScramError on a bad proof).

    Args:
        mechanism: "SCRAM-SHA-256" or "SCRAM-SHA-512".
        lookup: ``user -> ScramCredential`` for this mechanism. For an unknown user it must return a decoy
            credential (see ``broker.security.sasl``), so an unknown user costs the same messages and the
            same work as a wrong password and the two cannot be told apart.
        nonce: the server nonce to append to the client's.
    """

    def __init__(self, mechanism: str, lookup: Callable[[str], ScramCredential], nonce: str) -> None:
        self.mechanism = mechanism
        self.hash_name = _digest(mechanism)
        _check_nonce(nonce)
        self._lookup = lookup
        self._server_nonce = nonce
        self.username: str | None = None
        self._credential: ScramCredential | None = None
        self._first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._client_nonce = ""
        self._gs2_header = ""

    def first(self, client_first: bytes) -> bytes:
        text = _decode_message(client_first)
        # gs2-header: "n," or "y," (no channel binding; "p=" asks for binding Kafka never offers), then an
        # optional authzid "a=<name>", then ",".
        flag, sep, rest = text.partition(",")
        if not sep or flag not in ("n", "y"):
            raise ScramError("channel binding is not supported (gs2 header must start with 'n,' or 'y,')")
        authzid, sep, bare = rest.partition(",")
        if not sep:
            raise ScramError("malformed gs2 header")
        if authzid and not authzid.startswith("a="):
            raise ScramError("malformed authorization id")
        if bare.startswith("m="):
            raise ScramError("mandatory extensions are not supported")
        values = _attributes(bare, ("n", "r"))
        username = decode_saslname(values["n"])
        if not username:
            raise ScramError("empty user name")
        if authzid and decode_saslname(authzid[2:]) != username:
            # Kafka: the authorization id, when given, must be the authenticated user.
            raise ScramError("authorization id is not the user name")
        if values.get("tokenauth", "").lower() == "true":
            raise ScramError("delegation tokens are not supported")
        _check_nonce(values["r"])
        self.username = username
        self._credential = self._lookup(username)
        self._gs2_header = f"{flag},{authzid},"
        self._first_bare = bare
        self._client_nonce = values["r"]
        self._nonce = values["r"] + self._server_nonce
        credential = self._credential
        self._server_first = (f"r={self._nonce},s={base64.b64encode(credential.salt).decode()},"
                              f"i={credential.iterations}")
        return self._server_first.encode("utf-8")

    def final(self, client_final: bytes) -> bytes:
        if self._credential is None:
            raise ScramError("client-final before client-first")
        text = _decode_message(client_final)
        values = _attributes(text, ("c", "r"))
        if "p" not in values or not text.rpartition(",")[2].startswith("p="):
            raise ScramError("the proof must be the last attribute")
        if _b64decode(values["c"], "channel binding") != self._gs2_header.encode("utf-8"):
            raise ScramError("channel binding does not repeat the gs2 header")
        # librdkafka before 2.1 repeats its own nonce in front of the server's combined one (it sends
        # cnonce + cnonce + snonce); Kafka accepts any client nonce that ends with the server-first's. Only
        # that one form is accepted besides the RFC's, and the proof covers the message as sent either way.
        nonce = values["r"]
        if nonce != self._nonce and nonce != self._client_nonce + self._nonce:
            raise ScramError("nonce does not match")
        without_proof = text[:text.rindex(",p=")]
        auth_message = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        credential = self._credential
        proof = _b64decode(values["p"], "proof")
        signature = _hmac(self.hash_name, credential.stored_key, auth_message)
        # A proof of the wrong length is checked all the same (against a zero-padded one) so its length
        # does not shorten the work.
        client_key = _xor(proof.ljust(len(signature), b"\0")[:len(signature)], signature)
        computed = hashlib.new(self.hash_name, client_key).digest()
        if not hmac.compare_digest(computed, credential.stored_key) or len(proof) != len(signature):
            raise ScramError("invalid credentials")
        return f"v={base64.b64encode(_hmac(self.hash_name, credential.server_key, auth_message)).decode()}".encode()
