"""LogSegments: the ordered segments of one partition log, and the locks that guard swapping them (Kafka's
``LogSegments``). Any thread reads; the loop thread (roll), retention, truncation and the cleaner swap.

Owns: the immutable tuple of segments with their base offsets (one pair, replaced whole, so a reader that
took it sees a consistent list without a lock), the active (last) segment, the rolled segments whose seal
is still running, the ``truncations`` count (a flush or a cleaning that raced a truncation compares it and
gives up), ``lock`` (held for each swap) and ``io_lock`` (fdatasync, seal, truncation and the cleaner's
renames of the same files never overlap). A segment's files (``.log`` and its companion ``.index`` and
``.timeindex``) are the segment's own: renamed ``.deleted``, moved and unlinked together by segment.py, so
a file that goes with every segment belongs there too.

Pinning: a reader pins each segment it touches (``Segment.try_pin``) and ``release``s it; a segment retired
meanwhile is handed to the reaper (background.py) by the last release, so its fd is never closed under a
reader. No file of its own: the directory's state after a crash is the segments' (segment.py, loader.py).
"""

from __future__ import annotations

import bisect
import threading
from pathlib import Path

from .background import Background
from .segment import Segment

__all__ = ["LogSegments"]


class LogSegments:
    """The segments of one log (see the module docstring). ``current`` is ``(segments, base offsets)``."""

    def __init__(self, segments: list[Segment], background: Background) -> None:
        self.lock = threading.Lock()  # every swap of ``current`` (roll, retention, truncation, cleaning)
        self.io_lock = threading.Lock()  # fdatasync vs seal (unmap/trim) vs truncation of the same files
        self.current: tuple[tuple[Segment, ...], tuple[int, ...]] = (
            tuple(segments), tuple(segment.base_offset for segment in segments))
        self.active = segments[-1]
        self.sealing: list[Segment] = []  # rolled, seal (trim + fdatasync) not done: the recovery point waits
        self.truncations = 0  # bumped by each truncation
        self._background = background

    # --- reading (any thread) -------------------------------------------------------------------------------

    @property
    def all(self) -> tuple[Segment, ...]:
        return self.current[0]

    def base_offsets(self) -> list[int]:
        return list(self.current[1])

    def floor(self, offset: int) -> tuple[Segment, ...]:
        """The segments from the one holding ``offset`` (the first one when ``offset`` is below it) on."""
        segments, bases = self.current
        return segments[max(0, bisect.bisect_right(bases, offset) - 1):]

    @property
    def size_bytes(self) -> int:
        return sum(segment.committed_position for segment in self.current[0])

    def max_timestamp(self) -> int:
        """The largest batch max timestamp (-1: none), from the segments' in-memory maxima."""
        return max((segment.max_timestamp for segment in self.current[0]), default=-1)

    def sealing_floor(self, point: int) -> int:
        """``point`` held back to the base of a rolled segment whose seal is not done yet."""
        for segment in list(self.sealing):
            point = min(point, segment.base_offset)
        return point

    def release(self, segment: Segment) -> None:
        """Drop a reader's pin; the last one hands a retired segment to the reaper."""
        if segment.unpin():
            self._background.on_unpinned(segment)

    # --- swaps ------------------------------------------------------------------------------------------------

    def _set(self, segments: tuple[Segment, ...]) -> None:
        self.current = (segments, tuple(segment.base_offset for segment in segments))

    def roll(self, old: Segment, new: Segment) -> bool:
        """The loop thread's roll from ``old`` (the active segment) to ``new``. An empty ``old`` (left read-only
        by a failed reopen) is replaced, not kept: False then, else it joins ``sealing``."""
        with self.lock:
            segments, bases = self.current
            if old.committed_position == 0:
                self.current = (segments[:-1] + (new,), bases[:-1] + (new.base_offset,))
                kept = False
            else:
                self.current = (segments + (new,), bases + (new.base_offset,))
                self.sealing.append(old)
                kept = True
            self.active = new
        return kept

    def sealed(self, segment: Segment) -> None:
        with self.lock:
            if segment in self.sealing:
                self.sealing.remove(segment)

    def drop_first_locked(self, count: int) -> tuple[Segment, ...]:
        """Retention: the first ``count`` segments leave (never the active one). The caller holds ``lock``."""
        segments = self.current[0]
        doomed = segments[:count]
        self._set(segments[count:])
        self.sealing = [segment for segment in self.sealing if segment not in doomed]
        return doomed

    def truncate_after(self, offset: int) -> tuple[Segment, list[Segment]]:
        """Truncation: the segments past the one holding ``offset`` leave; that one becomes the active one.
        Returns (the previously active segment, the dropped segments)."""
        with self.lock:
            segments = self.current[0]
            keep = [segment for segment in segments if segment.base_offset <= offset] or [segments[0]]
            dropped = list(segments[len(keep):])
            self._set(tuple(keep))
            self.sealing = [segment for segment in self.sealing if segment not in dropped]
            previous_active, self.active = self.active, keep[-1]
            self.truncations += 1
        return previous_active, dropped

    def reset_locked(self, segment: Segment) -> list[Segment]:
        """A full truncation: ``segment`` is the only one. The caller holds ``lock`` (and moves the log start
        with the swap). Returns the dropped segments."""
        dropped = list(self.current[0])
        self._set((segment,))
        self.sealing = []
        self.active = segment
        self.truncations += 1
        return dropped

    def replace_groups_locked(self, groups: list[tuple[list[Segment], Segment]]) -> None:
        """The cleaner's swap: each group of consecutive segments becomes its one cleaned segment. The caller
        holds ``lock``."""
        segments = list(self.current[0])
        for group, new in groups:
            start = segments.index(group[0])
            segments[start:start + len(group)] = [new]
        self._set(tuple(segments))

    # --- whole log ------------------------------------------------------------------------------------------

    def retire(self, segments, delete_after_ms: int) -> None:
        for segment in segments:
            self._background.retire(segment, delete_after_ms)

    def stop_warming(self) -> None:
        for segment in self.current[0]:
            segment.stop_warming()

    def relocate(self, directory: Path) -> list[Segment]:
        """The log's directory was renamed to ``directory`` (delete_log): every segment's paths follow."""
        segments = list(self.current[0])
        for segment in segments:
            segment.relocate(directory)
        return segments
