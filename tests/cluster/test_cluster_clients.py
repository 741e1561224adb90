"""Real clients against a three-broker cluster: kafka-python, aiokafka, confluent-kafka and kcat each create
a 6-partition topic, produce to every partition and read every partition back, bootstrapping through each
broker in turn, so each client finds the leaders on all three brokers from whichever broker it first asked;
and a consumer group of three members, one per client library and each bootstrapped on a different broker,
consumes a topic spread over the brokers exactly once, committing as it goes (issue: cluster metadata in
etcd, "Tests").

One cluster serves the module (a start is three broker processes and a controller election); every case
works on a topic of its own.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections import Counter

import pytest

from tests.support.clients import DRIVERS, KCAT, OP_TIMEOUT_S, REQUEST_TIMEOUT_MS
from tests.support.cluster import Cluster
from tests.support.groups import Member, read_events
from tests.support.polling import gather, gather_async, wait_until
from tests.support.topics import unique_topic

PARTITIONS = 6
PER_PARTITION = 20
CLIENTS = ["kafka-python", "aiokafka", "confluent-kafka", "kcat"]


@pytest.fixture(scope="module")
def cluster(etcd_server, tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("clients-cluster"), etcd_server, 3).start()
    try:
        yield cluster
    finally:
        dead = [node_id for node_id, broker in cluster.brokers.items() if not broker.alive()]
        cluster.stop()
        assert not dead, f"brokers {dead} died during the tests:\n{cluster.log_texts()}"


# -- each client: every partition in one producer, every partition in one consumer ---------------------------
def produce_kafka_python(bootstrap, topic, values_by_partition):
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, request_timeout_ms=REQUEST_TIMEOUT_MS,
                             max_block_ms=int(OP_TIMEOUT_S * 1000))
    try:
        futures = {p: [producer.send(topic, v, partition=p) for v in values]
                   for p, values in values_by_partition.items()}
        producer.flush(timeout=OP_TIMEOUT_S)
        return {p: [f.get(timeout=OP_TIMEOUT_S).offset for f in fs] for p, fs in futures.items()}
    finally:
        producer.close(timeout=5)


def consume_kafka_python(bootstrap, topic, count):
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             fetch_max_wait_ms=100, request_timeout_ms=REQUEST_TIMEOUT_MS)
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        return gather(lambda: _rows(consumer.poll(timeout_ms=500)), count=count, timeout_s=OP_TIMEOUT_S)
    finally:
        consumer.close()


def _rows(fetched) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of a kafka-python poll's or an aiokafka getmany's records."""
    return [(tp.partition, m.offset, m.value) for tp, messages in fetched.items() for m in messages]


def produce_aiokafka(bootstrap, topic, values_by_partition):
    from aiokafka import AIOKafkaProducer

    async def go():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5,
                                    request_timeout_ms=REQUEST_TIMEOUT_MS)
        await producer.start()
        try:
            futures = {p: [await producer.send(topic, v, partition=p) for v in values]
                       for p, values in values_by_partition.items()}
            await producer.flush()
            return {p: [(await f).offset for f in fs] for p, fs in futures.items()}
        finally:
            await producer.stop()

    return asyncio.run(asyncio.wait_for(go(), OP_TIMEOUT_S * 2))


def consume_aiokafka(bootstrap, topic, count):
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def go():
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                    fetch_max_wait_ms=100, request_timeout_ms=REQUEST_TIMEOUT_MS)
        await consumer.start()
        try:
            partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            consumer.assign(partitions)
            await consumer.seek_to_beginning(*partitions)

            async def fetch():
                return _rows(await consumer.getmany(timeout_ms=500))

            return await gather_async(fetch, count=count, timeout_s=OP_TIMEOUT_S)
        finally:
            await consumer.stop()

    return asyncio.run(asyncio.wait_for(go(), OP_TIMEOUT_S * 2))


def produce_confluent(bootstrap, topic, values_by_partition):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "message.timeout.ms": int(OP_TIMEOUT_S * 1000)})
    results: dict[tuple[int, int], object] = {}
    for p, values in values_by_partition.items():
        for i, v in enumerate(values):
            producer.produce(topic, v, partition=p,
                             on_delivery=lambda err, msg, key=(p, i): results.__setitem__(key, err or msg.offset()))
    assert producer.flush(OP_TIMEOUT_S) == 0, "records still undelivered"
    errors = [r for r in results.values() if not isinstance(r, int)]
    assert not errors, f"{len(errors)} records not delivered, the first: {errors[0]}"
    return {p: [results[(p, i)] for i in range(len(values))] for p, values in values_by_partition.items()}


def consume_confluent(bootstrap, topic, count):
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 100})

    def fetch():
        messages = consumer.consume(num_messages=count, timeout=0.5)
        for m in messages:
            if m.error():
                raise KafkaException(m.error())
        return [(m.partition(), m.offset(), m.value()) for m in messages]

    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        return gather(fetch, count=count, timeout_s=OP_TIMEOUT_S)
    finally:
        consumer.close()


def _kcat(args, stdin=None) -> str:
    result = subprocess.run([KCAT, *args], input=stdin, capture_output=True, timeout=OP_TIMEOUT_S + 15)
    assert result.returncode == 0, f"kcat {' '.join(args)} exited {result.returncode}: {result.stderr.decode()[-2000:]}"
    return result.stdout.decode()


def produce_kcat(bootstrap, topic, values_by_partition):
    # kcat reports no offsets: the read-back checks where each record went.
    for p, values in values_by_partition.items():
        _kcat(["-b", bootstrap, "-P", "-t", topic, "-p", str(p), "-X", "acks=all", "-X", "linger.ms=5"],
              stdin=b"".join(v + b"\n" for v in values))
    return {p: [None] * len(values) for p, values in values_by_partition.items()}


def consume_kcat(bootstrap, topic, count):
    # -e: exit once every partition is read to its end.
    out = _kcat(["-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-J", "-q",
                 "-X", "fetch.wait.max.ms=100"])
    return [(m["partition"], m["offset"], m["payload"].encode()) for m in map(json.loads, out.splitlines()) if m]


CLIENT_CALLS = {
    "kafka-python": (produce_kafka_python, consume_kafka_python),
    "aiokafka": (produce_aiokafka, consume_aiokafka),
    "confluent-kafka": (produce_confluent, consume_confluent),
    "kcat": (produce_kcat, consume_kcat),
}


@pytest.mark.parametrize("via", [1, 2, 3])
@pytest.mark.parametrize("client", CLIENTS)
def test_a_client_produces_and_consumes_every_partition_through_any_bootstrap_broker(cluster, client, via):
    bootstrap = cluster.brokers[via].bootstrap
    topic = unique_topic(f"{client}-via{via}")
    driver = DRIVERS[client]
    if driver.supports_admin:
        driver.create_topic(bootstrap, topic, PARTITIONS)  # through this broker: forwarded to the controller
        leaders = cluster.wait_for_leaders(topic, PARTITIONS)
    else:
        leaders = cluster.create_topic(topic, PARTITIONS, 1, via=[via])
    assert Counter(p.leader for p in leaders.values()) == {1: 2, 2: 2, 3: 2}

    produce, consume = CLIENT_CALLS[client]
    sent = {p: [f"{client}-via{via}-p{p}-{i}".encode() for i in range(PER_PARTITION)] for p in range(PARTITIONS)}
    offsets = produce(bootstrap, topic, sent)
    for p, partition_offsets in offsets.items():
        assert partition_offsets in ([None] * PER_PARTITION, list(range(PER_PARTITION))), (p, partition_offsets)

    got = consume(bootstrap, topic, PARTITIONS * PER_PARTITION)
    by_partition: dict[int, list] = {p: [] for p in range(PARTITIONS)}
    for partition, offset, value in got:
        by_partition[partition].append((offset, value))
    for p in range(PARTITIONS):
        assert by_partition[p] == list(enumerate(sent[p])), f"partition {p} (leader {leaders[p].leader})"


def test_a_group_of_three_clients_spans_the_brokers_and_consumes_everything_exactly_once(cluster, tmp_path):
    topic = unique_topic("group-span")
    group = f"span-{uuid.uuid4().hex[:8]}"
    leaders = cluster.create_topic(topic, PARTITIONS, 1)
    assert {p.leader for p in leaders.values()} == {1, 2, 3}
    # One member per client library, each bootstrapped on a different broker; the coordinator is on one.
    members = [Member(client, cluster.brokers[node_id].bootstrap, topic, group, tmp_path / f"{client}.events", 10000)
               for client, node_id in (("kafka-python", 1), ("aiokafka", 2), ("confluent", 3))]
    try:
        def settled():
            events = read_events([m.events for m in members])
            latest = {}
            for event in events:
                if event["event"] == "assigned":
                    latest[event["client"]] = event["partitions"]
            # Each member's newest assignment holds two partitions and together they hold all six: the
            # group is stable with three members (an older assignment of a member would hold three or six).
            if (len(latest) == 3 and all(len(p) == 2 for p in latest.values())
                    and sorted(sum(latest.values(), [])) == list(range(PARTITIONS))):
                return latest
            return None

        assignment = wait_until(settled, what="the group stable with its three members", timeout_s=90,
                                detail=lambda: "\n".join(m.log_text() for m in members))
        sent = {p: [f"group-p{p}-{i}".encode() for i in range(50)] for p in range(PARTITIONS)}
        produce_confluent(cluster.bootstrap, topic, sent)
        expected = {v.decode() for values in sent.values() for v in values}

        def committed_everything():
            events = read_events([m.events for m in members])
            committed: dict[int, int] = {}
            for event in events:
                if event["event"] == "committed":
                    for p, offset in event["offsets"].items():
                        committed[int(p)] = max(committed.get(int(p), 0), offset)
            return committed == {p: 50 for p in range(PARTITIONS)}

        wait_until(committed_everything, what="every partition consumed and committed to its end", timeout_s=90,
                   detail=lambda: "\n".join(m.log_text() for m in members))
        for member in members:
            member.leave()
    finally:
        for member in members:
            member.stop_quietly()

    events = read_events([m.events for m in members])
    consumed = [e for e in events if e["event"] == "consumed"]
    counts = Counter(e["value"] for e in consumed)
    assert set(counts) == expected
    duplicates = {v: n for v, n in counts.items() if n > 1}
    assert not duplicates, f"consumed more than once: {sorted(duplicates)[:10]} (assignment {assignment})"
    # Each member read only its own partitions, so every broker served a member that bootstrapped elsewhere.
    for e in consumed:
        assert e["partition"] in assignment[e["client"]], e
    assert not [e for e in events if e["event"] == "commit_failed"]

    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(PARTITIONS)])
    answer = admin.list_consumer_group_offsets([request])[group].result(30)
    assert {tp.partition: tp.offset for tp in answer.topic_partitions} == {p: 50 for p in range(PARTITIONS)}
