"""The pure parts of transactions: the coordinator's state machine (``broker.txn.metadata``), its log format
(``broker.txn.log``) and a partition's open/aborted transactions (``broker.txn_partition``), the last against
a model under random interleavings (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from copyless.broker.txn import metadata as m
from copyless.broker.txn.log import TxnLogView, decode, encode_key, encode_value
from copyless.broker.txn_partition import (
    ABORT,
    COMMIT,
    Marker,
    PartitionTxns,
    build_marker,
    control_type_of,
    read_marker,
)
from copyless.protocol.records import read_header, validate_batch

NOW = 1_700_000_000_000


def _started(state=m.TxnState.ONGOING, epoch=3, partitions=frozenset({("t", 0)})):
    return m.TxnMetadata("tid", 42, epoch, 10_000, state, partitions, NOW, NOW)


def test_a_new_id_gets_the_new_producer_id_at_epoch_0():
    decision = m.on_init(None, transactional_id="tid", timeout_ms=5000, new_producer_id=7, now_ms=NOW)
    assert decision.error == ErrorCode.none
    assert (decision.metadata.producer_id, decision.metadata.producer_epoch, decision.metadata.state) == (
        7, 0, m.TxnState.EMPTY)


def test_init_bumps_the_epoch_and_aborts_an_open_transaction_first():
    done = _started(m.TxnState.COMPLETE_COMMIT)
    bumped = m.on_init(done, transactional_id="tid", timeout_ms=5000, new_producer_id=-1, now_ms=NOW).metadata
    assert (bumped.producer_id, bumped.producer_epoch, bumped.state, bumped.partitions) == (
        42, 4, m.TxnState.EMPTY, frozenset())
    decision = m.on_init(_started(), transactional_id="tid", timeout_ms=5000, new_producer_id=-1, now_ms=NOW)
    assert decision.error == ErrorCode.concurrent_transactions and decision.abort_first
    assert (decision.metadata.state, decision.metadata.producer_epoch) == (m.TxnState.PREPARE_ABORT, 4)
    assert decision.metadata.partitions == frozenset({("t", 0)})  # the markers go where the records are
    exhausted = _started(m.TxnState.COMPLETE_ABORT, epoch=m.MAX_EPOCH)
    renewed = m.on_init(exhausted, transactional_id="tid", timeout_ms=5000, new_producer_id=99, now_ms=NOW).metadata
    assert (renewed.producer_id, renewed.producer_epoch) == (99, 0)


def test_kip_360_bump_from_an_old_epoch_is_fenced():
    done = _started(m.TxnState.COMPLETE_COMMIT)
    assert m.on_init(done, transactional_id="tid", timeout_ms=1, new_producer_id=-1, expected_producer_id=42,
                     expected_epoch=2, now_ms=NOW).error == ErrorCode.producer_fenced
    assert m.on_init(done, transactional_id="tid", timeout_ms=1, new_producer_id=-1, expected_producer_id=42,
                     expected_epoch=3, now_ms=NOW).metadata.producer_epoch == 4


def test_add_partitions_end_and_complete():
    empty = _started(m.TxnState.EMPTY, partitions=frozenset())
    ongoing = m.on_add_partitions(empty, producer_id=42, producer_epoch=3, partitions=frozenset({("t", 1)}),
                                  now_ms=NOW + 5).metadata
    assert (ongoing.state, ongoing.partitions, ongoing.start_ms) == (m.TxnState.ONGOING, {("t", 1)}, NOW + 5)
    same = m.on_add_partitions(ongoing, producer_id=42, producer_epoch=3, partitions=frozenset({("t", 1)}),
                               now_ms=NOW + 9)
    assert same == m.Decision(ErrorCode.none)  # nothing new: nothing to write
    assert m.on_add_partitions(ongoing, producer_id=42, producer_epoch=2, partitions=frozenset(),
                               now_ms=NOW).error == ErrorCode.producer_fenced
    assert m.on_add_partitions(ongoing, producer_id=41, producer_epoch=3, partitions=frozenset(),
                               now_ms=NOW).error == ErrorCode.invalid_producer_id_mapping
    prepared = m.on_end(ongoing, producer_id=42, producer_epoch=3, commit=True, now_ms=NOW).metadata
    assert prepared.state is m.TxnState.PREPARE_COMMIT
    assert m.on_add_partitions(prepared, producer_id=42, producer_epoch=3, partitions=frozenset({("t", 2)}),
                               now_ms=NOW).error == ErrorCode.concurrent_transactions
    assert m.on_end(prepared, producer_id=42, producer_epoch=3, commit=True,
                    now_ms=NOW).error == ErrorCode.concurrent_transactions
    assert m.on_end(prepared, producer_id=42, producer_epoch=3, commit=False,
                    now_ms=NOW).error == ErrorCode.invalid_txn_state
    completed = m.on_complete(prepared, NOW)
    assert (completed.state, completed.partitions) == (m.TxnState.COMPLETE_COMMIT, frozenset())
    assert m.on_end(completed, producer_id=42, producer_epoch=3, commit=True, now_ms=NOW) == m.Decision(ErrorCode.none)
    assert m.on_end(empty, producer_id=42, producer_epoch=3, commit=False,
                    now_ms=NOW).error == ErrorCode.invalid_txn_state


def test_timeout_aborts_with_a_bumped_epoch_only_once_due():
    ongoing = _started()
    assert m.on_timeout(ongoing, NOW + 9_999) is None
    fenced = m.on_timeout(ongoing, NOW + 10_000)
    assert (fenced.state, fenced.producer_epoch) == (m.TxnState.PREPARE_ABORT, 4)
    assert m.on_timeout(_started(m.TxnState.PREPARE_COMMIT), NOW + 10**9) is None


@given(st.builds(m.TxnMetadata, st.text(min_size=1, max_size=20), st.integers(0, 2**63 - 1),
                 st.integers(0, 32767), st.integers(1, 2**31 - 1), st.sampled_from(list(m.TxnState)),
                 st.frozensets(st.tuples(st.text(min_size=1, max_size=10), st.integers(0, 2**31 - 1)), max_size=5),
                 st.integers(-1, 2**62), st.integers(-1, 2**62)))
def test_the_log_format_round_trips(metadata):
    assert decode(encode_key(metadata.transactional_id), encode_value(metadata)) == (
        metadata.transactional_id, metadata)


def test_the_log_view_keeps_the_latest_state_and_skips_unreadable_records():
    view = TxnLogView()
    first, later = _started(m.TxnState.EMPTY), _started(m.TxnState.ONGOING)
    view.apply([(encode_key("tid"), encode_value(first)), (b"\x00\x07junk", b"x"),
                (encode_key("tid"), encode_value(later))])
    assert view.transactions == {"tid": later} and view.corrupt_records == 1


def test_a_marker_is_a_valid_control_batch():
    for commit, kind in ((True, COMMIT), (False, ABORT)):
        marker = build_marker(42, 3, commit, 7, NOW)
        header = validate_batch(marker, 0)  # CRC and framing as any batch
        assert header.is_control and header.is_transactional and header.records_count == 1
        assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, -1)
        assert control_type_of(marker) == kind
        assert read_marker(marker) == Marker(kind, 7)
        assert read_marker(marker[:61 + 32]) == Marker(kind, 7)  # what the load scan reads of it
        assert read_header(marker).size == len(marker)


def test_a_marker_from_an_older_coordinator_epoch_is_fenced():
    txns = PartitionTxns()
    assert txns.coordinator_fenced(42, 0) is None
    txns.on_batch(read_header(_txn_batch(42)), 0)
    txns.on_marker(42, 1, COMMIT, 2, coordinator_epoch=5)
    assert txns.coordinator_fenced(42, 4) == 5
    assert txns.coordinator_fenced(42, 5) is None and txns.coordinator_fenced(42, 6) is None
    assert txns.coordinator_fenced(43, 0) is None  # per producer


# --- a partition's transactions against a model ---------------------------------------------------------------

_events = st.lists(st.tuples(st.sampled_from(["batch", "commit", "abort", "replicate"]), st.integers(0, 3)),
                   max_size=40)


@settings(max_examples=300, deadline=None)
@given(_events)
def test_lso_and_aborted_transactions_match_a_model(events):
    txns = PartitionTxns()
    offset = high_watermark = 0
    open_first: dict[int, int] = {}
    closed: list[tuple[int, int, int, bool]] = []  # (producer, first, marker offset, aborted)
    for kind, producer in events:
        if kind == "batch":
            header = read_header(_txn_batch(producer))
            txns.on_batch(header, offset)
            open_first.setdefault(producer, offset)
            offset += 1
        elif kind in ("commit", "abort"):
            txns.on_marker(producer, offset, COMMIT if kind == "commit" else ABORT, high_watermark)
            if producer in open_first:
                closed.append((producer, open_first.pop(producer), offset, kind == "abort"))
            offset += 1
        else:
            high_watermark = offset
        # The model: the first offset of every transaction not closed by a replicated marker, else the HW.
        unstable = list(open_first.values()) + [first for _p, first, marker, _a in closed if marker >= high_watermark]
        assert txns.lso(high_watermark) == min(unstable + [high_watermark])
        for fetch_offset in range(offset + 1):
            expected = [(p, first) for p, first, marker, aborted in closed
                        if aborted and marker >= fetch_offset and first < offset]
            got = [(a.producer_id, a.first_offset) for a in txns.aborted_between(fetch_offset, offset)]
            assert got == expected


def _txn_batch(producer: int) -> bytes:
    from tests.support import batches

    return batches.keyed_batch([b"v"], producer_id=producer, producer_epoch=0, base_sequence=0,
                               attributes_extra=0x10)


# --- the aborted transactions read from sealed segments' .txnindex files, against the same model -----------------

_sealed_events = st.lists(st.tuples(st.sampled_from(["batch"] * 3 + ["abort"] * 3 + ["commit", "replicate"]
                                                    + ["roll"] * 2 + ["roll-torn", "log-start"]), st.integers(0, 2)),
                          max_size=70)


@settings(max_examples=400, deadline=None)
@given(_sealed_events, st.data())
def test_aborted_transactions_read_from_sealed_index_files_match_a_model(events, data):
    """Rolls hand the segment's entries to a real, mapped .txnindex (or, when the file does not hold them,
    leave them on the heap, between mapped files); retention drops what lies below the log start. For random
    fetch ranges, the list equals the model's: every aborted transaction whose marker is at or after the fetch
    offset and whose first batch is below the upper bound, in marker order (a walk that stops early must
    not lose one)."""
    import tempfile
    from pathlib import Path

    from copyless.broker.storage import txn_index

    txns = PartitionTxns()
    offset = high_watermark = log_start = segment_base = 0
    open_first: dict[int, int] = {}
    closed: list[tuple[int, int, int]] = []  # aborted: (producer, first, marker offset)
    with tempfile.TemporaryDirectory() as directory:
        for kind, producer in events:
            if kind == "batch":
                txns.on_batch(read_header(_txn_batch(producer)), offset)
                open_first.setdefault(producer, offset)
                offset += 1
            elif kind in ("commit", "abort"):
                txns.on_marker(producer, offset, COMMIT if kind == "commit" else ABORT, high_watermark)
                if producer in open_first:
                    first = open_first.pop(producer)
                    if kind == "abort":
                        closed.append((producer, first, offset))
                offset += 1
            elif kind == "replicate":
                high_watermark = offset
            elif kind == "log-start":
                log_start = min(log_start + producer, high_watermark)
                txns.drop_before(log_start)
            elif offset > segment_base:  # a roll at the log end
                entries = [tuple(entry) for entry in txns.unsealed_below(offset) if entry.last_offset >= segment_base]
                path = txn_index.txn_index_path(Path(directory), segment_base)
                # A torn roll: the file lost its last entry (an append that failed), and stays unused.
                txn_index.append(path, entries[:-1] if kind == "roll-torn" else entries)
                index = txn_index.open_sealed(path, segment_base, entries)
                assert (index is None) == (not entries or kind == "roll-torn")
                if index is not None:
                    txns.adopt(index)
                segment_base = offset
        held = [(a.producer_id, a.first_offset, a.last_offset) for a in txns.aborted]
        # Below the log start, a map may keep the rest of its file: only what is above it must be exact.
        assert [entry for entry in held if entry[2] >= log_start] == \
            [entry for entry in closed if entry[2] >= log_start]
        assert set(held) <= set(closed)
        for _ in range(4):
            fetch_offset = data.draw(st.integers(log_start, offset), "fetch offset")
            for upper in range(fetch_offset, offset + 2):  # every upper bound: a walk's stop lies between two
                expected = [(p, first) for p, first, marker in closed if marker >= fetch_offset and first < upper]
                got = [(a.producer_id, a.first_offset) for a in txns.aborted_between(fetch_offset, upper)]
                assert got == expected, (fetch_offset, upper)
