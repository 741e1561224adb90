"""A follower's append: the leader's batches stored as they are (offsets, leader epochs, timestamps, CRCs),
each checked before anything is appended, the first one at the follower's log end.

The leader here is a real PartitionLog; what the follower receives is what the leader's read hands out (the
bytes a replica fetch sends with sendfile), cut into fetch-sized pieces.
"""

from __future__ import annotations

import pytest

from copyless.broker.storage import LogConfig, UnexpectedAppendOffsetError
from copyless.protocol.records import InvalidBatchError, iter_batches, set_base_offset
from tests.support.batches import build_batch, records_of
from tests.support.blocking_appends import append_as_follower_blocking, append_blocking

CONFIG = LogConfig(segment_bytes=8 << 10, segment_index_bytes=1024, index_interval_bytes=256, retention_ms=None)


def leader_bytes(partition_log, start: int = 0, max_bytes: int = 1 << 30) -> bytes:
    """Every batch from ``start`` to the log end, read the way a replica fetch reads (whole batches)."""
    out = b""
    offset = start
    while offset < partition_log.log_end_offset:
        result = partition_log.read(offset, max_bytes)
        with result.slice as region:
            data = region.read_bytes()
        out += data
        offset = [header for _, header in iter_batches(data)][-1].next_offset
    return out


def fill_leader(partition_log, count: int) -> None:
    for number in range(count):
        epoch = 1 if number < count // 2 else 3
        append_blocking(partition_log, build_batch([f"r{number}-{i}".encode() * 20 for i in range(number % 3 + 1)],
                                         [10_000 + number] * (number % 3 + 1), codec=number % 2),
                             leader_epoch=epoch, log_append_time_ms=50_000 + number if number % 5 == 0 else None)


def test_the_follower_stores_the_leaders_batches_byte_for_byte_across_its_own_rolls(manager_factory):
    leader = manager_factory(CONFIG).create_log("leader", 0)
    fill_leader(leader, 120)
    follower = manager_factory(CONFIG, directory=leader.directory.parent.parent / "follower").create_log("f", 0)
    offset = 0
    while offset < leader.log_end_offset:
        # A replica fetch of at most 1.5 KiB at the follower's log end, as the fetcher sends it.
        result = leader.read(follower.log_end_offset, 1536)
        with result.slice as region:
            fetched = bytearray(region.read_bytes())  # the fetcher's receive buffer
        appended = append_as_follower_blocking(follower, fetched)
        headers = [header for _, header in iter_batches(fetched)]
        assert appended.first_offset == offset and appended.last_offset == headers[-1].last_offset
        assert [(base, header) for base, header in appended.headers] == [(h.base_offset, h) for h in headers]
        offset = follower.log_end_offset
    assert len(follower.segments) >= 3
    assert leader_bytes(follower) == leader_bytes(leader)
    assert follower.leader_epochs.entries() == leader.leader_epochs.entries() == [(1, 0), (3, 120)]


def test_a_corrupt_batch_anywhere_appends_nothing(manager_factory):
    leader = manager_factory(CONFIG).create_log("leader", 0)
    fill_leader(leader, 6)
    data = bytearray(leader_bytes(leader))
    follower = manager_factory(CONFIG, directory=leader.directory.parent.parent / "follower").create_log("f", 0)
    positions = [position for position, _ in iter_batches(data)]
    data[positions[3] + 70] ^= 0x40  # inside the fourth batch's records: its CRC no longer matches
    with pytest.raises(InvalidBatchError) as raised:
        append_as_follower_blocking(follower, data)
    assert raised.value.reason == "bad crc"
    assert follower.log_end_offset == 0 and follower.read(0, 1 << 20).slice is None


def test_batches_never_go_back_and_a_compacted_leaders_gaps_are_taken_at_their_offsets(manager_factory):
    leader = manager_factory(CONFIG).create_log("leader", 0)
    fill_leader(leader, 6)
    data = leader_bytes(leader)
    follower = manager_factory(CONFIG, directory=leader.directory.parent.parent / "follower").create_log("f", 0)
    positions = [position for position, _ in iter_batches(data)]
    back = bytearray(data)
    set_base_offset(back, positions[2], 0)  # baseOffset lies outside the CRC: only the offset check sees it
    with pytest.raises(InvalidBatchError) as raised:
        append_as_follower_blocking(follower, back)
    assert raised.value.reason == "bad offsets"
    assert follower.log_end_offset == 0
    # A gap between two batches (a leader's cleaner removed the records between): the run before it goes in.
    gap = bytearray(data)
    set_base_offset(gap, positions[2], 1000)
    run = append_as_follower_blocking(follower, gap)
    assert (run.first_offset, follower.log_end_offset) == (0, [h for _, h in iter_batches(data)][1].next_offset)
    # The next fetch starts past the gap: the log end moves over it and the batch keeps its offset.
    after = append_as_follower_blocking(follower, gap[positions[2]:positions[3]])
    assert after.first_offset == 1000 and follower.log_end_offset > 1000
    with pytest.raises(UnexpectedAppendOffsetError) as raised:
        append_as_follower_blocking(follower, data[positions[1]:])
    assert raised.value.first_offset < raised.value.log_end_offset
    follower = manager_factory(CONFIG, directory=leader.directory.parent.parent / "follower2").create_log("f", 0)
    # A fetch cut inside its last batch: the whole batches go in, the rest comes with the next fetch.
    cut = append_as_follower_blocking(follower, data[: positions[4] + 30])
    assert (cut.first_offset, follower.log_end_offset) == (0, [h for _, h in iter_batches(data)][3].next_offset)
    rest = append_as_follower_blocking(follower, data[positions[4]:])
    assert rest.first_offset == cut.last_offset + 1 and leader_bytes(follower) == data
    empty = append_as_follower_blocking(follower, b"")
    assert (empty.first_offset, empty.last_offset, empty.headers) == (follower.log_end_offset,
                                                                      follower.log_end_offset - 1, [])


def test_a_followers_log_reloads_with_the_leaders_epochs_and_timestamps(manager_factory, tmp_path):
    leader = manager_factory(CONFIG).create_log("leader", 0)
    fill_leader(leader, 40)
    follower_manager = manager_factory(CONFIG, directory=tmp_path / "follower")
    follower = follower_manager.create_log("f", 0)
    append_as_follower_blocking(follower, leader_bytes(leader))
    follower_manager.abandon()  # a kill -9: the next start recovers from the recovery point
    follower = manager_factory(CONFIG, directory=tmp_path / "follower").get_log("f", 0)
    assert follower.leader_epochs.entries() == [(1, 0), (3, 39)]
    got = [(r.offset, r.value, r.timestamp) for r in records_of(leader_bytes(follower))]
    assert got == [(r.offset, r.value, r.timestamp) for r in records_of(leader_bytes(leader))]
