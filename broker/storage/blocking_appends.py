"""BlockingAppends: append, follower append and roll for callers off the event loop's thread (mixed into
PartitionLog): tests, benchmarks, tools.

The log's own appends never block: what the worker threads have not prepared yet raises AppendNotReady
with a future. These twins wait for that future (blocking) and try again, which is what the partition
layer does on the loop by awaiting. Calling them on the event loop's thread is a bug (storage/blocking.py).
"""

from __future__ import annotations

import time

from copyless.client.protocol.records import BatchHeader

from . import blocking
from .clock import now_ms
from .errors import AppendNotReady, StorageError
from .results import AppendResult, FollowerAppend
from .segment import Segment

__all__ = ["BlockingAppends"]


class BlockingAppends:
    """Blocking twins of PartitionLog's appends and roll (see the module docstring)."""

    def append_blocking(self, records, *, leader_epoch: int = 0, log_append_time_ms: int | None = None,
                        timeout_s: float = 60.0) -> AppendResult:
        """``append``, waiting (blocking) for whatever the worker threads are preparing. For callers off the
        event loop's thread: tests, benchmarks, tools. Raises StorageError (and TimeoutError after
        ``timeout_s`` of waiting)."""
        view = memoryview(records)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        first: AppendResult | None = None
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                result = self.append(view, leader_epoch=leader_epoch, log_append_time_ms=log_append_time_ms)
            except AppendNotReady as exc:
                if exc.appended is not None:
                    base_offset, _last_offset, consumed = exc.appended
                    if first is None:
                        first = AppendResult(base_offset, base_offset, -1, self.log_start_offset)
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

    def append_as_follower_blocking(self, records, timeout_s: float = 60.0) -> FollowerAppend:
        """``append_as_follower``, waiting (blocking) for whatever the worker threads are preparing. For
        callers off the event loop's thread: tests, tools."""
        view = memoryview(records)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        first_offset = None
        done: list[tuple[int, BatchHeader]] = []
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                result = self.append_as_follower(view)
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

    def roll(self, timeout_s: float = 60.0) -> Segment | None:
        """Roll now (Kafka ``UnifiedLog.roll``) unless the active segment is empty, waiting for the next
        segment if it is still being prepared. Blocking: off the event loop's thread (tests, tools).

        Raises:
            StorageError: the next segment could not be created.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if self._closed:
                raise StorageError("log is closed", path=self.directory)
            if self._active.written_position == 0:
                return None
            try:
                return self._roll(now_ms())
            except AppendNotReady as exc:
                blocking.check("waiting for the next segment")
                exc.ready.result(max(0.0, deadline - time.monotonic()))
