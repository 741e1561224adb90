"""The leader epoch cache and the high watermark a log keeps for replication.

The cache's rules are Kafka's LeaderEpochFileCache (KIP-101/279): entries (epoch, start offset) strictly
increasing in both, OffsetForLeaderEpoch answered from them, the ``leader-epoch-checkpoint`` file in
Kafka's text format, and a file that never disagrees with the log after a restart (rebuilt from the batch
headers when missing, unreadable or behind). The high watermark is set by the partition layer, written to
the data dir's ``high-watermark-checkpoint`` and restored clamped to the log.
"""

from __future__ import annotations

from copyless.broker.storage import LogConfig
from copyless.broker.storage.checkpoint import read_checkpoint
from copyless.broker.storage.leader_epoch_cache import LeaderEpochCache
from copyless.protocol.records import iter_batches
from tests.support.batches import build_batch, records_of
from tests.support.blocking_appends import append_blocking
from tests.support.polling import wait_until


def append(partition_log, count: int, *, epoch: int = 0, size: int = 50) -> None:
    for number in range(count):
        append_blocking(partition_log, build_batch([bytes([65 + number % 26]) * size], [number]), leader_epoch=epoch)


def test_assign_is_idempotent_and_drops_entries_the_new_one_contradicts(tmp_path):
    cache = LeaderEpochCache(tmp_path / "leader-epoch-checkpoint")
    assert cache.latest_epoch() == -1 and cache.entries() == []
    assert cache.assign(0, 0) and cache.assign(2, 10)
    assert not cache.assign(2, 15) and not cache.assign(2, 10)  # the same epoch, later: nothing to record
    assert cache.assign(5, 20) and cache.entries() == [(0, 0), (2, 10), (5, 20)]
    # A new epoch starting below the latest entry: the entries at or after its start describe records that
    # are gone (Kafka drops such non-monotonic entries).
    assert cache.assign(6, 12)
    assert cache.entries() == [(0, 0), (2, 10), (6, 12)]
    # A leadership that wrote nothing here (epoch 6 at 12), overtaken by epoch 2's records fetched from the
    # new leader at offset 12: epoch 2 simply runs on.
    assert cache.assign(2, 12)
    assert cache.entries() == [(0, 0), (2, 10)]
    assert not cache.assign(-1, 30) and cache.entries() == [(0, 0), (2, 10)]


def test_end_offset_for_follows_kip_101_and_279(tmp_path):
    cache = LeaderEpochCache(tmp_path / "leader-epoch-checkpoint")
    assert cache.end_offset_for(0, 10) == (-1, -1)  # nothing known
    for epoch, start in ((1, 0), (3, 40), (4, 70)):
        cache.assign(epoch, start)
    assert cache.end_offset_for(4, 95) == (4, 95)  # the latest epoch ends at the log end
    assert cache.end_offset_for(3, 95) == (3, 70)  # an earlier one at the next entry's start
    assert cache.end_offset_for(2, 95) == (1, 40)  # unknown epoch: the largest one below it
    assert cache.end_offset_for(0, 95) == (0, 0)  # below the first entry: it ends where that one starts
    assert cache.end_offset_for(9, 95) == (-1, -1)  # newer than anything here
    assert cache.end_offset_for(-1, 95) == (-1, -1)


def test_truncation_from_either_end(tmp_path):
    cache = LeaderEpochCache(tmp_path / "leader-epoch-checkpoint")
    for epoch, start in ((1, 0), (3, 40), (4, 70), (6, 90)):
        cache.assign(epoch, start)
    cache.truncate_from_end(70)
    assert cache.entries() == [(1, 0), (3, 40)]
    cache.truncate_from_start(55)
    assert cache.entries() == [(3, 55)]
    cache.truncate_from_start(10)
    assert cache.entries() == [(3, 55)]
    cache.clear()
    assert cache.entries() == [] and cache.latest_epoch() == -1


def test_checkpoint_file_is_kafkas_text_format_written_in_the_background(manager_factory):
    manager = manager_factory()
    partition_log = manager.create_log("epochs", 0)
    append(partition_log, 3, epoch=0)
    append(partition_log, 2, epoch=4)
    path = partition_log.directory / "leader-epoch-checkpoint"
    # The appends recorded the epochs in memory; a flush thread writes the file without being asked.
    wait_until(lambda: path.exists() and path.read_text() == "0\n2\n0 0\n4 3\n", what="the epoch checkpoint",
               timeout_s=10)
    partition_log.leader_epochs.assign(7, partition_log.log_end_offset)  # what a new leader records
    wait_until(lambda: path.read_text() == "0\n3\n0 0\n4 3\n7 5\n", what="the new leader's epoch on disk",
               timeout_s=10)
    manager.shutdown()
    reopened = manager_factory().get_log("epochs", 0)
    # A leadership with no record yet is not kept past a restart (Kafka drops entries at the log end).
    assert reopened.leader_epochs.entries() == [(0, 0), (4, 3)]
    assert reopened.leader_epochs.end_offset_for(0, reopened.log_end_offset) == (0, 3)


def test_a_missing_or_corrupt_checkpoint_is_rebuilt_from_the_batch_headers(manager_factory):
    manager = manager_factory()
    partition_log = manager.create_log("legacy", 0)
    append(partition_log, 20, size=4000)  # several segments of epoch 0: a log from before the cache
    append(partition_log, 5, epoch=2, size=4000)
    directory = partition_log.directory
    assert len(partition_log.segments) > 1
    manager.shutdown()
    (directory / "leader-epoch-checkpoint").unlink()
    manager = manager_factory()
    assert manager.get_log("legacy", 0).leader_epochs.entries() == [(0, 0), (2, 20)]
    manager.shutdown()
    assert (directory / "leader-epoch-checkpoint").read_text() == "0\n2\n0 0\n2 20\n"
    for garbage in ("0\n3\n0 0\n2 20\n", "1\n1\n0 0\n", "0\n2\n2 0\n1 20\n", "not a checkpoint"):
        (directory / "leader-epoch-checkpoint").write_text(garbage)
        manager = manager_factory()
        assert manager.get_log("legacy", 0).leader_epochs.entries() == [(0, 0), (2, 20)], garbage
        manager.shutdown()


def test_after_a_crash_the_cache_agrees_with_the_recovered_log(manager_factory):
    manager = manager_factory()
    partition_log = manager.create_log("crashy", 0)
    append(partition_log, 4, epoch=1)
    assert partition_log.flush().result(timeout=30) == 4  # a flush writes the epochs before the recovery point
    manager.checkpoint_recovery_points()
    directory = partition_log.directory
    assert (directory / "leader-epoch-checkpoint").read_text() == "0\n1\n1 0\n"
    append(partition_log, 3, epoch=3)
    partition_log.leader_epochs.assign(5, partition_log.log_end_offset)
    manager.wait_for_background()
    manager.abandon()
    # As if the background write had not happened before the kill: the file lags the log.
    (directory / "leader-epoch-checkpoint").write_text("0\n1\n1 0\n")
    partition_log = manager_factory().get_log("crashy", 0)
    assert partition_log.log_end_offset == 7
    assert partition_log.leader_epochs.entries() == [(1, 0), (3, 4)]
    assert (directory / "leader-epoch-checkpoint").read_text() == "0\n2\n1 0\n3 4\n"


def test_the_high_watermark_is_checkpointed_and_restored_clamped_to_the_log(manager_factory):
    manager = manager_factory(background_interval_ms=20, offsets_checkpoint_interval_ms=50)
    partition_log = manager.create_log("hw", 0)
    append(partition_log, 6)
    assert partition_log.high_watermark == 0  # replication's: nothing set it yet
    partition_log.set_high_watermark(4)
    checkpoint = manager.data_dir / "high-watermark-checkpoint"
    wait_until(lambda: read_checkpoint(checkpoint).get(("hw", 0)) == 4, what="the high watermark written",
               timeout_s=10)
    manager.shutdown()
    partition_log = manager_factory().get_log("hw", 0)
    assert partition_log.high_watermark == 4 and partition_log.log_end_offset == 6


def test_a_high_watermark_past_the_recovered_log_is_clamped(manager_factory, tmp_path):
    manager = manager_factory()
    partition_log = manager.create_log("hw", 0)
    append(partition_log, 6)
    partition_log.set_high_watermark(6)
    manager.checkpoint_offsets()
    manager.abandon()
    # The checkpoint says 9: more than the log holds after the crash (its last batches never reached disk).
    (tmp_path / "data" / "high-watermark-checkpoint").write_text("0\n1\nhw 0 9\n")
    partition_log = manager_factory().get_log("hw", 0)
    assert partition_log.log_end_offset == 6 and partition_log.high_watermark == 6


def test_a_consumer_read_stops_at_the_high_watermark_on_whole_batches(manager_factory):
    partition_log = manager_factory(LogConfig(segment_bytes=64 << 10, retention_ms=None)).create_log("reads", 0)
    for number in range(4):  # batches of 3 records: offsets 0-2, 3-5, 6-8, 9-11
        append_blocking(partition_log, build_batch([b"x" * 20] * 3, [number] * 3))
    # A consumer fetch reads below the high watermark (Kafka's rule); a follower reads to the log end.
    for high_watermark, expected_end in ((6, 6), (7, 6), (12, 12), (3, 3)):
        result = partition_log.read(0, 1 << 20, max_offset=high_watermark)
        with result.slice as region:
            data = region.read_bytes()
        assert [r.offset for r in records_of(data)][-1] == expected_end - 1
        assert all(header.last_offset < high_watermark for _, header in iter_batches(data))
    assert partition_log.read(6, 1 << 20, max_offset=6).slice is None  # at the high watermark: nothing yet
    assert partition_log.read(7, 1 << 20, max_offset=7).slice is None  # its batch is not wholly below it
    follower = partition_log.read(6, 1 << 20)
    with follower.slice as region:
        assert [r.offset for r in records_of(region.read_bytes())] == list(range(6, 12))
