"""Named crash points for the kill -9 tests, and named delay points for the overlapping-fault tests.

Once ``arm(name, skip)`` names a point, the process SIGKILLs itself the moment it reaches it: the files are
left exactly as a crash at that step leaves them. ``skip=N`` lets the first N hits pass (to crash on, say, the
third roll). Armed by the crash tests' scenario processes; unarmed, a failpoint costs one comparison.

A delay point (``DELAY_POINTS``) sleeps instead, on the worker thread that reaches it: it widens a window
that timing alone rarely opens (a truncation still running when the partition's role changes). Armed in a
broker process by the environment, ``COPYLESS_DELAYPOINTS="name=seconds[,name=seconds]"``, read once at
import; a broker started without it has no delay point armed, and checking one costs a dict lookup.
"""

from __future__ import annotations

import os
import signal
import time

_ARMED: str | None = None
_skip = 0

# Every point, in protocol order; the crash tests iterate over this tuple.
POINTS = (
    "roll.before_rename",  # next segment taken at a roll, no batch in it yet, nothing renamed
    "append.first_copied",  # a segment's first append is in the file, its headers not yet rewritten
    "roll.after_log_rename",  # io thread: new .log has its name; its indexes still carry the prepared names
    "roll.after_index_rename",  # io thread: new segment named, old one not yet sealed on disk
    "seal.after_unmap",  # old segment unmapped, still full length (zero tail)
    "seal.after_trim",  # old segment trimmed, not yet fdatasync'ed
    "checkpoint.after_tmp_write",  # checkpoint .tmp written, not fsynced
    "checkpoint.before_rename",  # .tmp fsynced
    "checkpoint.after_rename",  # renamed, directory not yet fsynced
    "retention.after_log_start",  # log start moved in memory, files untouched
    "retention.after_rename",  # one segment renamed to .deleted
    "retention.before_unlink",  # .deleted files about to be removed
)

# The steps of a truncation (truncation.py), in protocol order; a test truncates at each of them.
TRUNCATION_POINTS = (
    "truncate_fully.after_log_start_checkpoint",  # full: the new start checkpointed, no file touched yet
    "truncate.after_segment_rename",  # one more segment past the cut renamed .deleted (from the last one)
    "truncate.after_log_cut",  # the segment holding the target cut (zeros or ftruncate), indexes not yet
    "truncate_fully.after_new_segment",  # full: the old segments renamed, the empty one created and named
    "truncate.after_epoch_checkpoint",  # the leader epoch file cut, the data dir's checkpoints not yet
)

# The steps of a cleaning's swap (cleaner.py), in protocol order; a test crashes at each of them.
COMPACTION_POINTS = (
    "clean.after_cleaned_written",  # every .cleaned file written and synced, no manifest yet
    "clean.after_swap_manifest",  # the manifest (the commit point) durable, no file renamed
    "clean.after_old_renamed",  # one more old segment renamed .deleted
    "clean.after_cleaned_renamed",  # one group's cleaned files carry the segment names
    "clean.before_manifest_removed",  # every group swapped on disk and in memory, the manifest still there
    "clean.after_checkpoint",  # the cleaner checkpoint written: the cleaning is over
)


# Points that sleep when armed (worker threads only: a sleep on the event loop would stall the broker).
DELAY_POINTS = (
    "truncate.before_cut",  # a follower's truncation has started on its worker thread, nothing cut yet
    "groups.load.replayed",  # a group shard's replay has read its partition, the shard does not serve it yet
)

DELAYPOINTS_ENV = "COPYLESS_DELAYPOINTS"


def _parse_delays(text: str) -> dict[str, float]:
    delays: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, seconds = item.partition("=")
        if name not in DELAY_POINTS:
            raise ValueError(f"unknown delay point {name!r} in {DELAYPOINTS_ENV}")
        delays[name] = float(seconds)
    return delays


_DELAYS: dict[str, float] = _parse_delays(os.environ.get(DELAYPOINTS_ENV, ""))


def delaypoint(name: str) -> None:
    """Sleep here for the armed number of seconds if ``name`` is armed (see the module docstring)."""
    seconds = _DELAYS.get(name)
    if seconds:
        time.sleep(seconds)


# The transaction coordinator's steps (broker.txn.service): the broker process arms one from the environment
# (``COPYLESS_FAILPOINT``) for the transaction crash tests.
TXN_POINTS = (
    "txn.after_prepare",  # PrepareCommit/PrepareAbort replicated, no marker written yet
    "txn.after_markers",  # every marker written, Complete* not yet stored
)


# A producer-state snapshot's write (broker.producer_snapshot), in protocol order.
SNAPSHOT_POINTS = (
    "snapshot.after_tmp_write",  # the .tmp written, not fsync'd
    "snapshot.before_rename",  # the .tmp fsync'd, not renamed
    "snapshot.after_rename",  # renamed, the directory not yet fsync'd
)


def arm(name: str | None, skip: int = 0) -> None:
    """SIGKILL this process at the ``skip``+1-th hit of failpoint ``name`` (None disarms)."""
    global _ARMED, _skip
    if name is not None and name not in POINTS + TRUNCATION_POINTS + COMPACTION_POINTS + TXN_POINTS + SNAPSHOT_POINTS:
        raise ValueError(f"unknown failpoint {name!r}")
    _ARMED, _skip = name, skip


def failpoint(name: str) -> None:
    """SIGKILL this process if ``name`` is the armed failpoint (after the configured number of skips)."""
    global _skip
    if _ARMED is None or name != _ARMED:
        return
    if _skip > 0:
        _skip -= 1
        return
    os.kill(os.getpid(), signal.SIGKILL)
