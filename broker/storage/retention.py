"""Retention: which whole segments go past retention.ms or beyond retention.bytes, or below DeleteRecords'
log start. A pure function over the segment tuple; PartitionLog's ``run_retention`` calls it under the
segment list's lock and swaps the list (log_segments.py), and ``delete_records_before`` moves the log start.

The log start offset moves first, then the segments leave the segment tuple and are renamed ``.deleted``
and handed to the reaper (background.py), which closes and unlinks them once no FileSlice pins them and
file.delete.delay.ms has passed. Owns no state and no file. Crash story: a crash after the log start moved
but before the files went leaves whole segments below the checkpointed start, which start-up removes;
``.deleted`` files are removed at start-up.
"""

from __future__ import annotations

from .config import LogConfig
from .segment import Segment

__all__ = ["deletable_count"]


def deletable_count(segments: tuple[Segment, ...], config: LogConfig, now: int, *, log_start_offset: int,
                    upper_bound: int) -> int:
    """How many of the oldest ``segments`` retention removes: those past retention.ms (by their largest
    timestamp) or beyond retention.bytes, and those wholly below ``log_start_offset``; never the active
    (last) segment, and only segments wholly below ``upper_bound`` (the high watermark: Kafka's
    ``deletableSegments`` rule).

    Why the high watermark bounds it: on a leader, records above it are not yet on every ISR member. If
    retention removed them, the log start would pass a follower that is still in the ISR, and that
    follower would have to restart its log at the leader's start, dropping records it never received
    (and the high watermark, held at or above the log start, would jump over them: acks=all writes
    acknowledged without being replicated). A single-node broker's partition layer keeps the high
    watermark at the log end, so there it bounds nothing.
    """
    retention_ms, retention_bytes = config.retention_ms, config.retention_bytes
    if not config.delete:
        # cleanup.policy=compact alone: old segments are cleaned, never deleted by age or size (Kafka's
        # rule); DeleteRecords' log start still removes whole segments below it.
        retention_ms = retention_bytes = None
    candidates = segments[:-1]
    # Only segments whose every record is below the high watermark: the next segment starts at or below it.
    for number, segment in enumerate(segments[1:len(candidates) + 1], start=1):
        if segment.base_offset > upper_bound:
            candidates = candidates[: number - 1]
            break
    # The segment before one that still carries its prepared name stays until the rename (io thread, just
    # after the roll) is done: after a crash in that window the successor's base offset is known only from
    # its first batch, and if that batch was torn this named predecessor is what keeps the log end where it
    # was (offsets are never handed out twice).
    for number, segment in enumerate(segments[1:], start=1):
        if not segment.named:
            candidates = candidates[: number - 1]
            break
    count = 0
    # Segments wholly below the log start (DeleteRecords moved it past them: Kafka's
    # deleteLogStartOffsetBreachedSegments).
    while count < len(candidates) and segments[count + 1].base_offset <= log_start_offset:
        count += 1
    if retention_ms is not None:
        while count < len(candidates):
            segment = candidates[count]
            newest = segment.max_timestamp if segment.max_timestamp >= 0 else segment.created_ms
            if now - newest <= retention_ms:
                break
            count += 1
    if retention_bytes is not None:
        excess = sum(segment.committed_position for segment in segments[count:]) - retention_bytes
        while count < len(candidates) and excess - candidates[count].committed_position >= 0:
            excess -= candidates[count].committed_position
            count += 1
    return count
