"""A compacted topic read by the real clients: kafka-python, confluent-kafka (librdkafka) and kcat each read
the cleaned log from the start to its end through the offset gaps the cleaner left, and each sees, per key,
the latest value at the offset it was written at. A keyless record is refused with INVALID_RECORD (87), as
Kafka refuses it. One broker subprocess; the cleaner runs on its own threads with a 100 ms backoff."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from confluent_kafka import KafkaError, Producer
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from tests.support.broker_process import TEST_BROKER_CONFIG, BrokerProcess
from tests.support.polling import wait_until
from tests.support.read_back import read_partition_to_end

pytestmark = pytest.mark.timeout(180)

TOPIC = "table"
KEYS = 30
ROUNDS = 25
SEGMENT_BYTES = 16 << 10


def _segments(broker) -> list:
    return sorted((broker.data_dir / f"{TOPIC}-0").glob("*.log"))


@pytest.fixture(scope="module")
def compacted_broker(tmp_path_factory):
    base = tmp_path_factory.mktemp("compacted")
    broker = BrokerProcess(data_dir=base / "data", log_path=base / "broker.log", loop="uvloop",
                           config={**TEST_BROKER_CONFIG, "log.cleaner.backoff.ms": 100})
    broker.start()
    try:
        yield broker
    finally:
        assert broker.stop() == 0, broker.log_tail()


@pytest.fixture(scope="module")
def compacted(compacted_broker):
    broker = compacted_broker
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([NewTopic(TOPIC, 1, 1, topic_configs={
            "cleanup.policy": "compact", "segment.bytes": str(SEGMENT_BYTES), "min.cleanable.dirty.ratio": "0.1"})])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=2)
    written: dict[int, tuple[bytes, bytes]] = {}
    try:
        futures = []
        for round_number in range(ROUNDS):
            for key in range(KEYS):
                record = (b"key-%02d" % key, b"%02d@%02d:" % (key, round_number) + b"v" * 150)
                futures.append((producer.send(TOPIC, key=record[0], value=record[1], partition=0), record))
        producer.flush(30)
        for future, record in futures:
            written[future.get(10).offset] = record
    finally:
        producer.close()
    # The records alone fill more than 6 segments (counting the files here would race the cleaner, which
    # merges them while the producer is still writing).
    record_bytes = sum(len(key) + len(value) for key, value in written.values())
    assert record_bytes > 6 * SEGMENT_BYTES
    wait_until(lambda: len(_segments(broker)) <= 3, timeout_s=60, what="the cleaner to merge the cleaned segments",
               detail=lambda: f"{len(_segments(broker))} segments, {record_bytes} record bytes written")
    latest = {}
    for offset in sorted(written):
        latest[written[offset][0]] = offset
    return broker, written, latest


def check(read: list[tuple[int, bytes, bytes]], written, latest) -> None:
    offsets = [offset for offset, _, _ in read]
    assert offsets == sorted(set(offsets))
    assert len(read) < len(written) / 2, "the log was not compacted"
    for offset, key, value in read:
        assert written[offset] == (key, value), f"offset {offset}: {key!r} is not what was written there"
    last_read = {key: offset for offset, key, _ in read}
    assert last_read == latest, "every key's latest record, at its own offset"


def read_kafka_python(bootstrap: str, end: int):
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tp = TopicPartition(TOPIC, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    out = []
    deadline = time.monotonic() + 60
    try:
        while consumer.position(tp) < end and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                out += [(r.offset, r.key, r.value) for r in records]
    finally:
        consumer.close()
    assert time.monotonic() < deadline, f"kafka-python stopped at {out[-1][0] if out else None} of {end}"
    return out


def test_kafka_python_reads_the_compacted_log(compacted):
    broker, written, latest = compacted
    check(read_kafka_python(broker.bootstrap, max(written) + 1), written, latest)


def test_confluent_kafka_reads_the_compacted_log(compacted):
    broker, written, latest = compacted
    check(read_partition_to_end(broker.bootstrap, TOPIC), written, latest)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_reads_the_compacted_log(compacted):
    broker, written, latest = compacted
    completed = subprocess.run(["kcat", "-b", broker.bootstrap, "-C", "-t", TOPIC, "-p", "0", "-o", "beginning", "-e",
                                "-q", "-f", "%o\t%k\t%s\n"], capture_output=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    read = []
    for line in completed.stdout.decode().splitlines():
        offset, key, value = line.split("\t")
        read.append((int(offset), key.encode(), value.encode()))
    check(read, written, latest)


def test_a_keyless_record_is_refused_with_invalid_record(compacted):
    broker, _, _ = compacted
    errors = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    producer.produce(TOPIC, value=b"no key", partition=0, on_delivery=lambda error, _message: errors.append(error))
    producer.flush(30)
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() == KafkaError.INVALID_RECORD, errors[0]
