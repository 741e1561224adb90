"""Disk follows the data: a partition's files own at most its data plus preallocate_ahead_bytes (64 MiB) of
blocks, read from ``st_blocks``, through a burst (steps sized by the rate), rolls (a next segment prepared
with its own first step) and a pause; and an idle partition owns only its first steps (4 MiB of log, a few
KiB of index), not a whole segment."""

from __future__ import annotations

import os
import time

from copyless.broker.storage import LogConfig
from tests.support.batches import build_batch

MIB = 1 << 20
AHEAD = 64 * MIB


def usage(partition_log) -> tuple[int, int]:
    """(bytes of blocks the partition's files own, bytes of data: batches and index entries)."""
    while True:  # the io thread renames a rolled-to segment's files meanwhile: scan again
        try:
            blocks = sum(entry.stat().st_blocks * 512 for entry in os.scandir(partition_log.directory))
            break
        except FileNotFoundError:
            continue
    data = 0
    for segment in partition_log.segments:
        data += segment.committed_position
        data += segment.offset_index.entries * segment.offset_index.entry.size
        data += segment.time_index.entries * segment.time_index.entry.size
    return blocks, data


def test_blocks_stay_within_data_plus_64_mib(manager_factory):
    config = LogConfig(segment_bytes=96 * MIB, retention_ms=None, segment_ms=None)
    assert config.preallocate_ahead_bytes == AHEAD and not config.preallocate
    partition_log = manager_factory(config).create_log("usage", 0)
    assert partition_log.wait_warm(60)
    blocks, data = usage(partition_log)
    assert data == 0 and blocks <= 5 * MIB, f"a new partition owns {blocks} bytes of blocks"
    worst = 0
    batch = build_batch([os.urandom(MIB - 200)], [1])
    for number in range(300):  # ~300 MiB in 1 MiB batches: three rolls, each with a prepared next segment
        partition_log.append_blocking(batch)
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
