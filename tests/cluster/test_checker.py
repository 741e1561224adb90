"""The fault tests' checker (``tests.support.checker``) on histories built by hand: a clean history has no
anomaly, and each kind of anomaly is found in a history made to hold exactly that one (so every check can
fail), with the partition and offset where it lies."""

from __future__ import annotations

from tests.support.batches import build_batch
from tests.support.checker import (
    KINDS,
    Ack,
    History,
    LeaderClaim,
    Ownership,
    Poll,
    ReplicaBatch,
    Seek,
    Send,
    check,
    counts,
)


def value(n: int) -> bytes:
    return b"%09d" % n


def batch(base: int, values: list[bytes]) -> ReplicaBatch:
    return ReplicaBatch(base, base + len(values) - 1, build_batch(values, base_offset=base))


def clean() -> History:
    """Producer p0 sends 0..5 to partitions 0 and 1 alternately; everything is acknowledged, read by a
    consumer from offset 0, stored on three replicas in two batches each, led by one broker per epoch."""
    h = History(topic="t")
    per_partition: dict[int, list[bytes]] = {0: [], 1: []}
    for sequence in range(6):
        partition = sequence % 2
        v = value(sequence)
        h.sends.append(Send("p0", sequence, partition, v))
        h.acks.append(Ack("p0", sequence, partition, len(per_partition[partition]), v))
        per_partition[partition].append(v)
    index = 0
    for partition, values in per_partition.items():
        h.seeks.append(Seek("c0", index, partition, 0))
        index += 1
        for offset, v in enumerate(values):
            h.polls.append(Poll("c0", index, partition, offset, v))
            index += 1
        h.final[partition] = list(enumerate(values))
        h.replicas[partition] = {node: [batch(0, values[:2]), batch(2, values[2:])] for node in (1, 2, 3)}
    h.leaders = [LeaderClaim(1, "t", 0, 0), LeaderClaim(2, "t", 0, 1), LeaderClaim(1, "t", 0, 2),
                 LeaderClaim(2, "t", 1, 0), LeaderClaim(2, "t", 1, 0)]  # a broker may log its epoch twice
    h.ownership = [Ownership("m1", 0, 0.0, 5.0), Ownership("m2", 0, 5.0, 9.0), Ownership("m1", 1, 0.0, 9.0)]
    return h


def test_a_clean_history_has_no_anomaly():
    h = clean()
    assert check(h) == []
    assert counts(check(h)) == dict.fromkeys(KINDS, 0)


def only(h: History, kind: str):
    found = check(h)
    assert found, f"no anomaly found; expected {kind}"
    assert {a.kind for a in found} == {kind}, [str(a) for a in found]
    return found


def test_an_acknowledged_record_missing_from_the_final_log_is_lost():
    h = clean()
    # The acknowledged record at p0@2 is gone: the partition was truncated below it, and nothing read it.
    h.final[0] = h.final[0][:2]
    h.polls = [p for p in h.polls if (p.partition, p.offset) < (0, 2)]
    h.replicas[0] = {node: [batch(0, [value(0), value(2)])] for node in (1, 2, 3)}
    found = [a for a in check(h) if a.kind == "lost"]
    assert [(a.partition, a.offset) for a in found] == [(0, 2)]
    assert {a.kind for a in check(h)} == {"lost"}


def test_a_value_stored_twice_is_a_duplicate():
    h = clean()
    extra = (3, value(4))  # a retried send written again
    h.final[0].append(extra)
    h.replicas[0] = {n: [*bs, batch(3, [value(4)])] for n, bs in h.replicas[0].items()}
    h.polls.append(Poll("c0", 100, 0, 3, value(4)))
    found = only(h, "duplicate")
    assert [(a.partition, a.offset) for a in found] == [(0, 3)]


def test_an_offset_seen_with_two_records_is_divergent():
    h = clean()
    # A zombie leader acknowledged another record at p1@1 (the offset then also lost that record: the two
    # kinds come together, as in Jepsen's workload).
    h.acks.append(Ack("p9", 0, 1, 1, b"zombie"))
    found = [a for a in check(h) if a.kind == "divergent-offset"]
    assert [(a.partition, a.offset) for a in found] == [(1, 1)]
    assert "zombie" in found[0].detail and repr(value(3)) in found[0].detail
    assert {a.kind for a in check(h)} == {"divergent-offset", "lost"}


def test_a_read_of_a_record_later_truncated_is_a_truncated_read():
    h = clean()
    h.polls.append(Poll("c0", 100, 1, 3, value(77)))  # read above what survived, then cut away
    found = only(h, "truncated-read")
    assert [(a.partition, a.offset) for a in found] == [(1, 3)]


def test_acknowledgements_out_of_sending_order_are_a_nonmonotonic_send():
    h = clean()
    # Sequences 0 and 2 of p0 (both partition 0) acknowledged at swapped offsets: the log holds them swapped.
    h.acks = [Ack(a.producer, {0: 2, 2: 0}.get(a.sequence, a.sequence), a.partition, a.offset,
                  a.value) for a in h.acks]
    found = only(h, "nonmonotonic-send")
    assert [(a.partition, a.offset) for a in found] == [(0, 0)]


def test_a_consumer_going_back_without_a_seek_is_a_nonmonotonic_poll():
    h = clean()
    h.polls.append(Poll("c0", 100, 0, 1, value(2)))
    found = only(h, "nonmonotonic-poll")
    assert [(a.partition, a.offset) for a in found] == [(0, 1)]
    # With a seek first, going back is what was asked for.
    h.seeks.append(Seek("c0", 99, 0, 1))
    assert check(h) == []


def test_a_consumer_jumping_over_records_is_a_poll_skip():
    h = clean()
    h.polls = [p for p in h.polls if (p.partition, p.offset) != (1, 1)]
    found = only(h, "poll-skip")
    assert [(a.partition, a.offset) for a in found] == [(1, 2)]
    # An assignment whose start the history does not know makes no claim about the next offset.
    h.seeks.append(Seek("c0", next(p.index for p in h.polls if (p.partition, p.offset) == (1, 2)) - 1, 1, None))
    assert check(h) == []


def test_replicas_that_differ_below_the_high_watermark_diverge():
    h = clean()
    # Broker 3 holds other bytes for the second batch of partition 0 (same values, another timestamp).
    other = ReplicaBatch(2, 2, build_batch([value(4)], base_offset=2, base_timestamp_ms=1))
    h.replicas[0][3] = [h.replicas[0][3][0], other]
    found = only(h, "replica-divergence")
    assert found[0].partition == 0 and "[3]" in found[0].detail


def test_a_replica_short_of_the_high_watermark_diverges():
    h = clean()
    h.replicas[1][2] = h.replicas[1][2][:1]
    found = only(h, "replica-divergence")
    assert [(a.partition, a.offset) for a in found][0] == (1, 2)


def test_two_brokers_leading_one_epoch():
    h = clean()
    h.leaders.append(LeaderClaim(3, "t", 0, 1))
    found = only(h, "two-leaders-one-epoch")
    assert found[0].partition == 0 and "[2, 3]" in found[0].detail


def test_two_members_holding_one_partition_at_once():
    h = clean()
    h.ownership.append(Ownership("m2", 1, 8.5, 12.0))
    found = only(h, "two-owners")
    assert found[0].partition == 1


def test_every_kind_has_a_history_that_produces_it():
    """A kind no history above produces would be a check that cannot fail."""
    produced = {"lost", "duplicate", "divergent-offset", "truncated-read", "nonmonotonic-send", "nonmonotonic-poll",
                "poll-skip", "replica-divergence", "two-leaders-one-epoch", "two-owners"}
    assert set(KINDS) == produced
