"""LogLoader: a partition's directory read into the state a PartitionLog is built from (Kafka's
``LogLoader``), or a new log's first segment created. Blocking: start-up, a worker thread.

It returns a ``LoadedLog``: the segment list (log_segments.py), the log start and end, the recovery point
(the log end: what was recovered is fdatasynced before it returns), the leader epoch cache made to agree
with the segments, the high watermark, why appends must wait for a segment (a full disk) and the load's
figures. It keeps no state of its own.

Clean start (the data dir's clean-shutdown marker): files and indexes are trusted after cheap checks.
Unclean: every segment from the one holding the checkpointed recovery point is rescanned and cut at its
first torn or corrupt batch (SegmentRecovery), later segments that no longer follow on are removed, and
the recovered tail is fdatasynced so the recovery point can be the log end. Leftovers of interrupted
operations are cleaned first (``_clean_directory``). A trimmed zero or sparse tail is the unused
preallocated space of the segment that was active, and is logged as such. Crash story: loading writes only
what a crash may interrupt and a second load finishes (cuts of torn tails, removals of files that are no
longer part of the log, the epoch checkpoint rewritten whole).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import NamedTuple

from . import filenames
from ._fileops import sync_data
from .background import Background
from .checkpoint import fsync_directory
from .cleaner import recover_swap
from .clock import now_ms
from .config import LogConfig
from .errors import StorageError, storage_error_from
from .leader_epoch_cache import LeaderEpochCache
from .log_reads import batch_headers
from .log_segments import LogSegments
from .prepared_segment import PreparedSegment
from .segment import Segment
from .segment_recovery import RecoveryOutcome

__all__ = ["LogLoader", "LoadStats", "LoadedLog", "create_segment"]

log = logging.getLogger("copyless.storage")


class LoadStats(NamedTuple):
    segments: int
    segments_recovered: int
    bytes_rescanned: int
    bytes_discarded: int
    segments_removed: int
    seconds: float


class LoadedLog(NamedTuple):
    """What a PartitionLog is constructed from."""

    segments: LogSegments
    log_start_offset: int
    log_end_offset: int
    recovery_point: int  # everything below is durable: the log end, after a load or a creation
    high_watermark: int
    leader_epochs: LeaderEpochCache
    roll_error: StorageError | None  # set when the last segment could not be reopened for appends
    stats: LoadStats


def create_segment(directory: Path, name: str, config: LogConfig, background: Background,
                   base_offset: int) -> Segment:
    """An empty active segment named ``base_offset``, created under the temporary ``name`` and renamed, the
    directory fsynced; its warm-up is queued. Blocking. Raises OSError (nothing is left behind)."""
    prepared = PreparedSegment(directory, name, config)
    try:
        prepared.create()
    except BaseException:
        prepared.warm_done.set()
        raise
    segment = Segment.from_prepared(prepared, base_offset, config.index_interval_bytes)
    segment.assign_name()
    fsync_directory(directory)
    background.submit_warm(prepared.warm_done, prepared.warm, config.index_interval_bytes)
    if segment.prefault.want(min(config.prefault_window_bytes, segment.allocated_bytes)):
        background.submit_warm(segment.prefault.idle, segment.chase, background.prefault_helper)
    return segment


class LogLoader:
    """Builds the state of one log directory (see the module docstring). Blocking."""

    def __init__(self, directory: Path, config: LogConfig, background: Background) -> None:
        self.directory = directory
        self.config = config
        self.background = background

    def create_new(self, base_offset: int = 0) -> LoadedLog:
        """A new, empty log with one segment at ``base_offset`` (blocking: allocates its first step)."""
        directory, config = self.directory, self.config
        directory.mkdir(parents=True, exist_ok=True)
        try:
            segment = create_segment(directory, f"{filenames.PREPARED_PREFIX}-0", config, self.background,
                                     base_offset)
        except OSError as exc:
            raise storage_error_from(exc, "creating a log", directory, bytes_needed=config.segment_bytes) from None
        fsync_directory(directory.parent)
        return self._loaded([segment], None, LoadStats(1, 0, 0, 0, 0, 0.0))

    def _loaded(self, segments: list[Segment], roll_error: StorageError | None, stats: LoadStats) -> LoadedLog:
        end = segments[-1].next_offset
        return LoadedLog(LogSegments(segments, self.background), segments[0].base_offset, end, end,
                         segments[0].base_offset, self._epoch_cache(), roll_error, stats)

    def _epoch_cache(self) -> LeaderEpochCache:
        # Its background writes go to a flush thread: off the io thread, whose FIFO of seals and renames they
        # would delay.
        return LeaderEpochCache(self.directory / filenames.LEADER_EPOCH_CHECKPOINT,
                                schedule_flush=self.background.flush.submit)

    def load(self, *, clean: bool, recovery_point: int, high_watermark: int | None = None,
             log_start_offset: int | None = None) -> LoadedLog:
        """Read an existing log directory (blocking, start-up).

        Clean: trust files and indexes (cheap sanity checks; a segment failing them is recovered). Unclean:
        rescan every segment from the one holding ``recovery_point``, truncating at the first torn or corrupt
        batch, removing later segments and rebuilding indexes; then fdatasync what was recovered so the
        recovery point can be the log end. The leader epoch cache is loaded and made to agree with the log
        (its file's entries past the log end dropped, the batches from the recovery point scanned again), and
        the checkpointed ``high_watermark`` restored (None: the log start), clamped to the log. A checkpointed
        ``log_start_offset`` above the first segment's base is the log start (DeleteRecords); above the log
        end, the log is emptied and restarted there (a full truncation a crash interrupted, Kafka's rule).
        """
        loaded = self._load_segments(clean=clean, recovery_point=max(recovery_point, log_start_offset or 0))
        start, end = loaded.log_start_offset, loaded.log_end_offset
        rescan_from = None if clean else recovery_point
        if log_start_offset is not None and log_start_offset > start:
            if log_start_offset > end:
                log.warning("%s: the log ends at %d, below its checkpointed start %d: restarting it there",
                            self.directory, end, log_start_offset)
                loaded = self._restart_at(loaded, log_start_offset)
                start = end = log_start_offset
            else:
                start = log_start_offset
        # The epoch cache and the high watermark, made to agree with the segments.
        cache = loaded.leader_epochs
        cache.restore(lambda offset: batch_headers(loaded.segments, offset), log_start_offset=start,
                      log_end_offset=end, rescan_from=rescan_from)
        if end == start:
            cache.clear()
        # Written now: the recovery point written after an unclean start-up is the log end.
        cache.flush()
        high_watermark = min(max(start if high_watermark is None else high_watermark, start), end)
        return loaded._replace(log_start_offset=start, log_end_offset=end, recovery_point=end,
                               high_watermark=high_watermark)

    def _restart_at(self, loaded: LoadedLog, offset: int) -> LoadedLog:
        """The log ends below its checkpointed start: its segments go (renamed ``.deleted``, the last first, as
        a full truncation does: start-up removes them) and an empty segment starts at ``offset``."""
        dropped = loaded.segments.all
        for segment in reversed(dropped):
            segment.stop_warming()
            segment.rename_deleted()
        fsync_directory(self.directory)
        try:
            segment = create_segment(self.directory, f"{filenames.PREPARED_PREFIX}-0", self.config, self.background,
                                     offset)
        except OSError as exc:
            raise storage_error_from(exc, "truncating fully", self.directory, offset=offset) from None
        delete_after = now_ms() + self.config.file_delete_delay_ms
        for old in dropped:
            self.background.retire(old, delete_after)
        return self._loaded([segment], None, loaded.stats)

    def _load_segments(self, *, clean: bool, recovery_point: int) -> LoadedLog:
        directory, config, background = self.directory, self.config, self.background
        started = time.perf_counter()
        bases, adopted = self._clean_directory(directory)
        if not bases:
            # Never restart below the checkpointed recovery point: those offsets were handed out already.
            return self.create_new(recovery_point)._replace(
                stats=LoadStats(1, 0, 0, 0, 0, time.perf_counter() - started))
        segments = [Segment.open_existing(directory, base, config.index_interval_bytes) for base in bases]
        first_to_recover = len(segments)
        if not clean:
            first_to_recover = 0
            for number, segment in enumerate(segments):
                if segment.base_offset <= recovery_point:
                    first_to_recover = number
        recovered = rescanned = discarded = removed = 0
        kept: list[Segment] = []
        truncated = False  # a segment out of sequence was found: it and everything after it go
        cut = False  # the last kept segment lost bytes to recovery (a torn or corrupt batch)
        for number, segment in enumerate(segments):
            # A segment may start past its predecessor's end where compaction removed that segment's last
            # records (cleaner.py), never before it, and never after a predecessor recovery cut: records
            # between them may be lost, and a later segment must not pass for their continuation. Nor may an
            # adopted one: a roll names its segment by the log end, and a gap there comes from the first
            # batch's base offset, which the CRC does not cover (a leader's appends never leave gaps; a
            # follower fetches what it loses again).
            if truncated or (kept and (segment.base_offset < kept[-1].next_offset
                                       or (segment.base_offset > kept[-1].next_offset
                                           and (cut or segment.base_offset in adopted)))):
                if not truncated:
                    log.warning("%s: segment %d does not follow offset %d: removing it and later segments",
                                directory, segment.base_offset, kept[-1].next_offset)
                truncated = True
                segment.close(unlink=True)
                removed += 1
                continue
            # A segment's batches lie below the next segment's base offset (its name): a batch past it is one
            # whose base offset was garbled (the CRC does not cover it), and the segment is cut there.
            next_base = segments[number + 1].base_offset if number + 1 < len(segments) else None
            if number < first_to_recover and segment.load_clean(next_base):
                kept.append(segment)
                cut = False
                continue
            outcome: RecoveryOutcome = segment.recover(config.segment_index_bytes, next_base)
            recovered += 1
            rescanned += outcome.valid_bytes
            discarded += outcome.discarded_bytes
            if outcome.stop_reason is not None and outcome.discarded_bytes:
                # A zero tail ("bad length") is the unused preallocated part of a segment; anything else is a
                # torn or corrupt batch. Later segments survive only if they still follow on by offset (the
                # continuity check above): a rolled-but-untrimmed segment keeps its successors, a cut in the
                # middle of the data does not.
                if outcome.stop_reason == "bad length":
                    log.info("%s: %s: trimmed %d bytes of preallocated space past the last batch (at position"
                             " %d)", directory, segment.log_path.name, outcome.discarded_bytes, outcome.valid_bytes)
                else:
                    log.warning("%s: %s: cut at position %d, the end of the last whole batch (%s); the %d bytes"
                                " after it (a torn or corrupt write, and preallocated space) were dropped",
                                directory, segment.log_path.name, outcome.valid_bytes, outcome.stop_reason,
                                outcome.discarded_bytes)
            cut = outcome.stop_reason is not None and outcome.discarded_bytes > 0
            kept.append(segment)
        if not kept:
            return self.create_new(recovery_point)._replace(
                stats=LoadStats(1, recovered, rescanned, discarded, removed, time.perf_counter() - started))
        for segment in kept[:-1]:
            if segment.offset_index.writable or segment.time_index.writable:
                segment.seal_recovered()
        last = kept[-1]
        roll_error: StorageError | None = None
        try:
            last.make_active(config)
        except OSError as exc:
            # Typically ENOSPC: start degraded. The log serves reads; appends get StorageError until a
            # segment can be preallocated (retried in the background, see SegmentPreparation.take_prepared).
            roll_error = storage_error_from(exc, "preallocating", last.log_path, bytes_needed=config.segment_bytes)
            log.error("%s: cannot reopen %s for appends: %s", directory, last.log_path.name, roll_error)
            last.make_read_only()
        if recovered:
            sync_data(last.fd)
            last.flushed_position = last.committed_position
        fsync_directory(directory)
        if last.map is not None:
            assert last.warm_done is not None  # make_active, which mapped it, set it
            background.submit_warm(last.warm_done, last.warm_remainder)
            window_end = min(last.written_position + config.prefault_window_bytes, last.allocated_bytes)
            if last.prefault.want(window_end):
                background.submit_warm(last.prefault.idle, last.chase, background.prefault_helper)
        stats = LoadStats(len(kept), recovered, rescanned, discarded, removed, time.perf_counter() - started)
        return self._loaded(kept, roll_error, stats)

    @staticmethod
    def _clean_directory(directory: Path) -> tuple[list[int], set[int]]:
        """Remove leftovers of interrupted operations and return the segment base offsets, sorted, and those
        of the segments adopted from prepared files.

        Leftovers: a cleaning's swap (finished if committed, else its ``.cleaned`` files removed: cleaner.py);
        ``*.deleted`` (retention was interrupted; the log start already moved past them);
        ``prepared-*`` files: adopted under their first batch's base offset when they hold batches past the
        named segments (a roll whose renames never ran), removed otherwise (an unused spare); index files
        without a ``.log`` (a roll interrupted between renames; a ``.log`` without indexes gets them rebuilt).
        """
        recover_swap(directory)
        logs: set[int] = set()
        indexes: list[tuple[int, Path]] = []
        named = [parsed[0] for parsed in map(filenames.parse_segment_file, os.listdir(directory))
                 if parsed is not None and parsed[1] == "log"]
        adopted_bases: set[int] = set()
        for entry in sorted(os.scandir(directory), key=lambda entry: entry.name):
            if entry.name.startswith(filenames.PREPARED_PREFIX) and entry.name.endswith(filenames.LOG_SUFFIX):
                adopted = Segment.adopt_prepared(directory, Path(entry.path), max(named, default=-1))
                if adopted is not None:
                    adopted_bases.add(adopted)
                    log.info("%s: adopted %s as segment %d (a roll's renames were interrupted)", directory,
                             entry.name, adopted)
        for entry in os.scandir(directory):
            name = entry.name
            path = Path(entry.path)
            if name.endswith(filenames.DELETED_SUFFIX) or name.startswith(filenames.PREPARED_PREFIX) \
                    or name.endswith(".tmp"):
                path.unlink(missing_ok=True)
                continue
            parsed = filenames.parse_segment_file(name)
            if parsed is None:
                continue
            base_offset, kind = parsed
            if kind == "log":
                logs.add(base_offset)
            else:
                indexes.append((base_offset, path))
        for base_offset, path in indexes:
            if base_offset not in logs:
                path.unlink(missing_ok=True)
        return sorted(logs), adopted_bases
