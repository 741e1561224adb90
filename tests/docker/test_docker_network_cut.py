"""A partition leader cut off the network (`docker network disconnect`) while a producer writes, on the real engine.

The broker leading the partition loses the compose "cluster" network: etcd and both followers are out of its
reach, while the host still reaches its published port (the "clients" network), as a client that knows its
address would. Invariants (Kafka's, replication.md §1):

- the isolated broker acknowledges no acks=all write sent to it after the cut (its followers cannot fetch, and
  it cannot shrink the ISR without etcd);
- once its etcd lease is gone it stops reporting itself leader: asked directly, its Metadata does not name it
  leader of the partition, and a Produce to it gets NOT_LEADER_OR_FOLLOWER;
- the other brokers elect a new leader from the ISR, and the producer's writes are acknowledged through it;
- reconnected, the broker truncates what only it had (the write sent to it after the cut is nowhere in the
  partition), catches up and rejoins the ISR, and every acknowledged record is in the log once, at its
  acknowledged offset.
"""

from __future__ import annotations

import time

import pytest

from tests.docker import docker_harness as harness
from tests.support import batches, wire
from tests.support.polling import wait_until

pytestmark = [pytest.mark.timeout(900), pytest.mark.usefixtures("cluster_mode")]

TOPIC = "cut"
NOT_LEADER_OR_FOLLOWER = 6
# The brokers' etcd lease is 2 s (broker.session.timeout.ms); a new controller, if the cut broker was the
# controller too, adds one more lease. 60 s tolerates a loaded 2-core machine.
FAILOVER_TIMEOUT_S = 60.0
REJOIN_TIMEOUT_S = 120.0


class _Tolerant:
    """``condition`` for wait_until during a failover, where a broker may refuse or time out for a while: an
    exception counts as "not yet", and the last one is shown if the wait fails."""

    def __init__(self, condition) -> None:
        self.condition, self.last_error = condition, None

    def __call__(self):
        try:
            return self.condition()
        except Exception as exc:
            self.last_error = exc
            return None

    def detail(self) -> str:
        return f"last error: {self.last_error!r}"


def _wait(condition, *, what: str, timeout_s: float):
    tolerant = _Tolerant(condition)
    return wait_until(tolerant, what=what, timeout_s=timeout_s, interval_s=0.2, detail=tolerant.detail)


def _direct_metadata(port: int) -> tuple[int, list[int]]:
    """(leader, ISR) of TOPIC-0 as the broker on ``port`` itself reports them: Metadata v1 straight to it (a
    client library would ask whichever broker it likes, the cut-off one included)."""
    with wire.RawConnection("127.0.0.1", port, timeout_s=5) as conn:
        reader = wire.Reader(conn.roundtrip(wire.metadata_v1(1, [TOPIC]), timeout_s=5))
    reader.array(lambda r: (r.take(">i"), r.string(), r.take(">i"), r.string()))  # brokers
    reader.take(">i")  # controller id

    def partition(r):
        _error, index, leader = r.take(">hii")
        _replicas, isr = r.array(lambda r: r.take(">i")), r.array(lambda r: r.take(">i"))
        return index, (leader, isr)

    def topic(r):
        r.take(">h"), r.string(), r.take(">b")
        return dict(r.array(partition))

    (partitions,) = reader.array(topic)
    return partitions[0]


def _direct_produce(port: int, value: bytes, *, timeout_ms: int = 3000) -> int:
    """One acks=all Produce of ``value`` to TOPIC-0, straight to the broker on ``port``: its error code."""
    with wire.RawConnection("127.0.0.1", port, timeout_s=timeout_ms / 1000 + 15) as conn:
        frame = wire.produce_v3(7, TOPIC, 0, batches.build_batch([value]), acks=-1, timeout_ms=timeout_ms)
        error, _base_offset = wire.parse_produce_v3(conn.roundtrip(frame, timeout_s=timeout_ms / 1000 + 15))
    return error


def test_leader_cut_off_stops_acknowledging_fails_over_and_rejoins(compose_project):
    project = compose_project("cluster")
    project.timed_up(label="cluster (3 etcd + 3 brokers)")
    harness.create_topic(project.bootstrap(), TOPIC, partitions=1, replication_factor=3,
                         configs={"min.insync.replicas": "2"})
    _wait(lambda: len(harness.describe_partitions(project.bootstrap(), TOPIC)[0].isr) == 3, timeout_s=60,
          what="the topic's three replicas in sync")

    producer = harness.BackgroundProducer(project.bootstrap(), TOPIC).start()
    try:
        _wait(lambda: len(producer.acknowledged) >= 50, timeout_s=60, what="writes acknowledged before the cut")
        leader = harness.describe_partitions(project.bootstrap(), TOPIC)[0].leader
        service = harness.broker_service(leader)
        port = project.ports[service]
        others = [s for s in ("broker1", "broker2", "broker3") if s != service]

        project.disconnect(service)
        cut_at = time.monotonic()

        # Cut off from its followers and etcd, it cannot acknowledge an acks=all write (nor move the ISR).
        stray = b"sent-to-the-cut-off-leader"
        assert _direct_produce(port, stray) != 0

        # Its lease expires: asked directly, it no longer claims the partition, and refuses writes to it.
        _wait(lambda: _direct_metadata(port)[0] != leader, timeout_s=FAILOVER_TIMEOUT_S,
              what=f"{service} still reports itself leader after its lease is gone")
        assert _direct_produce(port, b"after-the-lease") == NOT_LEADER_OR_FOLLOWER

        # The rest elect a new leader from the ISR, and the producer's writes go through it.
        def new_leader():
            leaders = {_direct_metadata(project.ports[other])[0] for other in others}
            return leaders.pop() if len(leaders) == 1 and not leaders & {leader, -1} else None

        elected = _wait(new_leader, timeout_s=FAILOVER_TIMEOUT_S, what="a new leader elected")
        assert elected != leader
        elected_at = time.monotonic()
        _wait(lambda: producer.acknowledged_after(elected_at), timeout_s=FAILOVER_TIMEOUT_S,
              what="a write acknowledged through the new leader")
        harness.TIMINGS.append(f"network cut ({project.name}): new leader seen {elected_at - cut_at:.1f} s after it")

        # Back on the network: it truncates, catches up and rejoins the ISR.
        project.connect(service)
        _wait(lambda: all(leader in _direct_metadata(project.ports[other])[1] for other in others),
              timeout_s=REJOIN_TIMEOUT_S, what=f"{service} back in the ISR")
        rejoined_at = time.monotonic()
        _wait(lambda: producer.acknowledged_after(rejoined_at), timeout_s=30,
              what="writes acknowledged after the rejoin")
    finally:
        producer.stop()

    acknowledged = {offset: value for offset, value, _ in producer.acknowledged}
    assert acknowledged and len(acknowledged) == len(producer.acknowledged), "two records acknowledged at one offset"
    end = harness.end_offset(project.bootstrap(), TOPIC)
    records = harness.consume(project.bootstrap(), TOPIC, [0], end)
    log = {offset: value for _, offset, _, value in records}
    assert sorted(log) == list(range(end)), f"offsets not contiguous: {sorted(log)[:10]}..."
    assert {offset: log.get(offset) for offset in acknowledged} == acknowledged
    assert stray not in log.values(), "the write only the cut-off leader had survived its truncation"
    assert len(set(log.values())) == len(log), "a record is in the log twice"
    # The cut never killed it: the same process rejoined.
    assert project.state(service).status == "running" and project.state(service).restarts == 0
