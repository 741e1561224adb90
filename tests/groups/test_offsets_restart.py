"""Committed offsets live in ``__consumer_offsets`` and survive a graceful restart and a kill -9 of the broker.

A kafka-python member consumes and commits; the broker is stopped with SIGTERM and started again on the same
data directory; an aiokafka member joining the group receives exactly the records produced after the
commit. Then the broker is killed with SIGKILL mid-life and restarted; a confluent-kafka member resumes from
the aiokafka member's commits, again receiving only newer records.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from kafka import KafkaConsumer
from kafka.admin import KafkaAdminClient

from tests.support.groups import create_topic, produce, start_broker
from tests.support.polling import gather, gather_async

PARTITIONS = 3
GROUP = "resume"
TOPIC = "resume-topic"


def committed(bootstrap: str) -> dict[int, int]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets(GROUP)[GROUP]
    finally:
        admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == TOPIC}


def _values(fetched) -> list[str]:
    """The values of a kafka-python poll's or an aiokafka getmany's records."""
    return [r.value.decode() for records in fetched.values() for r in records]


def consume_kafka_python(bootstrap: str, expected: int) -> list[str]:
    consumer = KafkaConsumer(TOPIC, bootstrap_servers=bootstrap, group_id=GROUP, enable_auto_commit=False,
                             auto_offset_reset="earliest", session_timeout_ms=3000, heartbeat_interval_ms=300)
    try:
        values = gather(lambda: _values(consumer.poll(timeout_ms=200)), count=expected, timeout_s=60)
        consumer.commit()
    finally:
        consumer.close()
    return values


def consume_aiokafka(bootstrap: str, expected: int, linger_s: float = 1.0) -> list[str]:
    from aiokafka import AIOKafkaConsumer

    async def run():
        consumer = AIOKafkaConsumer(TOPIC, bootstrap_servers=bootstrap, group_id=GROUP, enable_auto_commit=False,
                                    auto_offset_reset="earliest", session_timeout_ms=3000,
                                    heartbeat_interval_ms=300)
        await consumer.start()

        async def fetch():
            return _values(await consumer.getmany(timeout_ms=200))

        try:
            values = await gather_async(fetch, count=expected, timeout_s=60)
            # Keep polling a little: anything already committed that came back would show up here.
            end = time.monotonic() + linger_s
            while time.monotonic() < end:
                values += await fetch()
            await consumer.commit()
        finally:
            await consumer.stop()
        return values

    return asyncio.run(run())


def consume_confluent(bootstrap: str, expected: int, linger_s: float = 1.0) -> list[str]:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "session.timeout.ms": 3000,
                         "heartbeat.interval.ms": 300})
    consumer.subscribe([TOPIC])
    values: list[str] = []
    try:
        deadline = time.monotonic() + 60
        linger_until = None
        while time.monotonic() < deadline:
            for message in consumer.consume(num_messages=500, timeout=0.2):
                if message.error() is None:
                    values.append(message.value().decode())
            if len(values) >= expected:
                linger_until = linger_until or time.monotonic() + linger_s
                if time.monotonic() >= linger_until:
                    break
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return values


@pytest.mark.timeout(240)
def test_offsets_survive_graceful_restart_and_kill(broker_factory, tmp_path):
    broker = start_broker(broker_factory, tmp_path)
    create_topic(broker.bootstrap, TOPIC, PARTITIONS)
    first = produce(broker.bootstrap, TOPIC, PARTITIONS, "one", 40)
    got = consume_kafka_python(broker.bootstrap, len(first))
    assert set(got) == first
    assert committed(broker.bootstrap) == {p: 40 for p in range(PARTITIONS)}

    broker.restart("graceful")
    assert committed(broker.bootstrap) == {p: 40 for p in range(PARTITIONS)}
    second = produce(broker.bootstrap, TOPIC, PARTITIONS, "two", 10)
    got = consume_aiokafka(broker.bootstrap, len(second))
    assert sorted(got) == sorted(second), "a new member must resume exactly at the committed offsets"
    assert committed(broker.bootstrap) == {p: 50 for p in range(PARTITIONS)}

    broker.restart("kill")
    assert committed(broker.bootstrap) == {p: 50 for p in range(PARTITIONS)}
    third = produce(broker.bootstrap, TOPIC, PARTITIONS, "three", 10)
    got = consume_confluent(broker.bootstrap, len(third))
    assert sorted(got) == sorted(third)
    assert committed(broker.bootstrap) == {p: 60 for p in range(PARTITIONS)}
    assert "committed offset(s)" in broker.log_text()
