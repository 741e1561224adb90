"""Build a log of several segments and leader epochs, then truncate it (until a failpoint SIGKILLs us).
Used by test_storage_truncation_crash.py.

Usage: python storage_truncation_scenario.py DATA_DIR MODE
MODE: ``to-active`` (cut inside the active segment), ``to-older`` (cut inside the first, sealed segment) or
``fully`` (empty the log and restart it past its end, as a follower below its leader's log start).
Prints ``PLAN <old end> <target>`` before truncating and ``DONE <log end>`` after. The records are a pure
function of the batch number (``batch_for``), so the parent can rebuild the original log.
"""

from __future__ import annotations

import os
import sys

from copyless.broker.storage import LogConfig, LogManager, _failpoints
from tests.support.batches import build_batch
from tests.support.blocking_appends import append_blocking

CONFIG = LogConfig(segment_bytes=8 << 10, segment_index_bytes=1024, index_interval_bytes=256, retention_ms=None,
                   file_delete_delay_ms=0)
BATCHES = 150
FULL_TARGET = 10_000


def batch_for(number: int) -> tuple[bytes, int]:
    """The bytes of batch ``number`` and its leader epoch."""
    records = number % 3 + 1
    data = build_batch([f"{number}:{i}".encode() * (number % 7 + 5) for i in range(records)],
                       [1_000 + number] * records, codec=number % 2)
    return data, number // 40


def main() -> None:
    data_dir, mode = sys.argv[1], sys.argv[2]
    # The parent names the step to crash at (and how many hits to let pass) in the environment.
    _failpoints.arm(os.environ.get("COPYLESS_FAILPOINT") or None, int(os.environ.get("COPYLESS_FAILPOINT_SKIP", "0")))
    manager = LogManager(data_dir, default_config=CONFIG, background_interval_ms=None)
    manager.startup()
    partition_log = manager.create_log("cut", 0)
    for number in range(BATCHES):
        data, epoch = batch_for(number)
        append_blocking(partition_log, data, leader_epoch=epoch)
        if number == BATCHES // 2:
            partition_log.flush().result(timeout=60)
            manager.checkpoint_offsets()
    partition_log.set_high_watermark(partition_log.log_end_offset // 3)
    manager.wait_for_background()
    bases = partition_log.segment_base_offsets()
    if mode == "to-active":
        target = bases[-1] + 4
    elif mode == "to-older":
        target = bases[0] + 5
    else:
        target = FULL_TARGET
    print(f"PLAN {partition_log.log_end_offset} {target}", flush=True)
    if mode == "fully":
        partition_log.truncate_fully_and_start_at(target)
    else:
        partition_log.truncate_to(target)
    print(f"DONE {partition_log.log_end_offset}", flush=True)
    manager.shutdown()


if __name__ == "__main__":
    main()
