"""The pre-fault window: which pages of a segment's map are faulted in, read from /proc/self/pagemap.

A page whose page-table entry is present was pre-faulted (or written); pre-faulting the whole segment up
front would show every page present. mincore() cannot tell: it reports pages in the page cache, and the
kernel's read-ahead puts neighbours of every touched page there.

Appends past the pre-faulted pages are written with pwrite, not faulted in through the map, and keep their
header rewrites.

The zeros a chase writes before it maps its pages: where the claims put them (a margin past the appends),
an append that must wait for a chunk being written over its range (forced with a chunk held mid-write), and
appends racing a chase on real threads with no margin at all, every byte kept.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from copyless.broker.storage import LogConfig
from copyless.broker.storage import prefault as prefault_module
from copyless.broker.storage import preparation as preparation_module
from copyless.broker.storage._fileops import map_address, preallocate
from copyless.protocol.records import LOG_OVERHEAD, decode_records, validate_batch
from tests.support.batches import build_batch
from tests.support.blocking_appends import append_blocking

PAGE = os.sysconf("SC_PAGE_SIZE")
KIB, MIB = 1 << 10, 1 << 20
WINDOW = 256 * KIB
SEGMENT = 4 * MIB
PRESENT = 1 << 63
CONFIG = LogConfig(segment_bytes=SEGMENT, segment_index_bytes=64 * KIB, retention_ms=None, segment_ms=None,
                   preallocate=True, prefault_window_bytes=WINDOW, outrun_pwrite=False)


def present_pages(region, start: int, end: int) -> list[bool]:
    """For each page of [start, end) of a map: is its page-table entry present?"""
    first = (map_address(region) + start) // PAGE
    count = (end - start) // PAGE
    with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
        raw = os.pread(pagemap.fileno(), 8 * count, 8 * first)
    return [bool(int.from_bytes(raw[i:i + 8], "little") & PRESENT) for i in range(0, len(raw), 8)]


def mapped_bytes(region, start: int, end: int) -> int:
    return sum(present_pages(region, start, end)) * PAGE


@pytest.fixture
def window_manager(manager_factory, monkeypatch):
    """Logs with whole-segment allocation and a fixed 256 KiB window (no rate-based growth). Appends that
    outrun the window fault their pages in here (outrun_pwrite off): these tests read which
    pages are mapped, and a page an append wrote with pwrite is cached but not mapped (the outrun tests
    below cover that path)."""
    monkeypatch.setattr(preparation_module, "WARM_AHEAD_MS", 0)
    return manager_factory(CONFIG)


@pytest.fixture
def window_log(window_manager):
    return window_manager.create_log("window", 0)


def append_batch(partition_log, number: int, value_bytes: int = 16 * KIB - 200) -> None:
    append_blocking(partition_log, build_batch([bytes([number % 251]) * value_bytes], [number]))


def append_until(partition_log, position: int) -> None:
    """Append 16 KiB batches until the active segment holds at least ``position`` bytes."""
    number = 0
    while partition_log.segments[-1].written_position < position:
        append_batch(partition_log, number)
        number += 1


def append_until_roll(partition_log) -> None:
    rolls = partition_log.stats["rolls"]
    number = 0
    while partition_log.stats["rolls"] == rolls:
        append_batch(partition_log, number)
        number += 1


def test_a_new_segment_is_pre_faulted_only_a_window_ahead(window_log):
    assert window_log.wait_warm(30)
    active = window_log.segments[-1]
    assert active.allocated_bytes == SEGMENT, "blocks are still reserved for the whole segment"
    assert mapped_bytes(active.map, 0, WINDOW) == WINDOW
    assert mapped_bytes(active.map, WINDOW, SEGMENT) == 0, "pre-faulted past the window"


def test_the_window_follows_the_appends_in_steps(window_log):
    active = window_log.segments[-1]
    append_until(window_log, 1 * MIB)
    assert window_log.wait_warm(30)
    written = active.written_position
    assert mapped_bytes(active.map, 0, written // PAGE * PAGE) == written // PAGE * PAGE
    # A refill is asked for once half the window is used: at least half a window ahead is warm, never more
    # than a whole window.
    ahead = present_pages(active.map, written // PAGE * PAGE, SEGMENT)
    warm_ahead = ahead.index(False) * PAGE if False in ahead else len(ahead) * PAGE
    assert WINDOW // 2 - PAGE <= warm_ahead <= WINDOW + PAGE
    assert not any(ahead[warm_ahead // PAGE:]), "pages past the window's end are mapped"
    assert active.prefault.position >= written + WINDOW // 2 - PAGE


def test_the_window_spills_into_the_next_segment_before_a_roll(window_log):
    active = window_log.segments[-1]
    append_until(window_log, SEGMENT - WINDOW // 4)
    assert window_log.wait_warm(30)
    prepared = window_log.next_segment
    assert prepared is not None and prepared.ready.is_set(), "the next segment is prepared before the roll"
    spill = prepared.prefault.position // PAGE * PAGE
    assert spill == WINDOW, "a whole window at the spare's head once the window reaches past the end"
    assert mapped_bytes(prepared.map, 0, spill) == spill
    assert mapped_bytes(prepared.map, spill + PAGE, SEGMENT) == 0, "the whole spare segment was pre-faulted"
    append_until_roll(window_log)
    assert window_log.stats["rolls"] == 1 and window_log.segments[-1] is not active
    new = window_log.segments[-1]
    assert new.prefault is prepared.prefault, "the window carries over the roll"
    append_until(window_log, 512 * KIB)
    assert window_log.wait_warm(30)
    assert mapped_bytes(new.map, 0, 512 * KIB) == 512 * KIB
    assert mapped_bytes(new.map, 512 * KIB + WINDOW + PAGE, SEGMENT) == 0


@pytest.mark.parametrize("prefault_bytes_per_ms", [1.0, 1e12])
def test_the_next_head_is_asked_for_as_early_as_pre_faulting_it_takes(window_log, monkeypatch,
                                                                       prefault_bytes_per_ms):
    # Pre-faulting measured far slower than the appends (1 byte per ms): the spare's head is asked for as
    # soon as the spare exists, not half a window before the end, where it could not finish by the roll.
    # Measured far faster: only once the room left is under half a window.
    monkeypatch.setattr(prefault_module, "_prefault_bytes_per_ms", prefault_bytes_per_ms)
    active = window_log.segments[-1]
    number = 0
    while window_log.next_segment is None:
        append_batch(window_log, number)
        number += 1
    append_batch(window_log, number)
    prepared = window_log.next_segment
    room = SEGMENT - active.written_position
    assert room > WINDOW, "the spare was prepared only at the segment's very end"
    assert window_log.wait_warm(30)
    if prefault_bytes_per_ms < 1e6:
        assert prepared.prefault.position // PAGE * PAGE == WINDOW
        assert mapped_bytes(prepared.map, 0, WINDOW) == WINDOW
    else:
        assert prepared.prefault.target == 0
        assert mapped_bytes(prepared.map, 0, SEGMENT) == 0
    assert prefault_module.prefault_bytes_per_ms() == prefault_bytes_per_ms, "steps this short are not timed"


def test_a_reopened_active_segment_gets_a_window(window_manager, window_log, manager_factory):
    append_until(window_log, 1 * MIB)
    written = window_log.segments[-1].written_position
    window_manager.shutdown()
    reopened = manager_factory(CONFIG, directory=window_manager.data_dir).get_log("window", 0)
    assert reopened.wait_warm(30)
    active = reopened.segments[-1]
    assert active.written_position == written
    start = (written + PAGE - 1) // PAGE * PAGE
    assert mapped_bytes(active.map, start, start + WINDOW - 2 * PAGE) == WINDOW - 2 * PAGE
    assert mapped_bytes(active.map, written + WINDOW + PAGE, SEGMENT) == 0


@pytest.mark.parametrize("idle_s", [0.0, 60.0])
def test_a_paused_log_pre_faults_only_the_floor_past_its_write_position(manager_factory, monkeypatch, idle_s):
    # A window sized by the append rate (10 s of it: the whole segment) against the floor (256 KiB). While
    # the appends keep coming (idle after 60 s) the chase runs to the window's end; once they have paused
    # (idle after 0 s: at once) it stops a floor past the write position, and gives the rest of its target
    # back so that the next append asks again.
    monkeypatch.setattr(preparation_module, "WARM_AHEAD_MS", 10_000)
    monkeypatch.setattr(prefault_module, "PREFAULT_IDLE_S", idle_s)
    paused_log = manager_factory(CONFIG).create_log("paused", 0)
    assert paused_log.wait_warm(30)
    active = paused_log.segments[-1]
    append_until(paused_log, 1 * MIB)
    assert paused_log.wait_warm(30)
    written = active.written_position
    floor_end = (written + WINDOW) // PAGE * PAGE + PAGE
    beyond = mapped_bytes(active.map, floor_end, SEGMENT)
    if idle_s:
        assert beyond == SEGMENT - floor_end, "the chase stopped short of a window the appends asked for"
    else:
        assert beyond == 0, "pre-faulted past the floor after the appends paused"
        assert written <= active.prefault.target <= written + WINDOW + PAGE
        assert mapped_bytes(active.map, written // PAGE * PAGE + PAGE, written + WINDOW - PAGE) > 0
        # The next append asks again, and gets the floor past its new write position.
        append_batch(paused_log, 10_000)
        assert paused_log.wait_warm(30)
        assert active.prefault.position >= written + WINDOW


def test_a_chase_stops_at_its_lead_and_gives_the_rest_of_its_target_back(tmp_path):
    fd = os.open(tmp_path / "segment", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        preallocate(fd, 8 * MIB)
        region = mmap.mmap(fd, 8 * MIB)
        prefault = prefault_module.Prefault()
        assert prefault.want(6 * MIB)
        prefault.chase(region, fd, lambda: 8 * MIB, lead=lambda: 2 * MIB)
        assert prefault.idle.is_set() and prefault.position == 2 * MIB and prefault.target == 2 * MIB
        # The first MiB lies within the zeros' margin of the appends (at 0): left to them (pwrite).
        warm = prefault_module.ZERO_MARGIN_BYTES
        assert prefault.warm_from == warm and not any(present_pages(region, 0, warm))
        assert all(present_pages(region, warm, 2 * MIB)) and not any(present_pages(region, 2 * MIB, 8 * MIB))
        assert prefault.want(6 * MIB), "a new chase may be queued for what was given back"
        prefault.chase(region, fd, lambda: 8 * MIB, lead=lambda: 8 * MIB)
        assert prefault.position == 6 * MIB and all(present_pages(region, warm, 6 * MIB))
        region.close()
    finally:
        os.close(fd)


class RecordingExecutor(ThreadPoolExecutor):
    """A real one-thread executor that remembers which ranges were handed to it."""

    def __init__(self) -> None:
        super().__init__(1)
        self.ranges: list[tuple[int, int]] = []

    def submit(self, function, *args, **kwargs):
        _region, _fd, start, end = args[:4]
        self.ranges.append((start, end))
        return super().submit(function, *args, **kwargs)


def test_a_chase_far_behind_hands_half_of_each_step_to_the_helper(tmp_path, monkeypatch):
    monkeypatch.setattr(prefault_module, "PREFAULT_SPLIT_BYTES", 1 * MIB)
    fd = os.open(tmp_path / "segment", os.O_RDWR | os.O_CREAT, 0o644)
    helper = RecordingExecutor()
    try:
        preallocate(fd, 8 * MIB)
        region = mmap.mmap(fd, 8 * MIB)
        prefault = prefault_module.Prefault()
        assert prefault.want(6 * MIB)
        prefault.chase(region, fd, lambda: 8 * MIB, helper=helper)
        assert prefault.idle.is_set() and prefault.position == 6 * MIB
        assert helper.ranges == [(3 * MIB, 6 * MIB)]
        warm = prefault_module.ZERO_MARGIN_BYTES  # below it: the appends' pages (the zeros' margin)
        assert prefault.warm_from == warm and not any(present_pages(region, 0, warm))
        assert all(present_pages(region, warm, 6 * MIB)) and not any(present_pages(region, 6 * MIB, 8 * MIB))
        # A step below the split stays on the chasing thread.
        assert prefault.want(6 * MIB + 512 * KIB)
        prefault.chase(region, fd, lambda: 8 * MIB, helper=helper)
        assert helper.ranges == [(3 * MIB, 6 * MIB)]
        assert all(present_pages(region, 6 * MIB, 6 * MIB + 512 * KIB))
        assert not any(present_pages(region, 6 * MIB + 512 * KIB, 8 * MIB))
        region.close()
    finally:
        helper.shutdown()
        os.close(fd)


def vm_flags_of(path) -> set[str]:
    """The VmFlags /proc/self/smaps shows for this process's map of ``path``."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for number, line in enumerate(lines):
        if line.endswith(" " + str(path)):
            for following in lines[number + 1:]:
                if following.startswith("VmFlags:"):
                    return set(following.split()[1:])
    raise AssertionError(f"no map of {path}")


def test_an_active_segment_map_reads_no_pages_around_a_fault(window_manager, window_log):
    # "rr" is VM_RAND_READ (MADV_RANDOM): a fault reads no window around itself, so no readahead runs past
    # the committed end into the preallocated tail (8 MiB per fault with this disk's read_ahead_kb).
    append_until(window_log, 64 * KIB)
    assert "rr" in vm_flags_of(window_log.segments[-1].log_path)
    append_until_roll(window_log)
    window_manager.wait_for_background()  # the new segment's files have their final names
    assert "rr" in vm_flags_of(window_log.segments[-1].log_path)


# --- appends that outrun the pre-fault ----------------------------------------------------------------------


def read_back(partition_log) -> tuple[list[tuple[int, int, int]], list[bytes]]:
    """(baseOffset, attributes, maxTimestamp) of every batch of the log, each validated (CRC included), and
    every record's value, read from the file (pread)."""
    headers, values = [], []
    offset = 0
    while offset < partition_log.log_end_offset:
        with partition_log.read(offset, 1 << 30).slice as region:
            data = region.read_bytes()
        position = 0
        while position < len(data):
            header = validate_batch(data, position)
            headers.append((header.base_offset, header.attributes, header.max_timestamp))
            values += [record.value for record in decode_records(data, position)]
            position += header.batch_length + LOG_OVERHEAD
            offset = header.base_offset + header.last_offset_delta + 1
    return headers, values


@pytest.mark.parametrize("log_append_time", [False, True])
def test_appends_past_the_pre_faulted_pages_are_written_not_faulted_in(window_manager, monkeypatch,
                                                                        log_append_time):
    """A window pre-faulted, its chases then stopped: appends inside it are copied into the map; those past
    it are written with pwrite (counted), their pages cached but not mapped, and their headers rewritten in
    the map all the same (offsets; with LogAppendTime, the timestamp and a CRC recomputed over pwrite'd
    bytes)."""
    partition_log = window_manager.create_log("outrun", 0, dataclasses.replace(CONFIG, outrun_pwrite=True))
    assert partition_log.wait_warm(30)
    active = partition_log.segments[-1]
    active.prefault.stopped = True  # no chase moves the pre-faulted end from here on
    pre_faulted = active.prefault.position
    assert pre_faulted >= WINDOW - PAGE
    outrun = prefault_module.PREFAULT_STATS["outrun_bytes"]
    expected_outrun = 0
    append_time = 1_700_000_000_000 if log_append_time else None
    number = 0
    while active.written_position < 1 * MIB:
        start = active.written_position
        append_blocking(partition_log, build_batch([bytes([number % 251]) * (16 * KIB - 200)], [number]),
                             log_append_time_ms=append_time)
        if active.written_position > pre_faulted or start < active.prefault.warm_from:
            expected_outrun += active.written_position - start
        number += 1
    assert prefault_module.PREFAULT_STATS["outrun_bytes"] - outrun == expected_outrun > 512 * KIB
    # Copied into the map below the pre-faulted end; past it only the header pages were touched through the
    # map: a 16 KiB batch spans four pages, and the middle ones of every batch stay unmapped. (A LogAppendTime
    # CRC reads the whole batch through the map, which maps its pages without allocating any.)
    # Below warm_from, pages within the zeros' margin of the first append: left to the appends' pwrite.
    warm_from = active.prefault.warm_from
    assert warm_from <= prefault_module.ZERO_MARGIN_BYTES + 2 * PAGE
    assert all(present_pages(active.map, -(-warm_from // PAGE) * PAGE, pre_faulted // PAGE * PAGE))
    if not log_append_time:
        past = present_pages(active.map, pre_faulted // PAGE * PAGE + 4 * PAGE,
                             active.written_position // PAGE * PAGE)
        assert sum(past) < len(past) // 2, "pages past the pre-fault were faulted in, not written"
    headers, values = read_back(partition_log)
    assert [base for base, _, _ in headers] == list(range(number))
    assert values == [bytes([n % 251]) * (16 * KIB - 200) for n in range(number)]
    if log_append_time:
        assert all(attributes & 0x08 and timestamp == append_time for _, attributes, timestamp in headers)
    else:
        assert [timestamp for _, _, timestamp in headers] == list(range(number))


# --- zeros ahead of the appends ----------------------------------------------------------------------------


@pytest.fixture
def segment_file(tmp_path):
    """An 8 MiB preallocated file and its shared map."""
    fd = os.open(tmp_path / "segment", os.O_RDWR | os.O_CREAT, 0o644)
    preallocate(fd, 8 * MIB)
    region = mmap.mmap(fd, 8 * MIB)
    try:
        yield fd, region
    finally:
        region.close()
        os.close(fd)


def test_a_chase_writes_zeros_then_maps_the_pages(segment_file, monkeypatch):
    fd, region = segment_file
    zeroed = prefault_module.PREFAULT_STATS["zeroed_bytes"]
    prefault = prefault_module.Prefault()
    assert prefault.want(6 * MIB)
    prefault.chase(region, fd, lambda: 8 * MIB)
    assert prefault.method == "zeros+madvise"
    # Nothing has been appended: zeros go from the margin past position 0 to the target.
    margin = prefault_module.ZERO_MARGIN_BYTES
    assert prefault_module.PREFAULT_STATS["zeroed_bytes"] - zeroed == 6 * MIB - margin
    # The margin's pages are left to the appends, which write below warm_from with pwrite.
    assert prefault.warm_from == margin and not any(present_pages(region, 0, margin))
    assert all(present_pages(region, margin, 6 * MIB)) and not any(present_pages(region, 6 * MIB, 8 * MIB))
    assert region[:6 * MIB] == bytes(6 * MIB)
    prefault.zeros = False
    assert prefault.want(7 * MIB)
    prefault.chase(region, fd, lambda: 8 * MIB)
    assert prefault.method == "madvise"
    assert prefault_module.PREFAULT_STATS["zeroed_bytes"] - zeroed == 6 * MIB - prefault_module.ZERO_MARGIN_BYTES
    assert all(present_pages(region, 6 * MIB, 7 * MIB))


def test_zeros_are_claimed_only_past_the_appends_by_the_margin(segment_file):
    prefault = prefault_module.Prefault()
    prefault.begin_append(0, 5000)
    margin = prefault_module.ZERO_MARGIN_BYTES
    first_page = (5000 + margin + PAGE - 1) // PAGE * PAGE
    claim = prefault.claim(0, 8 * MIB)
    assert claim == (first_page, 8 * MIB)
    prefault.release(claim)
    assert prefault.claim(0, first_page) is None, "nothing of the range is far enough past the appends"
    prefault.begin_append(5000, 400 * KIB)
    assert prefault.claim(0, 2 * MIB) == (400 * KIB + margin, 2 * MIB)
    prefault.release((400 * KIB + margin, 2 * MIB))
    # An append of 2 MiB (one produce request of librdkafka's largest batches) widens the margin to twice
    # its size, and it shrinks by an eighth per append after it.
    prefault.begin_append(400 * KIB, 400 * KIB + 2 * MIB)
    assert prefault.claim(0, 8 * MIB) == (400 * KIB + 6 * MIB, 8 * MIB)
    prefault.release((400 * KIB + 6 * MIB, 8 * MIB))
    prefault.begin_append(400 * KIB + 2 * MIB, 400 * KIB + 2 * MIB + 100)
    assert prefault.claim(0, 8 * MIB) == (400 * KIB + 2 * MIB + 4096 + 2 * (2 * MIB - 2 * MIB // 8), 8 * MIB)
    # The log sets a margin of ZERO_MARGIN_MS of its append rate; the largest of the three counts.
    prefault.rate_margin = 5 * MIB
    assert prefault.claim(0, 8 * MIB) == (400 * KIB + 2 * MIB + 4096 + 5 * MIB, 8 * MIB)


def test_an_append_waits_for_the_zero_chunk_it_overlaps(segment_file, monkeypatch):
    """The race the claims exist for, forced: a chunk of zeros is held mid-write while an append wants to copy
    into the same pages. The append is told to wait (a future, which the loop awaits instead of blocking)
    and copies only once the chunk is released; copied before, the zeros written after it would wipe it."""
    fd, region = segment_file
    monkeypatch.setattr(prefault_module, "ZERO_MARGIN_BYTES", 0)
    monkeypatch.setattr(prefault_module, "ZERO_MARGIN_APPENDS", 0)
    writing, resume = threading.Event(), threading.Event()
    real_write_zeros = prefault_module.write_zeros

    def held_write_zeros(fd_, start, end):
        writing.set()
        assert resume.wait(30)
        real_write_zeros(fd_, start, end)

    monkeypatch.setattr(prefault_module, "write_zeros", held_write_zeros)
    waits = prefault_module.PREFAULT_STATS["append_waits"]
    prefault = prefault_module.Prefault()
    assert prefault.want(2 * MIB)
    chase = threading.Thread(target=prefault.chase, args=(region, fd, lambda: 8 * MIB))
    chase.start()
    assert writing.wait(30), "the chase claimed its first chunk"
    assert prefault._claims == [(0, 1 * MIB)]
    data = bytes(range(1, 256)) * 64

    released = prefault.begin_append(0, len(data))
    assert released is not None, "the append may not copy into pages a chunk of zeros is being written over"
    assert not released.done()
    resume.set()
    released.result(30)
    assert prefault.begin_append(0, len(data)) is None
    region[0:len(data)] = data
    chase.join(30)
    assert not chase.is_alive()
    assert prefault_module.PREFAULT_STATS["append_waits"] == waits + 1
    assert region[0:len(data)] == data, "the appended bytes survived the zeros"
    assert os.pread(fd, len(data), 0) == data
    # The chunk after it was claimed past the append's end, not over it.
    assert prefault.position == 2 * MIB and not prefault._claims


def test_appends_racing_a_chase_keep_every_byte(segment_file, monkeypatch):
    """Real threads, no holds: one chase zeroes page-sized chunks right behind the appends (margin 0) while
    this thread appends odd-sized runs; every appended byte must be in the file afterwards."""
    fd, region = segment_file
    monkeypatch.setattr(prefault_module, "ZERO_MARGIN_BYTES", 0)
    monkeypatch.setattr(prefault_module, "ZERO_MARGIN_APPENDS", 0)
    monkeypatch.setattr(prefault_module, "ZERO_CHUNK_BYTES", PAGE)
    rng = random.Random(7)
    prefault = prefault_module.Prefault()
    written = 0
    model = bytearray()
    with ThreadPoolExecutor(1) as warm:
        while written < 7 * MIB:
            if prefault.want(min(8 * MIB, written + 1 * MIB)):
                # late binding on purpose: the chase reads how far the writes below have got
                warm.submit(prefault.chase, region, fd, lambda: 8 * MIB, lambda: written)  # noqa: B023
            size = rng.choice((100, 1000, 5000, 40_000))
            data = rng.randbytes(size)
            released = prefault.begin_append(written, written + size)
            while released is not None:  # a zero chunk over the range: wait for it, as the loop awaits
                released.result(30)
                released = prefault.begin_append(written, written + size)
            region[written:written + size] = data
            model += data
            written += size
        assert prefault.idle.wait(30)
    assert region[:written] == model
    assert prefault_module.PREFAULT_STATS["zeroed_bytes"] > 0


def test_a_step_starting_inside_a_page_leaves_no_gap(segment_file):
    """Only pages within the zeros' margin of the appends are left to them: a step that starts inside a page
    (targets follow the appends' byte positions) zeros from the next page boundary, and the page it starts
    in was mapped by the step before, so warm_from stays where the margin put it."""
    fd, region = segment_file
    prefault = prefault_module.Prefault()
    assert prefault.want(3 * MIB + 100)
    prefault.chase(region, fd, lambda: 8 * MIB)
    warm = prefault.warm_from
    assert warm == prefault_module.ZERO_MARGIN_BYTES
    assert prefault.want(7 * MIB)
    prefault.chase(region, fd, lambda: 8 * MIB)
    assert prefault.position == 7 * MIB and prefault.warm_from == warm
    assert all(present_pages(region, warm, 7 * MIB))
