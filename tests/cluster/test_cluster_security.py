"""A secured cluster on etcd: every broker listens SASL_SSL for clients and SASL_SSL + SCRAM-SHA-512 between
brokers (replication and forwarding authenticate as ``User:broker``, a super user); credentials and ACLs
live in etcd and reach every broker through its watch.

- replication and acks=all work across the SASL_SSL inter-broker listener;
- an ACL created through one broker and a credential set through another are in force on the third;
- a follower cannot be claimed: a client authenticated as a user without ClusterAction that sends a
  Fetch with a ``replica_id`` is answered TOPIC_AUTHORIZATION_FAILED and moves no follower state;
- a broker without valid broker credentials (a wrong inter-broker password) cannot fetch: it never joins
  the ISR of a partition it is assigned, and its log stays empty, while the leader keeps acknowledging.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from copyless.client.admin_security import Acl
from tests.support.broker_process import BrokerProcess
from tests.support.polling import wait_until
from tests.support.security import Identity, listener_ports, make_certs, produce, unique

pytestmark = pytest.mark.timeout(400)

BROKER_PASSWORD, ADMIN_PASSWORD = "broker-pw-Kq2", "admin-pw-Xe5"
LISTENERS = ("--listener", "PLAINTEXT=127.0.0.1:0", "--listener", "SASL_SSL=127.0.0.1:0",
             "--listener", "INTERNAL=127.0.0.1:0", "--inter-broker-listener", "INTERNAL")


def _jaas(user: str, password: str) -> str:
    return f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" password="{password}";'


def secure_cluster_config(certs, broker_password: str = BROKER_PASSWORD) -> dict:
    return {
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,INTERNAL:SASL_SSL",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
        "listener.name.internal.scram-sha-512.sasl.jaas.config": _jaas("broker", broker_password),
        "ssl.keystore.location": str(certs / "broker.pem"),
        "ssl.truststore.location": str(certs / "ca.pem"),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:broker;User:admin",
    }


BOOTSTRAP_USERS = ("--add-scram", f"SCRAM-SHA-512=[name=broker,password={BROKER_PASSWORD}]",
                   "--add-scram", f"SCRAM-SHA-512=[name=admin,password={ADMIN_PASSWORD}]")


@pytest.fixture
def certs(tmp_path):
    return make_certs(tmp_path / "certs", "broker:localhost,IP:127.0.0.1")


def _identity(certs, user: str, password: str) -> Identity:
    return Identity("SASL_SSL", ca=certs / "ca.pem", username=user, password=password)


def _admin(address: str, identity: Identity, method: str, *args, **kwargs):
    from copyless import Admin

    async def go():
        async with Admin(address, **identity.copyless()) as admin:
            return await getattr(admin, method)(*args, **kwargs)

    return asyncio.run(go())


def _sasl_address(broker: BrokerProcess) -> str:
    return f"127.0.0.1:{listener_ports(broker)['SASL_SSL']}"


def _start(cluster_factory, certs):
    """The cluster, with Describe on every topic for the harness's own Metadata reads (``Cluster.metadata``
    asks the PLAINTEXT listener, as ``User:ANONYMOUS``)."""
    cluster = cluster_factory(3, config=secure_cluster_config(certs), extra_args=(*LISTENERS, *BOOTSTRAP_USERS))
    _admin(_sasl_address(cluster.brokers[1]), _identity(certs, "admin", ADMIN_PASSWORD), "create_acls",
           [Acl("TOPIC", "*", "LITERAL", "User:ANONYMOUS", "*", "DESCRIBE", "ALLOW")])
    return cluster


def test_secure_cluster_replicates_and_shares_credentials_and_acls(cluster_factory, certs):
    cluster = _start(cluster_factory, certs)
    admin = _identity(certs, "admin", ADMIN_PASSWORD)
    b1, b2, b3 = (_sasl_address(cluster.brokers[n]) for n in (1, 2, 3))
    topic = unique("secure-rf3")
    _admin(b2, admin, "create_topics", [topic], num_partitions=3, replication_factor=3)  # forwarded if not controller
    cluster.wait_for_isr(topic, 3, 3)

    # A user set through broker 2, an ACL created through broker 1: both in force on broker 3.
    _admin(b2, admin, "set_scram_credential", "alice", "alice-pw")
    _admin(b1, admin, "create_acls", [Acl("TOPIC", topic, "LITERAL", "User:alice", "*", "WRITE", "ALLOW"),
                                      Acl("TOPIC", topic, "LITERAL", "User:alice", "*", "READ", "ALLOW")])
    alice = _identity(certs, "alice", "alice-pw")
    wait_until(lambda: produce("confluent-kafka", b3, alice, topic, [b"one"]) == 0,
               what="alice's credential and ACL to reach broker 3", timeout_s=30, interval_s=0.5)
    # acks=all over the SASL_SSL inter-broker listener: every replica has the records.
    assert produce("kafka-python", b3, alice, topic, [f"v{i}".encode() for i in range(50)]) == 0
    isr = cluster.wait_for_isr(topic, 3, 3)
    assert all(len(view.isr) == 3 for view in isr.values())
    users = _admin(b3, admin, "describe_scram_credentials")
    assert set(users) >= {"admin", "broker", "alice"}
    # Deleting the ACL through broker 3 takes Write away on broker 1.
    _admin(b3, admin, "delete_acls", [Acl("TOPIC", topic, "LITERAL", "User:alice", "*", "WRITE", "ALLOW")])
    wait_until(lambda: produce("confluent-kafka", b1, alice, topic, [b"late"]) == 29,
               what="the deleted ACL to reach broker 1", timeout_s=30, interval_s=0.5)


def test_a_follower_needs_broker_credentials(cluster_factory, certs, tmp_path):
    cluster = _start(cluster_factory, certs)
    admin = _identity(certs, "admin", ADMIN_PASSWORD)
    b1 = _sasl_address(cluster.brokers[1])
    _admin(b1, admin, "set_scram_credential", "mallory", "mallory-pw")

    # 1. A user claiming to be follower 2 of a partition led by broker 1 is refused.
    topic = unique("claimed")
    _admin(b1, admin, "create_topics", [topic], num_partitions=1, replication_factor=3)
    cluster.wait_for_isr(topic, 1, 3)
    leader = cluster.leader_of(topic)
    leader_address = _sasl_address(cluster.brokers[leader])
    follower = next(n for n in (1, 2, 3) if n != leader)
    assert _fake_follower_fetch(leader_address, _identity(certs, "mallory", "mallory-pw"), topic, follower) == {29}

    # 2. A fourth broker whose inter-broker password is wrong cannot replicate what it is assigned.
    rogue = BrokerProcess(data_dir=tmp_path / "rogue" / "data", log_path=tmp_path / "rogue" / "broker.log",
                          config={**cluster.config, **secure_cluster_config(certs, broker_password="wrong-pw")},
                          extra_args=("--node-id", "4", "--metadata", cluster.url, *LISTENERS))
    rogue.start()
    try:
        wait_until(lambda: 4 in cluster.metadata().brokers, what="broker 4 registered", timeout_s=30)
        assigned = unique("assigned")
        _create_assigned(b1, admin, assigned, [1, 4])
        _alice_writes(b1, admin, certs, assigned)
        # A new partition's ISR is its replicas; broker 4 never fetches, so the leader drops it after
        # replica.lag.time.max.ms (4 s here) and it never comes back.
        wait_until(lambda: cluster.metadata([assigned]).topics[assigned][0].isr == (1,),
                   what="broker 4 out of the ISR", timeout_s=30)
        time.sleep(2)
        view = cluster.metadata([assigned]).topics[assigned][0]
        assert view.leader == 1 and view.isr == (1,), view
        rogue_log = rogue.log_text()
        assert "SASL_AUTHENTICATION_FAILED" in rogue_log
        # Its log of the partition holds no batch (segments are preallocated: empty means zeros, not size 0).
        segments = list((tmp_path / "rogue" / "data" / f"{assigned}-0").glob("*.log"))
        assert segments and all(f.read_bytes()[:64] == bytes(64) for f in segments)
        assert "wrong-pw" not in rogue_log and "wrong-pw" not in cluster.log_texts()
    finally:
        rogue.stop()


def _create_assigned(address: str, admin: Identity, topic: str, replicas: list[int]) -> None:
    import datetime

    from kio.schema.create_topics.v4.request import CreatableReplicaAssignment, CreatableTopic, CreateTopicsRequest
    from kio.schema.create_topics.v4.response import CreateTopicsResponse
    from kio.schema.types import BrokerId, TopicName

    from copyless.client.conn import Connection
    from copyless.client.security import ClientSecurity

    async def go():
        host, port = address.rsplit(":", 1)
        security = ClientSecurity.create(**admin.copyless())
        connection = await Connection.open(host, int(port), security=security)
        try:
            request = CreateTopicsRequest(topics=(CreatableTopic(
                name=TopicName(topic), num_partitions=-1, replication_factor=-1,
                assignments=(CreatableReplicaAssignment(partition_index=0,
                                                        broker_ids=tuple(BrokerId(b) for b in replicas)),),
                configs=()),), timeout=datetime.timedelta(seconds=30), validate_only=False)
            response = await connection.request_kio(request, CreateTopicsResponse)
            assert response.topics[0].error_code == 0, response
        finally:
            connection.close()

    asyncio.run(go())


def _alice_writes(address: str, admin: Identity, certs, topic: str) -> None:
    _admin(address, admin, "set_scram_credential", "writer", "writer-pw")
    _admin(address, admin, "create_acls", [Acl("TOPIC", topic, "LITERAL", "User:writer", "*", "WRITE", "ALLOW")])
    writer = _identity(certs, "writer", "writer-pw")
    # acks=1: the leader acknowledges alone while broker 4 is out of the ISR.
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": address, "acks": "1", **writer.librdkafka()})
    errors = []
    for i in range(20):
        producer.produce(topic, f"w{i}".encode(), on_delivery=lambda err, _m: errors.append(err))
    producer.flush(30)
    assert len(errors) == 20 and not [e for e in errors if e is not None], errors


def _fake_follower_fetch(address: str, identity: Identity, topic: str, replica_id: int) -> set[int]:
    """Fetch v11 as ``replica_id`` over an authenticated connection: the partitions' error codes."""
    import datetime

    from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic
    from kio.schema.types import BrokerId, TopicName

    from copyless.client.conn import Connection
    from copyless.client.security import ClientSecurity
    from copyless.protocol.messages import decode_fetch_response, encode_kio

    async def go():
        host, port = address.rsplit(":", 1)
        connection = await Connection.open(host, int(port), security=ClientSecurity.create(**identity.copyless()))
        try:
            request = FetchRequest(replica_id=BrokerId(replica_id), max_wait=datetime.timedelta(milliseconds=100),
                                   min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                                   topics=(FetchTopic(topic=TopicName(topic), partitions=(FetchPartition(
                                       partition=0, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
                                       partition_max_bytes=1 << 20),)),),
                                   forgotten_topics_data=(), rack_id="")
            frame = await connection.request(1, [encode_kio(request)], lambda data, offset: bytes(data[offset:]),
                                             version=11)
            _error, partitions = decode_fetch_response(memoryview(frame), 0)
            return {p.error_code for p in partitions}
        finally:
            connection.close()

    return asyncio.run(go())
