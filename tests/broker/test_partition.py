"""The Partition core on its own (no sockets, no etcd): the ISR and high watermark rules, epoch fencing and
the acks=all waits, driven through the same calls the replica manager and the handlers make, with a
hypothesis state machine checking that the high watermark never goes back and never passes what the ISR
holds."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kio.schema.errors import ErrorCode

from copyless.broker.errors import (
    FencedLeaderEpoch,
    NotEnoughReplicas,
    NotLeaderOrFollower,
    RequestTimedOut,
    UnknownLeaderEpoch,
)
from copyless.broker.partition import Partition, PartitionState, Role
from copyless.broker.storage.errors import AppendNotReady, OffsetOutOfRangeError
from tests.support.batches import build_batch

LEADER, F1, F2 = 1, 2, 3


class FakeLog:
    """The slice of PartitionLog a Partition uses: offsets and the appends' results."""

    def __init__(self) -> None:
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.high_watermark = 0
        self.epochs: list[tuple[int, int]] = []
        self.config = SimpleNamespace(flush_mode="async")
        self.read_from: list[int] = []
        self.leader_epochs = SimpleNamespace(assign=lambda epoch, start: self.epochs.append((epoch, start)),
                                             latest_epoch=lambda: self.epochs[-1][0] if self.epochs else -1)

    def set_high_watermark(self, value: int) -> None:
        self.high_watermark = value

    def read(self, offset, max_bytes, *, min_one_message, max_offset=None):
        if not self.log_start_offset <= offset <= self.log_end_offset:
            raise OffsetOutOfRangeError(offset, self.log_start_offset, self.log_end_offset)
        self.read_from.append(offset)
        return SimpleNamespace(slice=None)

    def append(self, records, *, leader_epoch: int, log_append_time_ms=None):
        base = self.log_end_offset
        self.log_end_offset += records
        return SimpleNamespace(base_offset=base, last_offset=self.log_end_offset - 1, log_append_time_ms=-1,
                               log_start_offset=self.log_start_offset)


class FakeProducers:
    def check(self, topic, partition, header):
        return SimpleNamespace(error=ErrorCode.none, message=None, duplicate_of=None)

    def update(self, topic, partition, header, base_offset, timestamp=None):
        pass


class Notifier:
    def __init__(self) -> None:
        self.keys: list = []

    def notify(self, key) -> None:
        self.keys.append(key)


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000.0

    def __call__(self) -> float:
        return self.ms


def make(isr=(LEADER, F1, F2), epoch=3, lease=lambda: True):
    clock = Clock()
    partition = Partition("t", 0, FakeLog(), node_id=LEADER, producers=FakeProducers(), notifier=Notifier(),
                          lease_valid=lease, clock=clock)
    partition.replica_lag_time_max_ms = 10_000
    partition.make_leader(PartitionState(LEADER, epoch, tuple(isr), (LEADER, F1, F2), version=10))
    return partition, clock


async def append_async(partition: Partition, count: int = 1, acks: int = -1):
    return await partition.append_as_leader(count, SimpleNamespace(is_control=False, is_transactional=False,
                                                                   base_sequence=0), acks=acks)


def append(partition: Partition, count: int = 1, acks: int = -1):
    return asyncio.run(append_async(partition, count, acks))


def test_a_new_leader_records_its_epoch_at_the_log_end():
    partition, _ = make(epoch=7)
    assert partition.log.epochs == [(7, 0)]
    assert partition.role is Role.LEADER and partition.leader_epoch == 7


def test_the_high_watermark_is_the_smallest_log_end_over_the_isr():
    partition, _ = make()
    append(partition, 10)
    assert partition.high_watermark == 0
    partition.update_follower_fetch_state(F1, 10)
    assert partition.high_watermark == 0  # F2 has nothing yet
    partition.update_follower_fetch_state(F2, 4)
    assert partition.high_watermark == 4
    partition.update_follower_fetch_state(F2, 10)
    assert partition.high_watermark == 10
    assert partition.log.high_watermark == 10


def test_only_the_fetching_follower_can_join_the_isr():
    # F2 once fetched offset 0 and died; the idle partition's high watermark is still 0. A fetch from F1
    # must not carry F2 back into the ISR on its stale view.
    partition, _ = make(isr=(LEADER,))
    partition.update_follower_fetch_state(F2, 0)
    partition.update_follower_fetch_state(F1, 0)
    assert partition.isr_expansion(F1) == (LEADER, F1)
    assert partition.isr_expansion(LEADER) is None
    append(partition, 5, acks=1)
    assert partition.high_watermark == 5  # the ISR is the leader alone
    partition.update_follower_fetch_state(F1, 3)
    assert partition.isr_expansion(F1) is None  # below the high watermark


def test_a_follower_below_the_epoch_start_does_not_join():
    partition, _ = make(isr=(LEADER,))
    partition.log.log_end_offset = 20  # records from an earlier epoch
    partition.make_leader(PartitionState(LEADER, 9, (LEADER,), (LEADER, F1, F2), version=11))
    assert partition.epoch_start_offset == 20
    partition.update_follower_fetch_state(F1, 15)
    assert partition.isr_expansion(F1) is None
    partition.update_follower_fetch_state(F1, 20)
    assert partition.isr_expansion(F1) == (LEADER, F1)


def test_a_follower_that_stops_catching_up_is_shrunk_after_the_lag_time():
    partition, clock = make()
    append(partition, 3)
    partition.update_follower_fetch_state(F1, 3)
    partition.update_follower_fetch_state(F2, 1)
    clock.ms += 9_000
    assert partition.isr_shrink() is None
    clock.ms += 2_000
    partition.update_follower_fetch_state(F1, 3)  # F1 keeps fetching at the log end; F2 stays at 1
    partition.update_follower_fetch_state(F2, 1)
    assert partition.isr_shrink() == (LEADER, F1)


def test_while_an_isr_change_is_in_flight_the_high_watermark_counts_both_sets():
    partition, _ = make(isr=(LEADER,))
    partition.begin_isr_change((LEADER, F1))
    append(partition, 4)
    assert partition.high_watermark == 0  # F1 is counted, and it has nothing
    partition.update_follower_fetch_state(F1, 4)
    assert partition.high_watermark == 4
    partition.end_isr_change(PartitionState(LEADER, 3, (LEADER, F1), (LEADER, F1, F2), version=12))
    assert partition.isr == (LEADER, F1)


def test_a_follower_fetch_offset_past_the_log_end_is_refused_and_credits_nothing():
    partition, _ = make()
    append(partition, 10)
    partition.update_follower_fetch_state(F1, 10)
    with pytest.raises(OffsetOutOfRangeError):
        partition.update_follower_fetch_state(F2, 11)  # F2 claims a record the leader does not have
    assert partition.high_watermark == 0
    assert partition.followers[F2].log_end_offset == -1
    with pytest.raises(OffsetOutOfRangeError):
        partition.read_for_follower(F2, 1_000, 1 << 20, min_one_message=True)
    assert partition.high_watermark == 0
    partition.update_follower_fetch_state(F2, 10)
    assert partition.high_watermark == 10


class TimingOutStore:
    """A metadata store whose first ISR write commits but answers with a timeout (its outcome unknown to the
    leader); later calls wait for ``release``, so the test looks at the leader inside the window."""

    def __init__(self, isr, version: int) -> None:
        self.state = PartitionState(LEADER, 3, tuple(isr), (LEADER, F1, F2), version)
        self.release = asyncio.Event()
        self.calls: list[str] = []

    async def alter_isr(self, topic, partition, state, isr, joining_epochs=None):
        self.calls.append("alter_isr")
        if len(self.calls) > 1:
            await self.release.wait()
        if state.version != self.state.version:
            return None
        self.state = PartitionState(LEADER, 3, tuple(isr), self.state.replicas, self.state.version + 1)
        if len(self.calls) == 1:
            raise TimeoutError("etcd call deadline passed")
        return self.state

    async def read_partition_state(self, topic, partition):
        self.calls.append("read")
        await self.release.wait()
        return self.state


def test_an_isr_change_whose_write_timed_out_keeps_the_maximal_isr_until_a_definite_answer():
    """The write that adds F1 committed, but the leader only saw a timeout. Etcd lists F1 in the ISR, so F1
    may be elected next: until the leader knows, its high watermark must count F1, or it acknowledges
    records F1 does not have (KIP-497's maximal ISR)."""
    from copyless.broker.replica_manager import ReplicaManager

    partition, _ = make(isr=(LEADER,))
    store = TimingOutStore((LEADER,), version=10)

    async def scenario():
        manager = ReplicaManager(SimpleNamespace(node_id=LEADER, metadata=store))
        partition.update_follower_fetch_state(F1, 0)
        manager._change_isr(partition, (LEADER, F1), "caught up", {F1: 1})
        async with asyncio.timeout(5):  # the write is sent again after its unknown outcome
            while len(store.calls) < 2:
                await asyncio.sleep(0.01)
        assert manager.stats["isr_changes_unknown"] == 1
        await append_async(partition, 5, acks=1)
        assert partition.maximal_isr == (LEADER, F1)
        assert partition.high_watermark == 0, "records F1 lacks counted as replicated while etcd lists F1"
        store.release.set()
        async with asyncio.timeout(5):
            while partition.pending_isr is not None:
                await asyncio.sleep(0.01)
        return manager

    manager = asyncio.run(scenario())
    assert partition.isr == (LEADER, F1) and partition.state_version == 11
    assert partition.high_watermark == 0
    assert manager.stats["isr_expands"] == 1
    partition.update_follower_fetch_state(F1, 5)
    assert partition.high_watermark == 5


def test_a_newer_state_from_the_watch_answers_an_isr_change_of_unknown_outcome():
    partition, _ = make(isr=(LEADER,))
    partition.begin_isr_change((LEADER, F1))
    partition.make_leader(PartitionState(LEADER, 3, (LEADER,), (LEADER, F1, F2), version=10))
    assert partition.pending_isr == (LEADER, F1)  # the same state it was made from: no answer yet
    partition.make_leader(PartitionState(LEADER, 3, (LEADER, F1), (LEADER, F1, F2), version=12))
    assert partition.pending_isr is None and partition.isr == (LEADER, F1)


def test_epoch_fencing_follows_kip_320():
    partition, _ = make(epoch=5)
    partition.check_leader(-1)
    partition.check_leader(5)
    with pytest.raises(FencedLeaderEpoch):
        partition.check_leader(4)
    with pytest.raises(UnknownLeaderEpoch):
        partition.check_leader(6)


def test_a_broker_whose_lease_may_have_expired_refuses_to_lead():
    valid = [True]
    partition, _ = make(lease=lambda: valid[0])
    append(partition, 1)
    valid[0] = False
    with pytest.raises(NotLeaderOrFollower):
        append(partition, 1)


def test_acks_all_below_min_insync_replicas_is_refused_before_appending():
    partition, _ = make(isr=(LEADER,))
    partition.min_insync_replicas = 2
    with pytest.raises(NotEnoughReplicas):
        append(partition, 1)
    assert partition.log.log_end_offset == 0
    append(partition, 1, acks=1)
    assert partition.log.log_end_offset == 1


def test_acks_all_completes_when_the_high_watermark_passes_the_batch():
    async def scenario():
        partition, _ = make()
        info = await append_async(partition, 2)
        waiting = asyncio.ensure_future(partition.wait_replicated(info.last_offset + 1, 5, partition.leader_epoch))
        await asyncio.sleep(0)
        partition.update_follower_fetch_state(F1, 2)
        await asyncio.sleep(0)
        assert not waiting.done()
        partition.update_follower_fetch_state(F2, 2)
        await waiting

    asyncio.run(scenario())


def test_acks_all_times_out_with_the_requests_timeout():
    async def scenario():
        partition, _ = make()
        info = await append_async(partition, 1)
        with pytest.raises(RequestTimedOut):
            await partition.wait_replicated(info.last_offset + 1, 0.05, partition.leader_epoch)

    asyncio.run(scenario())


def test_a_write_waiting_when_leadership_moves_is_never_acknowledged_even_if_regained():
    async def scenario():
        partition, _ = make(epoch=3)
        info = await append_async(partition, 1)
        waiting = asyncio.ensure_future(partition.wait_replicated(info.last_offset + 1, 5, 3))
        await asyncio.sleep(0)
        # Deposed, then (after truncating, in real life) elected again at a later epoch; the high watermark
        # passes the offset with whatever is there now.
        partition.make_follower(PartitionState(F1, 4, (F1, LEADER, F2), (LEADER, F1, F2), version=20))
        partition.make_leader(PartitionState(LEADER, 5, (LEADER, F1, F2), (LEADER, F1, F2), version=21))
        partition.update_follower_fetch_state(F1, 1)
        partition.update_follower_fetch_state(F2, 1)
        with pytest.raises(NotLeaderOrFollower):
            await waiting

    asyncio.run(scenario())


class HighWatermarkMachine(RuleBasedStateMachine):
    """Random appends, follower fetches (never past the leader's end), ISR shrinks/expansions and clock
    moves: the high watermark never goes back and never passes the log end of any ISR member."""

    def __init__(self) -> None:
        super().__init__()
        self.partition, self.clock = make()
        self.ends = {F1: 0, F2: 0}
        self.last_hw = 0

    @rule(count=st.integers(1, 5))
    def produce(self, count):
        append(self.partition, count, acks=1)

    @rule(follower=st.sampled_from([F1, F2]), data=st.data())
    def fetch(self, follower, data):
        offset = data.draw(st.integers(self.ends[follower], self.partition.log.log_end_offset))
        self.ends[follower] = offset
        self.partition.update_follower_fetch_state(follower, offset)
        proposed = self.partition.isr_expansion(follower)
        if proposed is not None:
            self.partition.begin_isr_change(proposed)
            self.partition.end_isr_change(PartitionState(LEADER, 3, proposed, (LEADER, F1, F2),
                                                         version=self.partition.state_version + 1))

    @rule(ms=st.integers(0, 15_000))
    def time_passes(self, ms):
        self.clock.ms += ms
        proposed = self.partition.isr_shrink()
        if proposed is not None:
            self.partition.begin_isr_change(proposed)
            self.partition.end_isr_change(PartitionState(LEADER, 3, proposed, (LEADER, F1, F2),
                                                         version=self.partition.state_version + 1))

    @invariant()
    def high_watermark_is_safe(self):
        hw = self.partition.high_watermark
        assert hw >= self.last_hw
        self.last_hw = hw
        for member in self.partition.isr:
            if member != LEADER:
                assert hw <= self.ends[member], (hw, member, self.ends, self.partition.isr)
        assert hw <= self.partition.log.log_end_offset


TestHighWatermark = HighWatermarkMachine.TestCase
TestHighWatermark.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


class StallingLog(FakeLog):
    """A log whose next append must wait for a worker thread (a segment being prepared): AppendNotReady
    with a concurrent future the test resolves."""

    def __init__(self) -> None:
        super().__init__()
        import concurrent.futures
        self.ready = concurrent.futures.Future()
        self.follower_appends: list = []

    def append(self, records, *, leader_epoch: int, log_append_time_ms=None):
        if not self.ready.done():
            raise AppendNotReady("a segment", self.ready)
        return super().append(records, leader_epoch=leader_epoch)

    def append_as_follower(self, records):
        if not self.ready.done():
            raise AppendNotReady("a segment", self.ready)
        self.follower_appends.append(bytes(records))
        self.log_end_offset += FIVE_RECORDS_COUNT
        return SimpleNamespace(headers=())


FIVE_RECORDS_COUNT = 5
FIVE_RECORDS = build_batch([b"fetched"] * FIVE_RECORDS_COUNT)


def stalling_partition():
    partition = Partition("t", 0, StallingLog(), node_id=F1, producers=FakeProducers(), notifier=Notifier())
    partition.make_follower(PartitionState(LEADER, 3, (LEADER, F1), (LEADER, F1, F2), version=10))
    return partition


def test_a_follower_append_that_waited_for_storage_lands_nothing_after_the_epoch_moved():
    """Records fetched from the old leader at epoch 3 must not land once this replica follows (or leads) at
    a later epoch: the append re-checks its epoch after the await."""
    partition = stalling_partition()

    async def scenario():
        append = asyncio.ensure_future(partition.append_as_follower(FIVE_RECORDS, 3))
        await asyncio.sleep(0.01)
        assert not append.done()
        partition.make_leader(PartitionState(F1, 4, (F1,), (LEADER, F1, F2), version=11))
        partition.log.ready.set_result(None)
        return await append

    assert asyncio.run(scenario()) is None
    assert partition.log.follower_appends == [] and partition.log_end_offset == 0


def test_a_follower_append_at_its_epoch_lands_after_the_wait():
    partition = stalling_partition()

    async def scenario():
        append = asyncio.ensure_future(partition.append_as_follower(FIVE_RECORDS, 3))
        await asyncio.sleep(0.01)
        partition.log.ready.set_result(None)
        return await append

    assert asyncio.run(scenario()) == 5
    assert partition.log.follower_appends == [FIVE_RECORDS]


def test_a_leader_append_that_waited_for_storage_is_not_written_under_a_later_epoch():
    partition = stalling_partition()
    partition.make_leader(PartitionState(F1, 4, (F1,), (LEADER, F1, F2), version=11))

    async def scenario():
        append = asyncio.ensure_future(append_async(partition, 5, acks=1))
        await asyncio.sleep(0.01)
        partition.make_follower(PartitionState(LEADER, 5, (LEADER, F1), (LEADER, F1, F2), version=12))
        partition.make_leader(PartitionState(F1, 6, (F1,), (LEADER, F1, F2), version=13))
        partition.log.ready.set_result(None)
        await append

    with pytest.raises(NotLeaderOrFollower):
        asyncio.run(scenario())
    assert partition.log_end_offset == 0
