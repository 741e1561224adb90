"""The Broker state object: everything a request handler may reach through ``ctx.broker``.

It owns the topic registry, the log manager, producer state, the long-poll notifier, the stats and the
cluster identity, and it is where topic lifecycle is made crash-consistent:

- create: partition logs first (worker thread: preallocation), then the registry file (tmp + fsync +
  rename). A crash in between leaves log directories the registry does not list; startup deletes them,
  and the client never saw the topic acknowledged.
- delete: the registry file first, then the logs (renamed to ``*-delete`` and removed by storage). A crash in
  between leaves the same kind of orphan, deleted the same way.
- a data dir with logs but no ``topics.json`` (registry lost) adopts the logs as topics rather than
  deleting data.

Cluster identity lives in ``<data_dir>/meta.properties`` (Kafka's file and keys: ``version``,
``cluster.id``, ``node.id``), created on first start.

Single node: every partition's leader is this node, the leader epoch is 0 forever (so KIP-320 clients never
see it move, across restarts too), and the high watermark is the log end offset.

Threading: methods are loop-thread unless marked blocking; blocking work (fsync, preallocation,
unlinks, LogManager.shutdown) runs in worker threads.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from copyless.broker._files import write_atomically
from copyless.broker.config import BrokerConfig
from copyless.broker.handlers import HandlerTable, load_handlers
from copyless.broker.notify import AppendNotifier
from copyless.broker.producer_state import ProducerIdAllocator, ProducerStateManager
from copyless.broker.stats import BrokerStats
from copyless.broker.topics import Topic, TopicError, TopicRegistry, parse_topic_configs

__all__ = ["Broker", "LEADER_EPOCH"]

log = logging.getLogger("copyless.broker")

LEADER_EPOCH = 0
META_FILE = "meta.properties"


def _storage():
    # Imported lazily so the pure layers (wire, handlers' decision code) import without the storage part.
    import copyless.broker.storage as storage

    return storage


def producer_state_scan_start(partition_log) -> int:
    """Where the startup scan for producer state begins: the second-to-last segment.

    Deduplication only needs the batches a retry can still refer to: the last five per producer, sent
    moments before the restart. Kafka keeps producer-state snapshots for this; scanning the last two
    segments' headers instead bounds startup to O(two segments) per partition rather than O(log) (a header
    scan runs at roughly a million batches per second). A producer idle since before those segments restarts
    with no state and may continue at any sequence, as Kafka allows once producer state expires.
    """
    bases = partition_log.segment_base_offsets()
    start = bases[-2] if len(bases) >= 2 else partition_log.log_start_offset
    return max(start, partition_log.log_start_offset)


class Broker:
    """Shared state of one broker process.

    Attributes (the handler contract):
        config: BrokerConfig.
        node_id, cluster_id: identity for Metadata / FindCoordinator.
        log_manager: broker.storage.LogManager.
        topics: TopicRegistry (``topics.get(name) -> Topic | None``).
        producers: ProducerStateManager; producer_ids: ProducerIdAllocator.
        appends: AppendNotifier (``notify((topic, partition))`` after an append wakes long-poll fetches).
        stats: BrokerStats.
        handlers: HandlerTable (drives dispatch and ApiVersions).
        groups: set by the groups part's startup hook (None until then).
        closing: True once shutdown began.
    """

    def __init__(self, config: BrokerConfig, *, handlers: HandlerTable | None = None) -> None:
        self.config = config
        self.node_id = config.node_id
        self.data_dir = Path(config.data_dir)
        self.cluster_id: str = ""
        self.topics = TopicRegistry(self.data_dir)
        self.producers = ProducerStateManager()
        self.producer_ids = ProducerIdAllocator(self.data_dir, config.producer_id_block_size)
        self.appends = AppendNotifier()
        self.stats = BrokerStats()
        self.handlers = handlers if handlers is not None else load_handlers()
        self.log_manager: Any = None
        self.groups: Any = None
        self.closing = False
        self._creating: dict[str, asyncio.Future] = {}
        self._deleting: dict[str, asyncio.Future] = {}
        self._registry_lock: asyncio.Lock | None = None
        self._producer_id_lock: asyncio.Lock | None = None

    # --- startup / shutdown ----------------------------------------------------------------------------

    def default_log_config(self):
        """The broker-wide LogConfig (topic configs override it: ``log_config_for``)."""
        return self.config.log_config()

    def log_config_for(self, topic: Topic):
        """The topic's LogConfig: broker defaults with the topic's overrides."""
        overrides = parse_topic_configs(topic.configs)
        return dataclasses.replace(self.default_log_config(), **overrides)

    def startup(self) -> None:
        """Load identity, topics and logs; reconcile them; rebuild producer state. Blocking: before serving."""
        started = time.monotonic()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.cluster_id = self._load_or_create_meta()
        self.topics.load()
        storage = _storage()
        # The storage's own housekeeping thread applies flush.ms, retention and recovery-point checkpoints.
        self.log_manager = storage.LogManager(
            self.data_dir,
            default_config=self.default_log_config(),
            topic_configs={topic.name: self.log_config_for(topic) for topic in self.topics},
            retention_check_interval_ms=self.config.retention_check_interval_ms,
        )
        self.log_manager.startup()
        self._reconcile_logs()
        producers = 0
        for (topic, partition), partition_log in self.log_manager.logs().items():
            producers += self.producers.rebuild(
                topic, partition, partition_log.batch_headers(producer_state_scan_start(partition_log))
            )
        self.producer_ids.load(floor=self.producers.max_producer_id() + 1)
        log.info(
            "broker state loaded: cluster_id=%s node_id=%d topics=%d partitions=%d producers=%d in %.0f ms",
            self.cluster_id, self.node_id, len(self.topics), len(self.log_manager.logs()), producers,
            (time.monotonic() - started) * 1000,
        )

    def _load_or_create_meta(self) -> str:
        path = self.data_dir / META_FILE
        try:
            properties = dict(
                line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and not line.startswith("#")
            )
            cluster_id = properties["cluster.id"].strip()
            node_id = int(properties.get("node.id", self.node_id))
            if node_id != self.node_id:
                log.warning("%s says node.id=%d; configured node.id=%d wins", path, node_id, self.node_id)
            return cluster_id
        except FileNotFoundError:
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
            write_atomically(path, f"version=1\ncluster.id={cluster_id}\nnode.id={self.node_id}\n".encode())
            return cluster_id

    def _reconcile_logs(self) -> None:
        """Make the registry and the log directories agree (see the module docstring)."""
        existing = self.log_manager.logs()
        adopted: dict[str, int] = {}
        for (topic_name, partition), partition_log in list(existing.items()):
            topic = self.topics.get(topic_name)
            if topic is not None and partition < topic.partitions:
                continue
            if self.topics.loaded_from_disk:
                log.warning("deleting %s-%d: not in the topic registry (interrupted create or delete)", topic_name, partition)
                self.log_manager.delete_log(topic_name, partition)
            else:
                adopted[topic_name] = max(adopted.get(topic_name, 0), partition + 1)
        for name, partitions in adopted.items():
            log.warning("adopting topic %s with %d partitions from its log directories (no registry)", name, partitions)
            self.topics.add(Topic(name=name, partitions=partitions, internal=name.startswith("__")))
        for topic in self.topics:
            config = self.log_config_for(topic)
            for partition in range(topic.partitions):
                if self.log_manager.get_log(topic.name, partition) is None:
                    log.warning("recreating missing log %s-%d", topic.name, partition)
                    self.log_manager.create_log(topic.name, partition, config)
        if adopted or not self.topics.path.exists():
            self.topics.persist()

    async def run_startup_hooks(self) -> None:
        for hook in self.handlers.startup_hooks:
            await hook(self)

    async def run_shutdown_hooks(self) -> None:
        for hook in reversed(self.handlers.shutdown_hooks):
            try:
                await hook(self)
            except Exception:
                log.exception("shutdown hook %r failed", hook)

    def shutdown_logs(self) -> None:
        """Flush, checkpoint, write the clean-shutdown marker. Blocking: worker thread."""
        if self.log_manager is not None:
            self.log_manager.shutdown()

    # --- partitions ----------------------------------------------------------------------------------------

    def get_log(self, topic: str, partition: int):
        """The PartitionLog, or None when the topic or partition does not exist (-> UNKNOWN_TOPIC_OR_PARTITION)."""
        entry = self.topics.get(topic)
        if entry is None or not 0 <= partition < entry.partitions:
            return None
        return self.log_manager.get_log(topic, partition)

    def append_records(self, topic: str, partition: int, records, *, log_append_time_ms: int | None = None):
        """Append already-validated batches and wake long-poll fetches. Loop thread, non-blocking.

        For internal writers (e.g. committed offsets); client produce goes through the Produce handler,
        which validates first. Raises StorageError; returns storage's AppendResult.
        """
        partition_log = self.get_log(topic, partition)
        if partition_log is None:
            raise TopicError(ErrorCode.unknown_topic_or_partition, f"{topic}-{partition} does not exist")
        result = partition_log.append(records, leader_epoch=LEADER_EPOCH, log_append_time_ms=log_append_time_ms)
        self.appends.notify((topic, partition))
        return result

    # --- topic lifecycle -------------------------------------------------------------------------------------

    def _lock(self) -> asyncio.Lock:
        if self._registry_lock is None:
            self._registry_lock = asyncio.Lock()
        return self._registry_lock

    async def _persist_registry(self) -> None:
        # The snapshot is taken under the lock so writes land in the order the changes were made.
        async with self._lock():
            contents = self.topics.snapshot()
            await asyncio.to_thread(self.topics.persist, contents)

    async def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        configs: dict[str, str | None] | None = None,
        *,
        replication_factor: int | None = None,
        internal: bool = False,
        validate_only: bool = False,
    ) -> Topic:
        """Validate and create a topic (logs, then registry). Returns it when done.

        Raises:
            TopicError: with the Kafka error code (INVALID_TOPIC_EXCEPTION, TOPIC_ALREADY_EXISTS,
                INVALID_PARTITIONS, INVALID_REPLICATION_FACTOR, INVALID_CONFIG, KAFKA_STORAGE_ERROR).
        """
        if name in self._creating:
            raise TopicError(ErrorCode.topic_already_exists, f"Topic '{name}' is being created.")
        pending_delete = self._deleting.get(name)
        if pending_delete is not None:
            # Recreating a topic whose logs are still being removed: wait, or the old logs would be reused.
            await asyncio.shield(pending_delete)
            if name in self._creating:
                raise TopicError(ErrorCode.topic_already_exists, f"Topic '{name}' is being created.")
        self.topics.check_new(name, internal=internal)
        configs = dict(configs or {})
        parse_topic_configs(configs)
        if partitions is None or partitions == -1:
            partitions = self.config.num_partitions
        if partitions < 1:
            raise TopicError(ErrorCode.invalid_partitions, "Number of partitions must be larger than 0.")
        if partitions > 100_000:
            raise TopicError(ErrorCode.invalid_partitions, f"Number of partitions {partitions} exceeds 100000.")
        if replication_factor is not None and replication_factor not in (-1, 1):
            raise TopicError(
                ErrorCode.invalid_replication_factor,
                f"Unable to replicate the partition {replication_factor} time(s): The target replication factor "
                f"of {replication_factor} cannot be reached because only 1 broker(s) are registered.",
            )
        topic = Topic(name=name, partitions=partitions, configs={k: str(v) for k, v in configs.items()}, internal=internal)
        log_config = self.log_config_for(topic)
        if validate_only:
            return topic
        done = asyncio.get_running_loop().create_future()
        self._creating[name] = done
        try:
            try:
                await asyncio.to_thread(self._create_logs_blocking, topic, log_config)
            except Exception as exc:
                storage = _storage()
                if isinstance(exc, storage.StorageError):
                    raise TopicError(ErrorCode.kafka_storage_error, f"Cannot create logs for '{name}': {exc}") from exc
                raise
            self.topics.add(topic)
            await self._persist_registry()
            log.info("created topic %s with %d partition(s) configs=%s", name, partitions, dict(topic.configs) or "{}")
            return topic
        finally:
            del self._creating[name]
            if not done.done():
                done.set_result(None)

    def _create_logs_blocking(self, topic: Topic, log_config) -> None:
        created = []
        try:
            for partition in range(topic.partitions):
                if self.log_manager.get_log(topic.name, partition) is None:
                    self.log_manager.create_log(topic.name, partition, log_config)
                    created.append(partition)
        except Exception:
            for partition in created:
                try:
                    self.log_manager.delete_log(topic.name, partition)
                except Exception:
                    log.exception("cleanup of %s-%d failed", topic.name, partition)
            raise

    async def wait_created(self, name: str) -> None:
        """Wait for an in-progress creation of ``name`` (if any) to finish."""
        pending = self._creating.get(name)
        if pending is not None:
            await asyncio.shield(pending)

    def is_creating(self, name: str) -> bool:
        return name in self._creating

    async def delete_topic(self, name: str) -> None:
        """Remove a topic: registry first, then its logs.

        Raises:
            TopicError: UNKNOWN_TOPIC_OR_PARTITION, or INVALID_TOPIC_EXCEPTION for an internal topic.
        """
        topic = self.topics.get(name)
        if topic is None:
            raise TopicError(ErrorCode.unknown_topic_or_partition, "This server does not host this topic-partition.")
        if topic.internal:
            raise TopicError(ErrorCode.invalid_topic_exception, f"Topic '{name}' is internal and cannot be deleted")
        self.topics.remove(name)
        done = asyncio.get_running_loop().create_future()
        self._deleting[name] = done
        try:
            await self._persist_registry()
            for partition in range(topic.partitions):
                self.producers.remove_partition(name, partition)
            # Long-poll fetches on the topic answer now; their next round sees UNKNOWN_TOPIC_OR_PARTITION.
            self.appends.notify_topic(name)
            await asyncio.to_thread(self._delete_logs_blocking, topic)
        finally:
            del self._deleting[name]
            done.set_result(None)
        log.info("deleted topic %s (%d partition(s))", name, topic.partitions)

    def _delete_logs_blocking(self, topic: Topic) -> None:
        for partition in range(topic.partitions):
            try:
                self.log_manager.delete_log(topic.name, partition)
            except Exception:
                log.exception("deleting log %s-%d failed; it is deleted at the next startup", topic.name, partition)

    # --- producer ids ------------------------------------------------------------------------------------------

    async def allocate_producer_id(self) -> int:
        if self._producer_id_lock is None:
            self._producer_id_lock = asyncio.Lock()
        async with self._producer_id_lock:
            if self.producer_ids.needs_block:
                await asyncio.to_thread(self.producer_ids.reserve_block)
            return self.producer_ids.next_id()
