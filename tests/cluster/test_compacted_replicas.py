"""A compacted topic at replication factor 3 on three broker processes and a real etcd: every replica cleans
its own log (the cleaner decides alone on each broker), yet all of them read back the same latest record per
key at the same offsets, a kill -9 of the leader loses no acknowledged latest value (and the killed leader
recovers its cleaned log and catches up), and a follower that starts on an empty disk copies a leader's already cleaned
log, offset gaps and all.

Records are produced by an idempotent acks=all librdkafka producer, over a small key set with tombstones, in
segments of 8 KiB so the cleaner has many sealed segments to clean; each replica's log is read straight from
its segment files (tests.support.log_files) and the cleanings are counted by each broker's /metrics
(``copyless_partition_cleanings_total``).
"""

from __future__ import annotations

import shutil
from itertools import pairwise

import pytest
from confluent_kafka import Producer

from tests.support.batches import records_of
from tests.support.cluster import Cluster
from tests.support.log_files import read_partition_log
from tests.support.metrics import metrics_address, scrape, value
from tests.support.polling import wait_until
from tests.support.read_back import read_partition_to_end
from tests.support.topics import unique_topic

pytestmark = pytest.mark.timeout(300)

KEYS = 12
VALUE_BYTES = 160
SEGMENT_BYTES = 8 << 10
BROKER_CONFIG = {"log.cleaner.backoff.ms": 100}
TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.bytes": str(SEGMENT_BYTES), "min.cleanable.dirty.ratio": "0.01",
                "min.insync.replicas": "2"}


def key_of(number: int) -> bytes:
    return b"key-%02d" % number


def produce_rounds(bootstrap: str, topic: str, rounds: range, tag: str) -> dict[int, tuple[bytes, bytes | None]]:
    """Every key once a round (some rounds' records are tombstones), plus a key written once every fifth
    round, acks=all and idempotent; returns
    {offset: (key, value)} of what was acknowledged, and fails on any delivery error."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5,
                         "batch.size": 4096, "message.timeout.ms": 30000})
    acknowledged: dict[int, tuple[bytes, bytes | None]] = {}
    errors = []

    def delivered(error, message):
        if error is not None:
            errors.append(error)
        else:
            acknowledged[message.offset()] = (message.key(), message.value())

    for round_number in rounds:
        for number in range(KEYS):
            tombstone = (round_number * 7 + number) % 5 == 0
            label = b"%s:%d:%02d:" % (tag.encode(), round_number, number)
            payload = None if tombstone else label.ljust(VALUE_BYTES, b"v")
            producer.produce(topic, key=key_of(number), value=payload, partition=0, on_delivery=delivered)
        if round_number % 5 == 0:  # a key written once: its record outlives the cleanings, between gaps
            producer.produce(topic, key=b"once-%s-%02d" % (tag.encode(), round_number), value=b"once",
                             partition=0, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:3]
    return acknowledged


def latest_of(records) -> dict[bytes, tuple[int, bytes | None]]:
    latest = {}
    for offset, key, payload in sorted(records, key=lambda record: record[0]):
        latest[key] = (offset, payload)
    return latest


def replica_records(cluster: Cluster, node: int, topic: str,
                    end: int | None = None) -> list[tuple[int, bytes, bytes | None]]:
    """The records of ``node``'s log, read from its files twice until two reads agree (a cleaning's swap
    renames files under a reader) and, with ``end``, hold the offset before it (a rolled segment takes its
    offset name on a worker thread, a moment after the append that filled it)."""
    data_dir = cluster.brokers[node].data_dir

    def stable():
        try:
            first = read_partition_log(data_dir, topic, 0)
            second = read_partition_log(data_dir, topic, 0)
        except FileNotFoundError:
            return None
        if end is not None and not (first and first[-1].last_offset >= end - 1):
            return None
        return first if first == second else None
    batches = wait_until(stable, what=f"a stable read of broker {node}'s log" + (f" up to {end}" if end else ""),
                         timeout_s=30)
    return [(record.offset, record.key, record.value) for record in records_of(b"".join(b.data for b in batches))]


def check_replica(records, written: dict, high_watermark: int) -> dict:
    """Every record of a replica up to the high watermark is the one acknowledged at its offset, in offset
    order; returns its latest record per key."""
    offsets = [offset for offset, _, _ in records]
    assert offsets == sorted(set(offsets)), "offsets not increasing"
    below = [record for record in records if record[0] < high_watermark]
    for offset, key, payload in below:
        assert written.get(offset) == (key, payload), f"offset {offset} holds {key!r}, not what was written there"
    return latest_of(below)


def cleanings(address, topic: str) -> float:
    try:
        return value(scrape(address), "copyless_partition_cleanings_total", topic=topic, partition="0") or 0
    except OSError:
        return 0


def wait_cleaned(cluster: Cluster, addresses: dict, nodes, topic: str, written: dict) -> None:
    """Until each of ``nodes`` counted a cleaning of the partition and its log holds less than half the
    records written."""
    def cleaned():
        return all(cleanings(addresses[node], topic) >= 1 and
                   len(replica_records(cluster, node, topic)) < len(written) / 2 for node in nodes)
    wait_until(cleaned, what=f"brokers {sorted(nodes)} cleaning their replicas", timeout_s=90,
               detail=lambda: {node: (cleanings(addresses[node], topic), len(replica_records(cluster, node, topic)))
                               for node in nodes})


def test_replicas_clean_alone_agree_and_survive_the_leaders_kill(cluster_factory):
    cluster = cluster_factory(3, config=BROKER_CONFIG, extra_args=("--metrics-listen", "127.0.0.1:0"))
    addresses = {node: metrics_address(broker) for node, broker in cluster.brokers.items()}
    topic = unique_topic("compacted")
    cluster.create_topic(topic, 1, 3, configs=TOPIC_CONFIG)
    cluster.wait_for_isr(topic, 1, 3)
    written = produce_rounds(cluster.bootstrap, topic, range(30), "a")
    high_watermark = max(written) + 1
    assert sorted(written) == list(range(high_watermark))
    expected = latest_of((offset, key, payload) for offset, (key, payload) in written.items())
    assert any(payload is None for _, payload in expected.values()), "some key's latest record is a tombstone"

    wait_cleaned(cluster, addresses, cluster.brokers, topic, written)
    cluster.wait_for_isr(topic, 1, 3)
    latest = {}
    for node in cluster.brokers:
        records = replica_records(cluster, node, topic, high_watermark)
        assert records[-1][0] == high_watermark - 1, f"broker {node} ends at {records[-1:]}"
        latest[node] = check_replica(records, written, high_watermark)
    assert latest[1] == latest[2] == latest[3] == expected

    # kill -9 the leader; the next one takes writes, and a reader of the whole topic finds every key's latest
    # acknowledged record (tombstones included) at its own offset.
    old_leader = cluster.leader_of(topic)
    cluster.brokers[old_leader].kill()
    moved = cluster.wait_for_leaders(topic, 1, excluding={old_leader})[0]
    survivors = ",".join(cluster.brokers[n].bootstrap for n in cluster.brokers if n != old_leader)
    more = produce_rounds(survivors, topic, range(30, 40), "b")
    assert min(more) == high_watermark
    written.update(more)
    expected = latest_of((offset, key, payload) for offset, (key, payload) in written.items())
    read = read_partition_to_end(cluster.brokers[moved.leader].bootstrap, topic)
    assert read and read[-1][0] == max(written)
    end = max(written) + 1
    assert check_replica(read, written, end) == expected
    assert len(read) < len(written), "the reader saw every record ever written: nothing was cleaned"

    # The killed leader recovers its cleaned log (gaps and all), truncates to the new leader's epochs, catches
    # up and holds the same latest records.
    cluster.brokers[old_leader].start()
    cluster.wait_for_isr(topic, 1, 3, timeout_s=60)
    records = replica_records(cluster, old_leader, topic, end)
    assert check_replica(records, written, end) == expected


def test_an_empty_follower_copies_a_cleaned_log_with_its_gaps(cluster_factory):
    cluster = cluster_factory(3, config=BROKER_CONFIG, extra_args=("--metrics-listen", "127.0.0.1:0"))
    addresses = {node: metrics_address(broker) for node, broker in cluster.brokers.items()}
    topic = unique_topic("compacted")
    cluster.create_topic(topic, 1, 3, configs=TOPIC_CONFIG, replica_assignment=[[1, 2, 3]])
    cluster.wait_for_isr(topic, 1, 3)
    # Broker 3 loses its disk; 1 and 2 take every round and clean their logs meanwhile.
    three = cluster.brokers[3]
    three.kill()
    shutil.rmtree(three.data_dir)
    three.data_dir.mkdir()
    written = produce_rounds(",".join(cluster.brokers[n].bootstrap for n in (1, 2)), topic, range(30), "a")
    high_watermark = max(written) + 1
    expected = latest_of((offset, key, payload) for offset, (key, payload) in written.items())
    wait_cleaned(cluster, addresses, (1, 2), topic, written)
    leader = cluster.leader_of(topic)
    leader_offsets = [offset for offset, _, _ in replica_records(cluster, leader, topic, high_watermark)]
    assert leader_offsets[0] > 0, "the leader's first records were cleaned away"
    inner_gaps = sum(1 for before, after in pairwise(leader_offsets) if after > before + 1)
    assert inner_gaps >= 3, f"the leader's log has gaps between its records: {leader_offsets}"

    three.start()
    cluster.wait_for_isr(topic, 1, 3, timeout_s=60)
    records = replica_records(cluster, 3, topic, high_watermark)
    assert records[-1][0] == high_watermark - 1
    assert check_replica(records, written, high_watermark) == expected
    assert records[0][0] == leader_offsets[0], "broker 3's log starts where the leader's cleaned one does"
    # It holds the leader's cleaned batches, gaps included, not a history it could not have fetched.
    assert len(records) < len(written) / 2
