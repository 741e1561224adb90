"""The server side of SASL on one connection: which requests may come when, and the mechanisms' exchanges.
Pure: the clock, the credential lookup, nonces and the decoy secret are passed in.

States (Kafka's ``SaslServerAuthenticator``)::

    START ──SaslHandshake v1──> HANDSHAKE ──SaslAuthenticate*──> AUTHENTICATED ──SaslHandshake──> (re-auth)
      │                           (raw frames after a v0 handshake)       │
      └─ ApiVersions any time before; anything else closes the connection  └─ every API; past the session's
                                                                              lifetime only SaslHandshake
                                                                              and SaslAuthenticate
    any failure ──> FAILED: answer SASL_AUTHENTICATION_FAILED (after connection.failed.authentication.delay.ms,
                    which the shell waits) and close

- SaslHandshake names a mechanism; one not enabled on the listener answers UNSUPPORTED_SASL_MECHANISM with
  the enabled list, and the connection closes. A v0 handshake means the client then sends the mechanism's
  tokens as bare size-prefixed frames, not inside SaslAuthenticate (``expects_raw_token``).
- SCRAM-SHA-256/512 (``protocol.scram``): two round trips. An unknown user gets a decoy credential
  derived from a per-process secret, so the server-first message and the work are the same as for a real
  user, and "no such user" and "wrong password" fail identically (Kafka fails unknown users one message
  earlier; not doing so keeps user names from being probed).
- PLAIN: ``authzid NUL user NUL password`` in one token, checked against the user's SCRAM credential
  (SHA-512 first, else SHA-256): PBKDF2 of the password with the stored salt must give the stored key. That
  PBKDF2 is the one expensive step of any exchange, so ``Step.verify`` hands it to the shell to run on a
  worker thread. There is no PLAIN password store: one set of credentials serves both mechanisms, and the
  broker never holds a password.
- Re-authentication (KIP-368): with ``connections.max.reauth.ms`` > 0 a session lasts that long
  (SaslAuthenticate v1+ tells the client ``session_lifetime_ms``); the client re-runs the handshake and the
  exchange on the same connection, which must keep the mechanism and the principal. A request other than
  those two after the lifetime closes the connection, for clients of every version.

Secrets: no password, proof, salted password or key is ever put in a message, a log line or an error
string here; ``Step.error`` is safe to send and to log.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass

from copyless.protocol.scram import (
    MECHANISMS as SCRAM_MECHANISMS,
)
from copyless.protocol.scram import (
    MIN_ITERATIONS,
    ScramCredential,
    ScramError,
    ScramServer,
    credential_from_password,
)

__all__ = ["SaslSession", "Step", "StepKind", "SaslState", "PLAIN", "SUPPORTED_MECHANISMS", "decoy_credential",
           "parse_plain", "SASL_HANDSHAKE", "SASL_AUTHENTICATE", "API_VERSIONS"]

PLAIN = "PLAIN"
SUPPORTED_MECHANISMS = (PLAIN, *SCRAM_MECHANISMS)
API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
# PLAIN's user and password are each at most 255 bytes in Kafka's PlainSaslServer checks; a token holds
# two NULs and an authzid as long as the user name.
MAX_PLAIN_TOKEN_BYTES = 3 * 255 + 2


class SaslState(enum.Enum):
    START = "start"
    HANDSHAKE = "handshake"  # a mechanism is chosen; its tokens come next
    AUTHENTICATED = "authenticated"
    FAILED = "failed"


class StepKind(enum.Enum):
    CHALLENGE = "challenge"  # send ``response``, expect another token
    SUCCESS = "success"  # send ``response``; the connection is authenticated as ``principal``
    FAILURE = "failure"  # answer SASL_AUTHENTICATION_FAILED with ``error`` (after the delay), then close
    VERIFY = "verify"  # run ``verify()`` off the loop, then call ``SaslSession.verified(result)``


@dataclass
class Step:
    kind: StepKind
    response: bytes = b""
    error: str = ""
    verify: Callable[[], bool] | None = None


def decoy_credential(secret: bytes, mechanism: str, username: str) -> ScramCredential:
    """A credential for a user that does not exist: stable per user (the same salt on every attempt, as a
    real user's), unguessable without ``secret``, and never matching any proof."""
    hash_name = SCRAM_MECHANISMS[mechanism]
    seed = hmac.new(secret, f"{mechanism}\0{username}".encode(), hashlib.sha512).digest()
    size = hashlib.new(hash_name).digest_size
    return ScramCredential(salt=seed[:16], stored_key=hmac.new(seed, b"stored", hash_name).digest()[:size],
                           server_key=hmac.new(seed, b"server", hash_name).digest()[:size], iterations=MIN_ITERATIONS)


def parse_plain(token: bytes) -> tuple[str, str, str]:
    """``authzid NUL user NUL password`` -> (authzid, user, password). Raises ValueError (no secret in it)."""
    if len(token) > MAX_PLAIN_TOKEN_BYTES:
        raise ValueError(f"PLAIN token of {len(token)} bytes exceeds {MAX_PLAIN_TOKEN_BYTES}")
    parts = bytes(token).split(b"\0")
    if len(parts) != 3:
        raise ValueError("PLAIN token must be authzid NUL user NUL password")
    try:
        authzid, user, password = (part.decode("utf-8") for part in parts)
    except UnicodeDecodeError:
        raise ValueError("PLAIN token is not UTF-8") from None
    if not user or not password:
        raise ValueError("PLAIN user and password must not be empty")
    if authzid and authzid != user:
        raise ValueError("PLAIN authorization id must be empty or the user name")
    return authzid, user, password


class SaslSession:
    """SASL for one connection of a SASL_PLAINTEXT or SASL_SSL listener (module docstring).

    Args:
        mechanisms: the listener's ``sasl.enabled.mechanisms``.
        lookup: ``(user, mechanism) -> ScramCredential | None`` over the credential store.
        clock_ms: monotonic milliseconds.
        nonce: ``() -> str``, a fresh server nonce (printable, no ',').
        decoy_secret: bytes for ``decoy_credential``.
        reauth_ms: ``connections.max.reauth.ms`` (0: sessions never expire).
    """

    def __init__(self, mechanisms, lookup, *, clock_ms: Callable[[], float], nonce: Callable[[], str],
                 decoy_secret: bytes, reauth_ms: int = 0) -> None:
        self.mechanisms = tuple(mechanisms)
        self._lookup = lookup
        self._clock_ms = clock_ms
        self._nonce = nonce
        self._decoy_secret = decoy_secret
        self.reauth_ms = reauth_ms
        self.state = SaslState.START
        self.mechanism: str | None = None
        self.raw_tokens = False  # a v0 handshake: tokens come as bare frames
        self.principal: str | None = None  # "User:<name>" once authenticated
        self.expires_at_ms: float | None = None
        self.reauthentications = 0
        self._scram: ScramServer | None = None
        self._pending_user: str | None = None
        self._authenticated_mechanism: str | None = None

    # --- what may come ---------------------------------------------------------------------------------------

    @property
    def authenticated(self) -> bool:
        return self.principal is not None

    @property
    def expects_raw_token(self) -> bool:
        return self.state == SaslState.HANDSHAKE and self.raw_tokens

    def refusal(self, api_key: int) -> str | None:
        """None when a request of ``api_key`` may be served now, else why the connection must close."""
        if self.state == SaslState.FAILED:
            return "authentication failed"
        if api_key in (API_VERSIONS, SASL_HANDSHAKE):
            return None
        if api_key == SASL_AUTHENTICATE:
            if self.state == SaslState.HANDSHAKE and not self.raw_tokens:
                return None
            return "SaslAuthenticate without a SaslHandshake v1 before it"
        if self.principal is None:
            return f"API key {api_key} before SASL authentication completed"
        if self.expired():
            return "the SASL session expired (connections.max.reauth.ms) and the client did not re-authenticate"
        return None

    def expired(self) -> bool:
        return self.expires_at_ms is not None and self._clock_ms() >= self.expires_at_ms

    def session_lifetime_ms(self) -> int:
        """What SaslAuthenticate v1+ tells the client: 0 when sessions do not expire."""
        if self.expires_at_ms is None:
            return 0
        return max(1, int(self.expires_at_ms - self._clock_ms()))

    # --- the handshake ---------------------------------------------------------------------------------------

    def handshake(self, mechanism: str, version: int) -> str | None:
        """A SaslHandshake. Returns None when accepted; otherwise an error name: "UNSUPPORTED_SASL_MECHANISM"
        or "ILLEGAL_SASL_STATE" (the connection then closes)."""
        if self.state == SaslState.HANDSHAKE or self.state == SaslState.FAILED:
            self.state = SaslState.FAILED
            return "ILLEGAL_SASL_STATE"
        if mechanism not in self.mechanisms:
            self.state = SaslState.FAILED
            return "UNSUPPORTED_SASL_MECHANISM"
        if self.principal is not None and mechanism != self._authenticated_mechanism:
            # Re-authentication keeps the mechanism (Kafka refuses a change).
            self.state = SaslState.FAILED
            return "ILLEGAL_SASL_STATE"
        self.state = SaslState.HANDSHAKE
        self.mechanism = mechanism
        self.raw_tokens = version == 0
        self._scram = None
        return None

    # --- tokens ---------------------------------------------------------------------------------------------

    def authenticate(self, token: bytes) -> Step:
        """One token of the chosen mechanism (from SaslAuthenticate, or a bare frame after a v0 handshake)."""
        if self.state != SaslState.HANDSHAKE or self.mechanism is None:
            self.state = SaslState.FAILED
            return Step(StepKind.FAILURE, error="SASL token without a handshake")
        if self.mechanism == PLAIN:
            return self._plain(token)
        return self._scram_step(token)

    def _fail(self, error: str) -> Step:
        self.state = SaslState.FAILED
        return Step(StepKind.FAILURE, error=error)

    def _credential(self, user: str, mechanism: str) -> ScramCredential:
        credential = self._lookup(user, mechanism)
        return credential if credential is not None else decoy_credential(self._decoy_secret, mechanism, user)

    def _scram_step(self, token: bytes) -> Step:
        mechanism = self.mechanism
        assert mechanism is not None  # authenticate() refuses a token before the handshake chose one
        failed = (f"Authentication failed during authentication due to invalid credentials with SASL mechanism "
                  f"{mechanism}")
        try:
            if self._scram is None:
                self._scram = ScramServer(mechanism, lambda user: self._credential(user, mechanism), self._nonce())
                return Step(StepKind.CHALLENGE, self._scram.first(token))
            scram, self._scram = self._scram, None
            response = scram.final(token)
        except ScramError as exc:
            text = str(exc)
            return self._fail(failed if text == "invalid credentials" else f"Authentication failed: {text}")
        return self._succeed(scram.username, response)

    def _plain(self, token: bytes) -> Step:
        try:
            _authzid, user, password = parse_plain(token)
        except ValueError as exc:
            return self._fail(f"Authentication failed: {exc}")
        candidates = [(m, self._lookup(user, m)) for m in ("SCRAM-SHA-512", "SCRAM-SHA-256")]
        found = [(m, c) for m, c in candidates if c is not None]
        mechanism, credential = found[0] if found else ("SCRAM-SHA-512", decoy_credential(
            self._decoy_secret, "SCRAM-SHA-512", user))
        self._pending_user = user

        def verify() -> bool:
            derived = credential_from_password(mechanism, password, credential.salt, credential.iterations)
            return hmac.compare_digest(derived.stored_key, credential.stored_key)

        return Step(StepKind.VERIFY, verify=verify)

    def verified(self, ok: bool) -> Step:
        """The outcome of a VERIFY step's ``verify()``."""
        user, self._pending_user = self._pending_user, None
        if not ok or user is None or self.state != SaslState.HANDSHAKE:
            return self._fail("Authentication failed: Invalid username or password")
        return self._succeed(user, b"")

    def _succeed(self, user: str | None, response: bytes) -> Step:
        principal = f"User:{user}"
        if self.principal is not None and principal != self.principal:
            return self._fail("Authentication failed: re-authentication must keep the principal "
                              f"{self.principal}")
        if self.principal is not None:
            self.reauthentications += 1
        self.principal = principal
        self._authenticated_mechanism = self.mechanism
        self.state = SaslState.AUTHENTICATED
        self.expires_at_ms = self._clock_ms() + self.reauth_ms if self.reauth_ms > 0 else None
        return Step(StepKind.SUCCESS, response)
