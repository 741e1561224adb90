"""Recovery checks a batch's offsets against where the batch sits, not only its CRC.

The batch CRC covers the attributes onward, not the base offset: a byte a crash garbles there leaves a batch
whose CRC still checks out. Each test writes real segments through a LogManager, abandons it (no clean
shutdown), garbles bytes of a base offset on disk and starts again: recovery must cut the segment at that
batch as at a torn one (and drop the segments that no longer follow on), never move the log end past what
was appended nor crash on an index entry it cannot write. ``copyless inspect`` reports such a batch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from copyless.broker.storage import LogConfig
from copyless.protocol.records import iter_batches
from tests.support.batches import build_batch
from tests.support.blocking_appends import append_blocking
from tests.support.subprocesses import python_env

SMALL_SEGMENTS = LogConfig(segment_bytes=2048, index_interval_bytes=0, segment_index_bytes=24, retention_ms=None)
ONE_SEGMENT = LogConfig(segment_bytes=1 << 20, index_interval_bytes=0, segment_index_bytes=4096, retention_ms=None)


def write_and_abandon(manager_factory, config: LogConfig, batches: int, values: int = 1) -> Path:
    """``batches`` appends of ``values`` records each to a log ``t-0`` of a manager started with ``config``,
    which is then dropped without a clean shutdown (nothing is flushed, no marker written). Returns the
    partition's directory; ``manager_factory(config)`` starts again on the same data directory."""
    manager = manager_factory(config)
    log = manager.create_log("t", 0, config)
    for _ in range(batches):
        append_blocking(log, build_batch([b"v"] * values))
    manager.abandon()
    return log.directory


def garble(path: Path, position: int, data: bytes) -> None:
    with open(path, "r+b") as handle:
        handle.seek(position)
        handle.write(data)


def batch_positions(path: Path) -> list[int]:
    data = path.read_bytes()
    return [position for position, _ in iter_batches(data)]


def test_a_garbled_base_offset_in_a_rolled_segment_cuts_it_there(manager_factory):
    # Three 1-record batches, one segment each (2 KiB segments); 0x3c in byte 4 makes the first batch claim
    # offset 0x3c000000, at or past the next segment's base offset: not a batch of this segment.
    directory = write_and_abandon(manager_factory, SMALL_SEGMENTS, 3)
    garble(directory / "00000000000000000000.log", 4, b"\x3c")
    log = manager_factory(SMALL_SEGMENTS).get_log("t", 0)
    assert log.log_end_offset == 0
    assert log.segment_base_offsets() == [0]
    append_blocking(log, build_batch([b"after"]))
    assert log.log_end_offset == 1


def test_a_base_offset_past_the_index_range_cannot_crash_start_up(manager_factory):
    # 0x01 in byte 3: offset 2**32, a relative offset no .index entry (u32) can hold.
    directory = write_and_abandon(manager_factory, SMALL_SEGMENTS, 3)
    garble(directory / "00000000000000000000.log", 3, b"\x01")
    log = manager_factory(SMALL_SEGMENTS).get_log("t", 0)
    assert log.log_end_offset == 0
    assert log.segment_base_offsets() == [0]


def test_a_relative_offset_past_int32_in_the_last_segment_is_cut(manager_factory):
    # The last segment has no successor to bound it: Kafka's rule (last offset - base offset fits an int32)
    # still does. 0x80 in byte 4 is offset 2**31.
    directory = write_and_abandon(manager_factory, ONE_SEGMENT, 1)
    garble(directory / "00000000000000000000.log", 4, b"\x80")
    log = manager_factory(ONE_SEGMENT).get_log("t", 0)
    assert log.log_end_offset == 0


def test_a_garbled_first_batch_followed_by_its_successors_is_the_one_cut(manager_factory):
    # The saved stateful example: the last segment's first batch garbled, the batches after it intact. They
    # go back below its claimed end but continue the segment's base offset: the first batch is the outlier.
    directory = write_and_abandon(manager_factory, ONE_SEGMENT, 3)
    garble(directory / "00000000000000000000.log", 4, b"\x3c")
    manager = manager_factory(ONE_SEGMENT)
    log = manager.get_log("t", 0)
    assert log.log_end_offset == 0
    assert manager.startup_stats["bytes_discarded"] > 0


def test_a_base_offset_garbled_lower_cuts_at_that_batch_and_keeps_the_ones_before(manager_factory):
    # Four 2-record batches (offsets 0, 2, 4, 6); the third one's low byte made 0: it goes back below the
    # second one's end, and does not continue the first one's either, so it is the outlier.
    directory = write_and_abandon(manager_factory, ONE_SEGMENT, 4, values=2)
    path = directory / "00000000000000000000.log"
    third = batch_positions(path)[2]
    garble(path, third + 7, b"\x00")
    log = manager_factory(ONE_SEGMENT).get_log("t", 0)
    assert log.log_end_offset == 4
    headers = list(log.batch_headers(0))
    assert [h.base_offset for h in headers] == [0, 2]


def test_a_base_offset_garbled_slightly_higher_is_cut_where_its_successor_continues(manager_factory):
    # Offsets 0, 2, 4, 6; the second batch claims 3 (records 3..4): the third, at 4, goes back into it but
    # continues the second one's records placed at offset 2, so the second batch is the outlier.
    directory = write_and_abandon(manager_factory, ONE_SEGMENT, 4, values=2)
    path = directory / "00000000000000000000.log"
    garble(path, batch_positions(path)[1] + 7, b"\x03")
    log = manager_factory(ONE_SEGMENT).get_log("t", 0)
    assert log.log_end_offset == 2
    assert [h.base_offset for h in log.batch_headers(0)] == [0]


def test_a_prepared_segment_adopted_for_a_garbled_base_offset_is_removed(manager_factory):
    # A roll whose renames never ran leaves the new segment as prepared-*.log; start-up adopts it under its
    # first batch's base offset. Garbled, that name is 0x3c000000 + 2: recovery cuts the segment at that
    # batch (the next one continues offset 2), and the empty segment it leaves must not set the log end.
    directory = write_and_abandon(manager_factory, SMALL_SEGMENTS, 4)  # segments 0 (offsets 0, 1) and 2 (2, 3)
    bases = sorted(int(path.name[:20]) for path in directory.glob("*.log"))
    assert bases == [0, 2]
    second = directory / f"{bases[1]:020d}.log"
    for suffix in (".index", ".timeindex"):
        (directory / f"{bases[1]:020d}{suffix}").unlink(missing_ok=True)
    prepared = directory / "prepared-0.log"
    second.rename(prepared)
    garble(prepared, 4, b"\x3c")
    log = manager_factory(SMALL_SEGMENTS).get_log("t", 0)
    assert log.log_end_offset == 2
    assert log.segment_base_offsets() == [0]


def test_inspect_reports_a_garbled_base_offset_as_an_error(manager_factory):
    directory = write_and_abandon(manager_factory, SMALL_SEGMENTS, 3)
    garble(directory / "00000000000000000000.log", 3, b"\x01")
    done = subprocess.run([sys.executable, "-m", "copyless", "inspect", "--data-dir", str(directory.parent)],
                          capture_output=True, text=True, timeout=120, env=python_env())
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "ERROR" in done.stdout and "00000000000000000000.log" in done.stdout, done.stdout
    assert "4294967296" in done.stdout, done.stdout
