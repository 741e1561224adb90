"""Cluster state shared by producer, consumer and admin: bootstrap, metadata cache, one connection per node.

Owns: ``Metadata`` (pure: brokers, controller, topics -> partition leaders and leader epochs, built from
Metadata v8 responses, v5 when a broker has no v7+) and ``Cluster`` (the shell: connecting, reconnecting,
refreshing metadata, coordinator lookup, offset lookups by leader). A single-node broker and a
multi-broker cluster look the same here: requests go to each partition's leader.

Leader epochs (KIP-320): brokers answer Metadata from their own view of the cluster, and a broker that
has not yet heard of a leader change still names the old leader. A partition's entry is therefore replaced
only by one with the same or a higher leader epoch; a lower one is dropped (the Java client's
``Metadata.updateLatestMetadata`` rule), so a stale answer from a lagging broker cannot send requests
back to a deposed leader. Requests carry the epoch known here as ``current_leader_epoch``; a broker on a
different epoch answers FENCED_LEADER_EPOCH or UNKNOWN_LEADER_EPOCH, and the caller refreshes.

Failures: every request path treats a lost connection, a timeout and the retriable "leader moved" errors
(``LEADER_ERRORS``) the same way: refresh metadata (coalesced, after ``retry_backoff_ms``) and retry until
its own deadline. Requests any broker answers go to the least loaded live connection; a broker whose last
answer named no leader (or no coordinator) is asked only when no other can be reached, so a broker cut off
from the cluster, still reachable by the client, cannot hold it on a view that no longer changes.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field

from kio.schema.find_coordinator.v1.request import FindCoordinatorRequest
from kio.schema.find_coordinator.v1.response import FindCoordinatorResponse
from kio.schema.list_offsets.v4.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.schema.list_offsets.v4.response import ListOffsetsResponse
from kio.schema.metadata.v5 import request as metadata_v5
from kio.schema.metadata.v5 import response as metadata_v5_response
from kio.schema.metadata.v8 import request as metadata_v8
from kio.schema.metadata.v8 import response as metadata_v8_response
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i64

from copyless.client.conn import DEFAULT_REQUEST_TIMEOUT_MS, Connection
from copyless.client.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError, NotKafkaError
from copyless.protocol.batch_builder import GATHER_MIN_VALUE_BYTES

__all__ = ["Cluster", "Metadata", "TopicInfo", "parse_bootstrap", "LEADER_ERRORS", "COORDINATOR_ERRORS",
           "EARLIEST", "LATEST"]

log = logging.getLogger("copyless.client")

# Kafka error codes the cluster layer interprets.
LEADER_NOT_AVAILABLE = 5
UNKNOWN_TOPIC_OR_PARTITION = 3
COORDINATOR_NOT_AVAILABLE = 15
COORDINATOR_LOAD_IN_PROGRESS = 14
NOT_COORDINATOR = 16
NOT_LEADER_OR_FOLLOWER = 6
KAFKA_STORAGE_ERROR = 56
FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75
# Errors after which a partition's leader may have moved: the request is retried after a metadata refresh
# (the Java client's InvalidMetadataException family).
LEADER_ERRORS = frozenset({
    UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER, KAFKA_STORAGE_ERROR,
    FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH,
})
COORDINATOR_ERRORS = frozenset({COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR})
EARLIEST = -2
LATEST = -1
# Kafka's socket.connection.setup.timeout.ms: a bootstrap host that does not answer (a dead machine, a
# dropped SYN) costs this long before the next one is tried, not the whole request timeout.
CONNECT_TIMEOUT_MS = 10_000


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
    leader_epochs: dict[int, int] = field(default_factory=dict)  # partition -> leader epoch (-1 unknown)

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

    def update(self, response, *, all_topics: bool = False) -> set[str]:
        """Apply a Metadata (v5 or v8) response. Returns the topics of which some partition's entry was
        older than the one known (kept; the caller may ask again)."""
        self.brokers = {int(b.node_id): (b.host, int(b.port)) for b in response.brokers}
        self.controller_id = int(response.controller_id)
        self.cluster_id = response.cluster_id
        stale: set[str] = set()
        previous = self.topics
        if all_topics:
            self.topics = {}
        for topic in response.topics:
            info = TopicInfo(topic.name, int(topic.error_code), bool(topic.is_internal))
            known = previous.get(topic.name)
            for partition in topic.partitions:
                index = int(partition.partition_index)
                epoch = int(getattr(partition, "leader_epoch", -1))
                known_epoch = known.leader_epochs.get(index, -1) if known is not None else -1
                if known is not None and epoch < known_epoch:
                    # A broker that has not seen the latest leader change yet: keep what is known.
                    stale.add(topic.name)
                    info.leaders[index] = known.leaders[index]
                    info.replicas[index] = known.replicas[index]
                    info.isr[index] = known.isr[index]
                    info.partition_errors[index] = known.partition_errors.get(index, 0)
                    info.leader_epochs[index] = known_epoch
                    continue
                info.leaders[index] = int(partition.leader_id)
                info.replicas[index] = tuple(int(r) for r in partition.replica_nodes)
                info.isr[index] = tuple(int(r) for r in partition.isr_nodes)
                info.partition_errors[index] = int(partition.error_code)
                info.leader_epochs[index] = epoch
            if info.error_code == 0 and info.leaders:
                self.topics[topic.name] = info
            else:
                self.topics.pop(topic.name, None)
        self.updated_at = time.monotonic()
        return stale

    def partition_count(self, topic: str) -> int | None:
        info = self.topics.get(topic)
        return len(info.leaders) if info is not None else None

    def leader(self, topic: str, partition: int) -> int:
        info = self.topics.get(topic)
        if info is None:
            return -1
        return info.leaders.get(partition, -1)

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The partition's leader epoch as last seen (-1: unknown, or a broker without Metadata v7)."""
        info = self.topics.get(topic)
        if info is None:
            return -1
        return info.leader_epochs.get(partition, -1)


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
        security=None,
    ) -> None:
        self.bootstrap = parse_bootstrap(bootstrap_servers)
        self.security = security
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
        # The broker whose last Metadata answer left a partition asked for without a leader, or was behind
        # on a leader epoch: the next refresh asks another broker first (see any_connection).
        self._metadata_behind: int | None = None
        self.closed = False

    async def start(self) -> None:
        """Connect to a bootstrap server and load broker metadata.

        Raises:
            NotKafkaError: every bootstrap address answered, but not as a Kafka broker (within 5 s).
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
                connect_timeout_ms=min(self.request_timeout_ms, CONNECT_TIMEOUT_MS),
                gather_min_bytes=self.gather_min_bytes,
                node_id=node_id,
                security=self.security,
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

    async def any_connection(self, *, avoid: int | None = None) -> Connection:
        """A connection for a request any broker answers (Metadata, FindCoordinator, admin requests).

        The live connection with the fewest requests in flight (the Java client's least loaded node), else a
        known broker connected now, else a bootstrap server. ``avoid``: a broker whose last answer was of no
        use (it named no leader, or no coordinator) is taken only when no other broker can be reached. A
        broker cut off from the rest of the cluster but still reachable by this client answers from a view
        that no longer changes; asked first every time, it would hold the client there for good.
        """
        live = [(connection.in_flight_count, node_id != avoid, connection)
                for node_id, connection in self._connections.items()
                if isinstance(node_id, int) and not connection.closed]
        preferred = [(load, connection) for load, usable, connection in live if usable]
        if preferred:
            return min(preferred, key=lambda item: item[0])[1]
        errors = []
        nodes = [(node_id, address) for node_id, address in self.metadata.brokers.items() if node_id != avoid]
        random.shuffle(nodes)
        tried = set()
        for node_id, address in nodes:
            tried.add(tuple(address))
            try:
                return await self.connection(node_id)
            except (KafkaConnectionError, OSError) as exc:
                errors.append(str(exc))
        if live:
            return live[0][2]  # only the broker to avoid is reachable: its answer may have changed by now
        not_kafka = True
        for host, port in self.bootstrap:
            if (host, port) in tried:
                continue  # the broker just tried there: a second wait would only repeat its error
            try:
                return await self._open(("bootstrap", host, port), host, port, None)
            except (KafkaConnectionError, OSError) as exc:
                errors.append(str(exc))
                not_kafka = not_kafka and isinstance(exc, NotKafkaError)
        if not_kafka and not self.metadata.brokers:
            raise NotKafkaError("; ".join(errors))
        raise KafkaConnectionError("no broker reachable: " + "; ".join(errors))

    # --- metadata -----------------------------------------------------------------------------------------

    async def refresh_metadata(self, topics: list[str] | None = None, *, allow_auto_create: bool = True):
        """Fetch metadata for ``topics`` (None = every topic, [] = brokers only) and update the cache.

        Metadata v8 (leader epochs) where the broker has it, else v5. Tries up to three brokers.

        Raises:
            NotKafkaError: the client has never reached a broker and no bootstrap address answers as one (at
                once, without retries: a wrong port is not a transient failure).
            KafkaConnectionError: no broker answered.
        """
        last: Exception | None = None
        for _attempt in range(3):
            try:
                connection = await self.any_connection(avoid=self._metadata_behind)
            except KafkaConnectionError as exc:
                if isinstance(exc, NotKafkaError) and not self.metadata.updated_at:
                    raise  # never reached a broker, and every bootstrap address is something else: a wrong port
                last = exc
                await asyncio.sleep(self.retry_backoff_ms / 1000)
                continue
            names = None if topics is None else tuple(topics)
            request: metadata_v8.MetadataRequest | metadata_v5.MetadataRequest
            response_cls: type[metadata_v8_response.MetadataResponse] | type[metadata_v5_response.MetadataResponse]
            if connection.supports(3, 8) or not connection.api_versions:
                request = metadata_v8.MetadataRequest(
                    topics=None if names is None else tuple(metadata_v8.MetadataRequestTopic(name=TopicName(t))
                                                            for t in names),
                    allow_auto_topic_creation=allow_auto_create,
                    include_cluster_authorized_operations=False,
                    include_topic_authorized_operations=False,
                )
                response_cls = metadata_v8_response.MetadataResponse
            else:
                request = metadata_v5.MetadataRequest(
                    topics=None if names is None else tuple(metadata_v5.MetadataRequestTopic(name=TopicName(t))
                                                            for t in names),
                    allow_auto_topic_creation=allow_auto_create,
                )
                response_cls = metadata_v5_response.MetadataResponse
            try:
                response = await connection.request_kio(request, response_cls)
            except (KafkaConnectionError, KafkaTimeoutError) as exc:
                last = exc
                continue
            stale = self.metadata.update(response, all_topics=topics is None)
            if stale:
                log.debug("metadata from node %s is behind on %s; kept the newer leader epochs",
                          connection.node_id, sorted(stale))
            leaderless = any(partition.leader_id < 0 for topic in response.topics
                             if names is None or topic.name in names for partition in topic.partitions)
            self._metadata_behind = connection.node_id if stale or leaderless else None
            return response
        raise KafkaConnectionError(f"metadata request failed: {last}")

    async def wait_for_topic(
        self, topic: str, timeout_ms: int = 60_000, *, allow_auto_create: bool = True, fail_if_missing: bool = False
    ) -> int:
        """Load metadata for ``topic`` until every partition has a leader; return its partition count.

        ``fail_if_missing``: an unknown topic raises at once instead of being waited for (kcat's behaviour
        for a consumer); an error that is not retriable (INVALID_TOPIC_EXCEPTION for ``a/b``, an
        authorization error) always raises at once.

        Raises:
            KafkaError: the topic's error, or UNKNOWN_TOPIC_OR_PARTITION / LEADER_NOT_AVAILABLE when it
                does not appear (with leaders) within ``timeout_ms``.
        """
        deadline = time.monotonic() + timeout_ms / 1000
        backoff = self.retry_backoff_ms / 1000
        while True:
            info = self.metadata.topics.get(topic)
            if info is not None and all(leader >= 0 for leader in info.leaders.values()):
                return len(info.leaders)
            try:
                response = await self.refresh_metadata([topic], allow_auto_create=allow_auto_create)
            except KafkaConnectionError:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(backoff)
                continue
            info = self.metadata.topics.get(topic)
            if info is not None and all(leader >= 0 for leader in info.leaders.values()):
                return len(info.leaders)
            error = next((int(t.error_code) for t in response.topics if t.name == topic), UNKNOWN_TOPIC_OR_PARTITION)
            if error:
                failure = KafkaError(error, f"topic {topic!r}")
                if not failure.retriable or (fail_if_missing and error == UNKNOWN_TOPIC_OR_PARTITION):
                    raise failure
            if time.monotonic() >= deadline:
                raise KafkaError(error or LEADER_NOT_AVAILABLE, f"topic {topic!r}")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    def request_update(self, topics) -> None:
        """Refresh metadata for ``topics`` in the background (coalesced with a refresh already running)."""
        self._wanted_topics.update(topics)
        if self.closed:
            return
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.get_running_loop().create_task(self._background_refresh())

    async def _background_refresh(self) -> None:
        await asyncio.sleep(self.retry_backoff_ms / 1000)
        topics, self._wanted_topics = sorted(self._wanted_topics), set()
        try:
            await self.refresh_metadata(topics)
        except Exception as exc:  # next request_update retries
            log.debug("metadata refresh failed: %s", exc)

    async def coordinator(self, group_id: str, timeout_ms: int = 30_000, *, key_type: int = 0) -> Connection:
        """The connection to ``group_id``'s group coordinator (FindCoordinator v1), or with ``key_type`` 1 to
        the transaction coordinator of the transactional id ``group_id``.

        Retried with backoff while the answer is a coordinator error (the group's ``__consumer_offsets``
        partition is moving or loading) or the broker asked cannot be reached, until ``timeout_ms``.

        Raises:
            KafkaError: a non-retriable error, or the last coordinator error at the deadline.
            KafkaConnectionError: no broker reachable at the deadline.
        """
        deadline = time.monotonic() + timeout_ms / 1000
        backoff = self.retry_backoff_ms / 1000
        unhelpful: int | None = None  # the broker that last answered with a coordinator error: asked last
        while True:
            try:
                connection = await self.any_connection(avoid=unhelpful)
                response = await connection.request_kio(
                    FindCoordinatorRequest(key=group_id, key_type=i8(key_type)), FindCoordinatorResponse
                )
                code = int(response.error_code)
                unhelpful = connection.node_id if code else None
                if code == 0:
                    node_id = int(response.node_id)
                    self.metadata.brokers.setdefault(node_id, (response.host, int(response.port)))
                    return await self._open(("coordinator", node_id), response.host, int(response.port), node_id)
                if code not in COORDINATOR_ERRORS or time.monotonic() > deadline:
                    what = "transactional id" if key_type else "group"
                    raise KafkaError(code, f"FindCoordinator for {what} {group_id!r}")
            except (KafkaConnectionError, KafkaTimeoutError):
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    # --- offsets by leader ----------------------------------------------------------------------------------

    async def list_offsets(
        self, requests: dict, *, isolation_level: int = 0, timeout_ms: int | None = None
    ) -> dict[tuple[str, int], int]:
        """ListOffsets v4 to each partition's leader: ``{(topic, partition): EARLIEST | LATEST | timestamp}``
        -> ``{(topic, partition): offset}`` (-1 when no record has a timestamp >= the one asked).

        Each request carries the leader epoch known here; partitions whose leader moved (LEADER_ERRORS),
        lost connections and timeouts are retried after a metadata refresh, until ``timeout_ms``
        (default: the request timeout).

        Raises:
            KafkaError: a partition's non-retriable error (UNKNOWN_TOPIC_OR_PARTITION for a partition the
                topic does not have), or the last retriable one at the deadline.
        """
        pending = {(tp[0], int(tp[1])): int(ts) for tp, ts in requests.items()}
        deadline = time.monotonic() + (timeout_ms if timeout_ms is not None else self.request_timeout_ms) / 1000
        backoff = self.retry_backoff_ms / 1000
        out: dict[tuple[str, int], int] = {}
        while pending:
            last: Exception | None = None
            retry_topics: set[str] = set()
            by_leader: dict[int, list[tuple[str, int]]] = {}
            for topic in {tp[0] for tp in pending}:
                if self.metadata.partition_count(topic) is None:
                    remaining_ms = max(int((deadline - time.monotonic()) * 1000), 1)
                    await self.wait_for_topic(topic, remaining_ms, allow_auto_create=False, fail_if_missing=True)
            for tp in pending:
                leader = self.metadata.leader(*tp)
                if leader < 0:
                    if (self.metadata.partition_count(tp[0]) is not None
                            and tp[1] not in self.metadata.topics[tp[0]].leaders):
                        raise KafkaError(UNKNOWN_TOPIC_OR_PARTITION,
                                         f"topic {tp[0]!r} has no partition {tp[1]} "
                                         f"(it has {self.metadata.partition_count(tp[0])})")
                    retry_topics.add(tp[0])
                    continue
                by_leader.setdefault(leader, []).append(tp)
            for leader, tps in by_leader.items():
                by_topic: dict[str, list] = {}
                for topic, partition in tps:
                    by_topic.setdefault(topic, []).append(ListOffsetsPartition(
                        partition_index=i32(partition),
                        current_leader_epoch=i32(self.metadata.leader_epoch(topic, partition)),
                        timestamp=i64(pending[(topic, partition)]),
                    ))
                try:
                    connection = await self.connection(leader)
                    response = await connection.request_kio(
                        ListOffsetsRequest(
                            replica_id=BrokerId(-1),
                            isolation_level=i8(isolation_level),
                            topics=tuple(ListOffsetsTopic(name=TopicName(t),
                                                          partitions=tuple(p)) for t, p in by_topic.items()),
                        ),
                        ListOffsetsResponse,
                    )
                except (KafkaConnectionError, KafkaTimeoutError) as exc:
                    last = exc
                    retry_topics.update(by_topic)
                    continue
                for topic in response.topics:
                    for partition in topic.partitions:
                        tp = (topic.name, int(partition.partition_index))
                        code = int(partition.error_code)
                        if code == 0:
                            out[tp] = int(partition.offset)
                            pending.pop(tp, None)
                            continue
                        error = KafkaError(code, f"ListOffsets {tp[0]}-{tp[1]}")
                        if code not in LEADER_ERRORS and not error.retriable:
                            raise error
                        last = error
                        retry_topics.add(tp[0])
            if not pending:
                break
            if time.monotonic() >= deadline:
                if isinstance(last, Exception):
                    raise last
                raise KafkaError(LEADER_NOT_AVAILABLE, f"no leader for {sorted(pending)}")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)
            try:
                await self.refresh_metadata(sorted(retry_topics), allow_auto_create=False)
            except KafkaConnectionError as exc:
                last = exc
        return out

    async def close(self) -> None:
        """Close every connection; requests in flight fail with KafkaConnectionError."""
        self.closed = True
        if self._refresh is not None and not self._refresh.done():
            self._refresh.cancel()
        for connection in list(self._connections.values()):
            connection.close()
        self._connections.clear()
