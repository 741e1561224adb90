"""SaslHandshake (17) v0-1 and SaslAuthenticate (36) v0-2: the requests of a SASL exchange.

The connection's ``SaslSession`` (``ctx.session``, ``broker.security.sasl``) holds the state; this module
turns its steps into responses:

- SaslHandshake: the mechanism accepted, or UNSUPPORTED_SASL_MECHANISM with the listener's enabled list
  (the connection then closes, as Kafka's does), or ILLEGAL_SASL_STATE for a handshake in the middle of an
  exchange. On a listener without SASL both APIs answer ILLEGAL_SASL_STATE and the connection stays, as in
  Kafka.
- SaslAuthenticate: the mechanism's next message; on success v1+ carries ``session_lifetime_ms``
  (``connections.max.reauth.ms``, KIP-368); on failure SASL_AUTHENTICATION_FAILED with a message that holds
  no secret, sent after ``connection.failed.authentication.delay.ms``, and the connection closes.

PLAIN's password check (PBKDF2 against the stored SCRAM credential) runs on a worker thread.
"""

from __future__ import annotations

import asyncio
import logging

from kio.schema.errors import ErrorCode

from copyless.broker.handlers.context import RequestContext
from copyless.broker.security.sasl import Step, StepKind
from copyless.broker.wire.codecs import build, response_module

__all__ = ["HANDLERS", "run_step"]

log = logging.getLogger("copyless.security")

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36


async def run_step(broker, session, token: bytes) -> Step:
    """One token through the session, running a PLAIN verification off the loop; counts the outcome."""
    reauthenticating = session.authenticated
    step = session.authenticate(token)
    if step.kind == StepKind.VERIFY:
        ok = await asyncio.to_thread(step.verify)
        step = session.verified(ok)
    security = broker.security
    if step.kind == StepKind.SUCCESS:
        security.mechanism_stats[(session.mechanism, "ok")] += 1
        if reauthenticating:
            security.stats["reauthentications"] += 1
        log.debug("authenticated %s with %s", session.principal, session.mechanism)
    elif step.kind == StepKind.FAILURE:
        security.mechanism_stats[(session.mechanism or "none", "failed")] += 1
    return step


async def handshake(ctx: RequestContext, request):
    module = response_module(SASL_HANDSHAKE, ctx.api_version)
    session = ctx.session
    if session is None:
        return build(module.SaslHandshakeResponse, error_code=ErrorCode.illegal_sasl_state, mechanisms=())
    refused = session.handshake(request.mechanism, ctx.api_version)
    if refused is not None:
        ctx.close_reason = (f"SaslHandshake {refused} for mechanism {request.mechanism!r} (enabled: "
                            f"{', '.join(session.mechanisms)})")
    code = ErrorCode[refused.lower()] if refused else ErrorCode.none
    return build(module.SaslHandshakeResponse, error_code=code, mechanisms=tuple(session.mechanisms))


async def authenticate(ctx: RequestContext, request):
    module = response_module(SASL_AUTHENTICATE, ctx.api_version)
    session = ctx.session
    if session is None:
        return build(module.SaslAuthenticateResponse, error_code=ErrorCode.illegal_sasl_state,
                     error_message="SaslAuthenticate on a listener without SASL", auth_bytes=b"")
    step = await run_step(ctx.broker, session, bytes(request.auth_bytes))
    if step.kind == StepKind.FAILURE:
        await asyncio.sleep(ctx.broker.security.failed_authentication_delay_s())
        ctx.close_reason = f"SASL authentication failed: {step.error}"
        return build(module.SaslAuthenticateResponse, error_code=ErrorCode.sasl_authentication_failed,
                     error_message=step.error, auth_bytes=b"")
    import datetime

    lifetime = session.session_lifetime_ms() if step.kind == StepKind.SUCCESS else 0
    return build(module.SaslAuthenticateResponse, error_code=ErrorCode.none, error_message=None,
                 auth_bytes=step.response, session_lifetime=datetime.timedelta(milliseconds=lifetime))


HANDLERS = {
    SASL_HANDSHAKE: (0, 1, handshake),
    SASL_AUTHENTICATE: (0, 2, authenticate),
}
