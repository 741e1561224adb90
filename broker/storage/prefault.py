"""The pre-fault window: pages of an active segment's map made resident ahead of its appends (file layer).

A ``Prefault`` per segment chases a target the appends move ahead of them, on the warm thread (and its
helper): it writes zeros over each chunk (pwrite, under a claim no append overlaps) and maps the pages with
MADV_POPULATE_WRITE, so an append is a memcpy into resident pages. Appends publish where they write before
they copy (``begin_append``); one that would land on a chunk being zeroed is told to wait (a Future the loop
awaits). Nothing here owns a file or a map: the segment lends them, and keeps them open until ``idle``.
Crash story: zeros only ever land past every byte an append has begun writing, in blocks the segment
already owns, so a crash leaves at worst a zero tail, which recovery trims.
"""

from __future__ import annotations

import logging
import mmap
import threading
import time
from concurrent.futures import Future

from ._fileops import POPULATE_STEP_BYTES, ZERO_CHUNK_BYTES, populate, write_zeros
from .background import Completion

__all__ = ["Prefault", "PREFAULT_STATS", "prefault_bytes_per_ms", "observe_append_wait", "observe_outrun"]

log = logging.getLogger("copyless.storage")

# Pre-faulting runs a window ahead of the write position, not over whole segments. Allocation (blocks) is
# cheap and is what keeps writes off sparse pages; pre-faulting is CPU: measured here, MADV_POPULATE_WRITE
# costs 0.15 s per GiB on memory the guest recently freed but 2.6-3.3 s per GiB on memory it never touched
# (the hypervisor backs each page on first touch), and it dirties zero pages that writeback would write out
# if the appends did not overwrite them first. Pre-faulting a whole 1 GiB segment at creation, plus the next
# one at half full, cost up to 6 s of CPU on a 2-core machine for a topic that received 768 MiB, and kept
# the warm thread busy through the consumers' reads. The window is the larger of a floor
# (LogConfig.prefault_window_bytes, 16 MiB) and WARM_AHEAD_MS of the observed append rate (PartitionLog), so
# a partition taking 6 GB/s still writes into warm pages while a quiet one holds only the floor.


# A chase this far behind its target (appends outrunning one thread's pre-faulting) splits each step: the upper
# half goes to the helper thread. Measured on this VM, 10 KB records produced into fresh memory: 460-580 MB/s
# with one thread, the loop thread faulting a fifth of the pages itself (a quarter of the broker's samples in
# the kernel's page zeroing), 600-720 MB/s with two; below it, one thread keeps up and the helper stays idle.
PREFAULT_SPLIT_BYTES = 32 << 20
# A chase re-reads its target and its lead between steps of at most this much (two halves of 32 MiB with the
# helper): ~0.1 s on memory the hypervisor has to back first, so a chase notices within that time that the
# appends have stopped.
PREFAULT_MAX_STEP_BYTES = 64 << 20
# An active segment with no append for this long is idle: its chase stops at the floor window past the write
# position instead of running on to the end of a window sized by the last burst's rate (up to 300 MB here,
# WARM_AHEAD_MS of a 0.6 GB/s burst, pre-faulted on both cores at 3.3 s per GiB of memory the hypervisor
# backs first). Measured against running on, four alternating rounds of 10 KB records: broker CPU per GB
# lower in three (4.00-4.45 s against 4.10-4.72 after 768 MB; 5.07-5.89 against 5.51-6.41 with a consumer
# tailing the producer), the loop thread's worst lag 12-220 ms against 92-370 (benchmarks/NOTES.md).
# Producers at these rates append every few milliseconds; 100 ms without one is a pause.
PREFAULT_IDLE_S = 0.1

# How fast pre-faulting has been going (bytes per ms of a step's wall time, both threads together), so a log
# can start on the next segment's head early enough (SegmentPreparation._prefault_ahead). It moves by an order of
# magnitude with where the pages come from: 1.45 s per GiB per thread on memory the hypervisor has to back
# first (the guest's free pages are reported back to it), 0.15 s on recycled memory. The start value is the
# slow case; steps shorter than PREFAULT_SAMPLE_MIN_BYTES are too short to time.
PREFAULT_SAMPLE_MIN_BYTES = 4 << 20
_prefault_bytes_per_ms = 700_000.0


def prefault_bytes_per_ms() -> float:
    """The recent pre-fault speed (an exponential average over steps, any log's)."""
    return _prefault_bytes_per_ms


def _observe_prefault(length: int, seconds: float) -> None:
    global _prefault_bytes_per_ms
    if length >= PREFAULT_SAMPLE_MIN_BYTES and seconds > 0:
        _prefault_bytes_per_ms += 0.3 * (length / (seconds * 1e3) - _prefault_bytes_per_ms)


# A chase writes zeros over its pages (pwrite, 1 MiB chunks) before it maps them with MADV_POPULATE_WRITE.
# Measured here (benchmarks.mmap_warmup, "first touch", CPU seconds per GiB put into a fresh file's page
# cache and then copied into): 0.46 with the zeros written first against 1.76 with MADV_POPULATE_WRITE alone
# on memory the guest had used before; 1.47 against 1.39 on a freshly booted guest, where the hypervisor's
# own first touch of each page sets the price either way. A profile of the broker at 1 KB records had 62% of
# its samples in MADV_POPULATE_WRITE. The madvise after the zeros only fills page tables (0.12 s per GiB), so
# the appends' memcpy takes no fault. LogConfig.prefault_zeros = False turns the zeros off (Prefault.zeros).
# Unlike MADV_POPULATE_WRITE, a write of zeros changes the file: one that raced an append would wipe records
# just copied into the map. So zeros go only under a claim (Prefault.claim), a margin past the furthest byte
# an append has begun writing; nearer (a chase that fell behind the appends), the pages are only populated.
# An append that reaches into a claim waits for that chunk's pwrite (0.3-2 ms), holding the event loop. The
# margin is the largest of ZERO_MARGIN_BYTES, ZERO_MARGIN_APPENDS times the recent appends' size (the
# largest, decaying by an eighth per append) and ZERO_MARGIN_MS of the append rate. Measured on 1.5 GiB
# produce runs of 1 KB and 10 KB records (librdkafka's requests of 1-2 MB): with a fixed 1 MiB, 90-158
# appends waited per run; with twice the appends' size, 9-81, for 0.03-0.34 s in all and up to 16.5 ms at a
# time (the warm thread descheduled while it held a claim: two cores, shared with the producer). 40 ms of
# the rate is under a tenth of the window (WARM_AHEAD_MS, 500 ms of it).
ZERO_MARGIN_BYTES = 1 << 20
ZERO_MARGIN_APPENDS = 2
ZERO_MARGIN_MS = 40
# ... but the rate's term at most this much. Blocks reach at most 64 MiB past the data (block_budget), so a
# window is at most that deep, and 40 ms of a 1.5-2 GB/s loop of 1 MiB appends (60-80 MB) left no page of it
# far enough for zeros: every page was either faulted in by MADV_POPULATE_WRITE alone (0.8-0.95 s of CPU per
# GB) or, once such pages were left to the appends, written by their pwrite. 8 MiB is 4-5 ms of those
# appends, 16-20 chunks of zeros at ~4 GB/s.
ZERO_MARGIN_RATE_MAX_BYTES = 8 << 20
# An append that runs past the pages the chase has pre-faulted (a burst that outruns it, a fresh partition's
# first megabytes) writes them with pwrite(2) instead of faulting them in through the map: the page cache
# then takes the pages the way write() does. CPU seconds per GiB of 1 MiB appends into a fresh fallocated
# file here: 1.77 for a memcpy into unpopulated map pages (a fault per 4 KiB page), 0.25 for pwrite; into
# pre-faulted pages, 0.15-0.18 for the memcpy and 0.20 for pwrite, so pre-faulted pages keep the memcpy.
# The header rewrites still go through the map (a minor fault on a page already cached). It is a syscall on
# the loop thread (0.25 ms per MiB, GIL released), where a memcpy into unpopulated pages held the loop
# 1.8 ms per MiB; dirty-page throttling can hold either the same way. LogConfig.outrun_pwrite = False turns
# it off (those appends then fault their pages in through the map; Prefault.outrun_pwrite).
# How the chases went, all logs together: bytes zeroed, appends that had to wait for a zero chunk (how many,
# their seconds in all and the longest wait: time the event loop was held), and bytes appended with pwrite
# because they ran past the pre-faulted pages.
PREFAULT_STATS = {"zeroed_bytes": 0, "append_waits": 0, "append_wait_s": 0.0, "append_wait_max_s": 0.0,
                  "outrun_bytes": 0}
_stats_lock = threading.Lock()


def observe_append_wait(seconds: float) -> None:
    """An append awaited a zero chunk's release for ``seconds`` (the event loop served others meanwhile)."""
    with _stats_lock:
        PREFAULT_STATS["append_wait_s"] += seconds
        PREFAULT_STATS["append_wait_max_s"] = max(PREFAULT_STATS["append_wait_max_s"], seconds)


def observe_outrun(length: int) -> None:
    """An append wrote ``length`` bytes with pwrite, past the pre-faulted pages (Prefault.outrun_pwrite)."""
    with _stats_lock:
        PREFAULT_STATS["outrun_bytes"] += length


class Prefault:
    """Pre-faulting of one segment's log map, chasing a target the appends move ahead of them.

    The loop thread raises ``target`` (``want``); at most one ``chase`` task per segment is queued or running
    on the warm thread at a time, and it re-reads the target after every step, so a segment being appended
    to is pre-faulted by one long task in large steps, not by one small task per append. ``position``: every
    page below it was pre-faulted (or written). A missed wake-up (the target raised just as a chase ends) only
    delays the next step to the next append's ``want``.

    Zeros and appends never overlap. Each append publishes its end before it copies (``begin_append``, loop
    thread) and waits while a claim overlaps its range; each chunk of zeros is claimed (``claim``, warm or
    helper thread) only a margin past the published end (ZERO_MARGIN_*), and released once written. Both sides
    check under one lock, so an append either sees the claim and waits, or has published an end that the
    claim then starts beyond. The object is shared by a prepared segment and the segment made from it at a
    roll, so a chase of the spare's head that is still running after the roll is held off the appends too.
    """

    __slots__ = ("position", "warm_from", "target", "stopped", "idle", "method", "seconds", "append_end", "append_span",
                 "rate_margin", "_claims", "_released", "_release_future",
                 "zeros", "outrun_pwrite")

    def __init__(self, position: int = 0, *, zeros: bool = True, outrun_pwrite: bool = True) -> None:
        self.position = position
        # With outrun_pwrite and zeros: pages in [warm_from, position) are pre-faulted; below warm_from they
        # are the appends' to write (pwrite). A chase that finds the appends within the zeros' margin leaves
        # those pages to them instead of faulting them in (see ``fill``), and moves warm_from past the gap.
        self.warm_from = 0
        self.zeros = zeros  # write zeros over each chunk before mapping it (LogConfig.prefault_zeros)
        # Appends past ``position`` write with pwrite (LogConfig.outrun_pwrite), so a step's pages count as
        # pre-faulted as soon as it is done.
        self.outrun_pwrite = outrun_pwrite
        self.target = position
        self.stopped = False
        self.idle = Completion(done=True)  # set while no chase is queued or running
        self.idle.set()
        self.method = ""
        self.seconds = 0.0
        self.append_end = position  # the furthest byte an append has begun writing (loop thread)
        self.append_span = 0  # the recent appends' size: the largest, decaying by an eighth per append
        self.rate_margin = 0  # ZERO_MARGIN_MS of the append rate, in bytes (set by the log, loop thread)
        self._claims: list[tuple[int, int]] = []  # ranges being zeroed (at most one per chasing thread)
        self._released = threading.Lock()
        self._release_future: Future | None = None  # what appends waiting for a claim's release await

    def want(self, end: int) -> bool:
        """Loop thread: pre-fault up to ``end``. True when the caller must queue a chase (none is queued)."""
        if end > self.target:
            self.target = end
        if self.stopped or self.position >= self.target or not self.idle.is_set():
            return False
        self.idle.clear()
        return True

    def begin_append(self, start: int, end: int) -> Future | None:
        """Loop thread, before copying [start, end) into the map: publish ``end``. Returns None when the
        append may go ahead, or, when a chunk of zeros is being written over the range (rare: see
        ZERO_MARGIN_MS), a Future resolved once that chunk is released: the append must wait for it (by
        awaiting, never by blocking the loop) and try again."""
        with self._released:
            if end > self.append_end:
                self.append_end = end
            span = self.append_span - (self.append_span >> 3)
            self.append_span = max(span, end - start)
            if self._claims and self._overlaps(start, end):
                with _stats_lock:
                    PREFAULT_STATS["append_waits"] += 1
                if self._release_future is None:
                    self._release_future = Future()
                return self._release_future
            return None

    def _overlaps(self, start: int, end: int) -> bool:
        return any(claim_start < end and start < claim_end for claim_start, claim_end in self._claims)

    def claim(self, start: int, end: int) -> tuple[int, int] | None:
        """Warm thread: take [max(start, append_end + margin), end) for zeros, page-aligned; None when no
        page of it is far enough past the appends. Release with ``release``."""
        page = mmap.PAGESIZE
        with self._released:
            margin = max(ZERO_MARGIN_BYTES, ZERO_MARGIN_APPENDS * self.append_span, self.rate_margin)
            start = max(start, self.append_end + margin)
            start += -start % page
            if start >= end:
                return None
            claim = (start, end)
            self._claims.append(claim)
            return claim

    def release(self, claim: tuple[int, int]) -> None:
        with self._released:
            self._claims.remove(claim)
            future, self._release_future = self._release_future, None
        if future is not None and future.set_running_or_notify_cancel():
            future.set_result(None)

    def fill(self, region: mmap.mmap, fd: int, start: int, end: int, stopped=lambda: False,
             advance: bool = False) -> str:
        """Warm or helper thread: pre-fault [start, end) in steps of POPULATE_STEP_BYTES, each zeros in claimed
        chunks, then MADV_POPULATE_WRITE over the zeroed part (it changes no byte, so it may run where the
        appends are). Step by step, so the appends find mapped pages as soon as possible. ``advance`` (the
        caller's range starts at ``position`` or at the write position past it): move ``position`` past each step
        as it is done, so an append there copies into the map instead of writing with pwrite (``outrun_pwrite``).
        Returns the method.

        Pages too near the appends for zeros (within the claim's margin) are left to the appends when they
        write past the pre-fault with pwrite (``outrun_pwrite``): MADV_POPULATE_WRITE alone faults each 4 KiB
        page in at 0.8-0.95 s of CPU per GB here, the appends' pwrite puts the same pages in the page cache
        for 0.19-0.23 s, and zeros + populate cost 0.24 s (tools: /proc thread clocks, 256 MiB, 2026-11-28).
        Such a gap moves ``warm_from`` past it before ``position`` moves, so no append copies into it."""
        method = ""
        step_start = start
        gaps = self.zeros and self.outrun_pwrite
        while step_start < end:
            if stopped():
                return method + "-stopped"
            step_end = min(end, step_start + POPULATE_STEP_BYTES)
            warm_start = step_start
            if self.zeros:
                warm_start = self._write_zeros(fd, step_start, step_end)
            if not gaps or warm_start - step_start < mmap.PAGESIZE:
                # A claim starts on a page boundary: less than a page short of the step's start is only the
                # page the previous step mapped (populate maps whole pages), not a gap.
                warm_start = step_start
            if warm_start < step_end:
                method = populate(region, warm_start, step_end - warm_start, stopped)
                if self.zeros and method == "madvise":
                    method = "zeros+madvise"
            else:
                method = method or "left to the appends"
            if warm_start > step_start:
                self.warm_from = max(self.warm_from, warm_start)  # before position: see Segment.append_run
            if advance and method in ("madvise", "zeros+madvise", "left to the appends"):
                self.position = max(self.position, step_end)
            step_start = step_end
        return method

    def _write_zeros(self, fd: int, start: int, end: int) -> int:
        """Zeros over the chunks of [start, end) far enough past the appends (``claim``); returns where the
        zeroed part begins (``end`` when no chunk was far enough)."""
        position = start
        zeroed_from = end
        while position < end:
            chunk_end = min(end, (position // ZERO_CHUNK_BYTES + 1) * ZERO_CHUNK_BYTES)
            claim = self.claim(position, chunk_end)
            if claim is not None:
                try:
                    write_zeros(fd, *claim)
                finally:
                    self.release(claim)
                with _stats_lock:
                    PREFAULT_STATS["zeroed_bytes"] += claim[1] - claim[0]
                zeroed_from = min(zeroed_from, claim[0])
            position = chunk_end
        return zeroed_from

    def chase(self, region: mmap.mmap | None, fd: int, limit, floor=lambda: 0, helper=None, lead=None) -> None:
        """Warm thread: pre-fault [max(position, floor()), target), never past ``limit`` (the allocated prefix:
        a pre-fault of a sparse page could hit a full disk; a write of zeros there would allocate blocks). The
        caller keeps the map and ``fd`` open until ``idle``; ``limit``, ``floor`` and ``lead`` are callables
        read at each step. ``helper``: an executor that takes the upper half of a step more than
        PREFAULT_SPLIT_BYTES long (waited for before the step counts as done). ``lead``: the furthest the chase
        may go for now; a chase it stops short lowers the target to where it stopped, so the next append that
        wants more queues a new chase."""
        started = time.perf_counter()

        def stopped() -> bool:
            return self.stopped

        try:
            while not self.stopped and region is not None:
                start = max(self.position, floor())  # pages the appends already wrote need no pre-fault
                end = min(self.target, limit(), start + PREFAULT_MAX_STEP_BYTES)
                if lead is not None:
                    furthest = lead()
                    if furthest <= start:
                        # A want() raising the target meanwhile may be undone here; the append after it
                        # finds the target within half a window again and asks once more.
                        self.target = min(self.target, max(self.position, furthest))
                        break
                    end = min(end, furthest)
                if end <= start:
                    break
                step_started = time.perf_counter()
                if helper is not None and end - start >= PREFAULT_SPLIT_BYTES:
                    middle = start + (end - start) // 2
                    middle -= middle % mmap.PAGESIZE
                    upper = helper.submit(self.fill, region, fd, middle, end, stopped)
                    try:
                        self.method = self.fill(region, fd, start, middle, stopped, advance=self.outrun_pwrite)
                    finally:
                        upper.result()  # the map stays open until both halves are done
                else:
                    self.method = self.fill(region, fd, start, end, stopped, advance=self.outrun_pwrite)
                if not self.stopped:
                    _observe_prefault(end - start, time.perf_counter() - step_started)
                self.position = end
        except OSError as exc:  # not fatal: the appends fault the pages in themselves
            log.warning("pre-faulting failed: %s", exc)
        finally:
            self.seconds += time.perf_counter() - started
            self.idle.set()
