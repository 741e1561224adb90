"""The storage's worker threads, and the reaper of retired segments. Never imports asyncio.

Five executors, so one kind of slow work never queues behind another:

- ``warm`` (1 thread): create + posix_fallocate the next segment of a log while the active one still has
  room, and pre-fault each active segment's window ahead of its appends (0.15 s per GiB of recycled memory
  here, up to 3.3 s per GiB of memory the VM never touched: why it is a window, see segment.py).
- ``allocate`` (1 thread): the next step of blocks of an active segment (posix_fallocate of up to 64 MiB,
  a few ms), never queued behind a pre-fault step of the warm thread (up to 0.1 s): an append that outran
  its blocks waits for this alone.
- ``prefault_helper`` (1 thread): the upper half of a pre-fault step when the appends outrun the warm
  thread (segment.PREFAULT_SPLIT_BYTES); only ever waited on by a warm task, so it never queues behind one.
- ``io`` (1 thread, FIFO): seal rolled segments (unmap, trim, fdatasync) and delete retired files. FIFO
  order is what lets a seal advance the recovery point: every older segment was sealed first.
- ``flush`` (2 threads): fdatasync for flush policies and group commit. Two, so a slow fdatasync of one log
  does not hold another log's acks (os.fdatasync releases the GIL: 5 ms worst stall of another Python
  thread measured, vs 286 ms for mmap.flush() on 512 MiB).

The asyncio shell wraps the returned concurrent futures with ``asyncio.wrap_future``. A ``Completion`` is
how a worker thread announces a piece of work done: threads wait on it, the event loop awaits its
``future()`` (an append that needs a segment or blocks still being prepared waits that way, never by blocking).
"""

from __future__ import annotations

import logging
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from . import blocking, clock

log = logging.getLogger("copyless.storage")

__all__ = ["Background", "Completion"]


class Completion:
    """A one-shot flag a worker thread sets when its work is done (threading.Event's API), which the event
    loop can await through ``future()`` instead of blocking in ``wait``. Any thread; ``clear`` re-arms it."""

    __slots__ = ("_event", "_lock", "_future")

    def __init__(self, done: bool = False) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._future: Future | None = None
        if done:
            self._event.set()

    def set(self) -> None:
        with self._lock:
            self._event.set()
            future, self._future = self._future, None
        if future is not None and future.set_running_or_notify_cancel():
            future.set_result(None)

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set (worker threads, shutdown, tests; never the event loop's thread)."""
        if not self._event.is_set():
            blocking.check("waiting for a worker thread")
        return self._event.wait(timeout)

    def future(self) -> Future:
        """A concurrent Future resolved once this is set (already resolved if it is): the loop awaits it with
        ``asyncio.wrap_future``."""
        with self._lock:
            if self._future is None or self._event.is_set():
                future: Future[None] = Future()
                if self._event.is_set():
                    future.set_running_or_notify_cancel()
                    future.set_result(None)
                    return future
                self._future = future
            return self._future


class Background:
    """Executors plus the list of retired segments waiting for their last pin to go."""

    def __init__(self) -> None:
        self.warm = ThreadPoolExecutor(1, thread_name_prefix="copyless-warm")
        self.prefault_helper = ThreadPoolExecutor(1, thread_name_prefix="copyless-prefault")
        self.allocate = ThreadPoolExecutor(1, thread_name_prefix="copyless-allocate")
        self.io = ThreadPoolExecutor(1, thread_name_prefix="copyless-io")
        self.flush = ThreadPoolExecutor(2, thread_name_prefix="copyless-flush")
        self._lock = threading.Lock()
        self._retired: list = []  # Segments renamed .deleted, closed once unpinned and past their delay
        self._deleted_dirs: list[tuple[Path, list]] = []  # (renamed dir, its segments)
        self._closed = False

    def submit_io(self, function, *args) -> Future:
        return self.io.submit(function, *args)

    def submit_warm(self, done: Completion, function, *args) -> Future:
        """Queue a warm-up whose completion ``done`` announces. ``done`` is set however the task ends, even
        cancelled before it ran (a shutdown that drops queued work): seals and closes wait on it."""
        future = self.warm.submit(function, *args)
        future.add_done_callback(lambda _: done.set())
        return future

    def submit_allocate(self, done: Completion, function, *args) -> Future:
        """Queue a step of blocks whose completion ``done`` announces (set however the task ends)."""
        future = self.allocate.submit(function, *args)
        future.add_done_callback(lambda _: done.set())
        return future

    # --- retired segments --------------------------------------------------------------------------------

    def retire(self, segment, delete_after_ms: int) -> None:
        """Queue a segment whose files were renamed ``.deleted``; it is closed and unlinked once unpinned."""
        segment.retire(delete_after_ms)
        with self._lock:
            self._retired.append(segment)

    def retire_directory(self, directory: Path, segments: list, now_ms: int) -> None:
        for segment in segments:
            self.retire(segment, now_ms)
        with self._lock:
            self._deleted_dirs.append((directory, segments))

    def on_unpinned(self, segment) -> None:
        """A FileSlice released the last pin of a retired segment (loop thread): reap without blocking."""
        if not self._closed:
            try:
                self.io.submit(self.reap)
            except RuntimeError:  # executor shut down meanwhile
                pass

    def reap(self, now_ms: int | None = None) -> int:
        """Close and unlink retired segments that are unpinned and past their delay (io thread)."""
        now = clock.now_ms() if now_ms is None else now_ms
        ready = []
        with self._lock:
            keep = []
            for segment in self._retired:
                taken = segment.take_for_deletion(now)
                if taken:
                    ready.append(segment)
                elif taken is not None:
                    keep.append(segment)
            self._retired = keep
        for segment in ready:
            try:
                segment.close(unlink=True)
            except Exception:  # one bad segment must not stop the reaping of the others
                log.exception("deleting %s failed", segment.log_path)
        with self._lock:
            pending = []
            for directory, segments in self._deleted_dirs:
                if all(segment.closed for segment in segments):
                    shutil.rmtree(directory, ignore_errors=True)
                else:
                    pending.append((directory, segments))
            self._deleted_dirs = pending
        return len(ready)

    @property
    def retired_count(self) -> int:
        with self._lock:
            return len(self._retired)

    def shutdown(self, *, cancel_queued: bool = False) -> None:
        """Stop the threads after the running tasks (and, unless ``cancel_queued``, the queued ones) end."""
        self._closed = True
        # io first: a running seal may wait for a warm-up to stop, never the other way round.
        # The helper after warm: a running chase waits on its helper's half.
        for executor in (self.io, self.flush, self.allocate, self.warm, self.prefault_helper):
            executor.shutdown(wait=True, cancel_futures=cancel_queued)
