"""One consumer-group member in its own process, so a test can stop it gracefully (SIGTERM: the client closes
and sends LeaveGroup) or kill -9 it (it just vanishes, as a crashed consumer does).

    python group_member.py {kafka-python|aiokafka|confluent} BOOTSTRAP TOPIC GROUP EVENTS_FILE SESSION_TIMEOUT_MS

Consumes with manual commits: each polled batch is first written to EVENTS_FILE (fsync'ed JSON lines), then
committed synchronously; a commit that succeeded is written as its own event. Every event carries
``time.monotonic()`` (CLOCK_MONOTONIC is system-wide on Linux, so events of different processes order).

    {"t": ..., "event": "consumed", "partition": p, "offset": o, "value": "..."}
    {"t": ..., "event": "committed", "offsets": {"p": next_offset, ...}}
    {"t": ..., "event": "assigned", "partitions": [...]}
    {"t": ..., "event": "revoked", "partitions": [...]}      (kafka-python and confluent)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

client, bootstrap, topic, group, events_path, session_ms = sys.argv[1:7]
session_ms = int(session_ms)
heartbeat_ms = max(session_ms // 6, 100)
stop = False


def on_term(signum, frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
events = open(events_path, "a", buffering=1)  # noqa: SIM115 (the process's lifetime; line-buffered for readers)


def emit(event: str, **fields) -> None:
    events.write(json.dumps({"t": time.monotonic(), "event": event, "client": client, **fields}) + "\n")
    events.flush()
    os.fsync(events.fileno())


def consumed(records) -> None:
    for partition, offset, value in records:
        emit("consumed", partition=partition, offset=offset, value=value)


def run_kafka_python() -> None:
    from kafka import KafkaConsumer, OffsetAndMetadata
    from kafka.consumer.subscription_state import ConsumerRebalanceListener
    from kafka.errors import KafkaError

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            emit("revoked", partitions=sorted(tp.partition for tp in revoked))

        def on_partitions_assigned(self, assigned):
            emit("assigned", partitions=sorted(tp.partition for tp in assigned))

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                             auto_offset_reset="earliest", session_timeout_ms=session_ms,
                             heartbeat_interval_ms=heartbeat_ms, fetch_max_wait_ms=100,
                             client_id="member-kafka-python")
    consumer.subscribe([topic], listener=Listener())
    while not stop:
        try:
            batch = consumer.poll(timeout_ms=200)
        except KafkaError as exc:  # a broker down or restarting: a consumer application retries
            emit("poll_failed", error=repr(exc))
            time.sleep(0.2)
            continue
        if not batch:
            continue
        offsets = {}
        for tp, records in batch.items():
            consumed((r.partition, r.offset, r.value.decode()) for r in records)
            offsets[tp] = OffsetAndMetadata(records[-1].offset + 1, "", -1)
        try:
            consumer.commit(offsets)
            emit("committed", offsets={str(tp.partition): o.offset for tp, o in offsets.items()})
        except KafkaError as exc:
            emit("commit_failed", error=repr(exc))
    consumer.close()


def run_aiokafka() -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
    from aiokafka.errors import KafkaError

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            pass

        def on_partitions_assigned(self, assigned):
            emit("assigned", partitions=sorted(tp.partition for tp in assigned))

    async def main():
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                                    auto_offset_reset="earliest", session_timeout_ms=session_ms,
                                    heartbeat_interval_ms=heartbeat_ms, fetch_max_wait_ms=100,
                                    client_id="member-aiokafka")
        consumer.subscribe([topic], listener=Listener())
        await consumer.start()
        try:
            while not stop:
                batch = await consumer.getmany(timeout_ms=200)
                if not batch:
                    continue
                offsets = {}
                for tp, records in batch.items():
                    consumed((r.partition, r.offset, r.value.decode()) for r in records)
                    offsets[tp] = records[-1].offset + 1
                try:
                    await consumer.commit(offsets)
                    emit("committed", offsets={str(tp.partition): o for tp, o in offsets.items()})
                except KafkaError as exc:
                    emit("commit_failed", error=repr(exc))
        finally:
            await consumer.stop()

    asyncio.run(main())


def run_confluent() -> None:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    def on_assign(consumer, partitions):
        emit("assigned", partitions=sorted(tp.partition for tp in partitions))

    def on_revoke(consumer, partitions):
        emit("revoked", partitions=sorted(tp.partition for tp in partitions))

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "session.timeout.ms": session_ms,
        "heartbeat.interval.ms": heartbeat_ms, "fetch.wait.max.ms": 100, "client.id": "member-confluent",
    })
    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
    while not stop:
        messages = [m for m in consumer.consume(num_messages=500, timeout=0.2) if m.error() is None]
        if not messages:
            continue
        consumed((m.partition(), m.offset(), m.value().decode()) for m in messages)
        last: dict[int, int] = {}
        for m in messages:
            last[m.partition()] = max(last.get(m.partition(), -1), m.offset() + 1)
        try:
            consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in last.items()], asynchronous=False)
            emit("committed", offsets={str(p): o for p, o in last.items()})
        except KafkaException as exc:
            emit("commit_failed", error=repr(exc))
    consumer.close()


{"kafka-python": run_kafka_python, "aiokafka": run_aiokafka, "confluent": run_confluent}[client]()
emit("closed")
