"""The admin client's security calls: ACLs (CreateAcls, DescribeAcls, DeleteAcls v1) and SCRAM credentials
(DescribeUserScramCredentials, AlterUserScramCredentials v0), sent to any broker (each writes the
cluster's metadata store itself).

ACL bindings travel as ``Acl`` values with Kafka's names as strings (resource type TOPIC, GROUP, CLUSTER,
TRANSACTIONAL_ID; pattern LITERAL, PREFIXED, and in filters ANY and MATCH; operations READ, WRITE, CREATE,
DELETE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALL, and ANY
in filters; permission ALLOW, DENY, ANY). ``None`` in a filter field means any value.

``set_scram_credential`` salts and hashes the password here (PBKDF2 on a worker thread) and sends only the
salt and the salted password, as Kafka's ``Admin.alterUserScramCredentials`` does; the password itself
never leaves the client.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass

from kio.static.primitive import i8, i32

from copyless.client.cluster import Cluster
from copyless.client.errors import KafkaError

__all__ = ["Acl", "SecurityAdmin", "RESOURCE_TYPES", "PATTERN_TYPES", "OPERATIONS", "PERMISSIONS",
           "SCRAM_MECHANISMS"]

RESOURCE_TYPES = {"UNKNOWN": 0, "ANY": 1, "TOPIC": 2, "GROUP": 3, "CLUSTER": 4, "TRANSACTIONAL_ID": 5,
                  "DELEGATION_TOKEN": 6, "USER": 7}
PATTERN_TYPES = {"UNKNOWN": 0, "ANY": 1, "MATCH": 2, "LITERAL": 3, "PREFIXED": 4}
OPERATIONS = {"UNKNOWN": 0, "ANY": 1, "ALL": 2, "READ": 3, "WRITE": 4, "CREATE": 5, "DELETE": 6, "ALTER": 7,
              "DESCRIBE": 8, "CLUSTER_ACTION": 9, "DESCRIBE_CONFIGS": 10, "ALTER_CONFIGS": 11,
              "IDEMPOTENT_WRITE": 12, "CREATE_TOKENS": 13, "DESCRIBE_TOKENS": 14}
PERMISSIONS = {"UNKNOWN": 0, "ANY": 1, "DENY": 2, "ALLOW": 3}
SCRAM_MECHANISMS = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}


def _name(table: dict, code: int) -> str:
    return next((name for name, value in table.items() if value == int(code)), "UNKNOWN")


def _code(table: dict, name: str, what: str) -> int:
    text = str(name).upper()
    for candidate in (text, text.replace("-", "_")):
        if candidate in table:
            return table[candidate]
    else:
        raise ValueError(f"unknown {what} {name!r} (one of {', '.join(table)})") from None


@dataclass(frozen=True)
class Acl:
    """A binding, or a filter (``None`` / ANY fields match anything)."""

    resource_type: str = "ANY"
    resource_name: str | None = None
    pattern_type: str = "LITERAL"
    principal: str | None = None
    host: str | None = None
    operation: str = "ANY"
    permission: str = "ANY"

    def codes(self) -> tuple[int, str | None, int, str | None, str | None, int, int]:
        return (_code(RESOURCE_TYPES, self.resource_type, "resource type"), self.resource_name,
                _code(PATTERN_TYPES, self.pattern_type, "pattern type"), self.principal, self.host,
                _code(OPERATIONS, self.operation, "operation"), _code(PERMISSIONS, self.permission, "permission"))

    def describe(self) -> str:
        return (f"{self.permission} {self.principal} from {self.host} {self.operation} on "
                f"{self.resource_type}:{self.pattern_type}:{self.resource_name}")


class SecurityAdmin:
    """Mixed into ``Admin``: needs ``self._cluster``."""

    _cluster: Cluster  # Admin's (declared for the type checker)

    async def _any(self):
        return await self._cluster.any_connection()

    async def create_acls(self, acls) -> None:
        """Store ``acls`` (full bindings). Raises KafkaError with the first refusal (SECURITY_DISABLED,
        CLUSTER_AUTHORIZATION_FAILED, INVALID_REQUEST with the reason)."""
        from kio.schema.create_acls.v1 import request as rq
        from kio.schema.create_acls.v1 import response as rs

        acls = list(acls)
        creations = []
        for acl in acls:
            rtype, name, pattern, principal, host, operation, permission = acl.codes()
            creations.append(rq.AclCreation(resource_type=rtype, resource_name=name or "",
                                            resource_pattern_type=pattern, principal=principal or "",
                                            host=host or "", operation=operation, permission_type=permission))
        connection = await self._any()
        response = await connection.request_kio(rq.CreateAclsRequest(creations=tuple(creations)), rs.CreateAclsResponse)
        for acl, result in zip(acls, response.results, strict=True):
            if int(result.error_code):
                raise KafkaError(int(result.error_code), f"{acl.describe()}: {result.error_message or ''}".rstrip(": "))

    async def describe_acls(self, acl_filter: Acl = Acl()) -> list[Acl]:
        """The stored bindings ``acl_filter`` matches. Raises KafkaError."""
        from kio.schema.describe_acls.v1 import request as rq
        from kio.schema.describe_acls.v1 import response as rs

        rtype, name, pattern, principal, host, operation, permission = acl_filter.codes()
        connection = await self._any()
        response = await connection.request_kio(
            rq.DescribeAclsRequest(resource_type_filter=i8(rtype), resource_name_filter=name,
                                   pattern_type_filter=i8(pattern),
                                   principal_filter=principal, host_filter=host, operation=i8(operation),
                                   permission_type=i8(permission)), rs.DescribeAclsResponse)
        if int(response.error_code):
            raise KafkaError(int(response.error_code), response.error_message or "describe ACLs")
        return [Acl(_name(RESOURCE_TYPES, resource.resource_type), resource.resource_name,
                    _name(PATTERN_TYPES, resource.pattern_type), acl.principal, acl.host,
                    _name(OPERATIONS, acl.operation), _name(PERMISSIONS, acl.permission_type))
                for resource in response.resources for acl in resource.acls]

    async def delete_acls(self, filters) -> list[Acl]:
        """Delete every stored binding some filter matches; returns them. Raises KafkaError."""
        from kio.schema.delete_acls.v1 import request as rq
        from kio.schema.delete_acls.v1 import response as rs

        items = []
        for acl_filter in filters:
            rtype, name, pattern, principal, host, operation, permission = acl_filter.codes()
            items.append(rq.DeleteAclsFilter(resource_type_filter=rtype, resource_name_filter=name,
                                             pattern_type_filter=pattern, principal_filter=principal, host_filter=host,
                                             operation=operation, permission_type=permission))
        connection = await self._any()
        response = await connection.request_kio(rq.DeleteAclsRequest(filters=tuple(items)), rs.DeleteAclsResponse)
        deleted = []
        for result in response.filter_results:
            if int(result.error_code):
                raise KafkaError(int(result.error_code), result.error_message or "delete ACLs")
            deleted += [Acl(_name(RESOURCE_TYPES, m.resource_type), m.resource_name,
                            _name(PATTERN_TYPES, m.pattern_type), m.principal, m.host,
                            _name(OPERATIONS, m.operation), _name(PERMISSIONS, m.permission_type))
                        for m in result.matching_acls]
        return deleted

    async def describe_scram_credentials(self, users=None) -> dict[str, dict[str, int]]:
        """``{user: {mechanism: iterations}}`` for ``users`` (None: every user with a credential). Raises
        KafkaError (RESOURCE_NOT_FOUND for a named user without one)."""
        from kio.schema.describe_user_scram_credentials.v0 import request as rq
        from kio.schema.describe_user_scram_credentials.v0 import response as rs

        connection = await self._any()
        request = rq.DescribeUserScramCredentialsRequest(
            users=None if users is None else tuple(rq.UserName(name=u) for u in users))
        response = await connection.request_kio(request, rs.DescribeUserScramCredentialsResponse)
        if int(response.error_code):
            raise KafkaError(int(response.error_code), response.error_message or "describe SCRAM credentials")
        result = {}
        for item in response.results:
            if int(item.error_code):
                raise KafkaError(int(item.error_code), f"user {item.user!r}: {item.error_message or ''}".rstrip(": "))
            result[item.user] = {_name(SCRAM_MECHANISMS, info.mechanism): int(info.iterations)
                                 for info in item.credential_infos}
        return result

    async def set_scram_credential(self, user: str, password: str, *, mechanism: str = "SCRAM-SHA-512",
                                   iterations: int = 4096) -> None:
        """Create or replace ``user``'s credential for ``mechanism`` (the salted password is computed here).
        Raises KafkaError, ValueError."""
        from kio.schema.alter_user_scram_credentials.v0 import request as rq

        from copyless.protocol.scram import MECHANISMS, salted_password

        code = _code(SCRAM_MECHANISMS, mechanism, "SCRAM mechanism")
        salt = secrets.token_bytes(32)
        salted = await asyncio.to_thread(salted_password, MECHANISMS[mechanism.upper()], password, salt, iterations)
        await self._alter_scram(upsertions=(rq.ScramCredentialUpsertion(
            name=user, mechanism=i8(code), iterations=i32(iterations), salt=salt, salted_password=salted),))

    async def delete_scram_credential(self, user: str, *, mechanism: str = "SCRAM-SHA-512") -> None:
        """Raises KafkaError (RESOURCE_NOT_FOUND when the user has no credential for the mechanism)."""
        from kio.schema.alter_user_scram_credentials.v0 import request as rq

        await self._alter_scram(deletions=(rq.ScramCredentialDeletion(
            name=user, mechanism=i8(_code(SCRAM_MECHANISMS, mechanism, "SCRAM mechanism"))),))

    async def _alter_scram(self, *, upsertions=(), deletions=()) -> None:
        from kio.schema.alter_user_scram_credentials.v0 import request as rq
        from kio.schema.alter_user_scram_credentials.v0 import response as rs

        connection = await self._any()
        response = await connection.request_kio(
            rq.AlterUserScramCredentialsRequest(deletions=tuple(deletions), upsertions=tuple(upsertions)),
            rs.AlterUserScramCredentialsResponse)
        for item in response.results:
            if int(item.error_code):
                raise KafkaError(int(item.error_code), f"user {item.user!r}: {item.error_message or ''}".rstrip(": "))
