"""The seams between the request handlers and the rest of the broker, as typed Protocols.

A handler receives ``ctx.broker`` typed as ``BrokerServices``: the settings and identity, the topic entry
points, and narrow views of the parts it calls (``Replicas`` of the replica manager, ``Metadata`` of the
metadata backend, ``ServedApis`` of the handler table). ``Broker`` (state.py), ``ReplicaManager`` and both
metadata backends satisfy them structurally; none of them is imported here at run time, so the handlers
depend on this module and not on the composition root that imports them (tests/test_import_graph.py checks
there is no circle; tests/broker/test_interfaces.py checks that the handlers reach nothing past these
members and that the concrete classes have all of them). The members are read-only properties, so a
component may hold a more specific type (``Broker.replicas`` is a ``ReplicaManager``).

Adding what a handler needs is one member here; reaching past it fails the suite rather than quietly
widening what a handler depends on. Types only: nothing here runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from copyless.broker.cluster.image import ClusterImage, TopicInfo
    from copyless.broker.config import BrokerConfig
    from copyless.broker.groups.service import GroupService
    from copyless.broker.notify import AppendNotifier
    from copyless.broker.partition import Partition
    from copyless.broker.security.manager import SecurityManager
    from copyless.broker.stats import BrokerStats
    from copyless.broker.txn.service import TransactionService

__all__ = ["BrokerServices", "Metadata", "Replicas", "ServedApis"]


class Replicas(Protocol):
    """What handlers and the group coordinator need of the replica manager: the partitions hosted here."""

    @property
    def leadership_listeners(self) -> list[Callable[[Partition, bool], None]]:
        """Called with (partition, True) when this broker starts leading a partition, (partition, False)
        when it stops."""
        ...

    def get(self, topic: str, partition: int) -> Partition | None:
        """The hosted partition, or None."""
        ...

    def leader(self, topic: str, partition: int, current_leader_epoch: int = ...) -> Partition:
        """The partition if this broker leads it in ``current_leader_epoch`` (-1: any). Raises
        UnknownTopicOrPartition, NotLeaderOrFollower, FencedLeaderEpoch, UnknownLeaderEpoch."""
        ...

    def leading(self) -> Iterable[Partition]:
        """The partitions this broker leads."""
        ...

    def after_follower_fetch(self, partition: Partition, replica_id: int, replica_epoch: int = -1) -> None:
        """A follower's fetch was served: it may join the ISR, and the high watermark may advance."""
        ...


class Metadata(Protocol):
    """What handlers need of the metadata backend (``cluster.backend.MetadataBackend``) beyond the topic entry
    points ``BrokerServices`` wraps."""

    @property
    def image(self) -> ClusterImage:
        """The current cluster image: brokers, topics, partition states."""
        ...

    def lease_valid(self) -> bool:
        """True while this broker's registration certainly holds (it may act as a leader)."""
        ...

    async def alter_topic_configs(self, name: str, configs: Mapping[str, str], *,
                                  validate_only: bool = False) -> None: ...

    async def alter_broker_configs(self, key: str, configs: Mapping[str, str], *,
                                   validate_only: bool = False) -> None: ...

    async def elect_preferred_leaders(self, partitions: Sequence[tuple[str, int]] | None = None) -> dict: ...


class ServedApis(Protocol):
    """What handlers need of the handler table: the API versions it serves (ApiVersions)."""

    def served(self) -> dict[int, tuple[int, int]]: ...


class BrokerServices(Protocol):
    """What a request handler may reach through ``ctx.broker``."""

    @property
    def config(self) -> BrokerConfig:
        """The settings in force (the static ones with the dynamic broker configs layered over)."""
        ...

    @property
    def static_config(self) -> BrokerConfig:
        """The settings as started (file and flags)."""
        ...

    @property
    def dynamic_configs(self) -> dict[str, dict[str, str]]:
        """The dynamic broker configs in force: key ("" every broker, "<id>" one) -> name -> value."""
        ...

    @property
    def node_id(self) -> int: ...

    @property
    def cluster_id(self) -> str: ...

    @property
    def closing(self) -> bool:
        """True once shutdown began."""
        ...

    @property
    def replicas(self) -> Replicas: ...

    @property
    def metadata(self) -> Metadata: ...

    @property
    def appends(self) -> AppendNotifier:
        """Long-poll wake-ups: a partition's high watermark moved (or its log end, for followers)."""
        ...

    @property
    def stats(self) -> BrokerStats: ...

    @property
    def security(self) -> SecurityManager: ...

    @property
    def groups(self) -> GroupService | None:
        """The group coordinator, once its startup hook ran."""
        ...

    @property
    def transactions(self) -> TransactionService | None:
        """The transaction coordinator, once its startup hook ran."""
        ...

    @property
    def handlers(self) -> ServedApis: ...

    def topic(self, name: str) -> TopicInfo | None: ...

    def is_creating(self, name: str) -> bool: ...

    async def wait_created(self, name: str) -> None: ...

    async def create_topic(self, name: str, partitions: int | None = None,
                           configs: dict[str, str | None] | None = None, *, replication_factor: int | None = None,
                           assignments: dict[int, list[int]] | None = None, internal: bool = False,
                           validate_only: bool = False) -> TopicInfo:
        """Create a topic through the metadata backend. Raises TopicError with the Kafka error code."""
        ...

    async def delete_topic(self, name: str) -> None: ...

    async def create_partitions(self, name: str, count: int, assignments: Sequence[Sequence[int]] | None = None, *,
                                validate_only: bool = False) -> TopicInfo: ...

    async def allocate_producer_id(self) -> int:
        """A producer id never handed out before, by any broker of the cluster."""
        ...
