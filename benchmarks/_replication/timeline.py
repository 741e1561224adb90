"""The arithmetic of a failover: from acknowledgement times and a kill time to the figures. Pure: numbers in,
numbers out, no clock, no process.

A producer writing steadily sees acknowledgements every few milliseconds; a SIGKILL of the partition's
leader silences them until a new leader appends and its ISR catches up. ``stall`` finds that silence: the
longest gap between consecutive acknowledgements from the last one before the kill onwards, and reports
when acknowledgements resumed, counted from the kill. Taking the longest gap rather than the first
acknowledgement after the kill matters: the dying leader's last responses may still be in flight for a
millisecond after the kill, and would read as a failover of 1 ms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

__all__ = ["Stall", "stall", "summary"]


@dataclass(frozen=True)
class Stall:
    resumed_s: float | None   # kill -> first acknowledgement after the silence (None: never resumed)
    gap_s: float | None       # the silence itself: last acknowledgement before it -> first after it
    acked_after: int          # acknowledgements after the kill, in the window given


def stall(ack_times: Sequence[float], kill_at: float) -> Stall:
    """The write stall a kill at ``kill_at`` caused, from every acknowledgement time (any order, seconds on
    the same clock). Acknowledgements long before the kill do not matter: the search starts at the last one
    at or before it (or at the kill itself when there is none)."""
    before = [t for t in ack_times if t <= kill_at]
    after = sorted(t for t in ack_times if t > kill_at)
    if not after:
        return Stall(None, None, 0)
    points = [max(before) if before else kill_at] + after
    gap, end = max(((b - a, b) for a, b in pairwise(points)), key=lambda pair: pair[0])
    return Stall(resumed_s=end - kill_at, gap_s=gap, acked_after=len(after))


def summary(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """min / median / max of the values that exist, and how many did not (a stall that never ended)."""
    present = sorted(v for v in values if v is not None)
    if not present:
        return {"n": 0, "missing": len(values), "min": None, "median": None, "max": None}
    middle = len(present) // 2
    median = present[middle] if len(present) % 2 else (present[middle - 1] + present[middle]) / 2
    return {"n": len(present), "missing": len(values) - len(present), "min": present[0], "median": median,
            "max": present[-1]}
