"""The storage's wall clock: milliseconds since the epoch (segment.ms, retention.ms and flush.ms count in it)."""

from __future__ import annotations

import time

__all__ = ["now_ms"]


def now_ms() -> int:
    return time.time_ns() // 1_000_000
