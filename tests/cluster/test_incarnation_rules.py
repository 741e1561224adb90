"""The controller's rules for ISR entries tied to broker incarnations (``broker.cluster.controller.next_state``,
``broker.cluster.incarnation``), as pure functions: no etcd, no processes."""

from __future__ import annotations

from copyless.broker.cluster.controller import next_state
from copyless.broker.cluster.image import BrokerInfo
from copyless.broker.cluster.incarnation import Incarnation, previous_epoch
from copyless.broker.partition import PartitionState

REPLICAS = (1, 2, 3)


def live(*brokers: tuple[int, int, int]) -> dict[int, BrokerInfo]:
    """(node id, epoch, previous epoch) -> the controller's live map."""
    return {node: BrokerInfo(node, {}, epoch=epoch, previous_epoch=previous) for node, epoch, previous in brokers}


def test_a_member_that_re_registered_without_its_data_leaves_the_isr_though_never_seen_gone():
    # Broker 2 restarted after a power loss and registered again (epoch 40) before any image showed it gone.
    state = PartitionState(1, 3, (1, 2, 3), REPLICAS, version=50)
    decided = next_state(state, REPLICAS, live((1, 10, -1), (2, 40, -1), (3, 30, -1)),
                         isr_epochs={1: 10, 2: 20, 3: 30})
    assert decided is not None
    new, epochs = decided
    assert (new.leader, new.leader_epoch, new.isr) == (1, 3, (1, 3)) and epochs == {1: 10, 3: 30}


def test_a_member_that_vouches_for_its_old_epoch_is_carried_over():
    state = PartitionState(1, 3, (1, 2, 3), REPLICAS, version=50)
    new, epochs = next_state(state, REPLICAS, live((1, 10, -1), (2, 40, 20), (3, 30, -1)),
                             isr_epochs={1: 10, 2: 20, 3: 30})
    assert new.isr == (1, 2, 3) and epochs == {1: 10, 2: 40, 3: 30}
    # Once carried over, nothing more to do.
    assert next_state(PartitionState(1, 3, (1, 2, 3), REPLICAS, version=60), REPLICAS,
                      live((1, 10, -1), (2, 40, 20), (3, 30, -1)), isr_epochs=epochs) is None


def test_a_leaderless_partition_elects_only_a_member_whose_entry_holds():
    state = PartitionState(-1, 5, (1, 2, 3), REPLICAS, version=70)
    entries = {1: 10, 2: 20, 3: 30}
    # 2 is back after a wiped disk or a power loss: no leader, and the ISR is kept as recorded.
    assert next_state(state, REPLICAS, live((2, 80, -1)), isr_epochs=entries) is None
    # ... unless unclean election is allowed.
    new, epochs = next_state(state, REPLICAS, live((2, 80, -1)), isr_epochs=entries, unclean=True)
    assert (new.leader, new.isr, epochs) == (2, (2,), {2: 80})
    # 3 is back after a clean shutdown: it leads, at its new epoch.
    new, epochs = next_state(state, REPLICAS, live((2, 80, -1), (3, 90, 30)), isr_epochs=entries)
    assert (new.leader, new.leader_epoch, new.isr, epochs) == (3, 6, (3,), {3: 90})


def test_a_dead_leaders_successor_must_hold_its_entry():
    state = PartitionState(1, 2, (1, 2, 3), REPLICAS, version=50)
    new, epochs = next_state(state, REPLICAS, live((2, 60, -1), (3, 30, -1)), isr_epochs={1: 10, 2: 20, 3: 30})
    assert (new.leader, new.leader_epoch, new.isr, epochs) == (3, 3, (3,), {3: 30})


def test_entries_without_an_epoch_hold_for_whoever_is_live():
    # A state written before entries carried epochs.
    state = PartitionState(-1, 0, (1, 2), REPLICAS, version=5)
    new, epochs = next_state(state, REPLICAS, live((2, 9, -1)), isr_epochs={})
    assert (new.leader, new.isr, epochs) == (2, (2,), {2: 9})


def test_what_a_starting_broker_may_vouch_for():
    record = Incarnation(42, "boot-a")
    assert previous_epoch(record, clean_shutdown=True, current_boot_id="boot-b") == 42
    assert previous_epoch(record, clean_shutdown=False, current_boot_id="boot-a") == 42
    assert previous_epoch(record, clean_shutdown=False, current_boot_id="boot-b") == -1
    assert previous_epoch(None, clean_shutdown=True, current_boot_id="boot-a") == -1
    assert previous_epoch(Incarnation(42, ""), clean_shutdown=False, current_boot_id="") == -1
