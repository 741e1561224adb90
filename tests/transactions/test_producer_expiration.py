"""``producer.id.expiration.ms`` on a real broker with librdkafka (confluent-kafka) producers: an idle
idempotent producer's state is forgotten (the ``partition_producers`` metric, and the snapshot a graceful
shutdown writes), a transactional producer with a transaction open is kept however old its batches are
(across a restart too), its commit marker renews it and it expires after that, and a producer whose state
expired goes on producing (its next sequence is accepted as a new producer's would be)."""

from __future__ import annotations

import re
import time

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from copyless.broker import producer_snapshot  # noqa: E402
from tests.support.metrics import scrape, value  # noqa: E402
from tests.support.polling import wait_until  # noqa: E402
from tests.support.topics import unique_topic  # noqa: E402

pytestmark = pytest.mark.timeout(180)

EXPIRATION_MS = 3000
_METRICS_LINE = re.compile(r"serving Prometheus metrics on http://([\d.]+):(\d+)/metrics")


def _metrics_address(proc, runs: int) -> tuple[str, int]:
    """The metrics address of the broker's ``runs``-th start (the log file spans restarts)."""
    found = wait_until(lambda: (lines := _METRICS_LINE.findall(proc.log_text()))[runs - 1:] and lines[runs - 1],
                       what="the metrics endpoint's log line", timeout_s=30)
    return found[0], int(found[1])


def _producers(address, topic: str) -> float | None:
    return value(scrape(address), "copyless_partition_producers", topic=topic, partition="0")


def _latest_snapshot(data_dir, topic: str):
    directory = data_dir / f"{topic}-0"
    return producer_snapshot.read(directory, producer_snapshot.snapshot_offsets(directory)[-1])


def _send(producer: Producer, topic: str, value: bytes) -> None:
    errors = []
    producer.produce(topic, value, partition=0, on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(30) == 0
    assert errors == [None]


def test_idle_producers_expire_and_one_with_an_open_transaction_does_not(broker_factory):
    broker = broker_factory(config={"producer.id.expiration.ms": EXPIRATION_MS,
                                    "producer.id.expiration.check.interval.ms": 200},
                            extra_args=("--metrics-listen", "127.0.0.1:0"))
    address = _metrics_address(broker, 1)
    idle, busy = unique_topic("idle"), unique_topic("busy")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(idle, 1, 1), NewTopic(busy, 1, 1)]).values():
        future.result(30)
    transactional = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": unique_topic("tid"),
                              "transaction.timeout.ms": 120_000})
    transactional.init_transactions(30)
    transactional.begin_transaction()
    _send(transactional, busy, b"open")
    # The idempotent producer writes after the transactional one: once it has expired, so has the open
    # transaction's batch by age.
    idempotent = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    _send(idempotent, idle, b"first")
    assert (_producers(address, idle), _producers(address, busy)) == (1, 1)

    wait_until(lambda: _producers(address, idle) == 0, what="the idle producer expired", timeout_s=30)
    assert _producers(address, busy) == 1

    # A graceful restart: the shutdown's snapshots hold what the partitions kept, and the start loads them.
    broker.restart("graceful")
    address = _metrics_address(broker, 2)
    assert _latest_snapshot(broker.data_dir, idle).producers == ()
    kept = _latest_snapshot(broker.data_dir, busy)
    assert [p.producer_id for p in kept.producers] == [pid for pid, _ in kept.ongoing] and len(kept.ongoing) == 1
    assert time.time() * 1000 - kept.producers[0].last_timestamp >= EXPIRATION_MS
    time.sleep(1.0)  # several checks after the start
    assert (_producers(address, idle), _producers(address, busy)) == (0, 1)

    # The commit marker closes the transaction and renews the producer; idle again, it expires.
    transactional.commit_transaction(30)
    assert _producers(address, busy) == 1
    wait_until(lambda: _producers(address, busy) == 0, what="the committed producer expired", timeout_s=30)

    # The expired idempotent producer goes on at its next sequence: accepted, and known again.
    _send(idempotent, idle, b"second")
    assert _producers(address, idle) == 1
