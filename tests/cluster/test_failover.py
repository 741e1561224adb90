"""Failover, seen from outside with real processes and real clients (issue: replication, "Failover"):

- a killed leader's partitions move to the first live in-sync replica in assignment order, at the next leader
  epoch, while the partitions it only followed keep their leader and epoch and drop it from their ISR; a
  produce to a follower is NOT_LEADER_OR_FOLLOWER; no broker ever answers Metadata with a lower leader epoch
  than it answered before (asked over and over, from every broker, all through the failover);
- the killed broker, restarted, cuts the tail it alone held by epoch, catches up, rejoins the ISR, and the
  automatic leader rebalance gives it its preferred partitions back (no ElectLeaders request is sent);
- a partition with no live in-sync replica has no leader (-1, LEADER_NOT_AVAILABLE) while an out-of-sync
  replica is alive, unless the topic has ``unclean.leader.election.enable``: then that replica leads (and
  the records it lacked are gone, which is why it is off by default), and the in-sync replicas that come back
  truncate to its log;
- the group coordinator moves with its ``__consumer_offsets`` partition: a kafka-python group keeps
  consuming and committing through the coordinator's kill -9, every commit it saw acknowledged is in every
  later OffsetFetch answer, brokers meanwhile answer only COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE
  or NOT_COORDINATOR, and the restarted old coordinator answers NOT_COORDINATOR;
- retention on a leader stops at the high watermark, so a follower that is in the ISR but behind is never
  forced to restart its log above records it never received.

One cluster of three brokers serves the module (each start is three processes and an election); each test
works on topics of its own and leaves every broker running. Leases are 3 s here rather than the suite's 2 s,
so the tests that pause followers for about a second keep them registered on a loaded machine.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from itertools import pairwise

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v2 import request as find_coordinator_v2
from kio.schema.offset_fetch.v5 import request as offset_fetch_v5

from tests.support.batches import build_batch, records_of
from tests.support.cluster import Cluster, read_metadata
from tests.support.groups import Member, read_events
from tests.support.kio_requests import KafkaWire, list_offsets, produce
from tests.support.log_files import read_partition_log
from tests.support.polling import holds_for, wait_until
from tests.support.topics import unique_topic

FAILOVER_CONFIG = {
    "broker.session.timeout.ms": 3000,
    "log.segment.bytes": 1 << 20,
    # A parked follower fetch is answered within 0.2 s, so a paused follower has none outstanding soon.
    "replica.fetch.wait.max.ms": 200,
    "log.retention.check.interval.ms": 200,
}
LEASE_S = 3.0
OFFSETS_TOPIC = "__consumer_offsets"


@pytest.fixture(scope="module")
def cluster(etcd_server, tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("failover-cluster"), etcd_server, 3, config=FAILOVER_CONFIG)
    try:
        cluster.start()  # inside the try: brokers already started are stopped if a later one fails to
        yield cluster
    finally:
        for broker in cluster.brokers.values():
            if broker.alive():
                os.kill(broker.pid, signal.SIGCONT)
        cluster.stop()


# --- helpers ---------------------------------------------------------------------------------------------------

def whole(cluster: Cluster) -> None:
    """Every broker running and registered (a test that failed half-way may have left one down)."""
    for broker in cluster.brokers.values():
        if not broker.alive():
            broker.start()
    wait_until(lambda: len(cluster.metadata().brokers) == len(cluster.brokers), what="every broker registered",
               timeout_s=30)


def create_assigned(cluster: Cluster, name: str, assignment: list[list[int]], **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    topic = NewTopic(name, len(assignment), replica_assignment=assignment, config=dict(configs))
    admin.create_topics([topic], operation_timeout=20)[name].result(30)
    cluster.wait_for_isr(name, len(assignment), len(assignment[0]))


def acks_all(bootstrap: str, topic: str, partition: int, values: list[bytes]) -> list[int]:
    """An idempotent acks=all librdkafka producer; every value must be acknowledged. Returns the offsets."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "message.timeout.ms": 30000})
    results: dict[int, object] = {}
    for index, value in enumerate(values):
        producer.produce(topic, value, partition=partition,
                         on_delivery=lambda err, msg, i=index: results.__setitem__(i, err or msg.offset()))
    assert producer.flush(60) == 0, "acks=all records still undelivered after 60 s"
    errors = {i: r for i, r in results.items() if not isinstance(r, int)}
    assert not errors, f"{len(errors)} acks=all records not acknowledged, the first: {next(iter(errors.items()))}"
    return [results[i] for i in range(len(values))]


def read_values(bootstrap: str, topic: str, partition: int, end: int) -> list[tuple[int, bytes]]:
    """(offset, value) of every record below ``end``, read by a librdkafka consumer."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, partition, 0)])
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 60
    try:
        while (not out or out[-1][0] < end - 1) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or (message.error() and message.error().code() == KafkaError._PARTITION_EOF):
                continue
            assert not message.error(), message.error()
            out.append((message.offset(), message.value()))
    finally:
        consumer.close()
    return out


def raw_produce(broker, topic: str, partition: int, values: list[bytes], acks: int):
    """One batch by a raw Produce v8: the partition's answer (error_code, base_offset)."""
    wire = KafkaWire(broker.port, host=broker.host)
    try:
        response = produce(wire, topic, {partition: build_batch(values)}, acks=acks, timeout_ms=2000)
    finally:
        wire.close()
    return response.responses[0].partition_responses[0]


def offsets_of(broker, topic: str, partition: int) -> tuple[int, int]:
    """(log start, high watermark) by ListOffsets earliest and latest."""
    wire = KafkaWire(broker.port, host=broker.host)
    try:
        earliest = list_offsets(wire, topic, -2, partition)
        latest = list_offsets(wire, topic, -1, partition)
    finally:
        wire.close()
    assert earliest.error_code == ErrorCode.none and latest.error_code == ErrorCode.none, (earliest, latest)
    return earliest.offset, latest.offset


def log_batches(cluster: Cluster, node_id: int, topic: str, partition: int = 0):
    for _ in range(20):
        try:
            return read_partition_log(cluster.brokers[node_id].data_dir, topic, partition)
        except FileNotFoundError:
            time.sleep(0.05)  # retention retired a segment between the directory listing and its read
    return read_partition_log(cluster.brokers[node_id].data_dir, topic, partition)


def log_end(cluster: Cluster, node_id: int, topic: str, partition: int = 0) -> int:
    batches = log_batches(cluster, node_id, topic, partition)
    return batches[-1].last_offset + 1 if batches else 0


def partition_view(cluster: Cluster, topic: str, partition: int = 0, via: int | None = None):
    try:
        return cluster.metadata([topic], via=via).topics[topic][partition]
    except (OSError, KeyError):
        return None


@contextmanager
def paused(cluster: Cluster, node_ids: list[int]):
    """SIGSTOP the brokers for the block (SIGCONT always follows)."""
    for node_id in node_ids:
        os.kill(cluster.brokers[node_id].pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for node_id in node_ids:
            os.kill(cluster.brokers[node_id].pid, signal.SIGCONT)


def start_all(brokers) -> None:
    """Start brokers at once (each start waits for its startup line)."""
    threads = [threading.Thread(target=broker.start) for broker in brokers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(broker.alive() for broker in brokers)


class EpochWatcher:
    """Asks every running broker for Metadata over and over (a thread) and keeps, per (broker, topic,
    partition), the leader epochs it answered in order; ``check`` fails if any went down."""

    def __init__(self, cluster: Cluster, topics: list[str]) -> None:
        self.cluster = cluster
        self.topics = topics
        self.epochs: dict[tuple[int, str, int], list[int]] = defaultdict(list)
        self.answers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="epoch-watcher", daemon=True)

    def __enter__(self) -> EpochWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            for node_id, broker in list(self.cluster.brokers.items()):
                if not broker.alive():
                    continue
                try:
                    view = read_metadata(broker.bootstrap, self.topics, timeout_s=2.0)
                except Exception:  # down, starting, paused: nothing to record
                    continue
                self.answers += 1
                for topic, partitions in view.topics.items():
                    for index, partition in partitions.items():
                        self.epochs[(node_id, topic, index)].append(partition.leader_epoch)
            self._stop.wait(0.05)

    def check(self) -> None:
        for key, epochs in self.epochs.items():
            lower = [(before, after) for before, after in pairwise(epochs) if after < before]
            assert not lower, f"broker {key[0]} answered a lower leader epoch for {key[1]}-{key[2]}: {lower[:3]}"

    def seen(self, node_id: int, topic: str, partition: int) -> set[int]:
        return set(self.epochs.get((node_id, topic, partition), ()))


# --- 1 and 2: a killed leader, its partitions' new leaders, its restart and its partitions back ---------------

def test_a_killed_leader_moves_to_the_first_live_isr_replica_and_gets_its_partitions_back(cluster):
    whole(cluster)
    topic = unique_topic("moves")
    # Assignment order differs from node-id order on purpose: partition 0 must go to 3, not to 2.
    assignment = [[1, 3, 2], [2, 1, 3], [3, 2, 1]]
    create_assigned(cluster, topic, assignment, **{"min.insync.replicas": "2"})
    before = cluster.wait_for_isr(topic, 3, 3)
    assert [before[p].leader for p in range(3)] == [1, 2, 3]
    victim = cluster.brokers[1]

    with EpochWatcher(cluster, [topic]) as watcher:
        committed = [f"committed-{i}".encode() for i in range(200)]
        assert acks_all(cluster.bootstrap, topic, 0, committed) == list(range(200))
        wait_until(lambda: all(log_end(cluster, n, topic) == 200 for n in (1, 2, 3)),
                   what="every replica of partition 0 holding the acknowledged records", timeout_s=30)

        # A tail only the victim holds: its followers are paused (their parked fetches answered first), it
        # takes acks=1 writes, and it dies before they wake up.
        with paused(cluster, [2, 3]):
            time.sleep(0.4)
            answer = raw_produce(victim, topic, 0, [f"tail-{i}".encode() for i in range(7)], acks=1)
            assert answer.error_code == ErrorCode.none and answer.base_offset == 200
            victim.kill()
        assert log_end(cluster, 1, topic) == 207
        assert log_end(cluster, 2, topic) == 200 and log_end(cluster, 3, topic) == 200

        # 1. Partition 0 (led by the victim) moves to 3, the first live ISR member in its assignment
        #    [1, 3, 2], one epoch up; the partitions it followed keep leader and epoch, without it in the ISR.
        def moved():
            view = cluster.metadata([topic]).topics[topic]
            if view[0].leader == 3 and all(1 not in view[p].isr for p in range(3)):
                return view
            return None
        after = wait_until(moved, what="partition 0 led by broker 3 and broker 1 out of every ISR",
                           timeout_s=LEASE_S + 20)
        assert after[0].leader_epoch == before[0].leader_epoch + 1 and set(after[0].isr) == {2, 3}
        for p in (1, 2):
            assert (after[p].leader, after[p].leader_epoch) == (before[p].leader, before[p].leader_epoch)
            assert set(after[p].isr) == {2, 3}

        # 5. A produce to a follower is refused, and nothing is appended there.
        for acks in (1, -1):
            refused = raw_produce(cluster.brokers[2], topic, 0, [b"to-a-follower"], acks=acks)
            assert refused.error_code == ErrorCode.not_leader_or_follower
        new_records = [f"after-{i}".encode() for i in range(100)]
        assert acks_all(cluster.bootstrap, topic, 0, new_records) == list(range(200, 300))

        # 2. The victim comes back: it cuts its tail where its epoch ends on the new leader, copies the new
        #    leader's records, rejoins every ISR ...
        victim.start()
        cluster.wait_for_isr(topic, 3, 3)
        wait_until(lambda: all(log_end(cluster, n, topic) == 300 for n in (1, 2, 3)),
                   what="every replica of partition 0 ending at 300", timeout_s=30)
        cuts = re.findall(rf"{re.escape(topic)}-0: truncating from (\d+) to (\d+)", victim.log_text())
        assert cuts == [("207", "200")], f"truncations logged by the restarted broker: {cuts}"
        logs = {n: b"".join(b.data for b in log_batches(cluster, n, topic)) for n in (1, 2, 3)}
        assert logs[1] == logs[3] == logs[2], "the replicas' logs differ"
        assert [r.value for r in records_of(logs[1])] == committed + new_records

        # ... and the automatic leader rebalance (no ElectLeaders request here) hands partition 0 back to
        #    its preferred replica, one epoch further.
        back = wait_until(lambda: (lambda v: v if v is not None and v.leader == 1 else None)(
            partition_view(cluster, topic, 0)), what="partition 0 led by its preferred replica again",
            timeout_s=30)
        assert back.leader_epoch == after[0].leader_epoch + 1
        assert read_values(cluster.bootstrap, topic, 0, 300) == list(enumerate(committed + new_records))
        # The watcher asks each broker in turn, up to 2 s an answer on a loaded machine: it may not have asked 2
        # and 3 since the hand-back yet.
        wait_until(lambda: all(back.leader_epoch in watcher.seen(n, topic, 0) for n in (2, 3)),
                   what="brokers 2 and 3 answering the hand-back's epoch", timeout_s=20)

    # 5. Every broker's answers, all along, never went back to an older epoch; and the watcher did see the
    #    epochs move on each broker that was up throughout.
    watcher.check()
    for node_id in (2, 3):
        assert {before[0].leader_epoch, after[0].leader_epoch, back.leader_epoch} <= watcher.seen(node_id, topic, 0)


# --- 1: no live in-sync replica: no leader, unless unclean election is allowed ------------------------------

def test_no_live_in_sync_replica_means_no_leader_unless_unclean_election_is_enabled(cluster):
    whole(cluster)
    clean, unclean = unique_topic("clean"), unique_topic("unclean")
    create_assigned(cluster, clean, [[1, 2, 3]], **{"min.insync.replicas": "1"})
    create_assigned(cluster, unclean, [[1, 2, 3]], **{"min.insync.replicas": "1",
                                                         "unclean.leader.election.enable": "true"})
    first = [f"first-{i}".encode() for i in range(50)]
    while_down = [f"while-3-down-{i}".encode() for i in range(50)]
    for topic in (clean, unclean):
        assert acks_all(cluster.bootstrap, topic, 0, first) == list(range(50))

    # Broker 3 dies and leaves both ISRs; records are acknowledged by 1 and 2 alone.
    cluster.brokers[3].kill()
    for topic in (clean, unclean):
        wait_until(lambda t=topic: (lambda v: v is not None and set(v.isr) == {1, 2})(partition_view(cluster, t)),
                   what=f"{topic}'s ISR without broker 3", timeout_s=LEASE_S + 20)
        assert acks_all(cluster.bootstrap, topic, 0, while_down) == list(range(50, 100))

    # Then 2 dies (and leaves both ISRs: 1 alone holds every acknowledged record), then 1, and 3 comes back:
    # the only live replica, and out of sync. (One at a time: two killed together leave the ISR to the order
    # in which their leases happen to expire.)
    cluster.brokers[2].kill()
    for topic in (clean, unclean):
        wait_until(lambda t=topic: (lambda v: v is not None and v.isr == (1,))(partition_view(cluster, t)),
                   what=f"{topic}'s ISR down to broker 1", timeout_s=LEASE_S + 20)
    epoch_before = {topic: partition_view(cluster, topic).leader_epoch for topic in (clean, unclean)}
    cluster.brokers[1].kill()
    cluster.brokers[3].start()
    survivor = cluster.brokers[3]

    # Unclean: 3 leads, alone, at a new epoch; the 50 records it never had are gone.
    elected = wait_until(lambda: (lambda v: v if v is not None and v.leader == 3 else None)(
        partition_view(cluster, unclean, via=3)), what="the out-of-sync replica elected (unclean)",
        timeout_s=LEASE_S + 30)
    assert elected.isr == (3,) and elected.leader_epoch > epoch_before[unclean]
    after_unclean = [f"unclean-{i}".encode() for i in range(20)]
    assert acks_all(survivor.bootstrap, unclean, 0, after_unclean) == list(range(50, 70))

    def leaderless_for(seconds: float, live: set[int]) -> None:
        """Clean: no leader, LEADER_NOT_AVAILABLE, the ISR kept (watched across more than one leader-rebalance
        interval), and 3 refuses writes for it."""
        wait_until(lambda: set(cluster.metadata(via=3).brokers) == live, what=f"brokers {sorted(live)} live",
                   timeout_s=LEASE_S + 30)

        def leaderless():
            view = partition_view(cluster, clean, via=3)
            assert view is not None and view.leader == -1 and view.error_code == ErrorCode.leader_not_available, view
            assert view.isr == (1,), view

        holds_for(leaderless, seconds=seconds)
        refused = raw_produce(survivor, clean, 0, [b"no-leader"], acks=1)
        assert refused.error_code == ErrorCode.not_leader_or_follower

    leaderless_for(4.0, {3})

    # 2 comes back, out of sync in both: the clean partition still has no leader; in the unclean one it
    # follows 3 and cuts the records 3 never had.
    cluster.brokers[2].start()
    leaderless_for(3.5, {2, 3})
    # 1, the last in-sync replica, comes back: it leads the clean partition with every acknowledged record,
    # and cuts the unclean one's records too.
    cluster.brokers[1].start()
    led = wait_until(lambda: (lambda v: v if v is not None and v.leader == 1 else None)(
        partition_view(cluster, clean, via=3)), what="the clean partition led by broker 1", timeout_s=30)
    assert led.leader_epoch > epoch_before[clean]
    assert read_values(cluster.bootstrap, clean, 0, 100) == list(enumerate(first + while_down))
    for topic in (clean, unclean):
        cluster.wait_for_isr(topic, 1, 3)
    wait_until(lambda: all(log_end(cluster, n, unclean) == 70 for n in (1, 2, 3)),
               what="every replica of the unclean partition ending at 70", timeout_s=30)
    for node_id in (1, 2):
        cuts = re.findall(rf"{re.escape(unclean)}-0: truncating from (\d+) to (\d+)",
                          cluster.brokers[node_id].log_text())
        assert cuts == [("100", "50")], f"broker {node_id}'s truncations: {cuts}"
    logs = {n: b"".join(b.data for b in log_batches(cluster, n, unclean)) for n in (1, 2, 3)}
    assert logs[1] == logs[2] == logs[3]
    assert [r.value for r in records_of(logs[3])] == first + after_unclean
    # The clean partition lost nothing, on any replica.
    wait_until(lambda: all(log_end(cluster, n, clean) == 100 for n in (1, 2, 3)),
               what="every replica of the clean partition ending at 100", timeout_s=30)
    logs = {n: b"".join(b.data for b in log_batches(cluster, n, clean)) for n in (1, 2, 3)}
    assert logs[1] == logs[2] == logs[3]
    assert [r.value for r in records_of(logs[3])] == first + while_down


# --- 3: the group coordinator moves with its __consumer_offsets partition -------------------------------------

def find_coordinator(broker, group: str) -> tuple[int, int]:
    wire = KafkaWire(broker.port, host=broker.host)
    try:
        response = wire.request(find_coordinator_v2.FindCoordinatorRequest(key=group, key_type=0))
    finally:
        wire.close()
    return response.error_code, response.node_id


class OffsetProbe:
    """Asks every running broker for a group's committed offsets over and over (OffsetFetch v5, a thread),
    recording (monotonic time sent, node, error code, {partition: offset})."""

    def __init__(self, cluster: Cluster, group: str, topic: str, partitions: int) -> None:
        self.cluster = cluster
        self.request = offset_fetch_v5.OffsetFetchRequest(group_id=group, topics=(
            offset_fetch_v5.OffsetFetchRequestTopic(name=topic, partition_indexes=tuple(range(partitions))),))
        self.answers: list[tuple[float, int, int, dict[int, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="offset-probe", daemon=True)

    def __enter__(self) -> OffsetProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(30)

    def ask(self, node_id: int) -> tuple[float, int, int, dict[int, int]]:
        broker = self.cluster.brokers[node_id]
        sent = time.monotonic()
        wire = KafkaWire(broker.port, host=broker.host)
        try:
            wire.sock.settimeout(5)
            response = wire.request(self.request)
        finally:
            wire.close()
        code = response.error_code
        offsets = {}
        for topic in response.topics:
            for partition in topic.partitions:
                code = code or partition.error_code
                offsets[partition.partition_index] = partition.committed_offset
        answer = (sent, node_id, code, offsets)
        self.answers.append(answer)
        return answer

    def _run(self) -> None:
        while not self._stop.is_set():
            for node_id, broker in list(self.cluster.brokers.items()):
                if broker.alive():
                    try:
                        self.ask(node_id)
                    except Exception:  # down, starting: nothing to record
                        pass
            self._stop.wait(0.1)


def test_the_group_coordinator_moves_with_its_offsets_partition_and_no_acknowledged_commit_is_lost(cluster,
                                                                                                   tmp_path):
    whole(cluster)
    topic, group = unique_topic("grouped"), unique_topic("group")
    create_assigned(cluster, topic, [[1, 2, 3], [2, 3, 1], [3, 1, 2]], **{"min.insync.replicas": "2"})
    per_partition = 100
    produced = set()

    def produce_round(tag: str) -> None:
        for partition in range(3):
            values = [f"{tag}-{partition}-{i}".encode() for i in range(per_partition)]
            acks_all(cluster.bootstrap, topic, partition, values)
            produced.update(v.decode() for v in values)

    produce_round("first")

    def coordinator():
        code, node_id = find_coordinator(cluster.live()[0], group)
        return node_id if code == ErrorCode.none else None
    old = wait_until(coordinator, what="a coordinator for the group", timeout_s=30)
    cluster.wait_for_isr(OFFSETS_TOPIC, 4, 3)

    events = tmp_path / "member.jsonl"
    member = Member("kafka-python", cluster.bootstrap, topic, group, events, 6000)
    try:
        with OffsetProbe(cluster, group, topic, 3) as probe:
            def committed_up_to(end: int, since: float = 0.0):
                last: dict[int, int] = {}
                for event in read_events([events]):
                    if event["event"] == "committed" and event["t"] >= since:
                        for p, o in event["offsets"].items():
                            last[int(p)] = max(last.get(int(p), 0), o)
                return all(last.get(p) == end for p in range(3))

            def progress() -> str:
                history = read_events([events])
                kinds = defaultdict(int)
                for event in history:
                    kinds[event["event"]] += 1
                last = [e for e in history if e["event"] == "committed"][-3:]
                return (f"member events {dict(kinds)}, last commits {last}, exit code {member.process.poll()}\n"
                        + member.log_text())

            wait_until(lambda: committed_up_to(per_partition), what="the group's first commits", timeout_s=60,
                       detail=progress)
            killed_at = time.monotonic()
            cluster.brokers[old].kill()
            produce_round("second")
            # The group goes on with another coordinator: its commits after the kill reach the end.
            wait_until(lambda: committed_up_to(2 * per_partition, since=killed_at),
                       what="commits acknowledged by the new coordinator", timeout_s=90, detail=progress)
            new = wait_until(coordinator, what="the new coordinator", timeout_s=10)
            assert new != old

            # The old coordinator, restarted, is a follower of the offsets partition: NOT_COORDINATOR.
            cluster.brokers[old].start()
            _sent, _node, code, _offsets = probe.ask(old)
            assert code == ErrorCode.not_coordinator, ErrorCode(code)
            cluster.wait_for_isr(OFFSETS_TOPIC, 4, 3)
            time.sleep(0.5)  # a few more rounds of answers from all three
        member.leave()
    finally:
        member.stop_quietly()

    history = read_events([events])
    # Everything was consumed (at least once) by the one member, across the coordinator's move.
    consumed = {e["value"] for e in history if e["event"] == "consumed"}
    assert produced <= consumed, f"{len(produced - consumed)} records never consumed"
    # What clients were told meanwhile: only "load in progress", "not available" or "not the coordinator".
    codes = {code for _t, _n, code, _o in probe.answers}
    assert codes <= {ErrorCode.none, ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available,
                     ErrorCode.not_coordinator}, codes
    assert any(n == new and code == ErrorCode.none for _t, n, code, _o in probe.answers)
    # Never a lost commit: every successful answer holds at least what was acknowledged before it was asked.
    commits = [(e["t"], {int(p): o for p, o in e["offsets"].items()}) for e in history if e["event"] == "committed"]
    checked = 0
    for sent, node_id, code, offsets in probe.answers:
        if code != ErrorCode.none:
            continue
        acknowledged: dict[int, int] = {}
        for t, committed in commits:
            if t < sent:
                for p, o in committed.items():
                    acknowledged[p] = max(acknowledged.get(p, -1), o)
        lost = {p: (offsets.get(p), o) for p, o in acknowledged.items() if offsets.get(p, -1) < o}
        assert not lost, f"broker {node_id} answered older offsets than acknowledged (got, acknowledged): {lost}"
        checked += 1
    assert checked > 10
    final = [offsets for _t, _n, code, offsets in probe.answers if code == ErrorCode.none][-1]
    assert final == {p: 2 * per_partition for p in range(3)}


# --- 4: retention stops at the high watermark -------------------------------------------------------------------

def test_retention_on_a_leader_never_deletes_records_a_follower_in_the_isr_lacks(cluster):
    whole(cluster)
    topic = unique_topic("retained")
    leader_id, follower_id = 2, 3
    create_assigned(cluster, topic, [[leader_id, follower_id]], **{
        "segment.bytes": "16384", "retention.bytes": "32768", "min.insync.replicas": "1"})
    leader, follower = cluster.brokers[leader_id], cluster.brokers[follower_id]
    value = b"x" * 3000
    # The leader takes the partition once its replica manager applied the new topic (a moment after the
    # metadata shows it): the first write is retried until then.
    wait_until(lambda: raw_produce(leader, topic, 0, [value], acks=1).error_code == ErrorCode.none,
               what="the leader taking writes", timeout_s=30)
    for _ in range(9):
        answer = raw_produce(leader, topic, 0, [value], acks=1)
        assert answer.error_code == ErrorCode.none, ErrorCode(answer.error_code)

    def replicated():
        start, high_watermark = offsets_of(leader, topic, 0)
        return high_watermark == 10 and log_end(cluster, follower_id, topic) == 10
    wait_until(replicated, what="the follower holding the first records", timeout_s=30)

    with paused(cluster, [follower_id]):
        time.sleep(0.4)  # its parked fetch is answered; it asks for nothing more
        follower_end = log_end(cluster, follower_id, topic)
        for _ in range(60):  # ~180 KB: eleven segments past what retention.bytes keeps
            answer = raw_produce(leader, topic, 0, [value], acks=1)
            assert answer.error_code == ErrorCode.none, ErrorCode(answer.error_code)
        time.sleep(0.6)  # three retention checks
        start, high_watermark = offsets_of(leader, topic, 0)
    assert follower_end == 10 and high_watermark == 10
    assert start <= follower_end, f"retention moved the leader's log start to {start}, past the ISR's {follower_end}"

    # The follower catches up from where it was, still in the ISR; then retention goes on.
    wait_until(lambda: offsets_of(leader, topic, 0)[1] == 70 and log_end(cluster, follower_id, topic) == 70,
               what="the follower caught up", timeout_s=30)
    view = partition_view(cluster, topic)
    assert set(view.isr) == {leader_id, follower_id}
    shrinks = rf"{re.escape(topic)}-0: (proposing )?ISR \[[^\]]*\] -> \[{leader_id}\]"
    assert not any(re.search(shrinks, b.log_text()) for b in cluster.brokers.values()), \
        "the follower left the ISR during the pause: the case under test did not arise"
    assert f"{topic}-0: log end" not in follower.log_text(), "the follower had to restart its log"
    wait_until(lambda: offsets_of(leader, topic, 0)[0] > follower_end, what="retention going on once replicated",
               timeout_s=30)
    leader_batches = {b.base_offset: b.data for b in log_batches(cluster, leader_id, topic)}
    follower_batches = {b.base_offset: b.data for b in log_batches(cluster, follower_id, topic)}
    # The follower's log is one stretch up to the end (its own retention may have trimmed its start), the
    # same batches as the leader's where both still have them.
    assert sorted(follower_batches) == list(range(min(follower_batches), 70))
    assert all(follower_batches[o] == data for o, data in leader_batches.items() if o in follower_batches)
