"""min.insync.replicas, seen by real clients: with two of three brokers down an acks=all write is never
acknowledged (NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS_AFTER_APPEND or a timeout, never success), an acks=1
write is, and acks=all works again once the brokers are back (issue: replication, "acks=all").

Both ways of losing two brokers are covered: the two followers (the leader stays, its ISR shrinks to itself)
and the leader with one follower (the last in-sync replica is elected and leads alone). Between the kill and
the ISR shrink (about one lease, 2 s) the ISR still names the dead brokers: writes are appended then, and
wait for a high watermark that cannot move; they must time out, not succeed.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Producer
from kio.schema.errors import ErrorCode

from tests.support.batches import build_batch, records_of
from tests.support.clients import DRIVERS, Rec
from tests.support.kio_requests import KafkaWire, produce
from tests.support.log_files import read_partition_log
from tests.support.polling import wait_until
from tests.support.topics import unique_topic

REFUSALS = {ErrorCode.not_enough_replicas, ErrorCode.not_enough_replicas_after_append, ErrorCode.request_timed_out}


def confluent_acks_all(bootstrap: str, topic: str, values: list[bytes], message_timeout_ms: int) -> list:
    """An idempotent acks=all librdkafka producer: [offset, or the KafkaError of the delivery report]."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "message.timeout.ms": message_timeout_ms})
    results: dict[int, object] = {}
    for index, value in enumerate(values):
        producer.produce(topic, value, partition=0,
                         on_delivery=lambda err, msg, i=index: results.__setitem__(i, err or msg.offset()))
    producer.flush(message_timeout_ms / 1000 + 30)
    return [results.get(i, "no delivery report") for i in range(len(values))]


def kafka_python_acks_all(bootstrap: str, topic: str, values: list[bytes]) -> list:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, request_timeout_ms=3000,
                             delivery_timeout_ms=5000, max_block_ms=10000)
    outcomes = []
    try:
        futures = [producer.send(topic, value, partition=0) for value in values]
        for future in futures:
            try:
                outcomes.append(future.get(timeout=30).offset)
            except Exception as exc:  # kafka-python's errors for a refused or expired batch
                outcomes.append(exc)
    finally:
        producer.close(timeout=5)
    return outcomes


def aiokafka_acks_all(bootstrap: str, topic: str, values: list[bytes]) -> list:
    from aiokafka import AIOKafkaProducer

    async def go():
        # Not idempotent: aiokafka's idempotent producer retries a refused batch for ever (its stop() then
        # waits for it), while a plain one gives up once the batch is older than request_timeout_ms.
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False,
                                    linger_ms=5, request_timeout_ms=3000)
        await producer.start()
        try:
            futures = [await producer.send(topic, value, partition=0) for value in values]
            async with asyncio.timeout(20):
                results = await asyncio.gather(*futures, return_exceptions=True)
            return [r if isinstance(r, Exception) else r.offset for r in results]
        finally:
            async with asyncio.timeout(10):
                await producer.stop()

    return asyncio.run(go())


# The second variant takes 36 s and differs only in which broker is down: slow (tests/run.sh -m slow).
@pytest.mark.parametrize("down", ["both followers", pytest.param("the leader and a follower", marks=pytest.mark.slow)])
def test_with_two_of_three_brokers_down_acks_all_is_never_acknowledged_and_acks_1_is(cluster_factory, down):
    cluster = cluster_factory(3)
    topic = unique_topic("min-isr")
    cluster.create_topic(topic, 1, 3, configs={"min.insync.replicas": "2"})
    view = cluster.wait_for_isr(topic, 1, 3)[0]
    # acks=all works with the ISR whole: the refusals below are for the missing replicas, nothing else.
    before = [f"before-{i}".encode() for i in range(10)]
    assert confluent_acks_all(cluster.bootstrap, topic, before, 30000) == list(range(10))

    followers = [n for n in view.replicas if n != view.leader]
    killed = followers if down == "both followers" else [view.leader, followers[0]]
    (survivor,) = [n for n in cluster.brokers if n not in killed]
    for node_id in killed:
        cluster.brokers[node_id].kill()
    broker = cluster.brokers[survivor]

    # 1. Until the ISR shrinks to the survivor, and after: raw acks=all writes with a 1 s timeout, for
    #    6 s. None may succeed; every answer is a refusal or a timeout.
    def survivor_leads():
        partition = cluster.metadata([topic], via=survivor).topics[topic][0]
        return partition.leader == survivor
    wait_until(survivor_leads, what=f"node {survivor} leading the partition", timeout_s=30)
    answers = []
    wire = KafkaWire(broker.port, host=broker.host)
    try:
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            response = produce(wire, topic, {0: build_batch([b"raw-acks-all"])}, acks=-1, timeout_ms=1000)
            answers.append(ErrorCode(response.responses[0].partition_responses[0].error_code))
    finally:
        wire.close()
    assert answers and set(answers) <= REFUSALS, f"acks=all answers with one live replica: {answers}"

    wait_until(lambda: cluster.metadata([topic], via=survivor).topics[topic][0].isr == (survivor,),
               what="the ISR shrunk to the survivor alone", timeout_s=30)
    # Below min.insync.replicas a write is refused before it is appended: the log end does not move.
    log_end = read_partition_log(broker.data_dir, topic, 0)[-1].last_offset + 1
    wire = KafkaWire(broker.port, host=broker.host)
    try:
        for _ in range(5):
            response = produce(wire, topic, {0: build_batch([b"refused"])}, acks=-1, timeout_ms=1000)
            assert response.responses[0].partition_responses[0].error_code == ErrorCode.not_enough_replicas
    finally:
        wire.close()
    assert read_partition_log(broker.data_dir, topic, 0)[-1].last_offset + 1 == log_end

    # 2. Real clients, acks=all: every record fails, none is acknowledged.
    refused = {
        "confluent-kafka": confluent_acks_all(broker.bootstrap, topic,
                                              [b"confluent-all-%d" % i for i in range(5)], 5000),
        "kafka-python": kafka_python_acks_all(broker.bootstrap, topic, [b"kafka-python-all-%d" % i for i in range(5)]),
        "aiokafka": aiokafka_acks_all(broker.bootstrap, topic, [b"aiokafka-all-%d" % i for i in range(3)]),
    }
    for client, outcomes in refused.items():
        acknowledged = [o for o in outcomes if isinstance(o, int)]
        assert not acknowledged, f"{client} had acks=all records acknowledged at {acknowledged} with one live replica"

    # 3. acks=1 is acknowledged, through every client.
    written: dict[int, bytes] = {}
    acks_1_values: list[bytes] = []
    for name, driver in DRIVERS.items():
        values = [f"{name}-acks-1-{i}".encode() for i in range(5)]
        offsets = driver.produce(broker.bootstrap, topic, [Rec(b"k", v) for v in values], acks=1, codec="none")
        assert len(offsets) == len(values)
        acks_1_values += values
        written.update({o: v for o, v in zip(offsets, values, strict=True) if o is not None})
    assert len(written) == 15  # kcat reports no offsets; the other three do

    # 4. The two come back, catch up and rejoin; acks=all is acknowledged again.
    for node_id in killed:
        cluster.brokers[node_id].start()
    cluster.wait_for_isr(topic, 1, 3, timeout_s=60)
    after = confluent_acks_all(cluster.bootstrap, topic, [b"after-%d" % i for i in range(10)], 30000)
    assert all(isinstance(o, int) for o in after), after

    records = {r.offset: r.value for r in records_of(b"".join(
        batch.data for batch in read_partition_log(cluster.brokers[survivor].data_dir, topic, 0)))}
    assert [records[o] for o in range(10)] == before
    assert all(records.get(o) == v for o, v in written.items())
    stored = set(records.values())
    assert set(acks_1_values) <= stored
    assert all(records.get(o) == b"after-%d" % i for i, o in enumerate(after))
    never = [v for outcomes_values in ([b"confluent-all-%d" % i for i in range(5)],
                                       [b"kafka-python-all-%d" % i for i in range(5)],
                                       [b"aiokafka-all-%d" % i for i in range(3)], [b"refused"])
             for v in outcomes_values if v in stored]
    assert not never, f"writes refused below min.insync.replicas were appended: {never}"
