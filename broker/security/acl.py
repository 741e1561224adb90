"""ACLs in Kafka's model, and the authorizer that decides with them. Pure: values in, decisions out.

A binding is a resource pattern and an access control entry::

    resource   type (Topic | Group | Cluster | TransactionalId | DelegationToken | User), name, pattern
               (LITERAL: the name itself, or "*" for every resource of the type; PREFIXED: every name
               that starts with it)
    entry      principal ("User:alice", or "User:*"), host (an address, or "*"), operation, ALLOW | DENY

The numbers are Kafka's wire codes (``ResourceType``, ``PatternType``, ``AclOperation``,
``AclPermissionType``), so bindings travel through CreateAcls / DescribeAcls / DeleteAcls unchanged.

Decision (Kafka's ``AclAuthorizer`` / ``StandardAuthorizer``), for a principal, a client host, an
operation and one resource:

1. a principal in ``super.users`` is allowed everything;
2. the bindings that apply: LITERAL ones naming the resource or "*", PREFIXED ones whose name the
   resource's starts with, whose principal is this one or "User:*" and whose host is this one or "*";
3. any DENY binding for the operation (or ALL) denies; DENY wins over ALLOW, whatever their order;
4. any ALLOW binding for the operation, for ALL, or for an operation that implies it, allows: Read, Write,
   Delete and Alter imply Describe; AlterConfigs implies DescribeConfigs. A DENY implies nothing (denying
   Read does not deny Describe), as in Kafka;
5. otherwise, when no binding at all applies to the resource (for any principal) and
   ``allow.everyone.if.no.acl.found`` is true, allowed; else denied.

Filters (DescribeAcls, DeleteAcls) use ANY for "any value", a null name/principal/host for any, and the
pattern MATCH for "every binding that would apply to this resource name".

Cost: bindings are indexed by (resource type, pattern) and name, so a decision looks at the LITERAL
bindings of the name and of "*" and at the PREFIXED ones of the type (a linear scan of those: prefixes
are few in practice).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ResourceType",
    "PatternType",
    "Operation",
    "Permission",
    "AclBinding",
    "AclBindingFilter",
    "AclError",
    "Authorizer",
    "CLUSTER_NAME",
    "WILDCARD",
    "parse_principal",
]

CLUSTER_NAME = "kafka-cluster"  # the one Cluster resource's name (Kafka's CLUSTER_NAME)
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


# Operation -> the operations whose ALLOW also allows it (Kafka's AclEntry.supportedOperations implications).
_IMPLIED_BY = {
    Operation.DESCRIBE: (Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER),
    Operation.DESCRIBE_CONFIGS: (Operation.ALTER_CONFIGS,),
}

# The operations a resource type knows (Kafka's AclEntry.supportedOperations); CreateAcls refuses others.
SUPPORTED_OPERATIONS = {
    ResourceType.TOPIC: {Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE, Operation.DELETE,
                         Operation.ALTER, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS},
    ResourceType.GROUP: {Operation.READ, Operation.DESCRIBE, Operation.DELETE},
    ResourceType.CLUSTER: {Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS,
                           Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE, Operation.ALTER, Operation.DESCRIBE},
    ResourceType.TRANSACTIONAL_ID: {Operation.DESCRIBE, Operation.WRITE},
    ResourceType.DELEGATION_TOKEN: {Operation.DESCRIBE},
    ResourceType.USER: {Operation.CREATE_TOKENS, Operation.DESCRIBE_TOKENS},
}


class AclError(ValueError):
    """A binding or filter that cannot be stored or applied; the message says which field."""


def parse_principal(text: str) -> tuple[str, str]:
    """``"User:alice"`` -> ("User", "alice"). Raises AclError."""
    kind, sep, name = text.partition(":")
    if not sep or not kind or not name:
        raise AclError(f"principal {text!r} is not of the form Type:name (e.g. User:alice)")
    return kind, name


@dataclass(frozen=True)
class AclBinding:
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def check(self) -> AclBinding:
        """Refuse what Kafka's CreateAcls refuses (INVALID_REQUEST). Returns self. Raises AclError."""
        if self.resource_type in (ResourceType.ANY, ResourceType.UNKNOWN):
            raise AclError(f"resource type {self.resource_type.name} cannot be stored")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise AclError(f"pattern type must be LITERAL or PREFIXED, not {self.pattern_type.name}")
        if not self.resource_name:
            raise AclError("resource name must not be empty")
        if self.resource_type == ResourceType.CLUSTER and self.resource_name != CLUSTER_NAME:
            raise AclError(f"the cluster resource is named {CLUSTER_NAME!r}")
        if self.pattern_type == PatternType.PREFIXED and self.resource_name == WILDCARD:
            raise AclError("a PREFIXED pattern cannot be '*' (use LITERAL '*')")
        if self.operation in (Operation.ANY, Operation.UNKNOWN):
            raise AclError(f"operation {self.operation.name} cannot be stored")
        if self.operation != Operation.ALL and self.operation not in SUPPORTED_OPERATIONS[self.resource_type]:
            raise AclError(f"operation {self.operation.name} does not apply to a {self.resource_type.name}")
        if self.permission not in (Permission.ALLOW, Permission.DENY):
            raise AclError(f"permission must be ALLOW or DENY, not {self.permission.name}")
        parse_principal(self.principal)
        if not self.host:
            raise AclError("host must not be empty (use '*' for any)")
        return self

    def to_json(self) -> dict[str, Any]:
        return {"resource_type": self.resource_type.name, "resource_name": self.resource_name,
                "pattern_type": self.pattern_type.name, "principal": self.principal, "host": self.host,
                "operation": self.operation.name, "permission": self.permission.name}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AclBinding:
        """Raises AclError (KeyError, ValueError inside) on a document that is not a binding."""
        try:
            return cls(ResourceType[data["resource_type"]], str(data["resource_name"]),
                       PatternType[data["pattern_type"]], str(data["principal"]), str(data["host"]),
                       Operation[data["operation"]], Permission[data["permission"]]).check()
        except (KeyError, TypeError) as exc:
            raise AclError(f"not an ACL binding: {exc}") from None

    def describe(self) -> str:
        return (f"{self.permission.name} {self.principal} from {self.host} {self.operation.name} on "
                f"{self.resource_type.name}:{self.pattern_type.name}:{self.resource_name}")


@dataclass(frozen=True)
class AclBindingFilter:
    """A filter over bindings: ANY / None mean "any value"; pattern MATCH means "applies to this name"."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def check(self) -> AclBindingFilter:
        """Refuse filters with UNKNOWN values (Kafka: INVALID_REQUEST). Raises AclError."""
        for field, value in (("resource type", self.resource_type), ("pattern type", self.pattern_type),
                             ("operation", self.operation), ("permission", self.permission)):
            if value == 0:
                raise AclError(f"{field} UNKNOWN in a filter")
        return self

    def matches(self, binding: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and binding.resource_type != self.resource_type:
            return False
        if not self._pattern_matches(binding):
            return False
        if self.principal is not None and binding.principal != self.principal:
            return False
        if self.host is not None and binding.host != self.host:
            return False
        if self.operation != Operation.ANY and binding.operation != self.operation:
            return False
        return self.permission == Permission.ANY or binding.permission == self.permission

    def _pattern_matches(self, binding: AclBinding) -> bool:
        name, pattern = self.resource_name, self.pattern_type
        if pattern == PatternType.MATCH:
            if name is None:
                return True
            if binding.pattern_type == PatternType.LITERAL:
                return binding.resource_name in (name, WILDCARD)
            return name.startswith(binding.resource_name)
        if pattern != PatternType.ANY and binding.pattern_type != pattern:
            return False
        return name is None or binding.resource_name == name


class Authorizer:
    """Decisions over a set of bindings (module docstring). Immutable: a change builds a new one, so a
    decision never sees half of an update. Loop thread or any thread.

    Args:
        bindings: the stored ACLs.
        super_users: principals allowed everything (``super.users``).
        allow_if_no_acls: ``allow.everyone.if.no.acl.found``.
    """

    def __init__(self, bindings: Iterable[AclBinding] = (), super_users: Iterable[str] = (),
                 allow_if_no_acls: bool = False) -> None:
        self.bindings: frozenset[AclBinding] = frozenset(bindings)
        self.super_users = frozenset(super_users)
        self.allow_if_no_acls = allow_if_no_acls
        self._literal: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        self._prefixed: dict[ResourceType, list[AclBinding]] = {}
        for binding in self.bindings:
            if binding.pattern_type == PatternType.LITERAL:
                self._literal.setdefault((binding.resource_type, binding.resource_name), []).append(binding)
            else:
                self._prefixed.setdefault(binding.resource_type, []).append(binding)

    def with_bindings(self, bindings: Iterable[AclBinding]) -> Authorizer:
        return Authorizer(bindings, self.super_users, self.allow_if_no_acls)

    def _applicable(self, resource_type: ResourceType, name: str) -> list[AclBinding]:
        found = list(self._literal.get((resource_type, name), ()))
        if name != WILDCARD:
            found.extend(self._literal.get((resource_type, WILDCARD), ()))
        found.extend(b for b in self._prefixed.get(resource_type, ()) if name.startswith(b.resource_name))
        return found

    def authorize(self, principal: str, host: str, operation: Operation, resource_type: ResourceType,
                  name: str) -> bool:
        """May ``principal`` connecting from ``host`` do ``operation`` on the resource? O(bindings of it)."""
        if principal in self.super_users:
            return True
        applicable = self._applicable(resource_type, name)
        if not applicable:
            return self.allow_if_no_acls
        allowed = False
        implied_by = _IMPLIED_BY.get(operation, ())
        for binding in applicable:
            if binding.principal not in (principal, WILDCARD_PRINCIPAL) or binding.host not in (host, WILDCARD):
                continue
            if binding.permission == Permission.DENY:
                if binding.operation in (operation, Operation.ALL):
                    return False
            elif binding.operation in (operation, Operation.ALL) or binding.operation in implied_by:
                allowed = True
        return allowed

    def authorize_any(self, principal: str, host: str, operation: Operation, resource_type: ResourceType) -> bool:
        """Is ``operation`` allowed on at least one resource of the type (Kafka's
        ``authorizeByResourceType``: an idempotent producer may InitProducerId when it may Write some topic)?

        Allowed when some ALLOW binding for this principal and host covers the operation and no DENY on the
        same or a broader pattern (a LITERAL "*" or a PREFIXED one that is a prefix of it) cancels it.
        """
        if principal in self.super_users:
            return True
        ours = [b for b in self.bindings if b.resource_type == resource_type
                and b.principal in (principal, WILDCARD_PRINCIPAL) and b.host in (host, WILDCARD)]
        implied_by = _IMPLIED_BY.get(operation, ())
        denies = [b for b in ours if b.permission == Permission.DENY and b.operation in (operation, Operation.ALL)]
        if any(d.pattern_type == PatternType.LITERAL and d.resource_name == WILDCARD for d in denies):
            return False
        for allow in ours:
            if allow.permission != Permission.ALLOW:
                continue
            if allow.operation not in (operation, Operation.ALL) and allow.operation not in implied_by:
                continue
            covered = any(d.pattern_type == PatternType.PREFIXED and allow.resource_name.startswith(d.resource_name)
                          or d.pattern_type == PatternType.LITERAL and allow.pattern_type == PatternType.LITERAL
                          and d.resource_name == allow.resource_name for d in denies)
            if not covered:
                return True
        # No binding of the type at all: allow.everyone.if.no.acl.found decides, as for one resource.
        return self.allow_if_no_acls and not any(b.resource_type == resource_type for b in self.bindings)

    def matching(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        """The stored bindings the filter selects, in a stable order. O(bindings)."""
        return sorted((b for b in self.bindings if acl_filter.matches(b)), key=_order)


def _order(binding: AclBinding) -> tuple[ResourceType, str, PatternType, str, str, Operation, Permission]:
    return (binding.resource_type, binding.resource_name, binding.pattern_type, binding.principal, binding.host,
            binding.operation, binding.permission)
