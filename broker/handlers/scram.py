"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51), v0: the SCRAM credential store.

Kafka's rules (``ControllerApis`` / ``ScramControlManager``):

- Describe needs Describe on the cluster, Alter needs Alter on the cluster (CLUSTER_AUTHORIZATION_FAILED);
  with no authorizer configured both are open, as in Kafka.
- Describe: no users (null or empty) lists every user that has a credential; a named user without one
  answers RESOURCE_NOT_FOUND, a user named twice DUPLICATE_RESOURCE. Only mechanisms and iteration counts
  are returned, never a salt or a key.
- Alter: one result per user. A user whose (user, mechanism) pairs repeat, across deletions and
  upsertions, answers DUPLICATE_RESOURCE; an unknown mechanism UNSUPPORTED_SASL_MECHANISM; an empty user
  name, an iteration count outside 4096..16384 or an empty salt or salted password UNACCEPTABLE_CREDENTIAL;
  deleting a credential that does not exist RESOURCE_NOT_FOUND. A user's changes apply only when all of
  them are acceptable. The upsertion carries the salt and the salted password; the broker derives and keeps
  StoredKey and ServerKey, never the salted password.
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from copyless.broker.handlers.context import RequestContext
from copyless.broker.security import checks
from copyless.broker.security.acl import Operation
from copyless.broker.security.store import StoreError
from copyless.broker.wire.codecs import NO_THROTTLE, build, response_module
from copyless.protocol.scram import MAX_ITERATIONS, MIN_ITERATIONS, credential_from_salted_password

__all__ = ["HANDLERS", "MECHANISM_CODES"]

log = logging.getLogger("copyless.security")

DESCRIBE, ALTER = 50, 51
# Kafka's ScramMechanism type codes.
MECHANISM_CODES = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
_CODES = {name: code for code, name in MECHANISM_CODES.items()}


async def describe(ctx: RequestContext, request):
    module = response_module(DESCRIBE, ctx.api_version)

    def respond(code, message=None, results=()):
        return build(module.DescribeUserScramCredentialsResponse, throttle_time=NO_THROTTLE, error_code=code,
                     error_message=message, results=tuple(results))

    if not checks.cluster(ctx, Operation.DESCRIBE):
        return respond(ErrorCode.cluster_authorization_failed, "Describe on the cluster is needed")
    users = ctx.broker.security.store.users()
    names = [u.name for u in request.users] if request.users else sorted(users)
    results = []
    for name in dict.fromkeys(names):
        if names.count(name) > 1:
            results.append(build(module.DescribeUserScramCredentialsResult, user=name,
                                 error_code=ErrorCode.duplicate_resource,
                                 error_message=f"Cannot describe SCRAM credentials for the same user twice in a "
                                               f"single request: {name}", credential_infos=()))
        elif name not in users:
            results.append(build(module.DescribeUserScramCredentialsResult, user=name,
                                 error_code=ErrorCode.resource_not_found,
                                 error_message=f"Attempt to describe a user credential that does not exist: {name}",
                                 credential_infos=()))
        else:
            results.append(build(module.DescribeUserScramCredentialsResult, user=name, error_code=ErrorCode.none,
                                 error_message=None, credential_infos=tuple(
                                     build(module.CredentialInfo, mechanism=_CODES[mechanism], iterations=iterations)
                                     for mechanism, iterations in sorted(users[name].items()))))
    return respond(ErrorCode.none, None, results)


def _check_user(store, changes) -> tuple[ErrorCode, str | None]:
    """The outcome of one user's list of ("delete"|"upsert", item) changes, before any is applied."""
    pairs = [(item.name, item.mechanism) for _kind, item in changes]
    if len(pairs) != len(set(pairs)):
        return ErrorCode.duplicate_resource, "A user credential cannot be altered twice in the same request"
    for kind, item in changes:
        if not item.name:
            return ErrorCode.unacceptable_credential, "Username must not be empty"
        mechanism = MECHANISM_CODES.get(int(item.mechanism))
        if mechanism is None:
            return ErrorCode.unsupported_sasl_mechanism, f"Unknown SCRAM mechanism {int(item.mechanism)}"
        if kind == "delete":
            if store.credential(item.name, mechanism) is None:
                return ErrorCode.resource_not_found, "Attempt to delete a user credential that does not exist"
            continue
        if not MIN_ITERATIONS <= item.iterations <= MAX_ITERATIONS:
            return (ErrorCode.unacceptable_credential,
                    f"Iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}, not {item.iterations}")
        if not item.salt or not item.salted_password:
            return ErrorCode.unacceptable_credential, "Salt and salted password must not be empty"
    return ErrorCode.none, None


async def alter(ctx: RequestContext, request):
    module = response_module(ALTER, ctx.api_version)
    by_user: dict[str, list] = {}
    for item in request.deletions:
        by_user.setdefault(item.name, []).append(("delete", item))
    for item in request.upsertions:
        by_user.setdefault(item.name, []).append(("upsert", item))

    def respond(outcomes):
        return build(module.AlterUserScramCredentialsResponse, throttle_time=NO_THROTTLE,
                     results=tuple(build(module.AlterUserScramCredentialsResult, user=user, error_code=code,
                                         error_message=message) for user, (code, message) in outcomes.items()))

    if not checks.cluster(ctx, Operation.ALTER):
        return respond({user: (ErrorCode.cluster_authorization_failed, "Alter on the cluster is needed")
                        for user in by_user})
    store = ctx.broker.security.store
    outcomes, upserts, deletions = {}, [], []
    for user, changes in by_user.items():
        outcomes[user] = _check_user(store, changes)
        if outcomes[user][0] != ErrorCode.none:
            continue
        for kind, item in changes:
            mechanism = MECHANISM_CODES[int(item.mechanism)]
            if kind == "delete":
                deletions.append((user, mechanism))
            else:
                upserts.append((user, mechanism, credential_from_salted_password(
                    mechanism, bytes(item.salt), bytes(item.salted_password), int(item.iterations))))
    if upserts or deletions:
        try:
            await store.alter_credentials(upserts, deletions)
        except StoreError as exc:
            return respond({user: (ErrorCode.request_timed_out, str(exc)) if code == ErrorCode.none else (code, message)
                            for user, (code, message) in outcomes.items()})
        for user, mechanism, _credential in upserts:
            log.info("SCRAM credential %s of user %s set by %s", mechanism, user, ctx.principal)
        for user, mechanism in deletions:
            log.info("SCRAM credential %s of user %s deleted by %s", mechanism, user, ctx.principal)
    return respond(outcomes)


HANDLERS = {DESCRIBE: (0, 0, describe), ALTER: (0, 0, alter)}
