"""The broker's security, composed: per-listener TLS contexts and SASL settings, kTLS detection, the
credential and ACL store, the authorizer, and the counters. ``broker.security`` is this object.

Start-up (``prepare``, blocking, before serving): the settings are resolved per listener, certificate files
are read into one server context per TLS listener (a file that does not load stops the start with its
name), the kernel is asked once whether it has the tls module, and the single node's ``security.json`` is
read. ``start`` (loop, after the metadata backend joined) creates the ``add.scram`` bootstrap credentials
a user does not have yet; their PBKDF2 runs on a worker thread.

Decisions: ``authorize`` answers every request's checks (``broker.security.checks``); with no
``authorizer.class.name`` it allows everything, as Kafka does. The authorizer is rebuilt, whole, whenever
the store changes, so a decision never sees half of a change.

Counters (``stats``, also in ``/metrics`` and ``stats-json``): TLS handshakes and their failures, sessions
the kernel took over (kTLS) or not, record bytes sent by kTLS sendfile and bytes copied through TLS, SASL
authentications and failures by mechanism, re-authentications, requests refused before authentication,
and authorization denials. No counter, label or log line here carries a secret.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from copyless.broker.security.acl import Authorizer, Operation, ResourceType
from copyless.broker.security.principal import PrincipalMapper
from copyless.broker.security.sasl import SaslSession
from copyless.broker.security.settings import ListenerSecurity, SettingsError, parse_jaas
from copyless.broker.security.tls import KtlsStatus, client_context, kernel_tls_available, server_context

__all__ = ["SecurityManager", "ListenerRuntime", "ANONYMOUS", "parse_add_scram"]

log = logging.getLogger("copyless.security")

ANONYMOUS = "User:ANONYMOUS"


@dataclass
class ListenerRuntime:
    """One listener's security, ready to serve: its protocol, TLS context (SSL, SASL_SSL) and whether
    sessions may go to the kernel, its SASL mechanisms, its principal mapping."""

    security: ListenerSecurity
    context: Any = None  # ssl.SSLContext
    ktls: bool = False
    mapper: PrincipalMapper = field(default_factory=PrincipalMapper)  # DEFAULT: the subject as it is

    @property
    def protocol(self) -> str:
        return self.security.protocol


_SCRAM_SPEC = re.compile(r"^\s*(SCRAM-SHA-256|SCRAM-SHA-512)\s*=\s*\[(.*)\]\s*$", re.IGNORECASE)
_SPEC_ITEM = re.compile(r'\s*(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,]*))\s*(?:,|$)')


def parse_add_scram(spec: str) -> dict[str, str]:
    """kafka-storage's ``SCRAM-SHA-512=[name=alice,password=secret]`` (or ``[name=alice,iterations=8192,
    salt="...",saltedpassword="..."]``) -> {"mechanism": ..., "name": ..., ...}. Raises SettingsError
    (without the spec: it holds a password)."""
    match = _SCRAM_SPEC.match(spec)
    if match is None:
        raise SettingsError("add.scram entries read SCRAM-SHA-256=[name=USER,password=PASSWORD] or "
                            "SCRAM-SHA-512=[name=USER,iterations=N,salt=B64,saltedpassword=B64]")
    result = {"mechanism": match.group(1).upper()}
    body = match.group(2)
    position = 0
    while position < len(body):
        item = _SPEC_ITEM.match(body, position)
        if item is None or item.end() == position:
            raise SettingsError("add.scram: cannot parse an entry's fields")
        value = item.group(2) if item.group(2) is not None else item.group(3)
        result[item.group(1).lower()] = re.sub(r"\\(.)", r"\1", value.strip() if item.group(2) is None else value)
        position = item.end()
    if not result.get("name") or not ("password" in result or "saltedpassword" in result):
        raise SettingsError("add.scram: an entry needs name= and password= (or salt= and saltedpassword=)")
    return result


class SecurityManager:
    """``broker.security`` (module docstring). Loop thread except ``prepare``."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.settings = broker.config.security
        self.listeners: dict[str, ListenerRuntime] = {}
        self.ktls = KtlsStatus(False, "no TLS listener")
        self.store: Any = None
        self.authorizer: Authorizer | None = None
        self.decoy_secret = secrets.token_bytes(32)
        self.stats: Counter = Counter()
        self.mechanism_stats: Counter = Counter()  # (mechanism, "ok"|"failed") -> count
        self._inter_broker: Any = None

    # --- start-up ---------------------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Resolve listeners, load certificates, detect kTLS, open the store. Blocking.

        Raises:
            SettingsError: a certificate or key that does not load, a bad rule (named, never a password).
        """
        names = [name for name, _h, _p in self.broker.config.listener_specs()]
        resolved = {name: self.settings.listener(name) for name in names}
        if any(listener.tls for listener in resolved.values()):
            if self.settings.get("ssl.ktls.enable") in (False, "false", "False"):
                self.ktls = KtlsStatus(False, "ssl.ktls.enable is false")
            else:
                self.ktls = kernel_tls_available()
        for name, listener in resolved.items():
            mapper = PrincipalMapper(str(listener.get("ssl.principal.mapping.rules")))
            runtime = ListenerRuntime(listener, mapper=mapper)
            if listener.tls:
                runtime.ktls = self.ktls.available
                runtime.context = server_context(listener, ktls=runtime.ktls)
            self.listeners[name] = runtime
        if self.broker.config.clustered:
            from copyless.broker.security.store import EtcdSecurityStore

            self.store = EtcdSecurityStore(self.broker.metadata)
        else:
            from copyless.broker.security.store import EmbeddedSecurityStore

            self.store = EmbeddedSecurityStore(self.broker.data_dir)
            self.store.load_blocking()
        self.store.on_change = self._rebuild_authorizer
        self._rebuild_authorizer()
        if self.broker.config.clustered:
            self._inter_broker = self._make_inter_broker_client()
        for spec in self.settings.bootstrap_credentials():
            parse_add_scram(spec)  # refuse a malformed one before serving, not after

    async def start(self) -> None:
        """Create the bootstrap credentials users do not have yet. Loop thread, after the metadata started."""
        from copyless.protocol.scram import credential_from_password, credential_from_salted_password

        for spec in self.settings.bootstrap_credentials():
            fields = parse_add_scram(spec)
            user, mechanism = fields["name"], fields["mechanism"]
            if self.store.credential(user, mechanism) is not None:
                continue
            iterations = int(fields.get("iterations", 4096))
            salt = base64.b64decode(fields["salt"]) if "salt" in fields else secrets.token_bytes(32)
            if "saltedpassword" in fields:
                salted_password = base64.b64decode(fields["saltedpassword"])
                credential = credential_from_salted_password(mechanism, salt, salted_password, iterations)
            else:
                credential = await asyncio.to_thread(credential_from_password, mechanism, fields["password"], salt,
                                                     iterations)
            if await self.store.add_if_absent(user, mechanism, credential):
                log.info("created the %s credential of user %s (add.scram)", mechanism, user)

    def _rebuild_authorizer(self) -> None:
        if not self.settings.authorizer_enabled:
            self.authorizer = None
            return
        allow = str(self.settings.get("allow.everyone.if.no.acl.found")).lower() == "true"
        self.authorizer = Authorizer(self.store.acls, self.settings.super_users(), allow)

    # --- connections --------------------------------------------------------------------------------------------

    def listener(self, name: str) -> ListenerRuntime:
        return self.listeners[name]

    def new_sasl_session(self, name: str) -> SaslSession | None:
        """A SASL session for a new connection on listener ``name`` (None unless it is a SASL listener)."""
        runtime = self.listeners[name]
        if not runtime.security.sasl:
            return None
        return SaslSession(runtime.security.mechanisms, self.store.credential,
                           clock_ms=lambda: time.monotonic() * 1000, nonce=lambda: secrets.token_urlsafe(24),
                           decoy_secret=self.decoy_secret,
                           reauth_ms=int(runtime.security.get("connections.max.reauth.ms")))

    def tls_principal(self, name: str, tls_socket) -> str:
        """The principal of an SSL listener's client: its certificate's mapped subject, or ANONYMOUS when it
        presented none. Raises principal.MappingError when no rule maps the subject."""
        from copyless.broker.security.principal import distinguished_name

        certificate = tls_socket.getpeercert()
        if not certificate or not certificate.get("subject"):
            return ANONYMOUS
        return "User:" + self.listeners[name].mapper.principal_name(distinguished_name(certificate["subject"]))

    def failed_authentication_delay_s(self) -> float:
        return int(self.settings.get("connection.failed.authentication.delay.ms")) / 1000

    def max_receive_bytes(self) -> int:
        return int(self.settings.get("sasl.server.max.receive.size"))

    # --- decisions -----------------------------------------------------------------------------------------------

    def authorize(self, principal: str, host: str, operation: Operation, resource_type: ResourceType,
                  name: str) -> bool:
        authorizer = self.authorizer
        if authorizer is None:
            return True
        allowed = authorizer.authorize(principal, host, operation, resource_type, name)
        if not allowed:
            self.stats["authorization_denials"] += 1
            log.debug("denied: %s from %s %s on %s %s", principal, host, operation.name, resource_type.name, name)
        return allowed

    def authorize_any(self, principal: str, host: str, operation: Operation, resource_type: ResourceType) -> bool:
        authorizer = self.authorizer
        return authorizer is None or authorizer.authorize_any(principal, host, operation, resource_type)

    # --- this broker as a client of its peers ----------------------------------------------------------------

    def inter_broker_client(self):
        """The ``ClientSecurity`` this broker connects to its peers' inter-broker listener with (replication,
        forwarding to the controller), made at start-up: TLS with that listener's truststore (and keystore,
        for peers that want a certificate), SASL with ``sasl.mechanism.inter.broker.protocol`` and the
        credentials of the listener's JAAS line for that mechanism."""
        from copyless.client.security import PLAINTEXT

        return self._inter_broker or PLAINTEXT

    def _make_inter_broker_client(self):
        """Raises SettingsError when a SASL inter-broker listener has no JAAS line. Blocking (reads files)."""
        from copyless.client.security import PLAINTEXT, ClientSecurity

        name = self.broker.config.inter_broker_listener_name
        listener = self.listeners[name].security if name in self.listeners else self.settings.listener(name)
        if listener.protocol == "PLAINTEXT":
            return PLAINTEXT
        context = client_context(listener) if listener.tls else None
        if not listener.sasl:
            return ClientSecurity(listener.protocol, context)
        mechanism = str(self.settings.get("sasl.mechanism.inter.broker.protocol")).upper()
        jaas = listener.get(f"{mechanism.lower()}.sasl.jaas.config")
        if not jaas:
            raise SettingsError(f"inter-broker listener {name} is {listener.protocol}: set "
                                f"listener.name.{name.lower()}.{mechanism.lower()}.sasl.jaas.config to the "
                                f"broker's credentials")
        options = parse_jaas(jaas)
        return ClientSecurity(listener.protocol, context, mechanism, options.get("username"),
                              options.get("password")).check()

    # --- reporting ------------------------------------------------------------------------------------------------

    def summary(self) -> str:
        """For the startup line: each non-PLAINTEXT listener's protocol and how TLS writes records."""
        secured = [f"{name}={runtime.protocol}" for name, runtime in self.listeners.items()
                   if runtime.protocol != "PLAINTEXT"]
        if not secured:
            return ""
        parts = ["listeners " + " ".join(secured)]
        if any(runtime.security.tls for runtime in self.listeners.values()):
            parts.append(f"TLS by {self.ktls.describe()}")
        if self.authorizer is not None:
            parts.append("ACLs on")
        return "; ".join(parts)

    def snapshot(self) -> dict:
        return {"ktls_available": self.ktls.available, "ktls_reason": self.ktls.reason, **dict(self.stats),
                "sasl": {f"{mechanism}:{outcome}": count for (mechanism, outcome), count in
                         sorted(self.mechanism_stats.items())},
                "acls": len(self.store.acls) if self.store is not None else 0,
                "scram_credentials": len(self.store.credentials) if self.store is not None else 0}

    def metric_families(self, family) -> None:
        """Add this module's families through ``family(name, kind, help) -> Family`` (broker.metrics)."""
        stats = self.stats
        family("ktls_available", "gauge", "1 when the kernel can take TLS sessions over (kTLS), else 0.").add(
            1 if self.ktls.available else 0)
        sessions = family("tls_sessions_total", "counter", "TLS handshakes completed, by who encrypts (kernel, copy).")
        sessions.add(stats["ktls_sessions"], path="kernel")
        sessions.add(stats["tls_copy_sessions"], path="copy")
        family("tls_handshake_failures_total", "counter", "TLS handshakes that failed.").add(
            stats["tls_handshake_failures"])
        tls_bytes = family("tls_record_bytes_total", "counter",
                           "Record bytes fetched over TLS, by path (ktls_sendfile, copied).")
        tls_bytes.add(stats["ktls_sendfile_bytes"], path="ktls_sendfile")
        tls_bytes.add(stats["tls_copied_bytes"], path="copied")
        auth = family("sasl_authentications_total", "counter", "SASL authentications, by mechanism and outcome.")
        for (mechanism, outcome), count in sorted(self.mechanism_stats.items()):
            auth.add(count, mechanism=mechanism, outcome=outcome)
        family("sasl_reauthentications_total", "counter", "SASL re-authentications (KIP-368).").add(
            stats["reauthentications"])
        family("unauthenticated_requests_total", "counter",
               "Connections closed for a request before authentication completed.").add(
            stats["unauthenticated_requests"])
        family("authorization_denials_total", "counter", "Resource checks the ACLs denied.").add(
            stats["authorization_denials"])
