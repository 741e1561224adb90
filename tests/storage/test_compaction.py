"""The log cleaner on real segment files: per key the latest record survives at its own offset, tombstones
last delete.retention.ms past the cleaning that first kept them, idempotent producers' last batches stay,
the active segment and records above the high watermark are never touched, and all of it reads back the
same after a restart. Batches come from tests/support/batches.py (an encoder independent of copyless's)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from copyless.broker.inspect_log import check_partition
from copyless.broker.storage.cleaner import clean_log, dirty_ratio
from copyless.broker.storage.compaction import DELETE_HORIZON_BIT
from copyless.protocol.records import decode_records, iter_batches
from tests.support.batches import build_batch
from tests.support.blocking_appends import append_blocking
from tests.support.log_configs import SMALL
from tests.support.subprocesses import python_env

# The suite's small segments, compacted at any dirty ratio.
COMPACT = dataclasses.replace(SMALL, cleanup_policy=("compact",), min_cleanable_dirty_ratio=0.0)
VALUE_BYTES = 1200


def append_round(log_, model, keys, round_number, *, tombstones=(), producer=None, committed=True):
    """One batch per 5 keys; model[offset] = (key, value). ``committed``: the high watermark follows (as the
    partition layer moves it on a single node)."""
    for start in range(0, len(keys), 5):
        chunk = keys[start:start + 5]
        values = [None if key in tombstones else b"%s=%d:" % (key, round_number) + b"x" * VALUE_BYTES
                  for key in chunk]
        options = {}
        if producer is not None:
            options = dict(producer_id=producer[0], producer_epoch=0, base_sequence=producer[1])
            producer[1] += len(chunk)
        result = append_blocking(log_, build_batch(values, keys=list(chunk), **options))
        for offset, key, value in zip(range(result.base_offset, result.last_offset + 1), chunk, values, strict=True):
            model[offset] = (key, value)
        if committed:
            log_.set_high_watermark(log_.log_end_offset)


def read_all(log_):
    """Every (offset, key, value, batch header) the log serves from its start, through real reads."""
    out = []
    offset = log_.log_start_offset
    while offset < log_.log_end_offset:
        result = log_.read(offset, 1 << 20)
        if result.slice is None:
            break
        with result.slice as region:
            data = region.read_bytes()
        for position, header in iter_batches(data):
            for record in decode_records(data, position):
                out.append((record.offset, record.key, record.value, header))
            offset = header.next_offset
    return out


def latest_by_key(model):
    latest = {}
    for offset in sorted(model):
        latest[model[offset][0]] = offset
    return latest


def check_against_model(records, model, *, tombstones_gone=False):
    offsets = [offset for offset, *_ in records]
    assert offsets == sorted(set(offsets)), "offsets must stay strictly increasing"
    for offset, key, value, _ in records:
        assert model[offset] == (key, value), f"offset {offset} reads {key!r}, the model has {model[offset][0]!r}"
    latest = latest_by_key(model)
    present = {offset for offset, *_ in records}
    for key, offset in latest.items():
        if model[offset][1] is None and tombstones_gone:
            assert offset not in present
            assert all(k != key for _, k, _, _ in records), f"{key!r} outlived its tombstone"
        else:
            assert offset in present, f"the latest record of {key!r} (offset {offset}) is gone"


def test_cleaning_keeps_each_keys_latest_record_at_its_offset(manager_factory, tmp_path):
    manager = manager_factory(COMPACT)
    log_ = manager.create_log("table", 0)
    model = {}
    keys = [b"k%02d" % number for number in range(20)]
    for round_number in range(12):
        append_round(log_, model, keys, round_number)
    manager.wait_for_background()
    segments_before = len(log_.segments)
    size_before = log_.size_bytes
    assert segments_before >= 4 and dirty_ratio(log_) > 0.9
    result = clean_log(log_, force=True)
    assert result is not None and result.aborted is None
    assert result.records_dropped > 0 and result.keys == 20
    records = read_all(log_)
    check_against_model(records, model)
    # The active segment was not cleaned: everything in it is still there.
    active_base = log_.segments[-1].base_offset
    assert [o for o, *_ in records if o >= active_base] == [o for o in sorted(model) if o >= active_base]
    # Below the active segment each key appears at most once.
    cleaned_keys = [key for offset, key, *_ in records if offset < active_base]
    assert len(cleaned_keys) == len(set(cleaned_keys))
    assert log_.size_bytes < size_before / 2 and len(log_.segments) < segments_before
    assert dirty_ratio(log_) == 0.0
    assert clean_log(log_, force=True) is None, "nothing dirty left"
    manager.shutdown()
    report = check_partition(tmp_path / "data" / "table-0", "table", 0)
    assert not [finding for finding in report.findings if finding.level == "ERROR"], report.findings
    manager = manager_factory(COMPACT)
    log_ = manager.get_log("table", 0)
    assert log_.log_end_offset == max(model) + 1
    check_against_model(read_all(log_), model)


def test_tombstones_stay_until_their_horizon_then_go(manager_factory):
    config = dataclasses.replace(COMPACT, delete_retention_ms=60_000)
    manager = manager_factory(config)
    log_ = manager.create_log("table", 0)
    model = {}
    keys = [b"k%02d" % number for number in range(10)]
    for round_number in range(6):
        append_round(log_, model, keys, round_number)
    append_round(log_, model, keys, 6, tombstones=set(keys[:5]))
    for round_number in range(7, 20):  # pushes the tombstones out of the active segment
        append_round(log_, model, keys[5:], round_number)
    manager.wait_for_background()
    now = 1_800_000_000_000
    assert clean_log(log_, force=True, now=now) is not None
    records = read_all(log_)
    check_against_model(records, model)
    tombstone_headers = [header for _, _, value, header in records if value is None]
    assert len(tombstone_headers) == 5
    assert all(header.attributes & DELETE_HORIZON_BIT and header.base_timestamp == now + 60_000
               for header in tombstone_headers)
    # The record timestamps survive the horizon rewrite (deltas are rebased on it).
    for *_, header in records:
        assert header.base_timestamp > 0
    # More writes make the log dirty again; a cleaning before the horizon keeps the tombstones.
    for round_number in range(20, 34):
        append_round(log_, model, keys[5:], round_number)
    manager.wait_for_background()
    assert clean_log(log_, force=True, now=now + 59_999) is not None
    assert sum(1 for _, _, value, _ in read_all(log_) if value is None) == 5
    for round_number in range(34, 48):
        append_round(log_, model, keys[5:], round_number)
    manager.wait_for_background()
    result = clean_log(log_, force=True, now=now + 60_000)
    assert result.tombstones_dropped == 5
    check_against_model(read_all(log_), model, tombstones_gone=True)


def test_inspect_shows_tombstones_and_their_delete_horizon(manager_factory):
    """``copyless inspect`` on a cleaned segment: the batch of tombstones with the horizon the cleaning stored
    in it (KIP-534), the others with none."""
    config = dataclasses.replace(COMPACT, delete_retention_ms=60_000)
    manager = manager_factory(config)
    log_ = manager.create_log("table", 0)
    model = {}
    keys = [b"k%02d" % number for number in range(10)]
    append_round(log_, model, keys, 0)
    append_round(log_, model, keys, 1, tombstones=set(keys[:5]))
    for round_number in range(2, 16):
        append_round(log_, model, keys[5:], round_number)
    manager.wait_for_background()
    before = inspect_lines(log_.segments[0].log_path)
    assert any("tombstones: 5 deleteHorizonMs: none" in line for line in before), before
    now = 1_800_000_000_000
    assert clean_log(log_, force=True, now=now) is not None
    lines = [line for segment in log_.segments[:-1] for line in inspect_lines(segment.log_path)]
    with_tombstones = [line for line in lines if "tombstones: 0 " not in line]
    assert len(with_tombstones) == 1, lines
    assert with_tombstones[0].endswith(f"tombstones: 5 deleteHorizonMs: {now + 60_000} (2027-01-15T08:01:00.000000Z)")
    assert all(line.endswith("deleteHorizonMs: none") for line in lines if line not in with_tombstones)
    assert all("isvalid: true" in line for line in lines)


def inspect_lines(segment_path):
    done = subprocess.run([sys.executable, "-m", "copyless", "inspect", str(segment_path)], capture_output=True,
                          text=True, timeout=60, env=python_env())
    assert done.returncode == 0, done.stdout + done.stderr
    return [line for line in done.stdout.splitlines() if line.startswith("baseOffset: ")]


def test_an_idempotent_producers_last_batch_stays_as_an_empty_batch(manager_factory):
    manager = manager_factory(COMPACT)
    log_ = manager.create_log("table", 0)
    model = {}
    keys = [b"k%02d" % number for number in range(10)]
    producer = [4242, 0]
    append_round(log_, model, keys[:5], 0, producer=producer)  # the producer's only batch
    for round_number in range(1, 12):
        append_round(log_, model, keys, round_number)
    manager.wait_for_background()
    assert clean_log(log_, force=True) is not None
    headers = list(log_.batch_headers(0))
    kept = [header for header in headers if header.producer_id == 4242]
    assert len(kept) == 1 and kept[0].records_count == 0
    assert (kept[0].base_offset, kept[0].last_offset, kept[0].base_sequence) == (0, 4, 0)
    check_against_model(read_all(log_), model)


def test_nothing_above_the_high_watermark_is_cleaned(manager_factory):
    manager = manager_factory(COMPACT)
    log_ = manager.create_log("table", 0)
    model = {}
    keys = [b"k%02d" % number for number in range(10)]
    append_round(log_, model, keys, 0)
    manager.wait_for_background()
    log_.set_high_watermark(log_.log_end_offset)
    high_watermark = log_.high_watermark
    for round_number in range(1, 12):
        append_round(log_, model, keys, round_number, committed=False)
    manager.wait_for_background()
    assert log_.high_watermark == high_watermark
    assert clean_log(log_, force=True) is None
    assert [o for o, *_ in read_all(log_)] == sorted(model)


def test_a_pass_whose_map_fills_stops_there_and_the_next_one_goes_on(manager_factory):
    manager = manager_factory(COMPACT)
    log_ = manager.create_log("table", 0)
    model = {}
    keys = [b"k%02d" % number for number in range(40)]
    for round_number in range(8):
        append_round(log_, model, keys, round_number)
    manager.wait_for_background()
    first = clean_log(log_, force=True, max_map_entries=15)
    assert first.keys <= 15 and first.end_offset < log_.segments[-1].base_offset
    check_against_model(read_all(log_), model)
    passes = 1
    while clean_log(log_, force=True, max_map_entries=15) is not None:
        passes += 1
        check_against_model(read_all(log_), model)
        assert passes < 50
    assert passes >= 2 and dirty_ratio(log_) == 0.0


def test_transactional_records_neither_supersede_nor_go(manager_factory):
    """A key written in a transaction (which may have aborted: the batch cannot tell) must not remove the
    committed value before it, and a transactional batch stays whole even when later plain records supersede
    its keys: transactions lose nothing to the cleaner (its module docstring)."""
    manager = manager_factory(COMPACT)
    log_ = manager.create_log("table", 0)
    keys = [b"k%02d" % number for number in range(5)]
    model = {}
    append_round(log_, model, keys, 0)  # the committed values
    plain = sorted(model)
    values = [b"%s=txn" % key for key in keys]
    txn = append_blocking(log_, build_batch(values, keys=list(keys), producer_id=9, producer_epoch=0, base_sequence=0,
                                           attributes_extra=0x10))
    log_.set_high_watermark(log_.log_end_offset)
    for round_number in range(1, 12):  # fill segments so the transactional batch is below the active one
        append_round(log_, model, [b"other%02d" % n for n in range(20)], round_number)
    manager.wait_for_background()
    assert log_.segments[-1].base_offset > txn.last_offset
    result = clean_log(log_, force=True)
    assert result is not None and result.aborted is None and result.records_dropped > 0
    present = {offset: (key, value) for offset, key, value, _header in read_all(log_)}
    for offset in plain:  # not superseded by the transaction's records
        assert present[offset] == model[offset]
    for offset, key, value in zip(range(txn.base_offset, txn.last_offset + 1), keys, values, strict=True):
        assert present[offset] == (key, value)
    manager.shutdown()
