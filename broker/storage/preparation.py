"""SegmentPreparation: blocks, pre-faulted pages and the next segment, made ready before the appends need
them. The loop thread decides (``after_append``, ``take_prepared``, ``require_allocated``), the warm and
allocate threads work.

Owns: the next segment being prepared (``prepared``, its future and the sequence its temporary names take),
why rolls are paused (``roll_error``: no segment could be preallocated) and when to retry, and the sampled
append rate. It reads the segment list (log_segments.py) for the active and sealing segments' block
holdings and counts in the log's ``stats``.

Per append, a few comparisons: queue the next step of blocks once less than half the wanted lead is left
(LogConfig.preallocate_*), keep the pre-fault window ahead of the write position, and prepare the next
segment once the active one should fill within PREPARE_HORIZON_MS. When something is not ready in time,
the append gets AppendNotReady with a future to await, never a blocking wait. No files of its own: crash
stories are the segment's and the prepared segment's (a ``prepared-*`` file is adopted or removed at
start-up).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from pathlib import Path

from . import filenames
from . import prefault as prefault_module
from .background import Background
from .block_budget import grant_end, held_past_data
from .clock import now_ms
from .config import LogConfig
from .errors import AppendNotReady, StorageError, free_bytes, storage_error_from
from .index import OffsetIndex, TimeIndex
from .log_segments import LogSegments
from .prefault import prefault_bytes_per_ms
from .prepared_segment import PreparedSegment, index_allocation_bytes
from .segment import Segment

__all__ = ["SegmentPreparation"]

log = logging.getLogger("copyless.storage")

# The smallest step of blocks queued past a promise (or a first step, if smaller), apart from an append's own
# bytes and a segment's end:
# below it the budget is asked again only once the appends have written this much more (a grant walks every
# file of the partition: 5-15 us here, against about 20 us for a whole 1 KiB append).
MIN_STEP_BYTES = 1 << 20

# _held_past_data's stand-in for a next segment about to be created (its first step is then what is sized).
NEXT_SEGMENT = object()

# When to prepare (create, posix_fallocate, pre-fault) the next segment: once the active one is past half
# full *and* expected to fill within PREPARE_HORIZON_MS at its current write rate (or its index, or
# segment.ms, runs out as soon). Pre-faulting 1 GiB takes ~0.1-0.4 s here, so 10 s leaves a wide margin,
# and only partitions about to roll hold a spare segment's worth of disk (a spare for every partition would
# double what a 1000-partition broker with 1 GiB segments reserves). The half-full floor keeps the warm-up
# away from the roll, where the io thread is already unmapping, trimming and fdatasyncing the sealed
# segment: pre-faulting zeroes pages at ~3 GB/s and competes with appends for memory bandwidth (measured
# here, 1 MiB appends right after a roll ran at 0.38x the warm rate when the next warm-up started at the
# roll, 0.88x when it started at half full). The rate is the larger of the segment-lifetime average and
# the last ~100 ms, so a burst after an idle spell is noticed. A partition appending faster than
# pre-faulting runs (memcpy into warm pages ~6.7 GB/s) still catches its warm-up: the benchmark's "burst".
PREPARE_MIN_FILL = 0.5
PREPARE_HORIZON_MS = 10_000
RATE_SAMPLE_MS = 100
# After a roll failed for lack of space, how often an append may start a background preallocation retry.
ROLL_RETRY_INTERVAL_S = 0.25
# Allocate at least this much of the observed append rate ahead of the write position (stepped allocation
# only); the rate of a fresh segment counts from RATE_FLOOR_MS so one early batch does not look like a flood.
ALLOCATE_AHEAD_MS = 1_000
RATE_FLOOR_MS = 10
# Pre-fault at least this much of the observed append rate ahead of the write position (see
# LogConfig.prefault_window_bytes for the floor and prefault.py for why it is a window), never past the
# blocks the segment owns (at most LogConfig.preallocate_ahead_bytes ahead). Half a second: the warm thread
# pre-faults recycled memory at ~6.7 GB/s, so it stays ahead of any append rate this machine reaches once it
# has a head start of a few milliseconds; a longer window only pre-faults more pages a run may never use.
WARM_AHEAD_MS = 500
# The head of the next segment is asked for this many times the time pre-faulting it should take before the
# roll: the warm thread may first finish a step of the active segment's window.
HEAD_LEAD_MARGIN = 1.5


class SegmentPreparation:
    """What is made ready ahead of one log's appends (see the module docstring). Loop thread unless noted."""

    def __init__(self, name: str, directory: Path, config: LogConfig, background: Background,
                 segments: LogSegments, stats: dict, roll_error: StorageError | None) -> None:
        self.name = name
        self.directory = directory
        self.config = config
        self._background = background
        self._segments = segments
        self.stats = stats
        self.prepared: PreparedSegment | None = None
        self.prepared_future: Future | None = None
        self._sequence = 0
        self._last_unprepared_warning_s = -1e9
        # Set while no segment can be preallocated (disk full): rolls are then retried only in the background
        # (see take_prepared), never by a posix_fallocate on the append path.
        self.roll_error = roll_error
        self._roll_retry_s = 0.0
        self._rate_sample_ms = 0
        self._rate_sample_bytes = 0
        self._rate_sample_segment: Segment | None = None
        self._recent_bytes_per_ms = 0.0

    def after_append(self, active: Segment, now: int) -> None:
        """After each append: the next step of blocks, the next segment and the pre-fault window, each queued
        on its thread when due (a few comparisons)."""
        rate = self._append_rate(active, now)
        # After a failed extension (disk full) retry at most every ROLL_RETRY_INTERVAL_S, not per append.
        if (active.allocated_bytes < active.capacity_bytes and active.extension_done.is_set()
                and active.allocated_bytes - active.written_position < self._want_ahead(rate) // 2
                and (time.monotonic() - active.extension_failed_s >= ROLL_RETRY_INTERVAL_S
                     or active.extension_failed_s < 0)):
            self._extend_active(active, rate)
        prepared = self.prepared
        if prepared is None:
            if self._should_prepare(active, now, rate):
                self._prepare_next()
        elif not self.config.preallocate:
            self._maybe_extend_next(active, prepared, rate)
        window = max(self.config.prefault_window_bytes, int(rate * WARM_AHEAD_MS))
        self._prefault_ahead(active, window, rate)

    def truncated(self) -> None:
        """The log was cut: the rate sample no longer describes the active segment."""
        self._rate_sample_segment = None

    def restarted(self) -> None:
        """A full truncation created a new active segment: rolls may go on."""
        self.roll_error = None
        self._rate_sample_segment = None

    def next_name(self, kind: str = "") -> str:
        """A new temporary name for a segment being created (``prepared-<kind><n>``)."""
        self._sequence += 1
        return f"{filenames.PREPARED_PREFIX}-{kind}{self._sequence}"

    def close(self) -> None:
        """Clean close: wait for the next segment's creation and remove its files. Blocking."""
        prepared, future = self.prepared, self.prepared_future
        if prepared is None:
            return
        if future is not None and not future.cancel():
            try:
                future.result()
            except Exception:
                pass
        prepared.discard()
        self.prepared = self.prepared_future = None

    def stop_warming(self) -> None:
        if self.prepared is not None:
            self.prepared.stop_warm = True

    def abandon(self) -> None:
        if self.prepared is not None:
            self.prepared.abandon()

    def discard(self) -> None:
        """delete_log: the next segment's files go on the io thread."""
        if self.prepared is not None:
            prepared, self.prepared = self.prepared, None
            prepared.stop_warm = True
            self._background.submit_io(prepared.discard)

    def _append_rate(self, active: Segment, now: int) -> float:
        """Bytes per ms appended to the active segment: the larger of its lifetime average and the last
        ~RATE_SAMPLE_MS, so a burst after an idle spell is noticed at once."""
        written = active.written_position
        if now - self._rate_sample_ms >= RATE_SAMPLE_MS:
            if self._rate_sample_segment is active:
                self._recent_bytes_per_ms = (written - self._rate_sample_bytes) / (now - self._rate_sample_ms)
            else:
                self._recent_bytes_per_ms = 0.0
            self._rate_sample_ms, self._rate_sample_bytes, self._rate_sample_segment = now, written, active
        started = active.first_append_ms
        if started is None:
            return self._recent_bytes_per_ms
        return max(self._recent_bytes_per_ms, written / max(now - started, RATE_FLOOR_MS))

    def _want_ahead(self, bytes_per_ms: float) -> int:
        """How many blocks the active segment would like past its write position: ALLOCATE_AHEAD_MS of the
        append rate, at least a first step (an idle partition holds 4 MiB; a burst asks for whole budgets at
        once). What it gets is cut to the budget (``_grant``)."""
        return max(self.config.first_step_bytes, int(bytes_per_ms * ALLOCATE_AHEAD_MS))

    def _held_past_data(self, exclude=None) -> int:
        """Blocks the partition's files own or were promised past their data (block_budget), ``exclude`` (a
        segment, the prepared one, or NEXT_SEGMENT for one about to be created) left out. With no prepared
        segment, the first step it will be created with is held for it."""
        holdings = []
        for segment in self._segments.sealing:
            # As at the roll, until the seal is done: its trims free the blocks a moment after they drop the
            # segment's own figures (the index's read-only map first, then its ftruncate).
            holdings += segment.sealing_holdings or segment.block_holdings()
        if self._segments.active is not exclude:
            holdings += self._segments.active.block_holdings()
        prepared = self.prepared
        if prepared is None:
            if exclude is not NEXT_SEGMENT:
                config = self.config
                first = config.first_step_bytes
                holdings.append((0, first))
                for entry_size in (OffsetIndex.entry.size, TimeIndex.entry.size):
                    holdings.append((0, index_allocation_bytes(first, entry_size, 0, config.index_interval_bytes,
                                                               config.index_ahead_bytes)))
        elif prepared is not exclude:
            holdings += prepared.block_holdings()
        return held_past_data(holdings)

    def _grant(self, file, data_end: int, want_ahead: int, need_end: int = 0) -> int:
        """The end ``file`` (the active segment or the prepared one) may be promised blocks to: block_budget's
        rule over this partition's files."""
        config = self.config
        if config.preallocate:
            return file.capacity_bytes if isinstance(file, Segment) else file.segment_bytes
        capacity = file.capacity_bytes if isinstance(file, Segment) else file.segment_bytes
        own_indexes = lambda end: held_past_data(file.block_holdings(end)[1:])  # noqa: E731
        return grant_end(data_end=data_end, promised_end=file.promised_log_end(), capacity=capacity,
                         want_ahead=want_ahead, held_elsewhere=self._held_past_data(file),
                         budget=config.preallocate_ahead_bytes, need_end=need_end, index_cost=own_indexes)

    def _extend_active(self, active: Segment, bytes_per_ms: float, need_end: int = 0) -> bool:
        """Queue the active segment's next step of blocks, as far as the budget lets it (loop thread). False
        when one is queued already or the budget leaves nothing past what was promised."""
        if not active.extension_done.is_set() or active.sealed:
            return False
        written = active.written_position
        if not need_end and written < active.regrant_at:
            return False  # the budget had no step for it: ask again once the appends have freed one
        end = self._grant(active, written, self._want_ahead(bytes_per_ms), need_end)
        promised = active.promised_log_end()
        step = min(MIN_STEP_BYTES, self.config.first_step_bytes)
        if not need_end and end - promised < min(step, active.capacity_bytes - promised):
            active.regrant_at = written + step
            return False
        if end <= promised or not active.start_extension(end):
            return False
        self.stats["extensions"] += 1
        self._background.submit_allocate(active.extension_done, active.extend_ahead, end)
        return True

    def _prefault_ahead(self, active: Segment, window: int, bytes_per_ms: float) -> None:
        """Keep ``window`` bytes ahead of the write position pre-faulted (loop thread; a few comparisons per
        append). A refill is asked for once half the window is used, so the warm thread works in steps of
        at least half a window (8 MiB+), one task per segment at a time.

        Near the active segment's end, a whole window at the head of the prepared next one is pre-faulted, so
        the appends after a roll land in warm pages with no pre-faulting running beside them (with only the
        spill pre-faulted, 1 MiB appends after a roll ran at 0.58-0.70x the warm rate instead of 0.94-1.03x),
        while a spare that is never rolled into stays cold. That head is asked for early enough to be done by
        the roll: once the room left would fill (at ``bytes_per_ms``) in less time than pre-faulting a window
        takes at the speed pre-faulting has been going. Appends of 1 MiB batches in a loop run at 5-6 GB/s
        here, pre-faulting fresh memory at ~0.7 GB/s: starting at half a window before the end, as this once
        did, left the head cold and the appends after a roll at 0.2x the warm rate."""
        written = active.written_position
        prefault = active.prefault
        prefault.rate_margin = min(int(bytes_per_ms * prefault_module.ZERO_MARGIN_MS),
                                   prefault_module.ZERO_MARGIN_RATE_MAX_BYTES)
        if prefault.target - written < window >> 1 and prefault.want(min(written + window, active.allocated_bytes)):
            self._background.submit_warm(prefault.idle, active.chase, self._background.prefault_helper)
        prepared = self.prepared
        if prepared is None or prepared.taken:
            return
        head = prepared.prefault
        if head.target > window >> 1:
            return  # asked for already (again only if the window more than doubles)
        room = active.capacity_bytes - written
        prefault_ms = window / prefault_bytes_per_ms()  # to pre-fault the head
        lead = max(window >> 1, int(HEAD_LEAD_MARGIN * prefault_ms * bytes_per_ms))
        if room < lead and head.want(min(window, prepared.allocated_bytes)):
            self._background.submit_warm(head.idle, prepared.chase, self._background.prefault_helper)

    def require_allocated(self, active: Segment, end: int, now: int) -> None:
        """Before writing up to ``end``: blocks must cover it. An append that outran extend_ahead queues the
        next step on the allocate thread and raises AppendNotReady (the caller awaits it); once an extension
        has failed (disk full), appends past the blocks get StorageError, and a new attempt is queued at
        most every ROLL_RETRY_INTERVAL_S. Loop thread, never blocks; nothing appended when it raises."""
        spare = active.prepared_from
        if spare is not None and spare.allocated_bytes > active.allocated_bytes:
            active.allocated_bytes = spare.allocated_bytes  # a step the spare took before the roll, published late
        if end <= active.allocated_bytes:
            return
        self.stats["extensions_waited"] += 1
        extending = not active.extension_done.is_set()
        failed_recently = (active.extension_failed_s >= 0
                           and time.monotonic() - active.extension_failed_s < ROLL_RETRY_INTERVAL_S)
        if not extending and failed_recently:
            raise StorageError("allocating failed: no space for the next step of the segment",
                               path=active.log_path, bytes_needed=end - active.allocated_bytes,
                               bytes_free=free_bytes(self.directory))
        if not extending:
            self._extend_active(active, self._append_rate(active, now), need_end=end)
        raise AppendNotReady("the next step of blocks", active.extension_done.future())

    def _maybe_extend_next(self, active: Segment, prepared: PreparedSegment, bytes_per_ms: float) -> None:
        """Near the roll the active segment's blocks ahead shrink to its room: the next segment takes what the
        budget leaves, up to ALLOCATE_AHEAD_MS of the rate, so the appends after the roll find blocks and a
        pre-faulted head waiting instead of a 4 MiB first step. Loop thread; a step of at least a first
        step's size (or up to the rate's want), so the allocate thread is not handed a step per append."""
        config = self.config
        want = min(prepared.segment_bytes, self._want_ahead(bytes_per_ms))
        promised = prepared.promised_log_end()
        if (want - promised < config.first_step_bytes or not prepared.extension_done.is_set()
                or active.written_position < prepared.regrant_at):
            return
        end = self._grant(prepared, 0, want)
        if end - promised < config.first_step_bytes and not end >= want > promised:
            # The budget had no step for it: ask again once the appends have freed one (a grant costs
            # 5-15 us, a 1 KiB append about 20).
            prepared.regrant_at = active.written_position + min(MIN_STEP_BYTES, config.first_step_bytes)
            return
        if prepared.start_extension(end):
            self.stats["extensions"] += 1
            self._background.submit_allocate(prepared.extension_done, prepared.extend_to, end)

    def _should_prepare(self, active: Segment, now: int, bytes_per_ms: float) -> bool:
        """True once the active segment should fill (by bytes, index entries or segment.ms) within
        PREPARE_HORIZON_MS at ``bytes_per_ms``."""
        started = active.first_append_ms
        if started is None:
            return False
        written = active.written_position
        elapsed_ms = max(now - started, 1)
        if (written >= active.capacity_bytes * PREPARE_MIN_FILL
                and active.room_bytes <= bytes_per_ms * PREPARE_HORIZON_MS):
            return True
        index = active.offset_index
        if index.entries >= index.max_entries * PREPARE_MIN_FILL and (
                (index.max_entries - index.entries) * elapsed_ms <= index.entries * PREPARE_HORIZON_MS):
            return True
        segment_ms = self.config.segment_ms
        return segment_ms is not None and now - started >= segment_ms - PREPARE_HORIZON_MS

    def _prepare_next(self) -> None:
        """Queue creation + warm-up of the next segment on the warm thread (non-blocking)."""
        config, active = self.config, self._segments.active
        # Its first step: the rate's, within what the other files leave of the budget (at least the first
        # step reserved for it, unless a rolled segment not yet trimmed still holds blocks past its data).
        name = self.next_name()
        first = config.first_step_bytes
        if not config.preallocate:
            sizing = PreparedSegment(self.directory, name, config, 0)
            want = min(config.segment_bytes, self._want_ahead(self._append_rate(active, now_ms())))
            first = grant_end(data_end=0, promised_end=0, capacity=config.segment_bytes, want_ahead=want,
                              held_elsewhere=self._held_past_data(NEXT_SEGMENT),
                              budget=config.preallocate_ahead_bytes,
                              index_cost=lambda end: held_past_data(sizing.block_holdings(end)[1:]))
        prepared = PreparedSegment(self.directory, name, config, first)
        self.prepared = prepared
        self.prepared_future = self._background.submit_warm(prepared.warm_done, prepared.create_and_warm,
                                                             self.config.index_interval_bytes)

    def take_prepared(self) -> PreparedSegment:
        """The prepared next segment. When it is not ready (still being created on the warm thread, or never
        asked for: appends outran the preparation horizon), its creation is queued if need be and
        AppendNotReady raised: the roll happens on the append after it is ready. Loop thread, never blocks."""
        if self.roll_error is not None:
            return self._take_after_error()
        prepared = self.prepared
        if prepared is not None and prepared.ready.is_set():
            if prepared.failed is None:
                self.prepared = self.prepared_future = None
                return prepared
            # Creating it failed (create() removed its files): rolls pause until a retry succeeds.
            self.prepared = self.prepared_future = None
            exc = prepared.failed
            self.roll_error = (storage_error_from(exc, "creating a segment", prepared.log_path,
                                                   bytes_needed=self.config.segment_bytes)
                                if isinstance(exc, OSError) else
                                StorageError(f"creating a segment failed: {exc}", path=prepared.log_path))
            self._roll_retry_s = time.monotonic() + ROLL_RETRY_INTERVAL_S
            log.error("%s: appends paused: %s", self.name, self.roll_error)
            raise self._paused_error()
        if prepared is None:
            # Appends outran the preparation (it starts once a roll is near at the current rate).
            self.stats["rolls_unprepared"] += 1
            now = time.monotonic()
            if now - self._last_unprepared_warning_s >= 60:
                self._last_unprepared_warning_s = now
                log.info("%s: a roll found no prepared segment (%d such rolls so far): appends wait for "
                         "its creation", self.name, self.stats["rolls_unprepared"])
            self._prepare_next()
            prepared = self.prepared
        self.stats["roll_waits"] += 1
        assert prepared is not None  # _prepare_next always leaves one
        raise AppendNotReady("the next segment", prepared.ready.future())

    def _take_after_error(self) -> PreparedSegment:
        """Rolls are paused since a segment could not be preallocated: take a segment the background retry
        has prepared, else start such a retry (at most every ROLL_RETRY_INTERVAL_S, and only when statvfs
        shows room for it: one syscall, ~2 us) and refuse this append. Loop thread, never blocks."""
        prepared, future = self.prepared, self.prepared_future
        if prepared is not None and prepared.ready.is_set() and prepared.failed is None:
            self.prepared = self.prepared_future = None
            self.roll_error = None
            log.info("%s: a segment could be preallocated again: appends resume", self.name)
            return prepared
        if prepared is not None and future is not None and future.done():
            # The retry failed (create() removed its files); remember why.
            self.prepared = self.prepared_future = None
            exc = future.exception()
            if isinstance(exc, OSError):
                self.roll_error = storage_error_from(exc, "creating a segment", prepared.log_path,
                                                      bytes_needed=self.config.segment_bytes)
        now = time.monotonic()
        if self.prepared is None and now >= self._roll_retry_s:
            self._roll_retry_s = now + ROLL_RETRY_INTERVAL_S
            config = self.config
            needed = config.segment_bytes + 2 * config.segment_index_bytes
            available = free_bytes(self.directory)
            if available is None or available >= needed:
                self._prepare_next()
        raise self._paused_error()

    def _paused_error(self) -> StorageError:
        cause = self.roll_error
        assert cause is not None  # rolls are paused only after an error
        return StorageError("appends paused: no segment could be preallocated (retrying in the background)",
                            path=cause.path, errno=cause.errno,
                            **{**cause.numbers, "bytes_free": free_bytes(self.directory)})

    def wait_warm(self, timeout_s: float | None = None) -> bool:
        """Block until the active segment and the prepared next one (if any) are created and pre-faulted as
        far as their windows ask. For benchmarks and tests; never on the loop thread. Returns False on
        timeout."""
        prepared = self.prepared
        events = [event for event in (self._segments.active.warm_done, self._segments.active.extension_done,
                                      self._segments.active.prefault.idle,
                                      prepared.warm_done if prepared is not None else None,
                                      prepared.prefault.idle if prepared is not None else None)
                  if event is not None]
        return all(event.wait(timeout_s) for event in events)
