"""Disk follows the data: a partition's files own at most its data plus preallocate_ahead_bytes (64 MiB) of
blocks, read from ``st_blocks``, through a burst (steps sized by the rate), rolls (a next segment prepared
with its own first step) and a pause, also with the allocate thread running every step late; and an idle partition owns
only its first steps (4 MiB of log, a few KiB of index), not a whole segment."""

from __future__ import annotations

import os
import random
import time

import pytest

from copyless.broker.storage import LogConfig
from tests.support.batches import build_batch
from tests.support.blocking_appends import append_blocking

MIB = 1 << 20
AHEAD = 64 * MIB


BLOCK = 4096


def _blocks(size: int) -> int:
    return size + (-size % BLOCK)


def usage(partition_log) -> tuple[int, int]:
    """(bytes of blocks the partition's files own, bytes of blocks their data needs). The data of each file
    is counted in whole 4 KiB blocks, plus one block per file for ext4's extent tree (an inode holds four
    extents; a file allocated in steps and converted from unwritten extents as it is written can need more),
    since no allocator can put a file's bytes in less than that."""
    while True:  # the io thread renames a rolled-to segment's files meanwhile: scan again
        try:
            entries = list(os.scandir(partition_log.directory))
            blocks = sum(entry.stat().st_blocks * 512 for entry in entries)
            break
        except FileNotFoundError:
            continue
    data = len(entries) * BLOCK  # the extent trees, and the small files (leader-epoch-checkpoint)
    for segment in partition_log.segments:
        data += _blocks(segment.committed_position)
        for index in (segment.offset_index, segment.time_index):
            data += _blocks(index.entries * index.entry.size)
    return blocks, data


@pytest.mark.parametrize("late_steps", [False, True], ids=["steps-on-time", "steps-late"])
def test_blocks_stay_within_data_plus_64_mib(manager_factory, monkeypatch, late_steps):
    """``steps-late`` runs every step of blocks 0-20 ms after it is queued, as a loaded machine does: the
    appends and the roll's preparation then decide while steps are still queued (CI once saw 74.6 MiB past
    the data that way, before block_budget charged a step from when it is queued)."""
    config = LogConfig(segment_bytes=96 * MIB, retention_ms=None, segment_ms=None)
    assert config.preallocate_ahead_bytes == AHEAD and not config.preallocate
    partition_log = manager_factory(config).create_log("usage", 0)
    if late_steps:
        background, rng = partition_log.background, random.Random(37)
        submit = background.submit_allocate

        def submit_late(done, function, *args):
            delay = rng.uniform(0, 0.02)

            def late(*call_args):
                time.sleep(delay)
                function(*call_args)
            return submit(done, late, *args)
        monkeypatch.setattr(background, "submit_allocate", submit_late)
    assert partition_log.wait_warm(60)
    blocks, data = usage(partition_log)
    assert partition_log.log_end_offset == 0 and blocks - data <= 5 * MIB, f"a new partition owns {blocks} bytes"
    worst = 0
    batch = build_batch([os.urandom(MIB - 200)], [1])
    for number in range(300):  # ~300 MiB in 1 MiB batches: three rolls, each with a prepared next segment
        append_blocking(partition_log, batch)
        if number % 8 == 0:
            assert partition_log.wait_warm(60)
        blocks, data = usage(partition_log)
        worst = max(worst, blocks - data)
        assert blocks <= data + AHEAD, f"after {number + 1} MiB: {blocks} bytes of blocks for {data} of data"
    assert partition_log.stats["rolls"] >= 3
    assert worst > 16 * MIB, f"the steps never ran ahead of the writer ({worst} bytes)"
    # A pause: nothing more is reserved while idle.
    assert partition_log.wait_warm(60)
    time.sleep(0.3)
    blocks, data = usage(partition_log)
    assert blocks <= data + AHEAD
    assert partition_log.log_end_offset == 300


def test_idle_partitions_own_their_first_steps_only(manager_factory):
    config = LogConfig(retention_ms=None)  # 1 GiB segments, Kafka's default
    manager = manager_factory(config)
    logs = [manager.create_log("idle", partition) for partition in range(20)]
    for partition_log in logs:
        assert partition_log.wait_warm(60)
        blocks, _data = usage(partition_log)
        active = partition_log.segments[-1]
        assert os.fstat(active.fd).st_size == 1 << 30, "the segment keeps its logical size (one map)"
        assert blocks <= config.preallocate_first_bytes + MIB, f"an idle partition owns {blocks} bytes"
