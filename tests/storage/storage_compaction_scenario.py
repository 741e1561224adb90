"""Build a compacted log of many segments, then clean it once (until a failpoint SIGKILLs us). Used by
test_compaction_crash.py.

Usage: python storage_compaction_scenario.py DATA_DIR
Prints ``PLAN <log end>`` before the cleaning and ``DONE <segments>`` after. The records are a pure function
of the batch number (``batch_for``) and the cleaning's clock is fixed, so two runs clean the same way.
"""

from __future__ import annotations

import os
import sys

from copyless.broker.storage import LogConfig, LogManager, _failpoints
from copyless.broker.storage.cleaner import clean_log
from tests.support.batches import build_batch
from tests.support.blocking_appends import append_blocking

CONFIG = LogConfig(segment_bytes=8 << 10, segment_index_bytes=1024, index_interval_bytes=256, retention_ms=None,
                   file_delete_delay_ms=0, cleanup_policy=("compact",), min_cleanable_dirty_ratio=0.0,
                   delete_retention_ms=1000)
BATCHES = 300
KEYS = 150
NOW_MS = 1_800_000_000_000


def batch_for(number: int) -> bytes:
    """Batch ``number``: three records of keys (3n, 3n+1, 3n+2) mod KEYS; every 7th key of batch 100-140 a
    tombstone."""
    keys = [b"key-%03d" % ((3 * number + i) % KEYS) for i in range(3)]
    values = [None if 100 <= number < 140 and (3 * number + i) % 7 == 0 else b"%d:%d:" % (number, i) + b"v" * 60
              for i in range(3)]
    return build_batch(values, [1_700_000_000_000 + number] * len(values), keys=keys, codec=number % 2)


def main() -> None:
    data_dir = sys.argv[1]
    _failpoints.arm(os.environ.get("COPYLESS_FAILPOINT") or None, int(os.environ.get("COPYLESS_FAILPOINT_SKIP", "0")))
    manager = LogManager(data_dir, default_config=CONFIG, background_interval_ms=None)
    manager.startup()
    partition_log = manager.create_log("table", 0)
    for number in range(BATCHES):
        append_blocking(partition_log, batch_for(number))
    partition_log.set_high_watermark(partition_log.log_end_offset)
    partition_log.flush().result(timeout=60)
    manager.wait_for_background()
    manager.checkpoint_offsets()
    print(f"PLAN {partition_log.log_end_offset}", flush=True)
    result = clean_log(partition_log, force=True, now=NOW_MS)
    assert result is not None and result.aborted is None, result
    print(f"DONE {result.segments_before} {result.segments_after}", flush=True)
    manager.shutdown()


if __name__ == "__main__":
    main()
