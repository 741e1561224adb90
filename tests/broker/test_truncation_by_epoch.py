"""Truncation by leader epoch over more than one round (KIP-279), on the replica fetcher's own code: a
follower whose latest epoch the leader never had cuts where its largest earlier epoch ends, then asks again,
until its epochs agree with the leader's. Leader epoch caches are the storage's own; the leader answers
OffsetForLeaderEpoch from its cache as the broker's handler does; no sockets, no etcd.

The case is the issue's: follower epochs [(0, 0), (2, 10)], leader [(0, 0), (1, 5), (3, 15)]. One round cut
the follower to 10 and left it holding epoch-0 records at 5-9 where the leader has epoch-1 ones."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from kio.schema.offset_for_leader_epoch.v3 import response as ofle

from copyless.broker.cluster.replica_fetcher import ReplicaFetcher, _Follow, truncation_step
from copyless.broker.partition import Partition, PartitionState, Role
from copyless.broker.storage.leader_epoch_cache import LeaderEpochCache

FOLLOWER, LEADER = 2, 1


class EpochLog:
    """The slice of PartitionLog the follower path uses: offsets, a real leader epoch cache, truncate_to."""

    def __init__(self, path, entries, log_end: int) -> None:
        self.leader_epochs = LeaderEpochCache(path)
        for epoch, start in entries:
            self.leader_epochs.assign(epoch, start)
        self.log_start_offset = 0
        self.log_end_offset = log_end
        self.high_watermark = 0
        self.cuts: list[int] = []

    def truncate_to(self, offset: int) -> None:  # worker thread, as in storage
        if offset < self.log_end_offset:
            self.cuts.append(offset)
            self.log_end_offset = offset
            self.leader_epochs.truncate_from_end(offset)

    def set_high_watermark(self, value: int) -> None:
        self.high_watermark = value


class Leader:
    """Answers OffsetForLeaderEpoch from its epoch cache (Partition.end_offset_for_epoch's rule)."""

    def __init__(self, log_: EpochLog) -> None:
        self.log = log_
        self.asked: list[int] = []

    async def request_kio(self, request, _response_cls):
        results = []
        for topic in request.topics:
            partitions = []
            for asked in topic.partitions:
                self.asked.append(asked.leader_epoch)
                epoch, end = self.log.leader_epochs.end_offset_for(asked.leader_epoch, self.log.log_end_offset)
                partitions.append(ofle.EpochEndOffset(error_code=0, partition=asked.partition, leader_epoch=epoch,
                                                      end_offset=end))
            results.append(ofle.OffsetForLeaderTopicResult(topic=topic.topic, partitions=tuple(partitions)))
        return ofle.OffsetForLeaderEpochResponse(throttle_time=0, topics=tuple(results))


def follower_partition(log_: EpochLog, epoch: int = 3) -> Partition:
    partition = Partition("t", 0, log_, node_id=FOLLOWER, producers=None, notifier=SimpleNamespace(notify=print))
    partition.make_follower(PartitionState(LEADER, epoch, (LEADER, FOLLOWER), (LEADER, FOLLOWER), version=5))
    return partition


def fetcher_for(partition: Partition) -> ReplicaFetcher:
    async def truncate(p, offset, leader_epoch):
        return await p.mutate_as_follower(leader_epoch, lambda: p.log.truncate_to(offset), lambda _r: None)

    broker = SimpleNamespace(node_id=FOLLOWER, replicas=SimpleNamespace(truncate=truncate))
    fetcher = ReplicaFetcher(broker, LEADER)
    return fetcher


async def truncate_until_done(fetcher: ReplicaFetcher, partition: Partition, leader: Leader) -> _Follow:
    """What the fetcher's loop does: truncate while the partition still needs it (bounded)."""
    follow = _Follow(partition, partition.leader_epoch)
    fetcher.partitions[partition.key] = follow
    for _round in range(10):
        if not follow.needs_truncation:
            return follow
        await fetcher._truncate(leader, [follow])
    raise AssertionError("truncation did not end in 10 rounds")


def test_a_follower_whose_latest_epoch_the_leader_never_had_truncates_until_the_epochs_agree(tmp_path):
    leader = Leader(EpochLog(tmp_path / "leader", [(0, 0), (1, 5), (3, 15)], log_end=25))
    follower_log = EpochLog(tmp_path / "follower", [(0, 0), (2, 10)], log_end=20)
    partition = follower_partition(follower_log)
    follow = asyncio.run(truncate_until_done(fetcher_for(partition), partition, leader))

    assert not follow.needs_truncation
    # Round 1 asks for epoch 2 (answered (1, 15): the follower has no epoch 1, so it cuts where its epoch 0
    # ends, 10); round 2 asks for epoch 0 (answered (0, 5)) and cuts to 5, where the logs agree.
    assert leader.asked == [2, 0]
    assert follower_log.cuts == [10, 5]
    assert follower_log.log_end_offset == 5
    assert [tuple(e) for e in follower_log.leader_epochs.entries()] == [(0, 0)]
    # From 5 on, fetching copies the leader's epoch-1 records: up to the log end both agree epoch by epoch.
    assert leader.log.leader_epochs.end_offset_for(0, 25) == (0, 5)


def test_a_follower_that_has_the_leaders_epoch_truncates_in_one_round(tmp_path):
    leader = Leader(EpochLog(tmp_path / "leader", [(0, 0), (2, 10), (4, 30)], log_end=40))
    follower_log = EpochLog(tmp_path / "follower", [(0, 0), (2, 10)], log_end=35)
    partition = follower_partition(follower_log, epoch=4)
    asyncio.run(truncate_until_done(fetcher_for(partition), partition, leader))
    assert leader.asked == [2]
    assert follower_log.cuts == [30]


@pytest.mark.parametrize("follower, leader, expected", [
    # (follower entries, follower log end), leader's answer -> (target, done)
    (([(0, 0), (2, 10)], 20), (1, 15), (10, False)),
    (([(0, 0)], 10), (0, 5), (5, True)),
    (([(0, 0), (2, 10)], 20), (2, 30), (20, True)),  # the leader has more of epoch 2: nothing to cut
    (([(0, 0), (2, 10)], 20), (-1, -1), (20, True)),  # the leader knows no epoch at or below ours
    (([(3, 7)], 20), (1, 15), (7, True)),  # ours starts later: the leader's epoch 1 ends before it
])
def test_truncation_step(tmp_path, follower, leader, expected):
    entries, log_end = follower
    cache = EpochLog(tmp_path / "f", entries, log_end).leader_epochs
    assert truncation_step(cache, log_end, *leader) == expected


def test_a_truncation_decided_under_an_old_epoch_does_not_run_after_the_role_changed(tmp_path):
    follower_log = EpochLog(tmp_path / "follower", [(0, 0), (2, 10)], log_end=20)
    partition = follower_partition(follower_log)

    async def scenario():
        partition.make_leader(PartitionState(FOLLOWER, 4, (FOLLOWER,), (LEADER, FOLLOWER), version=9))
        return await partition.mutate_as_follower(3, lambda: follower_log.truncate_to(5), lambda _r: None)

    assert asyncio.run(scenario()) is False
    assert follower_log.cuts == [] and partition.role is Role.LEADER
