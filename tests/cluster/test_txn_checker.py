"""The transactional checker (``tests.support.checker.check_transactions``) on histories built by hand: a
clean history has no anomaly, and each kind is found in a history made to hold exactly that one (so every
check can fail); an unknown outcome is allowed either way, but all or none."""

from __future__ import annotations

import dataclasses

import pytest

from tests.support.checker import TXN_KINDS, Txn, TxnHistory, TxnRead, check_transactions, txn_counts

T, IN, OUT = "t", "in", "out"


def records(txn: str) -> tuple[tuple[str, int, bytes], ...]:
    return tuple((T, p, f"{txn}/{p}".encode()) for p in range(3))


def clean() -> TxnHistory:
    """Producer a: c1 committed, a1 aborted, c2 committed; producer z (fenced zombie) z1; b: u1 unknown
    (committed in fact), u2 unknown (aborted in fact). A reader saw c1 and u1 live. Consume-transform-produce:
    inputs i0, i1; i0 transformed in x1 (aborted) then x2 (committed), i1 in x2."""
    h = TxnHistory(input_topic=IN, output_topic=OUT)
    h.txns = [Txn("a", "c1", "committed", records("c1")), Txn("a", "a1", "aborted", records("a1")),
              Txn("a", "c2", "committed", records("c2")), Txn("z", "z1", "fenced", records("z1")),
              Txn("b", "u1", "unknown", records("u1")), Txn("b", "u2", "unknown", records("u2")),
              Txn("ctp", "x1", "aborted", ((OUT, 0, b"x1:i0"),)),
              Txn("ctp", "x2", "committed", ((OUT, 0, b"x2:i0"), (OUT, 1, b"x2:i1")))]
    for p in range(3):
        h.final[(T, p)] = [(0, f"c1/{p}".encode()), (2, f"c2/{p}".encode()), (4, f"u1/{p}".encode())]
    h.final[(OUT, 0)] = [(1, b"x2:i0")]
    h.final[(OUT, 1)] = [(0, b"x2:i1")]
    h.final[(IN, 0)] = [(0, b"i0"), (1, b"i1")]
    h.reads = [TxnRead("r0", T, p, 0, f"c1/{p}".encode()) for p in range(3)]
    h.reads += [TxnRead("r0", T, 1, 4, b"u1/1")]
    h.inputs = [b"i0", b"i1"]
    h.derived = {b"x1:i0": b"i0", b"x2:i0": b"i0", b"x2:i1": b"i1"}
    h.group_offsets = {0: 2}
    return h


def only(h: TxnHistory, kind: str) -> list:
    found = check_transactions(h)
    got = txn_counts(found)
    assert got[kind] >= 1, f"{kind} not found: {[str(a) for a in found]}"
    assert {k: n for k, n in got.items() if n and k != kind} == {}, [str(a) for a in found]
    return [a for a in found if a.kind == kind]


def test_a_clean_history_has_no_anomaly():
    assert check_transactions(clean()) == []
    assert set(txn_counts([])) == set(TXN_KINDS)


def test_an_aborted_record_read_live_or_at_the_end():
    h = clean()
    h.reads.append(TxnRead("r1", T, 2, 1, b"a1/2"))
    found = check_transactions(h)
    assert {k: n for k, n in txn_counts(found).items() if n} == {"aborted-read": 1, "phantom-read": 1}
    [a] = [a for a in found if a.kind == "aborted-read"]
    assert (a.partition, a.offset) == (2, 1) and "a1" in a.detail and "r1" in a.detail
    h = clean()
    h.final[(T, 0)].insert(1, (1, b"a1/0"))
    [a] = only(h, "aborted-read")
    assert "final" in a.detail


def test_a_fenced_zombies_record_read():
    h = clean()
    h.final[(T, 1)].append((5, b"z1/1"))
    [a] = only(h, "zombie-read")
    assert (a.partition, a.offset) == (1, 5) and "z1" in a.detail


def test_a_committed_transaction_torn_across_partitions():
    h = clean()
    h.final[(T, 2)] = [r for r in h.final[(T, 2)] if r[1] != b"c2/2"]
    [a] = only(h, "torn-txn")
    assert "c2" in a.detail and "2 of 3" in a.detail


def test_an_unknown_transaction_may_go_either_way_but_not_in_part():
    h = clean()
    for p in range(3):  # u1 dropped whole (and the live read of it with it): fine
        h.final[(T, p)] = h.final[(T, p)][:2]
    h.reads = h.reads[:3]
    assert check_transactions(h) == []
    h.final[(T, 0)].append((4, b"u2/0"))  # u2 committed in part
    [a] = only(h, "torn-txn")
    assert "u2" in a.detail and "unknown" in a.detail


def test_a_committed_transaction_lost_whole():
    h = clean()
    h.reads = []
    for p in range(3):
        h.final[(T, p)] = [r for r in h.final[(T, p)] if not r[1].startswith(b"c1")]
    [a] = only(h, "lost-txn")
    assert "c1" in a.detail


def test_a_record_twice():
    h = clean()
    h.final[(T, 0)].append((6, b"c1/0"))
    [a] = only(h, "duplicate-record")
    assert (a.partition, a.offset) == (0, 6)
    h = clean()
    h.reads.append(TxnRead("r1", T, 0, 7, b"c1/0"))
    found = check_transactions(h)
    assert txn_counts(found)["duplicate-record"] == 1  # read at offsets 0 and 7 (and 7 is a phantom too)
    assert txn_counts(found)["phantom-read"] == 1


def test_a_read_the_final_log_does_not_hold():
    h = clean()
    h.reads.append(TxnRead("r1", T, 0, 3, b"mystery"))
    [a] = only(h, "phantom-read")
    assert (a.partition, a.offset) == (0, 3) and "None" in a.detail


def test_consume_transform_produce_loses_an_input():
    h = clean()
    h.inputs.append(b"i2")
    [a] = only(h, "ctp-lost")
    assert "i2" in a.detail


def test_consume_transform_produce_outputs_an_input_twice():
    h = clean()
    h.txns.append(Txn("ctp", "x3", "committed", ((OUT, 1, b"x3:i1"),)))
    h.derived[b"x3:i1"] = b"i1"
    h.final[(OUT, 1)].append((2, b"x3:i1"))
    [a] = only(h, "ctp-duplicate")
    assert (a.partition, a.offset) == (1, 2) and "i1" in a.detail


def test_an_outcome_the_checker_does_not_know_is_refused():
    h = clean()
    h.txns[0] = dataclasses.replace(h.txns[0], outcome="maybe")
    with pytest.raises(ValueError):
        check_transactions(h)


def test_consume_transform_produce_commits_offsets_apart_from_outputs():
    h = clean()
    h.group_offsets = {0: 1}  # the offset of i1 stayed behind while its output was committed
    [a] = only(h, "ctp-offset")
    assert a.partition == 0 and a.offset == 1 and "up to offset 1" in a.detail
    h.group_offsets = {}
    [a] = only(h, "ctp-offset")
    assert a.offset is None
