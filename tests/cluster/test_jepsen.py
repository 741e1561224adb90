"""A Jepsen-style check of the cluster's one promise: an acknowledged record survives leaders dying, pausing
and being cut off, and is found exactly once, where it was acknowledged (issue: replication, "Tests").

Three brokers and an etcd, each on a host of its own (network namespaces, ``tests.support.netns``); a topic
of 3 partitions, replication factor 3, min.insync.replicas 2. Clients run in the test's own namespace and
reach every host, as clients on a LAN would, even a broker cut off from its peers:

- a stream of records from an idempotent acks=all librdkafka producer, each value a sequence number,
  recording every acknowledgement (partition, offset, value);
- a consumer group of two members (librdkafka and kafka-python, processes of their own) consuming with
  synchronous commits, recording what they consumed and committed.

Meanwhile a nemesis picks, with an RNG seeded from ``COPYLESS_JEPSEN_SEED`` (else at random, and printed so a
failing run can be replayed), a schedule of faults aimed at the leader of a chosen partition, one at a time:

- kill: SIGKILL, then restart it on the same address;
- pause: SIGSTOP for longer than its lease (2 s) plus a margin, so the others replace it, then SIGCONT: the
  zombie wakes still believing it leads, and clients still reach it; it must acknowledge nothing more;
- isolate: cut it off from etcd and both peers (iptables in its namespace), then heal;
- lose-etcd: cut it off from etcd only: its lease runs out and the others elect a new leader while its
  followers still reach it, then heal.

The schedule (faults, targets, durations) depends only on the seed; which broker a fault hits depends on who
leads then. After the last fault everything is healed and every replica is back in the ISR, then:

1. every acknowledged record is in the final log exactly once, at its acknowledged offset, and the
   acknowledged records of a partition are in the order they were sent (each partition read from 0 with a
   plain consumer);
2. the replicas of each partition hold the same bytes (read from their segment files);
3. no two brokers were ever leader of one partition in the same epoch (every broker's "leader at epoch"
   log lines, over all its restarts, for every topic including ``__consumer_offsets``);
4. the group consumed every acknowledged record, everything it consumed is in the final log at the offset
   it was consumed from (it never read above a high watermark that later moved back), and no committed
   offset lies beyond the final log end;
5. followers were served by sendfile: every broker's ``replica_copied_bytes`` is 0.
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tests.support.groups import Member, read_events
from tests.support.log_files import read_partition_log
from tests.support.polling import wait_until
from tests.support.topics import unique_topic

SEED_ENV = "COPYLESS_JEPSEN_SEED"
PARTITIONS = 3
# About 90 records a second: enough to have writes in flight at every fault, little enough to leave the two
# cores to the brokers.
RATE_PER_S = 90
LEASE_S = 2.0  # broker.session.timeout.ms of CLUSTER_TEST_CONFIG
# Each kind of fault twice, plus one drawn at random: 9 faults of 6-12 s each with recovery and calm,
# 70-90 s in all (measured: eight took 50 s with 1-3 s of calm, 65-70 s with 2-5 s).
FAULTS = ("kill", "pause", "isolate", "lose-etcd")
EXTRA_FAULTS = 1

LEADER_LINE = re.compile(r"(?P<topic>\S+)-(?P<partition>\d+): leader at epoch (?P<epoch>\d+) from offset \d+")


@dataclass(frozen=True)
class Fault:
    kind: str
    partition: int  # the fault hits whoever leads this partition when it starts
    hold_s: float  # how long the broker stays down, paused or cut off
    quiet_s: float  # calm after the cluster has leaders again


def schedule_for(seed: int) -> list[Fault]:
    """The nemesis' plan: a function of the seed only."""
    rng = random.Random(seed)
    kinds = [*FAULTS, *FAULTS, *(rng.choice(FAULTS) for _ in range(EXTRA_FAULTS))]
    rng.shuffle(kinds)
    plan = []
    for kind in kinds:
        if kind == "pause":
            hold_s = LEASE_S + rng.uniform(1.5, 4.0)  # past the lease: the others elect a new leader
        elif kind in ("isolate", "lose-etcd"):
            hold_s = rng.uniform(2.5, 6.0)  # sometimes within a lease and a half, mostly past it
        else:
            hold_s = rng.uniform(0.5, 3.0)  # dead before its restart begins
        plan.append(Fault(kind, rng.randrange(PARTITIONS), round(hold_s, 2), round(rng.uniform(2.0, 5.0), 2)))
    return plan


@dataclass
class Ack:
    partition: int
    offset: int
    value: bytes


@dataclass
class AckedStream:
    """Idempotent acks=all records, value = sequence number, to partition ``sequence % 3``, at a steady
    rate from a thread of its own; every delivery report is kept."""

    bootstrap: str
    topic: str
    acked: list[Ack] = field(default_factory=list)
    failed: dict[int, KafkaError] = field(default_factory=dict)
    fatal: list[str] = field(default_factory=list)
    sent: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._errors: list[KafkaError] = []
        self._thread = threading.Thread(target=self._run, name="acked-stream", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=150)
        assert not self._thread.is_alive(), "the producer did not finish flushing"

    def _new_producer(self) -> Producer:
        return Producer({
            "bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            # Long enough to ride out any one fault (a restart under load takes a few seconds, an isolation
            # up to 6 s plus a lease): records fail only if the cluster stays unavailable this long.
            "message.timeout.ms": 60000, "socket.timeout.ms": 10000,
            "topic.metadata.refresh.interval.ms": 2000, "error_cb": self._on_error,
        })

    def _on_error(self, error: KafkaError) -> None:
        # Kept raw and read later: librdkafka may call this while a Python exception is pending, and any
        # call that checks for one (str(), a method) then fails with SystemError.
        self._errors.append(error)

    def _delivered(self, sequence: int):
        def report(error, message) -> None:
            if error is None:
                self.acked.append(Ack(message.partition(), message.offset(), message.value()))
            else:
                self.failed[sequence] = error
        return report

    def _run(self) -> None:
        producer = self._new_producer()
        fatal_seen = 0
        interval_s = 1.0 / RATE_PER_S
        next_send = time.monotonic()
        while not self._stop.is_set():
            try:
                fatal = [error for error in self._errors[fatal_seen:] if error.fatal()]
                fatal_seen = len(self._errors)
                if fatal:
                    raise KafkaException(fatal[0])
                value = b"%09d" % self.sent
                try:
                    producer.produce(self.topic, value, partition=self.sent % PARTITIONS,
                                     on_delivery=self._delivered(self.sent))
                except BufferError:
                    producer.poll(0.1)
                    continue
                self.sent += 1
                producer.poll(0)
                next_send += interval_s
                pause_s = next_send - time.monotonic()
                if pause_s > 0:
                    producer.poll(pause_s)
                else:
                    next_send = time.monotonic()
            except KafkaException as exc:
                # A fatal idempotence error ends that producer (librdkafka raises it from any call): what it
                # still holds fails, and a new producer (a new producer id) goes on with the next values.
                self.fatal.append(str(exc))
                self._retire(producer)
                producer = self._new_producer()
        self._retire(producer, flush_s=120)

    def _retire(self, producer: Producer, flush_s: float = 10) -> None:
        try:
            producer.flush(flush_s)
        except KafkaException as exc:
            self.fatal.append(str(exc))
            try:
                producer.purge()
                producer.flush(10)
            except KafkaException:
                pass


class Nemesis:
    """Runs a schedule against a cluster in a NetLab, keeping a history of what it did."""

    def __init__(self, cluster, lab, etcd_host, topic: str) -> None:
        self.cluster = cluster
        self.lab = lab
        self.etcd_host = etcd_host
        self.topic = topic
        self.history: list[str] = []
        self._started = time.monotonic()

    def note(self, text: str) -> None:
        self.history.append(f"{time.monotonic() - self._started:7.2f}s {text}")

    def leader_of(self, partition: int) -> int | None:
        view = self.cluster.wait_for_leaders(self.topic, PARTITIONS, timeout_s=60)
        return view[partition].leader

    def run(self, plan: list[Fault]) -> None:
        for fault in plan:
            node_id = self.leader_of(fault.partition)
            broker = self.cluster.brokers[node_id]
            self.note(f"{fault.kind} node {node_id} (leader of partition {fault.partition}) for {fault.hold_s} s")
            if fault.kind == "kill":
                broker.kill()
                time.sleep(fault.hold_s)
                broker.start(port=broker.port)
            elif fault.kind == "pause":
                os.kill(broker.pid, signal.SIGSTOP)
                time.sleep(fault.hold_s)
                os.kill(broker.pid, signal.SIGCONT)
            else:
                if fault.kind == "isolate":
                    self.lab.isolate(self.cluster.hosts[node_id])
                else:
                    self.lab.cut(self.cluster.hosts[node_id], self.etcd_host)
                time.sleep(fault.hold_s)
                self.lab.heal()
            self.note(f"{fault.kind} of node {node_id} over")
            try:
                self.cluster.wait_for_leaders(self.topic, PARTITIONS, timeout_s=45)
            except AssertionError:
                self.note("no leader for some partition 45 s after the fault ended; going on")
            time.sleep(fault.quiet_s)

    def heal_everything(self) -> None:
        self.lab.heal()
        for node_id, broker in self.cluster.brokers.items():
            if broker.alive():
                os.kill(broker.pid, signal.SIGCONT)
            else:
                self.note(f"node {node_id} was down at the end: restarting it")
                broker.start(port=broker.port)


def read_partition(bootstrap: str, topic: str, partition: int) -> list[tuple[int, bytes]]:
    """Every record of one partition, from offset 0 to its high watermark, with a plain consumer. Leadership
    may still move (the preferred leader takes its partitions back): errors saying so are retried."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"jepsen-reader-{partition}",
                         "enable.auto.commit": False, "enable.partition.eof": True, "fetch.wait.max.ms": 100})
    try:
        def high_watermark():
            try:
                return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            except KafkaException as exc:
                if not exc.args[0].retriable():
                    raise
                return None
        _low, high = wait_until(high_watermark, what=f"partition {partition}'s high watermark", timeout_s=60)
        consumer.assign([TopicPartition(topic, partition, 0)])
        out: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 60
        while (not out or out[-1][0] < high - 1) and high > 0 and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=1000, timeout=0.5):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF or error.retriable():
                        continue
                    raise AssertionError(f"reading partition {partition}: {error}")
                out.append((message.offset(), message.value()))
        return out
    finally:
        consumer.close()


def leaders_by_epoch(log_texts: dict[int, str]) -> dict[tuple[str, int, int], set[int]]:
    """(topic, partition, epoch) -> the brokers that logged becoming its leader."""
    leaders: dict[tuple[str, int, int], set[int]] = defaultdict(set)
    for node_id, text in log_texts.items():
        for match in LEADER_LINE.finditer(text):
            leaders[(match["topic"], int(match["partition"]), int(match["epoch"]))].add(node_id)
    return leaders


@contextmanager
def replayable(seed: int, nemesis: Nemesis):
    """Any failure inside names the seed and what the nemesis did."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n\nreplay with {SEED_ENV}={seed}; the nemesis:\n" + "\n".join(nemesis.history)) from None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_acknowledged_records_survive_kills_pauses_and_partitions(net_cluster_factory, tmp_path):
    seed = int(os.environ.get(SEED_ENV) or random.randrange(10**6))
    print(f"nemesis seed {seed} (replay: {SEED_ENV}={seed})")
    plan = schedule_for(seed)
    cluster, lab, etcd_host = net_cluster_factory(3)
    topic = unique_topic("jepsen")
    cluster.create_topic(topic, PARTITIONS, 3, configs={"min.insync.replicas": "2"})
    cluster.wait_for_isr(topic, PARTITIONS, 3)
    nemesis = Nemesis(cluster, lab, etcd_host, topic)
    every_broker = ",".join(b.bootstrap for b in cluster.brokers.values())
    group = f"jepsen-{seed}"
    members = [Member(client, every_broker, topic, group, tmp_path / f"{client}.events", 10000)
               for client in ("confluent", "kafka-python")]
    stream = AckedStream(every_broker, topic)
    try:
        with replayable(seed, nemesis):
            try:
                stream.start()
                time.sleep(3)  # writes flowing and the group formed before the first fault
                nemesis.run(plan)
            finally:
                nemesis.heal_everything()
                stream.stop()
            nemesis.note(f"stream stopped: {stream.sent} sent, {len(stream.acked)} acknowledged, "
                         f"{len(stream.failed)} failed, fatal errors: {stream.fatal}")
            print("\n".join(nemesis.history))
            cluster.wait_for_isr(topic, PARTITIONS, 3, timeout_s=120)
            assert len(stream.acked) > RATE_PER_S * 20, "too few acknowledged records for the test to mean much"

            # 1. Every acknowledged record, once, at its offset, in sending order.
            final = {p: read_partition(every_broker, topic, p) for p in range(PARTITIONS)}
            for p, records in final.items():
                assert [offset for offset, _v in records] == list(range(len(records))), f"partition {p} has gaps"
            at = {p: dict(records) for p, records in final.items()}
            lost = [a for a in stream.acked if at[a.partition].get(a.offset) != a.value]
            assert not lost, (f"{len(lost)} acknowledged records not at their offset, the first: {lost[:5]} "
                              f"(found there: {[at[a.partition].get(a.offset) for a in lost[:5]]})")
            counts = Counter(value for records in final.values() for _offset, value in records)
            duplicated = sorted(a.value for a in stream.acked if counts[a.value] > 1)
            assert not duplicated, f"acknowledged records stored more than once: {duplicated[:10]}"
            for p in range(PARTITIONS):
                acked = sorted((int(a.value), a.offset) for a in stream.acked if a.partition == p)
                offsets = [offset for _sequence, offset in acked]
                assert offsets == sorted(offsets), f"partition {p}: acknowledged records out of sending order"

            # 2. The replicas agree byte for byte, once every log end is the same.
            def replica_logs(p):
                logs = {n: b"".join(b.data for b in read_partition_log(broker.data_dir, topic, p))
                        for n, broker in cluster.brokers.items()}
                return logs if len(set(logs.values())) == 1 else None
            for p in range(PARTITIONS):
                wait_until(lambda: replica_logs(p), what=f"the three replicas of partition {p} to hold the same bytes",
                           timeout_s=60)

            # 3. One leader per (partition, epoch), over every broker's whole log.
            leaders = leaders_by_epoch({n: b.log_text() for n, b in cluster.brokers.items()})
            assert any(key[0] == topic for key in leaders), "no 'leader at epoch' line for the topic in any log"
            shared = {key: nodes for key, nodes in leaders.items() if len(nodes) > 1}
            assert not shared, f"two brokers led one partition in one epoch: {shared}"

            # 4. The group: everything consumed, nothing consumed that the log later lost, commits within the log.
            acked_values = {a.value.decode() for a in stream.acked}

            def consumed_everything():
                seen = {e["value"] for e in read_events([m.events for m in members]) if e["event"] == "consumed"}
                return acked_values <= seen
            wait_until(consumed_everything, what="the group to consume every acknowledged record", timeout_s=120,
                       detail=lambda: "\n".join(m.log_text() for m in members))
            for member in members:
                assert member.process.poll() is None, f"group member {member.client} died:\n{member.log_text()}"
                member.leave()
            events = read_events([m.events for m in members])
            phantom = [e for e in events if e["event"] == "consumed"
                       and at[e["partition"]].get(e["offset"]) != e["value"].encode()]
            assert not phantom, f"{len(phantom)} records consumed that are not in the final log there: {phantom[:5]}"
            beyond = [(e["client"], p, offset) for e in events if e["event"] == "committed"
                      for p, offset in e["offsets"].items() if offset > len(final[int(p)])]
            assert not beyond, f"commits past the final log end: {beyond[:10]}"

            # 5. Followers were served by sendfile.
            stats = {n: b.stats_json() for n, b in cluster.brokers.items()}
            assert {n: s["replica_copied_bytes"] for n, s in stats.items()} == {n: 0 for n in stats}
            assert sum(s["replica_sendfile_bytes"] for s in stats.values()) > 0
    finally:
        for member in members:
            member.stop_quietly()
