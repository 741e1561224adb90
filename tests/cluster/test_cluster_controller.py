"""The controller: elected through etcd, replaced when its lease expires, and fenced so a deposed controller
can never write (issue: cluster metadata in etcd, "One controller")."""

from __future__ import annotations

import asyncio
import json
import types

from confluent_kafka.admin import AdminClient, NewTopic

from copyless.broker.cluster import etcd_client as etcd
from copyless.broker.cluster.controller import Controller
from copyless.broker.cluster.image import ClusterImage
from copyless.broker.cluster.keys import Layout
from copyless.broker.config import BrokerConfig
from tests.support.etcd import unique_root
from tests.support.polling import wait_until


def test_another_broker_takes_over_when_the_controller_is_killed(cluster_factory):
    cluster = cluster_factory(3)
    old = cluster.metadata().controller_id
    cluster.brokers[old].kill()

    def new_controller():
        try:
            controller = cluster.metadata().controller_id
        except OSError:
            return None
        return controller if controller not in (-1, old) else None

    # The old controller's lease (2 s) must expire first; the rest is one watch event and one transaction.
    new = wait_until(new_controller, what="a new controller after kill -9 of the old one", timeout_s=15)
    assert new in cluster.brokers and new != old
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic("after-failover", 2, 1)], operation_timeout=20)["after-failover"].result(30)
    leaders = cluster.wait_for_leaders("after-failover", 2)
    assert {p.leader for p in leaders.values()} <= {b for b in cluster.brokers if b != old}
    assert new_controller() == new  # and it stayed the controller


class _Metadata(types.SimpleNamespace):
    """What Controller needs of its backend, for driving two controllers by hand against a real etcd."""

    def lease_valid(self) -> bool:
        return True


async def _stale_controller_write(endpoint: str) -> dict:
    root = unique_root()
    layout = Layout(root, "cluster")
    client = etcd.EtcdClient(etcd.parse_endpoints(endpoint))
    outcome = {}
    try:
        lease_a, _ttl = await client.grant(2)
        config = BrokerConfig(auto_leader_rebalance=False)
        a = Controller(_Metadata(node_id=1, client=client, layout=layout, lease_id=lease_a,
                                 broker=types.SimpleNamespace(config=config), image=None))
        a._run = a._rebalance = lambda: asyncio.sleep(0)  # drive its writes by hand
        assert await a.campaign()
        state_key = layout.partition("t", 0)
        written = await a._write([etcd.created(state_key, 0)],
                                 [etcd.put(state_key, json.dumps({"leader": 1, "leader_epoch": 0, "isr": [1, 2],
                                                                  "controller_epoch": a.epoch}).encode())])
        outcome["first write"] = written.succeeded
        # A loses its lease (its controller key goes with it) and B is elected: the epoch moves on.
        await client.revoke(lease_a)
        lease_b, _ttl = await client.grant(2)
        b = Controller(_Metadata(node_id=2, client=client, layout=layout, lease_id=lease_b,
                                 broker=types.SimpleNamespace(config=config), image=None))
        b._run = b._rebalance = lambda: asyncio.sleep(0)
        outcome["b elected"] = await b.campaign()
        outcome["epochs"] = (a.epoch, b.epoch)
        # A does not know yet: its next write carries its old token and must be refused.
        current, _ = await client.get(state_key)
        stale = await a._write([etcd.modified(state_key, current.mod_revision)],
                               [etcd.put(state_key,
                                         b'{"leader": 1, "leader_epoch": 1, "isr": [1], "controller_epoch": 1}')])
        outcome["stale write"] = stale.succeeded
        outcome["a still active"] = a.active
        after, _ = await client.get(state_key)
        outcome["state unchanged"] = after.mod_revision == current.mod_revision
        # B's own write goes through.
        fresh = await b._write([etcd.modified(state_key, current.mod_revision)],
                               [etcd.put(state_key,
                                         b'{"leader": 2, "leader_epoch": 1, "isr": [2], "controller_epoch": 2}')])
        outcome["b write"] = fresh.succeeded
        await client.revoke(lease_b)
        await client.txn([], [etcd.delete_prefix(f"/{root}/".encode())])
    finally:
        await client.close()
    return outcome


def test_a_deposed_controllers_write_is_refused_by_etcd(etcd_server):
    outcome = asyncio.run(_stale_controller_write(etcd_server.endpoint))
    assert outcome["first write"] is True
    assert outcome["b elected"] is True and outcome["epochs"] == (1, 2)
    assert outcome["stale write"] is False, "a controller whose epoch moved on wrote to etcd"
    assert outcome["state unchanged"] is True
    assert outcome["a still active"] is False, "the refused controller did not resign"
    assert outcome["b write"] is True


async def _image_from_before_the_election(endpoint: str) -> dict:
    root = unique_root()
    layout = Layout(root, "cluster")
    client = etcd.EtcdClient(etcd.parse_endpoints(endpoint))
    outcome = {}
    try:
        lease, _ttl = await client.grant(2)
        a = Controller(_Metadata(node_id=1, client=client, layout=layout, lease_id=lease,
                                 broker=types.SimpleNamespace(config=BrokerConfig(auto_leader_rebalance=False)),
                                 image=None))
        a._run = a._rebalance = lambda: asyncio.sleep(0)
        assert await a.campaign()
        # The watch delivers an image of the revision before the election: no controller named yet.
        a.on_image(ClusterImage(revision=a.token - 1, controller_id=-1))
        outcome["active after a stale image"] = a.active
        a.on_image(ClusterImage(revision=a.token, controller_id=1))
        outcome["active after its own"] = a.active
        # A newer image naming another broker still deposes it.
        a.on_image(ClusterImage(revision=a.token + 1, controller_id=2))
        outcome["active after a newer one naming another"] = a.active
        await client.revoke(lease)
        await client.txn([], [etcd.delete_prefix(f"/{root}/".encode())])
    finally:
        await client.close()
    return outcome


def test_an_image_from_before_the_election_does_not_depose_the_controller(etcd_server):
    outcome = asyncio.run(_image_from_before_the_election(etcd_server.endpoint))
    assert outcome == {"active after a stale image": True, "active after its own": True,
                       "active after a newer one naming another": False}


def test_an_election_whose_answer_was_lost_still_leaves_a_controller(etcd_server, tmp_path):
    """The election transaction commits but its answer never arrives (the call times out): the controller key
    names the candidate, on its live lease, so no other broker stands. The candidate must see the key in its
    image and take office; otherwise the cluster has no controller, and neither failover nor CreateTopics
    happen until that broker restarts."""
    from tests.support.cluster import Cluster
    from tests.support.etcd_proxy import TXN, EtcdFaultProxy

    proxy = EtcdFaultProxy(etcd_server.endpoint).start()
    cluster = Cluster(tmp_path / "cluster", proxy, 2, config={"offsets.topic.replication.factor": 2})
    try:
        cluster.start()
        old = cluster.metadata().controller_id
        candidate = next(n for n in cluster.brokers if n != old)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        topic = NewTopic("led-by-the-controller", 1, replica_assignment=[[old, candidate]])
        admin.create_topics([topic], operation_timeout=20)[topic.topic].result(30)
        cluster.wait_for_isr(topic.topic, 1, 2)
        lost = proxy.lose_answer(TXN, json.dumps({"broker_id": candidate}).encode())
        cluster.brokers[old].kill()
        wait_until(lambda: lost.lost, what=f"node {candidate}'s election transaction sent (its answer dropped)",
                   timeout_s=20)
        # The election did commit: the key names the candidate.
        wait_until(lambda: cluster.metadata(via=candidate).controller_id == candidate,
                   what="the image naming the candidate controller", timeout_s=10)
        # And it acts on it: the dead broker's partition fails over, and a topic can be created.
        wait_until(lambda: cluster.metadata([topic.topic], via=candidate).topics[topic.topic][0].leader == candidate,
                   what=f"{topic.topic}-0 failed over to node {candidate}", timeout_s=15)
        survivor = AdminClient({"bootstrap.servers": cluster.brokers[candidate].bootstrap})
        survivor.create_topics([NewTopic("after-the-lost-answer", 1, 1)],
                               operation_timeout=20)["after-the-lost-answer"].result(30)
        assert "took office from the watched election key" in cluster.brokers[candidate].log_text()
    finally:
        cluster.stop()
        proxy.close()
