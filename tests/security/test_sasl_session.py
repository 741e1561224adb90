"""The SASL session state machine: what may come when, SCRAM and PLAIN exchanges, decoys for unknown users,
re-authentication, and a stateful model check that no sequence of events authenticates without a proof."""

from __future__ import annotations

import base64
import itertools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from copyless.broker.security.sasl import SaslSession, SaslState, StepKind, decoy_credential
from copyless.protocol.scram import ScramClient, credential_from_password

USERS = {("alice", m): credential_from_password(m, "alice-pw", b"alice-salt-1234", 4096)
         for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")}
ALL = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def session(mechanisms=ALL, reauth_ms=0, clock=None):
    counter = itertools.count()
    return SaslSession(mechanisms, lambda user, mech: USERS.get((user, mech)), clock_ms=clock or Clock(),
                       nonce=lambda: f"srv{next(counter)}", decoy_secret=b"secret", reauth_ms=reauth_ms)


def scram_login(s, mechanism, user, password, version=1):
    assert s.handshake(mechanism, version) is None
    client = ScramClient(mechanism, user, password, "cnonce")
    step = s.authenticate(client.first())
    assert step.kind == StepKind.CHALLENGE
    step = s.authenticate(client.final(step.response))
    if step.kind == StepKind.SUCCESS:
        client.verify(step.response)
    return step


def plain_login(s, user, password):
    assert s.handshake("PLAIN", 1) is None
    step = s.authenticate(f"\0{user}\0{password}".encode())
    assert step.kind == StepKind.VERIFY
    return s.verified(step.verify())


def test_only_api_versions_and_handshake_before_authentication():
    s = session()
    assert s.refusal(18) is None and s.refusal(17) is None
    assert "before SASL authentication" in s.refusal(3)
    assert "SaslAuthenticate without" in s.refusal(36)
    assert s.handshake("SCRAM-SHA-512", 1) is None
    assert s.refusal(36) is None
    assert "before SASL authentication" in s.refusal(0)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_success_and_failure(mechanism):
    s = session()
    assert scram_login(s, mechanism, "alice", "alice-pw").kind == StepKind.SUCCESS
    assert s.principal == "User:alice" and s.refusal(0) is None
    s = session()
    step = scram_login(s, mechanism, "alice", "wrong")
    assert step.kind == StepKind.FAILURE and "invalid credentials" in step.error and "wrong" not in step.error
    assert s.state == SaslState.FAILED and s.refusal(18) is not None


def test_unknown_user_looks_like_a_known_one():
    """Same messages, same salt on every attempt, same error: user names cannot be probed."""
    firsts = []
    for _ in range(2):
        s = session()
        s.handshake("SCRAM-SHA-512", 1)
        client = ScramClient("SCRAM-SHA-512", "mallory", "pw", "cnonce")
        step = s.authenticate(client.first())
        assert step.kind == StepKind.CHALLENGE
        firsts.append(step.response.split(b",", 1)[1])
        final = s.authenticate(client.final(step.response))
        assert final.kind == StepKind.FAILURE
    assert firsts[0] == firsts[1]
    s = session()
    wrong = scram_login(s, "SCRAM-SHA-512", "alice", "nope")
    assert final.error == wrong.error
    decoy = decoy_credential(b"secret", "SCRAM-SHA-512", "mallory")
    assert base64.b64encode(decoy.salt) in firsts[0] and len(decoy.stored_key) == 64


def test_plain_checks_against_the_scram_credential():
    s = session()
    assert plain_login(s, "alice", "alice-pw").kind == StepKind.SUCCESS
    assert s.principal == "User:alice"
    s = session()
    assert plain_login(s, "alice", "x").kind == StepKind.FAILURE
    s = session()
    assert plain_login(s, "nobody", "x").kind == StepKind.FAILURE
    s = session()
    s.handshake("PLAIN", 1)
    assert s.authenticate(b"no-nul-here").kind == StepKind.FAILURE


def test_unsupported_mechanism_and_double_handshake():
    s = session(mechanisms=("SCRAM-SHA-512",))
    assert s.handshake("PLAIN", 1) == "UNSUPPORTED_SASL_MECHANISM"
    assert s.state == SaslState.FAILED
    s = session()
    s.handshake("PLAIN", 1)
    assert s.handshake("PLAIN", 1) == "ILLEGAL_SASL_STATE"


def test_v0_handshake_expects_raw_tokens():
    s = session()
    s.handshake("SCRAM-SHA-256", 0)
    assert s.expects_raw_token and s.refusal(36) is not None
    assert scram_login(session(), "SCRAM-SHA-256", "alice", "alice-pw", version=0).kind == StepKind.SUCCESS


def test_reauthentication_expiry_mechanism_and_principal():
    clock = Clock()
    s = session(reauth_ms=10_000, clock=clock)
    scram_login(s, "SCRAM-SHA-512", "alice", "alice-pw")
    assert s.session_lifetime_ms() == 10_000
    clock.now += 9_000
    assert s.refusal(0) is None
    clock.now += 1_000
    assert "expired" in s.refusal(0)
    assert s.refusal(17) is None  # the re-authentication itself may come
    assert scram_login(s, "SCRAM-SHA-512", "alice", "alice-pw").kind == StepKind.SUCCESS
    assert s.refusal(0) is None and s.reauthentications == 1
    # Another mechanism on re-authentication is refused.
    assert s.handshake("SCRAM-SHA-256", 1) == "ILLEGAL_SASL_STATE"


def test_reauthentication_cannot_change_principal():
    more = dict(USERS)
    more[("bob", "SCRAM-SHA-512")] = credential_from_password("SCRAM-SHA-512", "bob-pw", b"bob-salt-1234567", 4096)
    s = SaslSession(ALL, lambda u, m: more.get((u, m)), clock_ms=Clock(), nonce=lambda: "n", decoy_secret=b"s",
                    reauth_ms=1)
    scram_login(s, "SCRAM-SHA-512", "alice", "alice-pw")
    step = scram_login(s, "SCRAM-SHA-512", "bob", "bob-pw")
    assert step.kind == StepKind.FAILURE and "keep the principal" in step.error
    assert s.state == SaslState.FAILED


class SessionModel(RuleBasedStateMachine):
    """Any sequence of handshakes, tokens (honest or not), requests and time: a session is authenticated
    only right after an honest exchange, its principal never changes, and a failed one serves nothing."""

    def __init__(self):
        super().__init__()
        self.clock = Clock()
        self.session = session(reauth_ms=5_000, clock=self.clock)
        self.client = None
        self.principals = set()
        self.honest_successes = 0

    @rule(mechanism=st.sampled_from([*ALL, "GSSAPI"]), version=st.sampled_from([0, 1]))
    def handshake(self, mechanism, version):
        self.session.handshake(mechanism, version)
        self.client = None

    @rule(password=st.sampled_from(["alice-pw", "bad"]), user=st.sampled_from(["alice", "eve"]))
    def scram_first(self, password, user):
        mechanism = self.session.mechanism
        if mechanism and mechanism.startswith("SCRAM") and self.session.state == SaslState.HANDSHAKE:
            self.client = (ScramClient(self.session.mechanism, user, password, "c"), user, password)
            step = self.session.authenticate(self.client[0].first())
            self.last = step

    @rule()
    def scram_final(self):
        if self.client is None or getattr(self, "last", None) is None or self.last.kind != StepKind.CHALLENGE:
            return
        client, user, password = self.client
        try:
            final = client.final(self.last.response)
        except ValueError:
            return
        step = self.session.authenticate(final)
        honest = user == "alice" and password == "alice-pw"
        assert (step.kind == StepKind.SUCCESS) == (honest and step.kind != StepKind.FAILURE)
        if step.kind == StepKind.SUCCESS:
            self.honest_successes += 1
        self.client = None
        self.last = None

    @rule(token=st.binary(max_size=64))
    def garbage_token(self, token):
        step = self.session.authenticate(token)
        if step.kind == StepKind.VERIFY:
            step = self.session.verified(step.verify())
        assert step.kind != StepKind.SUCCESS or self.session.mechanism == "PLAIN" and token.count(b"\0") == 2

    @rule(ms=st.integers(min_value=0, max_value=6_000))
    def time_passes(self, ms):
        self.clock.now += ms

    @invariant()
    def rules_hold(self):
        s = self.session
        if s.principal is not None:
            self.principals.add(s.principal)
        assert len(self.principals) <= 1
        if s.state == SaslState.FAILED:
            assert all(s.refusal(key) is not None for key in (0, 3, 17, 18, 36))
        if s.principal is None:
            assert s.refusal(0) is not None and s.refusal(1) is not None


SessionModel.TestCase.settings = settings(max_examples=150, stateful_step_count=25, deadline=None)
test_session_model = SessionModel.TestCase
