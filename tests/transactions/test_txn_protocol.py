"""Transactions on the wire, request by request (kio entities over a socket): the coordinator's answers, the
partition side (LSO, aborted transactions, markers) and the error codes Kafka 3.9 gives for misuse.

One broker for the module; every test uses its own transactional id and topic.
"""

from __future__ import annotations

import datetime
import time
import uuid

import pytest
from kio.schema.add_offsets_to_txn.v3 import request as add_offsets_v3
from kio.schema.add_partitions_to_txn.v1 import request as add_v1
from kio.schema.add_partitions_to_txn.v3 import request as add_v3
from kio.schema.describe_transactions.v0 import request as describe_v0
from kio.schema.end_txn.v3 import request as end_v3
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v11 import request as fetch_v11
from kio.schema.find_coordinator.v2 import request as find_v2
from kio.schema.init_producer_id.v4 import request as init_v4
from kio.schema.list_offsets.v5 import request as list_offsets_v5
from kio.schema.list_transactions.v0 import request as list_v0
from kio.schema.offset_commit.v7 import request as commit_v7
from kio.schema.offset_fetch.v5 import request as fetch_offsets_v5
from kio.schema.offset_fetch.v7 import request as fetch_offsets_v7
from kio.schema.offset_fetch.v8 import request as fetch_offsets_v8
from kio.schema.produce.v8 import request as produce_v8
from kio.schema.txn_offset_commit.v3 import request as txn_commit_v3
from kio.schema.write_txn_markers.v1 import request as markers_v1

from tests.support import batches
from tests.support.kio_requests import MS, KafkaWire, create_topic
from tests.support.polling import wait_until

pytestmark = pytest.mark.timeout(60)

TRANSACTIONAL = 0x10


@pytest.fixture
def wire(broker):
    client = KafkaWire(broker.port)
    yield client
    client.close()


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _init(wire, tid: str, timeout_ms: int = 60_000):
    response = wire.request(init_v4.InitProducerIdRequest(transactional_id=tid, transaction_timeout=timeout_ms * MS,
                                                          producer_id=-1, producer_epoch=-1))
    return ErrorCode(response.error_code), response.producer_id, response.producer_epoch


def _add(wire, tid, pid, epoch, topic, partitions, module=add_v3):
    response = wire.request(module.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=(module.AddPartitionsToTxnTopic(name=topic, partitions=tuple(partitions)),)))
    return {(t.name, p.partition_index): ErrorCode(p.partition_error_code)
            for t in response.results_by_topic_v3_and_below for p in t.results_by_partition}


def _end(wire, tid, pid, epoch, commit: bool):
    response = wire.request(end_v3.EndTxnRequest(transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                                                 committed=commit))
    return ErrorCode(response.error_code)


def _produce(wire, topic, records, tid):
    response = wire.request(produce_v8.ProduceRequest(
        transactional_id=tid, acks=-1, timeout=5000 * MS, topic_data=(produce_v8.TopicProduceData(
            name=topic, partition_data=(produce_v8.PartitionProduceData(index=0, records=records),)),)))
    partition = response.responses[0].partition_responses[0]
    return ErrorCode(partition.error_code), partition.base_offset


def _txn_batch(values, pid, epoch, sequence):
    return batches.keyed_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=sequence,
                               attributes_extra=TRANSACTIONAL)


def _fetch(wire, topic, offset, isolation):
    response = wire.request(fetch_v11.FetchRequest(
        max_wait=0 * MS, min_bytes=1, max_bytes=1 << 20, isolation_level=isolation, session_id=0, session_epoch=-1,
        forgotten_topics_data=(), rack_id="", topics=(fetch_v11.FetchTopic(topic=topic, partitions=(
            fetch_v11.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20),)),)))
    return response.responses[0].partitions[0]


def _latest(wire, topic, isolation):
    response = wire.request(list_offsets_v5.ListOffsetsRequest(
        replica_id=-1, isolation_level=isolation, topics=(list_offsets_v5.ListOffsetsTopic(name=topic, partitions=(
            list_offsets_v5.ListOffsetsPartition(partition_index=0, timestamp=-1, current_leader_epoch=-1),)),)))
    return response.topics[0].partitions[0].offset


def _setup(wire):
    topic, tid = _name("txnp"), _name("tid")
    assert create_topic(wire, topic).error_code == ErrorCode.none
    code, pid, epoch = _init(wire, tid)
    assert code == ErrorCode.none and pid >= 0 and epoch == 0
    return topic, tid, pid, epoch


def test_find_coordinator_names_this_broker_for_a_transactional_id(wire, broker):
    response = wire.request(find_v2.FindCoordinatorRequest(key=_name("tid"), key_type=1))
    assert ErrorCode(response.error_code) == ErrorCode.none
    assert response.port == broker.port


def test_an_aborted_transaction_is_hidden_by_the_lso_then_by_the_aborted_list(wire):
    topic, tid, pid, epoch = _setup(wire)
    assert _produce(wire, topic, batches.keyed_batch([b"plain"]), None) == (ErrorCode.none, 0)
    assert _add(wire, tid, pid, epoch, topic, [0]) == {(topic, 0): ErrorCode.none}
    assert _produce(wire, topic, _txn_batch([b"t0", b"t1"], pid, epoch, 0), tid) == (ErrorCode.none, 1)

    committed = _fetch(wire, topic, 0, isolation=1)
    assert (committed.high_watermark, committed.last_stable_offset) == (3, 1)
    assert batches.values_of(committed.records) == [b"plain"]
    assert _latest(wire, topic, isolation=1) == 1
    assert _latest(wire, topic, isolation=0) == 3
    assert _fetch(wire, topic, 1, isolation=1).records in (None, b"")
    assert batches.values_of(_fetch(wire, topic, 0, isolation=0).records) == [b"plain", b"t0", b"t1"]

    assert _end(wire, tid, pid, epoch, commit=False) == ErrorCode.none
    after = _fetch(wire, topic, 0, isolation=1)
    assert (after.high_watermark, after.last_stable_offset) == (4, 4)  # the batch, then the ABORT marker at 3
    assert [(a.producer_id, a.first_offset) for a in after.aborted_transactions] == [(pid, 1)]
    headers = batches.batch_headers(after.records)
    assert [h.base_offset for h in headers] == [0, 1, 3]
    assert headers[2].attributes & 0x30 == 0x30  # the marker: transactional and control
    # A fetch that starts after the aborted transaction's marker is not told about it.
    assert _fetch(wire, topic, 4, isolation=1).aborted_transactions == ()


def test_a_committed_transaction_carries_no_aborted_entry(wire):
    topic, tid, pid, epoch = _setup(wire)
    assert _add(wire, tid, pid, epoch, topic, [0]) == {(topic, 0): ErrorCode.none}
    assert _produce(wire, topic, _txn_batch([b"c0"], pid, epoch, 0), tid)[0] == ErrorCode.none
    assert _end(wire, tid, pid, epoch, commit=True) == ErrorCode.none
    # A retried EndTxn of the same outcome succeeds; the other outcome is refused.
    assert _end(wire, tid, pid, epoch, commit=True) == ErrorCode.none
    assert _end(wire, tid, pid, epoch, commit=False) == ErrorCode.invalid_txn_state
    fetched = _fetch(wire, topic, 0, isolation=1)
    assert fetched.last_stable_offset == fetched.high_watermark == 2
    assert fetched.aborted_transactions == ()
    headers = batches.batch_headers(fetched.records)
    assert [(h.base_offset, h.attributes & 0x30) for h in headers] == [(0, 0x10), (1, 0x30)]  # the batch, the marker
    assert batches.values_of(fetched.records)[0] == b"c0"


def test_misuse_gets_kafkas_error_codes(wire):
    topic, tid, pid, epoch = _setup(wire)
    assert _end(wire, tid, pid, epoch, commit=True) == ErrorCode.invalid_txn_state  # nothing begun
    assert _add(wire, tid, pid + 1000, epoch, topic, [0]) == {(topic, 0): ErrorCode.invalid_producer_id_mapping}
    assert _add(wire, tid, pid, epoch + 1, topic, [0]) == {(topic, 0): ErrorCode.producer_fenced}
    # AddPartitionsToTxn v1 predates PRODUCER_FENCED (KIP-588): its clients get INVALID_PRODUCER_EPOCH.
    assert _add(wire, tid, pid, epoch + 1, topic, [0], module=add_v1) == {
        (topic, 0): ErrorCode.invalid_producer_epoch}
    missing = _name("missing")
    both = wire.request(add_v3.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=(add_v3.AddPartitionsToTxnTopic(name=topic, partitions=(0,)),
                             add_v3.AddPartitionsToTxnTopic(name=missing, partitions=(0,)))))
    codes = {t.name: ErrorCode(t.results_by_partition[0].partition_error_code)
             for t in both.results_by_topic_v3_and_below}
    assert codes == {topic: ErrorCode.operation_not_attempted, missing: ErrorCode.unknown_topic_or_partition}
    # A transactional batch outside an ongoing transaction that holds the partition, or without the id.
    assert _produce(wire, topic, _txn_batch([b"x"], pid, epoch, 0), tid)[0] == ErrorCode.invalid_txn_state
    assert _produce(wire, topic, _txn_batch([b"x"], pid, epoch, 0), None)[0] == ErrorCode.invalid_record
    assert _init(wire, _name("tid"), timeout_ms=900_001)[0] == ErrorCode.invalid_transaction_timeout
    assert _init(wire, "")[0] == ErrorCode.invalid_request
    # Nothing of it reached the log.
    assert _fetch(wire, topic, 0, isolation=0).high_watermark == 0


def test_a_new_producer_fences_the_old_and_aborts_its_transaction(wire):
    topic, tid, pid, epoch = _setup(wire)
    assert _add(wire, tid, pid, epoch, topic, [0]) == {(topic, 0): ErrorCode.none}
    assert _produce(wire, topic, _txn_batch([b"old"], pid, epoch, 0), tid)[0] == ErrorCode.none
    # The first InitProducerId aborts the open transaction at a bumped epoch and asks for a retry.
    assert _init(wire, tid)[0] == ErrorCode.concurrent_transactions
    code, new_pid, new_epoch = wait_until(lambda: (lambda r: r if r[0] == ErrorCode.none else None)(_init(wire, tid)),
                                          what="InitProducerId once the abort completed", timeout_s=10)
    assert (new_pid, new_epoch) == (pid, epoch + 2)
    assert _end(wire, tid, pid, epoch, commit=True) == ErrorCode.producer_fenced
    assert _add(wire, tid, pid, epoch, topic, [0]) == {(topic, 0): ErrorCode.producer_fenced}
    fetched = _fetch(wire, topic, 0, isolation=1)
    assert [(a.producer_id, a.first_offset) for a in fetched.aborted_transactions] == [(pid, 0)]
    assert fetched.last_stable_offset == fetched.high_watermark == 2
    # The zombie's late batch meets the abort marker's newer epoch on the partition.
    assert _add(wire, tid, new_pid, new_epoch, topic, [0]) == {(topic, 0): ErrorCode.none}
    assert _produce(wire, topic, _txn_batch([b"late"], pid, epoch, 1), tid)[0] == ErrorCode.invalid_producer_epoch


def test_describe_and_list_transactions(wire):
    topic, tid, pid, epoch = _setup(wire)
    assert _add(wire, tid, pid, epoch, topic, [0]) == {(topic, 0): ErrorCode.none}
    # (An unknown id is answered TRANSACTIONAL_ID_NOT_FOUND with start time -1, as Kafka does, which kio's
    # reader refuses to parse: only the known one is asked here.)
    described = wire.request(describe_v0.DescribeTransactionsRequest(transactional_ids=(tid,)))
    (ongoing,) = described.transaction_states
    assert (ErrorCode(ongoing.error_code), ongoing.transaction_state, ongoing.producer_id) == (
        ErrorCode.none, "Ongoing", pid)
    assert [(t.topic, tuple(t.partitions)) for t in ongoing.topics] == [(topic, (0,))]
    assert ongoing.transaction_timeout == datetime.timedelta(seconds=60)
    assert abs(ongoing.transaction_start_time.timestamp() - time.time()) < 60
    listed = wire.request(list_v0.ListTransactionsRequest(state_filters=("Ongoing", "Nonsense"),
                                                          producer_id_filters=()))
    assert tid in {t.transactional_id for t in listed.transaction_states}
    assert listed.unknown_state_filters == ("Nonsense",)
    assert _end(wire, tid, pid, epoch, commit=False) == ErrorCode.none


def test_the_cli_lists_and_describes_transactional_ids(wire, broker):
    import json
    import subprocess
    import sys

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "copyless.broker", "transactions", *args, "--bootstrap",
                               broker.bootstrap, "--json"], capture_output=True, text=True, timeout=60)

    topic, tid, pid, epoch = _setup(wire)
    assert _add(wire, tid, pid, epoch, topic, [0]) == {(topic, 0): ErrorCode.none}
    listed = cli("list")
    assert listed.returncode == 0, listed.stderr
    ongoing = {"transactional_id": tid, "producer_id": pid, "state": "Ongoing", "coordinator": 0}
    assert ongoing in json.loads(listed.stdout)
    described = cli("describe", tid)
    assert described.returncode == 0, described.stderr
    shown = json.loads(described.stdout)
    assert (shown["state"], shown["producer_epoch"], shown["partitions"]) == ("Ongoing", epoch, [f"{topic}-0"])
    assert _end(wire, tid, pid, epoch, commit=False) == ErrorCode.none
    assert wait_until(lambda: _init(wire, tid)[0] == ErrorCode.none, what="a new epoch", timeout_s=10)
    # An id with no transaction started: Kafka's start time -1 on the wire, read back as such.
    empty = json.loads(cli("describe", tid).stdout)
    assert (empty["state"], empty["start_ms"], empty["producer_epoch"], empty["partitions"]) == (
        "Empty", -1, epoch + 1, [])
    missing = cli("describe", _name("missing"))
    assert missing.returncode != 0 and "TRANSACTIONAL_ID_NOT_FOUND" in missing.stderr


@pytest.mark.parametrize("point", ["txn.after_prepare", "txn.after_markers"])
def test_a_coordinator_killed_while_committing_completes_the_commit_on_restart(broker_factory, monkeypatch, point):
    """kill -9 once the decision (PrepareCommit) is stored but no marker written, or once every marker is
    written but CompleteCommit is not: the restarted coordinator finds PrepareCommit in
    ``__transaction_state`` and writes the markers (again): the transaction is committed, its records read
    once by read_committed consumers, and the producer's retried EndTxn succeeds."""
    monkeypatch.setenv("COPYLESS_FAILPOINT", point)
    broker = broker_factory()
    monkeypatch.delenv("COPYLESS_FAILPOINT")
    wire = KafkaWire(broker.port)
    topic, tid, pid, epoch = _setup(wire)
    assert _add(wire, tid, pid, epoch, topic, [0]) == {(topic, 0): ErrorCode.none}
    assert _produce(wire, topic, _txn_batch([b"k0", b"k1"], pid, epoch, 0), tid)[0] == ErrorCode.none
    try:
        # after_prepare: the broker dies before it answers; after_markers: it answers (the markers are
        # written), then dies before storing CompleteCommit.
        answered = _end(wire, tid, pid, epoch, commit=True)
    except (ConnectionError, OSError):
        answered = None
    assert answered is None if point == "txn.after_prepare" else answered in (None, ErrorCode.none)
    wire.close()
    broker.process.wait(30)
    assert broker.process.returncode == -9
    broker.restart("kill")
    wire = KafkaWire(broker.port)
    try:
        def committed():
            fetched = _fetch(wire, topic, 0, isolation=1)
            return fetched if fetched.last_stable_offset == fetched.high_watermark > 1 else None

        fetched = wait_until(committed, what="the commit completed after the restart", timeout_s=30)
        headers = batches.batch_headers(fetched.records)
        assert [h.base_offset for h in headers if not h.attributes & 0x20] == [0]
        assert fetched.aborted_transactions == ()
        assert batches.values_of(fetched.records)[:2] == [b"k0", b"k1"]
        assert wait_until(lambda: _end(wire, tid, pid, epoch, commit=True) == ErrorCode.none,
                          what="the retried EndTxn answered", timeout_s=10)
    finally:
        wire.close()


def _send_offsets(wire, tid, pid, epoch, group, topic, offset):
    """AddOffsetsToTxn then TxnOffsetCommit of ``offset`` for partition 0 of ``topic`` (a simple group)."""
    added = wire.request(add_offsets_v3.AddOffsetsToTxnRequest(transactional_id=tid, producer_id=pid,
                                                               producer_epoch=epoch, group_id=group))
    assert ErrorCode(added.error_code) == ErrorCode.none
    response = wire.request(txn_commit_v3.TxnOffsetCommitRequest(
        transactional_id=tid, group_id=group, producer_id=pid, producer_epoch=epoch,
        topics=(txn_commit_v3.TxnOffsetCommitRequestTopic(name=topic, partitions=(
            txn_commit_v3.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=offset,
                                                                 committed_metadata=""),)),)))
    assert [ErrorCode(p.error_code) for t in response.topics for p in t.partitions] == [ErrorCode.none]


def _committed(wire, group, topic):
    """The group's committed offset of partition 0 of ``topic``, or None while its coordinator loads."""
    response = wire.request(fetch_offsets_v5.OffsetFetchRequest(group_id=group, topics=(
        fetch_offsets_v5.OffsetFetchRequestTopic(name=topic, partition_indexes=(0,)),)))
    if ErrorCode(response.error_code) == ErrorCode.coordinator_load_in_progress:
        return None
    assert ErrorCode(response.error_code) == ErrorCode.none
    return response.topics[0].partitions[0].committed_offset


def test_offsets_of_a_commit_whose_marker_lands_while_their_group_loads_are_committed(broker_factory, monkeypatch):
    """The coordinator dies once PrepareCommit is stored (``txn.after_prepare``) for a transaction holding
    offsets of a group. On restart it writes the markers again, the one for the group's ``__consumer_offsets``
    partition while the group coordinator loads that partition (delay point ``groups.load.replayed``: the
    replay has read the log, the shard does not serve from it yet). The offsets must be committed all the
    same: once lost between the replay and the marker, they stayed pending for good, and the group's next
    member restarted from the offsets before them."""
    monkeypatch.setenv("COPYLESS_FAILPOINT", "txn.after_prepare")
    broker = broker_factory()
    monkeypatch.delenv("COPYLESS_FAILPOINT")
    wire = KafkaWire(broker.port)
    topic, tid, pid, epoch = _setup(wire)
    group = _name("group")
    assert _add(wire, tid, pid, epoch, topic, [0]) == {(topic, 0): ErrorCode.none}
    assert _produce(wire, topic, _txn_batch([b"r0"], pid, epoch, 0), tid)[0] == ErrorCode.none
    _send_offsets(wire, tid, pid, epoch, group, topic, 1)
    with pytest.raises((ConnectionError, OSError)):
        _end(wire, tid, pid, epoch, commit=True)
    wire.close()
    broker.process.wait(30)
    assert broker.process.returncode == -9
    monkeypatch.setenv("COPYLESS_DELAYPOINTS", "groups.load.replayed=2")
    broker.restart("kill")
    monkeypatch.delenv("COPYLESS_DELAYPOINTS")
    wire = KafkaWire(broker.port)
    try:
        # The commit completes (the retried EndTxn succeeds once Complete* is stored), then the group loads.
        assert wait_until(lambda: _end(wire, tid, pid, epoch, commit=True) == ErrorCode.none,
                          what="the retried EndTxn answered", timeout_s=20)
        assert wait_until(lambda: _committed(wire, group, topic) is not None, what="the group loaded",
                          timeout_s=20)
        assert _committed(wire, group, topic) == 1
    finally:
        wire.close()


# --- KIP-447: OffsetFetch require_stable, TxnOffsetCommit v3 ------------------------------------------------


def _commit_plain(wire, group, topic, offsets):
    response = wire.request(commit_v7.OffsetCommitRequest(
        group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=(commit_v7.OffsetCommitRequestTopic(
            name=topic, partitions=tuple(commit_v7.OffsetCommitRequestPartition(
                partition_index=p, committed_offset=o, committed_metadata="") for p, o in offsets.items())),)))
    assert {ErrorCode(p.error_code) for t in response.topics for p in t.partitions} == {ErrorCode.none}


def _txn_commit(wire, tid, pid, epoch, group, topic, offsets, *, generation=-1, member=""):
    response = wire.request(add_offsets_v3.AddOffsetsToTxnRequest(
        transactional_id=tid, producer_id=pid, producer_epoch=epoch, group_id=group))
    assert ErrorCode(response.error_code) == ErrorCode.none
    response = wire.request(txn_commit_v3.TxnOffsetCommitRequest(
        transactional_id=tid, group_id=group, producer_id=pid, producer_epoch=epoch, generation_id=generation,
        member_id=member, topics=(txn_commit_v3.TxnOffsetCommitRequestTopic(name=topic, partitions=tuple(
            txn_commit_v3.TxnOffsetCommitRequestPartition(partition_index=p, committed_offset=o,
                                                          committed_metadata="") for p, o in offsets.items())),)))
    return {p.partition_index: ErrorCode(p.error_code) for t in response.topics for p in t.partitions}


def _fetch_offsets(wire, group, topic, partitions, *, stable, module=fetch_offsets_v7):
    fields = dict(group_id=group, topics=(module.OffsetFetchRequestTopic(name=topic, partition_indexes=partitions),))
    if module is fetch_offsets_v7:
        fields["require_stable"] = stable
    response = wire.request(module.OffsetFetchRequest(**fields))
    assert ErrorCode(response.error_code) == ErrorCode.none
    return {p.partition_index: (ErrorCode(p.error_code), p.committed_offset)
            for t in response.topics for p in t.partitions}


def test_require_stable_answers_unstable_while_a_transaction_holds_the_offset(wire):
    topic, tid, pid, epoch = _setup(wire)
    group = _name("g447")
    _commit_plain(wire, group, topic, {0: 2})
    assert _txn_commit(wire, tid, pid, epoch, group, topic, {0: 5}) == {0: ErrorCode.none}
    # The transaction is open: a stable fetch gets UNSTABLE_OFFSET_COMMIT for the partition it holds, the
    # others (partition 1: nothing committed) their offset; an unstable fetch (and v5) the committed 2.
    assert _fetch_offsets(wire, group, topic, [0, 1], stable=True) == {
        0: (ErrorCode.unstable_offset_commit, -1), 1: (ErrorCode.none, -1)}
    assert _fetch_offsets(wire, group, topic, [0], stable=False) == {0: (ErrorCode.none, 2)}
    assert _fetch_offsets(wire, group, topic, [0], stable=True, module=fetch_offsets_v5) == {0: (ErrorCode.none, 2)}
    # v8: several groups in one request, each answered on its own.
    other = _name("g447")
    _commit_plain(wire, other, topic, {0: 9})
    response = wire.request(fetch_offsets_v8.OffsetFetchRequest(require_stable=True, groups=tuple(
        fetch_offsets_v8.OffsetFetchRequestGroup(group_id=g, topics=(
            fetch_offsets_v8.OffsetFetchRequestTopics(name=topic, partition_indexes=(0,)),)) for g in (group, other))))
    assert [(g.group_id, ErrorCode(g.error_code), [(ErrorCode(p.error_code), p.committed_offset)
                                                   for t in g.topics for p in t.partitions])
            for g in response.groups] == [(group, ErrorCode.none, [(ErrorCode.unstable_offset_commit, -1)]),
                                          (other, ErrorCode.none, [(ErrorCode.none, 9)])]
    assert _end(wire, tid, pid, epoch, commit=True) == ErrorCode.none
    assert _fetch_offsets(wire, group, topic, [0], stable=True) == {0: (ErrorCode.none, 5)}


def test_an_aborted_transaction_releases_the_offset_it_held(wire):
    topic, tid, pid, epoch = _setup(wire)
    group = _name("g447")
    _commit_plain(wire, group, topic, {0: 3})
    assert _txn_commit(wire, tid, pid, epoch, group, topic, {0: 8}) == {0: ErrorCode.none}
    assert _fetch_offsets(wire, group, topic, [0], stable=True) == {0: (ErrorCode.unstable_offset_commit, -1)}
    assert _end(wire, tid, pid, epoch, commit=False) == ErrorCode.none
    assert _fetch_offsets(wire, group, topic, [0], stable=True) == {0: (ErrorCode.none, 3)}


def test_txn_offset_commit_v3_names_a_member_the_group_must_know(wire):
    """A producer naming a member or a generation of a group that has none is refused (Kafka's
    validateOffsetCommit for transactional commits); naming neither is accepted."""
    topic, tid, pid, epoch = _setup(wire)
    group = _name("g447")
    assert _txn_commit(wire, tid, pid, epoch, group, topic, {0: 1}, generation=4, member="gone-member") == {
        0: ErrorCode.unknown_member_id}
    assert _txn_commit(wire, tid, pid, epoch, group, topic, {0: 1}) == {0: ErrorCode.none}
    assert _end(wire, tid, pid, epoch, commit=True) == ErrorCode.none
    assert _fetch_offsets(wire, group, topic, [0], stable=True) == {0: (ErrorCode.none, 1)}


# --- WriteTxnMarkers: the coordinator epoch ------------------------------------------------------------------


def _marker(wire, topic, pid, epoch, coordinator_epoch, commit=True):
    response = wire.request(markers_v1.WriteTxnMarkersRequest(markers=(markers_v1.WritableTxnMarker(
        producer_id=pid, producer_epoch=epoch, transaction_result=commit, coordinator_epoch=coordinator_epoch,
        topics=(markers_v1.WritableTxnMarkerTopic(name=topic, partition_indexes=(0,)),)),)))
    return ErrorCode(response.markers[0].topics[0].partitions[0].error_code)


@pytest.mark.parametrize("restart", ["kill", "graceful"])
def test_a_marker_from_an_older_coordinator_epoch_is_fenced_also_after_a_restart(broker_factory, restart):
    """Kafka's checkCoordinatorEpoch: once a partition has a producer's marker at coordinator epoch E, a
    marker at an older epoch (a deposed coordinator's late retry) is refused with
    TRANSACTION_COORDINATOR_FENCED and leaves the transaction open. After kill -9 the epoch is rebuilt by
    replaying the log after the last snapshot; after a clean shutdown it comes from the snapshot at the log
    end, with nothing replayed."""
    broker = broker_factory()
    wire = KafkaWire(broker.port)
    topic, tid, pid, epoch = _setup(wire)
    assert _add(wire, tid, pid, epoch, topic, [0]) == {(topic, 0): ErrorCode.none}
    assert _produce(wire, topic, _txn_batch([b"a"], pid, epoch, 0), tid)[0] == ErrorCode.none
    assert _marker(wire, topic, pid, epoch, coordinator_epoch=1000) == ErrorCode.none
    assert _produce(wire, topic, _txn_batch([b"b"], pid, epoch, 1), tid)[0] == ErrorCode.none
    assert _marker(wire, topic, pid, epoch, coordinator_epoch=999, commit=False) == \
        ErrorCode.transaction_coordinator_fenced
    assert _latest(wire, topic, isolation=1) == 2  # still open: the LSO is the second batch
    wire.close()
    broker.restart(restart)
    wire = KafkaWire(broker.port)
    try:
        assert _marker(wire, topic, pid, epoch, coordinator_epoch=999, commit=False) == \
            ErrorCode.transaction_coordinator_fenced
        assert _marker(wire, topic, pid, epoch, coordinator_epoch=1000) == ErrorCode.none
        assert _latest(wire, topic, isolation=1) == 4
    finally:
        wire.close()


# --- transactional.id.expiration.ms ----------------------------------------------------------------------------


def _listed(wire):
    response = wire.request(list_v0.ListTransactionsRequest(state_filters=(), producer_id_filters=()))
    return {t.transactional_id: t.transaction_state for t in response.transaction_states}


def test_an_idle_transactional_id_expires_by_a_tombstone(broker_factory):
    """Kafka's transactional.id.expiration.ms: an id with no transaction in progress, idle past it, is
    removed by a tombstone in __transaction_state (so a restart does not bring it back); an id whose
    transaction is open stays; the forgotten producer gets INVALID_PRODUCER_ID_MAPPING, and InitProducerId
    starts the id afresh."""
    broker = broker_factory(config={"transactional.id.expiration.ms": 3000,
                                    "transaction.remove.expired.transaction.cleanup.interval.ms": 200})
    wire = KafkaWire(broker.port)
    topic, idle, pid, epoch = _setup(wire)
    assert _add(wire, idle, pid, epoch, topic, [0]) == {(topic, 0): ErrorCode.none}
    assert _produce(wire, topic, _txn_batch([b"a"], pid, epoch, 0), idle)[0] == ErrorCode.none
    assert _end(wire, idle, pid, epoch, commit=True) == ErrorCode.none
    # Known until it expires (CompleteCommit is stored in the background after EndTxn answers).
    assert _listed(wire)[idle] in ("PrepareCommit", "CompleteCommit")
    busy = _name("tid")
    code, busy_pid, busy_epoch = _init(wire, busy)
    assert code == ErrorCode.none
    assert _add(wire, busy, busy_pid, busy_epoch, topic, [0]) == {(topic, 0): ErrorCode.none}
    wait_until(lambda: idle not in _listed(wire), what="the idle id expired", timeout_s=20)
    # Kept meanwhile: the id whose transaction is open (its own timeout aborts it, not the expiration).
    assert _listed(wire)[busy] == "Ongoing"
    wire.close()
    broker.restart("kill")
    wire = KafkaWire(broker.port)
    try:
        listed = wait_until(lambda: _listed(wire) or None, what="the coordinator loaded", timeout_s=20)
        assert idle not in listed and listed[busy] == "Ongoing"
        assert _add(wire, idle, pid, epoch, topic, [0]) == {(topic, 0): ErrorCode.invalid_producer_id_mapping}
        code, new_pid, new_epoch = _init(wire, idle)
        assert code == ErrorCode.none and new_epoch == 0
    finally:
        wire.close()


def test_read_committed_consumption_over_many_segments_drops_exactly_the_aborted_transactions(wire):
    """Two producers' overlapping transactions, one in three aborted, over segments of 4 KiB: a read_committed
    consumer fetching 1 KiB at a time and dropping what each response's aborted list names (as Java's
    ``CompletedFetch`` does) reads exactly the committed values. The lists come from the sealed segments'
    .txnindex files and are bounded by the records sent, not by the LSO."""
    topic = _name("txnseg")
    assert create_topic(wire, topic, configs=(("segment.bytes", "4096"), ("index.interval.bytes", "256"))
                        ).error_code == ErrorCode.none
    producers = []
    for _ in range(2):
        tid = _name("tid")
        code, pid, epoch = _init(wire, tid)
        assert code == ErrorCode.none
        producers.append([tid, pid, epoch, 0])
    committed, aborted_count = [], 0
    for round_number in range(40):
        for tid, pid, epoch, _ in producers:
            assert _add(wire, tid, pid, epoch, topic, [0]) == {(topic, 0): ErrorCode.none}
        pending: dict[int, list[bytes]] = {}
        for batch_number in range(3):
            for producer in producers:
                tid, pid, epoch, sequence = producer
                value = f"{round_number}-{pid}-{batch_number}".encode().ljust(200, b".")
                assert _produce(wire, topic, _txn_batch([value], pid, epoch, sequence), tid)[0] == ErrorCode.none
                producer[3] += 1
                pending.setdefault(pid, []).append(value)
        for number, (tid, pid, epoch, _) in enumerate(producers):
            abort = (round_number + number) % 3 == 0
            assert _end(wire, tid, pid, epoch, commit=not abort) == ErrorCode.none
            aborted_count += abort
            if not abort:
                committed.append(pending[pid])
    expected = sorted(value for values in committed for value in values)

    def fetch(offset):
        response = wire.request(fetch_v11.FetchRequest(
            max_wait=0 * MS, min_bytes=1, max_bytes=1 << 20, isolation_level=1, session_id=0, session_epoch=-1,
            forgotten_topics_data=(), rack_id="", topics=(fetch_v11.FetchTopic(topic=topic, partitions=(
                fetch_v11.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1024),)),)))
        return response.responses[0].partitions[0]

    end = 40 * (6 + 2)  # every batch and marker
    wait_until(lambda: _latest(wire, topic, isolation=1) == end, what="every marker written", timeout_s=10)
    read, offset, largest_list = [], 0, 0
    while True:
        fetched = fetch(offset)
        if not fetched.records:
            assert offset == fetched.last_stable_offset == fetched.high_watermark
            break
        aborted = sorted((a.first_offset, a.producer_id) for a in fetched.aborted_transactions)
        largest_list = max(largest_list, len(aborted))
        skipping: set[int] = set()
        cursor = 0
        for header in batches.batch_headers(fetched.records):
            while aborted and aborted[0][0] <= header.base_offset:
                skipping.add(aborted.pop(0)[1])
            data = fetched.records[cursor:cursor + header.size]
            cursor += header.size
            producer_id = int.from_bytes(data[43:51], "big", signed=True)  # after the header's timestamps
            if header.attributes & 0x20:  # a marker ends its producer's transaction
                skipping.discard(producer_id)
            elif producer_id not in skipping:
                read.extend(batches.values_of(data))
            offset = header.base_offset + header.last_offset_delta + 1
    assert sorted(read) == expected
    assert aborted_count >= 20 and largest_list < aborted_count  # per response, not every one from the start


def test_a_partition_keeps_only_its_active_segments_aborted_transactions_live_and_after_a_restart(tmp_path):
    """A broker of its own (in this process, so its state can be read on its loop): 60 aborted transactions
    over segments of 4 KiB. After the rolls, the partition's heap holds the active segment's entries only and
    the rest are read from the mapped .txnindex files; a restart loads them the same way; read_committed
    fetches list the same aborted transactions before and after."""
    from tests.support.live_broker import LiveBroker

    topic, tid = _name("txnmem"), _name("tid")

    async def held(live):
        txns = live.broker.txn_partitions.peek(topic, 0)
        active = live.broker.replicas.leader(topic, 0, -1).log.segment_base_offsets()[-1]
        txns.drop_before(0)  # takes the maps the worker thread handed back
        return (len(txns.unsealed), len(txns.sealed), len(txns.aborted),
                sum(1 for entry in txns.aborted if entry.last_offset >= active))

    def listed(wire):
        return [[(a.producer_id, a.first_offset) for a in _fetch(wire, topic, offset, isolation=1).aborted_transactions]
                for offset in range(0, 120, 7)]

    live = LiveBroker(tmp_path / "data", "uvloop")
    try:
        wire = live.client()
        assert create_topic(wire, topic, configs=(("segment.bytes", "4096"),)).error_code == ErrorCode.none
        code, pid, epoch = _init(wire, tid)
        assert code == ErrorCode.none
        for number in range(60):
            assert _add(wire, tid, pid, epoch, topic, [0]) == {(topic, 0): ErrorCode.none}
            value = str(number).encode().ljust(300, b".")
            assert _produce(wire, topic, _txn_batch([value], pid, epoch, number), tid)[0] == ErrorCode.none
            assert _end(wire, tid, pid, epoch, commit=False) == ErrorCode.none
        wait_until(lambda: _latest(wire, topic, isolation=1) == 120, what="every marker written", timeout_s=10)
        before = listed(wire)
        unsealed, sealed, total, active = wait_until(
            lambda: (lambda h: h if h[0] == h[3] else None)(live.call(held, live)),
            what="the rolled segments' files mapped", timeout_s=10)
        assert total == 60 and sealed >= 5 and unsealed == active < 60
        wire.close()
    finally:
        live.stop()
    live = LiveBroker(tmp_path / "data", "uvloop")
    try:
        wire = live.client()
        unsealed, sealed, total, active = live.call(held, live)
        assert total == 60 and sealed >= 5 and unsealed == active < 60
        assert listed(wire) == before
        # From 0: those of the first segment's records (the fetch reads one segment), not all 60.
        assert before[0] == [(pid, 2 * number) for number in range(len(before[0]))] and 0 < len(before[0]) < 60
        wire.close()
    finally:
        live.stop()
