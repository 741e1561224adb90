"""Illegal group sequences sent as raw protocol requests get Kafka's error codes and never wedge the group.

Requests are built with kio and sent over plain sockets (``copyless.client.blocking.BlockingClient``), one connection
per simulated member, because a parked JoinGroup holds its connection as in Kafka. After the abuse, a real
kafka-python consumer joins the same group and consumes every record.
"""

from __future__ import annotations

import datetime
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from kafka import KafkaConsumer
from kio.schema.errors import ErrorCode
from kio.schema.heartbeat.v3 import request as hb_rq
from kio.schema.heartbeat.v3 import response as hb_rs
from kio.schema.join_group.v5 import request as jg_rq
from kio.schema.join_group.v5 import response as jg_rs
from kio.schema.leave_group.v3 import request as lg_rq
from kio.schema.leave_group.v3 import response as lg_rs
from kio.schema.offset_commit.v7 import request as oc_rq
from kio.schema.offset_commit.v7 import response as oc_rs
from kio.schema.sync_group.v3 import request as sg_rq
from kio.schema.sync_group.v3 import response as sg_rs
from kio.static.primitive import i32Timedelta

from copyless.client.blocking import BlockingClient as GroupsClient
from tests.support.groups import create_topic, produce, start_broker, wait_until_coordinator_active
from tests.support.polling import wait_until

GROUP = "abused"
TOPIC = "abused-topic"


def ms(value: int):
    return i32Timedelta.parse(datetime.timedelta(milliseconds=value))


class RawMember:
    def __init__(self, bootstrap: str, instance_id: str | None = None):
        host, port = bootstrap.rsplit(":", 1)
        self.client = GroupsClient(host, int(port))
        self.instance_id = instance_id
        self.member_id = ""
        self.generation = -1

    def join(self, *, session_ms=3000, rebalance_ms=3000, protocol="range", protocol_type="consumer"):
        response = self.client.request(jg_rq.JoinGroupRequest(
            group_id=GROUP, session_timeout=ms(session_ms), rebalance_timeout=ms(rebalance_ms),
            member_id=self.member_id, group_instance_id=self.instance_id, protocol_type=protocol_type,
            protocols=(jg_rq.JoinGroupRequestProtocol(name=protocol, metadata=b"\x00\x00"),),
        ), jg_rs.JoinGroupResponse)
        if response.error_code in (ErrorCode.none, ErrorCode.member_id_required):
            self.member_id = response.member_id
        if response.error_code == ErrorCode.none:
            self.generation = response.generation_id
        return response

    def sync(self, assignments=(), generation=None, member_id=None):
        response = self.client.request(sg_rq.SyncGroupRequest(
            group_id=GROUP, generation_id=self.generation if generation is None else generation,
            member_id=self.member_id if member_id is None else member_id, group_instance_id=self.instance_id,
            assignments=tuple(sg_rq.SyncGroupRequestAssignment(member_id=m, assignment=a) for m, a in assignments),
        ), sg_rs.SyncGroupResponse)
        self.assignment = response.assignment
        return response.error_code

    def heartbeat(self, generation=None, member_id=None):
        return self.client.request(hb_rq.HeartbeatRequest(
            group_id=GROUP, generation_id=self.generation if generation is None else generation,
            member_id=self.member_id if member_id is None else member_id, group_instance_id=self.instance_id,
        ), hb_rs.HeartbeatResponse).error_code

    def commit(self, generation=None, offset=1):
        response = self.client.request(oc_rq.OffsetCommitRequest(
            group_id=GROUP, generation_id_or_member_epoch=self.generation if generation is None else generation,
            member_id=self.member_id, group_instance_id=self.instance_id,
            topics=(oc_rq.OffsetCommitRequestTopic(name=TOPIC, partitions=(
                oc_rq.OffsetCommitRequestPartition(partition_index=0, committed_offset=offset,
                                                   committed_leader_epoch=-1, committed_metadata=""),)),),
        ), oc_rs.OffsetCommitResponse)
        return response.topics[0].partitions[0].error_code


@pytest.mark.timeout(180)
def test_illegal_sequences_get_kafka_errors_and_never_wedge_the_group(broker_factory, tmp_path):
    broker = start_broker(broker_factory, tmp_path)
    wait_until_coordinator_active(broker.bootstrap)
    create_topic(broker.bootstrap, TOPIC, 2)
    values = produce(broker.bootstrap, TOPIC, 2, "v", 25)
    a, b = RawMember(broker.bootstrap), RawMember(broker.bootstrap)

    # Sync and heartbeat before any join: the group does not exist, the member is unknown.
    assert a.sync(generation=1, member_id="never-joined") == ErrorCode.unknown_member_id
    assert a.heartbeat(generation=1, member_id="never-joined") == ErrorCode.unknown_member_id
    # A session timeout below group.min.session.timeout.ms (1 s in these tests).
    assert a.join(session_ms=10).error_code == ErrorCode.invalid_session_timeout
    # JoinGroup v4+: the first join gets a member id to come back with (KIP-394).
    first = a.join()
    assert first.error_code == ErrorCode.member_id_required and first.member_id
    # An id the coordinator never issued, on a group it does not know.
    b.member_id = "forged-id"
    assert b.join().error_code == ErrorCode.unknown_member_id
    b.member_id = ""

    # a joins (alone, after the 300 ms join window), becomes leader of generation 1 and syncs.
    joined = a.join()
    assert joined.error_code == ErrorCode.none and joined.leader == a.member_id
    assert len(joined.members) == 1
    assert a.sync(assignments=[(a.member_id, b"")]) == ErrorCode.none
    assert a.heartbeat() == ErrorCode.none

    # A member with no protocol in common with the group.
    assert b.join().error_code == ErrorCode.member_id_required
    assert b.join(protocol="nothing-in-common").error_code == ErrorCode.inconsistent_group_protocol

    # Stale generation everywhere: ILLEGAL_GENERATION; a forged member: UNKNOWN_MEMBER_ID.
    assert a.heartbeat(generation=a.generation - 1) == ErrorCode.illegal_generation
    assert a.sync(generation=a.generation + 5) == ErrorCode.illegal_generation
    assert a.commit(generation=a.generation - 1) == ErrorCode.illegal_generation
    assert a.heartbeat(member_id="someone-else") == ErrorCode.unknown_member_id
    assert a.commit() == ErrorCode.none

    # b joins for real: a rebalance starts; a learns it from its heartbeat, and both rejoin in parallel.
    with ThreadPoolExecutor(2) as pool:
        b_join = pool.submit(b.join)
        # b's join is parked until a rejoins (or a's rebalance timeout passes).
        wait_until(lambda: a.heartbeat() == ErrorCode.rebalance_in_progress, what="a to hear of the rebalance",
                   timeout_s=10.0)
        assert a.commit() == ErrorCode.none, "the current generation may commit while others rejoin"
        a_join = pool.submit(a.join)
        a_result, b_result = a_join.result(15), b_join.result(15)
    assert a_result.error_code == b_result.error_code == ErrorCode.none
    assert a_result.generation_id == b_result.generation_id == 2
    leader, follower = (a, b) if a_result.leader == a.member_id else (b, a)
    # The follower's SyncGroup waits for the leader's; heartbeats of the old generation are now illegal.
    assert follower.heartbeat(generation=1) == ErrorCode.illegal_generation
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(follower.sync)
        assert leader.sync(assignments=[(a.member_id, b"A"), (b.member_id, b"B")]) == ErrorCode.none
        assert waiting.result(10) == ErrorCode.none

    # Static membership: a static member replaced by a new incarnation fences the old member id.
    # s1's join must start the rebalance: were a and b to rejoin first, they could complete one of their
    # own and s1 would then lead a later generation alone, as in Kafka.
    s1 = RawMember(broker.bootstrap, instance_id="static-1")
    previous_leader = leader
    with ThreadPoolExecutor(3) as pool:
        s1_join = pool.submit(s1.join)
        wait_until(lambda: a.heartbeat() == ErrorCode.rebalance_in_progress, what="a to hear of the rebalance",
                   timeout_s=10.0)
        jobs = [s1_join, pool.submit(a.join), pool.submit(b.join)]
        results = [job.result(15) for job in jobs]
    assert all(r.error_code == ErrorCode.none for r in results), [r.error_code for r in results]
    assert len({r.generation_id for r in results}) == 1, [r.generation_id for r in results]
    leader = next(m for m, r in zip((s1, a, b), results, strict=True) if r.leader == m.member_id)
    assert leader is previous_leader, "the leader of a rebalance stays the leader when it rejoins"
    with ThreadPoolExecutor(2) as pool:
        followers = [pool.submit(m.sync) for m in (s1, a, b) if m is not leader]
        assert leader.sync(assignments=[(s1.member_id, b"S"), (a.member_id, b"A"), (b.member_id, b"B")]) == 0
        assert all(f.result(10) == ErrorCode.none for f in followers)
    old_id = s1.member_id
    s2 = RawMember(broker.bootstrap, instance_id="static-1")
    restarted = s2.join()
    assert restarted.error_code == ErrorCode.none and restarted.member_id != old_id
    assert s1.heartbeat() == ErrorCode.fenced_instance_id
    # No rebalance for a follower's quick restart: the generation and its assignment are kept.
    assert restarted.generation_id == s1.generation
    s2.generation = restarted.generation_id
    assert s2.sync() == ErrorCode.none
    assert s2.assignment == b"S", "the restarted static member gets its old assignment back"
    assert a.heartbeat() == ErrorCode.none

    # LeaveGroup v3 in batch form: per-member errors.
    leave = a.client.request(lg_rq.LeaveGroupRequest(group_id=GROUP, members=(
        lg_rq.MemberIdentity(member_id=a.member_id, group_instance_id=None),
        lg_rq.MemberIdentity(member_id=b.member_id, group_instance_id=None),
        lg_rq.MemberIdentity(member_id="", group_instance_id="static-1"),
        lg_rq.MemberIdentity(member_id="ghost", group_instance_id=None),
    )), lg_rs.LeaveGroupResponse)
    assert leave.error_code == ErrorCode.none
    assert [m.error_code for m in leave.members] == [0, 0, 0, ErrorCode.unknown_member_id]

    # The group is not wedged: a real consumer joins it and reads everything after the committed offset 1.
    consumer = KafkaConsumer(TOPIC, bootstrap_servers=broker.bootstrap, group_id=GROUP, enable_auto_commit=False,
                             auto_offset_reset="earliest", session_timeout_ms=3000, heartbeat_interval_ms=300)
    got = set()
    try:
        deadline = time.monotonic() + 60
        while len(got) < len(values) - 1 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got |= {(r.partition, r.offset) for r in records}
    finally:
        consumer.close()
    expected = {(0, o) for o in range(1, 25)} | {(1, o) for o in range(25)}
    assert got == expected
    for member in (a, b, s1, s2):
        member.client.close()


@pytest.mark.timeout(120)
def test_graceful_shutdown_answers_a_parked_join(broker_factory, tmp_path):
    """SIGTERM does not wait out a rebalance: a parked JoinGroup gets COORDINATOR_NOT_AVAILABLE at once."""
    broker = start_broker(broker_factory, tmp_path)
    wait_until_coordinator_active(broker.bootstrap)
    a, b = RawMember(broker.bootstrap), RawMember(broker.bootstrap)
    a.join(rebalance_ms=120_000)
    assert a.join(rebalance_ms=120_000).error_code == ErrorCode.none
    assert a.sync(assignments=[(a.member_id, b"")]) == ErrorCode.none
    assert b.join().error_code == ErrorCode.member_id_required
    with ThreadPoolExecutor(1) as pool:
        parked = pool.submit(b.join)  # waits for a to rejoin: up to a's 120 s rebalance timeout
        wait_until(lambda: a.heartbeat() == ErrorCode.rebalance_in_progress, what="a to hear of the rebalance",
                   timeout_s=10.0)
        assert not parked.done()
        assert broker.stop() == 0
        assert parked.result(5).error_code == ErrorCode.coordinator_not_available
    assert "did not finish within" not in broker.log_text()
    a.client.close()
    b.client.close()
