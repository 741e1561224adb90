"""Real threads: appends and reads on one thread (the event loop's role) while the housekeeping thread applies
flush.ms and retention and the reaper deletes segments. Reads must return correct records or
OffsetOutOfRangeError for offsets retention removed, never a closed fd, a wrong byte or a crash."""

from __future__ import annotations

import os
import random
import time

from copyless.broker.storage import LogConfig, LogManager, OffsetOutOfRangeError
from tests.support.batches import build_batch, records_of
from tests.support.blocking_appends import append_blocking


def test_reads_race_retention_and_housekeeping(tmp_path):
    config = LogConfig(segment_bytes=8 << 10, segment_index_bytes=512, index_interval_bytes=1024, flush_ms=0,
                       retention_ms=None, retention_bytes=32 << 10, file_delete_delay_ms=0)
    manager = LogManager(tmp_path / "data", default_config=config, background_interval_ms=2,
                         retention_check_interval_ms=0, checkpoint_interval_ms=20)
    manager.startup()
    rng = random.Random(7)
    partition_log = manager.create_log("race", 0)
    held = []
    out_of_range = served = 0
    try:
        for number in range(3000):
            append_blocking(partition_log, build_batch([f"{number}".encode() * 40], [number]))
            # As a single node's partition layer does after each append (retention stays below it).
            partition_log.set_high_watermark(partition_log.log_end_offset)
            start, end = partition_log.log_start_offset, partition_log.log_end_offset
            offset = rng.randint(max(0, start - 5), end - 1)
            try:
                result = partition_log.read(offset, rng.choice((100, 2000, 1 << 20)))
            except OffsetOutOfRangeError:
                assert offset < partition_log.log_start_offset
                out_of_range += 1
                continue
            region = result.slice
            records = records_of(region.read_bytes())
            assert records and all(r.value == f"{r.offset}".encode() * 40 for r in records)
            served += 1
            held.append((region, region.read_bytes()))
            if len(held) > 20 or rng.random() < 0.3:  # slices released out of order, some held a while
                region, expected = held.pop(rng.randrange(len(held)))
                assert region.read_bytes() == expected
                region.release()
            if number % 500 == 0:
                time.sleep(0.01)  # let housekeeping run a few rounds
        for region, expected in held:
            assert region.read_bytes() == expected
            region.release()
        assert partition_log.stats["segments_deleted"] > 10
        assert served > 1000 and partition_log.log_start_offset > 0
        assert partition_log.flushed_offset > 0
    finally:
        manager.shutdown()
    # Every slice was released: shutdown (after stopping housekeeping) deletes every retired segment.
    leftovers = [n for n in os.listdir(partition_log.directory) if n.endswith(".deleted")]
    assert not leftovers, leftovers
    assert (tmp_path / "data" / ".copyless_cleanshutdown").exists()
