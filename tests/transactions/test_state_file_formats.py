"""The on-disk formats of producer-state snapshots (``broker.producer_snapshot``) and aborted-transaction
indexes (``broker.storage.txn_index``): they round-trip, and damage is detected, not read."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from copyless.broker import producer_snapshot
from copyless.broker.producer_snapshot import CorruptSnapshotError, ProducerSnapshot, SnapshotProducer
from copyless.broker.storage import txn_index

i64, i32, i16 = st.integers(-2**63, 2**63 - 1), st.integers(-2**31, 2**31 - 1), st.integers(-2**15, 2**15 - 1)

_snapshots = st.builds(
    ProducerSnapshot, st.integers(0, 2**63 - 1),
    st.lists(st.builds(SnapshotProducer, i64, i16, i64, st.lists(st.tuples(i32, i32, i64, i64), max_size=5).map(tuple)),
             max_size=8).map(tuple),
    st.lists(st.tuples(i64, i64), max_size=5).map(tuple), st.lists(st.tuples(i64, i64), max_size=5).map(tuple),
    st.lists(st.tuples(i64, i64), max_size=5).map(tuple))


@given(_snapshots)
def test_a_snapshot_round_trips_and_any_damage_is_detected(snapshot):
    data = producer_snapshot.encode(snapshot)
    assert producer_snapshot.decode(data) == snapshot
    for cut in {0, 3, len(data) // 2, len(data) - 1}:
        with pytest.raises(CorruptSnapshotError):
            producer_snapshot.decode(data[:cut])
    flipped = bytearray(data)
    flipped[-1] ^= 0x40
    with pytest.raises(CorruptSnapshotError):
        producer_snapshot.decode(bytes(flipped))


@given(st.lists(st.tuples(i64, i64, i64, i64), max_size=20), st.integers(0, txn_index.ENTRY.size - 1))
def test_index_entries_round_trip_and_a_torn_tail_is_reported_not_read(entries, torn_bytes):
    data = txn_index.encode(entries)
    assert len(data) == 34 * len(entries)
    assert txn_index.decode(data) == (entries, False)
    whole, torn = txn_index.decode(data + data[:torn_bytes] if entries else b"\x00" * torn_bytes)
    assert whole == entries and torn == (torn_bytes > 0)
