"""aiokafka's and kafka-python's transactional producers and read_committed consumers: a committed
transaction is read, an aborted one never, by each client's own consumer and by librdkafka's."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.read_back import read_topic_to_end
from tests.support.topics import create_topic, unique_topic

pytestmark = pytest.mark.timeout(90)


def _aiokafka(bootstrap: str, topic: str) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique_topic("aio"))
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait(topic, b"committed", partition=0)
            with pytest.raises(RuntimeError):
                async with producer.transaction():
                    await producer.send_and_wait(topic, b"aborted", partition=1)
                    raise RuntimeError("abort it")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, isolation_level="read_committed",
                                    auto_offset_reset="earliest")
        await consumer.start()
        try:
            seen = []
            for _ in range(10):
                batches = await consumer.getmany(timeout_ms=500)
                seen += [m.value for messages in batches.values() for m in messages]
                if seen:
                    await asyncio.sleep(0.5)  # anything after the first read would be a bug: look once more
                    batches = await consumer.getmany(timeout_ms=500)
                    seen += [m.value for messages in batches.values() for m in messages]
                    break
            return seen
        finally:
            await consumer.stop()

    return asyncio.run(run())


def _kafka_python(bootstrap: str, topic: str) -> list[bytes]:
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique_topic("kp"))
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(topic, b"committed", partition=0)
    producer.commit_transaction()
    producer.begin_transaction()
    producer.send(topic, b"aborted", partition=1)
    producer.flush()
    producer.abort_transaction()
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, isolation_level="read_committed",
                             auto_offset_reset="earliest", consumer_timeout_ms=3000)
    try:
        return [m.value for m in consumer]
    finally:
        consumer.close()


@pytest.mark.parametrize("client", ["aiokafka", "kafka-python"])
def test_transactional_producer_and_read_committed_consumer(broker_factory, client):
    broker = broker_factory()
    topic = unique_topic(f"txn-{client}")
    create_topic(broker.bootstrap, topic)
    seen = (_aiokafka if client == "aiokafka" else _kafka_python)(broker.bootstrap, topic)
    assert seen == [b"committed"]
    assert read_topic_to_end(broker.bootstrap, topic, "read_committed") == ["committed"]
    assert read_topic_to_end(broker.bootstrap, topic, "read_uncommitted") == ["aborted", "committed"]
