"""Transactions across partitions stay atomic through a broker kill -9 (the Jepsen check of Kafka's
transactions, on one node): two transactional producers each run transactions writing one record to each of
three partitions, committing or aborting at random, while the broker is killed with -9 and restarted once in
the middle. Then a read_committed consumer reads everything:

- no record of a transaction the client aborted is ever read;
- a transaction the client saw committed is read whole, on every partition;
- a transaction whose outcome the client never learned (the kill hit it) is read whole or not at all;
- no record is read twice.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaException, Producer  # noqa: E402

from tests.support.polling import wait_until  # noqa: E402
from tests.support.read_back import read_topic_to_end  # noqa: E402
from tests.support.topics import create_topic, unique_topic  # noqa: E402

pytestmark = pytest.mark.timeout(240)

PARTITIONS = 3
TRANSACTIONS = 30  # per producer


def _run_producer(bootstrap: str, topic: str, name: str, seed: int, outcomes: dict,
                  killed: threading.Event) -> None:
    rng = random.Random(seed)
    tid = unique_topic(name)

    def fresh() -> Producer:
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "transaction.timeout.ms": 30_000,
                             "linger.ms": 2, "message.timeout.ms": 30_000})
        producer.init_transactions(60)
        return producer

    producer = fresh()
    for number in range(TRANSACTIONS):
        txn = f"{name}-{number}"
        commit = rng.random() < 0.6
        outcomes[txn] = "unknown"
        try:
            producer.begin_transaction()
            for partition in range(PARTITIONS):
                producer.produce(topic, f"{txn}-p{partition}".encode(), partition=partition)
            if commit:
                producer.commit_transaction(60)
                outcomes[txn] = "committed"
            else:
                producer.flush(60)
                producer.abort_transaction(60)
                outcomes[txn] = "aborted"
        except KafkaException as exc:
            error = exc.args[0]
            if error.txn_requires_abort():
                try:
                    producer.abort_transaction(60)
                    outcomes[txn] = "aborted"
                except KafkaException:
                    producer = fresh()
            else:
                # Fatal, or retriable and retried to its timeout: start over as a new incarnation of the id
                # (fencing this one; its transaction is aborted by the coordinator if still open).
                producer = fresh()
        if number == TRANSACTIONS // 2:
            killed.wait(60)  # the second half runs after the broker's restart
        time.sleep(0.01)
    producer.flush(30)


def test_transactions_stay_atomic_through_a_broker_kill(broker_factory):
    broker = broker_factory()
    topic = unique_topic("atomic")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    outcomes: dict[str, str] = {}
    killed = threading.Event()
    threads = [threading.Thread(target=_run_producer, args=(broker.bootstrap, topic, name, seed, outcomes, killed),
                                daemon=True)
               for name, seed in (("alpha", 1), ("beta", 2))]
    for thread in threads:
        thread.start()
    # Killed while both producers are in their first half (past their first transactions, before their pause).
    wait_until(lambda: len(outcomes) >= 6, what="the producers under way", timeout_s=60, interval_s=0.005)
    broker.restart("kill")
    killed.set()
    for thread in threads:
        thread.join(180)
        assert not thread.is_alive(), "a producer did not finish"

    read: dict[str, list[int]] = defaultdict(list)
    for value in read_topic_to_end(broker.bootstrap, topic, "read_committed", PARTITIONS, timeout_s=60,
                                   errors_retried=True):
        txn, _, partition = value.rpartition("-p")
        read[txn].append(int(partition))

    assert set(outcomes) == {f"{n}-{i}" for n in ("alpha", "beta") for i in range(TRANSACTIONS)}
    for txn, partitions in read.items():
        assert sorted(partitions) == list(range(PARTITIONS)), f"{txn} read torn or twice: {partitions}"
        assert outcomes.get(txn) != "aborted", f"{txn} was aborted and read"
    for txn, outcome in outcomes.items():
        if outcome == "committed":
            assert txn in read, f"{txn} was committed and not read"
    counts = defaultdict(int)
    for outcome in outcomes.values():
        counts[outcome] += 1
    # Both halves ran: transactions committed before and after the kill.
    assert counts["committed"] >= TRANSACTIONS // 2, counts
    assert any(outcomes[f"{n}-{i}"] == "committed"
               for n in ("alpha", "beta") for i in range(TRANSACTIONS // 2 + 1, TRANSACTIONS)), outcomes
