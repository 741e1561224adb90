"""Idempotent-producer sequence rules, checked against a model with hypothesis."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from copyless.broker.producer_state import ProducerIdAllocator, ProducerStateManager
from copyless.protocol.records import read_header
from tests.support.batches import build_batch


def header(pid: int, epoch: int, sequence: int, count: int = 1, base_offset: int = 0):
    return read_header(
        build_batch([b"v"] * count, producer_id=pid, producer_epoch=epoch, base_sequence=sequence,
                    base_offset=base_offset)
    )


def test_in_order_duplicate_and_gap():
    state = ProducerStateManager()
    first = header(7, 0, 0, count=3)
    assert state.check("t", 0, first).error == ErrorCode.none
    state.update("t", 0, first, 100)
    # Retry of the same batch: original offset, not appended again.
    again = state.check("t", 0, first)
    assert again.error == ErrorCode.none and again.duplicate_of.first_offset == 100
    assert state.check("t", 0, header(7, 0, 3)).duplicate_of is None  # next in order
    assert state.check("t", 0, header(7, 0, 5)).error == ErrorCode.out_of_order_sequence_number
    # Other partitions are independent.
    assert state.check("t", 1, header(7, 0, 42)).error == ErrorCode.none


def test_epochs():
    state = ProducerStateManager()
    state.update("t", 0, header(1, 3, 0), 0)
    assert state.check("t", 0, header(1, 2, 1)).error == ErrorCode.invalid_producer_epoch
    assert state.check("t", 0, header(1, 4, 1)).error == ErrorCode.out_of_order_sequence_number
    assert state.check("t", 0, header(1, 4, 0)).error == ErrorCode.none


def test_sequence_wraps_at_int_max():
    state = ProducerStateManager()
    state.update("t", 0, header(1, 0, 2**31 - 1), 0)
    assert state.check("t", 0, header(1, 0, 0)).error == ErrorCode.none


def test_only_last_five_batches_are_remembered():
    state = ProducerStateManager()
    for n in range(7):
        state.update("t", 0, header(9, 0, n), n)
    assert state.check("t", 0, header(9, 0, 2)).duplicate_of.first_offset == 2
    # Sequence 1 fell out of the window: neither a known duplicate nor in order.
    assert state.check("t", 0, header(9, 0, 1)).error == ErrorCode.out_of_order_sequence_number


def test_rebuild_from_headers_restores_dedup():
    state = ProducerStateManager()
    headers = [header(5, 0, n * 2, count=2, base_offset=n * 2) for n in range(4)]
    assert state.rebuild("t", 0, headers) == 1
    assert state.check("t", 0, header(5, 0, 6, count=2)).duplicate_of.first_offset == 6
    assert state.check("t", 0, header(5, 0, 8)).duplicate_of is None
    assert state.max_producer_id() == 5


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 4)), min_size=1, max_size=30))
def test_retries_never_append_twice(sends):
    """A producer sends batches, retrying some; every retry is recognised while it is within the window."""
    state = ProducerStateManager()
    log: list[int] = []  # the sequences appended, in order
    sent = []  # (first_sequence, count)
    next_sequence = 0
    for retries, count in sends:
        batch = header(11, 0, next_sequence, count=count)
        for _ in range(retries):
            verdict = state.check("t", 0, batch)
            assert verdict.error == ErrorCode.none
            if verdict.duplicate_of is None:
                state.update("t", 0, batch, len(log))
                log.extend(range(next_sequence, next_sequence + count))
            else:
                assert verdict.duplicate_of.first_offset == log.index(next_sequence)
        sent.append((next_sequence, count))
        next_sequence += count
    assert log == list(range(next_sequence))


def test_producer_ids_never_reused_across_restarts(tmp_path):
    allocator = ProducerIdAllocator(tmp_path, block_size=3)
    allocator.load()
    ids = []
    for _ in range(4):
        if allocator.needs_block:
            allocator.reserve_block()
        ids.append(allocator.next_id())
    restarted = ProducerIdAllocator(tmp_path, block_size=3)
    restarted.load()
    restarted.reserve_block()
    assert restarted.next_id() > max(ids)
    floor = ProducerIdAllocator(tmp_path / "other", block_size=3)
    (tmp_path / "other").mkdir()
    floor.load(floor=50)
    floor.reserve_block()
    assert floor.next_id() == 50


def test_idle_producers_expire_unless_a_transaction_is_open_or_they_wrote_recently():
    """Kafka's producer.id.expiration.ms: a producer whose last batch (or marker) timestamp is at least the
    expiration old is forgotten, unless it has a transaction open in the partition; the others stay."""
    state = ProducerStateManager()
    now, expiration = 1_700_000_100_000, 60_000

    def at(pid, timestamp, sequence=0):
        built = build_batch([b"v"], producer_id=pid, producer_epoch=0, base_sequence=sequence,
                            base_timestamp_ms=timestamp)
        return read_header(built)

    state.update("t", 0, at(1, now - expiration), 0)  # idle exactly the expiration: expires (Kafka's >=)
    state.update("t", 0, at(2, now - 10 * expiration), 1)  # idle, but its transaction is open here
    state.update("t", 0, at(3, now - expiration + 1), 2)  # recent
    state.update("t", 0, at(4, now - 10 * expiration), 3)
    state.update_marker("t", 0, 4, 0, now - 5)  # a marker renews it
    state.update("t", 1, at(1, now - 10 * expiration), 0)  # another partition's state is its own
    assert state.remove_expired("t", 0, now, expiration, ongoing={2: 1}) == [1]
    assert [entry[0] for entry in state.entries_of("t", 0)] == [2, 3, 4]
    assert state.producer_count("t", 1) == 1
    # Forgotten: its next batch starts anywhere, as a new producer's would.
    assert state.check("t", 0, at(1, now, sequence=42)).error == ErrorCode.none
    # A LogAppendTime append records the broker's stamp, not the batch's.
    state.update("t", 2, at(5, 0), 0, timestamp=now)
    assert state.remove_expired("t", 2, now, expiration) == []
    assert state.remove_expired("t", 2, now + expiration, expiration) == [5]
