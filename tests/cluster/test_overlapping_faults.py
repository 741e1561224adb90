"""Faults that overlap: windows of the replication code that one fault at a time with calm in between never
opens (issue: replication that survives overlapping faults). Real broker processes on a real etcd; where
timing alone cannot open a window, a delay point (``broker.storage._failpoints``) widens it.

- A follower still truncating is elected leader: the truncation was decided against a leader that died at
  once, and must not cut the records the replica acknowledges as the next leader. Role changes wait for the
  truncation in progress (``Partition.mutate_as_follower``), so it leads only the log the cut left.
- A follower's fetch offset past the leader's log end is refused (OFFSET_OUT_OF_RANGE) before it is
  credited: the high watermark does not move over records that replica does not have.
- An ISR change whose etcd write timed out but committed: etcd lists the new member, which may be elected
  next, so the leader keeps counting it (KIP-497's maximal ISR) until it knows the outcome. A gRPC proxy in
  front of etcd drops the write's answer after etcd applied it and holds the brokers' watch streams, so no
  image tells the leader meanwhile.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import threading
import time

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v11 import request as fetch_v11

from tests.support.batches import build_batch, records_of
from tests.support.cluster import log_end, produce_acks_all
from tests.support.kio_requests import KafkaWire, list_offsets, produce
from tests.support.log_files import read_partition_log
from tests.support.polling import wait_until
from tests.support.topics import unique_topic

# Long enough for the leader of the truncation's epoch to die, its lease (2 s) to run out and the
# truncating replica to be elected, with a margin for a loaded machine.
TRUNCATION_DELAY_S = 10.0


def test_a_replica_elected_while_it_truncates_never_cuts_what_it_acknowledged(cluster_factory):
    cluster = cluster_factory(3, start=False)
    first, second, third = 1, 2, 3
    cluster.brokers[third].env = {"COPYLESS_DELAYPOINTS": f"truncate.before_cut={TRUNCATION_DELAY_S}"}
    cluster.start()
    topic = unique_topic("overlap")
    # min.insync.replicas=1: the third replica, alone in the ISR once the other two are dead, acknowledges.
    cluster.create_topic(topic, 1, 3, replica_assignment=[[first, second, third]],
                         configs={"min.insync.replicas": "1"})
    start = cluster.wait_for_isr(topic, 1, 3)[0]
    assert start.leader == first
    common = produce_acks_all(cluster.bootstrap, topic, [f"common-{i}".encode() for i in range(20)])
    assert common == list(range(20))
    wait_until(lambda: all(log_end(cluster, n, topic) == 20 for n in cluster.brokers),
               what="every replica at 20", timeout_s=30)

    # 1. The second replica pauses (well within its lease) while the leader takes acks=1 writes, one record
    #    a batch: the third copies them all; the second gets at most the first, in the answer to the long
    #    poll it had sent before the pause (a paused replica sends no further fetch). Then the leader dies
    #    and the second resumes.
    os.kill(cluster.brokers[second].pid, signal.SIGSTOP)
    try:
        wire = KafkaWire(cluster.brokers[first].port, host=cluster.brokers[first].host)
        try:
            for i in range(10):
                answer = produce(wire, topic, {0: build_batch([f"tail-{i}".encode()])},
                                 acks=1).responses[0].partition_responses[0]
                assert answer.error_code == ErrorCode.none
                if i == 0:
                    time.sleep(0.3)  # the pending long polls answer with this batch alone
        finally:
            wire.close()
        wait_until(lambda: log_end(cluster, third, topic) == 30, what="the third replica at 30", timeout_s=5)
        cluster.brokers[first].kill()
    finally:
        os.kill(cluster.brokers[second].pid, signal.SIGCONT)

    # 2. The second is elected (the first live ISR member in assignment order); the third follows it and
    #    starts cutting its tail (20-29) on a worker thread, held there by the delay point.
    third_broker = cluster.brokers[third]
    started = wait_until(lambda: re.search(rf"{re.escape(topic)}-0: truncating from 30 to (2[01]) ",
                                           third_broker.log_text()),
                         what="the third replica to start truncating to the second's log", timeout_s=30)
    cut = int(started.group(1))
    truncation_started = time.monotonic()

    # 3. The second dies at once: the third, still truncating, is the only ISR member left and is elected.
    cluster.brokers[second].kill()
    acked_values = [f"acked-{i}".encode() for i in range(10)]
    offsets = produce_acks_all(third_broker.bootstrap, topic, acked_values)
    assert time.monotonic() - truncation_started < TRUNCATION_DELAY_S + 30

    # 4. Once the truncation has ended, every record the third acknowledged is in its log at its offset.
    wait_until(lambda: re.search(rf"{re.escape(topic)}-0: truncated from offset \d+ to {cut}", third_broker.log_text()),
               what="the third replica's truncation to end", timeout_s=TRUNCATION_DELAY_S + 20)
    time.sleep(0.5)
    stored = {r.offset: r.value for r in records_of(b"".join(
        batch.data for batch in read_partition_log(third_broker.data_dir, topic, 0)))}
    lost = [(offset, value) for offset, value in zip(offsets, acked_values, strict=True) if stored.get(offset) != value]
    assert not lost, (f"acknowledged records missing from the leader's log after its truncation ended: {lost} "
                      f"(offsets acknowledged {offsets}, log end {max(stored, default=-1) + 1})")
    assert [stored[o] for o in range(20)] == [f"common-{i}".encode() for i in range(20)]
    assert offsets == list(range(cut, cut + 10)), "the new leader did not lead the log its truncation left"


def forged_follower_fetch(wire: KafkaWire, topic: str, replica_id: int, offset: int):
    request = fetch_v11.FetchRequest(
        replica_id=replica_id, max_wait=datetime.timedelta(0), min_bytes=1, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1,
        topics=(fetch_v11.FetchTopic(topic=topic, partitions=(fetch_v11.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=offset, log_start_offset=-1,
            partition_max_bytes=1 << 20),)),),
        forgotten_topics_data=(), rack_id="")
    return wire.request(request).responses[0].partitions[0]


def test_a_follower_fetch_offset_past_the_leaders_log_end_is_refused_and_moves_no_high_watermark(cluster_factory):
    cluster = cluster_factory(3)
    leader_id, follower, lagging = 1, 2, 3
    topic = unique_topic("pastend")
    cluster.create_topic(topic, 1, 3, replica_assignment=[[leader_id, follower, lagging]],
                         configs={"min.insync.replicas": "1"})
    cluster.wait_for_isr(topic, 1, 3)
    leader = cluster.brokers[leader_id]
    wire = KafkaWire(leader.port, host=leader.host)
    try:  # the metadata names the leader a moment before it has applied the state
        wait_until(lambda: list_offsets(wire, topic, -1).error_code == ErrorCode.none,
                   what="the leader to serve the partition", timeout_s=10)
    finally:
        wire.close()
    # The third replica stops fetching (paused, still in the ISR for replica.lag.time.max.ms, 4 s): the high
    # watermark waits for it.
    os.kill(cluster.brokers[lagging].pid, signal.SIGSTOP)
    wire = KafkaWire(leader.port, host=leader.host)
    try:
        answer = produce(wire, topic, {0: build_batch([f"r-{i}".encode() for i in range(10)])},
                         acks=1).responses[0].partition_responses[0]
        assert answer.error_code == ErrorCode.none and answer.base_offset == 0
        wait_until(lambda: log_end(cluster, follower, topic) == 10, what="the follower at 10", timeout_s=3)
        assert list_offsets(wire, topic, -1).offset == 0, "the high watermark passed the paused replica"
        # A fetch in the paused replica's name claims records the leader does not have.
        forged = forged_follower_fetch(wire, topic, lagging, 1_000)
        assert forged.error_code == ErrorCode.offset_out_of_range, ErrorCode(forged.error_code)
        assert list_offsets(wire, topic, -1).offset == 0, "a fetch offset past the log end moved the high watermark"
    finally:
        wire.close()
        os.kill(cluster.brokers[lagging].pid, signal.SIGCONT)
    # The paused replica catches up for real and the high watermark follows.
    wire = KafkaWire(leader.port, host=leader.host)
    try:
        wait_until(lambda: list_offsets(wire, topic, -1).offset == 10, what="the high watermark at 10", timeout_s=30)
    finally:
        wire.close()


def stored_isr(cluster, topic: str) -> list[int]:
    """The partition's ISR as etcd holds it now, read with etcdctl around the proxy."""
    out = cluster.etcd_direct.etcdctl("get", "--prefix", f"/{cluster.root}/")
    lines = out.splitlines()
    for key, value in zip(lines[::2], lines[1::2], strict=True):
        if key.endswith(f"/partitions/{topic}/0"):
            return json.loads(value)["isr"]
    raise AssertionError(f"no state key for {topic}-0 under /{cluster.root}/")


def test_an_isr_write_whose_answer_was_lost_keeps_the_new_member_counted(etcd_server, tmp_path):
    from tests.support.cluster import Cluster
    from tests.support.etcd_proxy import TXN, EtcdFaultProxy

    proxy = EtcdFaultProxy(etcd_server.endpoint).start()
    cluster = Cluster(tmp_path / "cluster", proxy, 3, config={"min.insync.replicas": 1})
    leader_id, steady, joining = 1, 2, 3
    release = None
    try:
        cluster.etcd_direct = etcd_server
        cluster.start()
        topic = unique_topic("lostisr")
        cluster.create_topic(topic, 1, 3, replica_assignment=[[leader_id, steady, joining]])
        cluster.wait_for_isr(topic, 1, 3)
        # The joining replica leaves the ISR (killed) and comes back: its leader proposes [1, 2, 3] once it has
        # caught up, and that write's answer is lost after etcd applied it.
        port = cluster.brokers[joining].port
        cluster.brokers[joining].kill()
        wait_until(lambda: cluster.metadata([topic], via=leader_id).topics[topic][0].isr == (leader_id, steady),
                   what="the ISR without the killed replica", timeout_s=30)
        lost = proxy.lose_answer(TXN, b'"isr":[1,2,3]', hold_watches=True)
        cluster.brokers[joining].start(port=port)
        wait_until(lambda: lost.lost, what="the leader's ISR write adding the replica back", timeout_s=30)
        # The write committed (etcd lists the replica); the replica stops before it gets any newer record.
        os.kill(cluster.brokers[joining].pid, signal.SIGSTOP)
        release = threading.Timer(4.0, proxy.release_watches)
        release.start()
        wire = KafkaWire(cluster.brokers[leader_id].port, host=cluster.brokers[leader_id].host)
        try:
            answer = produce(wire, topic, {0: build_batch([b"after-the-lost-answer"])}, acks=-1,
                             timeout_ms=30000).responses[0].partition_responses[0]
        finally:
            wire.close()
        assert answer.error_code == ErrorCode.none, ErrorCode(answer.error_code)
        # Acknowledged: either every replica etcd lists in the ISR has the record, or the ISR no longer
        # lists the one that lacks it (the ISR only shrinks while that replica is paused).
        isr = stored_isr(cluster, topic)
        assert joining not in isr or log_end(cluster, joining, topic) > answer.base_offset, (
            f"offset {answer.base_offset} acknowledged while etcd lists node {joining} in the ISR {isr} and its "
            f"log ends at {log_end(cluster, joining, topic)}: electing it loses the record")
        assert "has no definite answer" in cluster.brokers[leader_id].log_text()
    finally:
        if release is not None:
            release.cancel()
            proxy.release_watches()
        if cluster.brokers[joining].alive():
            os.kill(cluster.brokers[joining].pid, signal.SIGCONT)
        cluster.stop()
        proxy.close()
