"""The security settings, by Kafka's names, as entries of one table (name, type, default, validator,
synonyms, dynamic, scope, sensitive), and their values for each listener. Pure.

A setting may be given for every listener (``ssl.keystore.location``) or for one (Kafka's
``listener.name.<listener, lower case>.<setting>``), the second winning; SASL JAAS lines are per listener
and mechanism (``listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config``). In the TOML file::

    listeners = "CLIENTS://0.0.0.0:9093,INTERNAL://0.0.0.0:9094"
    "listener.security.protocol.map" = "CLIENTS:SASL_SSL,INTERNAL:SSL"
    "inter.broker.listener.name" = "INTERNAL"
    "ssl.keystore.location" = "/etc/copyless/broker.pem"      # PEM: the key and the certificate chain
    "ssl.truststore.location" = "/etc/copyless/ca.pem"
    "listener.name.internal.ssl.client.auth" = "required"
    "sasl.enabled.mechanisms" = "SCRAM-SHA-512"
    "authorizer.class.name" = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    "super.users" = "User:admin;User:CN=broker1"

Sensitive values (key passwords, JAAS lines) are never logged nor described: ``describe()`` masks them.
Every entry is static (read at start-up); the table's shape is the one the broker's config registry uses,
so the entries move into it unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

__all__ = ["SettingEntry", "ENTRIES", "SecuritySettings", "ListenerSecurity", "SettingsError", "PROTOCOLS",
           "parse_jaas", "parse_protocol_map", "is_security_key", "AUTHORIZER_CLASSES"]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# authorizer.class.name values that turn on the built-in ACL authorizer (Kafka's two, and a short name).
AUTHORIZER_CLASSES = ("org.apache.kafka.metadata.authorizer.StandardAuthorizer", "kafka.security.authorizer.AclAuthorizer",
                      "acl")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class SettingsError(ValueError):
    """A security setting is malformed; the message names it (never its value when it is sensitive)."""


@dataclass(frozen=True)
class SettingEntry:
    name: str
    type: str  # "string" | "list" | "int" | "long" | "boolean" | "password" | "class"
    default: Any
    validator: Callable[[Any], None] | None = None
    synonyms: tuple[str, ...] = ()
    dynamic: bool = False
    scope: str = "broker"  # "broker": one value; "listener": may be set per listener
    sensitive: bool = False
    doc: str = ""


def _choice(*allowed: str) -> Callable[[Any], None]:
    def check(value) -> None:
        if str(value).lower() not in allowed:
            raise SettingsError(f"must be one of {', '.join(allowed)}, not {value!r}")
    return check


def _list_of(allowed: tuple[str, ...]) -> Callable[[Any], None]:
    def check(value) -> None:
        for item in _items(value):
            if item not in allowed:
                raise SettingsError(f"{item!r} is not one of {', '.join(allowed)}")
    return check


def _at_least(minimum: int) -> Callable[[Any], None]:
    def check(value) -> None:
        if int(value) < minimum:
            raise SettingsError(f"must be >= {minimum}, not {value}")
    return check


def _protocols(value) -> None:
    for item in _items(value):
        if item.upper() not in ("TLSV1.2", "TLSV1.3"):
            raise SettingsError(f"{item!r}: only TLSv1.2 and TLSv1.3 are offered")


def _protocol_map(value) -> None:
    parse_protocol_map(value)


def _principal_rules(value) -> None:
    from copyless.broker.security.principal import MappingError, PrincipalMapper

    try:
        PrincipalMapper(str(value))
    except MappingError as exc:
        raise SettingsError(str(exc)) from None


ENTRIES: tuple[SettingEntry, ...] = (
    SettingEntry("listener.security.protocol.map", "string",
                 "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL", _protocol_map,
                 doc="LISTENER:PROTOCOL pairs; a listener named after a protocol needs no entry"),
    SettingEntry("sasl.enabled.mechanisms", "list", "SCRAM-SHA-256,SCRAM-SHA-512", _list_of(_MECHANISMS),
                 scope="listener", doc="mechanisms a SASL listener offers (Kafka's default, GSSAPI, is not offered)"),
    SettingEntry("sasl.mechanism.inter.broker.protocol", "string", "SCRAM-SHA-512", _list_of(_MECHANISMS),
                 doc="the mechanism brokers authenticate to each other with"),
    SettingEntry("sasl.jaas.config", "password", None, scope="listener", sensitive=True,
                 doc="per listener and mechanism: the credentials this broker logs in with as a client "
                     "(ScramLoginModule/PlainLoginModule username=... password=...)"),
    SettingEntry("sasl.server.max.receive.size", "int", 524288, _at_least(1024),
                 doc="the largest frame accepted before authentication completes"),
    SettingEntry("connections.max.reauth.ms", "long", 0, _at_least(0), scope="listener",
                 doc="SASL session lifetime (KIP-368); 0: sessions do not expire"),
    SettingEntry("connection.failed.authentication.delay.ms", "int", 100, _at_least(0),
                 doc="how long a failed authentication waits before its answer and the close"),
    SettingEntry("ssl.keystore.location", "string", None, scope="listener",
                 doc="PEM file holding the private key and the certificate chain"),
    SettingEntry("ssl.keystore.type", "string", "PEM", _choice("pem"), scope="listener"),
    SettingEntry("ssl.key.password", "password", None, scope="listener", sensitive=True,
                 doc="the password of an encrypted private key"),
    SettingEntry("ssl.keystore.password", "password", None, scope="listener", sensitive=True,
                 doc="accepted as the key's password when ssl.key.password is not set"),
    SettingEntry("ssl.truststore.location", "string", None, scope="listener",
                 doc="PEM file of the CA certificates that sign client (and peer broker) certificates"),
    SettingEntry("ssl.truststore.type", "string", "PEM", _choice("pem"), scope="listener"),
    SettingEntry("ssl.truststore.password", "password", None, scope="listener", sensitive=True,
                 doc="accepted and ignored: a PEM truststore has no password"),
    SettingEntry("ssl.client.auth", "string", "none", _choice("none", "requested", "required"), scope="listener"),
    SettingEntry("ssl.enabled.protocols", "list", "TLSv1.2,TLSv1.3", _protocols, scope="listener"),
    SettingEntry("ssl.protocol", "string", "TLSv1.3", _protocols, scope="listener",
                 doc="the newest protocol offered"),
    SettingEntry("ssl.cipher.suites", "list", "", scope="listener",
                 doc="TLS 1.2 suites by IANA or OpenSSL name; empty: OpenSSL's defaults"),
    SettingEntry("ssl.endpoint.identification.algorithm", "string", "https", _choice("https", ""),
                 doc="inter-broker client connections check the peer's host name ('' turns it off)"),
    SettingEntry("ssl.principal.mapping.rules", "string", "DEFAULT", _principal_rules, scope="listener"),
    SettingEntry("ssl.ktls.enable", "boolean", True,
                 doc="hand TLS sessions to the kernel (kTLS) where it has the tls module, keeping sendfile"),
    SettingEntry("authorizer.class.name", "class", "", _choice("", *(c.lower() for c in AUTHORIZER_CLASSES)),
                 doc="the ACL authorizer; empty: none (every request is allowed, the ACL APIs answer "
                     "SECURITY_DISABLED)"),
    SettingEntry("super.users", "list", "", doc="principals allowed everything, ';'-separated"),
    SettingEntry("allow.everyone.if.no.acl.found", "boolean", False),
    SettingEntry("add.scram", "list", (), sensitive=True,
                 doc="SCRAM credentials created at start-up when the user has none for that mechanism "
                     "(kafka-storage format --add-scram syntax)"),
)

_BY_NAME = {entry.name: entry for entry in ENTRIES}
_LISTENER_KEY = re.compile(r"^listener\.name\.([a-z0-9_]+)\.(.+)$")
_JAAS_KEY = re.compile(r"^(plain|scram-sha-256|scram-sha-512)\.sasl\.jaas\.config$")


def _items(value) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if str(v).strip()]
    return [v.strip() for v in str(value).split(",") if v.strip()]


def is_security_key(key: str) -> bool:
    """Whether a config-file key belongs to this table (directly or as a listener override)."""
    if key in _BY_NAME:
        return True
    match = _LISTENER_KEY.match(key)
    if match is None:
        return False
    rest = match.group(2)
    return _JAAS_KEY.match(rest) is not None or (rest in _BY_NAME and _BY_NAME[rest].scope == "listener")


def parse_protocol_map(value) -> dict[str, str]:
    """``"A:SASL_SSL,B:SSL"`` -> {"A": "SASL_SSL", ...}. Raises SettingsError."""
    result = {}
    for item in _items(value):
        name, sep, protocol = item.partition(":")
        protocol = protocol.strip().upper()
        if not sep or not name.strip() or protocol not in PROTOCOLS:
            raise SettingsError(f"listener.security.protocol.map: {item!r} is not LISTENER:PROTOCOL "
                                f"({', '.join(PROTOCOLS)})")
        result[name.strip().upper()] = protocol
    return result


def parse_jaas(text: str) -> dict[str, str]:
    """The options of a JAAS line. Raises SettingsError (without the line: it holds a password)."""
    from copyless.client.security import parse_jaas as parse

    try:
        return parse(text)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


@dataclass(frozen=True)
class ListenerSecurity:
    """What one listener needs at start-up (its settings resolved through the overrides)."""

    name: str
    protocol: str
    settings: Mapping[str, Any]

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def get(self, name: str):
        return self.settings[name]

    @property
    def mechanisms(self) -> tuple[str, ...]:
        return tuple(m.upper() for m in _items(self.settings["sasl.enabled.mechanisms"]))


@dataclass(frozen=True)
class SecuritySettings:
    """The security settings as given (file or flags), before they are resolved per listener."""

    values: tuple[tuple[str, Any], ...] = ()
    # The bootstrap credentials given as ``copyless serve --add-scram`` (kept apart from the file's).
    add_scram: tuple[str, ...] = field(default=())

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], add_scram=()) -> "SecuritySettings":
        return cls(tuple(sorted((str(k), v) for k, v in mapping.items())), tuple(add_scram))

    def _raw(self) -> dict[str, Any]:
        return dict(self.values)

    def get(self, name: str):
        raw = self._raw()
        return raw[name] if name in raw else _BY_NAME[name].default

    def listener(self, name: str) -> ListenerSecurity:
        """The settings of listener ``name``, overrides applied."""
        raw = self._raw()
        protocol = self.protocol_map().get(name.upper())
        if protocol is None:
            protocol = name.upper() if name.upper() in PROTOCOLS else "PLAINTEXT"
        resolved = {}
        prefix = f"listener.name.{name.lower()}."
        for entry in ENTRIES:
            value = raw.get(prefix + entry.name, raw.get(entry.name, entry.default)) if entry.scope == "listener" \
                else raw.get(entry.name, entry.default)
            resolved[entry.name] = value
        for mechanism in ("plain", "scram-sha-256", "scram-sha-512"):
            key = f"{prefix}{mechanism}.sasl.jaas.config"
            value = raw.get(key, raw.get(f"{mechanism}.sasl.jaas.config", raw.get("sasl.jaas.config")))
            resolved[f"{mechanism}.sasl.jaas.config"] = value
        return ListenerSecurity(name, protocol, resolved)

    def protocol_map(self) -> dict[str, str]:
        return parse_protocol_map(self.get("listener.security.protocol.map"))

    @property
    def authorizer_enabled(self) -> bool:
        return str(self.get("authorizer.class.name")).strip() != ""

    def super_users(self) -> tuple[str, ...]:
        return tuple(u.strip() for u in str(self.get("super.users")).split(";") if u.strip())

    def bootstrap_credentials(self) -> tuple[str, ...]:
        return tuple(_items(self.get("add.scram"))) + self.add_scram

    def validate(self, listener_names) -> None:
        """Check every value, and the listeners against the protocol map. Raises SettingsError naming the
        setting (never the value of a sensitive one)."""
        raw = self._raw()
        for key, value in raw.items():
            match = _LISTENER_KEY.match(key)
            base = match.group(2) if match else key
            if _JAAS_KEY.match(base) or base == "sasl.jaas.config":
                try:
                    parse_jaas(value)
                except SettingsError as exc:
                    raise SettingsError(f"{key}: {exc}") from None
                continue
            entry = _BY_NAME.get(base)
            if entry is None or (match and entry.scope != "listener"):
                raise SettingsError(f"unknown setting {key!r}")
            # An override of a listener that is not configured is ignored, as Kafka does: the file may be
            # shared by brokers whose listeners the command line names.
            if entry.validator is not None:
                try:
                    entry.validator(value)
                except (SettingsError, ValueError, TypeError) as exc:
                    shown = "" if entry.sensitive else f" ({exc})"
                    raise SettingsError(f"bad value for {key!r}{shown}") from None
        mapped = self.protocol_map()
        for name in listener_names:
            if name.upper() not in mapped and name.upper() not in PROTOCOLS:
                raise SettingsError(f"listener {name} has no security protocol: add {name}:PROTOCOL to "
                                    f"listener.security.protocol.map")
            listener = self.listener(name)
            if listener.tls and not listener.get("ssl.keystore.location"):
                raise SettingsError(f"listener {name} is {listener.protocol} but has no ssl.keystore.location")
            if listener.sasl:
                unsupported = [m for m in listener.mechanisms if m not in _MECHANISMS]
                if unsupported or not listener.mechanisms:
                    raise SettingsError(f"listener {name}: sasl.enabled.mechanisms must name some of "
                                        f"{', '.join(_MECHANISMS)}")
            if listener.get("ssl.client.auth") != "none" and listener.tls and not listener.get("ssl.truststore.location"):
                raise SettingsError(f"listener {name}: ssl.client.auth needs ssl.truststore.location")

    def describe(self) -> dict[str, Any]:
        """Every set value for the log, sensitive ones masked."""
        shown = {}
        for key, value in self._raw().items():
            match = _LISTENER_KEY.match(key)
            base = match.group(2) if match else key
            entry = _BY_NAME.get(base)
            sensitive = entry.sensitive if entry is not None else True
            shown[key] = "[hidden]" if sensitive else value
        if self.add_scram:
            shown["--add-scram"] = f"[{len(self.add_scram)} hidden]"
        return shown
