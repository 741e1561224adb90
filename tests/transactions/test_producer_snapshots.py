"""Loading a partition's producer state from a snapshot plus the log after it (``broker.partition_state_files``)
finds what a scan of the whole log finds, on real logs: after torn index tails, corrupt snapshots,
truncations, retention, and a kill -9 at each step of a snapshot's write."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from copyless.broker import producer_snapshot
from copyless.broker.inspect_log import check_partition
from copyless.broker.partition_state_files import StateFiles, load_partition_state
from copyless.broker.storage import LogManager, txn_index
from copyless.broker.storage._failpoints import SNAPSHOT_POINTS
from tests.support.log_configs import SMALL
from tests.support.producer_history import History, live_state, state_of

ROOT = Path(__file__).resolve().parents[2]


# --- load from a snapshot + replay == a scan of the whole log ---------------------------------------------------

_operations = st.lists(st.tuples(st.sampled_from(["idempotent", "transactional", "transactional", "commit", "abort",
                                                  "bump"]), st.integers(1, 4)), min_size=60, max_size=160)


def _full_scan(partition_log, high_watermark):
    """What the scan of the whole log finds: the load with no snapshot and no index file."""
    directory = partition_log.directory
    for offset in producer_snapshot.snapshot_offsets(directory):
        producer_snapshot.snapshot_path(directory, offset).unlink()
    for base in txn_index.index_bases(directory):
        txn_index.txn_index_path(directory, base).unlink()
    loaded = load_partition_state(partition_log, high_watermark)
    assert loaded.snapshot_offset is None and loaded.replay_start == partition_log.segment_base_offsets()[0]
    return state_of(loaded.producers, loaded.txns, high_watermark)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_operations, st.integers(0, 160), st.data())
def test_loading_from_a_snapshot_and_the_log_after_it_equals_a_full_scan(operations, snapshot_at, data):
    with tempfile.TemporaryDirectory() as tmp:
        manager = LogManager(Path(tmp), default_config=SMALL, background_interval_ms=None)
        manager.startup()
        partition_log = manager.create_log("t", 0)
        state_files = StateFiles()
        history = History(partition_log, state_files)
        for number, (operation, producer) in enumerate(operations):
            if number == snapshot_at:
                history.snapshot()  # as at a clean shutdown: mid-segment
            history.apply(operation, producer)
        state_files.close()
        high_watermark = data.draw(st.integers(0, partition_log.log_end_offset), "high watermark")
        partition_log.set_high_watermark(high_watermark)
        expected = live_state(history)
        directory = partition_log.directory
        snapshots = producer_snapshot.snapshot_offsets(directory)
        used = snapshots[-1] if snapshots else None
        indexes = txn_index.index_bases(directory)
        if indexes and data.draw(st.booleans(), "tear the last index"):
            path = txn_index.txn_index_path(directory, indexes[-1])
            os.truncate(path, path.stat().st_size - data.draw(st.integers(1, 33), "torn bytes"))
            bases = partition_log.segment_base_offsets()
            if used is not None and indexes[-1] <= max(base for base in bases if base <= used):
                # A torn file of the snapshot's segment or before it may have lost an entry below the
                # snapshot: not trusted, the whole log is replayed.
                used = None
        loaded = load_partition_state(partition_log, high_watermark)
        assert loaded.snapshot_offset == used
        assert state_of(loaded.producers, loaded.txns, high_watermark) == expected
        if used is not None:
            assert loaded.replay_start == used
        event(f"snapshot used: {used is not None}, aborted: {bool(loaded.txns.aborted)}, "
              f"segments: {min(len(partition_log.segment_base_offsets()), 3)}")
        # The load left a snapshot at the log end and whole index files: a second load replays nothing.
        again = load_partition_state(partition_log, high_watermark)
        assert again.batches_replayed == 0 and state_of(again.producers, again.txns, high_watermark) == expected
        assert _full_scan(partition_log, high_watermark) == expected
        manager.shutdown()


def test_truncation_drops_the_snapshots_and_index_entries_past_the_cut(history):
    partition_log = history.log
    for round_number in range(20):
        for producer in (1, 2, 3):
            history.apply("transactional", producer)
        for producer in (1, 2, 3):
            history.apply("abort" if (round_number + producer) % 2 else "commit", producer)
    history.snapshot()
    history.state_files.close()
    directory = partition_log.directory
    assert len(producer_snapshot.snapshot_offsets(directory)) >= 3 and txn_index.index_bases(directory)
    cut = partition_log.segment_base_offsets()[1] + 7
    partition_log.truncate_to(cut)
    partition_log.set_high_watermark(partition_log.log_end_offset)
    loaded = load_partition_state(partition_log, partition_log.log_end_offset)
    assert all(offset <= cut for offset in producer_snapshot.snapshot_offsets(directory))
    entries = [entry for base in txn_index.index_bases(directory)
               for entry in txn_index.read(txn_index.txn_index_path(directory, base))[0]]
    assert entries and all(entry.last_offset < cut for entry in entries)
    assert [tuple(entry)[:3] for entry in entries] == [tuple(a)[:3] for a in loaded.txns.aborted]
    expected = state_of(loaded.producers, loaded.txns, partition_log.log_end_offset)
    assert _full_scan(partition_log, partition_log.log_end_offset) == expected


def test_retention_deletes_a_segments_index_and_the_snapshots_below_the_log(history):
    partition_log = history.log
    for _ in range(40):
        history.apply("transactional", 1)
        history.apply("abort", 1)
    history.state_files.close()
    directory = partition_log.directory
    first, second = partition_log.segment_base_offsets()[:2]
    assert first in txn_index.index_bases(directory)
    partition_log.set_high_watermark(partition_log.log_end_offset)
    partition_log.delete_records_before(second)
    partition_log.run_retention()
    partition_log._background.reap(now_ms=2**62)
    assert not (txn_index.txn_index_path(directory, first)).exists()
    assert not list(directory.glob("*.txnindex.deleted"))
    loaded = load_partition_state(partition_log, partition_log.log_end_offset)
    assert all(offset >= second for offset in producer_snapshot.snapshot_offsets(directory))
    assert all(entry.last_offset >= second for entry in loaded.txns.aborted)


def test_a_corrupt_latest_snapshot_is_deleted_and_the_one_before_used(history):
    partition_log = history.log
    for _ in range(60):
        history.apply("transactional", 1)
        history.apply("abort", 1)
    history.apply("transactional", 2)
    history.snapshot()
    history.state_files.close()
    directory = partition_log.directory
    offsets = producer_snapshot.snapshot_offsets(directory)
    path = producer_snapshot.snapshot_path(directory, offsets[-1])
    data = bytearray(path.read_bytes())
    data[10] ^= 1
    path.write_bytes(bytes(data))
    findings = check_partition(directory, "t", 0).findings
    assert [(finding.severity, finding.where) for finding in findings] == [("ERROR", str(path))]
    loaded = load_partition_state(partition_log, partition_log.high_watermark)
    assert loaded.snapshot_offset == offsets[-2]
    assert state_of(loaded.producers, loaded.txns, partition_log.high_watermark) == live_state(history)


# --- kill -9 while a snapshot is written -------------------------------------------------------------------------


@pytest.mark.parametrize("point", SNAPSHOT_POINTS)
def test_a_kill_while_a_snapshot_is_written_leaves_a_loadable_partition(manager_factory, tmp_path, point):
    """The scenario process writes a transactional history and is SIGKILLed at ``point`` of its third
    snapshot write; a load then finds exactly what a full scan finds, and no .tmp is left."""
    env = dict(os.environ, COPYLESS_FAILPOINT=point, COPYLESS_FAILPOINT_SKIP="2", PYTHONPATH=str(ROOT))
    process = subprocess.run([sys.executable, "-m", "tests.transactions.snapshot_crash_scenario", str(tmp_path)],
                             cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert process.returncode == -9, process.stderr.decode()[-2000:]
    directory = tmp_path / "t-0"
    assert len(list(directory.glob("*.snapshot"))) == (3 if point == "snapshot.after_rename" else 2)
    partition_log = manager_factory(directory=tmp_path).get_log("t", 0)
    high_watermark = partition_log.log_end_offset
    loaded = load_partition_state(partition_log, high_watermark)
    assert loaded.snapshot_offset is not None and loaded.snapshot_offset > 0
    assert not list(directory.glob("*.tmp"))
    assert loaded.txns.aborted and loaded.txns.ongoing
    expected = state_of(loaded.producers, loaded.txns, high_watermark)
    assert _full_scan(partition_log, high_watermark) == expected


def test_index_entries_in_the_file_of_no_segment_are_refiled_under_the_segment_holding_their_marker(
        history):
    """A cleaning that merges segments leaves the later segments' .txnindex under their old names: loading
    files those entries under the merged segment, once."""
    partition_log = history.log
    for _ in range(60):
        history.apply("transactional", 1)
        history.apply("abort", 1)
    history.snapshot()
    history.state_files.close()
    directory = partition_log.directory
    first, second = partition_log.segment_base_offsets()[:2]
    # The entries of the first segment as if a cleaning had merged it into a segment at `first` from
    # a segment that started at `first + 1`, and an earlier load refiled half of them before a crash.
    entries, _ = txn_index.read(txn_index.txn_index_path(directory, first))
    assert len(entries) > 2 and second > first + 1
    txn_index.rewrite(txn_index.txn_index_path(directory, first + 1), entries)
    txn_index.rewrite(txn_index.txn_index_path(directory, first), entries[: len(entries) // 2])
    loaded = load_partition_state(partition_log, partition_log.high_watermark)
    assert state_of(loaded.producers, loaded.txns, partition_log.high_watermark) == live_state(history)
    assert first + 1 not in txn_index.index_bases(directory)
    assert txn_index.read(txn_index.txn_index_path(directory, first))[0] == entries


# --- the aborted transactions held in memory ------------------------------------------------------------------

def _aborted_entries_held(txns) -> int:
    """How many aborted-transaction entries (``AbortedTxn`` or ``txn_index.IndexEntry`` objects) are reachable
    from ``txns``: what the partition's state keeps on the heap, whatever attribute holds it."""
    from copyless.broker.txn_partition import AbortedTxn

    seen: set[int] = set()
    stack = [txns]
    held = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, type(os), type(_aborted_entries_held))):
            continue
        seen.add(id(obj))
        if isinstance(obj, (AbortedTxn, txn_index.IndexEntry)):
            held += 1
            continue
        stack.extend(gc.get_referents(obj))
    return held


def _active_segment_entries(partition_log, txns) -> int:
    active = partition_log.segment_base_offsets()[-1]
    return sum(1 for entry in txns.aborted if entry.last_offset >= active)


def test_the_aborted_transactions_held_in_memory_are_bounded_by_the_active_segments(manager_factory):
    """Kafka keeps only open transactions in memory and reads the aborted ones of sealed segments from their
    .txnindex at fetch time: here too, the live state and a loaded one hold the active segment's entries
    only, however many segments rolled with aborted transactions in them."""
    manager = manager_factory()
    partition_log = manager.create_log("t", 0)
    state_files = StateFiles()
    history = History(partition_log, state_files)
    for _ in range(200):
        history.apply("transactional", 1)
        history.apply("abort", 1)
    history.snapshot()
    state_files.close()
    assert len(partition_log.segment_base_offsets()) >= 10 and len(history.txns.aborted) == 200
    live_bound = _active_segment_entries(partition_log, history.txns)
    history.txns.aborted_between(0, partition_log.log_end_offset)  # the loop thread takes the sealed files
    assert _aborted_entries_held(history.txns) <= live_bound
    loaded = load_partition_state(partition_log, partition_log.high_watermark)
    assert _aborted_entries_held(loaded.txns) <= _active_segment_entries(partition_log, loaded.txns)
    assert state_of(loaded.producers, loaded.txns, partition_log.high_watermark) == live_state(history)
