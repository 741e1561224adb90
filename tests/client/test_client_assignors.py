"""Range and round-robin assignment as Kafka's Java assignors compute it; ConsumerProtocol bytes checked
against kio's codecs generated from Kafka's ConsumerProtocolSubscription/Assignment schemas."""

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.consumer_protocol_assignment.v0.data import ConsumerProtocolAssignment
from kio.schema.consumer_protocol_subscription.v0.data import ConsumerProtocolSubscription
from kio.serial import entity_reader

from copyless.client.assignors import (
    Subscription,
    TopicPartition,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    range_assign,
    round_robin_assign,
)


def test_range_matches_kafkas_documented_example():
    # RangeAssignor javadoc: C0, C1 subscribed to t0, t1, each with 3 partitions ->
    # C0: [t0p0, t0p1, t1p0, t1p1], C1: [t0p2, t1p2].
    subs = {"C0": Subscription(("t0", "t1")), "C1": Subscription(("t0", "t1"))}
    plan = range_assign(subs, {"t0": 3, "t1": 3})
    assert plan["C0"] == [("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)]
    assert plan["C1"] == [("t0", 2), ("t1", 2)]


def test_round_robin_matches_kafkas_documented_examples():
    subs = {"C0": Subscription(("t0", "t1")), "C1": Subscription(("t0", "t1"))}
    plan = round_robin_assign(subs, {"t0": 3, "t1": 3})
    assert plan["C0"] == [("t0", 0), ("t0", 2), ("t1", 1)]
    assert plan["C1"] == [("t0", 1), ("t1", 0), ("t1", 2)]
    # RoundRobinAssignor javadoc, unequal subscriptions: C0 [t0], C1 [t0, t1], C2 [t0, t1, t2];
    # t0 1 partition, t1 2, t2 3 -> C0 [t0p0], C1 [t1p0], C2 [t1p1, t2p0, t2p1, t2p2].
    subs = {"C0": Subscription(("t0",)), "C1": Subscription(("t0", "t1")), "C2": Subscription(("t0", "t1", "t2"))}
    plan = round_robin_assign(subs, {"t0": 1, "t1": 2, "t2": 3})
    assert plan == {"C0": [("t0", 0)], "C1": [("t1", 0)], "C2": [("t1", 1), ("t2", 0), ("t2", 1), ("t2", 2)]}


members = st.dictionaries(
    st.text("abcdef", min_size=1, max_size=4),
    st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True),
    min_size=1,
    max_size=6,
)


@settings(max_examples=100, deadline=None)
@given(members, st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 12)))
def test_every_subscribed_partition_is_assigned_exactly_once(members, counts):
    subs = {m: Subscription(tuple(t)) for m, t in members.items()}
    for assign in (range_assign, round_robin_assign):
        plan = assign(subs, counts)
        assigned = [tp for partitions in plan.values() for tp in partitions]
        wanted = {
            (t, p) for t in {t for s in subs.values() for t in s.topics} for p in range(counts.get(t, 0))
        }
        assert sorted(assigned) == sorted(wanted)
        for member, partitions in plan.items():
            assert all(tp[0] in subs[member].topics for tp in partitions)
        # balance per topic for range: sizes differ by at most one among subscribers
        if assign is range_assign:
            for topic in counts:
                sizes = [sum(1 for tp in plan[m] if tp[0] == topic) for m in subs if topic in subs[m].topics]
                if sizes:
                    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=10), max_size=5), st.one_of(st.none(), st.binary(max_size=10)))
def test_subscription_bytes_match_kafkas_schema(topics, user_data):
    data = encode_subscription(topics, user_data)
    assert data[:2] == b"\x00\x00"  # version 0
    theirs, _ = entity_reader(ConsumerProtocolSubscription)(data, 2)
    assert sorted(theirs.topics) == sorted(set(topics))
    assert theirs.user_data == user_data
    assert decode_subscription(data) == Subscription(tuple(sorted(set(topics))), user_data)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["x", "y", "zz"]), st.integers(0, 100)), unique=True, max_size=20))
def test_assignment_bytes_match_kafkas_schema(partitions):
    data = encode_assignment(partitions)
    theirs, _ = entity_reader(ConsumerProtocolAssignment)(data, 2)
    flattened = sorted((tp.topic, p) for tp in theirs.assigned_partitions for p in tp.partitions)
    assert flattened == sorted(partitions)
    assert sorted(decode_assignment(data)) == sorted(TopicPartition(*tp) for tp in partitions)
    assert decode_assignment(b"") == []
