"""What the replica manager and the replica fetchers need of the broker that hosts them, as typed Protocols.

``ReplicaManager`` (replica_manager.py) and ``FetcherManager`` / ``ReplicaFetcher`` (cluster/replica_fetcher.py)
are built by ``Broker`` (state.py) with the broker itself; each sees it only as the members listed here, so
neither can reach further into the composition root without the need showing up in this file. ``Broker``
satisfies both structurally; mypy (tests/test_types.py) checks the construction sites and every
``self.broker.<member>`` the two make. Types only: nothing here runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from copyless.broker.config import BrokerConfig
    from copyless.broker.notify import AppendNotifier
    from copyless.broker.partition_state_files import StateFiles
    from copyless.broker.producer_state import ProducerStateManager
    from copyless.broker.storage.config import LogConfig
    from copyless.broker.txn_partition import TxnPartitions

__all__ = ["FetcherHost", "ReplicaHost"]


class ReplicaHost(Protocol):
    """What the replica manager needs of the broker: the logs, the producer and transaction state it loads
    with each partition, the long-poll, the settings and the metadata backend."""

    node_id: int
    config: BrokerConfig
    # The broker's LogManager: None until start-up, and no partition exists before it (typed loosely so the
    # replica manager need not narrow it at each use).
    log_manager: Any
    producers: ProducerStateManager
    txn_partitions: TxnPartitions
    state_files: StateFiles
    snapshots_at_end: set[tuple[str, int]]
    appends: AppendNotifier

    @property
    def metadata(self) -> Any: ...

    def log_config_for(self, topic: Any) -> LogConfig: ...


class FetcherHost(Protocol):
    """What a replica fetcher needs of the broker: its identity and settings, the partitions it follows (the
    replica manager), the metadata backend (leaders' endpoints) and the security settings its connections use."""

    node_id: int
    config: BrokerConfig

    @property
    def replicas(self) -> Any: ...

    @property
    def metadata(self) -> Any: ...

    @property
    def security(self) -> Any: ...
