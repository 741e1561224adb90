"""Segment: one ``.log`` file of RecordBatch v2 bytes plus its ``.index`` and ``.timeindex`` (file layer).

On disk the ``.log`` is the concatenation of batches exactly as they travel on the wire (see
``client/protocol/records.py`` for the 61-byte header), so a fetch can sendfile a byte range of it. The first
batch's baseOffset equals the segment's base offset (its file name) and every batch's baseOffset equals the
previous batch's last offset + 1. A batch never straddles two segments.

Positions, in bytes from the start of the file, kept per segment (RocketMQ's ``MappedFile``)::

    flushed_position <= committed_position <= written_position <= allocated_bytes <= capacity_bytes
    fdatasync'ed        visible to readers     copied into the map   own real blocks    mapped, file size

The active segment's file has its full logical size (``segment_bytes``) and is mapped once. Blocks
(``posix_fallocate``) cover a prefix: the whole segment by default, or steps ahead of the write position
when configured. Nothing is ever written at or past ``allocated_bytes`` (a write into a sparse page on a full
disk is SIGBUS): an append that outruns the steps allocates synchronously first, or fails with StorageError.
Pages are pre-faulted on the warm thread in a window that runs ahead of the write position (``Prefault``),
shrinks to its floor when the appends pause, and spills into the head of the next segment early enough to
be done by the roll: zeros are written over them (pwrite, claimed so that they never land where an append
is copying) and then they are mapped (MADV_POPULATE_WRITE). Appends are a memcpy into the map plus in-place
header rewrites; an append that runs past the pre-faulted pages writes them with pwrite instead
(OUTRUN_PWRITE: the page cache takes them as from write(), for a seventh of a fault's CPU). A segment's
first append puts its base offset in before the rest of the batch (see ``adopt_prepared``). Reads
never touch the map: they hand out ``(fd, position, length)`` regions and scan headers with ``os.pread``
(coherent with the map: one page cache). Sealing (at a roll) unmaps, trims the zero or sparse tail and
fdatasyncs, on a worker thread.

A crash leaves the active file at full length with a zero, sparse (it reads as zeros) or torn tail; recovery
rescans batches with their CRC-32C, stops at the first bad one, truncates there (the file is not mapped
during recovery: truncating a mapped file and touching the lost pages is SIGBUS) and rebuilds both indexes.
A roll's segment keeps the spare's temporary name until the io thread renames it; a crash before that leaves
a ``prepared-N.log`` that start-up names after its first batch's base offset (``adopt_prepared``).

Pinning (RocketMQ ``ReferenceResource``): every handed-out FileSlice pins its segment; a segment retired by
retention closes its fd and unlinks its files only once the pin count is zero.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from copyless.client.protocol.records import (
    LOG_OVERHEAD,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    InvalidBatchError,
    batch_size_at,
    read_header,
    set_base_offset,
    set_leader_epoch,
    set_log_append_time,
    validate_batch,
)

from . import blocking, filenames
from ._failpoints import failpoint
from ._fileops import (
    POPULATE_STEP_BYTES,
    ZERO_CHUNK_BYTES,
    no_readaround,
    populate,
    preallocate,
    remove_file,
    set_readahead,
    sync_data,
    write_at,
    write_zeros,
)
from .background import Completion
from .config import LogConfig
from .errors import AppendNotReady, storage_error_from
from .index import OffsetIndex, TimeIndex

__all__ = ["Segment", "PreparedSegment", "scan_headers", "RecoveryOutcome"]

log = logging.getLogger("copyless.storage")

# Header scans (offset -> position for a fetch, timestamp lookups, load_clean) pread windows of the log into
# Python memory. A fetch's scan starts at the sparse index entry at or below the target, at most
# index_interval_bytes (4096) plus one batch before it, so a first window of 8 KiB covers the whole scan in one
# pread whenever batches are <= 4 KiB (~80 headers of 100-byte batches). Measured here: a pread costs ~2 us
# for 61 B, 4 KiB or 8 KiB alike (the syscall dominates) but 6.7 us for 64 KiB, so a fixed 64 KiB window
# would triple the cost of the common fetch and copy 8x the record bytes for nothing (the fetch itself
# sends them with sendfile). Scans that run past the first window (start-up, batch_headers, a segment
# without index entries) double the window up to 64 KiB: ~10 GB/s of scan instead of ~4 GB/s. After a batch
# at least as large as the window, the next read is just its 61-byte header: with 1 MiB batches a scan
# reads 61 B per batch, not a window of record bytes.
SCAN_FIRST_WINDOW_BYTES = 8 << 10
SCAN_MAX_WINDOW_BYTES = 64 << 10
# Every header-scan pread, counted (bytes copied into Python by scans; proves the windows stay small).
SCAN_STATS = {"preads": 0, "bytes": 0}
# The active segment's file has its logical size (segment_bytes, so one map covers it) from the start, but
# only a prefix owns blocks, and an append never writes past the allocated prefix. The prefix grows in steps
# ahead of the writer (LogConfig.preallocate_*), or is the whole segment with LogConfig.preallocate (the
# RocketMQ pattern: 1 GiB up front per partition reserves 1 TB for a 1000-partition topic).


def index_allocation_bytes(log_bytes: int, entry_size: int, used_bytes: int, index_interval_bytes: int,
                           ahead_bytes: int) -> int:
    """Bytes of an index that need blocks while the log has ``log_bytes`` of them: an entry per
    index_interval_bytes (or per batch) of log, plus the final time entry, at most ``ahead_bytes`` past the
    ``used_bytes`` of entries it holds."""
    entries = log_bytes // max(index_interval_bytes, RECORD_BATCH_OVERHEAD) + 2
    return min(entries * entry_size, used_bytes + ahead_bytes)


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
# can start on the next segment's head early enough (PartitionLog._prefault_ahead). It moves by an order of
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
# the appends' memcpy takes no fault. COPYLESS_PREFAULT_ZEROS=0 turns the zeros off.
PREFAULT_WRITES_ZEROS = os.environ.get("COPYLESS_PREFAULT_ZEROS", "1") != "0"
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
# An append that runs past the pages the chase has pre-faulted (a burst that outruns it, a fresh partition's
# first megabytes) writes them with pwrite(2) instead of faulting them in through the map: the page cache
# then takes the pages the way write() does. CPU seconds per GiB of 1 MiB appends into a fresh fallocated
# file here: 1.77 for a memcpy into unpopulated map pages (a fault per 4 KiB page), 0.25 for pwrite; into
# pre-faulted pages, 0.15-0.18 for the memcpy and 0.20 for pwrite, so pre-faulted pages keep the memcpy.
# The header rewrites still go through the map (a minor fault on a page already cached). It is a syscall on
# the loop thread (0.25 ms per MiB, GIL released), where a memcpy into unpopulated pages held the loop
# 1.8 ms per MiB; dirty-page throttling can hold either the same way. COPYLESS_OUTRUN_PWRITE=0 turns it off
# (those appends then fault their pages in through the map).
OUTRUN_PWRITE = os.environ.get("COPYLESS_OUTRUN_PWRITE", "1") != "0"
# How the chases went, all logs together: bytes zeroed, appends that had to wait for a zero chunk (how many,
# their seconds in all and the longest wait: time the event loop was held), and bytes appended with pwrite
# because they ran past the pre-faulted pages.
PREFAULT_STATS = {"zeroed_bytes": 0, "append_waits": 0, "append_wait_s": 0.0, "append_wait_max_s": 0.0,
                  "outrun_bytes": 0}
_stats_lock = threading.Lock()


def _observe_append_wait(seconds: float) -> None:
    """An append awaited a zero chunk's release for ``seconds`` (the event loop served others meanwhile)."""
    with _stats_lock:
        PREFAULT_STATS["append_wait_s"] += seconds
        PREFAULT_STATS["append_wait_max_s"] = max(PREFAULT_STATS["append_wait_max_s"], seconds)


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

    __slots__ = ("position", "target", "stopped", "idle", "method", "seconds", "append_end", "append_span",
                 "rate_margin", "_claims", "_released", "_release_future")

    def __init__(self, position: int = 0) -> None:
        self.position = position
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
        chunks, then MADV_POPULATE_WRITE over the whole step (it changes no byte, so it may run where the
        appends are). Step by step, so the appends find mapped pages as soon as possible. ``advance`` (the
        caller's range starts at ``position`` or at the write position past it): move ``position`` past each step
        as it is done, so an append there copies into the map instead of writing with pwrite (OUTRUN_PWRITE).
        Returns the method."""
        method = ""
        step_start = start
        while step_start < end:
            if stopped():
                return method + "-stopped"
            step_end = min(end, step_start + POPULATE_STEP_BYTES)
            if PREFAULT_WRITES_ZEROS:
                self._write_zeros(fd, step_start, step_end)
            method = populate(region, step_start, step_end - step_start, stopped)
            if PREFAULT_WRITES_ZEROS and method == "madvise":
                method = "zeros+madvise"
            if advance and method in ("madvise", "zeros+madvise"):
                self.position = max(self.position, step_end)
            step_start = step_end
        return method

    def _write_zeros(self, fd: int, start: int, end: int) -> None:
        position = start
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
            position = chunk_end

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
                        self.method = self.fill(region, fd, start, middle, stopped, advance=OUTRUN_PWRITE)
                    finally:
                        upper.result()  # the map stays open until both halves are done
                else:
                    self.method = self.fill(region, fd, start, end, stopped, advance=OUTRUN_PWRITE)
                if not self.stopped:
                    _observe_prefault(end - start, time.perf_counter() - step_started)
                self.position = end
        except OSError as exc:  # not fatal: the appends fault the pages in themselves
            log.warning("pre-faulting failed: %s", exc)
        finally:
            self.seconds += time.perf_counter() - started
            self.idle.set()


# Recovery reads whole batches for their CRC: 8 MiB per pread (GIL released) keeps syscalls rare.
RECOVERY_CHUNK_BYTES = 8 << 20
_MIN_BATCH_BYTES = RECORD_BATCH_OVERHEAD
_BASE_OFFSET_BYTES = 8  # baseOffset, the first field of a batch (int64)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def scan_headers(fd: int, start: int, end: int) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for each complete batch in [start, end) of ``fd`` (no CRC checks).

    Stops at the first torn or nonsensical header (zeros, a length past ``end``). Touches disk (pread).
    """
    buffer = b""
    buffer_start = start
    position = start
    window = SCAN_FIRST_WINDOW_BYTES
    previous_size = 0
    while end - position >= _MIN_BATCH_BYTES:
        relative = position - buffer_start
        if relative < 0 or relative + RECORD_BATCH_OVERHEAD > len(buffer):
            if previous_size >= SCAN_FIRST_WINDOW_BYTES:
                length = RECORD_BATCH_OVERHEAD  # big batches: read the next header only
            else:
                length = window
                window = min(window * 2, SCAN_MAX_WINDOW_BYTES)
            buffer = os.pread(fd, min(length, end - position), position)
            SCAN_STATS["preads"] += 1
            SCAN_STATS["bytes"] += len(buffer)
            buffer_start = position
            relative = 0
            if len(buffer) < RECORD_BATCH_OVERHEAD:
                return
        header = read_header(buffer, relative)
        if header.batch_length < RECORD_BATCH_OVERHEAD - LOG_OVERHEAD or header.size > end - position:
            return
        yield position, header
        position += header.size
        previous_size = header.size


@dataclass
class RecoveryOutcome:
    """What a recovery scan of one segment found."""

    valid_bytes: int
    discarded_bytes: int
    batches: int
    stop_reason: str | None  # None when the scan reached the end of the file


class PreparedSegment:
    """The next segment, created ahead of a roll under a temporary name (worker thread).

    ``ready`` is set once the files exist, are preallocated and mapped: from then on a roll may take it even
    while pre-faulting is still running (the warm-up then races the appends harmlessly: its zeros are claimed
    past them, see ``Prefault``). Its log is
    pre-faulted only as far as the active segment's pre-fault window reaches past the active end
    (``prefault``, moved by the appends), so a spare that is never rolled into costs no pre-faulting.
    """

    def __init__(self, directory: Path, name: str, config: LogConfig, allocate_bytes: int | None = None) -> None:
        self.directory = directory
        self.name = name
        self.segment_bytes = config.segment_bytes
        # The prefix given real blocks (and pre-faulted) up front; the rest follows in steps while appends
        # approach it (Segment.extend_ahead).
        self.allocated_bytes = min(self.segment_bytes, max(0, config.first_step_bytes if allocate_bytes is None
                                                           else allocate_bytes))
        self.index_bytes = config.segment_index_bytes
        self.index_interval_bytes = config.index_interval_bytes
        self.index_ahead_bytes = config.index_ahead_bytes
        self.window_floor_bytes = config.prefault_window_bytes
        self.log_path = directory / f"{name}{filenames.LOG_SUFFIX}"
        self.index_path = directory / f"{name}{filenames.INDEX_SUFFIX}"
        self.time_index_path = directory / f"{name}{filenames.TIME_INDEX_SUFFIX}"
        self.fd = -1
        self.map: mmap.mmap | None = None
        self.offset_index: OffsetIndex | None = None
        self.time_index: TimeIndex | None = None
        self.ready = Completion()  # the files exist, preallocated and mapped (or create() failed: see failed)
        self.failed: BaseException | None = None
        self.warm_done = Completion()  # create + index warm-up finished (or failed)
        self.prefault = Prefault()
        self.stop_warm = False
        self.taken = False
        self.create_seconds = 0.0
        self.warm_seconds = 0.0

    def create(self) -> None:
        """Create, preallocate and map the three files. Blocking (fallocate): worker thread normally."""
        started = time.perf_counter()
        fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            # Logical size = segment_bytes (a map may not extend past the end of its file), blocks only for
            # the allocated prefix: the tail stays sparse and is never written until allocated.
            preallocate(fd, self.allocated_bytes)
            os.ftruncate(fd, self.segment_bytes)
            set_readahead(fd, False)
            region = mmap.mmap(fd, self.segment_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            no_readaround(region)
            try:
                offset_index = OffsetIndex.create(self.index_path, self.index_bytes, index_allocation_bytes(
                    self.allocated_bytes, OffsetIndex.entry.size, 0, self.index_interval_bytes, self.index_ahead_bytes))
                try:
                    time_index = TimeIndex.create(self.time_index_path, self.index_bytes, index_allocation_bytes(
                        self.allocated_bytes, TimeIndex.entry.size, 0, self.index_interval_bytes,
                        self.index_ahead_bytes))
                except BaseException:
                    offset_index.close()
                    raise
            except BaseException:
                region.close()
                raise
        except BaseException as exc:
            os.close(fd)
            self.remove_files()
            self.failed = exc
            self.ready.set()  # whoever awaits the files learns of the failure (failed)
            raise
        self.fd, self.map, self.offset_index, self.time_index = fd, region, offset_index, time_index
        self.create_seconds = time.perf_counter() - started
        self.ready.set()

    def warm(self, index_interval_bytes: int = 4096) -> None:
        """Pre-fault the part of each index map the segment will use (worker thread); the log itself is
        pre-faulted by ``chase`` as the window asks.

        The first write to each page of a mapped file goes through the filesystem's page_mkwrite, which on
        ext4 may wait for a journal commit; unwarmed index pages cost 5-20 ms stalls on the first index entry
        of each fresh segment here. Both indexes of a 1 GiB segment fit in ~5 MiB: always warmed whole.
        """
        started = time.perf_counter()
        try:
            stop = lambda: self.stop_warm  # noqa: E731
            expected_entries = self.segment_bytes // max(index_interval_bytes, 64) + 2
            for index in (self.offset_index, self.time_index):
                length = min(index.allocated_entries, expected_entries) * index.entry.size
                if length and not self.stop_warm:
                    populate(index._writable_map, 0, length, stop)
        except OSError as exc:  # not fatal: the segment works, its first appends just fault pages in
            log.warning("pre-faulting %s failed: %s", self.log_path, exc)
        finally:
            self.warm_seconds = time.perf_counter() - started
            self.warm_done.set()

    def create_and_warm(self, index_interval_bytes: int = 4096) -> "PreparedSegment":
        try:
            self.create()
        except BaseException:
            self.warm_done.set()
            raise
        self.warm(index_interval_bytes)
        return self

    def chase(self, helper=None) -> None:
        """Warm thread: pre-fault the log up to the prefault target (nothing if the files do not exist)."""
        self.prefault.chase(None if self.stop_warm else self.map, self.fd, lambda: self.allocated_bytes,
                            helper=helper)

    def discard(self) -> None:
        """Close and remove an unused prepared segment (worker thread or shutdown)."""
        self.stop_warm = True
        self.prefault.stopped = True
        if self.ready.is_set():
            self.warm_done.wait()
            self.prefault.idle.wait()
            if self.map is not None:
                self.map.close()
                self.map = None
            for index in (self.offset_index, self.time_index):
                if index is not None:
                    index.close()
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
        self.remove_files()

    def remove_files(self) -> None:
        for path in (self.log_path, self.index_path, self.time_index_path):
            remove_file(path)


class Segment:
    """One segment. Appends and reads run on the loop thread; seal/flush/close on worker threads."""

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        fd: int,
        offset_index: OffsetIndex,
        time_index: TimeIndex,
        *,
        size_bytes: int,
        index_interval_bytes: int,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.log_path = filenames.log_path(directory, base_offset)
        self.fd = fd
        self.offset_index = offset_index
        self.time_index = time_index
        self.index_interval_bytes = index_interval_bytes
        self.index_ahead_bytes = 1 << 20  # the most index blocks past its entries (set from LogConfig)
        self.window_floor_bytes = 16 << 20  # the pre-fault window's floor (set from LogConfig)
        self.map: mmap.mmap | None = None
        self.capacity_bytes = size_bytes
        # Bytes [0, allocated_bytes) own real blocks. The map covers capacity_bytes but nothing may ever
        # be written at or past allocated_bytes (a sparse page on a full disk is SIGBUS): appends extend it
        # first, in steps ahead of the write position (extend_ahead, warm thread) or, when they outrun
        # that, synchronously (allocate_to).
        self.allocated_bytes = size_bytes
        self._extension_done = Completion(done=True)
        self.extension_failed_s = -1.0  # time.monotonic() of the last failed extend_ahead
        self.written_position = size_bytes
        self.committed_position = size_bytes
        self.flushed_position = size_bytes
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self.created_ms = now_ms()
        # segment.ms counts from the first append by the broker's clock. Kafka counts from the first batch's
        # timestamp, so a producer with a skewed or ancient clock rolls a segment on every append; the
        # broker's own clock cannot be pushed around by clients.
        self.first_append_ms: int | None = self.created_ms if size_bytes else None
        self.last_append_s = 0.0  # time.monotonic() of the last append (Prefault's lead)
        self.bytes_since_last_index_entry = 0
        self.sealed = True
        self.named = True  # False while the files still carry their prepared names
        self._warm_done: Completion | None = None  # index warm-up (and creation) of this segment
        self.prefault = Prefault(size_bytes)  # the log's pre-fault window (only an active segment moves it)
        self.stop_warm = False
        self._prepared: PreparedSegment | None = None
        # Pinning.
        self._lock = threading.Lock()
        self._pins = 0
        self.retired = False
        self.closed = False
        self.delete_after_ms = 0

    def __repr__(self) -> str:
        return (
            f"Segment({self.log_path.name}, next_offset={self.next_offset}, committed={self.committed_position},"
            f" flushed={self.flushed_position}, sealed={self.sealed})"
        )

    # --- opening ----------------------------------------------------------------------------------------

    @classmethod
    def open_existing(cls, directory: Path, base_offset: int, index_interval_bytes: int) -> "Segment":
        """Open a segment's files as found on disk (start-up). Not mapped; call load_clean or recover next."""
        log_path, index_path, time_index_path = filenames.segment_paths(directory, base_offset)
        fd = os.open(log_path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            offset_index = OffsetIndex.open_existing(index_path)
            time_index = TimeIndex.open_existing(time_index_path)
        except BaseException:
            os.close(fd)
            raise
        return cls(directory, base_offset, fd, offset_index, time_index, size_bytes=size,
                   index_interval_bytes=index_interval_bytes)

    @classmethod
    def from_prepared(cls, prepared: PreparedSegment, base_offset: int, index_interval_bytes: int) -> "Segment":
        """Make a prepared segment the active one (loop thread, at a roll). No I/O: the files keep their
        prepared names until ``assign_name`` runs on the io thread (three renames are journal operations
        that took 1-8 ms here under load; start-up adopts a prepared file that holds batches, see
        ``adopt_prepared``)."""
        prepared.taken = True
        segment = cls(prepared.directory, base_offset, prepared.fd, prepared.offset_index, prepared.time_index,
                      size_bytes=0, index_interval_bytes=index_interval_bytes)
        segment.log_path = prepared.log_path
        segment.named = False
        segment.map = prepared.map
        segment.capacity_bytes = prepared.segment_bytes
        segment.allocated_bytes = prepared.allocated_bytes
        segment.index_ahead_bytes = prepared.index_ahead_bytes
        segment.window_floor_bytes = prepared.window_floor_bytes
        segment.sealed = False
        segment._warm_done = prepared.warm_done
        segment.prefault = prepared.prefault  # a chase of the spare's head may still be running: it carries on
        segment._prepared = prepared
        return segment

    def assign_name(self) -> bool:
        """Rename the files to the base offset (io thread). False if the segment was retired meanwhile."""
        log_path, index_path, time_index_path = filenames.segment_paths(self.directory, self.base_offset)
        with self._lock:
            if self.named or self.retired or self.closed:
                return False
            os.rename(self.log_path, log_path)
            self.log_path = log_path
            failpoint("roll.after_log_rename")
            self.offset_index.rename(index_path)
            self.time_index.rename(time_index_path)
            self.named = True
        failpoint("roll.after_index_rename")
        return True

    @staticmethod
    def adopt_prepared(directory: Path, log_path: Path, after: int) -> int | None:
        """Start-up: a prepared file that already holds a valid first batch was the active segment of a roll
        whose renames never ran. Give it (and its indexes, if present) the name of that batch's base offset
        and return it; None when the file holds no valid batch (an unused spare: the caller removes it) or
        when that batch does not lie past ``after``, the highest base offset of the named segments (a roll's
        segment always comes after them)."""
        try:
            with open(log_path, "rb") as handle:
                head = handle.read(RECORD_BATCH_OVERHEAD)
                size = batch_size_at(head) or 0
                if size < RECORD_BATCH_OVERHEAD or size > 1 << 31:
                    return None
                handle.seek(0)
                first = handle.read(size)
            header = validate_batch(first)
        except (OSError, InvalidBatchError):
            return None
        base_offset = header.base_offset
        target_log, target_index, target_time_index = filenames.segment_paths(directory, base_offset)
        if base_offset <= after or target_log.exists():
            return None
        stem = log_path.name[: -len(filenames.LOG_SUFFIX)]
        for suffix, target in ((filenames.INDEX_SUFFIX, target_index), (filenames.TIME_INDEX_SUFFIX, target_time_index)):
            source = directory / f"{stem}{suffix}"
            if source.exists():
                os.rename(source, target)
        os.rename(log_path, target_log)
        return base_offset

    def load_clean(self) -> bool:
        """Restore the in-memory state of a cleanly closed segment from its indexes and a scan of the tail
        after the last index entry (O(index_interval_bytes), not O(segment)). False when the file does not
        end on a batch boundary or an index is not sane: the caller then recovers the segment instead."""
        size = self.committed_position
        start = 0
        if not self.offset_index.sane(0x7FFFFFFF, size) or not self.time_index.sane(0x7FFFFFFF):
            return False
        if self.offset_index.entries:
            _, start = self.offset_index.floor_position(0x7FFFFFFF)
        next_offset = None
        end = start
        for position, header in scan_headers(self.fd, start, size):
            next_offset = header.next_offset
            end = position + header.size
        if end != size:
            return False
        self.next_offset = self.base_offset if next_offset is None else next_offset
        self.bytes_since_last_index_entry = size - start
        last = self.time_index.last_entry()
        if last is not None:
            self.max_timestamp, relative = last
            self.offset_of_max_timestamp = self.base_offset + relative
        elif size:
            # No time entry at all (a segment sealed by an older version, or an empty index file): derive the
            # largest timestamp from the headers, O(batches) once.
            for _, header in scan_headers(self.fd, 0, size):
                if header.max_timestamp > self.max_timestamp:
                    self.max_timestamp = header.max_timestamp
                    self.offset_of_max_timestamp = header.base_offset
        return True

    def recover(self, index_bytes: int) -> RecoveryOutcome:
        """Rescan every batch (framing, magic, CRC-32C, offset continuity), truncate at the first bad one and
        rebuild both indexes. Start-up only, before the segment is mapped. Touches the whole file."""
        file_size = os.fstat(self.fd).st_size
        # The index rule adds at most one entry per index_interval_bytes (or per batch) of log: sizing the
        # rebuilt indexes to that bound, not to segment_index_bytes, keeps a recovery from needing more
        # space than the trimmed indexes it replaces (a 512 KiB segment: 1 KiB of .index, not 10 MiB).
        bound_entries = file_size // max(self.index_interval_bytes, RECORD_BATCH_OVERHEAD) + 2
        for index in (self.offset_index, self.time_index):
            index.reset(min(index_bytes, bound_entries * index.entry.size))
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = self.base_offset
        self.bytes_since_last_index_entry = 0
        position = 0
        batches = 0
        stop_reason = None
        buffer = b""
        buffer_start = 0
        while position < file_size:
            if file_size - position < RECORD_BATCH_OVERHEAD:
                stop_reason = "truncated header"
                break
            relative = position - buffer_start
            if relative + LOG_OVERHEAD > len(buffer):
                buffer = os.pread(self.fd, min(RECOVERY_CHUNK_BYTES, file_size - position), position)
                buffer_start, relative = position, 0
            size = batch_size_at(buffer, relative)
            if size is None or size < RECORD_BATCH_OVERHEAD:
                stop_reason = "bad length"
                break
            if size > file_size - position:
                stop_reason = "truncated batch"
                break
            if relative + size > len(buffer):
                buffer = os.pread(self.fd, max(size, min(RECOVERY_CHUNK_BYTES, file_size - position)), position)
                buffer_start, relative = position, 0
            try:
                header = validate_batch(buffer, relative, limit=relative + size)
            except InvalidBatchError as exc:
                stop_reason = exc.reason
                break
            if header.base_offset != self.next_offset:
                stop_reason = f"offset {header.base_offset}, expected {self.next_offset}"
                break
            self._index_batch(position, header.base_offset, header.max_timestamp, size)
            self.next_offset = header.next_offset
            position += size
            batches += 1
        if position < file_size:
            # Unmapped here by construction: truncating a mapped file and touching the cut pages is SIGBUS.
            os.ftruncate(self.fd, position)
        self.capacity_bytes = self.written_position = self.committed_position = position
        self.flushed_position = 0
        return RecoveryOutcome(position, file_size - position, batches, stop_reason)

    def make_active(self, config: LogConfig) -> None:
        """Allocate a first step past the data and map a reopened last segment so appends can continue
        (start-up). Pre-faulting is left to worker threads (warm_remainder for the indexes, the appends'
        pre-fault window for the log)."""
        segment_bytes, index_bytes = config.segment_bytes, config.segment_index_bytes
        self.index_ahead_bytes = config.index_ahead_bytes
        self.window_floor_bytes = config.prefault_window_bytes
        capacity = max(segment_bytes, self.committed_position)
        allocated = min(capacity, self.committed_position + config.first_step_bytes)
        preallocate(self.fd, allocated)
        os.ftruncate(self.fd, capacity)
        set_readahead(self.fd, False)
        region = mmap.mmap(self.fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        no_readaround(region)
        try:
            for index in (self.offset_index, self.time_index):
                full_entries = index_bytes // index.entry.size
                if not index.writable or index.in_memory or index.max_entries < full_entries:
                    index.make_writable(index_bytes, allocate_bytes=index_allocation_bytes(
                        allocated - self.committed_position, index.entry.size, 0, self.index_interval_bytes,
                        self.index_ahead_bytes))
        except BaseException:
            region.close()
            raise
        self.map = region
        self.capacity_bytes = capacity
        self.allocated_bytes = allocated
        self.sealed = False
        self._warm_done = Completion()
        self.prefault = Prefault(self.committed_position)

    def make_read_only(self) -> None:
        """After make_active failed (disk full): give back any partial preallocation and take no appends
        (room_bytes == 0), so nothing ever writes past the blocks this file owns. Start-up, unmapped."""
        if self.map is not None:
            self.map.close()
            self.map = None
        os.ftruncate(self.fd, self.committed_position)
        set_readahead(self.fd, True)
        self.capacity_bytes = self.allocated_bytes = self.written_position = self.committed_position
        self.sealed = True
        self._warm_done = None

    def warm_remainder(self) -> None:
        """Pre-fault the unused part of a reopened active segment's indexes (worker thread)."""
        try:
            if self.map is not None and not self.sealed:
                stop = lambda: self.sealed or self.closed or self.stop_warm  # noqa: E731
                expected_entries = self.capacity_bytes // max(self.index_interval_bytes, 64) + 2
                for index in (self.offset_index, self.time_index):
                    start = index.entries * index.entry.size
                    end = min(index.allocated_entries, expected_entries) * index.entry.size
                    if index.writable and end > start and not stop():
                        populate(index._writable_map, start, end - start, stop)
        except OSError as exc:
            log.warning("warming %s failed: %s", self.log_path, exc)
        finally:
            self._warm_done.set()

    # --- loop thread: append -------------------------------------------------------------------------------

    @property
    def size_bytes(self) -> int:
        return self.committed_position

    @property
    def room_bytes(self) -> int:
        return self.capacity_bytes - self.written_position

    def start_extension(self) -> bool:
        """Loop thread: mark an extend_ahead as queued (False if one already is). seal/close wait for it."""
        if not self._extension_done.is_set() or self.sealed:
            return False
        self._extension_done.clear()
        return True

    def extend_ahead(self, end: int) -> None:
        """Warm thread: allocate [allocated_bytes, end) and publish it. Appends may write a byte only once
        allocated_bytes covers it, so publishing after posix_fallocate is what keeps writes off sparse pages.
        Pre-faulting is the window's job (chase)."""
        try:
            if self.sealed or self.closed or self.stop_warm or self.map is None:
                return
            start = self.allocated_bytes
            end = min(end, self.capacity_bytes)
            if end <= start:
                return
            # Index blocks first: an entry is written only once the log bytes it points at are written.
            for index in (self.offset_index, self.time_index):
                index.allocate_to(index_allocation_bytes(end, index.entry.size, index.entries * index.entry.size,
                                                         self.index_interval_bytes, self.index_ahead_bytes))
            preallocate(self.fd, end, start)
            self.allocated_bytes = max(self.allocated_bytes, end)
        except OSError as exc:  # the append path reports it (StorageError) to the appends that need blocks
            first = self.extension_failed_s < 0
            self.extension_failed_s = time.monotonic()
            log.log(logging.WARNING if first else logging.DEBUG, "extending %s failed: %s", self.log_path, exc)

    def chase(self, helper=None) -> None:
        """Warm thread: pre-fault the log from the write position up to the window's target."""
        usable = not (self.sealed or self.closed or self.stop_warm)
        self.prefault.chase(self.map if usable else None, self.fd, lambda: self.allocated_bytes,
                            lambda: self.written_position, helper, self._prefault_lead)

    def _prefault_lead(self) -> int:
        """How far the window may be pre-faulted now (warm thread): as far as its target while appends keep
        arriving; once they have paused for PREFAULT_IDLE_S, the floor window past the write position."""
        if time.monotonic() - self.last_append_s < PREFAULT_IDLE_S:
            return self.capacity_bytes
        return self.written_position + self.window_floor_bytes

    def append_run(self, view: memoryview, batches: list[tuple[int, BatchHeader]], first_offset: int,
                   leader_epoch: int | None, log_append_time_ms: int | None) -> int:
        """Copy ``view`` (whole batches, positions in ``batches`` relative to it) to the end of the map and
        assign offsets from ``first_offset``; stamp ``leader_epoch`` on each batch (None: keep theirs, as a
        follower does). Returns the next offset. Loop thread.

        The copy is one memcpy (6.7 GB/s into pre-faulted pages here vs 2.35 GB/s first-touch), or, for an
        append past the pages the chase has pre-faulted, one pwrite (OUTRUN_PWRITE); the header rewrites
        happen in the map so the caller's buffer is never copied twice and never changed. A segment's first
        append writes its base offset first: until then the file may hold no whole batch.

        Raises AppendNotReady (nothing written) while a pre-fault chunk of zeros is being written over the
        range; StorageError if the pwrite fails (EIO, ...; nothing is committed: the bytes past
        ``committed_position`` are overwritten by the next append or cut by recovery), except with EFBIG,
        where the memcpy takes the bytes.
        """
        start = self.written_position
        end = start + len(view)
        # The SIGBUS invariant: never touch a byte that owns no block.
        if end > self.allocated_bytes:
            raise AssertionError(f"append to {end} past the allocated prefix {self.allocated_bytes}")
        # No zeros of a pre-fault chase may land in [start, end): wait (await) for a chunk being written there.
        released = self.prefault.begin_append(start, end)
        if released is not None:
            raise AppendNotReady("a pre-fault's zeros", released, on_waited=_observe_append_wait)
        if start == 0:
            self.first_append_ms = now_ms()
        self.last_append_s = time.monotonic()
        region = self.map
        head = 0
        if start == 0:
            # A segment's first batch names it at start-up when a roll's renames never ran (adopt_prepared),
            # so its base offset goes in before the rest of it: a kill between the copy and the rewrites
            # below must not leave a whole batch that still carries the client's base offset 0.
            set_base_offset(region, 0, first_offset)
            head = _BASE_OFFSET_BYTES
        if OUTRUN_PWRITE and end > self.prefault.position:
            try:
                write_at(self.fd, view[head:], start + head)
            except OSError as exc:
                if exc.errno != errno.EFBIG:
                    raise storage_error_from(exc, "appending to", self.log_path) from None
                # A per-file size limit (RLIMIT_FSIZE) caps write(2), not stores into a map over blocks
                # allocated before it: those bytes go in by memcpy, as without the pwrite. The limit
                # then stops the log where it always did, at the next segment's preallocation.
                region[start + head:end] = view[head:]
            else:
                with _stats_lock:
                    PREFAULT_STATS["outrun_bytes"] += end - start
        else:
            region[start + head:end] = view[head:]
        if start == 0:
            failpoint("append.first_copied")
        self.written_position = end
        offset = first_offset
        for relative, header in batches:
            position = start + relative
            size = header.batch_length + LOG_OVERHEAD
            set_base_offset(region, position, offset)
            if leader_epoch is not None and header.partition_leader_epoch != leader_epoch:
                set_leader_epoch(region, position, leader_epoch)
            max_timestamp = header.max_timestamp
            if log_append_time_ms is not None:
                set_log_append_time(region, position, size, log_append_time_ms)
                max_timestamp = log_append_time_ms
            self._index_batch(position, offset, max_timestamp, size)
            offset += header.last_offset_delta + 1
        self.next_offset = offset
        # Visible to readers only now, with every header rewritten.
        self.committed_position = end
        return offset

    def _index_batch(self, position: int, base_offset: int, max_timestamp: int, size: int) -> None:
        """Kafka ``LogSegment.append`` index rule: one entry per index_interval_bytes of log, at a batch start."""
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = base_offset
        if self.bytes_since_last_index_entry > self.index_interval_bytes or (
            self.index_interval_bytes == 0 and position > 0
        ):
            self.offset_index.maybe_append(base_offset - self.base_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp - self.base_offset)
            self.bytes_since_last_index_entry = 0
        self.bytes_since_last_index_entry += size

    def indexes_full(self) -> bool:
        return self.offset_index.is_full or self.time_index.is_full

    # --- loop thread: read -------------------------------------------------------------------------------

    def find_batch(self, offset: int, end_position: int) -> tuple[int, BatchHeader] | None:
        """The batch holding ``offset`` (or the first one after it) below ``end_position``: index floor, then a
        forward header scan (Kafka ``translateOffset``). Touches disk (pread)."""
        _, start = self.offset_index.floor_position(max(0, offset - self.base_offset))
        if start >= end_position:
            start = 0
        for position, header in scan_headers(self.fd, start, end_position):
            if header.last_offset >= offset:
                return position, header
        return None

    def whole_batches_end(self, start: int, limit: int) -> int:
        """End of the last batch lying wholly in [start, limit), ``start`` being a batch start; ``start`` if
        none does. The index gives the last indexed batch start below ``limit`` and a header scan walks the
        rest: at most one index interval (4 KiB) of small batches, or one header of big ones. Touches disk."""
        indexed = self.offset_index.floor_batch_start(limit)
        end = indexed if indexed > start else start
        for position, header in scan_headers(self.fd, end, limit):
            end = position + header.size
        return end

    def find_timestamp(self, timestamp_ms: int, end_position: int) -> tuple[int, BatchHeader] | None:
        """The first batch below ``end_position`` whose max timestamp is >= ``timestamp_ms``."""
        entry = self.time_index.floor_below(timestamp_ms)
        start = 0
        if entry is not None:
            _, start = self.offset_index.floor_position(entry[1])
        for position, header in scan_headers(self.fd, start, end_position):
            if header.max_timestamp >= timestamp_ms:
                return position, header
        return None

    # --- pinning -----------------------------------------------------------------------------------------

    def try_pin(self) -> bool:
        """Pin the segment's fd open; False once it has been closed (retired and reaped, or shut down)."""
        with self._lock:
            if self.closed:
                return False
            self._pins += 1
            return True

    def unpin(self) -> bool:
        """Drop one pin; True when this made a retired segment deletable."""
        with self._lock:
            self._pins -= 1
            return self.retired and self._pins == 0

    @property
    def pins(self) -> int:
        return self._pins

    # --- worker threads ------------------------------------------------------------------------------------

    def stop_warming(self) -> None:
        """Ask a running pre-fault of this segment to stop at its next step (any thread)."""
        self.stop_warm = True
        self.prefault.stopped = True
        if self._prepared is not None:
            self._prepared.stop_warm = True

    def seal_begin(self) -> None:
        """Loop thread, at a roll: no more appends; record the final time-index entry (Kafka
        ``onBecomeInactiveSegment``) so the segment's largest timestamp survives a clean restart."""
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp - self.base_offset,
                                         final=True)
        self.sealed = True

    def _unmap(self) -> None:
        """Stop and wait out every pre-fault of this segment, then unmap it (worker thread): a pre-fault
        running into a closed map would touch freed memory."""
        if self._prepared is not None:
            self._prepared.stop_warm = True
        self.prefault.stopped = True
        if self._warm_done is not None:
            self._warm_done.wait()
        self.prefault.idle.wait()
        self._extension_done.wait()
        region, self.map = self.map, None
        if region is not None:
            region.close()

    def seal_finish(self) -> None:
        """Unmap, trim the preallocated tail, fdatasync log and indexes (worker thread, after seal_begin)."""
        self._unmap()
        failpoint("seal.after_unmap")
        os.ftruncate(self.fd, self.committed_position)
        set_readahead(self.fd, True)
        self.capacity_bytes = self.committed_position
        for index in (self.offset_index, self.time_index):
            index.seal_readers()
            index.trim()
        failpoint("seal.after_trim")
        self.offset_index.sync()
        self.time_index.sync()
        sync_data(self.fd)
        self.flushed_position = self.committed_position

    def truncate_to(self, offset: int) -> int:
        """Cut this segment before the batch holding ``offset`` (or the first batch past it). Worker thread;
        appends to the log are paused. Returns the new next offset: that batch's base offset, so at most
        ``offset`` (a cut inside a batch drops the whole batch: the log never holds part of one).

        A mapped (active) segment gets zeros over [cut, committed end), written from the cut upwards: after
        a kill at any moment, recovery stops at the cut (a zero length), and no old batch survives past it
        to be taken, after later appends end right where it starts, for a continuation of the log (it could
        pass both the CRC and the offset checks). The file keeps its size, blocks and pre-faulted pages,
        which the appends reuse. A sealed segment is cut with ftruncate (then made active by the caller).
        Both indexes forget their entries past the cut; the largest timestamp is recomputed from the last
        time entry kept (a scan of at most one index interval plus the batches after it).
        """
        committed = self.committed_position
        found = self.find_batch(offset, committed) if offset < self.next_offset else None
        if found is None:
            return self.next_offset
        cut, header = found
        next_offset = min(header.base_offset, max(offset, self.base_offset))
        if self.map is not None:
            write_zeros(self.fd, cut, committed)
        else:
            os.ftruncate(self.fd, cut)
            self.capacity_bytes = self.allocated_bytes = cut
        failpoint("truncate.after_log_cut")
        self.offset_index.truncate_entries(self.offset_index.entries_below_position(cut))
        self.time_index.truncate_entries(self.time_index.entries_below_offset(next_offset - self.base_offset))
        last = self.time_index.last_entry()
        self.max_timestamp, self.offset_of_max_timestamp, start = -1, self.base_offset, 0
        if last is not None:
            self.max_timestamp, relative = last
            self.offset_of_max_timestamp = self.base_offset + relative
            start = self.offset_index.floor_position(relative)[1]
        for _, batch in scan_headers(self.fd, start, cut):
            if batch.max_timestamp > self.max_timestamp:
                self.max_timestamp, self.offset_of_max_timestamp = batch.max_timestamp, batch.base_offset
        indexed = self.offset_index.floor_batch_start(cut - 1) if self.offset_index.entries else 0
        self.bytes_since_last_index_entry = cut - indexed
        self.written_position = self.committed_position = cut
        self.flushed_position = min(self.flushed_position, cut)
        self.next_offset = next_offset
        return next_offset

    def rename_deleted(self) -> None:
        """Rename the three files to ``*.deleted`` (retention); the fd stays valid for pinned readers."""
        with self._lock:
            for attribute in ("log", "offset_index", "time_index"):
                path = self.log_path if attribute == "log" else getattr(self, attribute).path
                target = path.with_name(path.name + filenames.DELETED_SUFFIX)
                try:
                    if attribute == "log":
                        os.rename(path, target)
                        self.log_path = target
                    else:
                        getattr(self, attribute).rename(target)
                except FileNotFoundError:
                    pass
                failpoint("retention.after_rename")

    def close(self, *, unlink: bool = False) -> None:
        """Release map and fds (and remove the files when ``unlink``). Blocking; worker thread or shutdown."""
        with self._lock:
            self.closed = True
        self.sealed = True
        self._unmap()
        self.offset_index.close()
        self.time_index.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if unlink:
            failpoint("retention.before_unlink")
            for path in (self.log_path, self.offset_index.path, self.time_index.path):
                remove_file(path)

    def seal_recovered(self) -> None:
        """A recovered segment that is not the last one: final time entry, trim the rebuilt indexes,
        fdatasync (start-up)."""
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp - self.base_offset,
                                         final=True)
        for index in (self.offset_index, self.time_index):
            index.seal_readers()
            index.trim()
            index.sync()
        sync_data(self.fd)
        self.flushed_position = self.committed_position

    def trim_for_shutdown(self) -> None:
        """Clean close of the active segment: final time entry, unmap, trim, fdatasync (shutdown)."""
        if not self.sealed:
            self.seal_begin()
        if self.map is not None or self.capacity_bytes != self.committed_position:
            self.seal_finish()
        else:
            sync_data(self.fd)
            self.flushed_position = self.committed_position
