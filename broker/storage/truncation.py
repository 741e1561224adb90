"""Truncation of a partition log: the follower's cut back to where it agrees with its leader (KIPs 101 and
279), and the full restart of a follower that fell below its leader's log start. The file steps are
functions over the segment list (log_segments.py); PartitionLog's ``truncate_to`` and
``truncate_fully_and_start_at`` run them in order and move its offsets, the flusher's and the epoch cache.
No state and no file of its own: what it cuts and renames are the segments' files.

Both are blocking and run on a worker thread while the caller keeps appends to that partition paused; reads
may go on (a follower's log serves no consumer, and the leader never cut below its high watermark, so no
FileSlice handed out covers what is cut). Flushes and seals of the log wait: the cut holds its io lock.

Crash story: a kill -9 at any step recovers to a log that is a prefix of the one before, or, for a full
truncation, to the empty log it was heading for. The steps, each a named failpoint:

``truncate_to(offset)``
    1. the segments past the one holding ``offset`` are renamed ``.deleted``, the last first (a crash keeps
       a prefix; start-up removes ``.deleted`` files), then the directory is fsynced;
    2. the segment holding ``offset`` is cut before the batch holding it (``Segment.truncate_to``: zeros from
       the cut up over an active segment, ftruncate of a sealed one; recovery stops at the cut);
    3. the leader epoch checkpoint loses the entries past the new end (a crash before: start-up drops them);
    4. the data dir's checkpoints take the lower recovery point and high watermark (a crash before: the
       stale recovery point lies past the new end, so recovery rescans the cut segment, the last one).

``truncate_fully_and_start_at(offset)``
    1. the data dir's checkpoints take ``offset`` as log start and recovery point (start-up deletes a log
       that ends below its checkpointed start and starts an empty one there: Kafka's rule);
    2. every segment is renamed ``.deleted``, the last first;
    3. an empty segment is created at ``offset``;
    4. the leader epoch checkpoint is emptied, and the checkpoints are written again.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ._failpoints import failpoint
from .background import Background
from .checkpoint import fsync_directory
from .config import LogConfig
from .errors import StorageError, storage_error_from
from .log_segments import LogSegments
from .segment import Segment

__all__ = ["cut_files", "reactivate", "rename_all_deleted"]

log = logging.getLogger("copyless.storage")


def rename_all_deleted(segments) -> None:
    """Step 1 of either: rename each segment's files ``.deleted``, the last first (a crash keeps a prefix)."""
    for segment in reversed(segments):
        segment.stop_warming()
        segment.rename_deleted()
        failpoint("truncate.after_segment_rename")


def cut_files(segments: LogSegments, directory: Path, offset: int) -> tuple[Segment, int, list[Segment]]:
    """Steps 1 and 2 of ``truncate_to``: the segments past the one holding ``offset`` leave the list and are
    renamed ``.deleted``, the directory is fsynced, and that one is cut before the batch holding ``offset``.
    The caller holds ``segments.io_lock``. Returns (the segment before which the previous active one was
    cut, the new log end, the dropped segments); raises OSError (the log is then a prefix, as after a crash).
    """
    previous_active, dropped = segments.truncate_after(offset)
    rename_all_deleted(dropped)
    if dropped:
        fsync_directory(directory)
    cut = segments.active
    new_end = cut.truncate_to(offset)
    return previous_active, new_end, dropped


def reactivate(segment: Segment, config: LogConfig, background: Background, name: str) -> StorageError | None:
    """A sealed segment became the last one: map it for appends again (as start-up does). Returns why it
    could not be (a full disk: appends then wait for a segment the background can preallocate)."""
    try:
        segment.make_active(config)
    except OSError as exc:
        error = storage_error_from(exc, "preallocating", segment.log_path, bytes_needed=config.segment_bytes)
        log.error("%s: cannot reopen %s for appends: %s", name, segment.log_path.name, error)
        segment.make_read_only()
        return error
    assert segment.warm_done is not None  # make_active set it
    background.submit_warm(segment.warm_done, segment.warm_remainder)
    return None
