"""Replica placement and leader election: Kafka's rules as pure functions.

Placement (``AdminUtils.assignReplicasToBrokersRackUnaware``): with the live brokers sorted, partition p's
first replica is broker ``(p + start) % n``, so leaders rotate over the brokers; the followers are the
brokers at increasing shifts from it, the shift itself moving by one every n partitions, so the replicas of
consecutive partitions do not all follow the same pattern. ``start`` and the first shift are random per
topic (Kafka's default), or given (tests, reproducible layouts).

Election (``Election.scala``, KIP-106):

- clean: the first replica, in assignment order, that is alive and in the ISR; the new ISR is the live
  members of the old one;
- unclean (only with ``unclean.leader.election.enable``): if no ISR member is alive, the first live replica,
  with an ISR of itself: it may lack acknowledged records, which is why it is off by default;
- no candidate: no leader (-1), and the ISR stays as it was, so the first of its members to come back is
  elected and nothing it acknowledged is lost;
- preferred: the first replica of the assignment, when it is alive and in the ISR.

Pure: no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence

__all__ = ["assign_replicas", "elect_leader", "preferred_leader", "NO_LEADER"]

NO_LEADER = -1


def assign_replicas(brokers: Sequence[int], partitions: int, replication_factor: int, *,
                    start_partition: int = 0, start_index: int | None = None,
                    first_shift: int | None = None, rng: random.Random | None = None) -> list[tuple[int, ...]]:
    """Replica lists for partitions ``start_partition .. start_partition + partitions - 1``.

    Raises:
        ValueError: ``replication_factor`` is not in 1..len(brokers).
    """
    ordered = sorted(set(brokers))
    count = len(ordered)
    if not 1 <= replication_factor <= count:
        raise ValueError(f"replication factor {replication_factor} needs 1..{count} brokers")
    randrange = rng.randrange if rng is not None else random.randrange
    start = randrange(count) if start_index is None else start_index
    shift = randrange(count) if first_shift is None else first_shift
    assignment = []
    for partition in range(start_partition, start_partition + partitions):
        if partition > 0 and partition % count == 0:
            shift += 1
        first = (partition + start) % count
        replicas = [ordered[first]]
        for number in range(replication_factor - 1):
            step = 1 + (shift + number) % (count - 1)
            replicas.append(ordered[(first + step) % count])
        assignment.append(tuple(replicas))
    return assignment


def elect_leader(replicas: Sequence[int], isr: Sequence[int], live: Collection[int], *,
                 unclean: bool = False) -> tuple[int, tuple[int, ...]]:
    """``(leader, isr)`` after an election among ``live`` brokers (module docstring)."""
    live_isr = tuple(replica for replica in isr if replica in live)
    for replica in replicas:
        if replica in live_isr:
            return replica, live_isr
    if unclean:
        for replica in replicas:
            if replica in live:
                return replica, (replica,)
    return NO_LEADER, tuple(isr)


def preferred_leader(replicas: Sequence[int], isr: Collection[int], live: Collection[int]) -> int | None:
    """The assignment's first replica when it may lead now (alive and in the ISR), else None."""
    if replicas and replicas[0] in live and replicas[0] in isr:
        return replicas[0]
    return None
