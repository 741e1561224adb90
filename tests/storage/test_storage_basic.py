"""PartitionLog / LogManager basics against real files: offsets, reads by Kafka's rules, timestamps,
rolls, restart, retention, flush, pinning."""

from __future__ import annotations

import logging
import os
from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from copyless.broker.storage import FileSlice, LogConfig, OffsetOutOfRangeError, StorageError
from copyless.broker.storage import scan as scan_module
from copyless.protocol.records import iter_batches, read_header, validate_batch
from tests.support.batches import build_batch, records_of
from tests.support.blocking_appends import append_blocking


def append_values(partition_log, count, *, size=100, start_timestamp=1_000, per_batch=1):
    results = []
    for number in range(count):
        values = [f"v{number}-{i}".encode().ljust(size, b".") for i in range(per_batch)]
        timestamps = [start_timestamp + number * 10 + i for i in range(per_batch)]
        results.append(append_blocking(partition_log, build_batch(values, timestamps)))
    return results


def test_offsets_are_assigned_contiguously_and_batches_stay_valid(manager_factory):
    partition_log = manager_factory().create_log("orders", 0)
    first = append_blocking(partition_log, build_batch([b"a", b"b", b"c"], [1, 2, 3]))
    second = append_blocking(partition_log, build_batch([b"d"], [4]), leader_epoch=7)
    assert (first.base_offset, first.last_offset, first.log_append_time_ms) == (0, 2, -1)
    assert (second.base_offset, second.last_offset) == (3, 3)
    assert partition_log.log_end_offset == 4
    # The high watermark is replication's: the log reports what the partition layer last set.
    assert partition_log.high_watermark == 0
    partition_log.set_high_watermark(4)
    assert partition_log.high_watermark == 4 and partition_log.leader_epochs.entries() == [(0, 0), (7, 3)]
    result = partition_log.read(0, 1 << 20)
    with result.slice as region:
        data = region.read_bytes()
    headers = [validate_batch(data, position) for position, _ in iter_batches(data)]
    assert [(h.base_offset, h.last_offset, h.partition_leader_epoch) for h in headers] == [(0, 2, 0), (3, 3, 7)]
    assert [r.value for r in records_of(data)] == [b"a", b"b", b"c", b"d"]
    assert [r.offset for r in records_of(data)] == [0, 1, 2, 3]


def test_several_batches_in_one_append(manager_factory):
    partition_log = manager_factory().create_log("t", 0)
    records = build_batch([b"x"] * 3, [5, 6, 7]) + build_batch([b"y"] * 2, [8, 9])
    result = append_blocking(partition_log, records)
    assert (result.base_offset, result.last_offset) == (0, 4)
    with partition_log.read(3, 1 << 20).slice as region:
        data = region.read_bytes()
    assert read_header(data).base_offset == 3
    assert [r.offset for r in records_of(data)] == [3, 4]


def test_log_append_time_rewrites_timestamp_and_crc(manager_factory):
    partition_log = manager_factory().create_log("t", 0)
    result = append_blocking(partition_log, build_batch([b"a", b"b"], [10, 20]), log_append_time_ms=123_456)
    assert result.log_append_time_ms == 123_456
    with partition_log.read(0, 1 << 20).slice as region:
        data = region.read_bytes()
    header = validate_batch(data)  # CRC recomputed
    assert header.is_log_append_time and header.max_timestamp == 123_456
    assert [r.timestamp for r in records_of(data)] == [123_456, 123_456]
    assert partition_log.offset_for_timestamp(123_456) == (0, 123_456)


def test_partial_or_garbage_input_is_rejected_without_effect(manager_factory):
    partition_log = manager_factory().create_log("t", 0)
    batch = build_batch([b"a"], [1])
    for bad in (batch[:-1], batch + b"\x00" * 10, b"", b"\x00" * 100):
        with pytest.raises(ValueError):
            append_blocking(partition_log, bad)
    assert partition_log.log_end_offset == 0
    assert partition_log.read(0, 100).slice is None


def test_read_follows_kafka_fetch_rules(manager_factory):
    partition_log = manager_factory().create_log("t", 0)
    sizes = []
    for number in range(5):
        batch = build_batch([bytes([65 + number]) * 300], [number])
        sizes.append(len(batch))
        append_blocking(partition_log, batch)
    # Starts at the batch holding the offset and ends on a batch boundary within max_bytes: Kafka would
    # send 10 bytes of batch 3 that the client drops.
    partition_log.set_high_watermark(5)
    result = partition_log.read(2, sizes[2] + 10)
    assert isinstance(result.slice, FileSlice) and result.slice.length == sizes[2]
    assert result.high_watermark == 5 and result.log_start_offset == 0
    assert read_header(result.slice.read_bytes()).base_offset == 2
    result.slice.release()
    result = partition_log.read(2, sizes[2] + sizes[3] + sizes[4] - 1)
    assert result.slice.length == sizes[2] + sizes[3]
    result.slice.release()
    # First batch whole even when larger than max_bytes (min_one_message) ...
    result = partition_log.read(1, 10)
    assert result.slice.length == sizes[1]
    result.slice.release()
    # ... and nothing when not min_one_message.
    assert partition_log.read(1, 10, min_one_message=False).slice is None
    # Never past max_offset: the batch holding it is excluded.
    result = partition_log.read(0, 1 << 20, max_offset=3)
    assert result.slice.length == sum(sizes[:3])
    result.slice.release()
    assert partition_log.read(3, 1 << 20, max_offset=3).slice is None
    # Fetch at the log end is empty; beyond it or before the start is out of range.
    assert partition_log.read(5, 100).slice is None
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.read(6, 100)
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.read(-1, 100)


def test_reads_stay_in_one_segment_and_rolls_happen(manager_factory, small_config):
    partition_log = manager_factory(small_config).create_log("t", 0)
    append_values(partition_log, 400, size=400)
    bases = partition_log.segment_base_offsets()
    assert len(bases) > 2 and bases[0] == 0
    for base in bases[1:]:
        result = partition_log.read(base - 1, 1 << 30)
        data = result.slice.read_bytes()
        result.slice.release()
        offsets = [r.offset for r in records_of(data)]
        assert offsets[-1] == base - 1, "a read must stop at its segment's end"
    # Every offset readable, record by record.
    for offset in range(0, 400, 37):
        with partition_log.read(offset, 1).slice as region:
            assert [r.value[:8] for r in records_of(region.read_bytes()) if r.offset == offset] == [
                f"v{offset}-0".encode().ljust(8, b".")[:8]]


def test_offset_for_timestamp_is_exact_per_record(manager_factory, small_config):
    partition_log = manager_factory(small_config).create_log("t", 0)
    # Three records per batch with non-monotonic timestamps inside the batch.
    for number in range(300):
        base = 10_000 + number * 100
        append_blocking(partition_log, build_batch([b"a" * 200, b"b", b"c"], [base + 50, base, base + 20]))
    assert partition_log.offset_for_timestamp(0) == (0, 10_050)
    # t = base+10 of batch 120: first record (by offset) with ts >= t is the first record of batch 120.
    assert partition_log.offset_for_timestamp(10_000 + 120 * 100 + 10) == (360, 22_050)
    # t = base+51 of batch 7: batch 7's records are all below it, so batch 8's first record.
    assert partition_log.offset_for_timestamp(10_000 + 7 * 100 + 51) == (24, 10_850)
    assert partition_log.offset_for_timestamp(10_000 + 299 * 100 + 50) == (897, 39_950)
    assert partition_log.offset_for_timestamp(10_000 + 299 * 100 + 51) is None


def test_compressed_batches_are_stored_and_searched(manager_factory):
    partition_log = manager_factory().create_log("t", 0)
    for codec in (1, 2, 3, 4):
        append_blocking(partition_log, build_batch([b"z" * 100] * 4, [codec * 10 + i for i in range(4)], codec=codec))
    assert partition_log.offset_for_timestamp(32) == (10, 32)
    with partition_log.read(0, 1 << 20).slice as region:
        assert len(records_of(region.read_bytes())) == 16


def test_batch_headers_scan(manager_factory, small_config):
    partition_log = manager_factory(small_config).create_log("t", 0)
    append_values(partition_log, 300, size=300, per_batch=2)
    headers = list(partition_log.batch_headers(101))
    assert headers[0].base_offset == 100 and headers[0].last_offset == 101
    assert [h.base_offset for h in headers] == list(range(100, 600, 2))


def test_clean_restart_keeps_everything(manager_factory, small_config, tmp_path):
    manager = manager_factory(small_config)
    partition_log = manager.create_log("t", 3)
    append_values(partition_log, 300, size=300)
    segments_before = partition_log.segment_base_offsets()
    manager.shutdown()
    manager = manager_factory(small_config)
    assert manager.startup_stats["clean"] and manager.startup_stats["segments_recovered"] == 0
    partition_log = manager.get_log("t", 3)
    assert partition_log.segment_base_offsets() == segments_before
    assert partition_log.log_end_offset == partition_log.flushed_offset == 300
    assert partition_log.offset_for_timestamp(1_000 + 150 * 10) == (150, 2_500)
    assert append_blocking(partition_log, build_batch([b"after"], [5])).base_offset == 300
    with partition_log.read(299, 1 << 20).slice as region:
        assert [r.value for r in records_of(region.read_bytes())][-1] == b"after"


def test_unclean_restart_recovers_and_rebuilds_indexes(manager_factory, small_config):
    manager = manager_factory(small_config)
    partition_log = manager.create_log("t", 0)
    append_values(partition_log, 250, size=300)
    directory = partition_log.directory
    manager.abandon()
    # Indexes are never trusted after a crash: scribble over every one of them.
    for name in os.listdir(directory):
        if name.endswith("index"):
            with open(directory / name, "r+b") as handle:
                handle.write(b"\xff" * 64)
    manager = manager_factory(small_config)
    assert not manager.startup_stats["clean"]
    partition_log = manager.get_log("t", 0)
    assert partition_log.log_end_offset == 250
    for offset in (0, 77, 130, 249):
        with partition_log.read(offset, 1).slice as region:
            assert any(r.offset == offset for r in records_of(region.read_bytes()))
    assert partition_log.offset_for_timestamp(1_000 + 200 * 10) == (200, 3_000)


def test_start_up_says_new_clean_or_unclean(manager_factory, small_config, caplog, tmp_path):
    """A brand-new data dir has no clean-shutdown marker because nothing was ever there: it must not be
    reported as a crash, even when the broker has already put its own files there. A clean stop says clean;
    only a real crash says unclean (as a warning)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "meta.properties").write_text("node.id=0\n")  # the broker writes it before storage

    def start_up_records():
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="copyless.storage"):
            manager = manager_factory(small_config)
        return manager, [r for r in caplog.records if r.getMessage().startswith("storage started")]

    manager, (record,) = start_up_records()
    assert "new data directory" in record.getMessage() and "unclean" not in record.getMessage()
    assert record.levelno == logging.INFO and manager.startup_stats["new"]
    manager.create_log("t", 0)
    append_values(manager.get_log("t", 0), 3)
    manager.shutdown()
    manager, (record,) = start_up_records()
    assert "clean shutdown" in record.getMessage() and "unclean" not in record.getMessage()
    assert not manager.startup_stats["new"]
    manager.abandon()
    manager, (record,) = start_up_records()
    assert "unclean shutdown" in record.getMessage() and record.levelno == logging.WARNING
    assert not manager.startup_stats["new"] and not manager.startup_stats["clean"]
    # A data dir that lost its marker but holds logs is a crash, not a new directory.
    assert manager.get_log("t", 0).log_end_offset == 3


def test_torn_tail_is_truncated_at_the_last_whole_batch(manager_factory, small_config):
    manager = manager_factory(small_config)
    partition_log = manager.create_log("t", 0)
    append_values(partition_log, 20, size=100)
    active = partition_log.segments[-1]
    path, end = active.log_path, active.committed_position
    manager.abandon()
    with open(path, "r+b") as handle:  # corrupt the last batch's records: CRC mismatch
        handle.seek(end - 5)
        handle.write(b"XXXXX")
    manager = manager_factory(small_config)
    partition_log = manager.get_log("t", 0)
    assert partition_log.log_end_offset == 19
    assert manager.startup_stats["bytes_discarded"] > 0
    assert append_blocking(partition_log, build_batch([b"new"], [1])).base_offset == 19


def test_retention_by_size_and_time_keeps_active_and_pins(manager_factory):
    config = LogConfig(segment_bytes=16 << 10, segment_index_bytes=1024, retention_ms=None,
                       retention_bytes=40 << 10, file_delete_delay_ms=0)
    manager = manager_factory(config)
    partition_log = manager.create_log("t", 0)
    append_values(partition_log, 200, size=500)
    manager.wait_for_background()  # the last roll's renames are done (until then its predecessor stays)
    pinned = partition_log.read(0, 100).slice  # a FileSlice in flight pins segment 0
    first_segment = partition_log.segments[0]
    # Retention deletes only below the high watermark; the partition layer of a single node keeps it at the
    # log end, as here.
    partition_log.set_high_watermark(partition_log.log_end_offset)
    deleted = partition_log.run_retention()
    assert deleted > 0
    assert partition_log.log_start_offset == partition_log.segment_base_offsets()[0] > 0
    assert partition_log.size_bytes - partition_log.segments[0].size_bytes < 40 << 10
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.read(0, 100)
    manager.run_retention()  # the reaper must not delete a pinned segment
    assert first_segment.log_path.name.endswith(".deleted") and first_segment.log_path.exists()
    assert pinned.read_bytes()[:8] == bytes(8)  # still readable through the pinned fd: base offset 0
    pinned.release()
    manager.wait_for_background()  # seals still in flight also pin their segment until done
    assert not first_segment.log_path.exists()
    assert not any(name.endswith(".deleted") for name in os.listdir(partition_log.directory))
    # Time retention: every sealed segment's largest timestamp (~1970) is older than a day.
    partition_log.config = LogConfig(segment_bytes=16 << 10, retention_ms=86_400_000, file_delete_delay_ms=0)
    partition_log.run_retention()
    assert len(partition_log.segments) == 1 and partition_log.log_start_offset == partition_log.segments[0].base_offset


def test_retention_stops_at_the_high_watermark(manager_factory):
    """Kafka's rule: only segments wholly below the high watermark are deletable. Records above it are not on
    every in-sync replica yet; a leader that deleted them would force a follower still in the ISR to restart
    its log past records it never received."""
    config = LogConfig(segment_bytes=16 << 10, segment_index_bytes=1024, retention_ms=None,
                       retention_bytes=20 << 10, file_delete_delay_ms=0)
    manager = manager_factory(config)
    partition_log = manager.create_log("t", 0)
    append_values(partition_log, 400, size=500)  # ~13 segments, far over retention.bytes
    manager.wait_for_background()
    bases = partition_log.segment_base_offsets()
    high_watermark = bases[3] + 1  # inside the fourth segment: the first three are wholly below it
    partition_log.set_high_watermark(high_watermark)
    assert partition_log.run_retention() == 3
    assert partition_log.log_start_offset == bases[3] and partition_log.high_watermark == high_watermark
    assert partition_log.run_retention() == 0  # nothing more while the high watermark stays
    partition_log.set_high_watermark(partition_log.log_end_offset)
    assert partition_log.run_retention() > 0
    assert partition_log.size_bytes - partition_log.segments[0].size_bytes < 20 << 10


def test_flush_and_group_commit(manager_factory, small_config):
    partition_log = manager_factory(small_config).create_log("t", 0)
    append_values(partition_log, 50)
    targets = (10, 30, 50)
    futures = [partition_log.wait_flushed(offset) for offset in targets]
    for target, future in zip(targets, futures, strict=True):
        assert future.result(timeout=30) >= target
    assert partition_log.flushed_offset == 50
    assert all(segment.flushed_position == segment.committed_position for segment in partition_log.segments)
    assert partition_log.flush().result(timeout=30) == 50
    config = LogConfig(segment_bytes=64 << 10, segment_index_bytes=4096, flush_messages=5)
    partition_log.config = config
    append_values(partition_log, 5)
    deadline_future = partition_log.wait_flushed(55)
    assert deadline_future.result(timeout=30) >= 55


def test_delete_log_and_recreate(manager_factory, small_config):
    manager = manager_factory(small_config)
    partition_log = manager.create_log("gone", 0)
    append_values(partition_log, 10)
    directory = partition_log.directory
    manager.delete_log("gone", 0)
    assert manager.get_log("gone", 0) is None and not directory.exists()
    fresh = manager.create_log("gone", 0)
    assert fresh.log_end_offset == 0


def test_second_manager_on_same_directory_is_refused(manager_factory, tmp_path):
    manager_factory()
    from copyless.broker.storage import LogManager

    with pytest.raises(StorageError):
        LogManager(tmp_path / "data").startup()


def test_group_commit_covers_many_waiters_with_few_fdatasyncs(manager_factory, small_config):
    partition_log = manager_factory(small_config).create_log("t", 0)
    append_values(partition_log, 1)
    assert partition_log.flush().result(timeout=30) == 1
    flushes_before = partition_log.stats["flushes"]
    futures = []
    # Hold the log's I/O lock: the flush thread's first round waits here while 100 producers append and
    # wait (as acks=all producers in sync mode would); one or two fdatasync rounds must then release them all.
    with partition_log.log_segments.io_lock:
        for result in append_values(partition_log, 100):
            futures.append((result.last_offset + 1, partition_log.wait_flushed(result.last_offset + 1)))
        assert not any(future.done() for _, future in futures)
    for target, future in futures:
        assert future.result(timeout=30) >= target
    assert partition_log.flushed_offset == 101
    assert partition_log.stats["flushes"] - flushes_before <= 3


def test_flush_ms_policy_from_housekeeping(manager_factory):
    config = LogConfig(segment_bytes=64 << 10, segment_index_bytes=4096, flush_ms=0, retention_ms=None)
    manager = manager_factory(config)
    partition_log = manager.create_log("t", 0)
    append_values(partition_log, 10)
    assert manager.maybe_flush() == 1
    manager.wait_for_background()
    deadline_future = partition_log.wait_flushed(10)  # resolves once the policy's flush has run
    assert deadline_future.result(timeout=30) == 10


def test_appends_never_straddle_segments_and_big_appends_split(manager_factory):
    config = LogConfig(segment_bytes=8 << 10, segment_index_bytes=1024, retention_ms=None)
    partition_log = manager_factory(config).create_log("t", 0)
    # One append holding ~20 KiB of batches: more than two whole segments.
    records = b"".join(build_batch([bytes([i]) * 900], [i]) for i in range(22))
    result = append_blocking(partition_log, records)
    assert (result.base_offset, result.last_offset) == (0, 21)
    assert len(partition_log.segments) >= 3
    for segment in partition_log.segments:
        assert segment.size_bytes <= 8 << 10
    seen = []
    for header in partition_log.batch_headers(0):
        seen.append(header.base_offset)
    assert seen == list(range(22))
    with pytest.raises(ValueError):
        append_blocking(partition_log, build_batch([b"x" * (9 << 10)], [0]))  # a batch larger than a segment


def abandoned_log(manager_factory, config):
    """A real log of 200 records over several segments, dropped as a kill -9 leaves it: (bases, directory)."""
    manager = manager_factory(config)
    partition_log = manager.create_log("t", 0)
    append_values(partition_log, 200, size=400)
    bases = partition_log.segment_base_offsets()
    directory = partition_log.directory
    manager.abandon()
    return bases, directory


def test_prepared_segment_holding_batches_is_adopted_after_a_crash(manager_factory, small_config):
    # The state a kill leaves when a roll's renames (done on the io thread) never ran: the active segment's
    # batches sit in prepared-N.log. Built here from a real log by undoing the renames.
    bases, directory = abandoned_log(manager_factory, small_config)
    last_base = bases[-1]
    for suffix in (".log", ".index", ".timeindex"):
        os.rename(directory / f"{last_base:020d}{suffix}", directory / f"prepared-9{suffix}")
    (directory / "prepared-10.log").write_bytes(bytes(4096))  # an unused spare: removed
    manager = manager_factory(small_config)
    partition_log = manager.get_log("t", 0)
    assert partition_log.segment_base_offsets()[-1] == last_base
    assert partition_log.log_end_offset == 200
    assert not [name for name in os.listdir(directory) if name.startswith("prepared")]
    with partition_log.read(199, 1 << 20).slice as region:
        assert records_of(region.read_bytes())[-1].offset == 199


def test_two_rolls_whose_renames_never_ran_are_both_adopted(manager_factory, small_config):
    # The io thread renames in roll order, so a kill may leave the last two segments unnamed. Their names
    # sort "prepared-10" before "prepared-9": the newer file is looked at first and must not make the
    # older one look out of order.
    bases, directory = abandoned_log(manager_factory, small_config)
    for base, name in ((bases[-2], "prepared-9"), (bases[-1], "prepared-10")):
        for suffix in (".log", ".index", ".timeindex"):
            os.rename(directory / f"{base:020d}{suffix}", directory / f"{name}{suffix}")
    partition_log = manager_factory(small_config).get_log("t", 0)
    assert partition_log.segment_base_offsets() == bases
    assert partition_log.log_end_offset == 200


def test_a_prepared_file_whose_first_batch_precedes_the_named_segments_is_removed(manager_factory, small_config):
    # A kill between a rolled segment's first copy and its header rewrites could leave a whole batch that
    # still carries the client's base offset 0. With segment 0 gone (retention), adopting it as segment 0
    # would cut every later segment as not following on from it.
    bases, directory = abandoned_log(manager_factory, small_config)
    for suffix in (".log", ".index", ".timeindex"):
        (directory / f"{0:020d}{suffix}").unlink()
    stale = build_batch([b"not rewritten"], [5_000])
    validate_batch(stale)  # a whole, valid batch: only its base offset gives it away
    (directory / "prepared-11.log").write_bytes(stale + bytes(4096))
    partition_log = manager_factory(small_config).get_log("t", 0)
    assert partition_log.segment_base_offsets() == bases[1:]
    assert (partition_log.log_start_offset, partition_log.log_end_offset) == (bases[1], 200)
    assert not [name for name in os.listdir(directory) if name.startswith("prepared")]


def test_recovery_rescans_only_from_the_recovery_point(manager_factory, small_config):
    manager = manager_factory(small_config)
    partition_log = manager.create_log("t", 0)
    append_values(partition_log, 400, size=1000)
    assert partition_log.flush().result(timeout=30) == 400
    manager.wait_for_background()  # rolled segments sealed: the recovery point is the log end
    manager.checkpoint_recovery_points()
    segments = len(partition_log.segments)
    append_values(partition_log, 5, size=1000)
    manager.abandon()
    manager = manager_factory(small_config)
    stats = manager.startup_stats
    assert not stats["clean"] and segments > 3
    assert stats["segments_recovered"] <= 2, stats  # the segment holding the recovery point (and a new one)
    assert manager.get_log("t", 0).log_end_offset == 405


def test_corruption_in_a_middle_segment_cuts_the_log_there(manager_factory, small_config):
    manager = manager_factory(small_config)
    partition_log = manager.create_log("t", 0)
    append_values(partition_log, 400, size=1000)
    manager.wait_for_background()
    bases = partition_log.segment_base_offsets()
    assert len(bases) > 4
    victim = partition_log.segments[2]
    path = victim.log_path
    manager.abandon()
    # No checkpoint: recovery rescans every segment from offset 0.
    (path.parent.parent / "recovery-point-offset-checkpoint").unlink(missing_ok=True)
    with open(path, "r+b") as handle:  # flip a byte inside the third batch of segment 2: its CRC fails
        data = handle.read()
        position = 0
        for _ in range(2):
            position += read_header(data, position).size
        handle.seek(position + 70)
        handle.write(bytes([data[position + 70] ^ 0xFF]))
    manager = manager_factory(small_config)
    partition_log = manager.get_log("t", 0)
    assert partition_log.log_end_offset == bases[2] + 2
    assert partition_log.segment_base_offsets() == bases[:3]
    assert manager.startup_stats["segments_removed"] == len(bases) - 3
    with partition_log.read(bases[2] + 1, 1 << 20).slice as region:
        assert records_of(region.read_bytes())[-1].offset == bases[2] + 1


def scan_cost(function):
    """(preads, bytes) that header scans made while ``function`` ran, and its result."""
    before = dict(scan_module.SCAN_STATS)
    result = function()
    after = scan_module.SCAN_STATS
    return after["preads"] - before["preads"], after["bytes"] - before["bytes"], result


def test_header_scans_read_small_windows_and_only_headers_of_big_batches(manager_factory):
    config = LogConfig(segment_bytes=8 << 20, segment_index_bytes=64 << 10, index_interval_bytes=4096,
                       retention_ms=None)
    big = manager_factory(config).create_log("big", 0)
    for number in range(40):
        append_blocking(big, build_batch([bytes([number]) * 100_000], [number]))
    # A whole-segment scan of 100 KB batches reads one first window, then just each 61-byte header.
    preads, copied, headers = scan_cost(lambda: list(big.batch_headers(0)))
    assert [h.base_offset for h in headers] == list(range(40))
    assert copied <= scan_module.SCAN_FIRST_WINDOW_BYTES + 61 * 40, copied


def test_header_scans_of_small_batches_fit_one_window_per_fetch(manager_factory):
    config = LogConfig(segment_bytes=8 << 20, segment_index_bytes=64 << 10, index_interval_bytes=4096,
                       retention_ms=None)
    partition_log = manager_factory(config).create_log("small", 0)
    append_values(partition_log, 2_000, size=60)  # ~130-byte batches, ~260 KiB
    # A fetch: index floor, then a scan of at most ~4 KiB: one pread of the 8 KiB first window.
    for offset in (0, 1, 555, 1_234, 1_999):
        preads, copied, result = scan_cost(partial(partition_log.read, offset, 1 << 20))
        with result.slice as region:
            assert records_of(region.read_bytes())[0].offset == offset
        assert preads == 1 and copied <= scan_module.SCAN_FIRST_WINDOW_BYTES, (offset, preads, copied)
    # A long scan grows its window (8, 16, 32, then 64 KiB): ~260 KiB in 6 preads, not 33 of 8 KiB.
    preads, copied, headers = scan_cost(lambda: list(partition_log.batch_headers(0)))
    assert [h.base_offset for h in headers] == list(range(2_000))
    assert preads <= 7, preads


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.sampled_from([10, 3_000, 9_000, 70_000]), min_size=1, max_size=30),
       start_at=st.integers(min_value=0, max_value=29))
def test_header_scan_finds_every_batch_whatever_the_mix_of_sizes(tmp_path, sizes, start_at):
    """Windows that grow, header-only reads after big batches, and batches straddling windows: the scan
    must yield exactly the batches a full parse of the bytes finds, from any batch start."""
    data = b"".join(build_batch([bytes(size)], [number]) for number, size in enumerate(sizes))
    positions = [position for position, _ in iter_batches(data)]
    start = positions[min(start_at, len(positions) - 1)]
    path = tmp_path / f"scan-{len(data)}-{start}.log"
    path.write_bytes(data + bytes(5_000))  # a zero tail, as in an active segment
    fd = os.open(path, os.O_RDONLY)
    try:
        found = [position for position, _ in scan_module.scan_headers(fd, start, len(data) + 5_000)]
    finally:
        os.close(fd)
        path.unlink()
    assert found == [position for position in positions if position >= start]


def test_stepped_allocation_keeps_writes_inside_the_allocated_prefix(manager_factory, caplog):
    """The active segment has its full logical size (one map) but blocks only for a prefix that grows in
    steps; an append past the prefix waits for the next step (counted), and a crash leaves a sparse tail that
    recovery treats like the zero tail of a preallocated file."""
    step = 16 << 10
    config = LogConfig(segment_bytes=8 << 20, segment_index_bytes=64 << 10, retention_ms=None,
                       preallocate_first_bytes=step, preallocate_ahead_bytes=64 << 10)
    manager = manager_factory(config)
    partition_log = manager.create_log("sparse", 0)
    active = partition_log.segments[-1]
    stat = os.fstat(active.fd)
    assert active.allocated_bytes == step < active.capacity_bytes == stat.st_size == 8 << 20
    assert stat.st_blocks * 512 <= step + (64 << 10), "the whole segment was allocated up front"
    # One batch bigger than the prefix: allocated synchronously before the copy.
    big = build_batch([b"B" * (4 * step)], [1])
    assert append_blocking(partition_log, big).base_offset == 0
    assert partition_log.stats["extensions_waited"] == 1
    assert active.written_position <= active.allocated_bytes
    for number in range(1, 60):
        append_blocking(partition_log, build_batch([bytes([number]) * 3000], [number]))
        assert active.written_position <= active.allocated_bytes
    assert partition_log.wait_warm(30)
    assert os.fstat(active.fd).st_blocks * 512 >= active.written_position
    assert os.fstat(active.fd).st_size == 8 << 20
    manager.abandon()  # the file keeps its logical size with a sparse (never written) tail
    with caplog.at_level(logging.INFO, logger="copyless.storage"):
        manager = manager_factory(config)
    partition_log = manager.get_log("sparse", 0)
    assert partition_log.log_end_offset == 60 and manager.startup_stats["bytes_discarded"] > 0
    # Said in words a user reads correctly: the tail was unused preallocated space, not lost data.
    messages = [record.getMessage() for record in caplog.records]
    trimmed = [message for message in messages if "of preallocated space past the last batch" in message]
    assert len(trimmed) == 1 and f"trimmed {manager.startup_stats['bytes_discarded']} bytes" in trimmed[0], trimmed
    assert not any("discarded" in message for message in messages)
    with partition_log.read(59, 1 << 20).slice as region:
        assert records_of(region.read_bytes())[-1].value == bytes([59]) * 3000
    assert append_blocking(partition_log, build_batch([b"after"], [2])).base_offset == 60


def test_a_slices_upper_bound_offset_lies_past_its_records_and_within_an_index_interval_of_them(manager_factory):
    """``FileSlice.upper_bound_offset`` (Kafka's ``fetchUpperBoundOffset``, what bounds a read_committed
    fetch's aborted-transaction list): above every record the slice holds, and the batches between the
    slice's end and it span at most an index interval plus one batch (or run to the segment's end)."""
    import random

    rng = random.Random(7)
    partition_log = manager_factory().create_log("t", 0)
    for number in range(400):
        per_batch = rng.choice([1, 1, 2, 5])
        size = rng.choice([20, 150, 700, 1500])
        append_blocking(partition_log, build_batch([f"{number}-{i}".encode().ljust(size, b".")
                                                    for i in range(per_batch)], [1_000 + number] * per_batch))
    partition_log.set_high_watermark(partition_log.log_end_offset)
    assert len(partition_log.segment_base_offsets()) >= 3
    interval = partition_log.config.index_interval_bytes
    # Every batch: (base offset, last offset, size), by segment.
    whole = b""
    for base in partition_log.segment_base_offsets():
        with partition_log.read(base, 1 << 30).slice as region:
            whole += region.read_bytes()
    batches = [(header.base_offset, header.last_offset, header.size)
               for header in (read_header(whole, position) for position, _ in iter_batches(whole))]
    bases = partition_log.segment_base_offsets() + [partition_log.log_end_offset]
    checked = 0
    for fetch_offset in range(0, partition_log.log_end_offset, 3):
        for max_bytes in (1, 900, 4000, 20_000):
            result = partition_log.read(fetch_offset, max_bytes, min_one_message=True)
            with result.slice as region:
                data = region.read_bytes()
                upper = region.upper_bound_offset()
            sent = [read_header(data, position) for position, _ in iter_batches(data)]
            assert upper is not None and upper > sent[-1].last_offset
            segment_end = min(base for base in bases if base > sent[-1].last_offset)
            assert upper <= segment_end
            after = [size for base, _last, size in batches if sent[-1].last_offset < base < upper]
            assert upper == segment_end or sum(after) <= interval + max(size for *_, size in batches), \
                (fetch_offset, max_bytes, upper)
            checked += 1
    assert checked > 400
