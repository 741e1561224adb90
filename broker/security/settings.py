"""The security settings, by Kafka's names, as entries of the broker's config registry (``SECURITY_CONFIGS``:
name, type, default, validator, documentation, sensitive, settable per listener; ``broker.config.CONFIGS``
adds them), and their values for each listener. Pure.

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

Sensitive values (key passwords, JAAS lines) are never logged nor described: ``describe()`` masks them, and
DescribeConfigs answers them null. Every entry is static (read at start-up). The values are kept as given
(``SecuritySettings``) and resolved per listener here; the registry lists, describes and checks them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from copyless.broker.config_def import ConfigError, ConfigKey, ConfigType

__all__ = ["SECURITY_CONFIGS", "SecuritySettings", "ListenerSecurity", "SettingsError", "PROTOCOLS",
           "parse_jaas", "parse_protocol_map", "is_security_key", "AUTHORIZER_CLASSES"]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# authorizer.class.name values that turn on the built-in ACL authorizer (Kafka's two, and a short name).
AUTHORIZER_CLASSES = ("org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                      "kafka.security.authorizer.AclAuthorizer", "acl")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class SettingsError(ValueError):
    """A security setting is malformed; the message names it (never its value when it is sensitive)."""


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


def _checked(check: Callable[[Any], None]) -> Callable[[str, Any], None]:
    """One of the checks above as a registry validator: (name, value), refusing with ConfigError."""

    def validator(name: str, value) -> None:
        try:
            check(value)
        except (SettingsError, ValueError, TypeError) as exc:
            raise ConfigError(f"Invalid value {value!r} for configuration {name}: {exc}") from None

    validator.__doc__ = check.__doc__
    return validator


def _key(name: str, config_type: ConfigType, default, doc: str, check=None, *, per_listener: bool = False,
         sensitive: bool = False) -> ConfigKey:
    """A security setting of the broker's registry: static, read from ``BrokerConfig.security``."""
    return ConfigKey(name, config_type, doc, default=default, validator=_checked(check) if check else None,
                     per_listener=per_listener, sensitive=sensitive,
                     read=lambda config: config.security.get(name))


# The security settings of the broker's config registry (``broker.config.CONFIGS`` adds them, as Kafka's
# ConfigDef takes SslConfigs' and SaslConfigs' keys): one entry each. ``per_listener``: also settable for one
# listener as ``listener.name.<listener, lower case>.<name>``.
SECURITY_CONFIGS: tuple[ConfigKey, ...] = (
    _key("listener.security.protocol.map", ConfigType.STRING,
         "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
         "LISTENER:PROTOCOL pairs; a listener named after a protocol needs no entry.", _protocol_map),
    _key("sasl.enabled.mechanisms", ConfigType.LIST, "SCRAM-SHA-256,SCRAM-SHA-512",
         "Mechanisms a SASL listener offers (Kafka's default, GSSAPI, is not offered).", _list_of(_MECHANISMS),
         per_listener=True),
    _key("sasl.mechanism.inter.broker.protocol", ConfigType.STRING, "SCRAM-SHA-512",
         "The mechanism brokers authenticate to each other with.", _list_of(_MECHANISMS)),
    _key("sasl.jaas.config", ConfigType.PASSWORD, None,
         "Per listener and mechanism (listener.name.<l>.<mechanism>.sasl.jaas.config): the credentials this "
         "broker logs in with as a client (ScramLoginModule/PlainLoginModule username=... password=...).",
         per_listener=True, sensitive=True),
    _key("sasl.server.max.receive.size", ConfigType.INT, 524288,
         "The largest frame accepted before authentication completes.", _at_least(1024)),
    _key("connections.max.reauth.ms", ConfigType.LONG, 0,
         "SASL session lifetime (KIP-368); 0: sessions do not expire.", _at_least(0), per_listener=True),
    _key("connection.failed.authentication.delay.ms", ConfigType.INT, 100,
         "How long a failed authentication waits before its answer and the close.", _at_least(0)),
    _key("ssl.keystore.location", ConfigType.STRING, None,
         "PEM file holding the private key and the certificate chain.", per_listener=True),
    _key("ssl.keystore.type", ConfigType.STRING, "PEM", "The keystore's format: PEM.", _choice("pem"),
         per_listener=True),
    _key("ssl.key.password", ConfigType.PASSWORD, None, "The password of an encrypted private key.",
         per_listener=True, sensitive=True),
    _key("ssl.keystore.password", ConfigType.PASSWORD, None,
         "Accepted as the key's password when ssl.key.password is not set.", per_listener=True, sensitive=True),
    _key("ssl.truststore.location", ConfigType.STRING, None,
         "PEM file of the CA certificates that sign client (and peer broker) certificates.", per_listener=True),
    _key("ssl.truststore.type", ConfigType.STRING, "PEM", "The truststore's format: PEM.", _choice("pem"),
         per_listener=True),
    _key("ssl.truststore.password", ConfigType.PASSWORD, None,
         "Accepted and ignored: a PEM truststore has no password.", per_listener=True, sensitive=True),
    _key("ssl.client.auth", ConfigType.STRING, "none", "Whether clients present certificates: none, requested or "
         "required.", _choice("none", "requested", "required"), per_listener=True),
    _key("ssl.enabled.protocols", ConfigType.LIST, "TLSv1.2,TLSv1.3", "The TLS versions offered.", _protocols,
         per_listener=True),
    _key("ssl.protocol", ConfigType.STRING, "TLSv1.3", "The newest protocol offered.", _protocols,
         per_listener=True),
    _key("ssl.cipher.suites", ConfigType.LIST, "",
         "TLS 1.2 suites by IANA or OpenSSL name; empty: OpenSSL's defaults.", per_listener=True),
    _key("ssl.endpoint.identification.algorithm", ConfigType.STRING, "https",
         "Inter-broker client connections check the peer's host name ('' turns it off).", _choice("https", "")),
    _key("ssl.principal.mapping.rules", ConfigType.STRING, "DEFAULT",
         "From a client certificate's DN to its principal (Kafka's RULE:... syntax).", _principal_rules,
         per_listener=True),
    _key("ssl.ktls.enable", ConfigType.BOOLEAN, True,
         "Hand TLS sessions to the kernel (kTLS) where it has the tls module, keeping sendfile."),
    _key("authorizer.class.name", ConfigType.CLASS, "",
         "The ACL authorizer; empty: none (every request is allowed, the ACL APIs answer SECURITY_DISABLED).",
         _choice("", *(c.lower() for c in AUTHORIZER_CLASSES))),
    _key("super.users", ConfigType.STRING, "", "Principals allowed everything, ';'-separated."),
    _key("allow.everyone.if.no.acl.found", ConfigType.BOOLEAN, False,
         "Allow a request on a resource no ACL names."),
    _key("add.scram", ConfigType.LIST, (),
         "SCRAM credentials created at start-up when the user has none for that mechanism (kafka-storage format "
         "--add-scram syntax).", sensitive=True),
)

_BY_NAME = {key.name: key for key in SECURITY_CONFIGS}
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
    return _JAAS_KEY.match(rest) is not None or (rest in _BY_NAME and _BY_NAME[rest].per_listener)


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
    def from_mapping(cls, mapping: Mapping[str, Any], add_scram=()) -> SecuritySettings:
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
        for key in SECURITY_CONFIGS:
            value = raw.get(prefix + key.name, raw.get(key.name, key.default)) if key.per_listener \
                else raw.get(key.name, key.default)
            resolved[key.name] = value
        for mechanism in ("plain", "scram-sha-256", "scram-sha-512"):
            jaas_name = f"{prefix}{mechanism}.sasl.jaas.config"
            value = raw.get(jaas_name, raw.get(f"{mechanism}.sasl.jaas.config", raw.get("sasl.jaas.config")))
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
            if entry is None or (match and not entry.per_listener):
                raise SettingsError(f"unknown setting {key!r}")
            # An override of a listener that is not configured is ignored, as Kafka does: the file may be
            # shared by brokers whose listeners the command line names.
            if entry.validator is not None:
                try:
                    entry.validator(key, value)
                except ConfigError as exc:
                    shown = "" if entry.is_sensitive else f" ({exc})"
                    raise SettingsError(f"bad value for {key!r}{shown}") from None
        mapped = self.protocol_map()
        # Kafka refuses a listener the map does not name. copyless served plaintext on listeners of any name
        # (INTERNAL, OUTSIDE) before it had a map, so it keeps doing that until the map is set: a set map is
        # then the whole truth, and a listener it forgets is an error rather than a silent PLAINTEXT.
        map_is_set = "listener.security.protocol.map" in raw
        for name in listener_names:
            if map_is_set and name.upper() not in mapped and name.upper() not in PROTOCOLS:
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
            if (listener.get("ssl.client.auth") != "none" and listener.tls
                    and not listener.get("ssl.truststore.location")):
                raise SettingsError(f"listener {name}: ssl.client.auth needs ssl.truststore.location")

    def describe(self) -> dict[str, Any]:
        """Every set value for the log, sensitive ones masked."""
        shown = {}
        for key, value in self._raw().items():
            match = _LISTENER_KEY.match(key)
            base = match.group(2) if match else key
            entry = _BY_NAME.get(base)
            sensitive = entry.is_sensitive if entry is not None else True
            shown[key] = "[hidden]" if sensitive else value
        if self.add_scram:
            shown["--add-scram"] = f"[{len(self.add_scram)} hidden]"
        return shown
