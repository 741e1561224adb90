"""The block budget: how far a partition's files may own disk blocks past its data (pure: no files, no
threads).

A partition's files own blocks ahead of the bytes they hold, in steps (segment.py, preparation.py): the
active segment's log, a prepared next segment's log, a rolled segment not yet trimmed, and each one's two
index files. The budget (LogConfig.preallocate_ahead_bytes, 64 MiB) bounds the *sum* of their blocks past
their data, and it is a rule, not a race: every step is charged here when the loop thread queues it, at the
end it was promised, not when the allocate thread has allocated it. The loop thread alone queues steps, so
whatever order the allocate thread then runs them in, no file ever owns more than it was promised and the
sum of promises never passes the budget.

Before this rule, each step was sized against the blocks the other files had *already* allocated: with a
step of the active segment queued but not run, the next segment was granted the room that step was about to
take, and a loaded CI machine measured 74.6 MiB of blocks past the data (tests/storage/test_storage_disk_usage.py).

The one exception is an append's own bytes (``need_end``): an append that finds no blocks under it is given
exactly what it is about to write even when the budget is spent, because those bytes are data the moment
the append completes. So the bound holds between appends, which is when anyone can look.

Charges, per file, for ``(data, promised)`` pairs (``held_past_data``):
- a log: the end of its last queued step (or its allocated prefix, whichever is larger) less its written end;
- a rolled segment: its log and indexes as they were at the roll, until its seal (unmap, trims, fdatasync) is
  done: a trim drops the segment's own figures a moment before its ftruncate frees the blocks;
- an index: its allocated entries past its used entries, or what its log's promised end will make the
  allocate thread give it (prepared_segment.index_allocation_bytes: at most index_ahead_bytes past its entries);
- a partition with no prepared next segment: that segment's first step, not yet allocated but reserved, so
  the next segment can always be created with its first step inside the budget.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["BLOCK_BYTES", "held_past_data", "grant_end"]


# The filesystem's block: an allocation to a promised end owns the whole block holding it (ext4 here).
BLOCK_BYTES = 4096


def held_past_data(holdings: Iterable[tuple[int, int]]) -> int:
    """Blocks owned or promised past the data, over ``(data_end, promised_end)`` pairs (one per file), in
    whole blocks: the block holding a file's last data byte is the data's."""
    held = 0
    for data, promised in holdings:
        past = _round_up(promised) - _round_up(data)
        if past > 0:
            held += past
    return held


def _round_up(position: int) -> int:
    return position + (-position % BLOCK_BYTES)


def grant_end(*, data_end: int, promised_end: int, capacity: int, want_ahead: int, held_elsewhere: int,
              budget: int, need_end: int = 0, index_cost: Callable[[int], int] = lambda end: 0) -> int:
    """The end a file's blocks may be promised to (loop thread, before queueing its next step).

    ``want_ahead`` bytes past ``data_end`` are asked for; the grant is cut so that the file's blocks past
    its data (in whole blocks, as ``held_past_data`` counts them) plus ``index_cost(end)`` (what its indexes will hold
    past their entries, a non-decreasing function of the log's end) fit in what the other files leave of ``budget``
    (``held_elsewhere``). Never below ``promised_end`` (a promise is never taken back: the step may be running) nor
    below ``need_end`` (an append's own bytes: see the module docstring), never past ``capacity``.
    """
    room = budget - held_elsewhere
    end = _fit(data_end, min(want_ahead, room), capacity)
    cost = index_cost(end)
    if cost:
        # index_cost is non-decreasing, so a shorter end costs at most what this one did.
        end = _fit(data_end, min(want_ahead, room - cost), capacity)
    return max(end, promised_end, min(need_end, capacity))


def _fit(data_end: int, limit: int, capacity: int) -> int:
    """The furthest end, at most ``capacity``, that holds at most ``limit`` bytes of blocks past the block
    holding ``data_end`` (``data_end`` itself when none does)."""
    data_blocks = _round_up(data_end)
    end = min(capacity, data_blocks + max(0, limit))
    if _round_up(end) - data_blocks > limit:
        end -= end % BLOCK_BYTES
    return max(end, data_end)
