"""ListOffsets with the max-timestamp query (-3, KIP-734), through confluent-kafka's AdminClient
(``OffsetSpec.max_timestamp()``, ListOffsets v7) and through kio.

Kafka 3.9's answer: the first record that carries the partition's largest timestamp, with that timestamp;
an empty partition has none (offset -1). The query exists from v7: an older version naming -3 gets
INVALID_REQUEST, as before.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from kio.schema.errors import ErrorCode
from kio.schema.list_offsets.v7 import request as list_offsets_v7

from tests.support.clients import now_ms
from tests.support.kio_requests import KafkaWire, list_offsets
from tests.support.topics import unique_topic

pytestmark = pytest.mark.timeout(120)


def _produce(bootstrap: str, topic: str, partition: int, timestamps: list[int]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for number, timestamp in enumerate(timestamps):
        producer.produce(topic, value=b"v%d" % number, partition=partition, timestamp=timestamp)
        producer.flush(30)  # one batch per record: the answer is a record, not a batch
    assert producer.flush(30) == 0


def test_max_timestamp_through_confluent_admin(broker):
    topic = unique_topic("maxts")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    base = now_ms() - 60_000
    # The largest timestamp twice (offsets 1 and 3): the first of them is the answer.
    _produce(broker.bootstrap, topic, 0, [base, base + 50, base + 10, base + 50, base + 5])
    wanted = {TopicPartition(topic, partition): OffsetSpec.max_timestamp() for partition in (0, 1)}
    results = {tp.partition: future.result(30) for tp, future in admin.list_offsets(wanted).items()}
    assert (results[0].offset, results[0].timestamp) == (1, base + 50)
    assert results[1].offset == -1  # empty partition
    latest = admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.latest()})
    assert next(iter(latest.values())).result(30).offset == 5


def test_max_timestamp_needs_version_7(broker):
    topic = unique_topic("maxts-raw")
    _produce(broker.bootstrap, topic, 0, [1_000, 3_000, 2_000])
    wire = KafkaWire(broker.port)
    try:
        assert list_offsets(wire, topic, -3).error_code == ErrorCode.invalid_request  # v5
        response = wire.request(list_offsets_v7.ListOffsetsRequest(
            replica_id=-1, isolation_level=0, topics=(list_offsets_v7.ListOffsetsTopic(name=topic, partitions=(
                list_offsets_v7.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=-3),)),)))
        found = response.topics[0].partitions[0]
        assert (found.error_code, found.offset, found.timestamp) == (ErrorCode.none, 1, 3_000)
    finally:
        wire.close()
