"""etcd compacted under a running cluster (issue: replication that survives overlapping faults, window 8):
a broker whose watch must resume from a revision etcd no longer has reloads the whole state, and ends with
the same view as everyone else (``broker.cluster.etcd_metadata``, "Watching").

Broker 3 is cut off from etcd (a network cut in a ``NetLab``: it still reaches its peers and clients reach
it); meanwhile a topic is created and another deleted, and etcd is compacted to its latest revision. When the
cut heals, broker 3's watch asks for a compacted revision, etcd refuses, and the broker must reload: it
knows the new topic, no longer has the deleted one (its log is removed), and leads and follows as the
controller says.

The cut lasts until broker 3 has noticed it (a keepalive missed its deadline and the watch was torn down,
at most two keepalive intervals, ~1.3 s with a 2 s lease). A shorter cut tests nothing: the watch stream
stays open across it, etcd has already queued the events for that synced watcher (compaction does not
touch a synced watch), and TCP delivers them after the heal; the broker ends up right without reloading.
"""

from __future__ import annotations

import json

from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.polling import wait_until
from tests.support.topics import unique_topic


def etcd_revision(etcd) -> int:
    return int(json.loads(etcd.etcdctl("get", "/", "-w", "json"))["header"]["revision"])


def test_a_broker_whose_watch_was_compacted_away_reloads_everything(net_cluster_factory):
    cluster, lab, etcd_host = net_cluster_factory(3)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    doomed, born = unique_topic("doomed"), unique_topic("born")
    admin.create_topics([NewTopic(doomed, 3, 3)], operation_timeout=20)[doomed].result(30)
    cluster.wait_for_isr(doomed, 3, 3)
    three = cluster.brokers[3]
    # A new partition's ISR is all its replicas from the start (as in Kafka), so the wait above can end before
    # broker 3 has applied the creation and made the log.
    wait_until(lambda: (three.data_dir / f"{doomed}-0").is_dir(), what="broker 3 holding the topic's log",
               timeout_s=20)
    metadata_before = three.stats_json()["cluster"]["metadata"]

    lab.cut(cluster.hosts[3], etcd_host)
    try:
        others = AdminClient({"bootstrap.servers": ",".join(cluster.brokers[n].bootstrap for n in (1, 2))})
        others.delete_topics([doomed], operation_timeout=20)[doomed].result(30)
        others.create_topics([NewTopic(born, 2, 3)], operation_timeout=20)[born].result(30)
        wait_until(lambda: born in cluster.metadata([born], via=1).topics and
                   doomed not in cluster.metadata(via=1).topics, what="the changes seen by broker 1", timeout_s=20)
        revision = etcd_revision(cluster.etcd)
        cluster.etcd.etcdctl("compact", str(revision))
        # Heal only once broker 3's stream is gone, so that its resumed watch must ask for a revision
        # compacted away (the module docstring).
        wait_until(lambda: three.stats_json()["cluster"]["metadata"]["watch_resumes"] >
                   metadata_before["watch_resumes"], what="broker 3 noticing etcd is unreachable", timeout_s=15)
        # Broker 3 has seen none of it.
        assert born not in cluster.metadata(via=3).topics
    finally:
        lab.heal()

    wait_until(lambda: three.stats_json()["cluster"]["metadata"]["reloads"] > metadata_before["reloads"],
               what="broker 3 reloading the cluster state after its watch was compacted away", timeout_s=30)
    wait_until(lambda: (lambda view: born in view.topics and doomed not in view.topics)(cluster.metadata(via=3)),
               what="broker 3 knowing the new topic and not the deleted one", timeout_s=30)
    cluster.wait_for_isr(born, 2, 3)
    wait_until(lambda: not (three.data_dir / f"{doomed}-0").exists(), what="the deleted topic's log gone from broker 3",
               timeout_s=30)
    assert "compacted revision" in three.log_text()
