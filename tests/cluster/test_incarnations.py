"""ISR entries are tied to broker incarnations (issue: replication that survives overlapping faults, window 7;
``broker.cluster.incarnation``): a replica that comes back without the data its ISR entry promised is never
elected on that entry, and one that kept its data is.

Every test kills all three brokers of a partition at once (kill -9: the controller goes too, so nothing
shrinks the ISR, which stays [1, 2, 3] with no leader), does something to broker 2's disk, and starts broker
2 alone. Then broker 1 (killed in the same boot, so its page cache kept everything) comes back and must
lead with every acknowledged record, and 2 must catch up from it.

- a wiped disk: 2 starts on an empty data dir;
- a power loss: what was not fdatasync'd is gone from 2's logs (zeros, as never-written pages of the
  preallocated files read), and 2 runs in another boot of the machine (its boot id, bind-mounted over
  /proc/sys/kernel/random/boot_id in a mount namespace of its own, differs);
- a kill -9 alone (the control): 2 kept its page cache, vouches for its old epoch, and is elected at once.
"""

from __future__ import annotations

import os
import shutil
import signal

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.test_failover import acks_all, log_batches, partition_view, read_values
from tests.support.polling import holds_for, wait_until
from tests.support.power_loss import in_another_boot, lose_unflushed
from tests.support.topics import unique_topic

LEASE_S = 2.0


def kill_all(cluster) -> None:
    """kill -9 every broker, then wait for etcd to end their leases (registrations and the controller key).

    Broker 2 starts only after that, so the controller it becomes sees 1 and 3 gone in one image. Started
    while one of them still held its lease, it would elect that one (dead, but not yet known to be, as Kafka's
    controller would) and leave the ISR naming it alone, and broker 1 could no longer lead on its return."""
    def registered() -> list[str]:
        keys = cluster.etcd.etcdctl("get", "--prefix", "--keys-only", f"/{cluster.root}/").split()
        return [key for key in keys if "/brokers/" in key or key.endswith("/controller")]

    assert len(registered()) == len(cluster.brokers) + 1, registered()  # each broker, and the controller
    for broker in cluster.brokers.values():
        os.kill(broker.pid, signal.SIGKILL)
    for broker in cluster.brokers.values():
        broker.kill()
    wait_until(lambda: not registered(), what="the killed brokers' leases to end", timeout_s=LEASE_S + 30)


@pytest.mark.parametrize("fault", ["wiped disk", "power loss", pytest.param("kill -9 only", marks=pytest.mark.slow)])
def test_a_replica_without_the_data_its_isr_entry_promised_is_never_elected(cluster_factory, tmp_path, fault):
    cluster = cluster_factory(3, config={"offsets.topic.replication.factor": 1})
    topic = unique_topic("incarnation")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[1, 2, 3]], config={"min.insync.replicas": "2"})],
                        operation_timeout=20)[topic].result(30)
    cluster.wait_for_isr(topic, 1, 3)
    values = [f"acknowledged-{i}".encode() for i in range(100)]
    assert acks_all(cluster.bootstrap, topic, 0, values) == list(range(100))
    # Every replica has them (the last acknowledgement needed all three: the ISR is [1, 2, 3]).
    wait_until(lambda: all(sum(1 for _ in log_batches(cluster, n, topic)) and
                           log_batches(cluster, n, topic)[-1].last_offset == 99 for n in (1, 2, 3)),
               what="every replica holding the 100 records", timeout_s=20)
    assert set(partition_view(cluster, topic).isr) == {1, 2, 3}
    kill_all(cluster)

    two = cluster.brokers[2]
    if fault == "wiped disk":
        shutil.rmtree(two.data_dir)
        two.data_dir.mkdir()
    elif fault == "power loss":
        assert lose_unflushed(two.data_dir) > 0
        in_another_boot(two, tmp_path)
    two.start()

    def state():
        return partition_view(cluster, topic, via=2)

    wait_until(lambda: cluster.metadata(via=2).controller_id == 2 and set(cluster.metadata(via=2).brokers) == {2},
               what="broker 2 alone, and the controller", timeout_s=LEASE_S + 30)
    if fault == "kill -9 only":
        led = wait_until(lambda: (lambda v: v if v is not None and v.leader == 2 else None)(state()),
                         what="broker 2, which kept its page cache, elected", timeout_s=15)
        assert led.isr == (2,)
    else:
        # Watched across several of the controller's rounds: 2 is alive and in the recorded ISR, but its
        # entry names an incarnation whose records it no longer has.
        def not_elected():
            view = state()
            assert view is not None and view.leader == -1, f"broker 2 was elected after a {fault}: {view}"
            assert set(view.isr) == {1, 2, 3}, view

        holds_for(not_elected, seconds=6.0)
        assert "its data may be incomplete" in two.log_text() or fault == "wiped disk"

    # Broker 1 (killed in this boot) comes back with everything; 3 too. Whoever leads, nothing acknowledged
    # is lost, and every replica ends with the same bytes.
    cluster.brokers[1].start()
    cluster.brokers[3].start()
    cluster.wait_for_isr(topic, 1, 3, timeout_s=60)
    assert read_values(cluster.bootstrap, topic, 0, 100) == list(enumerate(values))
    wait_until(lambda: all(log_batches(cluster, n, topic) and log_batches(cluster, n, topic)[-1].last_offset == 99
                           for n in (1, 2, 3)), what="every replica at 100 again", timeout_s=30)
    logs = {n: b"".join(b.data for b in log_batches(cluster, n, topic)) for n in (1, 2, 3)}
    assert logs[1] == logs[2] == logs[3]
