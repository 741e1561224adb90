"""The admin APIs with cluster behaviour, on three broker processes and a real etcd: CreatePartitions placed
by the controller (asked directly by the admin clients, or forwarded by another broker), config changes
written once and seen by every broker, preferred leader election, DescribeCluster.
"""

from __future__ import annotations

import datetime

from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)
from kafka.admin import KafkaAdminClient
from kio.schema.errors import ErrorCode

from tests.support.clients import REQUEST_TIMEOUT_MS, ConfluentDriver, make_records, now_ms
from tests.support.kio_requests import KafkaWire
from tests.support.polling import wait_until
from tests.support.topics import unique_topic

OP_TIMEOUT_S = 30


def admin_for(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": REQUEST_TIMEOUT_MS})


def create_topic(admin: AdminClient, topic: str, partitions: int, factor: int = 3) -> None:
    admin.create_topics([NewTopic(topic, partitions, factor)], operation_timeout=20)[topic].result(OP_TIMEOUT_S)


def non_controller(cluster) -> int:
    controller = cluster.metadata().controller_id
    return next(node for node in cluster.brokers if node != controller)


def test_partitions_added_in_a_cluster_are_placed_and_led(cluster_factory):
    from kio.schema.create_partitions.v1 import request as create_partitions_v1

    cluster = cluster_factory(3)
    topic = unique_topic("grow")
    admin = admin_for(cluster.bootstrap)
    create_topic(admin, topic, 3)
    cluster.wait_for_isr(topic, 3, 3)
    admin.create_partitions([NewPartitions(topic, 6)])[topic].result(timeout=OP_TIMEOUT_S)
    # Forwarded: a broker that is not the controller passes the request on.
    wire = KafkaWire(cluster.brokers[non_controller(cluster)].port)
    try:
        response = wire.request(create_partitions_v1.CreatePartitionsRequest(
            topics=(create_partitions_v1.CreatePartitionsTopic(name=topic, count=7, assignments=None),),
            timeout=datetime.timedelta(seconds=30), validate_only=False))
    finally:
        wire.close()
    assert [(r.name, r.error_code) for r in response.results] == [(topic, ErrorCode.none)]
    client = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)
    try:
        client.create_partitions({topic: 8})
    finally:
        client.close()

    view = cluster.wait_for_leaders(topic, 8)
    for index, partition in view.items():
        assert sorted(partition.replicas) == [1, 2, 3], (index, partition)
    # Kafka's placement rotates the first replica over the brokers: the new partitions' leaders too.
    assert {view[index].replicas[0] for index in range(3, 6)} == {1, 2, 3}
    # Every broker sees the same eight partitions, and a new one takes acks=all writes.
    for node in cluster.brokers:
        assert len(cluster.metadata([topic], via=node).topics[topic]) == 8
    records = make_records(3, base_ts_ms=now_ms(), tag="p7")
    offsets = ConfluentDriver().produce(cluster.bootstrap, topic, records, acks="all", codec="none", partition=7)
    assert offsets == [0, 1, 2]


def test_config_changes_reach_every_broker(cluster_factory):
    from kio.schema.incremental_alter_configs.v0 import request as alter_v0

    cluster = cluster_factory(3)
    topic = unique_topic("conf")
    admin = admin_for(cluster.bootstrap)
    create_topic(admin, topic, 1)
    entry = ConfigEntry("retention.ms", "120000", incremental_operation=AlterConfigOpType.SET)
    [future] = admin.incremental_alter_configs([ConfigResource(ResourceType.TOPIC, topic,
                                                               incremental_configs=[entry])]).values()
    future.result(timeout=OP_TIMEOUT_S)
    # Every broker's dynamic defaults, set through broker 2 (the resource "" no client API names).
    wire = KafkaWire(cluster.brokers[2].port)
    try:
        response = wire.request(alter_v0.IncrementalAlterConfigsRequest(validate_only=False, resources=(
            alter_v0.AlterConfigsResource(resource_type=4, resource_name="", configs=(
                alter_v0.AlterableConfig(name="log.retention.bytes", config_operation=0, value="900000000"),)),)))
    finally:
        wire.close()
    assert response.responses[0].error_code == ErrorCode.none

    def described(node: int, resource: ConfigResource) -> dict:
        one = admin_for(cluster.brokers[node].bootstrap)
        [result] = one.describe_configs([resource]).values()
        return result.result(timeout=OP_TIMEOUT_S)

    for node in cluster.brokers:
        def settled(node=node):
            configs = described(node, ConfigResource(ResourceType.TOPIC, topic))
            return configs["retention.ms"].value == "120000" and configs["retention.bytes"].value == "900000000"
        wait_until(settled, what=f"broker {node} to see the new configs", timeout_s=15)
        mine = described(node, ConfigResource(ResourceType.BROKER, str(node)))["log.retention.bytes"]
        assert (mine.value, mine.source) == ("900000000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)


def test_preferred_leader_election_moves_leadership_back(cluster_factory):
    from kio.schema.elect_leaders.v0 import request as elect_v0

    cluster = cluster_factory(3, config={"auto.leader.rebalance.enable": False})
    topic = unique_topic("elect")
    admin = admin_for(cluster.bootstrap)
    create_topic(admin, topic, 2)
    view = cluster.wait_for_isr(topic, 2, 3)
    preferred = {index: partition.replicas[0] for index, partition in view.items()}
    assert {index: partition.leader for index, partition in view.items()} == preferred
    # Partition 0's preferred leader goes away and comes back: it returns as a follower.
    away = preferred[0]
    cluster.brokers[away].stop()
    cluster.wait_for_leaders(topic, 2, excluding={away})
    cluster.brokers[away].start(cluster.brokers[away].port)
    view = cluster.wait_for_isr(topic, 2, 3)
    assert view[0].leader != away

    outcome = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)]).result(timeout=OP_TIMEOUT_S)
    assert {tp.partition: error for tp, error in outcome.items()} == {0: None}
    wait_until(lambda: cluster.leader_of(topic, 0) == away, what="the preferred replica leading again", timeout_s=15)
    # Already led by its preferred replica: not needed; asked through a broker that is not the controller.
    wire = KafkaWire(cluster.brokers[non_controller(cluster)].port)
    try:
        response = wire.request(elect_v0.ElectLeadersRequest(
            topic_partitions=(elect_v0.TopicPartitions(topic=topic, partitions=(0, 1)),),
            timeout=datetime.timedelta(seconds=30)))
    finally:
        wire.close()
    results = {(r.topic, p.partition_id): p.error_code for r in response.replica_election_results
               for p in r.partition_result}
    assert results == {(topic, 0): ErrorCode.election_not_needed, (topic, 1): ErrorCode.election_not_needed}


def test_describe_cluster_lists_every_broker_and_the_controller(cluster_factory):
    cluster = cluster_factory(3)
    admin = admin_for(cluster.bootstrap)
    described = admin.describe_cluster().result(timeout=OP_TIMEOUT_S)
    assert described.controller.id == cluster.metadata().controller_id
    assert sorted((node.id, node.port) for node in described.nodes) == sorted(
        (node, broker.port) for node, broker in cluster.brokers.items())


def test_deleted_records_stay_deleted_on_the_next_leader(cluster_factory):
    from confluent_kafka import Consumer, Producer

    cluster = cluster_factory(3)
    topic = unique_topic("delete-records")
    admin = admin_for(cluster.bootstrap)
    create_topic(admin, topic, 1)
    cluster.wait_for_isr(topic, 1, 3)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for number in range(50):
        producer.produce(topic, b"r%d" % number, partition=0)
    assert producer.flush(30) == 0
    done = admin.delete_records([TopicPartition(topic, 0, 30)])
    assert done[TopicPartition(topic, 0, 30)].result(OP_TIMEOUT_S).low_watermark == 30
    leader = cluster.leader_of(topic)
    # The followers learn the new log start from their next fetches; the leader then goes away.
    def checkpointed(broker) -> bool:
        path = broker.data_dir / "log-start-offset-checkpoint"
        return path.exists() and f"{topic} 0 30" in path.read_text().splitlines()

    wait_until(lambda: all(checkpointed(broker) for node, broker in cluster.brokers.items() if node != leader),
               what="every follower's log start checkpoint at 30", timeout_s=20)
    cluster.brokers[leader].kill()
    cluster.wait_for_leaders(topic, 1, excluding={leader})
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "low-watermark"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=OP_TIMEOUT_S)
    finally:
        consumer.close()
    assert (low, high) == (30, 50)
