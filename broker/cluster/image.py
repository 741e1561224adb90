"""ClusterImage: an immutable snapshot of the cluster's metadata, as one backend last saw it.

Owns the value types every layer reads: ``BrokerInfo`` (a live broker: id, epoch, endpoints per listener),
``TopicInfo`` (name, topic id, replica assignment, configs), the per-partition ``PartitionState``
(leader, leader epoch, ISR, replicas, version) and the dynamic broker configs (``broker_configs``: ``""`` for
every broker, ``"<id>"`` for one; Kafka names to text, see ``broker.config_sources``). A backend replaces its image as a
whole on every change, so a reader holding one sees a consistent cluster (one etcd revision) and never a half-applied
change.

Pure: no I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from copyless.broker.partition import PartitionState

__all__ = ["BrokerInfo", "TopicInfo", "ClusterImage", "PartitionState"]


@dataclass(frozen=True)
class BrokerInfo:
    """A registered broker. ``epoch`` is its registration's version (etcd: the key's create revision), new
    at every start, so a restarted broker is told apart from the process it replaced. ``previous_epoch`` is
    the earlier epoch whose data this broker says it still holds in full (a clean restart, or one that kept
    the page cache), or -1: ISR entries recorded under that epoch still count (``broker.cluster.incarnation``)."""

    node_id: int
    endpoints: Mapping[str, tuple[str, int]]
    epoch: int = 0
    rack: str | None = None
    previous_epoch: int = -1

    def endpoint(self, listener: str | None) -> tuple[str, int] | None:
        """The advertised address on ``listener`` (None: the first one)."""
        if listener is None or listener not in self.endpoints:
            if listener is not None:
                return None
            return next(iter(self.endpoints.values()), None)
        return self.endpoints[listener]


@dataclass(frozen=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    assignment: tuple[tuple[int, ...], ...]  # per partition, the replicas in preference order
    configs: Mapping[str, str] = field(default_factory=dict)
    internal: bool = False

    @property
    def partitions(self) -> int:
        return len(self.assignment)


@dataclass(frozen=True)
class ClusterImage:
    """One consistent view. ``revision`` only grows (etcd's revision; the embedded backend counts changes)."""

    revision: int = 0
    cluster_id: str = ""
    controller_id: int = -1
    brokers: Mapping[int, BrokerInfo] = field(default_factory=dict)
    topics: Mapping[str, TopicInfo] = field(default_factory=dict)
    partitions: Mapping[tuple[str, int], PartitionState] = field(default_factory=dict)
    broker_configs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # (topic, partition) -> {ISR member: the broker epoch it was admitted under (0: not known)}.
    isr_epochs: Mapping[tuple[str, int], Mapping[int, int]] = field(default_factory=dict)

    def topic(self, name: str) -> TopicInfo | None:
        return self.topics.get(name)

    def partition_state(self, topic: str, partition: int) -> PartitionState | None:
        return self.partitions.get((topic, partition))

    def hosted_by(self, node_id: int) -> Iterator[tuple[str, int, TopicInfo]]:
        """(topic, partition, TopicInfo) for every partition with a replica on ``node_id``."""
        for topic in self.topics.values():
            for partition, replicas in enumerate(topic.assignment):
                if node_id in replicas:
                    yield topic.name, partition, topic
