"""``__consumer_offsets`` after many commits: disk and a coordinator's load time, before and after a cleaning,
against a log that only ever held the live keys.

What is measured, through the real ``broker.storage`` and ``broker.groups`` code: one ``__consumer_offsets``
partition (``cleanup.policy=compact``, 8 MiB segments) on a scratch directory. Ten groups each own 100
partitions of one topic (1,000 keys) and commit all of theirs in one OffsetCommit (one batch of 100 records,
``offsets.build_batch``, as the coordinator appends it) round after round: N commits in all (1,000,000 in the
full mode, 100,000 with ``--quick``, 10,000 tiny). Then:

- *before*: the log's bytes on disk and one coordinator load (``groups.service._replay_log``, what a broker
  runs when it takes over the partition: read from the log start, decode, fold into the offset store), timed
  in wall seconds and the thread's CPU seconds (medians of three loads);
- one cleaning (``cleaner.clean_log(force=True)``, the cleaner's synchronous entry point, on the calling
  thread) after a roll, so that every commit is in a sealed segment (a broker's active segment, up to
  ``offsets.topic.segment.bytes``, is never cleaned: on a live broker add up to one segment to *after*);
- *after*: bytes and load time again;
- *live only*: a second log that only ever held the live keys (one commit per key, the final offsets), its
  bytes and load time.

Ratios: after / live for the bytes (target within 2x) and for the load CPU seconds (target within 2x), and
before / after. Every load checks that the store it built holds the same 1,000 latest offsets. The machine is
shared: compare CPU seconds and the ratios within a run; the load average is recorded.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import Benchmark
from copyless.broker.groups import offsets as offsets_module
from copyless.broker.groups.offsets import CommittedOffset, OffsetStore
from copyless.broker.groups.service import _replay_log
from copyless.broker.storage import LogConfig, LogManager
from copyless.broker.storage.cleaner import CleanerConfig, clean_log
from tests.support.blocking_appends import append_blocking, roll_blocking

MIB = 1 << 20
GROUPS = 10
PARTITIONS_PER_GROUP = 100
TOPIC = "events"
LOADS = 3


def _commit_batch(group: int, round_number: int, now: int) -> bytes:
    commits = {(TOPIC, group * PARTITIONS_PER_GROUP + partition):
               CommittedOffset(round_number * 100 + partition, -1, "", now)
               for partition in range(PARTITIONS_PER_GROUP)}
    return offsets_module.build_batch(OffsetStore.commit_records(f"group-{group}", commits), now)


def _expected(last_round: int) -> dict:
    return {(f"group-{group}", TOPIC, group * PARTITIONS_PER_GROUP + partition): last_round * 100 + partition
            for group in range(GROUPS) for partition in range(PARTITIONS_PER_GROUP)}


def _load(partition_log, expected: dict) -> tuple[float, float, int]:
    """Median wall and CPU seconds of LOADS coordinator loads, and the records one load replays."""
    walls, cpus = [], []
    for _ in range(LOADS):
        cpu_before, started = time.thread_time(), time.perf_counter()
        store, _end = _replay_log(partition_log)
        walls.append(time.perf_counter() - started)
        cpus.append(time.thread_time() - cpu_before)
        got = {(group, topic, partition): committed.offset
               for group, commits in store.offsets.items() for (topic, partition), committed in commits.items()}
        assert got == expected, "the load did not rebuild the latest offsets"
    return statistics.median(walls), statistics.median(cpus), store.records_replayed


def _log_bytes(partition_log) -> int:
    return sum(segment.committed_position for segment in partition_log.segments)


def main(argv=None) -> dict[str, Any]:
    logging.basicConfig(level=logging.WARNING)
    bench = Benchmark("compaction_offsets", "__consumer_offsets after N commits over 1,000 partitions: disk and "
                      "coordinator load time before and after a cleaning, against a log of only the live keys", argv)
    commits = bench.pick(1_000_000, 100_000, 10_000)
    keys = GROUPS * PARTITIONS_PER_GROUP
    rounds = commits // keys
    config = LogConfig(segment_bytes=8 * MIB, retention_ms=None, segment_ms=None, cleanup_policy=("compact",),
                       min_cleanable_dirty_ratio=0.0)
    load_before = os.getloadavg()
    now = int(time.time() * 1000)
    expected = _expected(rounds - 1)
    with bench.scratch_dir() as scratch:
        manager = LogManager(Path(scratch) / "data", default_config=config, background_interval_ms=None)
        manager.startup()
        try:
            history = manager.create_log("__consumer_offsets", 0, config)
            with bench.progress(rounds, "rounds", "commits") as bar:
                for round_number in range(rounds):
                    for group in range(GROUPS):
                        append_blocking(history, _commit_batch(group, round_number, now))
                    bar.advance(1)
            history.set_high_watermark(history.log_end_offset)
            roll_blocking(history)
            manager.wait_for_background()
            bench.settle()
            before_bytes = _log_bytes(history)
            before_wall, before_cpu, before_records = _load(history, expected)
            bench.row(log="before cleaning", commits=commits, log_mb=round(before_bytes / MIB, 2),
                      records=before_records, load_s=round(before_wall, 4), load_cpu_s=round(before_cpu, 4),
                      segments=len(history.segments))
            cpu_before, started = time.thread_time(), time.perf_counter()
            result = clean_log(history, force=True, max_map_entries=CleanerConfig().max_map_entries)
            clean_wall, clean_cpu = time.perf_counter() - started, time.thread_time() - cpu_before
            assert result is not None and result.aborted is None and result.keys == keys, result
            manager.wait_for_background()
            after_bytes = _log_bytes(history)
            after_wall, after_cpu, after_records = _load(history, expected)
            bench.row(log="after cleaning", commits=commits, log_mb=round(after_bytes / MIB, 3),
                      records=after_records, load_s=round(after_wall, 4), load_cpu_s=round(after_cpu, 4),
                      segments=len(history.segments))

            live = manager.create_log("__consumer_offsets", 1, config)
            for group in range(GROUPS):
                append_blocking(live, _commit_batch(group, rounds - 1, now))
            live.set_high_watermark(live.log_end_offset)
            live_bytes = _log_bytes(live)
            live_wall, live_cpu, live_records = _load(live, expected)
            bench.row(log="live keys only", commits=keys, log_mb=round(live_bytes / MIB, 3), records=live_records,
                      load_s=round(live_wall, 4), load_cpu_s=round(live_cpu, 4), segments=len(live.segments))
        finally:
            manager.shutdown()
    load_after = os.getloadavg()
    ratios = {
        "bytes_after_over_live": round(after_bytes / live_bytes, 3),
        "load_cpu_after_over_live": round(after_cpu / live_cpu, 3),
        "load_wall_after_over_live": round(after_wall / live_wall, 3),
        "bytes_before_over_after": round(before_bytes / after_bytes, 1),
        "load_cpu_before_over_after": round(before_cpu / after_cpu, 1),
        "cleaning_s": round(clean_wall, 3),
        "cleaning_cpu_s": round(clean_cpu, 3),
    }
    bench.note(f"{commits:,} commits of {keys:,} keys ({GROUPS} groups x {PARTITIONS_PER_GROUP} partitions, one "
               f"batch per group and round); load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
               f"(2 cores)")

    def chart(fig) -> None:
        left, right = fig.subplots(1, 2)
        labels = [row["log"] for row in bench.rows]
        left.bar(labels, [row["log_mb"] for row in bench.rows], color="tab:green")
        left.set_yscale("log")
        left.set_ylabel("MiB on disk (log scale)")
        left.set_title("__consumer_offsets size")
        right.bar(labels, [row["load_cpu_s"] for row in bench.rows], color="tab:blue")
        right.set_yscale("log")
        right.set_ylabel("coordinator load, CPU s (log scale)")
        right.set_title("load time")
        for axis in (left, right):
            axis.tick_params(axis="x", labelsize=8)
        fig.suptitle(f"{commits:,} offset commits over {keys:,} partitions, one cleaning", fontsize=11)

    return bench.finish(ratios=ratios, chart=chart, extra={"commits": commits, "keys": keys},
                        columns=["log", "commits", "log_mb", "records", "load_s", "load_cpu_s", "segments"])


if __name__ == "__main__":
    main()
