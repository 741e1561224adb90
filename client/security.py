"""The client's security settings: TLS and SASL, by the names Kafka clients already use.

``ClientSecurity`` is what a connection needs: the security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT,
SASL_SSL), an ``ssl.SSLContext`` for the TLS ones, and the SASL mechanism (PLAIN, SCRAM-SHA-256,
SCRAM-SHA-512) with a user name and password for the SASL ones. Build it from keyword arguments named as
kafka-python and aiokafka name them (``security_protocol``, ``sasl_mechanism``, ``sasl_plain_username``,
``sasl_plain_password``, ``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_password``,
``ssl_check_hostname``, ``ssl_context``), or from a properties file as kcat's ``-F`` reads one, with
librdkafka's names (``security.protocol``, ``sasl.mechanisms``, ``sasl.username``, ``sasl.password``,
``ssl.ca.location``, ``ssl.certificate.location``, ``ssl.key.location``, ``ssl.key.password``,
``ssl.endpoint.identification.algorithm``) or the Java client's (``sasl.mechanism``, ``sasl.jaas.config``,
``ssl.truststore.location`` and ``ssl.keystore.location`` as PEM files).

The password never appears in ``repr``, in an error message or in a log line.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ClientSecurity", "PROTOCOLS", "MECHANISMS", "read_properties", "parse_jaas", "make_context", "PLAINTEXT",
           "resolve", "OPTION_NAMES"]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class ClientSecurity:
    protocol: str = "PLAINTEXT"
    ssl_context: ssl.SSLContext | None = field(default=None, compare=False)
    mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False, compare=False)

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def check(self) -> ClientSecurity:
        """Raises ValueError naming what is missing (never the password)."""
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"security protocol must be one of {', '.join(PROTOCOLS)}, not {self.protocol!r}")
        if self.tls and self.ssl_context is None:
            raise ValueError(f"{self.protocol} needs an SSL context")
        if self.sasl:
            if self.mechanism not in MECHANISMS:
                raise ValueError(f"SASL mechanism must be one of {', '.join(MECHANISMS)}, not {self.mechanism!r}")
            if not self.username or self.password is None:
                raise ValueError(f"{self.protocol} needs a SASL user name and password")
        return self

    @classmethod
    def create(cls, security_protocol: str = "PLAINTEXT", *, sasl_mechanism: str | None = None,
               sasl_plain_username: str | None = None, sasl_plain_password: str | None = None,
               ssl_context: ssl.SSLContext | None = None, ssl_cafile: str | None = None,
               ssl_certfile: str | None = None, ssl_keyfile: str | None = None, ssl_password: str | None = None,
               ssl_check_hostname: bool = True) -> ClientSecurity:
        """From kafka-python/aiokafka-style arguments. Raises ValueError, OSError (unreadable files)."""
        protocol = str(security_protocol).upper()
        context = ssl_context
        if protocol in ("SSL", "SASL_SSL") and context is None:
            context = make_context(cafile=ssl_cafile, certfile=ssl_certfile, keyfile=ssl_keyfile,
                                   password=ssl_password, check_hostname=ssl_check_hostname)
        mechanism = sasl_mechanism.upper() if sasl_mechanism else ("SCRAM-SHA-512" if "SASL" in protocol else None)
        return cls(protocol, context, mechanism, sasl_plain_username, sasl_plain_password).check()

    @classmethod
    def from_properties(cls, properties: dict[str, str]) -> ClientSecurity:
        """From librdkafka or Java client property names (module docstring). Raises ValueError, OSError."""
        get = properties.get
        protocol = (get("security.protocol") or "PLAINTEXT").upper()
        mechanism = get("sasl.mechanisms") or get("sasl.mechanism")
        username, password = get("sasl.username"), get("sasl.password")
        jaas = get("sasl.jaas.config")
        if jaas and (username is None or password is None):
            options = parse_jaas(jaas)
            username = username or options.get("username")
            password = password if password is not None else options.get("password")
        identification = get("ssl.endpoint.identification.algorithm", "https")
        return cls.create(
            protocol, sasl_mechanism=mechanism, sasl_plain_username=username, sasl_plain_password=password,
            ssl_cafile=get("ssl.ca.location") or get("ssl.truststore.location"),
            ssl_certfile=get("ssl.certificate.location") or get("ssl.keystore.location"),
            ssl_keyfile=get("ssl.key.location") or get("ssl.keystore.location"),
            ssl_password=get("ssl.key.password") or get("ssl.keystore.password"),
            ssl_check_hostname=str(identification).lower() == "https")


PLAINTEXT = ClientSecurity()
# The keyword arguments Producer, Consumer and Admin take for security (kafka-python's and aiokafka's names).
OPTION_NAMES = ("security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password", "ssl_context",
                "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_check_hostname")


def resolve(security: ClientSecurity | None, options: dict) -> ClientSecurity:
    """``security`` if given, else one built from kafka-python-style ``options``. Raises TypeError on an
    unknown option name, ValueError on a bad combination."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
    if security is not None:
        if options:
            raise TypeError("pass either security= or the security options, not both")
        return security.check()
    if not options:
        return PLAINTEXT
    return ClientSecurity.create(**options)


def make_context(*, cafile=None, certfile=None, keyfile=None, password=None, check_hostname=True) -> ssl.SSLContext:
    """A client context: trust ``cafile`` (else the system's CAs), present ``certfile``/``keyfile`` for
    mTLS, check the broker's host name unless told not to."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if cafile:
        context.load_verify_locations(cafile=cafile)
    else:
        context.load_default_certs()
    if certfile:
        context.load_cert_chain(certfile, keyfile or None, password=password)
    context.check_hostname = bool(check_hostname)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def read_properties(path: str | Path) -> dict[str, str]:
    """A Java-style properties file (``key=value`` or ``key: value``, ``#``/``!`` comments) as a dict.
    Raises OSError."""
    result = {}
    for raw in Path(path).read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cuts = [index for index in (line.find("="), line.find(":")) if index > 0]
        if cuts:
            cut = min(cuts)
            result[line[:cut].strip()] = line[cut + 1:].strip()
    return result


_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"|(\w+)\s*=\s*([^\s;"]+)')


def parse_jaas(text: str) -> dict[str, str]:
    """The options of a JAAS line (``... LoginModule required username="u" password="p";``). Raises
    ValueError, whose message never quotes the line (it holds a password)."""
    text = str(text).strip()
    head, required, options = text.partition(" required")
    if not required or not head.strip().endswith("LoginModule"):
        raise ValueError("sasl.jaas.config must read '<LoginModule class> required name=\"value\" ...;'")
    found = {}
    for match in _JAAS_OPTION.finditer(options):
        if match.group(1):
            found[match.group(1)] = re.sub(r"\\(.)", r"\1", match.group(2))
        else:
            found[match.group(3)] = match.group(4)
    return found
