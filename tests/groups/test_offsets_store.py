"""The ``__consumer_offsets`` record format and the view rebuilt from it (pure: bytes in, values out)."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from copyless.broker.groups.coordinator import GroupSnapshot, GroupState, MemberSnapshot
from copyless.broker.groups.offsets import (
    CommittedOffset,
    OffsetStore,
    build_batch,
    build_batches,
    decode_group_value,
    decode_key,
    decode_offset_value,
    group_metadata_key,
    group_metadata_value,
    offset_commit_key,
    offset_commit_value,
    partition_for,
)
from copyless.protocol.records import decode_records, iter_batches, validate_batch

names = st.text(min_size=1, max_size=20)
committed_offsets = st.builds(
    CommittedOffset,
    offset=st.integers(-1, 2**63 - 1),
    leader_epoch=st.integers(-1, 2**31 - 1),
    metadata=st.text(max_size=50),
    commit_timestamp_ms=st.integers(0, 2**62),
)


def test_partition_for_is_javas_string_hash():
    # Java: "hello".hashCode() == 99162322, "test".hashCode() == 3556498, "polygenelubricants".hashCode()
    # == Integer.MIN_VALUE (Kafka's Utils.abs maps it to 0).
    assert partition_for("hello", 2**31 - 1) == 99162322
    assert partition_for("test", 50) == 3556498 % 50
    assert partition_for("polygenelubricants", 50) == 0
    assert all(0 <= partition_for(f"group-{i}", 50) < 50 for i in range(200))


def test_offset_commit_record_bytes_are_kafkas():
    key = offset_commit_key("g", "t", 7)
    assert key == struct.pack(">hh1sh1si", 1, 1, b"g", 1, b"t", 7)
    value = offset_commit_value(CommittedOffset(42, 5, "md", 1000))
    assert value == struct.pack(">hqih2sq", 3, 42, 5, 2, b"md", 1000)


@given(names, names, st.integers(0, 2**31 - 1), committed_offsets)
def test_offset_records_round_trip(group, topic, partition, committed):
    assert decode_key(offset_commit_key(group, topic, partition)) == (group, topic, partition)
    assert decode_offset_value(offset_commit_value(committed)) == committed


members = st.builds(
    MemberSnapshot,
    member_id=names, group_instance_id=st.none() | names, client_id=st.text(max_size=10),
    client_host=st.text(max_size=10), session_timeout_ms=st.integers(1, 2**31 - 1),
    rebalance_timeout_ms=st.integers(1, 2**31 - 1), metadata=st.binary(max_size=30),
    assignment=st.binary(max_size=30),
)


@given(names, st.lists(members, max_size=4), st.integers(0, 2**31 - 1), st.integers(0, 2**62))
def test_group_metadata_round_trip(group, member_list, generation, timestamp):
    state = GroupState.STABLE if member_list else GroupState.EMPTY
    snapshot = GroupSnapshot(group, state, generation, "consumer", "range" if member_list else None,
                             member_list[0].member_id if member_list else None, timestamp, tuple(member_list))
    assert decode_key(group_metadata_key(group)) == (group,)
    assert decode_group_value(group, group_metadata_value(snapshot)) == snapshot


def test_built_batches_are_valid_v2_batches():
    records = [(offset_commit_key("g", "t", p), offset_commit_value(CommittedOffset(p, -1, "", 9))) for p in range(3)]
    records.append((group_metadata_key("g"), None))
    batch = build_batch(records, 123)
    header = validate_batch(batch)
    assert header.records_count == 4 and header.producer_id == -1 and header.max_timestamp == 123
    decoded = decode_records(batch)
    assert [(r.key, r.value) for r in decoded] == records


@settings(max_examples=50)
@given(st.lists(st.tuples(st.sampled_from(["g1", "g2"]), st.sampled_from(["t", "u"]), st.integers(0, 3),
                          st.none() | st.integers(0, 1000)), min_size=1, max_size=60))
def test_replay_latest_commit_wins_and_tombstones_delete(operations):
    """Replaying the log equals applying the operations to a dict in order."""
    model: dict[tuple[str, str, int], int] = {}
    records = []
    for group, topic, partition, offset in operations:
        key = offset_commit_key(group, topic, partition)
        if offset is None:
            model.pop((group, topic, partition), None)
            records.append((key, None))
        else:
            model[(group, topic, partition)] = offset
            records.append((key, offset_commit_value(CommittedOffset(offset, -1, "", 1))))
    # Split into several batches as successive commits would be, and replay them as one log.
    log = b"".join(build_batch(records[i:i + 7], 1) for i in range(0, len(records), 7))
    store = OffsetStore()
    position = 0
    for batch_position, header in iter_batches(log):
        position = batch_position + header.size
    assert position == len(log)
    store.replay(log)
    rebuilt = {(g, t, p): c.offset for g, offsets in store.offsets.items() for (t, p), c in offsets.items()}
    assert rebuilt == model


def test_replay_stops_at_a_torn_tail_and_skips_unreadable_records():
    good = build_batch([(offset_commit_key("g", "t", 0), offset_commit_value(CommittedOffset(5, -1, "", 1)))], 1)
    odd = build_batch([(struct.pack(">h", 9) + b"future", b"whatever")], 1)
    torn = build_batch([(offset_commit_key("g", "t", 0), offset_commit_value(CommittedOffset(9, -1, "", 1)))], 1)
    store = OffsetStore()
    next_offset = store.replay(good + odd + torn[:-3])
    assert store.committed("g")[("t", 0)].offset == 5
    assert store.corrupt_records == 1 and next_offset == 1


def test_large_commits_are_split_into_bounded_batches():
    records = [(offset_commit_key("g", "t" * 50, p), offset_commit_value(CommittedOffset(p, -1, "m" * 100, 1)))
               for p in range(5000)]
    data = build_batches(records, 1)
    batches = list(iter_batches(data))
    assert len(batches) > 1 and all(header.size < 300 * 1024 for _, header in batches)
    store = OffsetStore()
    store.replay(data)
    assert len(store.committed("g")) == 5000


def test_expiry_rules():
    store = OffsetStore()
    store.apply([(offset_commit_key("managed", "t", 0), offset_commit_value(CommittedOffset(1, -1, "", 0))),
                 (offset_commit_key("solo", "t", 0), offset_commit_value(CommittedOffset(1, -1, "", 0))),
                 (offset_commit_key("solo", "t", 1), offset_commit_value(CommittedOffset(1, -1, "", 500)))])
    retention = 1000
    empty_since_600 = GroupSnapshot("managed", GroupState.EMPTY, 3, "consumer", None, None, 600)
    assert store.expired("managed", empty_since_600, 1599, retention) == []
    assert store.expired("managed", empty_since_600, 1600, retention) == [("t", 0)]
    stable = GroupSnapshot("managed", GroupState.STABLE, 3, "consumer", "range", "m", 0,
                           (MemberSnapshot("m", None, "c", "h", 1, 1, b"", b""),))
    assert store.expired("managed", stable, 10**9, retention) == []
    solo = GroupSnapshot("solo", GroupState.EMPTY, 0, None, None, None, 0)
    assert store.expired("solo", solo, 1000, retention) == [("t", 0)]
    assert sorted(store.expired("solo", solo, 1500, retention)) == [("t", 0), ("t", 1)]
