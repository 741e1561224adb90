"""mTLS principals: the RFC 2253 name of a subject, and ssl.principal.mapping.rules as Kafka documents them."""

from __future__ import annotations

import pytest

from copyless.broker.security.principal import MappingError, PrincipalMapper, distinguished_name

SUBJECT = ((("countryName", "US"),), (("stateOrProvinceName", "CA"),), (("localityName", "Palo Alto"),),
           (("organizationName", "Example, Inc."),), (("organizationalUnitName", "ServiceUsers"),),
           (("commonName", "kafka-client"),))


def test_rfc2253_order_and_escaping():
    assert distinguished_name(SUBJECT) == ("CN=kafka-client,OU=ServiceUsers,O=Example\\, Inc.,L=Palo Alto,ST=CA,C=US")
    assert distinguished_name(((("commonName", "#lead"),),)) == "CN=\\#lead"
    assert distinguished_name(((("commonName", "a"), ("userId", "b")),)) == "CN=a+UID=b"


def test_email_address_is_written_as_java_does():
    # Java's X500Principal.getName() has no keyword for emailAddress: OID=#<DER IA5String>.
    name = distinguished_name(((("commonName", "x"),), (("emailAddress", "a@b.c"),)))
    assert name == "1.2.840.113549.1.9.1=#1605" + b"a@b.c".hex() + ",CN=x"


def test_kafka_documented_rules():
    rules = ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,"
             "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,"
             "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L,"
             "DEFAULT")
    mapper = PrincipalMapper(rules)
    assert mapper.principal_name("CN=kafka-client,OU=ServiceUsers,O=Example,L=x,ST=y,C=US") == "kafka-client"
    assert mapper.principal_name("CN=Duke,OU=JavaSoft,O=Sun,L=Santa Clara,ST=CA,C=US") == "duke@javasoft"
    assert mapper.principal_name("OU=x,CN=Admin.User") == "admin.user"
    assert mapper.principal_name("O=only") == "O=only"  # DEFAULT


def test_no_rule_matching_fails_and_bad_rules_are_refused():
    mapper = PrincipalMapper("RULE:^CN=(.*)$/$1/U")
    assert mapper.principal_name("CN=ab") == "AB"
    with pytest.raises(MappingError):
        mapper.principal_name("OU=x")
    with pytest.raises(MappingError):
        PrincipalMapper("RULE:^CN=(.*$/$1/")
    with pytest.raises(MappingError):
        PrincipalMapper("NONSENSE")
    assert PrincipalMapper("RULE:^CN=(.*)\\/x$/$1/").principal_name("CN=a/x") == "a"
    assert PrincipalMapper("").principal_name("CN=a") == "CN=a"
