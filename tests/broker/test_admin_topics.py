"""The admin APIs on topics and the cluster, against a real broker process with the admin clients of
confluent-kafka (librdkafka) and kafka-python: CreatePartitions, DeleteRecords, DescribeCluster,
ElectLeaders, and ApiVersions advertising each of them.
"""

from __future__ import annotations

import pytest
from kafka.admin import KafkaAdminClient
from kio.schema.errors import ErrorCode

from tests.support.clients import REQUEST_TIMEOUT_MS, ConfluentDriver, KafkaPythonDriver, make_records, now_ms
from tests.support.topics import unique_topic

OP_TIMEOUT_S = 30


def confluent_admin(bootstrap):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": REQUEST_TIMEOUT_MS})


def kafka_python_admin(bootstrap) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)


def kafka_error_code(exc: BaseException) -> int:
    """The Kafka error code a confluent-kafka future failed with."""
    return exc.args[0].code()


def test_api_versions_advertise_the_admin_apis(broker):
    admin = kafka_python_admin(broker.bootstrap)
    try:
        versions = admin.api_versions()
    finally:
        admin.close()
    served = {int(key): value for key, value in versions.items()}
    # CreatePartitions, DeleteRecords, AlterConfigs, IncrementalAlterConfigs, DeleteGroups, OffsetDelete,
    # ElectLeaders, DescribeCluster, DescribeConfigs.
    for api_key in (37, 21, 33, 44, 42, 47, 43, 60, 32):
        assert api_key in served, (api_key, sorted(served))


def test_create_partitions_with_confluent_kafka(broker):
    from confluent_kafka.admin import NewPartitions

    topic = unique_topic("grow")
    driver = ConfluentDriver()
    driver.create_topic(broker.bootstrap, topic, 2)
    admin = confluent_admin(broker.bootstrap)
    admin.create_partitions([NewPartitions(topic, 5)], validate_only=True)[topic].result(timeout=OP_TIMEOUT_S)
    assert driver.topic_partitions(broker.bootstrap, topic) == 2
    admin.create_partitions([NewPartitions(topic, 5)])[topic].result(timeout=OP_TIMEOUT_S)
    assert driver.topic_partitions(broker.bootstrap, topic) == 5
    # A new partition takes records like the old ones.
    records = make_records(3, base_ts_ms=now_ms(), tag="new")
    assert driver.produce(broker.bootstrap, topic, records, acks="all", codec="none", partition=4) == [0, 1, 2]
    assert [c.offset for c in driver.consume(broker.bootstrap, topic, 4, 0, 3)] == [0, 1, 2]

    for count, expected in ((3, ErrorCode.invalid_partitions), (5, ErrorCode.invalid_partitions)):
        future = admin.create_partitions([NewPartitions(topic, count)])[topic]
        with pytest.raises(Exception) as failure:
            future.result(timeout=OP_TIMEOUT_S)
        assert kafka_error_code(failure.value) == expected
    missing = unique_topic("missing")
    with pytest.raises(Exception) as failure:
        admin.create_partitions([NewPartitions(missing, 3)])[missing].result(timeout=OP_TIMEOUT_S)
    assert kafka_error_code(failure.value) == ErrorCode.unknown_topic_or_partition
    # A replica on a broker that does not exist.
    with pytest.raises(Exception) as failure:
        admin.create_partitions([NewPartitions(topic, 6, [[7]])])[topic].result(timeout=OP_TIMEOUT_S)
    assert kafka_error_code(failure.value) == ErrorCode.invalid_replica_assignment
    assert driver.topic_partitions(broker.bootstrap, topic) == 5


def test_create_partitions_with_kafka_python(broker):
    import kafka.errors as Errors

    topic = unique_topic("grow")
    driver = KafkaPythonDriver()
    driver.create_topic(broker.bootstrap, topic, 1)
    admin = kafka_python_admin(broker.bootstrap)
    try:
        admin.create_partitions({topic: {"count": 3, "assignments": [[0], [0]]}})
        assert driver.topic_partitions(broker.bootstrap, topic) == 3
        with pytest.raises(Errors.InvalidPartitionsError):
            admin.create_partitions({topic: 2})
        with pytest.raises(Errors.InvalidTopicError):
            admin.create_partitions({"__consumer_offsets": 10})
    finally:
        admin.close()
    records = make_records(2, base_ts_ms=now_ms(), tag="kp")
    assert driver.produce(broker.bootstrap, topic, records, acks=1, codec="none", partition=2) == [0, 1]


def test_partitions_added_survive_a_restart(broker_factory):
    from confluent_kafka.admin import NewPartitions

    proc = broker_factory()
    topic = unique_topic("grow")
    ConfluentDriver().create_topic(proc.bootstrap, topic, 1)
    admin = confluent_admin(proc.bootstrap)  # the handle must outlive its futures
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(timeout=OP_TIMEOUT_S)
    proc.restart("kill")
    assert ConfluentDriver().topic_partitions(proc.bootstrap, topic) == 4
    assert (proc.data_dir / f"{topic}-3").is_dir()


def test_delete_records_with_confluent_kafka(broker):
    from confluent_kafka import TopicPartition

    topic = unique_topic("trim")
    driver = ConfluentDriver()
    driver.create_topic(broker.bootstrap, topic, 1)
    driver.produce(broker.bootstrap, topic, make_records(10, base_ts_ms=now_ms(), tag="d"), acks="all", codec="none")
    admin = confluent_admin(broker.bootstrap)
    futures = admin.delete_records([TopicPartition(topic, 0, 4)])
    [(_tp, future)] = futures.items()
    assert future.result(timeout=OP_TIMEOUT_S).low_watermark == 4
    assert driver.watermarks(broker.bootstrap, topic, 0) == (4, 10)
    assert [c.offset for c in driver.consume(broker.bootstrap, topic, 0, 4, 6)] == list(range(4, 10))
    # Past the high watermark: OFFSET_OUT_OF_RANGE, nothing deleted.
    [(_tp, future)] = admin.delete_records([TopicPartition(topic, 0, 11)]).items()
    with pytest.raises(Exception) as failure:
        future.result(timeout=OP_TIMEOUT_S)
    assert kafka_error_code(failure.value) == ErrorCode.offset_out_of_range
    assert driver.watermarks(broker.bootstrap, topic, 0) == (4, 10)


def test_delete_records_with_kafka_python(broker):
    from kafka import TopicPartition

    topic = unique_topic("trim")
    driver = KafkaPythonDriver()
    driver.create_topic(broker.bootstrap, topic, 1)
    driver.produce(broker.bootstrap, topic, make_records(6, base_ts_ms=now_ms(), tag="d"), acks=1, codec="none")
    admin = kafka_python_admin(broker.bootstrap)
    try:
        # -1: up to the high watermark.
        result = admin.delete_records({TopicPartition(topic, 0): -1})
    finally:
        admin.close()
    assert result[TopicPartition(topic, 0)]["low_watermark"] == 6
    assert driver.watermarks(broker.bootstrap, topic, 0) == (6, 6)


def test_describe_cluster_with_both_clients(broker):
    admin = confluent_admin(broker.bootstrap)
    described = admin.describe_cluster().result(timeout=OP_TIMEOUT_S)
    assert described.controller.id == 0
    assert [(node.id, node.host, node.port) for node in described.nodes] == [(0, broker.host, broker.port)]
    assert described.cluster_id
    client = kafka_python_admin(broker.bootstrap)
    try:
        cluster = client.describe_cluster()
    finally:
        client.close()
    assert cluster["cluster_id"] == described.cluster_id
    assert cluster["controller_id"] == 0
    assert [(b["broker_id"], b["host"], b["port"]) for b in cluster["brokers"]] == [(0, broker.host, broker.port)]


def test_elect_leaders_on_a_single_node_is_never_needed(broker):
    from confluent_kafka import ElectionType, TopicPartition

    topic = unique_topic("elect")
    ConfluentDriver().create_topic(broker.bootstrap, topic, 2)
    admin = confluent_admin(broker.bootstrap)
    outcome = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0), TopicPartition(topic, 1),
                                                           TopicPartition(topic, 9)]).result(timeout=OP_TIMEOUT_S)
    codes = {tp.partition: (error.code() if error is not None else 0) for tp, error in outcome.items()}
    assert codes == {0: ErrorCode.election_not_needed, 1: ErrorCode.election_not_needed,
                     9: ErrorCode.unknown_topic_or_partition}
    client = kafka_python_admin(broker.bootstrap)
    try:
        response = client.elect_leaders(0, {topic: [0, 1]}, raise_errors=False)
    finally:
        client.close()
    results = {(r.topic, p.partition_id): p.error_code for r in response.replica_election_results
               for p in r.partition_result}
    assert results == {(topic, 0): ErrorCode.election_not_needed, (topic, 1): ErrorCode.election_not_needed}
