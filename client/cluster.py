"""Cluster state shared by producer, consumer and admin: bootstrap, metadata cache, one connection per node.

Owns: ``Metadata`` (pure: brokers, controller, topics -> partition leaders, built from a Metadata v5
response) and ``Cluster`` (the shell: connecting, reconnecting, refreshing metadata, coordinator lookup).
A single-node broker and a multi-broker cluster look the same here: requests go to each partition's leader.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field

from kio.schema.find_coordinator.v1.request import FindCoordinatorRequest
from kio.schema.find_coordinator.v1.response import FindCoordinatorResponse
from kio.schema.metadata.v5.request import MetadataRequest, MetadataRequestTopic
from kio.schema.metadata.v5.response import MetadataResponse

from copyless.client.conn import DEFAULT_REQUEST_TIMEOUT_MS, Connection
from copyless.client.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from copyless.client.protocol.batch_builder import GATHER_MIN_VALUE_BYTES

__all__ = ["Cluster", "Metadata", "TopicInfo", "parse_bootstrap"]

log = logging.getLogger("copyless.client")

# Kafka error codes the cluster layer interprets.
LEADER_NOT_AVAILABLE = 5
UNKNOWN_TOPIC_OR_PARTITION = 3
COORDINATOR_NOT_AVAILABLE = 15
COORDINATOR_LOAD_IN_PROGRESS = 14
NOT_COORDINATOR = 16


def parse_bootstrap(bootstrap) -> list[tuple[str, int]]:
    """``"h1:9092,h2:9093"`` or a list of such strings -> ``[(host, port), ...]`` (port defaults to 9092)."""
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    out = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        host, _, port = item.rpartition(":")
        if not host:
            host, port = item, "9092"
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError(f"no bootstrap servers in {bootstrap!r}")
    return out


@dataclass
class TopicInfo:
    name: str
    error_code: int
    is_internal: bool
    leaders: dict[int, int] = field(default_factory=dict)  # partition -> leader node id (-1 unknown)
    replicas: dict[int, tuple[int, ...]] = field(default_factory=dict)
    isr: dict[int, tuple[int, ...]] = field(default_factory=dict)
    partition_errors: dict[int, int] = field(default_factory=dict)

    @property
    def partitions(self) -> list[int]:
        return sorted(self.leaders)


class Metadata:
    """What the client knows about the cluster (pure)."""

    def __init__(self) -> None:
        self.brokers: dict[int, tuple[str, int]] = {}
        self.controller_id = -1
        self.cluster_id: str | None = None
        self.topics: dict[str, TopicInfo] = {}
        self.updated_at = 0.0

    def update(self, response: MetadataResponse, *, all_topics: bool = False) -> None:
        self.brokers = {int(b.node_id): (b.host, int(b.port)) for b in response.brokers}
        self.controller_id = int(response.controller_id)
        self.cluster_id = response.cluster_id
        if all_topics:
            self.topics = {}
        for topic in response.topics:
            info = TopicInfo(topic.name, int(topic.error_code), bool(topic.is_internal))
            for partition in topic.partitions:
                index = int(partition.partition_index)
                info.leaders[index] = int(partition.leader_id)
                info.replicas[index] = tuple(int(r) for r in partition.replica_nodes)
                info.isr[index] = tuple(int(r) for r in partition.isr_nodes)
                info.partition_errors[index] = int(partition.error_code)
            if info.error_code == 0 and info.leaders:
                self.topics[topic.name] = info
            else:
                self.topics.pop(topic.name, None)
        self.updated_at = time.monotonic()

    def partition_count(self, topic: str) -> int | None:
        info = self.topics.get(topic)
        return len(info.leaders) if info is not None else None

    def leader(self, topic: str, partition: int) -> int:
        info = self.topics.get(topic)
        if info is None:
            return -1
        return info.leaders.get(partition, -1)


class Cluster:
    """Connections and metadata for one client. Loop thread only.

    Args:
        bootstrap_servers: ``"host:port[,host:port]"`` or a list.
        client_id: sent in every request header.
        request_timeout_ms: per-request timeout (Kafka ``request.timeout.ms``).
        metadata_max_age_ms: refresh metadata at least this often (Kafka ``metadata.max.age.ms``).
        gather_min_bytes: the gathered-write crossover for every connection.
    """

    def __init__(
        self,
        bootstrap_servers,
        *,
        client_id: str = "copyless",
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        metadata_max_age_ms: int = 300_000,
        gather_min_bytes: int = GATHER_MIN_VALUE_BYTES,
        retry_backoff_ms: int = 100,
    ) -> None:
        self.bootstrap = parse_bootstrap(bootstrap_servers)
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self.gather_min_bytes = gather_min_bytes
        self.retry_backoff_ms = retry_backoff_ms
        self.metadata = Metadata()
        self._connections: dict[object, Connection] = {}
        self._connecting: dict[object, asyncio.Future] = {}
        self._refresh: asyncio.Task | None = None
        self._wanted_topics: set[str] = set()
        self.closed = False

    async def start(self) -> None:
        """Connect to a bootstrap server and load broker metadata.

        Raises:
            KafkaConnectionError: no bootstrap server answered.
        """
        await self.refresh_metadata([])

    # --- connections --------------------------------------------------------------------------------------

    async def _open(self, key, host: str, port: int, node_id: int | None) -> Connection:
        connection = self._connections.get(key)
        if connection is not None and not connection.closed:
            return connection
        pending = self._connecting.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future = asyncio.get_running_loop().create_future()
        self._connecting[key] = future
        try:
            connection = await Connection.open(
                host,
                port,
                client_id=self.client_id,
                request_timeout_ms=self.request_timeout_ms,
                gather_min_bytes=self.gather_min_bytes,
                node_id=node_id,
            )
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()
            raise
        finally:
            self._connecting.pop(key, None)
        if self.closed:
            connection.close()
            raise KafkaConnectionError("client closed")
        self._connections[key] = connection
        future.set_result(connection)
        return connection

    async def connection(self, node_id: int) -> Connection:
        """The (cached) connection to broker ``node_id``, reconnecting when it was lost."""
        connection = self._connections.get(node_id)
        if connection is not None and not connection.closed:
            return connection
        address = self.metadata.brokers.get(node_id)
        if address is None:
            await self.refresh_metadata()
            address = self.metadata.brokers.get(node_id)
            if address is None:
                raise KafkaConnectionError(f"broker {node_id} is not in the cluster metadata")
        return await self._open(node_id, address[0], address[1], node_id)

    def connection_nowait(self, node_id: int) -> Connection | None:
        connection = self._connections.get(node_id)
        return connection if connection is not None and not connection.closed else None

    async def any_connection(self) -> Connection:
        """A live connection to some broker (a known one first, else a bootstrap server)."""
        for key, connection in self._connections.items():
            if not connection.closed and isinstance(key, int):
                return connection
        errors = []
        nodes = list(self.metadata.brokers.items())
        random.shuffle(nodes)
        for node_id, _address in nodes:
            try:
                return await self.connection(node_id)
            except (KafkaConnectionError, OSError) as exc:
                errors.append(str(exc))
        for host, port in self.bootstrap:
            try:
                return await self._open(("bootstrap", host, port), host, port, None)
            except (KafkaConnectionError, OSError) as exc:
                errors.append(str(exc))
        raise KafkaConnectionError("no broker reachable: " + "; ".join(errors))

    # --- metadata -----------------------------------------------------------------------------------------

    async def refresh_metadata(self, topics: list[str] | None = None, *, allow_auto_create: bool = True):
        """Fetch metadata for ``topics`` (None = every topic, [] = brokers only) and update the cache."""
        request = MetadataRequest(
            topics=None if topics is None else tuple(MetadataRequestTopic(name=t) for t in topics),
            allow_auto_topic_creation=allow_auto_create,
        )
        last: Exception | None = None
        for _attempt in range(3):
            connection = await self.any_connection()
            try:
                response = await connection.request_kio(request, MetadataResponse)
            except (KafkaConnectionError, KafkaTimeoutError) as exc:
                last = exc
                continue
            self.metadata.update(response, all_topics=topics is None)
            return response
        raise KafkaConnectionError(f"metadata request failed: {last}")

    async def wait_for_topic(self, topic: str, timeout_ms: int = 60_000, *, allow_auto_create: bool = True) -> int:
        """Load metadata for ``topic`` until every partition has a leader; return its partition count.

        Raises:
            KafkaError: UNKNOWN_TOPIC_OR_PARTITION (or the topic's error) when it does not appear in time.
        """
        deadline = time.monotonic() + timeout_ms / 1000
        backoff = self.retry_backoff_ms / 1000
        while True:
            info = self.metadata.topics.get(topic)
            if info is not None and all(leader >= 0 for leader in info.leaders.values()):
                return len(info.leaders)
            response = await self.refresh_metadata([topic], allow_auto_create=allow_auto_create)
            info = self.metadata.topics.get(topic)
            if info is not None and all(leader >= 0 for leader in info.leaders.values()):
                return len(info.leaders)
            error = next((int(t.error_code) for t in response.topics if t.name == topic), UNKNOWN_TOPIC_OR_PARTITION)
            if time.monotonic() >= deadline:
                raise KafkaError(error or LEADER_NOT_AVAILABLE, f"topic {topic!r}")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    def request_update(self, topics) -> None:
        """Refresh metadata for ``topics`` in the background (coalesced with a refresh already running)."""
        self._wanted_topics.update(topics)
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.get_running_loop().create_task(self._background_refresh())

    async def _background_refresh(self) -> None:
        await asyncio.sleep(self.retry_backoff_ms / 1000)
        topics, self._wanted_topics = sorted(self._wanted_topics), set()
        try:
            await self.refresh_metadata(topics)
        except Exception as exc:  # next request_update retries
            log.debug("metadata refresh failed: %s", exc)

    async def coordinator(self, group_id: str, timeout_ms: int = 30_000) -> Connection:
        """The connection to ``group_id``'s group coordinator (FindCoordinator v1, retried while loading)."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            connection = await self.any_connection()
            response = await connection.request_kio(
                FindCoordinatorRequest(key=group_id, key_type=0), FindCoordinatorResponse
            )
            code = int(response.error_code)
            if code == 0:
                node_id = int(response.node_id)
                self.metadata.brokers.setdefault(node_id, (response.host, int(response.port)))
                return await self._open(("coordinator", node_id), response.host, int(response.port), node_id)
            if code not in (COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR) or (
                time.monotonic() > deadline
            ):
                raise KafkaError(code, f"FindCoordinator for group {group_id!r}")
            await asyncio.sleep(self.retry_backoff_ms / 1000)

    async def close(self) -> None:
        self.closed = True
        if self._refresh is not None and not self._refresh.done():
            self._refresh.cancel()
        for connection in list(self._connections.values()):
            connection.close()
        self._connections.clear()
