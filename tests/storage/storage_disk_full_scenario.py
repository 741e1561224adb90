"""Fill a small filesystem through the storage API; print what happened as JSON (run as a subprocess, so a
SIGBUS would show as the exit status instead of killing the test runner).

Usage: python storage_disk_full_scenario.py DATA_DIR [--rlimit-bytes N]
"""

from __future__ import annotations

import json
import resource
import signal
import sys
import time

from copyless.broker.storage import LogConfig, LogManager, StorageError
from tests.support.batches import build_batch
from tests.support.blocking_appends import append_blocking
from tests.support.log_reads import read_records

CONFIG = LogConfig(segment_bytes=512 << 10, segment_index_bytes=8 << 10, index_interval_bytes=4096, retention_ms=None,
                   file_delete_delay_ms=0)


def main() -> None:
    data_dir = sys.argv[1]
    rlimit = "--rlimit-bytes" in sys.argv
    report: dict = {}
    manager = LogManager(data_dir, default_config=CONFIG, background_interval_ms=None)
    manager.startup()
    partition_log = manager.create_log("full", 0)
    if rlimit:
        # The first segment exists; the next one cannot be preallocated past the per-file limit (EFBIG).
        limit = int(sys.argv[sys.argv.index("--rlimit-bytes") + 1])
        # Without this the kernel kills the process with SIGXFSZ instead of failing the call with EFBIG.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    values = []
    error = None
    for number in range(5000):
        value = f"{number:08d}".encode() * 512  # 4 KiB per record
        try:
            append_blocking(partition_log, build_batch([value], [number]))
        except StorageError as exc:
            error = exc
            break
        values.append(value)
    report["appended"] = len(values)
    report["error"] = None if error is None else {"errno": error.errno, "path": error.path, "numbers": error.numbers,
                                                   "disk_full": error.is_disk_full, "message": str(error)}
    report["log_end_offset_after_error"] = partition_log.log_end_offset
    # The seal of the segment before the full one trims its preallocated tail on the io thread, and that
    # may hand back a few KiB just after the refusal: once background work is done, appends take what is
    # left (each acknowledged, so it must read back) and then are refused again.
    manager.wait_for_background()
    report["second_append"] = "ok"
    for number in range(len(values), len(values) + 200):
        value = f"{number:08d}".encode() * 512
        try:
            append_blocking(partition_log, build_batch([value], [number]))
        except StorageError as exc:
            report["second_append"] = f"StorageError errno={exc.errno}"
            break
        values.append(value)
    report["appended_after_background"] = len(values) - report["appended"]
    # Reads keep working: every acknowledged record, in order.
    report["read_back_ok"] = read_all(partition_log) == values
    manager.shutdown()
    # Restart on the still-full filesystem: loads, stays readable.
    manager = LogManager(data_dir, default_config=CONFIG, background_interval_ms=None)
    manager.startup()
    partition_log = manager.get_log("full", 0)
    report["restart_clean"] = manager.startup_stats["clean"]
    report["restart_read_back_ok"] = read_all(partition_log) == values
    if rlimit:
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    # Free space with retention: appends work again.
    partition_log.config = LogConfig(segment_bytes=CONFIG.segment_bytes, segment_index_bytes=CONFIG.segment_index_bytes,
                                     retention_ms=None, retention_bytes=1 << 20, file_delete_delay_ms=0)
    # Retention deletes only below the high watermark, which a single node's partition layer keeps at the
    # log end.
    partition_log.set_high_watermark(partition_log.log_end_offset)
    report["segments_deleted"] = manager.run_retention()
    # Appends resume by themselves: the first refused append starts a background preallocation; a producer
    # keeps retrying (as Kafka clients do on KAFKA_STORAGE_ERROR) and gets through once it is ready.
    deadline = time.monotonic() + 30
    while True:
        try:
            result = append_blocking(partition_log, build_batch([b"after-retention"], [1]))
            report["append_after_retention"] = result.base_offset
            break
        except StorageError as exc:
            report["append_after_retention"] = f"StorageError {exc}"
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
    manager.shutdown()
    print(json.dumps(report))


def read_all(partition_log) -> list[bytes]:
    return [record.value for record in read_records(partition_log)]


if __name__ == "__main__":
    main()
