"""DeleteGroups and OffsetDelete against a real broker process: confluent-kafka's and kafka-python's admin
clients delete groups (an Empty one goes with its offsets; one with members is NON_EMPTY_GROUP; an unknown one
GROUP_ID_NOT_FOUND); kafka-python deletes single offsets (confluent-kafka's Python admin has no OffsetDelete
call), refused for topics a live member subscribes to. Deletions survive a restart: they are tombstones in
``__consumer_offsets``.
"""

from __future__ import annotations

import kafka.errors as Errors
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.structs import OffsetAndMetadata
from kio.schema.errors import ErrorCode

from tests.support.clients import REQUEST_TIMEOUT_MS, ConfluentDriver
from tests.support.polling import wait_until
from tests.support.topics import unique_topic

OP_TIMEOUT_S = 30


def kafka_python_admin(bootstrap) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)


def commit(admin: KafkaAdminClient, group: str, offsets: dict) -> None:
    """Committed offsets for a group without members (kafka-python's alter_group_offsets)."""
    result = admin.alter_group_offsets(group, {tp: OffsetAndMetadata(offset, "", -1) for tp, offset in offsets.items()})
    assert all(error is Errors.NoError for error in result.values()), result


def committed(admin: KafkaAdminClient, group: str) -> dict:
    return {tp: meta.offset for tp, meta in admin.list_group_offsets({group: None})[group].items()}


def member_of(bootstrap: str, group: str, topic: str) -> KafkaConsumer:
    """A live member subscribed to ``topic`` (polled until it has its assignment)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, request_timeout_ms=REQUEST_TIMEOUT_MS,
                             enable_auto_commit=False, session_timeout_ms=10000, heartbeat_interval_ms=1000)
    # Subscribed at construction, kafka-python 3.0.12 joins before its first metadata refresh: the leader assigns
    # nothing, rejoins once the metadata arrives, and a poll whose timeout expires during that second join never
    # applies its result (the member then waits metadata.max.age.ms, 5 min). Knowing the topic first: one join.
    wait_until(lambda: consumer.partitions_for_topic(topic), what=f"the consumer's metadata for {topic}", timeout_s=10)
    consumer.subscribe([topic])

    def assigned():
        consumer.poll(timeout_ms=200)
        return consumer.assignment()
    wait_until(assigned, what=f"a member of {group} with an assignment", timeout_s=OP_TIMEOUT_S)
    return consumer


def test_delete_groups_with_confluent_kafka(broker):
    topic = unique_topic("g")
    ConfluentDriver().create_topic(broker.bootstrap, topic, 2)
    empty, busy, unknown = unique_topic("empty"), unique_topic("busy"), unique_topic("unknown")
    admin = kafka_python_admin(broker.bootstrap)
    consumer = None
    try:
        commit(admin, empty, {TopicPartition(topic, 0): 5, TopicPartition(topic, 1): 7})
        assert committed(admin, empty) == {TopicPartition(topic, 0): 5, TopicPartition(topic, 1): 7}
        consumer = member_of(broker.bootstrap, busy, topic)
        from confluent_kafka.admin import AdminClient

        confluent = AdminClient({"bootstrap.servers": broker.bootstrap, "socket.timeout.ms": REQUEST_TIMEOUT_MS})
        futures = confluent.delete_consumer_groups([empty, busy, unknown], request_timeout=OP_TIMEOUT_S)
        futures[empty].result(timeout=OP_TIMEOUT_S)
        codes = {}
        for group in (busy, unknown):
            with pytest.raises(Exception) as failure:
                futures[group].result(timeout=OP_TIMEOUT_S)
            codes[group] = failure.value.args[0].code()
        assert codes == {busy: ErrorCode.non_empty_group, unknown: ErrorCode.group_id_not_found}
        assert committed(admin, empty) == {}
        assert empty not in [group.group_id for group in
                             confluent.list_consumer_groups().result(timeout=OP_TIMEOUT_S).valid]
    finally:
        if consumer is not None:
            consumer.close()
        admin.close()


def test_delete_groups_with_kafka_python_survives_a_restart(broker_factory):
    proc = broker_factory()
    topic = unique_topic("g")
    ConfluentDriver().create_topic(proc.bootstrap, topic, 1)
    gone, kept = unique_topic("gone"), unique_topic("kept")
    admin = kafka_python_admin(proc.bootstrap)
    try:
        commit(admin, gone, {TopicPartition(topic, 0): 3})
        commit(admin, kept, {TopicPartition(topic, 0): 4})
        never = unique_topic("never")
        assert admin.delete_groups([gone, never]) == {gone: "OK", never: "GroupIdNotFoundError"}
    finally:
        admin.close()
    proc.restart("kill")
    admin = kafka_python_admin(proc.bootstrap)
    try:
        assert committed(admin, gone) == {}
        assert committed(admin, kept) == {TopicPartition(topic, 0): 4}
    finally:
        admin.close()


def test_offset_delete_with_kafka_python(broker):
    subscribed, other = unique_topic("sub"), unique_topic("other")
    driver = ConfluentDriver()
    driver.create_topic(broker.bootstrap, subscribed, 1)
    driver.create_topic(broker.bootstrap, other, 2)
    group, idle = unique_topic("grp"), unique_topic("idle")
    admin = kafka_python_admin(broker.bootstrap)
    consumer = None
    try:
        # An Empty group: any of its offsets may go.
        commit(admin, idle, {TopicPartition(other, 0): 1, TopicPartition(other, 1): 2})
        result = admin.delete_group_offsets(idle, [TopicPartition(other, 0)])
        assert result == {TopicPartition(other, 0): Errors.NoError}
        assert committed(admin, idle) == {TopicPartition(other, 1): 2}

        # A group with a member subscribed to one topic: that topic's offsets stay.
        consumer = member_of(broker.bootstrap, group, subscribed)
        consumer.commit({TopicPartition(subscribed, 0): OffsetAndMetadata(1, "", -1),
                         TopicPartition(other, 1): OffsetAndMetadata(9, "", -1)})
        result = admin.delete_group_offsets(group, [TopicPartition(subscribed, 0), TopicPartition(other, 1)])
        assert result == {TopicPartition(subscribed, 0): Errors.GroupSubscribedToTopicError,
                          TopicPartition(other, 1): Errors.NoError}
        assert committed(admin, group) == {TopicPartition(subscribed, 0): 1}
        with pytest.raises(Errors.GroupIdNotFoundError):
            admin.delete_group_offsets(unique_topic("nobody"), [TopicPartition(other, 0)])
    finally:
        if consumer is not None:
            consumer.close()
        admin.close()
