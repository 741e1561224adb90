"""The Broker state object: everything a request handler may reach through ``ctx.broker``.

It is the composition root of one broker process: the configuration, the identity (``meta.properties``),
the storage (``LogManager``), the hosted partitions (``ReplicaManager``), the cluster metadata backend
(embedded single node, or etcd), producer state, the long-poll notifier, the stats, and the group
coordinator once its startup hook ran. Topic lifecycle and leadership belong to the metadata backend; the
partitions' rules to ``broker.partition``; this module wires them and orders start-up and shutdown:

1. ``startup()`` (blocking, before the event loop serves): identity, logs (recovery), producer state, the
   embedded registry;
2. ``start_cluster()`` (loop, once the listeners are bound, since registration names the endpoints): the
   backend joins or loads the cluster and the replica manager applies its first image;
3. the handlers' startup hooks (groups), then the listeners accept;
4. shutdown: hooks, the backend leaves (its lease is revoked, so leadership moves at once), logs close.

Cluster identity lives in ``<data_dir>/meta.properties`` (Kafka's file and keys: ``version``,
``cluster.id``, ``node.id``), created on first start. In a cluster the cluster id comes from etcd, and a
data dir whose ``meta.properties`` names another cluster refuses to start.

Threading: methods are loop-thread unless marked blocking; blocking work (fsync, preallocation, unlinks,
LogManager.shutdown) runs in worker threads.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from copyless.broker._files import write_atomically
from copyless.broker.cluster.backend import MetadataBackend, NewTopic
from copyless.broker.cluster.embedded import EmbeddedMetadata
from copyless.broker.cluster.image import TopicInfo
from copyless.broker.cluster.replica_fetcher import FetcherManager
from copyless.broker.config import BrokerConfig
from copyless.broker.config_sources import effective_config
from copyless.broker.handlers import HandlerTable, load_handlers
from copyless.broker.meta_properties import META_FILE, ClusterMismatchError, read_meta
from copyless.broker.notify import AppendNotifier
from copyless.broker.partition_state_files import StateFiles, load_partition_state
from copyless.broker.producer_state import ProducerStateManager, producer_state_scan_start
from copyless.broker.replica_manager import ReplicaManager
from copyless.broker.security.manager import SecurityManager
from copyless.broker.stats import BrokerStats
from copyless.broker.storage import LogManager
from copyless.broker.topics import parse_topic_configs
from copyless.broker.txn_partition import TxnPartitions

if TYPE_CHECKING:  # pragma: no cover
    from copyless.broker.groups.service import GroupService
    from copyless.broker.txn.service import TransactionService

# META_FILE, ClusterMismatchError and producer_state_scan_start are re-exported: their modules are
# meta_properties and producer_state.
__all__ = ["Broker", "META_FILE", "ClusterMismatchError", "producer_state_scan_start"]

log = logging.getLogger("copyless.broker")


class Broker:
    """Shared state of one broker process.

    It satisfies ``interfaces.BrokerServices``, the part of it a request handler may reach.

    Attributes:
        config: BrokerConfig.
        node_id, cluster_id: identity for Metadata / FindCoordinator.
        metadata: the MetadataBackend (``metadata.image`` is the current ClusterImage).
        replicas: ReplicaManager (``replicas.leader(topic, partition, epoch) -> Partition``).
        log_manager: broker.storage.LogManager.
        producers: ProducerStateManager.
        appends: AppendNotifier (long-poll wake-ups: a partition's high watermark moved, or its log end for
            followers).
        stats: BrokerStats.
        security: SecurityManager (TLS, SASL, ACLs: ``broker.security.manager``).
        handlers: HandlerTable (drives dispatch and ApiVersions).
        groups: set by the groups part's startup hook (None until then).
        transactions: the transaction coordinator, set by the transactions handlers' startup hook.
        txn_partitions: TxnPartitions (each partition's open and aborted transactions).
        closing: True once shutdown began.
    """

    def __init__(self, config: BrokerConfig, *, handlers: HandlerTable | None = None) -> None:
        self.config = config
        # The settings as started (file and flags): dynamic broker configs are layered over these.
        self.static_config = config
        self.dynamic_configs: dict[str, dict[str, str]] = {}
        self.node_id = config.node_id
        self.data_dir = Path(config.data_dir)
        self.cluster_id: str = ""
        self.producers = ProducerStateManager()
        self.txn_partitions = TxnPartitions()
        # Writes the partitions' .txnindex entries and producer snapshots (one thread, started on first use).
        self.state_files = StateFiles()
        # The partitions whose load left a snapshot at the log end (a clean shutdown need not write one again).
        self.snapshots_at_end: set[tuple[str, int]] = set()
        self.appends = AppendNotifier()
        self.stats = BrokerStats()
        self.handlers = handlers if handlers is not None else load_handlers()
        self.log_manager: LogManager | None = None  # set by startup()
        self.groups: GroupService | None = None  # set by the groups handler module's startup hook
        # the transaction coordinator (``broker.txn.service``), set at startup
        self.transactions: TransactionService | None = None
        self.closing = False
        # name -> (host, port) of each bound listener (set by the server once it has bound them).
        self.bound_listeners: dict[str, tuple[str, int]] = {}
        self.metadata: MetadataBackend = self._make_backend()
        self.security = SecurityManager(self)
        self.replicas = ReplicaManager(self, lease_valid=self.metadata.lease_valid)
        self.fetchers = FetcherManager(self)
        self.replicas.on_follower = self.fetchers.follow
        self._cluster_tasks: list = []

    def _make_backend(self) -> MetadataBackend:
        if self.config.metadata is None:
            return EmbeddedMetadata(self)
        # The etcd backend brings grpc and aetcd: imported here only when one is configured.
        from copyless.broker.cluster.etcd_metadata import EtcdMetadata

        return EtcdMetadata(self)

    # --- configuration ---------------------------------------------------------------------------------------

    def default_log_config(self):
        """The broker-wide LogConfig (topic configs override it: ``log_config_for``)."""
        return self.config.log_config()

    def cleaner_config(self):
        """The log cleaner's settings (``log.cleaner.*``)."""
        from copyless.broker.storage.cleaner import CleanerConfig

        config = self.config
        rate = config.log_cleaner_io_max_bytes_per_second
        return CleanerConfig(enable=config.log_cleaner_enable, threads=config.log_cleaner_threads,
                             backoff_ms=config.log_cleaner_backoff_ms,
                             dedupe_buffer_bytes=config.log_cleaner_dedupe_buffer_size,
                             io_max_bytes_per_second=None if rate >= 1e300 else rate)

    def log_config_for(self, topic: TopicInfo | Any):
        """The topic's LogConfig: broker defaults with the topic's overrides."""
        overrides = parse_topic_configs(topic.configs)
        return dataclasses.replace(self.default_log_config(), **overrides)

    def apply_broker_configs(self, dynamic) -> bool:
        """Take the dynamic broker configs (``ClusterImage.broker_configs``): ``config`` becomes the static
        settings with them layered over. Returns True when they changed (the caller re-applies every
        partition's log settings). A map that does not check out keeps the previous settings (logged): one
        bad etcd key must not stop a broker. Loop thread (or start-up)."""
        wanted = {str(key): dict(values) for key, values in dict(dynamic).items()}
        if wanted == self.dynamic_configs:
            return False
        try:
            self.config = effective_config(self.static_config, self.node_id, wanted, current=self.config)
        except Exception as exc:
            log.error("dynamic broker configs %s refused, keeping the previous ones: %s", wanted, exc)
            return False
        self.dynamic_configs = wanted
        log.info("dynamic broker configs in force: %s", wanted or "{}")
        return True

    def advertised_listeners(self) -> dict[str, tuple[str, int]]:
        """Listener name -> the address clients are told, for every bound listener (before binding: the
        configured addresses)."""
        config = self.config
        result = {}
        for name, host, port in config.listener_specs():
            bound_host, bound_port = self.bound_listeners.get(name, (host, port))
            result[name] = config.advertised_for(name, bound_host, bound_port)
        return result

    # --- startup / shutdown ----------------------------------------------------------------------------------

    def startup(self) -> None:
        """Load identity and logs; rebuild producer state. Blocking: before serving.

        Raises:
            StorageError, ValueError (a corrupt registry or meta.properties), ClusterMismatchError.
        """
        started = time.monotonic()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.config.metadata is None:
            self.cluster_id = self._load_or_create_meta()
        self.security.prepare()
        # Logs found at start-up load with their topic's settings where the backend knows them before
        # connecting (the embedded registry); otherwise with the defaults until the first image applies them.
        load_registry = getattr(self.metadata, "load_registry", None)
        topic_configs = load_registry() if load_registry is not None else {}
        # The storage's own housekeeping thread applies flush.ms, retention and recovery-point checkpoints.
        self.log_manager = LogManager(
            self.data_dir,
            default_config=self.default_log_config(),
            topic_configs={name: self.log_config_for(topic) for name, topic in topic_configs.items()},
            retention_check_interval_ms=self.config.retention_check_interval_ms,
            offsets_checkpoint_interval_ms=self.config.replica_high_watermark_checkpoint_interval_ms,
            cleaner_config=self.cleaner_config(),
        )
        self.log_manager.startup()
        producers = transactional = replayed = 0
        for (topic, partition), partition_log in self.log_manager.logs().items():
            # The latest producer snapshot plus the log after it (broker/partition_state_files.py).
            loaded = load_partition_state(partition_log, partition_log.high_watermark)
            self.producers.restore(topic, partition, loaded.producers)
            producers += len(loaded.producers)
            replayed += loaded.batches_replayed
            if loaded.snapshot_at_end:
                self.snapshots_at_end.add((topic, partition))
            txns = loaded.txns
            if txns.persisted or txns.has_transactions:
                self.txn_partitions.install(topic, partition, txns)
                transactional += 1
                if txns.ongoing:
                    log.info("%s-%d: %d open transaction(s), last stable offset %d", topic, partition,
                             len(txns.ongoing), txns.lso(partition_log.high_watermark))
        self.replicas.load_topic_ids()
        load = getattr(self.metadata, "load_blocking", None)
        if load is not None:
            load()
        log.info(
            "broker state loaded: node_id=%d logs=%d producers=%d transactional=%d batches replayed=%d in %.0f ms",
            self.node_id, len(self.log_manager.logs()), producers, transactional, replayed,
            (time.monotonic() - started) * 1000,
        )

    def _load_or_create_meta(self) -> str:
        """The embedded node's cluster id: from ``meta.properties``, created on first start. Blocking."""
        path = self.data_dir / META_FILE
        properties = read_meta(path)
        if properties:
            cluster_id = properties.get("cluster.id", "")
            if not cluster_id:
                raise ValueError(f"{path} has no cluster.id")
            node_id = int(properties.get("node.id", self.node_id))
            if node_id != self.node_id:
                log.warning("%s says node.id=%d; configured node.id=%d wins", path, node_id, self.node_id)
            return cluster_id
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        write_atomically(path, f"version=1\ncluster.id={cluster_id}\nnode.id={self.node_id}\n".encode())
        return cluster_id

    def check_or_write_meta(self, cluster_id: str) -> None:
        """A clustered broker's data dir must belong to ``cluster_id``: a new dir is stamped with it, a dir
        of another cluster refuses (ClusterMismatchError). Blocking."""
        path = self.data_dir / META_FILE
        properties = read_meta(path)
        existing = properties.get("cluster.id")
        if existing and existing != cluster_id:
            raise ClusterMismatchError(
                f"the data dir {self.data_dir} belongs to cluster {existing}, but the cluster in etcd is "
                f"{cluster_id}; refusing to start (point --data-dir at an empty directory to join this cluster)")
        node_id = properties.get("node.id")
        if node_id is not None and int(node_id) != self.node_id:
            raise ClusterMismatchError(
                f"the data dir {self.data_dir} belongs to node {node_id} of cluster {existing}, not node "
                f"{self.node_id}; refusing to start")
        if not existing:
            write_atomically(path, f"version=1\ncluster.id={cluster_id}\nnode.id={self.node_id}\n".encode())
        self.cluster_id = cluster_id

    async def start_cluster(self) -> None:
        """Join (or load) the cluster and apply its first image. Loop thread, once the listeners are bound."""
        refresh = getattr(self.metadata, "refresh_endpoints", None)
        if refresh is not None:
            refresh()
        await self.metadata.start()
        await self.security.start()
        if self.config.clustered:
            self._cluster_tasks.append(asyncio.get_running_loop().create_task(self.replicas.maintain_isr(),
                                                                              name="copyless-isr"))

    async def run_startup_hooks(self) -> None:
        for hook in self.handlers.startup_hooks:
            await hook(self)

    async def run_shutdown_hooks(self) -> None:
        for hook in reversed(self.handlers.shutdown_hooks):
            try:
                await hook(self)
            except Exception:
                log.exception("shutdown hook %r failed", hook)

    async def stop_cluster(self) -> None:
        """Leave the cluster (the backend gives up its lease, so the partitions led here move at once), stop
        fetching, and take every partition offline (waiting acks=all writes answer NOT_LEADER_OR_FOLLOWER).
        Idempotent."""
        if self.replicas.closing:
            return
        for task in self._cluster_tasks:
            task.cancel()
        self.replicas.close()
        try:
            await self.metadata.stop()
        except Exception:
            log.exception("leaving the cluster failed")
        await self.fetchers.close()

    def snapshot_producer_state(self) -> None:
        """Queue a producer snapshot at each partition's log end (a clean shutdown: the next start replays
        nothing). Loop thread."""
        for partition in list(self.replicas.partitions.values()):
            partition.snapshot_state()

    async def expire_producers(self, now_ms: int) -> int:
        """Forget, in every hosted partition, the producers idle past ``producer.id.expiration.ms`` with no
        transaction open there (``Partition.expire_producers``); return how many. Loop thread: O(producers),
        handing the loop back every few hundred partitions."""
        expiration_ms = self.config.producer_id_expiration_ms
        removed = 0
        for number, (key, partition) in enumerate(list(self.replicas.partitions.items()), 1):
            if self.replicas.partitions.get(key) is partition:  # still hosted after the last yield
                removed += partition.expire_producers(now_ms, expiration_ms)
            if number % 256 == 0:
                await asyncio.sleep(0)
        if removed:
            log.info("%d producer(s) idle for more than %d ms forgotten", removed, expiration_ms)
        return removed

    def shutdown_logs(self) -> None:
        """Finish the producer snapshots queued (``snapshot_producer_state``), flush, checkpoint, write the
        clean-shutdown marker. Blocking: worker thread."""
        self.state_files.close()
        if self.log_manager is not None:
            self.log_manager.shutdown()

    def stats_snapshot(self) -> dict:
        """The counters of ``stats-json``: the broker's, plus the cluster's (etcd calls by kind, the
        controller's and the replica fetchers' counters) when it runs in one."""
        snapshot = self.stats.snapshot()
        snapshot["security"] = self.security.snapshot()
        if self.config.clustered:
            metadata: Any = self.metadata  # the etcd backend: its own counters, beyond MetadataBackend's
            snapshot["cluster"] = {
                "broker_epoch": metadata.broker_epoch,
                "lease_valid": metadata.lease_valid(),
                "controller": metadata.is_controller,
                "metadata": dict(metadata.stats),
                "etcd_calls": dict(metadata.client.calls),
                "controller_stats": dict(metadata.controller.stats),
                "fetchers": {str(leader): dict(f.stats) for leader, f in self.fetchers.fetchers.items()},
                "isr_changes": dict(self.replicas.stats),
            }
        return snapshot

    # --- topics (the metadata backend decides; these are the handlers' entry points) --------------------------

    async def create_topic(self, name: str, partitions: int | None = None,
                           configs: dict[str, str | None] | None = None, *, replication_factor: int | None = None,
                           assignments: dict[int, list[int]] | None = None, internal: bool = False,
                           validate_only: bool = False) -> TopicInfo:
        """Create a topic through the metadata backend. Raises TopicError with the Kafka error code."""
        new = NewTopic(name=name, partitions=-1 if partitions is None else partitions,
                       replication_factor=-1 if replication_factor is None else replication_factor,
                       configs=dict(configs or {}), assignments=assignments, internal=internal)
        return await self.metadata.create_topic(new, validate_only=validate_only)

    async def delete_topic(self, name: str) -> None:
        await self.metadata.delete_topic(name)

    async def create_partitions(self, name: str, count: int, assignments=None, *,
                                validate_only: bool = False) -> TopicInfo:
        """CreatePartitions through the metadata backend. Raises TopicError."""
        return await self.metadata.create_partitions(name, count, assignments, validate_only=validate_only)

    def topic(self, name: str) -> TopicInfo | None:
        return self.metadata.image.topic(name)

    def is_creating(self, name: str) -> bool:
        return self.metadata.is_creating(name)

    async def wait_created(self, name: str) -> None:
        await self.metadata.wait_created(name)

    async def allocate_producer_id(self) -> int:
        return await self.metadata.allocate_producer_id()
