"""The Prometheus endpoint of clustered brokers: controller status, etcd calls, the leader's view of its
followers, and the under-replicated partition and controller ISR removal a killed follower causes."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.metrics import metrics_address, scrape, value
from tests.support.polling import wait_until
from tests.support.topics import unique_topic


def test_cluster_metrics_follow_the_controller_and_a_lost_follower(cluster_factory):
    cluster = cluster_factory(3, extra_args=("--metrics-listen", "127.0.0.1:0"))
    addresses = {node: metrics_address(broker) for node, broker in cluster.brokers.items()}
    topic = unique_topic("cm")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3)], operation_timeout=20)[topic].result(30)
    view = cluster.wait_for_leaders(topic, 1)
    leader = view[0].leader

    def hosted_everywhere():
        scraped = {node: scrape(address) for node, address in addresses.items()}
        return scraped if all(value(s, "copyless_partition_leader", topic=topic, partition="0") is not None
                              for s in scraped.values()) else None
    samples = wait_until(hosted_everywhere, what="every broker hosting the new partition", timeout_s=30)
    controller = cluster.metadata().controller_id
    assert {node: value(s, "copyless_controller_active") for node, s in samples.items()} == {
        node: (1 if node == controller else 0) for node in cluster.brokers}
    assert value(samples[controller], "copyless_controller_epoch") >= 1
    for node, s in samples.items():
        assert value(s, "copyless_etcd_calls_total", method="LeaseGrant") >= 1, node
        assert value(s, "copyless_partition_leader", topic=topic, partition="0") == (1 if node == leader else 0)
    followers = sorted(str(node) for node in cluster.brokers if node != leader)
    lags = [value(samples[leader], "copyless_follower_lag_records", topic=topic, partition="0", follower=f)
            for f in followers]
    assert all(lag is not None and lag >= 0 for lag in lags), lags

    assert value(samples[leader], "copyless_isr_shrinks_total") == 0
    # A follower killed (not the controller): the controller takes it out of the ISR, and the leader reports
    # the partition under-replicated.
    victim = next(int(f) for f in followers if int(f) != controller)
    cluster.brokers[victim].kill()

    def shrunk():
        s = scrape(addresses[leader])
        return value(s, "copyless_under_replicated_partitions") >= 1
    wait_until(shrunk, what="the leader's under-replicated partition", timeout_s=60)
    assert value(scrape(addresses[controller]), "copyless_controller_isr_removals_total") >= 1
