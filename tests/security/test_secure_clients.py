"""kafka-python, aiokafka, confluent-kafka, kcat and copyless's own client against a secured broker, over
SASL_SSL with SCRAM-SHA-512 and over mTLS: each produces, consumes in a group and calls the admin API,
first denied (the error code the client surfaces is Kafka's), then allowed by ACLs the super user adds.

One broker for the module (``tests/security/conftest.py``): nothing is allowed without an ACL, so every
grant below is what makes the next step pass.
"""

from __future__ import annotations

import pytest

from copyless.client.admin_security import Acl
from tests.support.security import (
    CLIENTS,
    IDEMPOTENT_BY_DEFAULT,
    consume_group,
    create_topic,
    list_topics,
    produce,
    unique,
)

pytestmark = pytest.mark.timeout(300)

TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED = 29, 30, 31
VALUES = [f"value-{i}".encode() for i in range(10)]


def _flow(secure, client: str, listener: str, identity, principal: str) -> None:
    bootstrap = secure.bootstrap(listener)
    topic, group = unique(f"sec-{client}"), unique(f"grp-{client}")
    secure.admin_call("create_topics", [topic], num_partitions=2)
    # Write on some other topic lets idempotent producers through InitProducerId (test_init_producer_id
    # covers that check), so what is refused below is the Metadata and Produce requests themselves.
    secure.grant(Acl("TOPIC", unique("elsewhere"), "LITERAL", principal, "*", "WRITE", "ALLOW"))

    # Nothing granted: the topic is not even visible, and a write is refused.
    assert topic not in list_topics(client, bootstrap, identity)
    assert produce(client, bootstrap, identity, topic, VALUES[:1]) == TOPIC_AUTHORIZATION_FAILED

    # Describe only: the client sees the topic, and the Produce request itself is refused.
    secure.grant(Acl("TOPIC", topic, "LITERAL", principal, "*", "DESCRIBE", "ALLOW"))
    assert topic in list_topics(client, bootstrap, identity)
    assert produce(client, bootstrap, identity, topic, VALUES[:1]) == TOPIC_AUTHORIZATION_FAILED

    secure.grant(Acl("TOPIC", topic, "LITERAL", principal, "*", "WRITE", "ALLOW"),
                 Acl("TOPIC", topic, "LITERAL", principal, "*", "READ", "ALLOW"))
    assert produce(client, bootstrap, identity, topic, VALUES) == 0

    # Reading in a group needs Read on the group as well.
    code, _values = consume_group(client, bootstrap, identity, topic, group, len(VALUES))
    assert code == GROUP_AUTHORIZATION_FAILED
    secure.grant(Acl("GROUP", group, "LITERAL", principal, "*", "READ", "ALLOW"))
    code, values = consume_group(client, bootstrap, identity, topic, group, len(VALUES))
    assert code == 0 and sorted(values) == sorted(VALUES)
    committed = secure.admin_call("describe_group", group)
    assert sum(o.committed_offset or 0 for o in committed.offsets) == len(VALUES)

    # The admin API: CreateTopics needs Create (here on a prefix).
    if client != "kcat":
        created = unique(f"made-{client}")
        assert create_topic(client, bootstrap, identity, created) == TOPIC_AUTHORIZATION_FAILED
        secure.grant(Acl("TOPIC", f"made-{client}-", "PREFIXED", principal, "*", "CREATE", "ALLOW"))
        assert create_topic(client, bootstrap, identity, created) == 0
        assert created in {d.name for d in secure.admin_call("describe_topics", [created])}


@pytest.mark.parametrize("client", CLIENTS)
def test_sasl_ssl_scram_sha_512(secure, client):
    _flow(secure, client, "SASL_SSL", secure.sasl("alice"), "User:alice")


@pytest.mark.parametrize("client", CLIENTS)
def test_mtls_principal_from_the_certificate(secure, client):
    # carol's certificate reads CN=carol,OU=copyless; the mapping rule makes her User:carol.
    _flow(secure, client, "SSL", secure.mtls("carol"), "User:carol")


@pytest.mark.parametrize("client", sorted(IDEMPOTENT_BY_DEFAULT))
def test_init_producer_id_needs_write_somewhere(secure, client):
    """An idempotent producer's InitProducerId needs IdempotentWrite on the cluster or Write on some topic
    (KIP-679): a new user has neither, so the producer fails with CLUSTER_AUTHORIZATION_FAILED, even on a
    topic the user may Describe; with IdempotentWrite it gets a producer id, and the Produce is refused on the
    topic it may not write."""
    topic, user = unique("sec-pid"), unique("pid")
    secure.admin_call("create_topics", [topic])
    secure.admin_call("set_scram_credential", user, "pid-password")
    identity = secure.sasl(user, "pid-password")
    secure.grant(Acl("TOPIC", topic, "LITERAL", f"User:{user}", "*", "DESCRIBE", "ALLOW"))
    assert produce(client, secure.bootstrap("SASL_SSL"), identity, topic, VALUES[:1]) == CLUSTER_AUTHORIZATION_FAILED
    secure.grant(Acl("CLUSTER", "kafka-cluster", "LITERAL", f"User:{user}", "*", "IDEMPOTENT_WRITE", "ALLOW"))
    assert produce(client, secure.bootstrap("SASL_SSL"), identity, topic, VALUES[:1]) == TOPIC_AUTHORIZATION_FAILED


def test_deny_beats_allow_for_every_client(secure):
    topic = unique("sec-deny")
    secure.admin_call("create_topics", [topic])
    secure.grant(Acl("TOPIC", topic, "LITERAL", "User:alice", "*", "ALL", "ALLOW"),
                 Acl("TOPIC", topic, "LITERAL", "User:alice", "*", "WRITE", "DENY"))
    for client in CLIENTS:
        assert produce(client, secure.bootstrap("SASL_SSL"), secure.sasl("alice"), topic, VALUES[:1]) == \
            TOPIC_AUTHORIZATION_FAILED, client


def test_other_mechanisms_and_sasl_plaintext(secure):
    """SCRAM-SHA-256 and PLAIN work where enabled; PLAIN checks the password against the SCRAM credential."""
    topic = unique("sec-mech")
    secure.admin_call("create_topics", [topic])
    secure.grant(Acl("TOPIC", topic, "LITERAL", "User:alice", "*", "WRITE", "ALLOW"))
    for mechanism in ("SCRAM-SHA-256", "PLAIN", "SCRAM-SHA-512"):
        for protocol in ("SASL_SSL", "SASL_PLAINTEXT"):
            identity = secure.sasl("alice", mechanism=mechanism, protocol=protocol)
            assert produce("confluent-kafka", secure.bootstrap(protocol), identity, topic, VALUES[:2]) == 0
            assert produce("kafka-python", secure.bootstrap(protocol), identity, topic, VALUES[:2]) == 0
    wrong = secure.sasl("alice", password="wrong", mechanism="PLAIN")
    assert produce("confluent-kafka", secure.bootstrap("SASL_SSL"), wrong, topic, VALUES[:1]) != 0
