"""Blocking twins of PartitionLog's appends and roll, for callers off the event loop's thread: the storage
tests, benchmarks and test tools.

The log's own appends never block: what the worker threads have not prepared yet raises AppendNotReady
with a future. These twins wait for that future (blocking) and try again, which is what the partition
layer does on the loop by awaiting. Calling them on the event loop's thread is a bug (storage/blocking.py
raises). No state of their own, no files: the crash story is the log's.
"""

from __future__ import annotations

import time

from copyless.broker.storage import blocking
from copyless.broker.storage.errors import AppendNotReady
from copyless.broker.storage.results import AppendResult, FollowerAppend
from copyless.broker.storage.segment import Segment
from copyless.protocol.records import BatchHeader

__all__ = ["append_blocking", "append_as_follower_blocking", "roll_blocking"]


def append_blocking(partition_log, records, *, leader_epoch: int = 0, log_append_time_ms: int | None = None,
                    timeout_s: float = 60.0) -> AppendResult:
    """``partition_log.append``, waiting (blocking) for whatever the worker threads are preparing. Raises
    StorageError (and TimeoutError after ``timeout_s`` of waiting)."""
    view = memoryview(records)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    first: AppendResult | None = None
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = partition_log.append(view, leader_epoch=leader_epoch, log_append_time_ms=log_append_time_ms)
        except AppendNotReady as exc:
            if exc.appended is not None:
                base_offset, _last_offset, consumed = exc.appended
                if first is None:
                    first = AppendResult(base_offset, base_offset, -1, partition_log.log_start_offset)
                view = view[consumed:]
            blocking.check("waiting for the storage's worker threads")
            started = time.monotonic()
            exc.ready.result(max(0.0, deadline - started))
            exc.waited(time.monotonic() - started)
            continue
        if first is None:
            return result
        return AppendResult(first.base_offset, result.last_offset, result.log_append_time_ms,
                            result.log_start_offset)


def append_as_follower_blocking(partition_log, records, timeout_s: float = 60.0) -> FollowerAppend:
    """``partition_log.append_as_follower``, waiting (blocking) for whatever the worker threads are
    preparing."""
    view = memoryview(records)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    first_offset = None
    done: list[tuple[int, BatchHeader]] = []
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = partition_log.append_as_follower(view)
        except AppendNotReady as exc:
            if first_offset is None and exc.follower_headers:
                first_offset = exc.follower_headers[0][0]
            done += exc.follower_headers
            if exc.appended is not None:
                view = view[exc.appended[2]:]
            blocking.check("waiting for the storage's worker threads")
            exc.ready.result(max(0.0, deadline - time.monotonic()))
            continue
        # The first offset appended: past the old log end where a compacted leader's gap came first.
        return FollowerAppend(result.first_offset if first_offset is None else first_offset,
                              result.last_offset, done + result.headers)


def roll_blocking(partition_log, timeout_s: float = 60.0) -> Segment | None:
    """``partition_log.roll``, waiting (blocking) for the next segment while it is still being prepared.
    None when the active segment is empty (nothing rolled)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return partition_log.roll()
        except AppendNotReady as exc:
            blocking.check("waiting for the next segment")
            exc.ready.result(max(0.0, deadline - time.monotonic()))
