"""EmbeddedMetadata: the single-node backend. This node is the whole cluster; its topics live in
``topics.json`` in the data directory. No coordination service is needed.

Every partition's leader is this node, its leader epoch is 0 forever (so KIP-320 clients never see it move,
across restarts too), its ISR and replicas are this node alone, so the high watermark is the log end.

Topic lifecycle is crash-consistent:

- create: partition logs first (worker thread: preallocation), then the registry (tmp + fsync + rename).
  A crash in between leaves log directories the registry does not list; start-up deletes them, and the
  client never saw the topic acknowledged.
- delete: the registry first, then the logs (the replica manager renames them ``*-delete`` for storage to
  remove). A crash in between leaves the same kind of orphan, deleted the same way.
- a data dir with logs but no ``topics.json`` (registry lost) adopts the logs as topics rather than
  deleting data.

- add partitions: the new partitions' logs first, then the registry, as for a create (a crash in between
  leaves logs the registry does not list, deleted at start-up).
- config changes: a topic's overrides are rewritten in the registry; dynamic broker configs live in
  ``broker-configs.json`` (``{"version": 1, "configs": {"": {...}, "0": {...}}}``, tmp + fsync + rename),
  read before the logs load so they load with them. Both take effect when the new image is applied.

Producer ids are reserved on disk in blocks (``producer-id-block``) so none is reused after a restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from kio.schema.errors import ErrorCode

from copyless.broker._files import write_atomically
from copyless.broker.cluster.backend import MetadataBackend, NewTopic, plan_partitions, plan_topic
from copyless.broker.cluster.image import BrokerInfo, ClusterImage, TopicInfo
from copyless.broker.partition import PartitionState
from copyless.broker.producer_state import ProducerIdAllocator
from copyless.broker.topics import Topic, TopicError, TopicRegistry

__all__ = ["EmbeddedMetadata", "LEADER_EPOCH", "BROKER_CONFIGS_FILE"]

log = logging.getLogger("copyless.metadata")

LEADER_EPOCH = 0
BROKER_CONFIGS_FILE = "broker-configs.json"


def read_broker_configs(path) -> dict[str, dict[str, str]]:
    """``broker-configs.json`` as {key: {name: value}} ({} when absent). Blocking.

    Raises:
        ValueError: the file exists but is not such a file (never silently dropped: it holds settings).
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(raw)
        return {str(key): {str(k): str(v) for k, v in dict(values).items()}
                for key, values in dict(data["configs"]).items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"dynamic broker configs {path} are corrupt: {exc}") from exc


def _topic_info(topic: Topic, node_id: int) -> TopicInfo:
    return TopicInfo(name=topic.name, topic_id=topic.topic_id, assignment=((node_id,),) * topic.partitions,
                     configs=dict(topic.configs), internal=topic.internal)


class EmbeddedMetadata(MetadataBackend):
    """Single-node metadata over ``topics.json``. ``broker`` provides config, node_id, cluster_id, data_dir,
    log_manager, replicas (the ReplicaManager) and producers."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.node_id = broker.node_id
        self.topics = TopicRegistry(broker.data_dir)
        self.producer_ids = ProducerIdAllocator(broker.data_dir, broker.config.producer_id_block_size)
        self.image = ClusterImage()
        self.broker_configs: dict[str, dict[str, str]] = {}
        self._broker_configs_path = broker.data_dir / BROKER_CONFIGS_FILE
        self._revision = 0
        self._creating: dict[str, asyncio.Future] = {}
        self._deleting: dict[str, asyncio.Future] = {}
        self._registry_lock: asyncio.Lock | None = None
        self._producer_id_lock: asyncio.Lock | None = None

    @property
    def is_controller(self) -> bool:
        return True

    def lease_valid(self) -> bool:
        return True

    # --- start-up --------------------------------------------------------------------------------------------

    def load_registry(self) -> dict[str, Topic]:
        """Read ``topics.json`` (blocking; before the logs load, so they load with their topics' settings).

        Raises:
            ValueError: the file exists but is not a registry.
        """
        self.topics.load()
        self.broker_configs = read_broker_configs(self._broker_configs_path)
        if self.broker_configs:
            self.broker.apply_broker_configs(self.broker_configs)
        return {topic.name: topic for topic in self.topics}

    def load_blocking(self) -> None:
        """Reconcile the registry with the logs on disk (module docstring). Blocking: before serving, after
        the logs are loaded."""
        existing = self.broker.log_manager.logs()
        adopted: dict[str, int] = {}
        for topic_name, partition in existing:
            topic = self.topics.get(topic_name)
            if topic is not None and partition < topic.partitions:
                continue
            if not self.topics.loaded_from_disk:
                adopted[topic_name] = max(adopted.get(topic_name, 0), partition + 1)
            # else: not in the registry: an interrupted create or delete; the image leaves it out, and the
            # replica manager deletes it.
        for name, partitions in adopted.items():
            log.warning("adopting topic %s with %d partitions from its log directories (no registry)", name, partitions)
            # The logs name their topic id (partition.metadata): the adopted topic keeps it, so they are its.
            ids = {self.broker.replicas.local_topic_id(name, p) for p in range(partitions)} - {None}
            topic_id = ids.pop() if len(ids) == 1 else None
            self.topics.add(Topic(name=name, partitions=partitions, internal=name.startswith("__"),
                                  **({"topic_id": topic_id} if topic_id is not None else {})))
        if adopted or not self.topics.path.exists():
            self.topics.persist()
        for topic in self.topics:
            # Logs written before topic ids were recorded carry none: they are this topic's by name.
            for partition in range(topic.partitions):
                if ((topic.name, partition) in existing
                        and self.broker.replicas.local_topic_id(topic.name, partition) is None):
                    self.broker.replicas.create_logs_blocking(_topic_info(topic, self.node_id), [partition])
        self.producer_ids.load(floor=self.broker.producers.max_producer_id() + 1)
        self.image = self._build_image()

    async def start(self) -> None:
        self.broker.replicas.publish(self.image)
        await self.broker.replicas.wait_applied(self.image.revision)

    async def stop(self) -> None:
        return None

    def _build_image(self) -> ClusterImage:
        node = self.node_id
        endpoints = {name: address for name, address in self.broker.advertised_listeners().items()}
        topics = {topic.name: _topic_info(topic, node) for topic in self.topics}
        state = PartitionState(leader=node, leader_epoch=LEADER_EPOCH, isr=(node,), replicas=(node,), version=0)
        partitions = {(topic.name, p): state for topic in self.topics for p in range(topic.partitions)}
        self._revision += 1
        return ClusterImage(revision=self._revision, cluster_id=self.broker.cluster_id, controller_id=node,
                            brokers={node: BrokerInfo(node, endpoints, epoch=0)}, topics=topics,
                            partitions=partitions,
                            broker_configs={key: dict(values) for key, values in self.broker_configs.items()})

    async def _publish(self) -> None:
        self.image = self._build_image()
        self.broker.replicas.publish(self.image)
        await self.broker.replicas.wait_applied(self.image.revision)

    def refresh_endpoints(self) -> None:
        """The listeners are bound (port 0 resolved): the image's broker entry must say where."""
        self.image = self._build_image()
        self.broker.replicas.image = self.image

    # --- topics ------------------------------------------------------------------------------------------------

    def _lock(self) -> asyncio.Lock:
        if self._registry_lock is None:
            self._registry_lock = asyncio.Lock()
        return self._registry_lock

    async def _persist_registry(self) -> None:
        # The snapshot is taken under the lock so writes land in the order the changes were made.
        async with self._lock():
            contents = self.topics.snapshot()
            await asyncio.to_thread(self.topics.persist, contents)

    def is_creating(self, name: str) -> bool:
        return name in self._creating

    async def wait_created(self, name: str) -> None:
        pending = self._creating.get(name)
        if pending is not None:
            await asyncio.shield(pending)

    async def create_topic(self, new: NewTopic, *, validate_only: bool = False) -> TopicInfo:
        name = new.name
        if name in self._creating:
            raise TopicError(ErrorCode.topic_already_exists, f"Topic '{name}' is being created.")
        pending_delete = self._deleting.get(name)
        if pending_delete is not None:
            # Recreating a topic whose logs are still being removed: wait, or the old logs would be reused.
            await asyncio.shield(pending_delete)
            if name in self._creating:
                raise TopicError(ErrorCode.topic_already_exists, f"Topic '{name}' is being created.")
        config = self.broker.config
        info = plan_topic(new, existing=self.topics.names(), live_brokers=[self.node_id],
                          default_partitions=config.num_partitions, default_replication_factor=1)
        if validate_only:
            return info
        done = asyncio.get_running_loop().create_future()
        self._creating[name] = done
        try:
            try:
                await asyncio.to_thread(self.broker.replicas.create_logs_blocking, info, range(info.partitions))
            except Exception as exc:
                from copyless.broker.storage import StorageError

                if isinstance(exc, StorageError):
                    raise TopicError(ErrorCode.kafka_storage_error, f"Cannot create logs for '{name}': {exc}") from exc
                raise
            self.topics.add(Topic(name=name, partitions=info.partitions, configs=dict(info.configs),
                                  internal=new.internal, topic_id=info.topic_id))
            await self._persist_registry()
            await self._publish()
            log.info("created topic %s with %d partition(s) configs=%s", name, info.partitions,
                     dict(info.configs) or "{}")
            return info
        finally:
            del self._creating[name]
            if not done.done():
                done.set_result(None)

    async def delete_topic(self, name: str) -> None:
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
            # Long-poll fetches on the topic answer now; their next round sees UNKNOWN_TOPIC_OR_PARTITION.
            self.broker.appends.notify_topic(name)
            await self._publish()
        finally:
            del self._deleting[name]
            done.set_result(None)
        log.info("deleted topic %s (%d partition(s))", name, topic.partitions)

    async def alter_isr(self, topic: str, partition: int, state: PartitionState, isr: tuple[int, ...],
                        joining_epochs=None) -> PartitionState | None:
        return None  # one replica: the ISR never changes

    async def create_partitions(self, name: str, count: int, assignments: Sequence[Sequence[int]] | None = None,
                                *, validate_only: bool = False) -> TopicInfo:
        topic = self.topics.get(name)
        if topic is None or name in self._creating:
            raise TopicError(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")
        info = plan_partitions(_topic_info(topic, self.node_id), count, assignments, live_brokers=[self.node_id])
        if validate_only:
            return info
        try:
            await asyncio.to_thread(self.broker.replicas.create_logs_blocking, info, range(topic.partitions, count))
        except Exception as exc:
            from copyless.broker.storage import StorageError

            if isinstance(exc, StorageError):
                raise TopicError(ErrorCode.kafka_storage_error, f"Cannot create logs for '{name}': {exc}") from exc
            raise
        if self.topics.get(name) is not topic:
            raise TopicError(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' changed meanwhile.")
        self.topics.replace(name, partitions=count)
        await self._persist_registry()
        await self._publish()
        log.info("topic %s: %d -> %d partitions", name, topic.partitions, count)
        return info

    async def alter_topic_configs(self, name: str, configs: Mapping[str, str], *, validate_only: bool = False) -> None:
        topic = self.topics.get(name)
        if topic is None:
            raise TopicError(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")
        if validate_only:
            return
        self.topics.replace(name, configs=dict(configs))
        await self._persist_registry()
        await self._publish()
        log.info("topic %s: configs %s -> %s", name, dict(topic.configs) or "{}", dict(configs) or "{}")

    async def alter_broker_configs(self, key: str, configs: Mapping[str, str], *, validate_only: bool = False) -> None:
        if validate_only:
            return
        previous = dict(self.broker_configs.get(key, {}))
        if configs:
            self.broker_configs[key] = dict(configs)
        else:
            self.broker_configs.pop(key, None)
        async with self._lock():
            contents = json.dumps({"version": 1, "configs": self.broker_configs}, indent=1, sort_keys=True).encode()
            await asyncio.to_thread(write_atomically, self._broker_configs_path, contents)
        await self._publish()
        log.info("dynamic broker configs %r: %s -> %s", key or "<default>", previous or "{}", dict(configs) or "{}")

    async def elect_preferred_leaders(self, partitions: Sequence[tuple[str, int]] | None = None) -> dict:
        """One replica per partition, always its preferred one: every election is not needed."""
        keys = list(partitions) if partitions is not None else list(self.image.partitions)
        return {key: ErrorCode.election_not_needed if key in self.image.partitions
                else ErrorCode.unknown_topic_or_partition for key in keys}

    # --- producer ids -------------------------------------------------------------------------------------------

    async def allocate_producer_id(self) -> int:
        if self._producer_id_lock is None:
            self._producer_id_lock = asyncio.Lock()
        async with self._producer_id_lock:
            if self.producer_ids.needs_block:
                await asyncio.to_thread(self.producer_ids.reserve_block)
            return self.producer_ids.next_id()
