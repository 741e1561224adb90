"""The metadata backend interface, and the topic checks both backends share.

A backend owns the cluster's metadata and this broker's place in it. It publishes ``ClusterImage``s to the
replica manager (``ReplicaManager.publish``) and carries out the changes requests ask for:

    lease_valid()                 may this broker act as a leader now (its registration is live)
    create_topic / delete_topic   CreateTopics, DeleteTopics, auto-create
    create_partitions             CreatePartitions
    alter_topic_configs           AlterConfigs / IncrementalAlterConfigs on a topic
    alter_isr                     a leader's ISR change, conditional on the state it saw
    elect_preferred_leaders       ElectLeaders (preferred)
    allocate_producer_id          InitProducerId: ids unique across the cluster and across restarts

``plan_topic`` is the one place a new topic is checked and laid out (Kafka's ``CreateTopicPolicy`` checks
and ``ReplicationControlManager.createTopic``): name, partitions, replication factor against the live
brokers, manual assignments, configs.

Pure except the abstract methods' implementations.
"""

from __future__ import annotations

import abc
import uuid
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from kio.schema.errors import ErrorCode

from copyless.broker.cluster.image import ClusterImage, TopicInfo
from copyless.broker.cluster.placement import assign_replicas
from copyless.broker.partition import PartitionState
from copyless.broker.topics import TopicError, check_new_topic_name, parse_topic_configs

__all__ = ["MetadataBackend", "NewTopic", "plan_topic", "MAX_PARTITIONS"]

MAX_PARTITIONS = 100_000


@dataclass(frozen=True)
class NewTopic:
    """A topic as CreateTopics (or auto-create) asks for it; -1 means the broker default."""

    name: str
    partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str | None] = field(default_factory=dict)
    assignments: Mapping[int, Sequence[int]] | None = None
    internal: bool = False


def plan_topic(new: NewTopic, *, existing: Sequence[str], live_brokers: Sequence[int], default_partitions: int,
               default_replication_factor: int, topic_id: uuid.UUID | None = None) -> TopicInfo:
    """Check ``new`` and lay it out over ``live_brokers``.

    Raises:
        TopicError: INVALID_TOPIC_EXCEPTION, TOPIC_ALREADY_EXISTS, INVALID_PARTITIONS,
            INVALID_REPLICATION_FACTOR, INVALID_REPLICA_ASSIGNMENT, INVALID_REQUEST, INVALID_CONFIG.
    """
    check_new_topic_name(new.name, existing, internal=new.internal)
    configs = {name: value for name, value in dict(new.configs).items()}
    parse_topic_configs(configs)
    live = sorted(set(live_brokers))
    if new.assignments:
        if new.partitions != -1 or new.replication_factor != -1:
            raise TopicError(ErrorCode.invalid_request, "Both numPartitions or replicationFactor and "
                             "replicasAssignments were set. Both cannot be used at the same time.")
        indexes = sorted(new.assignments)
        if indexes != list(range(len(indexes))):
            raise TopicError(ErrorCode.invalid_replica_assignment,
                             "Partitions should be a consecutive 0-based integer sequence")
        assignment = []
        sizes = set()
        for index in indexes:
            replicas = tuple(int(b) for b in new.assignments[index])
            if not replicas or len(set(replicas)) != len(replicas):
                raise TopicError(ErrorCode.invalid_replica_assignment,
                                 f"Replica assignment {list(replicas)} for partition {index} is empty or repeats a broker")
            unknown = [b for b in replicas if b not in live]
            if unknown:
                raise TopicError(ErrorCode.invalid_replica_assignment,
                                 f"Replica assignment {list(replicas)} for partition {index} names brokers that are "
                                 f"not registered: {unknown}")
            sizes.add(len(replicas))
            assignment.append(replicas)
        if len(sizes) > 1:
            raise TopicError(ErrorCode.invalid_replica_assignment,
                             "All partitions should have the same number of replicas")
    else:
        partitions = default_partitions if new.partitions in (None, -1) else new.partitions
        if partitions < 1:
            raise TopicError(ErrorCode.invalid_partitions, "Number of partitions must be larger than 0.")
        if partitions > MAX_PARTITIONS:
            raise TopicError(ErrorCode.invalid_partitions, f"Number of partitions {partitions} exceeds {MAX_PARTITIONS}.")
        factor = default_replication_factor if new.replication_factor in (None, -1) else new.replication_factor
        if factor < 1:
            raise TopicError(ErrorCode.invalid_replication_factor, "Replication factor must be larger than 0.")
        if factor > len(live):
            raise TopicError(
                ErrorCode.invalid_replication_factor,
                f"Unable to replicate the partition {factor} time(s): The target replication factor of {factor} "
                f"cannot be reached because only {len(live)} broker(s) are registered.")
        assignment = assign_replicas(live, partitions, factor)
    min_isr = configs.get("min.insync.replicas")
    if min_isr is not None and int(min_isr) > len(assignment[0]):
        # Kafka accepts it and every acks=all write then fails; refusing it up front is kinder and safe.
        raise TopicError(ErrorCode.invalid_config,
                         f"min.insync.replicas={min_isr} exceeds the replication factor {len(assignment[0])}")
    return TopicInfo(name=new.name, topic_id=topic_id or uuid.uuid4(), assignment=tuple(assignment),
                     configs={k: str(v) for k, v in configs.items()}, internal=new.internal)


class MetadataBackend(abc.ABC):
    """What the broker needs from its metadata (module docstring). Loop thread."""

    image: ClusterImage

    @property
    @abc.abstractmethod
    def is_controller(self) -> bool:
        """True when this broker may make cluster-wide changes itself."""

    @abc.abstractmethod
    def lease_valid(self) -> bool:
        """True while this broker's registration certainly holds (it may act as leader)."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Join (or load) the cluster and publish the first image. Raises on a fatal mismatch."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Leave: stop watches and timers, give up leases."""

    @abc.abstractmethod
    async def create_topic(self, new: NewTopic, *, validate_only: bool = False) -> TopicInfo:
        """Create ``new`` (or only check it). Returns once this broker's image has the topic. Raises
        TopicError."""

    @abc.abstractmethod
    async def delete_topic(self, name: str) -> None:
        """Delete a topic. Raises TopicError (UNKNOWN_TOPIC_OR_PARTITION, INVALID_TOPIC_EXCEPTION...)."""

    @abc.abstractmethod
    async def alter_isr(self, topic: str, partition: int, state: PartitionState,
                        isr: tuple[int, ...]) -> PartitionState | None:
        """Record ``isr`` if the stored state is still ``state`` (same version). Returns the new state, or
        None when refused (the state moved on: the next image carries it)."""

    @abc.abstractmethod
    async def allocate_producer_id(self) -> int:
        """A producer id never handed out before by any broker of the cluster."""

    def is_creating(self, name: str) -> bool:
        return False

    async def wait_created(self, name: str) -> None:
        return None
