"""The principal of an mTLS client: its certificate's subject as Kafka writes it, mapped by
``ssl.principal.mapping.rules``. Pure.

Kafka takes ``X500Principal.getName()`` of the client certificate (RFC 2253: the most specific RDN first,
``CN=alice,OU=eng,O=Example,C=US``, with ``,+"\\<>;`` and leading '#' or space escaped) and passes it through
the mapping rules (KIP-371)::

    ssl.principal.mapping.rules = RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,
                                  RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,
                                  DEFAULT

Each rule is ``RULE:<regex>/<replacement>/[L|U]``; the first whose regex matches the whole name gives the
principal name (``$1`` refers to a group; L/U lower- or upper-cases the result); ``DEFAULT`` gives the name
unchanged. No rule matching is an authentication failure (Kafka's ``NoMatchingRule``). The principal is
``User:<name>``.

Python's ``SSLSocket.getpeercert()`` lists the subject's RDNs in certificate order (``C`` first) with long
attribute names; ``distinguished_name`` turns that into the RFC 2253 string. Attributes RFC 2253 has no
keyword for are written as their OID with the DER value in hex (``1.2.840.113549.1.9.1=#16...`` for an
e-mail address), as Java does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["distinguished_name", "PrincipalMapper", "MappingError"]

# getpeercert() long names -> RFC 2253 keywords Java prints by name.
_KEYWORDS = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
# Attributes Java prints as OID=#<DER hex>, with the DER string type each is encoded in.
_OIDS = {
    "emailAddress": ("1.2.840.113549.1.9.1", 0x16),  # IA5String
    "serialNumber": ("2.5.4.5", 0x13),  # PrintableString
    "title": ("2.5.4.12", 0x0C),
    "surname": ("2.5.4.4", 0x0C),
    "givenName": ("2.5.4.42", 0x0C),
}


class MappingError(ValueError):
    """A bad rule (at start-up) or a name no rule maps (an authentication failure)."""


def _escape(value: str) -> str:
    out = []
    for index, char in enumerate(value):
        if char in ',+"\\<>;' or (index == 0 and char in "# ") or (index == len(value) - 1 and char == " "):
            out.append("\\" + char)
        else:
            out.append(char)
    return "".join(out)


def _der_hex(tag: int, value: str) -> str:
    data = value.encode("utf-8")
    if len(data) < 0x80:
        length = bytes([len(data)])
    else:
        size = len(data).to_bytes((len(data).bit_length() + 7) // 8, "big")
        length = bytes([0x80 | len(size)]) + size
    return "#" + (bytes([tag]) + length + data).hex()


def distinguished_name(subject: Iterable[Iterable[tuple[str, str]]]) -> str:
    """RFC 2253 string of ``getpeercert()["subject"]`` (a tuple of RDNs, each a tuple of (name, value))."""
    rdns = []
    for rdn in reversed(tuple(subject)):
        parts = []
        for name, value in rdn:
            if name in _KEYWORDS:
                parts.append(f"{_KEYWORDS[name]}={_escape(value)}")
            elif name in _OIDS:
                oid, tag = _OIDS[name]
                parts.append(f"{oid}={_der_hex(tag, value)}")
            else:
                parts.append(f"{name}={_escape(value)}")
        rdns.append("+".join(parts))
    return ",".join(rdns)


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""

    def apply(self, name: str) -> str | None:
        if self.pattern is None:
            return name
        match = self.pattern.fullmatch(name)
        if match is None:
            return None
        # Java's Matcher.replaceAll with $n references, over the whole (fully matched) name.
        result = re.sub(r"\$(\d)", lambda m: match.group(int(m.group(1))) or "", self.replacement)
        if self.case == "L":
            result = result.lower()
        elif self.case == "U":
            result = result.upper()
        return result


# One rule: DEFAULT, or RULE:pattern/replacement/ with '\/' allowed inside both, then an optional L or U.
_RULE = re.compile(r"\s*(?:(DEFAULT)|RULE:((?:\\/|[^/])*)/((?:\\/|[^/])*)/([LU]?))\s*(?:,|$)")


class PrincipalMapper:
    """``ssl.principal.mapping.rules`` compiled once (at start-up; a bad rule is a configuration error).

    Raises:
        MappingError: the rules do not parse (the message quotes where).
    """

    def __init__(self, rules: str = "DEFAULT") -> None:
        self.text = rules
        self.rules: list[_Rule] = []
        position = 0
        text = rules.strip()
        while position < len(text):
            match = _RULE.match(text, position)
            if match is None or match.end() == position:
                raise MappingError(f"ssl.principal.mapping.rules: cannot parse {text[position:]!r}")
            if match.group(1):
                self.rules.append(_Rule(None))
            else:
                try:
                    pattern = re.compile(match.group(2).replace("\\/", "/"))
                except re.error as exc:
                    raise MappingError(f"ssl.principal.mapping.rules: bad regex {match.group(2)!r}: {exc}") from None
                self.rules.append(_Rule(pattern, match.group(3).replace("\\/", "/"), match.group(4)))
            position = match.end()
        if not self.rules:
            self.rules.append(_Rule(None))

    def principal_name(self, distinguished: str) -> str:
        """The mapped name. Raises MappingError when no rule applies."""
        for rule in self.rules:
            result = rule.apply(distinguished)
            if result is not None:
                return result
        raise MappingError(f"no ssl.principal.mapping.rules rule matches the certificate subject {distinguished!r}")
