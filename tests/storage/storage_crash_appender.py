"""Append forever (or until a failpoint SIGKILLs us) to one log, with rolls, retention, flushes and
checkpoints; report every acknowledged offset on stdout. Used by test_storage_crash.py.

Usage: python storage_crash_appender.py DATA_DIR SEED MAX_APPENDS [zeros-racing]
``zeros-racing``: the pre-fault chases write zeros from the first page past the appends (margin 0, page-sized
chunks), so a kill lands while zeros and appends interleave.
Each record's value is a pure function of its offset (expected_value), so a reader can check any record.
"""

from __future__ import annotations

import dataclasses
import os
import random
import sys

from copyless.broker.storage import LogConfig, LogManager, _failpoints
from copyless.broker.storage import prefault as prefault_module
from tests.support.batches import build_batch
from tests.support.blocking_appends import append_blocking

CONFIG = LogConfig(segment_bytes=24 << 10, segment_index_bytes=1024, index_interval_bytes=1024, retention_ms=None,
                   retention_bytes=96 << 10, file_delete_delay_ms=0)


def expected_value(offset: int) -> bytes:
    length = (offset * 7919) % 900
    return (f"<{offset}>".encode() * (length // 4 + 1))[:length]


def main() -> None:
    data_dir, seed, max_appends = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    # The parent names the step to crash at (and how many hits to let pass) in the environment, and whether
    # appends past the pre-faulted pages write with pwrite.
    _failpoints.arm(os.environ.get("COPYLESS_FAILPOINT") or None, int(os.environ.get("COPYLESS_FAILPOINT_SKIP", "0")))
    config = dataclasses.replace(CONFIG, outrun_pwrite=os.environ.get("COPYLESS_OUTRUN_PWRITE", "1") != "0")
    if sys.argv[4:] == ["zeros-racing"]:
        prefault_module.ZERO_MARGIN_BYTES = 0
        prefault_module.ZERO_MARGIN_APPENDS = 0
        prefault_module.ZERO_MARGIN_MS = 0
        prefault_module.ZERO_CHUNK_BYTES = os.sysconf("SC_PAGE_SIZE")
    rng = random.Random(seed)
    manager = LogManager(data_dir, default_config=config, background_interval_ms=None)
    manager.startup()
    partition_log = manager.create_log("crash", 0, config)
    print(f"START {partition_log.log_start_offset} {partition_log.log_end_offset}", flush=True)
    for number in range(max_appends):
        batches = b""
        offset = partition_log.log_end_offset
        for _ in range(rng.randint(1, 3)):
            count = rng.randint(1, 4)
            batches += build_batch([expected_value(offset + i) for i in range(count)],
                                   [1_000 + offset + i for i in range(count)], codec=rng.choice((0, 0, 1)))
            offset += count
        result = append_blocking(partition_log, batches)
        assert result.last_offset == offset - 1
        print(f"ACK {result.last_offset}", flush=True)
        # As a single node's partition layer does: the high watermark follows the log end (retention deletes
        # only below it).
        partition_log.set_high_watermark(partition_log.log_end_offset)
        if number % 7 == 3:
            manager.run_retention()
        if number % 11 == 5:
            flushed = partition_log.flush().result(timeout=60)
            print(f"FLUSHED {flushed}", flush=True)
        if number % 13 == 8:
            manager.checkpoint_recovery_points()
    manager.shutdown()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
