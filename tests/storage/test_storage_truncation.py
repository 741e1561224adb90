"""Truncation (a follower cutting back to where it agrees with its leader) and DeleteRecords' log start.

Invariant: after ``truncate_to(offset)`` the log is the prefix of what it was that ends at the start of the
batch holding ``offset``, in memory, after a clean restart and after a kill (``abandon``); appends continue
from there, as leader or follower; the epoch cache and the high watermark follow the cut.
"""

from __future__ import annotations

import os

import pytest

from copyless.broker.storage import LogConfig, OffsetOutOfRangeError
from copyless.broker.storage.checkpoint import read_checkpoint
from copyless.protocol.records import iter_batches, set_base_offset, set_leader_epoch
from tests.support.batches import build_batch, records_of
from tests.support.blocking_appends import append_as_follower_blocking, append_blocking

CONFIG = LogConfig(segment_bytes=8 << 10, segment_index_bytes=1024, index_interval_bytes=256, retention_ms=None,
                   file_delete_delay_ms=0)


def batch(number: int, records: int = 2, size: int = 60) -> bytes:
    return build_batch([f"{number}:{i}:".encode().ljust(size, b".") for i in range(records)],
                       [1_000 + number] * records)


def contents(partition_log) -> list[tuple[int, bytes, int]]:
    out = []
    offset = partition_log.log_start_offset
    while offset < partition_log.log_end_offset:
        with partition_log.read(offset, 1 << 20).slice as region:
            data = region.read_bytes()
        records = records_of(data)
        out.extend((r.offset, r.value, [h for _, h in iter_batches(data) if h.base_offset <= r.offset
                                        <= h.last_offset][0].partition_leader_epoch) for r in records)
        offset = records[-1].offset + 1
    return out


def fill(partition_log, batches: int, *, epoch_every: int = 10, first: int = 0) -> None:
    for number in range(first, first + batches):
        append_blocking(partition_log, batch(number), leader_epoch=number // epoch_every)


def reopen(manager_factory, manager, *, crash: bool):
    manager.wait_for_background()
    (manager.abandon if crash else manager.shutdown)()
    return manager_factory(CONFIG)


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "kill"])
def test_truncate_within_the_active_segment_leaves_no_old_batch_to_resurrect(manager_factory, crash):
    manager = manager_factory(CONFIG)
    partition_log = manager.create_log("t", 0)
    fill(partition_log, 10, epoch_every=4)  # 20 records in one segment, epochs 0, 1, 2
    assert len(partition_log.segments) == 1
    before = contents(partition_log)
    partition_log.set_high_watermark(16)
    partition_log.truncate_to(11)  # inside the batch 10-11: the whole batch goes
    assert partition_log.log_end_offset == 10 and contents(partition_log) == before[:10]
    assert partition_log.high_watermark == 10
    assert partition_log.leader_epochs.entries() == [(0, 0), (1, 8)]
    # New batches of exactly the old sizes land where the old ones were; the old batch 14-15 would follow
    # on from them by offset and pass its CRC if the cut had left it there.
    for number in (50, 51):
        append_blocking(partition_log, batch(number), leader_epoch=5)
    expected = contents(partition_log)
    assert partition_log.log_end_offset == 14 and expected[:10] == before[:10]
    manager = reopen(manager_factory, manager, crash=crash)
    partition_log = manager.get_log("t", 0)
    assert partition_log.log_end_offset == 14 and contents(partition_log) == expected
    assert partition_log.leader_epochs.entries() == [(0, 0), (1, 8), (5, 10)]


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "kill"])
def test_truncate_into_an_older_segment_removes_the_later_ones_and_appends_resume(manager_factory, crash):
    manager = manager_factory(CONFIG)
    partition_log = manager.create_log("t", 0)
    fill(partition_log, 200)
    manager.wait_for_background()
    bases = partition_log.segment_base_offsets()
    assert len(bases) >= 4
    before = contents(partition_log)
    target = bases[1] + 6  # inside the second segment, a sealed one
    partition_log.truncate_to(target)
    assert partition_log.segment_base_offsets() == bases[:2]
    assert partition_log.log_end_offset == target and contents(partition_log) == before[:target]
    manager.wait_for_background()
    names = os.listdir(partition_log.directory)
    assert not [name for name in names if name.endswith(".deleted")]
    named = sorted(name for name in names if name.endswith(".log") and not name.startswith("prepared"))
    assert named == [f"{base:020d}.log" for base in bases[:2]]  # (a prepared spare may wait for the next roll)
    # As a follower: the new leader's batches at the new end, with their own epoch.
    follower_batches = b""
    offset = target
    for number in range(300, 360):
        data = bytearray(batch(number))
        set_base_offset(data, 0, offset)
        set_leader_epoch(data, 0, 40)
        follower_batches += data
        offset += 2
    append_as_follower_blocking(partition_log, follower_batches)
    assert len(partition_log.segments) > 2
    expected = contents(partition_log)
    manager = reopen(manager_factory, manager, crash=crash)
    partition_log = manager.get_log("t", 0)
    assert contents(partition_log) == expected and partition_log.log_end_offset == target + 120
    epochs = partition_log.leader_epochs.entries()
    assert epochs[-1] == (40, target) and all(start < target for _, start in epochs[:-1])


def test_truncate_at_a_segment_base_keeps_that_segment_empty(manager_factory):
    manager = manager_factory(CONFIG)
    partition_log = manager.create_log("t", 0)
    fill(partition_log, 150)
    manager.wait_for_background()
    bases = partition_log.segment_base_offsets()
    partition_log.truncate_to(bases[2])
    assert partition_log.segment_base_offsets() == bases[:3]
    assert partition_log.segments[-1].size_bytes == 0 and partition_log.log_end_offset == bases[2]
    fill(partition_log, 5, first=900)
    assert [offset for offset, _, _ in contents(partition_log)][-1] == bases[2] + 9


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "kill"])
def test_truncate_fully_restarts_the_log_empty_at_the_offset(manager_factory, crash):
    manager = manager_factory(CONFIG)
    partition_log = manager.create_log("t", 0)
    fill(partition_log, 120)
    partition_log.set_high_watermark(100)
    partition_log.truncate_fully_and_start_at(5_000)  # the leader's log start, past this follower's end
    assert (partition_log.log_start_offset, partition_log.log_end_offset, partition_log.high_watermark) == (
        5_000, 5_000, 5_000)
    assert partition_log.leader_epochs.entries() == [] and partition_log.segment_base_offsets() == [5_000]
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.read(10, 1 << 20)
    data = bytearray(batch(7))
    set_base_offset(data, 0, 5_000)
    set_leader_epoch(data, 0, 9)
    append_as_follower_blocking(partition_log, data)
    manager = reopen(manager_factory, manager, crash=crash)
    partition_log = manager.get_log("t", 0)
    assert (partition_log.log_start_offset, partition_log.log_end_offset) == (5_000, 5_002)
    assert partition_log.leader_epochs.entries() == [(9, 5_000)]
    # Below the log start: truncate_to restarts it there.
    partition_log.truncate_to(4_000)
    assert (partition_log.log_start_offset, partition_log.log_end_offset) == (4_000, 4_000)
    assert read_checkpoint(manager.data_dir / "log-start-offset-checkpoint")[("t", 0)] == 4_000


def test_delete_records_raises_the_log_start_below_the_high_watermark_only(manager_factory):
    manager = manager_factory(CONFIG)
    partition_log = manager.create_log("t", 0)
    fill(partition_log, 150)
    manager.wait_for_background()
    bases = partition_log.segment_base_offsets()
    before = contents(partition_log)
    partition_log.set_high_watermark(250)
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.delete_records_before(251)
    target = bases[2] + 3
    assert partition_log.delete_records_before(target) == target
    assert partition_log.log_start_offset == target
    assert partition_log.segment_base_offsets() == bases[2:]  # whole segments below it are gone
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.read(target - 1, 1 << 20)
    assert contents(partition_log) == [entry for entry in before if entry[0] >= target - 1]  # its batch straddles
    assert partition_log.leader_epochs.entries()[0][1] == target
    assert partition_log.delete_records_before(10) == target  # below the start: nothing to do
    manager.wait_for_background()
    manager.shutdown()
    assert read_checkpoint(manager.data_dir / "log-start-offset-checkpoint")[("t", 0)] == target
    partition_log = manager_factory(CONFIG).get_log("t", 0)
    assert partition_log.log_start_offset == target and partition_log.segment_base_offsets() == bases[2:]
    assert partition_log.high_watermark == 250
    assert partition_log.delete_records_before(-1) == 250  # -1: up to the high watermark
