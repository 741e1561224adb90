"""Retention: whole segments deleted past retention.ms or beyond retention.bytes, and DeleteRecords' log
start (mixed into PartitionLog; any thread).

The log start offset moves first, then the segments leave the segment tuple and are renamed ``.deleted``
and handed to the reaper (background.py), which closes and unlinks them once no FileSlice pins them and
file.delete.delay.ms has passed. Crash story: a crash after the log start moved but before the files went
leaves whole segments below the checkpointed start, which start-up removes; ``.deleted`` files are removed
at start-up.
"""

from __future__ import annotations

import logging

from ._failpoints import failpoint
from .clock import now_ms
from .errors import OffsetOutOfRangeError

__all__ = ["Retention"]

log = logging.getLogger("copyless.storage")


class Retention:
    """The retention half of PartitionLog (see the module docstring)."""

    def run_retention(self, now: int | None = None) -> int:
        """Delete the oldest whole segments past retention.ms (by their largest timestamp) or beyond
        retention.bytes; never the active segment, and only segments wholly below the high watermark
        (Kafka's ``deletableSegments`` rule). The log start offset moves first, then the files are renamed
        ``.deleted`` and handed to the reaper, which removes them once no FileSlice pins them and
        file_delete_delay_ms has passed. Returns the number of segments retired.

        Why the high watermark bounds it: on a leader, records above it are not yet on every ISR member. If
        retention removed them, the log start would pass a follower that is still in the ISR, and that
        follower would have to restart its log at the leader's start, dropping records it never received
        (and the high watermark, held at or above the log start, would jump over them: acks=all writes
        acknowledged without being replicated). A single-node broker's partition layer keeps the high
        watermark at the log end, so there it bounds nothing.
        """
        now = now_ms() if now is None else now
        retention_ms, retention_bytes = self.config.retention_ms, self.config.retention_bytes
        if not self.config.delete:
            # cleanup.policy=compact alone: old segments are cleaned, never deleted by age or size (Kafka's
            # rule); DeleteRecords' log start still removes whole segments below it.
            retention_ms = retention_bytes = None
        with self._lock:
            segments = self._segments
            candidates = segments[:-1]
            # Only segments whose every record is below the high watermark: the next segment starts at or
            # below it.
            upper_bound = min(self.high_watermark, self.log_end_offset)
            for number, segment in enumerate(segments[1:len(candidates) + 1], start=1):
                if segment.base_offset > upper_bound:
                    candidates = candidates[: number - 1]
                    break
            # The segment before one that still carries its prepared name stays until the rename (io thread,
            # just after the roll) is done: after a crash in that window the successor's base offset is
            # known only from its first batch, and if that batch was torn this named predecessor is what
            # keeps the log end where it was (offsets are never handed out twice).
            for number, segment in enumerate(segments[1:], start=1):
                if not segment.named:
                    candidates = candidates[: number - 1]
                    break
            count = 0
            # Segments wholly below the log start (DeleteRecords moved it past them: Kafka's
            # deleteLogStartOffsetBreachedSegments).
            while count < len(candidates) and segments[count + 1].base_offset <= self.log_start_offset:
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
            if count == 0:
                return 0
            doomed = segments[:count]
            self.log_start_offset = max(self.log_start_offset, segments[count].base_offset)
            # The bound above keeps the new start at or below the high watermark; this only lifts one that
            # was already below the start (a checkpointed value older than a DeleteRecords start).
            self.high_watermark = max(self.high_watermark, self.log_start_offset)
            failpoint("retention.after_log_start")
            self._segments = segments[count:]
            self._bases = self._bases[count:]
            self._sealing = [segment for segment in self._sealing if segment not in doomed]
        # Nothing below the log start needs flushing any more (Kafka bumps the recovery point the same way).
        self._advance_flushed(self.log_start_offset)
        for segment in doomed:
            try:
                segment.rename_deleted()
            except OSError as exc:
                log.warning("%s-%d: renaming %s for deletion failed: %s", self.topic, self.partition,
                            segment.log_path, exc)
            self._background.retire(segment, now + self.config.file_delete_delay_ms)
        self.stats["segments_deleted"] += count
        log.info("%s-%d: retention removed %d segment(s); log start offset now %d", self.topic, self.partition,
                 count, self.log_start_offset)
        return count

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: raise the log start offset to ``offset`` (-1: to the high watermark). Reads below it
        answer OFFSET_OUT_OF_RANGE and ListOffsets(earliest) answers it at once; the whole segments below it go
        the way retention removes segments. Blocking (writes the data dir's log start checkpoint before it
        returns, so the records do not come back after a crash): a worker thread. An offset at or below the
        log start changes nothing.

        Returns:
            the log start offset now.
        Raises:
            OffsetOutOfRangeError: ``offset`` is above the high watermark (Kafka's rule: only committed
                records can be deleted).
        """
        high_watermark = self.high_watermark
        if offset == -1:
            offset = high_watermark
        if offset < 0 or offset > high_watermark:
            raise OffsetOutOfRangeError(offset, self.log_start_offset, high_watermark,
                                        f"{self.topic}-{self.partition} (DeleteRecords beyond the high watermark)")
        with self._lock:
            if offset <= self.log_start_offset:
                return self.log_start_offset
            self.log_start_offset = offset
        self.leader_epochs.truncate_from_start(offset)
        if self.checkpoint_offsets is not None:
            self.checkpoint_offsets()
        self.run_retention()
        log.info("%s-%d: records before offset %d deleted (DeleteRecords)", self.topic, self.partition, offset)
        return self.log_start_offset
