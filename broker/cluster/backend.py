"""The metadata backend interface, and the topic checks both backends share.

A backend owns the cluster's metadata and this broker's place in it. It publishes ``ClusterImage``s to the
replica manager (``ReplicaManager.publish``) and carries out the changes requests ask for:

    lease_valid()                 may this broker act as a leader now (its registration is live)
    create_topic / delete_topic   CreateTopics, DeleteTopics, auto-create
    create_partitions             CreatePartitions
    alter_topic_configs           AlterConfigs / IncrementalAlterConfigs on a topic
    alter_broker_configs          AlterConfigs / IncrementalAlterConfigs on a broker ("" = every broker)
    alter_isr                     a leader's ISR change, conditional on the state it saw
    read_partition_state          a partition's state as stored now (an ISR change's unknown outcome)
    elect_preferred_leaders       ElectLeaders (preferred)
    allocate_producer_id          InitProducerId: ids unique across the cluster and across restarts

``plan_topic`` is the one place a new topic is checked and laid out (Kafka's ``CreateTopicPolicy`` checks
and ``ReplicationControlManager.createTopic``): name, partitions, replication factor against the live
brokers, manual assignments, configs. ``plan_partitions`` does the same for partitions added to a topic
(Kafka's ``createPartitions``: the new ones placed as if the topic had been created with them, continuing
the rotation that starts at partition 0's first replica).

Pure except the abstract methods' implementations.
"""

from __future__ import annotations

import abc
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from copyless.broker.cluster.image import ClusterImage, TopicInfo
from copyless.broker.cluster.placement import assign_replicas
from copyless.broker.partition import PartitionState
from copyless.broker.topics import TopicError, check_new_topic_name, parse_topic_configs

__all__ = ["MetadataBackend", "NewTopic", "plan_topic", "plan_partitions", "MAX_PARTITIONS",
           "inter_broker_client_id", "is_inter_broker", "replica_client_id", "replica_epoch_of"]

MAX_PARTITIONS = 100_000
# Brokers name their connections to each other so; the controller accepts an internal topic's creation
# only on such a connection (there is no authentication: this tells brokers from clients, it does not guard).
_INTER_BROKER_PREFIX = "copyless-broker-"


def inter_broker_client_id(node_id: int) -> str:
    return f"{_INTER_BROKER_PREFIX}{node_id}"


def is_inter_broker(client_id: str | None) -> bool:
    return client_id is not None and client_id.startswith(_INTER_BROKER_PREFIX)


# A follower's fetches name its broker epoch in the client id (Fetch v11 has no field for it; KIP-903's
# ReplicaState.ReplicaEpoch came with v15): the leader admits it to an ISR under that epoch only.
_REPLICA_PREFIX = "copyless-replica-"


def replica_client_id(node_id: int, broker_epoch: int) -> str:
    return f"{_REPLICA_PREFIX}{node_id}@{broker_epoch}"


def replica_epoch_of(client_id: str | None) -> int:
    """The broker epoch a follower's fetch names (``replica_client_id``), or -1."""
    if not client_id or not client_id.startswith(_REPLICA_PREFIX):
        return -1
    _node, _, epoch = client_id[len(_REPLICA_PREFIX):].partition("@")
    return int(epoch) if epoch.isdigit() else -1


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
                raise TopicError(ErrorCode.invalid_replica_assignment, f"Replica assignment {list(replicas)} "
                                 f"for partition {index} is empty or repeats a broker")
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
            raise TopicError(ErrorCode.invalid_partitions,
                             f"Number of partitions {partitions} exceeds {MAX_PARTITIONS}.")
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


def _check_assignment(replicas, index: int, live: Sequence[int], size: int | None) -> tuple[int, ...]:
    replicas = tuple(int(b) for b in replicas)
    if not replicas or len(set(replicas)) != len(replicas):
        raise TopicError(ErrorCode.invalid_replica_assignment,
                         f"Replica assignment {list(replicas)} for partition {index} is empty or repeats a broker")
    unknown = [b for b in replicas if b not in live]
    if unknown:
        raise TopicError(ErrorCode.invalid_replica_assignment,
                         f"Replica assignment {list(replicas)} for partition {index} names brokers that are "
                         f"not registered: {unknown}")
    if size is not None and len(replicas) != size:
        raise TopicError(ErrorCode.invalid_replica_assignment,
                         f"Inconsistent replication factor between partitions, partition 0 has {size} while "
                         f"partition {index} has replication factor {len(replicas)}")
    return replicas


def plan_partitions(topic: TopicInfo, count: int, assignments: Sequence[Sequence[int]] | None, *,
                    live_brokers: Sequence[int]) -> TopicInfo:
    """``topic`` grown to ``count`` partitions; ``assignments`` places the new ones (one replica list per new
    partition), else Kafka's placement does.

    Raises:
        TopicError: INVALID_PARTITIONS (not more than now, or above MAX_PARTITIONS), INVALID_REPLICA_ASSIGNMENT,
            INVALID_REPLICATION_FACTOR (more replicas than live brokers), INVALID_TOPIC_EXCEPTION (internal).
    """
    current = topic.partitions
    if topic.internal:
        raise TopicError(ErrorCode.invalid_topic_exception,
                         f"Topic '{topic.name}' is internal: its partition count decides where groups live")
    if count < current:
        raise TopicError(ErrorCode.invalid_partitions,
                         f"Topic currently has {current} partitions, which is higher than the requested {count}.")
    if count == current:
        raise TopicError(ErrorCode.invalid_partitions, f"Topic already has {current} partitions.")
    if count > MAX_PARTITIONS:
        raise TopicError(ErrorCode.invalid_partitions, f"Number of partitions {count} exceeds {MAX_PARTITIONS}.")
    live = sorted(set(live_brokers))
    factor = len(topic.assignment[0]) if topic.assignment else 1
    adding = count - current
    if assignments is not None:
        if len(assignments) != adding:
            raise TopicError(ErrorCode.invalid_replica_assignment,
                             f"Increasing the number of partitions by {adding} but {len(assignments)} assignments "
                             f"provided.")
        new = [_check_assignment(replicas, current + i, live, factor) for i, replicas in enumerate(assignments)]
    else:
        if factor > len(live):
            raise TopicError(ErrorCode.invalid_replication_factor,
                             f"Unable to replicate the partition {factor} time(s): only {len(live)} broker(s) are "
                             f"registered.")
        first = topic.assignment[0][0] if topic.assignment else live[0]
        start = next((i for i, broker in enumerate(live) if broker >= first), 0)
        new = assign_replicas(live, adding, factor, start_partition=current, start_index=start, first_shift=start)
    return TopicInfo(name=topic.name, topic_id=topic.topic_id, assignment=(*topic.assignment, *new),
                     configs=dict(topic.configs), internal=topic.internal)


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
    async def alter_isr(self, topic: str, partition: int, state: PartitionState, isr: tuple[int, ...],
                        joining_epochs: Mapping[int, int] | None = None) -> PartitionState | None:
        """Record ``isr`` if the stored state is still ``state`` (same version); a member joining it is
        admitted under its broker epoch in ``joining_epochs``. Returns the new state, or None when refused
        (the state moved on: the next image carries it)."""

    async def read_partition_state(self, topic: str, partition: int) -> PartitionState | None:
        """The partition's state as the store holds it now (a read, not the image): the answer to an ISR
        change whose write timed out. None when the partition has no state. Raises on a failed read."""
        return self.image.partition_state(topic, partition) if hasattr(self, "image") else None

    @abc.abstractmethod
    async def allocate_producer_id(self) -> int:
        """A producer id never handed out before by any broker of the cluster."""

    async def create_partitions(self, name: str, count: int, assignments: Sequence[Sequence[int]] | None = None,
                                *, validate_only: bool = False) -> TopicInfo:
        """Grow topic ``name`` to ``count`` partitions (``plan_partitions``). Returns once this broker's image
        has them. Raises TopicError."""
        raise TopicError(ErrorCode.invalid_request, "this metadata backend cannot add partitions")

    async def alter_topic_configs(self, name: str, configs: Mapping[str, str], *, validate_only: bool = False) -> None:
        """Replace topic ``name``'s overrides with ``configs`` (already checked). Raises TopicError."""
        raise TopicError(ErrorCode.invalid_request, "this metadata backend cannot alter topic configs")

    async def alter_broker_configs(self, key: str, configs: Mapping[str, str], *, validate_only: bool = False) -> None:
        """Replace the dynamic broker configs of ``key`` ("" every broker, "<id>" one) with ``configs``
        (already checked); every broker applies them from its next image."""
        raise TopicError(ErrorCode.invalid_request, "this metadata backend cannot alter broker configs")

    async def elect_preferred_leaders(self, partitions: Sequence[tuple[str, int]] | None = None) -> dict:
        """Preferred leader election: {(topic, partition): ErrorCode} (Kafka's ElectLeaders results)."""
        raise TopicError(ErrorCode.invalid_request, "this metadata backend cannot elect leaders")

    def is_creating(self, name: str) -> bool:
        return False

    async def wait_created(self, name: str) -> None:
        return None
