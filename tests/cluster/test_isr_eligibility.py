"""A follower cut off etcd alone stays out of the ISR until it registers again, and then rejoins (issue:
replication, "ISR and high watermark").

Cut off etcd but not its peers, a follower keeps fetching while its lease runs out; the controller removes
an unregistered broker from every ISR. A leader that judged it by its fetches alone added it straight back,
and the two undid each other hundreds of times a second for as long as the cut lasted (seen in the Jepsen
test). The brokers and etcd run on hosts of their own (network namespaces) so that exactly this link can be
cut.
"""

from __future__ import annotations

import re
import time

from tests.support.polling import wait_until
from tests.support.topics import unique_topic


def isr_changes(cluster, topic: str) -> int:
    """ISR changes applied by leaders and by the controller, over every broker's log, for ``topic``."""
    pattern = re.compile(rf"{re.escape(topic)}-\d+: ISR \[[\d, ]*\] -> \[[\d, ]*\]")
    return sum(len(pattern.findall(broker.log_text())) for broker in cluster.brokers.values())


def test_a_follower_cut_off_etcd_stays_out_of_the_isr_until_it_registers_again(net_cluster_factory):
    cluster, lab, etcd_host = net_cluster_factory(3)
    topic = unique_topic("eligible")
    # Both partitions led by one broker, so that of the other two at least one is not the controller either:
    # it follows both partitions, and its own loss of etcd adds no election to the story. (Kafka's placement
    # may spread the leaders over two brokers and the controller may be the third.)
    controller = cluster.metadata().controller_id
    first, second, third = sorted(cluster.brokers)
    cluster.create_topic(topic, 2, 3, configs={"min.insync.replicas": "2"},
                         replica_assignment=[[first, second, third], [first, third, second]])
    view = cluster.wait_for_isr(topic, 2, 3)
    follower = next(n for n in cluster.brokers if n != controller and all(p.leader != n for p in view.values()))
    before = isr_changes(cluster, topic)

    lab.cut(cluster.hosts[follower], etcd_host)
    cut_at = time.monotonic()
    # Its lease (2 s) runs out and the controller takes it out of both ISRs.
    wait_until(lambda: all(follower not in p.isr
                           for p in cluster.metadata([topic], via=controller).topics[topic].values()),
               what=f"node {follower} out of both ISRs", timeout_s=30)
    # It stays out while the cut lasts, though it still reaches both leaders.
    while time.monotonic() < cut_at + 8:
        partitions = cluster.metadata([topic], via=controller).topics[topic]
        assert all(follower not in p.isr for p in partitions.values()), partitions
        time.sleep(0.2)
    during = isr_changes(cluster, topic) - before

    lab.heal()
    cluster.wait_for_isr(topic, 2, 3, timeout_s=60)
    # Out once per partition (by the controller, and on each leader as applied), back once per partition:
    # a handful of changes, not one per fetch.
    assert during <= 8, f"{during} ISR changes while node {follower} was cut off etcd"
    assert isr_changes(cluster, topic) - before <= 16
