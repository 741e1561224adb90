"""Truncation by leader epoch: a deposed leader's unreplicated tail is cut exactly where its log diverges
from the new leader's, and the replicas end byte for byte identical (issue: replication, "Leader epochs and
truncation"; kill -9 at each step of a truncation is the storage failpoint tests' part).

The divergence is built for real, on three brokers and an etcd each on a host of its own (network
namespaces): the leader is cut off from etcd and its followers while a client that still reaches it writes
with acks=1. Those writes land in its log under its epoch and nowhere else. The other two elect a new leader
(the old one's lease expires) which takes acks=all writes at the same offsets under the next epoch. When the
network heals, the old leader follows again: it must drop its tail, no more and no less, and copy the new
leader's records in its place.
"""

from __future__ import annotations

import re

import pytest
from kio.schema.errors import ErrorCode

from tests.support.batches import build_batch, records_of
from tests.support.cluster import log_end, produce_acks_all
from tests.support.kio_requests import KafkaWire, produce
from tests.support.log_files import read_partition_log
from tests.support.polling import wait_until
from tests.support.topics import unique_topic


@pytest.mark.parametrize("common", [200, pytest.param(0, marks=pytest.mark.slow)],
                         ids=["after-200-common-records", "from-the-first-record"])
def test_a_deposed_leaders_unreplicated_tail_is_cut_exactly_at_the_divergence(net_cluster_factory, common):
    """``common`` records are on every replica before the leader is cut off. With none, the new leader has no
    record of the old leader's epoch at all: it must still say where that epoch ends for it (where its own
    first epoch starts, as Kafka answers), or the old leader keeps its tail and is counted as holding the new
    leader's records at those offsets."""
    cluster, lab, _etcd_host = net_cluster_factory(3)
    topic = unique_topic("diverge")
    cluster.create_topic(topic, 1, 3, configs={"min.insync.replicas": "2"})
    before = cluster.wait_for_isr(topic, 1, 3)[0]
    old = before.leader
    others = [node_id for node_id in cluster.brokers if node_id != old]

    # 1. Records every replica holds: acks=all, then every follower's log reaches them.
    committed = [f"committed-{i}".encode() for i in range(common)]
    if committed:
        assert produce_acks_all(cluster.bootstrap, topic, committed) == list(range(common))
    wait_until(lambda: all(log_end(cluster, n, topic) == common for n in cluster.brokers),
               what=f"every replica's log to hold the {common} acknowledged records", timeout_s=30)

    # 2. The leader is cut off from etcd and both followers; a client still reaches it and writes with acks=1
    #    while its lease lasts (2 s, of which at most a keepalive interval, 0.7 s, has passed at the cut).
    lab.isolate(cluster.hosts[old])
    diverged: list[bytes] = []
    wire = KafkaWire(cluster.brokers[old].port, host=cluster.brokers[old].host)
    try:
        for round_ in range(10):
            values = [f"diverged-{round_}-{i}".encode() for i in range(5)]
            answer = produce(wire, topic, {0: build_batch(values)}, acks=1).responses[0].partition_responses[0]
            if answer.error_code != ErrorCode.none:
                break
            assert answer.base_offset == common + len(diverged)
            diverged += values
    finally:
        wire.close()
    assert diverged, "the cut-off leader refused every acks=1 write: no divergence to test"
    diverged_end = common + len(diverged)
    assert log_end(cluster, old, topic) == diverged_end
    assert all(log_end(cluster, n, topic) == common for n in others), "the cut-off leader's writes replicated"

    # 3. The other two elect a new leader at a higher epoch, which takes acks=all writes where the common
    #    records end.
    def new_leader():
        try:
            view = cluster.metadata([topic], via=others[0]).topics[topic][0]
        except OSError:
            return None
        return view if view.leader in others and view.leader_epoch > before.leader_epoch else None

    elected = wait_until(new_leader, what="a new leader among the brokers still connected", timeout_s=30)
    survivors = ",".join(cluster.brokers[n].bootstrap for n in others)
    after = [f"after-{i}".encode() for i in range(100)]
    end = common + len(after)
    assert produce_acks_all(survivors, topic, after) == list(range(common, end))

    # 4. Heal: the old leader follows the new one, truncates to where its epoch ends on the new leader (the
    #    end of the common records), and copies the new records; the ISR is whole again.
    lab.heal()
    cluster.wait_for_isr(topic, 1, 3, timeout_s=60)
    wait_until(lambda: all(log_end(cluster, n, topic) == end for n in cluster.brokers),
               what=f"every replica's log to end at {end}", timeout_s=30)

    old_log = cluster.brokers[old].log_text()
    cut = re.findall(rf"{re.escape(topic)}-0: truncating from (\d+) to (\d+)", old_log)
    assert cut == [(str(diverged_end), str(common))], f"truncations logged by the old leader: {cut}"

    logs = {n: b"".join(batch.data for batch in read_partition_log(cluster.brokers[n].data_dir, topic, 0))
            for n in cluster.brokers}
    assert logs[old] == logs[elected.leader], "the old leader's log differs from the new leader's"
    assert all(data == logs[elected.leader] for data in logs.values()), "the replicas' logs differ"
    records = records_of(logs[old])
    assert [r.offset for r in records] == list(range(end))
    assert [r.value for r in records] == committed + after
    # The epochs say who wrote what: the first leader the common records, the new one the rest.
    epochs = {(batch.base_offset >= common, batch.leader_epoch) for batch in read_partition_log(
        cluster.brokers[old].data_dir, topic, 0)}
    expected = {(True, elected.leader_epoch)} | ({(False, before.leader_epoch)} if common else set())
    assert epochs == expected, epochs
