"""The checker of the fault tests: a pure function from a history of one run to the anomalies in it.

What a run records (``History``), all of it plain data, so the checker can be fed histories built by hand:

- ``sends``: every record a producer handed its client, in its sending order (``producer``, ``sequence``,
  ``partition``, ``value``); a producer is one client instance (a new producer id is a new producer);
- ``acks``: every acknowledgement (``producer``, ``sequence``, ``partition``, ``offset``, ``value``);
- ``polls``: every record a consumer was handed (``consumer``, ``partition``, ``offset``, ``value``), in the
  consumer's order, and ``seeks``: where a consumer's position was set on purpose (an assignment, a start
  at offset 0); both carry the consumer's ``index`` in one sequence per consumer, so polls and seeks
  interleave in the order the consumer saw them;
- ``final``: each partition read from offset 0 to its high watermark after every fault was healed;
- ``replicas``: each broker's batches of each partition, read from its segment files at the end;
- ``leaders``: every "I lead this partition at this epoch" a broker logged, over all its restarts;
- ``ownership``: the intervals during which a group member held a partition (assigned .. revoked).

The checks are those of Jepsen's Kafka workload, one anomaly kind each (``KINDS``):

    lost                   an acknowledged record is not in the final log at its acknowledged offset
    duplicate              a value is in the final log more than once
    divergent-offset       one offset of a partition was seen holding two different records (acks, polls,
                           the final log and each replica below the high watermark, across time)
    truncated-read         a consumer was handed a record that is not in the final log at that offset
    nonmonotonic-send      one producer's acknowledged records of a partition are not in its sending order
    nonmonotonic-poll      a consumer went back to an offset at or below one it had read, without a seek
    poll-skip              a consumer jumped over offsets the final log holds, without a seek
    replica-divergence     two replicas differ below the high watermark (batch bytes), or one lacks a part
    two-leaders-one-epoch  two brokers claimed the leadership of one partition in one epoch
    two-owners             two group members held one partition at the same time

``check(history)`` returns every anomaly found, ``counts(anomalies)`` the number by kind (every kind
present, 0 where none). Transactions have a history and checks of their own (``TxnHistory``,
``check_transactions``, ``TXN_KINDS``: aborted and zombie reads, torn and lost transactions, consume-transform-
produce exactly once), described where they are defined below.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import pairwise

from tests.support.batches import records_of

__all__ = ["Send", "Ack", "Poll", "Seek", "ReplicaBatch", "LeaderClaim", "Ownership", "History", "Anomaly",
           "KINDS", "check", "counts", "Txn", "TxnRead", "TxnHistory", "TXN_KINDS", "check_transactions",
           "txn_counts"]

KINDS = ("lost", "duplicate", "divergent-offset", "truncated-read", "nonmonotonic-send", "nonmonotonic-poll",
         "poll-skip", "replica-divergence", "two-leaders-one-epoch", "two-owners")


@dataclass(frozen=True)
class Send:
    producer: str
    sequence: int
    partition: int
    value: bytes


@dataclass(frozen=True)
class Ack:
    producer: str
    sequence: int
    partition: int
    offset: int
    value: bytes


@dataclass(frozen=True)
class Poll:
    consumer: str
    index: int
    partition: int
    offset: int
    value: bytes


@dataclass(frozen=True)
class Seek:
    """The consumer's next record of ``partition`` is meant to be at ``offset`` (None: wherever the group's
    committed offset says, unknown to the history)."""
    consumer: str
    index: int
    partition: int
    offset: int | None


@dataclass(frozen=True)
class ReplicaBatch:
    base_offset: int
    last_offset: int
    data: bytes  # the whole batch as stored


@dataclass(frozen=True)
class LeaderClaim:
    node: int
    topic: str
    partition: int
    epoch: int


@dataclass(frozen=True)
class Ownership:
    member: str
    partition: int
    start: float
    end: float


@dataclass
class History:
    topic: str = "t"
    sends: list[Send] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    polls: list[Poll] = field(default_factory=list)
    seeks: list[Seek] = field(default_factory=list)
    final: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)
    replicas: dict[int, dict[int, list[ReplicaBatch]]] = field(default_factory=dict)
    leaders: list[LeaderClaim] = field(default_factory=list)
    ownership: list[Ownership] = field(default_factory=list)


@dataclass(frozen=True)
class Anomaly:
    kind: str
    partition: int | None
    offset: int | None
    detail: str

    def __str__(self) -> str:
        where = ""
        if self.partition is not None:
            where = f" p{self.partition}" + ("" if self.offset is None else f"@{self.offset}")
        return f"{self.kind}{where}: {self.detail}"


def counts(anomalies: list[Anomaly]) -> dict[str, int]:
    out = dict.fromkeys(KINDS, 0)
    for anomaly in anomalies:
        out[anomaly.kind] += 1
    return out


def check(history: History) -> list[Anomaly]:
    final = {p: dict(records) for p, records in history.final.items()}
    found: list[Anomaly] = []
    found += _lost(history, final)
    found += _duplicates(history)
    found += _divergent_offsets(history)
    found += _truncated_reads(history, final)
    found += _nonmonotonic_sends(history)
    found += _polls_in_order(history, final)
    found += _replicas(history)
    found += _leaders(history)
    found += _owners(history)
    return found


def _lost(history: History, final: dict[int, dict[int, bytes]]) -> list[Anomaly]:
    out = []
    for ack in history.acks:
        there = final.get(ack.partition, {}).get(ack.offset)
        if there != ack.value:
            out.append(Anomaly("lost", ack.partition, ack.offset,
                               f"{ack.producer} #{ack.sequence} {ack.value!r} acknowledged here; the final log "
                               f"holds {'nothing' if there is None else repr(there)}"))
    return out


def _duplicates(history: History) -> list[Anomaly]:
    where: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for partition, records in history.final.items():
        for offset, value in records:
            where[value].append((partition, offset))
    return [Anomaly("duplicate", places[1][0], places[1][1], f"{value!r} stored at {places}")
            for value, places in where.items() if len(places) > 1]


def _replica_records(history: History) -> dict[tuple[int, int], list[tuple[int, int, bytes]]]:
    """(partition, node) -> the (offset, ..., value) of its records below the final high watermark."""
    out = {}
    for partition, nodes in history.replicas.items():
        high = len(history.final.get(partition, []))
        for node, batches in nodes.items():
            records = []
            for batch in batches:
                if batch.base_offset >= high:
                    continue
                records += [(r.offset, node, r.value or b"") for r in records_of(batch.data) if r.offset < high]
            out[(partition, node)] = records
    return out


def _divergent_offsets(history: History) -> list[Anomaly]:
    seen: dict[tuple[int, int], dict[bytes, str]] = defaultdict(dict)
    for ack in history.acks:
        seen[(ack.partition, ack.offset)].setdefault(ack.value, f"acked to {ack.producer}")
    for poll in history.polls:
        seen[(poll.partition, poll.offset)].setdefault(poll.value, f"polled by {poll.consumer}")
    for partition, records in history.final.items():
        for offset, value in records:
            seen[(partition, offset)].setdefault(value, "final log")
    for (partition, _node), records in _replica_records(history).items():
        for offset, node, value in records:
            seen[(partition, offset)].setdefault(value, f"replica on broker {node}")
    return [Anomaly("divergent-offset", partition, offset,
                    "; ".join(f"{value!r} ({source})" for value, source in values.items()))
            for (partition, offset), values in sorted(seen.items()) if len(values) > 1]


def _truncated_reads(history: History, final: dict[int, dict[int, bytes]]) -> list[Anomaly]:
    out = []
    for poll in history.polls:
        there = final.get(poll.partition, {}).get(poll.offset)
        if there != poll.value:
            out.append(Anomaly("truncated-read", poll.partition, poll.offset,
                               f"{poll.consumer} read {poll.value!r}; the final log holds "
                               f"{'nothing' if there is None else repr(there)}"))
    return out


def _nonmonotonic_sends(history: History) -> list[Anomaly]:
    by_stream: dict[tuple[str, int], list[Ack]] = defaultdict(list)
    for ack in history.acks:
        by_stream[(ack.producer, ack.partition)].append(ack)
    out = []
    for (producer, partition), acks in by_stream.items():
        acks.sort(key=lambda a: a.sequence)
        for before, after in pairwise(acks):
            if after.offset <= before.offset:
                out.append(Anomaly("nonmonotonic-send", partition, after.offset,
                                   f"{producer} sent #{before.sequence} before #{after.sequence}, acknowledged at "
                                   f"offsets {before.offset} and {after.offset}"))
    return out


def _polls_in_order(history: History, final: dict[int, dict[int, bytes]]) -> list[Anomaly]:
    steps: dict[str, list[Poll | Seek]] = defaultdict(list)
    for step in [*history.polls, *history.seeks]:
        steps[step.consumer].append(step)
    out = []
    for consumer, sequence in steps.items():
        # Per partition: the offset the next record should have (None: unknown, after a group assignment).
        expected: dict[int, int | None] = {}
        for step in sorted(sequence, key=lambda s: (s.index, isinstance(s, Poll))):
            if isinstance(step, Seek):
                expected[step.partition] = step.offset
                continue
            want = expected.get(step.partition)
            if want is not None and step.offset < want:
                out.append(Anomaly("nonmonotonic-poll", step.partition, step.offset,
                                   f"{consumer} read offset {step.offset} after reaching {want - 1}"))
            elif want is not None and step.offset > want:
                skipped = [o for o in range(want, step.offset) if o in final.get(step.partition, {})]
                if skipped:
                    out.append(Anomaly("poll-skip", step.partition, step.offset,
                                       f"{consumer} went from offset {want - 1} to {step.offset}, over "
                                       f"{len(skipped)} records of the final log (first {skipped[0]})"))
            expected[step.partition] = max(step.offset + 1, want or 0)
    return out


def _replicas(history: History) -> list[Anomaly]:
    out = []
    for partition, nodes in sorted(history.replicas.items()):
        high = len(history.final.get(partition, []))
        prefixes = {}
        for node, batches in sorted(nodes.items()):
            below = [b for b in sorted(batches, key=lambda b: b.base_offset) if b.base_offset < high]
            reaches = below[-1].last_offset + 1 if below else 0
            if reaches < high:
                out.append(Anomaly("replica-divergence", partition, reaches,
                                   f"broker {node}'s replica ends at {reaches}, below the high watermark {high}"))
            prefixes[node] = b"".join(b.data for b in below)
        distinct = defaultdict(list)
        for node, data in prefixes.items():
            distinct[data].append(node)
        if len(distinct) > 1:
            groups = sorted(distinct.items(), key=lambda item: -len(item[1]))
            first = groups[0][0]
            for data, members in groups[1:]:
                # the first differing batch, or where the shorter log ends: not strict, the logs may differ in length
                at = next((i for i, (a, b) in enumerate(zip(first, data, strict=False)) if a != b),
                          min(len(first), len(data)))
                out.append(Anomaly("replica-divergence", partition, None,
                                   f"brokers {groups[0][1]} and {members} differ below the high watermark "
                                   f"{high}, from byte {at}"))
    return out


def _leaders(history: History) -> list[Anomaly]:
    claims: dict[tuple[str, int, int], set[int]] = defaultdict(set)
    for claim in history.leaders:
        claims[(claim.topic, claim.partition, claim.epoch)].add(claim.node)
    return [Anomaly("two-leaders-one-epoch", partition, None, f"{topic} epoch {epoch} led by brokers {sorted(nodes)}")
            for (topic, partition, epoch), nodes in sorted(claims.items()) if len(nodes) > 1]


def _owners(history: History) -> list[Anomaly]:
    out = []
    by_partition: dict[int, list[Ownership]] = defaultdict(list)
    for held in history.ownership:
        by_partition[held.partition].append(held)
    for partition, spans in sorted(by_partition.items()):
        spans.sort(key=lambda s: s.start)
        for i, first in enumerate(spans):
            for second in spans[i + 1:]:
                if second.start >= first.end:
                    break
                if second.member != first.member:
                    out.append(Anomaly("two-owners", partition, None,
                                       f"{first.member} held it {first.start:.3f}-{first.end:.3f} and "
                                       f"{second.member} {second.start:.3f}-{second.end:.3f}"))
    return out


# -- transactions ------------------------------------------------------------------------------------------
#
# A transactional run (tests/cluster/test_jepsen_transactions.py) has a history of its own (``TxnHistory``):
#
# - ``txns``: every transaction a client began (``producer`` instance, ``txn`` id unique in the run, the
#   records it handed its client as (topic, partition, value), every value unique in the run) with the
#   outcome as far as that client knows: ``committed`` (commit returned), ``aborted`` (abort returned, or
#   it never asked to commit), ``unknown`` (commit raised and nothing settled it) or ``fenced`` (a newer
#   instance of its transactional id was initialised while it was open: a zombie);
# - ``reads``: every record a read_committed consumer was handed while the faults ran
#   (``reader``, topic, partition, offset, value);
# - ``final``: each partition of each topic read by read_committed from offset 0 to its end after every
#   fault was healed;
# - ``inputs`` and ``derived``: consume-transform-produce, the records of the input topic and, for every
#   record the transforming stage wrote to the output topic, the input record it came from;
#   ``group_offsets``: the group's committed offset of each input partition at the end (None: not read).
#
# The checks, one anomaly kind each (``TXN_KINDS``):
#
#     aborted-read        a read_committed consumer was handed a record of an aborted transaction
#     zombie-read         ... a record of a transaction whose producer had been fenced
#     torn-txn            a committed (or unknown) transaction is in the final read in part only
#     lost-txn            a committed transaction is not in the final read at all
#     duplicate-record    a record is in the final read twice, or was read at two offsets
#     phantom-read        a consumer was handed a record the final read does not hold at that offset
#     ctp-lost            an input record has no output among the committed output
#     ctp-duplicate       an input record has more than one output among the committed output
#     ctp-offset          the group's committed offset of an input partition is not just past the last input
#                         whose output is committed (offsets and outputs committed apart: the transaction
#                         committed one without the other)
#
# An ``unknown`` transaction may be committed or aborted, but all or none; nothing may be read of it unless
# the final read holds all of it.

TXN_KINDS = ("aborted-read", "zombie-read", "torn-txn", "lost-txn", "duplicate-record", "phantom-read",
             "ctp-lost", "ctp-duplicate", "ctp-offset")
OUTCOMES = ("committed", "aborted", "unknown", "fenced")


@dataclass(frozen=True)
class Txn:
    producer: str
    txn: str
    outcome: str
    records: tuple[tuple[str, int, bytes], ...]  # (topic, partition, value)


@dataclass(frozen=True)
class TxnRead:
    reader: str
    topic: str
    partition: int
    offset: int
    value: bytes


@dataclass
class TxnHistory:
    txns: list[Txn] = field(default_factory=list)
    reads: list[TxnRead] = field(default_factory=list)
    final: dict[tuple[str, int], list[tuple[int, bytes]]] = field(default_factory=dict)
    input_topic: str = ""
    output_topic: str = ""
    inputs: list[bytes] = field(default_factory=list)
    derived: dict[bytes, bytes] = field(default_factory=dict)  # output value -> input value
    group_offsets: dict[int, int] | None = None  # input partition -> the group's committed offset


def txn_counts(anomalies: list[Anomaly]) -> dict[str, int]:
    out = dict.fromkeys(TXN_KINDS, 0)
    for anomaly in anomalies:
        out[anomaly.kind] += 1
    return out


def check_transactions(history: TxnHistory) -> list[Anomaly]:
    for t in history.txns:
        if t.outcome not in OUTCOMES:
            raise ValueError(f"transaction {t.txn}: outcome {t.outcome!r} is none of {OUTCOMES}")
    owner = {value: t for t in history.txns for _topic, _p, value in t.records}
    # Where each value is in the final read: (topic, partition, offset) places, in order.
    places: dict[bytes, list[tuple[str, int, int]]] = defaultdict(list)
    for (topic, p), records in sorted(history.final.items()):
        for offset, value in records:
            places[value].append((topic, p, offset))
    found: list[Anomaly] = []
    found += _forbidden_reads(history, owner, places)
    found += _atomicity(history, places)
    found += _txn_duplicates(history, places)
    found += _phantoms(history)
    found += _ctp(history, places)
    return found


def _forbidden_reads(history: TxnHistory, owner: dict[bytes, Txn],
                     places: dict[bytes, list[tuple[str, int, int]]]) -> list[Anomaly]:
    out = []
    seen = [("final", topic, p, offset, value) for value, where in places.items() for topic, p, offset in where]
    seen += [(r.reader, r.topic, r.partition, r.offset, r.value) for r in history.reads]
    for reader, topic, p, offset, value in seen:
        t = owner.get(value)
        if t is None or t.outcome not in ("aborted", "fenced"):
            continue
        kind = "aborted-read" if t.outcome == "aborted" else "zombie-read"
        out.append(Anomaly(kind, p, offset, f"{reader} read {value!r} of {t.outcome} transaction {t.txn} "
                                            f"({t.producer}) in {topic}"))
    return out


def _atomicity(history: TxnHistory, places: dict[bytes, list[tuple[str, int, int]]]) -> list[Anomaly]:
    out = []
    for t in history.txns:
        if t.outcome not in ("committed", "unknown") or not t.records:
            continue
        present = [r for r in t.records if places.get(r[2])]
        missing = [r for r in t.records if not places.get(r[2])]
        if present and missing:
            topic, p, value = missing[0]
            out.append(Anomaly("torn-txn", p, None,
                               f"{t.outcome} transaction {t.txn} ({t.producer}): {len(present)} of "
                               f"{len(t.records)} records in the final read; missing {value!r} of {topic} "
                               f"and {len(missing) - 1} more"))
        elif missing and t.outcome == "committed":
            out.append(Anomaly("lost-txn", t.records[0][1], None,
                               f"committed transaction {t.txn} ({t.producer}): none of its {len(t.records)} "
                               f"records in the final read"))
    return out


def _txn_duplicates(history: TxnHistory, places: dict[bytes, list[tuple[str, int, int]]]) -> list[Anomaly]:
    out = []
    for value, where in places.items():
        if len(where) > 1:
            topic, p, offset = where[1]
            out.append(Anomaly("duplicate-record", p, offset,
                               f"{value!r} is in the final read {len(where)} times: {where}"))
    read_at: dict[tuple[str, bytes], set[tuple[int, int]]] = defaultdict(set)
    for r in history.reads:
        read_at[(r.topic, r.value)].add((r.partition, r.offset))
    for (topic, value), where in read_at.items():
        if len(where) > 1:
            p, offset = sorted(where)[1]
            out.append(Anomaly("duplicate-record", p, offset,
                               f"{value!r} of {topic} was read at {len(where)} places: {sorted(where)}"))
    return out


def _phantoms(history: TxnHistory) -> list[Anomaly]:
    final = {key: dict(records) for key, records in history.final.items()}
    out = []
    for r in history.reads:
        there = final.get((r.topic, r.partition), {}).get(r.offset)
        if there != r.value:
            out.append(Anomaly("phantom-read", r.partition, r.offset,
                               f"{r.reader} read {r.value!r} of {r.topic}; the final read holds {there!r} there"))
    return out


def _ctp(history: TxnHistory, places: dict[bytes, list[tuple[str, int, int]]]) -> list[Anomaly]:
    if not history.inputs:
        return []
    outputs: dict[bytes, list[bytes]] = defaultdict(list)
    for (topic, _p), records in history.final.items():
        if topic != history.output_topic:
            continue
        for _offset, value in records:
            source = history.derived.get(value)
            if source is not None:
                outputs[source].append(value)
    out = []
    for value in history.inputs:
        got = outputs.get(value, [])
        if not got:
            out.append(Anomaly("ctp-lost", None, None, f"input {value!r} has no committed output"))
        elif len(got) > 1:
            where = [places[v][0] for v in got]
            out.append(Anomaly("ctp-duplicate", where[1][1], where[1][2],
                               f"input {value!r} has {len(got)} committed outputs: {got} at {where}"))
    if history.group_offsets is not None:
        for (topic, p), records in sorted(history.final.items()):
            if topic != history.input_topic:
                continue
            done = [offset for offset, value in records if outputs.get(value)]
            expected = max(done) + 1 if done else None
            committed = history.group_offsets.get(p)
            if expected is not None and committed != expected:
                out.append(Anomaly("ctp-offset", p, committed,
                                   f"the group committed {committed} for input partition {p}; the committed "
                                   f"outputs cover inputs up to offset {expected - 1}"))
    return out
