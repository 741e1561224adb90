"""DescribeAcls (29), CreateAcls (30), DeleteAcls (31), v1-3: Kafka's ACL admin APIs over the store.

- With no ``authorizer.class.name`` every one answers SECURITY_DISABLED (54), as Kafka does.
- DescribeAcls needs Describe on the cluster, CreateAcls and DeleteAcls Alter on the cluster; otherwise
  CLUSTER_AUTHORIZATION_FAILED (31) for the whole request (each creation / filter of it).
- CreateAcls checks each binding as Kafka does (``AclBinding.check``): a refused one answers
  INVALID_REQUEST with the reason, the others are stored together. Creating a binding that exists is a
  success with no change.
- DeleteAcls removes, per filter, every stored binding the filter matches, and lists them. A filter with
  UNKNOWN values answers INVALID_REQUEST.
- Resource pattern filters: ANY, MATCH (bindings that apply to the named resource), LITERAL, PREFIXED.

v0 (no pattern type) is not served: kio carries no v0 schemas; every client in use sends v1 or later.
DescribeAcls stops at v1: kafka-python infers the broker's version from the table, and DescribeAcls v2
would make it 2.5 (trap T3, ``tests/broker/test_broker_wire.py``); v1 carries every field v2-3 do.
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from copyless.broker.handlers.context import RequestContext
from copyless.broker.security import checks
from copyless.broker.security.acl import (
    AclBinding,
    AclBindingFilter,
    AclError,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from copyless.broker.security.store import StoreError
from copyless.broker.wire.codecs import NO_THROTTLE, build, response_module

__all__ = ["HANDLERS"]

log = logging.getLogger("copyless.security")

DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
_DISABLED = "No Authorizer is configured (authorizer.class.name)."


def _enum(cls, value):
    try:
        return cls(int(value))
    except ValueError:
        return cls(0)


def _filter(item) -> AclBindingFilter:
    """Raises AclError."""
    return AclBindingFilter(_enum(ResourceType, item.resource_type_filter), item.resource_name_filter,
                            _enum(PatternType, getattr(item, "pattern_type_filter", PatternType.LITERAL)),
                            item.principal_filter, item.host_filter, _enum(Operation, item.operation),
                            _enum(Permission, item.permission_type)).check()


async def describe_acls(ctx: RequestContext, request):
    module = response_module(DESCRIBE_ACLS, ctx.api_version)
    security = ctx.broker.security

    def answer(code, message=None, resources=()):
        return build(module.DescribeAclsResponse, throttle_time=NO_THROTTLE, error_code=code,
                     error_message=message, resources=tuple(resources))

    if security.authorizer is None:
        return answer(ErrorCode.security_disabled, _DISABLED)
    if not checks.cluster(ctx, Operation.DESCRIBE):
        return answer(ErrorCode.cluster_authorization_failed, "Describe on the cluster is needed to list ACLs")
    try:
        acl_filter = _filter(request)
    except AclError as exc:
        return answer(ErrorCode.invalid_request, str(exc))
    grouped: dict[tuple, list[AclBinding]] = {}
    for binding in security.authorizer.matching(acl_filter):
        grouped.setdefault((binding.resource_type, binding.resource_name, binding.pattern_type), []).append(binding)
    resources = [build(module.DescribeAclsResource, resource_type=int(rtype), resource_name=name,
                       pattern_type=int(pattern),
                       acls=tuple(build(module.AclDescription, principal=b.principal, host=b.host,
                                        operation=int(b.operation), permission_type=int(b.permission))
                                  for b in bindings))
                 for (rtype, name, pattern), bindings in grouped.items()]
    return answer(ErrorCode.none, None, resources)


async def create_acls(ctx: RequestContext, request):
    module = response_module(CREATE_ACLS, ctx.api_version)
    security = ctx.broker.security

    def respond(outcomes):
        return build(module.CreateAclsResponse, throttle_time=NO_THROTTLE,
                     results=tuple(build(module.AclCreationResult, error_code=code, error_message=message)
                                   for code, message in outcomes))

    creations = request.creations
    if security.authorizer is None:
        return respond([(ErrorCode.security_disabled, _DISABLED)] * len(creations))
    if not checks.cluster(ctx, Operation.ALTER):
        return respond([(ErrorCode.cluster_authorization_failed, "Alter on the cluster is needed to create ACLs")]
                       * len(creations))
    outcomes: list[tuple[ErrorCode, str | None]] = []
    valid: list[AclBinding] = []
    for item in creations:
        try:
            binding = AclBinding(_enum(ResourceType, item.resource_type), item.resource_name,
                                 _enum(PatternType, getattr(item, "resource_pattern_type", PatternType.LITERAL)),
                                 item.principal, item.host, _enum(Operation, item.operation),
                                 _enum(Permission, item.permission_type)).check()
        except AclError as exc:
            outcomes.append((ErrorCode.invalid_request, str(exc)))
            continue
        valid.append(binding)
        outcomes.append((ErrorCode.none, None))
    if valid:
        try:
            await security.store.create_acls(valid)
        except StoreError as exc:
            outcomes = [(ErrorCode.request_timed_out, str(exc)) if code == ErrorCode.none else (code, message)
                        for code, message in outcomes]
        else:
            for binding in valid:
                log.info("ACL created by %s: %s", ctx.principal, binding.describe())
    return respond(outcomes)


async def delete_acls(ctx: RequestContext, request):
    module = response_module(DELETE_ACLS, ctx.api_version)
    security = ctx.broker.security

    def result(code, message=None, matching=()):
        return build(module.DeleteAclsFilterResult, error_code=code, error_message=message,
                     matching_acls=tuple(
                         build(module.DeleteAclsMatchingAcl, error_code=ErrorCode.none, error_message=None,
                               resource_type=int(b.resource_type), resource_name=b.resource_name,
                               pattern_type=int(b.pattern_type), principal=b.principal, host=b.host,
                               operation=int(b.operation), permission_type=int(b.permission)) for b in matching))

    def respond(results):
        return build(module.DeleteAclsResponse, throttle_time=NO_THROTTLE, filter_results=tuple(results))

    filters = request.filters
    if security.authorizer is None:
        return respond([result(ErrorCode.security_disabled, _DISABLED)] * len(filters))
    if not checks.cluster(ctx, Operation.ALTER):
        return respond([result(ErrorCode.cluster_authorization_failed, "Alter on the cluster is needed to delete "
                                                                        "ACLs")] * len(filters))
    results, doomed = [], set()
    matched: list[tuple[int, list[AclBinding]]] = []
    for index, item in enumerate(filters):
        try:
            acl_filter = _filter(item)
        except AclError as exc:
            results.append(result(ErrorCode.invalid_request, str(exc)))
            continue
        found = security.authorizer.matching(acl_filter)
        doomed.update(found)
        matched.append((index, found))
        results.append(None)
    if doomed:
        try:
            await security.store.delete_acls(doomed)
        except StoreError as exc:
            for index, _found in matched:
                results[index] = result(ErrorCode.request_timed_out, str(exc))
            return respond(results)
        for binding in sorted(doomed, key=lambda b: b.describe()):
            log.info("ACL deleted by %s: %s", ctx.principal, binding.describe())
    for index, found in matched:
        if results[index] is None:
            results[index] = result(ErrorCode.none, None, found)
    return respond(results)


HANDLERS = {
    DESCRIBE_ACLS: (1, 1, describe_acls),
    CREATE_ACLS: (1, 3, create_acls),
    DELETE_ACLS: (1, 3, delete_acls),
}
