"""One driver per real Kafka client, so every scenario runs unchanged against kafka-python, aiokafka,
confluent-kafka (librdkafka 2.16) and kcat (Debian's, librdkafka 2.0.2).

A driver produces a list of ``Rec`` to one partition (returning the offsets the broker acknowledged, or None
where the client cannot know them: acks=0, kcat), consumes from a chosen offset with assign + seek, looks
offsets up by time and reads watermarks, and creates/lists/deletes topics with the client's admin API.
Every call is bounded: client-side timeouts on each operation plus an overall deadline, because a client
talking to a broken broker can otherwise wait forever. ``assert_same_records`` checks what a driver consumed
against what was produced, every field the client can carry.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass

import pytest

from tests.support.polling import gather, gather_async

OP_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_MS = 15000
KCAT = shutil.which("kcat") or "/usr/bin/kcat"

# The clients log every retry at WARNING/ERROR: keep them, pytest shows them for failing tests only.
logging.getLogger("kafka").setLevel(logging.WARNING)
logging.getLogger("aiokafka").setLevel(logging.WARNING)


@dataclass(frozen=True)
class Rec:
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class Consumed:
    offset: int
    rec: Rec


def _consumed(message) -> Consumed:
    """A kafka-python or aiokafka ConsumerRecord (the two share their field names)."""
    return Consumed(message.offset, Rec(message.key, message.value, message.timestamp, tuple(message.headers or ())))


def make_records(count: int, *, base_ts_ms: int, tag: str, text_only: bool = False) -> list[Rec]:
    """Records worth checking: compressible payloads (so every codec really compresses), a null key, a
    record with headers, a 3 KiB value, binary bytes; timestamps one second apart from ``base_ts_ms``."""
    records = []
    for i in range(count):
        key: bytes | None = f"{tag}-key-{i}".encode()
        value: bytes | None = (f"{tag} value {i} " + "lorem ipsum dolor sit amet " * (1 + i % 5)).encode()
        headers: tuple[tuple[str, bytes], ...] = ()
        if not text_only:
            if i == 1:
                key = None
            if i == 2:
                headers = (("h1", b"one"), ("h2", bytes(range(8))))
            if i == 3:
                value = bytes(range(256)) * 2
            if i == 4:
                value = None  # tombstone
        if i == 5:
            value = (f"{tag} big " * 400).encode()[:3072]
        records.append(Rec(key, value, base_ts_ms + i * 1000, headers))
    return records


def now_ms() -> int:
    return int(time.time() * 1000)


def assert_same_records(driver: Driver, consumed, expected: list[Rec], first_offset: int, *, ts_range=None):
    """``consumed`` holds ``expected`` at offsets from ``first_offset``: keys, values, and headers and
    timestamps where the client carries them (else the timestamps fall in ``ts_range``, when given)."""
    got_offsets = [c.offset for c in consumed]
    assert got_offsets == list(range(first_offset, first_offset + len(expected))), got_offsets
    for c, rec in zip(consumed, expected, strict=True):
        assert c.rec.key == rec.key, (c.offset, c.rec.key, rec.key)
        assert c.rec.value == rec.value, (c.offset, c.rec.value, rec.value)
        if driver.supports_headers:
            assert tuple(c.rec.headers) == rec.headers, (c.offset, c.rec.headers, rec.headers)
        if driver.supports_timestamps:
            assert c.rec.timestamp_ms == rec.timestamp_ms, (c.offset, c.rec.timestamp_ms, rec.timestamp_ms)
        elif ts_range is not None:
            assert ts_range[0] <= c.rec.timestamp_ms <= ts_range[1], (c.offset, c.rec.timestamp_ms, ts_range)


class Driver:
    name = "?"
    codecs = ("none", "gzip", "snappy", "lz4", "zstd")
    supports_timestamps = True
    supports_headers = True
    supports_null_value = True
    supports_admin = True
    # librdkafka sends a batch uncompressed when compressing does not shrink it (a lone short record):
    # its partitions may mix the chosen codec with uncompressed batches.
    may_skip_compression = False

    def produce(self, bootstrap, topic, records, *, acks, codec, partition=0) -> list[int | None]:
        raise NotImplementedError

    def consume(self, bootstrap, topic, partition, start_offset, count) -> list[Consumed]:
        raise NotImplementedError

    def offset_for_time(self, bootstrap, topic, partition, timestamp_ms) -> int | None:
        raise NotImplementedError

    def watermarks(self, bootstrap, topic, partition) -> tuple[int, int]:
        raise NotImplementedError

    def create_topic(self, bootstrap, topic, partitions, configs: dict[str, str] | None = None) -> None:
        raise NotImplementedError

    def create_topic_error(self, bootstrap, topic, partitions) -> str | None:
        """Create and return the error's text (None when it succeeded)."""
        try:
            self.create_topic(bootstrap, topic, partitions)
        except Exception as exc:  # each client raises its own exception types
            return f"{type(exc).__name__}: {exc}"
        return None

    def delete_topic(self, bootstrap, topic) -> None:
        raise NotImplementedError

    def topic_partitions(self, bootstrap, topic) -> int | None:
        """Number of partitions from metadata, None if the topic is not listed."""
        raise NotImplementedError


# -- kafka-python --------------------------------------------------------------------------------------------
class KafkaPythonDriver(Driver):
    name = "kafka-python"

    def produce(self, bootstrap, topic, records, *, acks, codec, partition=0):
        from kafka import KafkaProducer

        config = dict(
            bootstrap_servers=bootstrap,
            compression_type=None if codec == "none" else codec,
            linger_ms=5,
            request_timeout_ms=REQUEST_TIMEOUT_MS,
            max_block_ms=int(OP_TIMEOUT_S * 1000),
        )
        if acks != "all":
            # kafka-python's default producer is idempotent with acks=all: "all" keeps the default.
            config["acks"] = acks
        producer = KafkaProducer(**config)
        try:
            futures = [
                producer.send(
                    topic,
                    key=r.key,
                    value=r.value,
                    partition=partition,
                    timestamp_ms=r.timestamp_ms,
                    headers=list(r.headers),
                )
                for r in records
            ]
            producer.flush(timeout=OP_TIMEOUT_S)
            offsets = [f.get(timeout=OP_TIMEOUT_S).offset for f in futures]
        finally:
            producer.close(timeout=5)
        return [None if acks == 0 else o for o in offsets]

    def _consumer(self, bootstrap):
        from kafka import KafkaConsumer

        return KafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
            request_timeout_ms=REQUEST_TIMEOUT_MS,
            auto_offset_reset="none",
        )

    def consume(self, bootstrap, topic, partition, start_offset, count):
        from kafka import TopicPartition

        tp = TopicPartition(topic, partition)
        consumer = self._consumer(bootstrap)
        try:
            consumer.assign([tp])
            consumer.seek(tp, start_offset)
            return gather(lambda: [_consumed(m) for m in consumer.poll(timeout_ms=500).get(tp, [])],
                          count=count, timeout_s=OP_TIMEOUT_S)
        finally:
            consumer.close()

    def offset_for_time(self, bootstrap, topic, partition, timestamp_ms):
        from kafka import TopicPartition

        tp = TopicPartition(topic, partition)
        consumer = self._consumer(bootstrap)
        try:
            found = consumer.offsets_for_times({tp: timestamp_ms})[tp]
        finally:
            consumer.close()
        return None if found is None else found.offset

    def watermarks(self, bootstrap, topic, partition):
        from kafka import TopicPartition

        tp = TopicPartition(topic, partition)
        consumer = self._consumer(bootstrap)
        try:
            low = consumer.beginning_offsets([tp])[tp]
            high = consumer.end_offsets([tp])[tp]
        finally:
            consumer.close()
        return low, high

    def _admin(self, bootstrap):
        from kafka.admin import KafkaAdminClient

        return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)

    def create_topic(self, bootstrap, topic, partitions, configs=None):
        from kafka.admin import NewTopic

        admin = self._admin(bootstrap)
        try:
            new_topic = NewTopic(name=topic, num_partitions=partitions, replication_factor=1,
                                 topic_configs=configs or {})
            response = admin.create_topics([new_topic], timeout_ms=10000)
            _raise_topic_errors(response)
        finally:
            admin.close()

    def delete_topic(self, bootstrap, topic):
        admin = self._admin(bootstrap)
        try:
            _raise_topic_errors(admin.delete_topics([topic], timeout_ms=10000))
        finally:
            admin.close()

    def topic_partitions(self, bootstrap, topic):
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)
        try:
            if topic not in consumer.topics():
                return None
            partitions = consumer.partitions_for_topic(topic)
            return None if partitions is None else len(partitions)
        finally:
            consumer.close()


def _raise_topic_errors(response) -> None:
    """kafka-python admin returns the raw response; error codes inside it are not raised for us."""
    for attr in ("topic_errors", "topic_error_codes", "responses"):
        entries = getattr(response, attr, None)
        if entries is None:
            continue
        for entry in entries:
            code = entry[1] if isinstance(entry, tuple) else getattr(entry, "error_code", 0)
            if code:
                from kafka.errors import for_code

                raise for_code(code)(f"topic error {code} in {entry}")
        return


# -- aiokafka ------------------------------------------------------------------------------------------------
def _run(coro):
    async def bounded():
        return await asyncio.wait_for(coro, OP_TIMEOUT_S * 2)

    return asyncio.run(bounded())


class AiokafkaDriver(Driver):
    name = "aiokafka"

    def produce(self, bootstrap, topic, records, *, acks, codec, partition=0):
        from aiokafka import AIOKafkaProducer

        async def go():
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap,
                acks=acks,
                # acks=all goes through the idempotent path (InitProducerId v0, sequences): aiokafka's
                # default is off, so this is the one place it is exercised.
                enable_idempotence=acks == "all",
                compression_type=None if codec == "none" else codec,
                linger_ms=5,
                request_timeout_ms=REQUEST_TIMEOUT_MS,
            )
            await producer.start()
            try:
                futures = [
                    await producer.send(
                        topic,
                        value=r.value,
                        key=r.key,
                        partition=partition,
                        timestamp_ms=r.timestamp_ms,
                        headers=list(r.headers),
                    )
                    for r in records
                ]
                await producer.flush()
                metadata = [await f for f in futures]
            finally:
                await producer.stop()
            return [None if acks == 0 else m.offset for m in metadata]

        return _run(go())

    async def _with_consumer(self, bootstrap, work):
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
            request_timeout_ms=REQUEST_TIMEOUT_MS,
            auto_offset_reset="none",
        )
        await consumer.start()
        try:
            return await work(consumer)
        finally:
            await consumer.stop()

    def consume(self, bootstrap, topic, partition, start_offset, count):
        from aiokafka import TopicPartition

        tp = TopicPartition(topic, partition)

        async def work(consumer):
            consumer.assign([tp])
            consumer.seek(tp, start_offset)

            async def fetch():
                return [_consumed(m) for m in (await consumer.getmany(tp, timeout_ms=500)).get(tp, [])]

            return await gather_async(fetch, count=count, timeout_s=OP_TIMEOUT_S)

        return _run(self._with_consumer(bootstrap, work))

    def offset_for_time(self, bootstrap, topic, partition, timestamp_ms):
        from aiokafka import TopicPartition

        tp = TopicPartition(topic, partition)

        async def work(consumer):
            found = (await consumer.offsets_for_times({tp: timestamp_ms}))[tp]
            return None if found is None else found.offset

        return _run(self._with_consumer(bootstrap, work))

    def watermarks(self, bootstrap, topic, partition):
        from aiokafka import TopicPartition

        tp = TopicPartition(topic, partition)

        async def work(consumer):
            low = (await consumer.beginning_offsets([tp]))[tp]
            high = (await consumer.end_offsets([tp]))[tp]
            return low, high

        return _run(self._with_consumer(bootstrap, work))

    async def _with_admin(self, bootstrap, work):
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)
        await admin.start()
        try:
            return await work(admin)
        finally:
            await admin.close()

    def create_topic(self, bootstrap, topic, partitions, configs=None):
        from aiokafka.admin import NewTopic

        async def work(admin):
            new_topic = NewTopic(name=topic, num_partitions=partitions, replication_factor=1,
                                 topic_configs=configs or {})
            response = await admin.create_topics([new_topic], timeout_ms=10000)
            _raise_aiokafka_topic_errors(response)

        _run(self._with_admin(bootstrap, work))

    def delete_topic(self, bootstrap, topic):
        async def work(admin):
            _raise_aiokafka_topic_errors(await admin.delete_topics([topic], timeout_ms=10000))

        _run(self._with_admin(bootstrap, work))

    def topic_partitions(self, bootstrap, topic):
        async def work(admin):
            if topic not in await admin.list_topics():
                return None
            described = await admin.describe_topics([topic])
            for entry in described:
                if entry["topic"] == topic and entry["error_code"] == 0:
                    return len(entry["partitions"])
            return None

        return _run(self._with_admin(bootstrap, work))


def _raise_aiokafka_topic_errors(response) -> None:
    from aiokafka.errors import for_code

    for entry in getattr(response, "topic_errors", None) or getattr(response, "topic_error_codes", None) or ():
        code = entry[1]
        if code:
            raise for_code(code)(f"topic error {code} in {entry}")


# -- confluent-kafka (librdkafka 2.16) -----------------------------------------------------------------------
class ConfluentDriver(Driver):
    name = "confluent-kafka"
    may_skip_compression = True

    def produce(self, bootstrap, topic, records, *, acks, codec, partition=0):
        from confluent_kafka import KafkaException, Producer

        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": str(acks) if acks != "all" else "all",
                "enable.idempotence": acks == "all",
                "compression.type": codec,
                "linger.ms": 5,
                "message.timeout.ms": int(OP_TIMEOUT_S * 1000),
                "socket.timeout.ms": REQUEST_TIMEOUT_MS,
            }
        )
        results: dict[int, tuple] = {}

        def delivered(index):
            def callback(err, message):
                results[index] = (err, message.offset())

            return callback

        for index, r in enumerate(records):
            producer.produce(
                topic,
                value=r.value,
                key=r.key,
                partition=partition,
                timestamp=r.timestamp_ms or 0,
                headers=list(r.headers) or None,
                on_delivery=delivered(index),
            )
        remaining = producer.flush(OP_TIMEOUT_S)
        assert remaining == 0, f"{remaining} messages not delivered within {OP_TIMEOUT_S}s"
        offsets = []
        for index in range(len(records)):
            if index not in results:
                raise AssertionError(f"no delivery report for record {index}")
            err, offset = results[index]
            if err is not None:
                raise KafkaException(err)
            # acks=0: delivered without a broker answer, so no offset (None or OFFSET_INVALID -1001).
            offsets.append(None if acks == 0 or offset is None or offset < 0 else offset)
        return offsets

    def _consumer(self, bootstrap):
        from confluent_kafka import Consumer

        # librdkafka insists on a group id even for assign(); nothing is committed.
        return Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"tests-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,
                "socket.timeout.ms": REQUEST_TIMEOUT_MS,
                "auto.offset.reset": "error",
            }
        )

    def consume(self, bootstrap, topic, partition, start_offset, count):
        from confluent_kafka import KafkaException, TopicPartition

        consumer = self._consumer(bootstrap)

        def fetch():
            out = []
            for message in consumer.consume(num_messages=count, timeout=0.5):
                if message.error():
                    raise KafkaException(message.error())
                _, ts = message.timestamp()
                headers = tuple((k, v) for k, v in (message.headers() or ()))
                out.append(Consumed(message.offset(), Rec(message.key(), message.value(), ts, headers)))
            return out

        try:
            consumer.assign([TopicPartition(topic, partition, start_offset)])
            return gather(fetch, count=count, timeout_s=OP_TIMEOUT_S)[:count]
        finally:
            consumer.close()

    def offset_for_time(self, bootstrap, topic, partition, timestamp_ms):
        from confluent_kafka import TopicPartition

        consumer = self._consumer(bootstrap)
        try:
            (found,) = consumer.offsets_for_times([TopicPartition(topic, partition, timestamp_ms)],
                                                  timeout=OP_TIMEOUT_S)
        finally:
            consumer.close()
        if found.error:
            raise RuntimeError(found.error)
        return None if found.offset < 0 else found.offset

    def watermarks(self, bootstrap, topic, partition):
        from confluent_kafka import TopicPartition

        consumer = self._consumer(bootstrap)
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=OP_TIMEOUT_S)
        finally:
            consumer.close()

    def _admin(self, bootstrap):
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": REQUEST_TIMEOUT_MS})

    def create_topic(self, bootstrap, topic, partitions, configs=None):
        from confluent_kafka.admin import NewTopic

        admin = self._admin(bootstrap)  # keep the handle alive until the future resolves
        futures = admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1, config=configs or {})],
            operation_timeout=10,
        )
        futures[topic].result(timeout=OP_TIMEOUT_S)

    def delete_topic(self, bootstrap, topic):
        admin = self._admin(bootstrap)
        futures = admin.delete_topics([topic], operation_timeout=10)
        futures[topic].result(timeout=OP_TIMEOUT_S)

    def topic_partitions(self, bootstrap, topic):
        metadata = self._admin(bootstrap).list_topics(timeout=OP_TIMEOUT_S)
        entry = metadata.topics.get(topic)
        if entry is None or entry.error is not None:
            return None
        return len(entry.partitions)


# -- kcat (librdkafka 2.0.2) ---------------------------------------------------------------------------------
class KcatDriver(Driver):
    """kcat cannot set timestamps, null values or per-record headers, reports no offsets and has no admin
    requests: the scenarios use text records, and wall-clock timestamps for the by-time lookup."""

    name = "kcat"
    may_skip_compression = True
    supports_timestamps = False
    supports_headers = False
    supports_null_value = False
    supports_admin = False

    def _run(self, args, stdin: bytes | None = None) -> str:
        if not shutil.which(KCAT):
            pytest.skip(f"kcat is not installed at {KCAT} (tests/run.sh installs Debian's package when root)")
        result = subprocess.run([KCAT, *args], input=stdin, capture_output=True, timeout=OP_TIMEOUT_S + 15)
        if result.returncode != 0:
            raise RuntimeError(f"kcat {' '.join(args)} exited {result.returncode}: {result.stderr.decode()[-3000:]}")
        return result.stdout.decode()

    def produce(self, bootstrap, topic, records, *, acks, codec, partition=0):
        for r in records:
            assert r.key is not None and b"\t" not in r.key and r.value is not None and b"\n" not in r.value
        lines = b"".join(r.key + b"\t" + r.value + b"\n" for r in records)
        args = ["-b", bootstrap, "-P", "-t", topic, "-p", str(partition), "-K", "\t", "-q",
                "-X", f"acks={acks}", "-X", "linger.ms=5", "-X", f"message.timeout.ms={int(OP_TIMEOUT_S * 1000)}"]
        if codec != "none":
            args += ["-z", codec]
        self._run(args, stdin=lines)
        return [None] * len(records)

    def consume(self, bootstrap, topic, partition, start_offset, count):
        if count == 0:
            return []
        out = self._run(["-b", bootstrap, "-C", "-t", topic, "-p", str(partition), "-o", str(start_offset),
                         "-c", str(count), "-e", "-J", "-q", "-X", "fetch.wait.max.ms=100"])
        consumed = []
        for line in out.splitlines():
            if not line.strip():
                continue
            m = json.loads(line)
            key = None if m.get("key") is None else m["key"].encode()
            value = None if m.get("payload") is None else m["payload"].encode()
            consumed.append(Consumed(m["offset"], Rec(key, value, m.get("ts"), ())))
        return consumed

    def _query(self, bootstrap, topic, partition, timestamp_ms) -> int:
        out = self._run(["-b", bootstrap, "-Q", "-t", f"{topic}:{partition}:{timestamp_ms}"])
        # "<topic> [<partition>] offset <N>"
        for line in out.splitlines():
            if "offset" in line:
                return int(line.rsplit("offset", 1)[1].split()[0])
        raise RuntimeError(f"kcat -Q printed no offset: {out!r}")

    def offset_for_time(self, bootstrap, topic, partition, timestamp_ms):
        offset = self._query(bootstrap, topic, partition, timestamp_ms)
        return None if offset < 0 else offset

    def watermarks(self, bootstrap, topic, partition):
        return self._query(bootstrap, topic, partition, -2), self._query(bootstrap, topic, partition, -1)

    def topic_partitions(self, bootstrap, topic):
        metadata = json.loads(self._run(["-b", bootstrap, "-L", "-J", "-t", topic]))
        for entry in metadata.get("topics", []):
            if entry.get("topic") == topic and not entry.get("error"):
                return len(entry.get("partitions", []))
        return None


DRIVERS = {d.name: d for d in (KafkaPythonDriver(), AiokafkaDriver(), ConfluentDriver(), KcatDriver())}
