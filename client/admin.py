"""The asyncio admin client: create, delete, list and describe topics; list offsets.

Owns the admin API. Topic creation and deletion go to the controller named in Metadata (``controller_id``),
as Kafka requires; offsets go to each partition's leader (ListOffsets v2: -2 earliest, -1 latest, or a
timestamp: the first offset whose record timestamp is >= it, exact per record).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from kio.schema.create_topics.v3.request import CreatableTopic, CreatableTopicConfig, CreateTopicsRequest
from kio.schema.create_topics.v3.response import CreateTopicsResponse
from kio.schema.delete_topics.v3.request import DeleteTopicsRequest
from kio.schema.delete_topics.v3.response import DeleteTopicsResponse

from copyless.client.assignors import TopicPartition
from copyless.client.cluster import Cluster
from copyless.client.conn import DEFAULT_REQUEST_TIMEOUT_MS
from copyless.client.errors import KafkaError

__all__ = ["Admin", "TopicDescription", "PartitionDescription", "EARLIEST", "LATEST"]

EARLIEST = -2
LATEST = -1
TOPIC_ALREADY_EXISTS = 36
UNKNOWN_TOPIC_OR_PARTITION = 3


@dataclass(frozen=True)
class PartitionDescription:
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    error_code: int


@dataclass(frozen=True)
class TopicDescription:
    name: str
    internal: bool
    partitions: tuple[PartitionDescription, ...]


class Admin:
    """Args: bootstrap_servers, client_id, request_timeout_ms. Use as ``async with Admin(...) as admin``."""

    def __init__(
        self,
        bootstrap_servers,
        *,
        client_id: str = "copyless-admin",
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
    ) -> None:
        self._cluster = Cluster(bootstrap_servers, client_id=client_id, request_timeout_ms=request_timeout_ms)
        self.request_timeout_ms = request_timeout_ms

    async def start(self) -> None:
        await self._cluster.start()

    async def close(self) -> None:
        await self._cluster.close()

    async def __aenter__(self) -> "Admin":
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def _controller(self):
        await self._cluster.refresh_metadata([])
        controller = self._cluster.metadata.controller_id
        if controller < 0:
            return await self._cluster.any_connection()
        return await self._cluster.connection(controller)

    async def create_topics(
        self,
        topics,
        *,
        num_partitions: int = 1,
        replication_factor: int = 1,
        configs: dict[str, str] | None = None,
        if_not_exists: bool = False,
        validate_only: bool = False,
    ) -> dict[str, int]:
        """Create ``topics`` (names). Returns ``{name: error_code}`` (0 = created).

        Raises:
            KafkaError: the first non-zero error (TOPIC_ALREADY_EXISTS is ignored with ``if_not_exists``).
        """
        if isinstance(topics, str):
            topics = [topics]
        request = CreateTopicsRequest(
            topics=tuple(
                CreatableTopic(
                    name=name,
                    num_partitions=num_partitions,
                    replication_factor=replication_factor,
                    assignments=(),
                    configs=tuple(CreatableTopicConfig(name=k, value=str(v)) for k, v in (configs or {}).items()),
                )
                for name in topics
            ),
            timeout=datetime.timedelta(milliseconds=self.request_timeout_ms),
            validate_only=validate_only,
        )
        connection = await self._controller()
        response = await connection.request_kio(request, CreateTopicsResponse)
        results = {result.name: int(result.error_code) for result in response.topics}
        for result in response.topics:
            code = int(result.error_code)
            if code and not (if_not_exists and code == TOPIC_ALREADY_EXISTS):
                raise KafkaError(code, f"create topic {result.name!r}: {result.error_message or ''}".rstrip(": "))
        return results

    async def delete_topics(self, topics, *, if_exists: bool = False) -> dict[str, int]:
        """Delete ``topics``. Returns ``{name: error_code}``; raises on the first error (UNKNOWN_TOPIC is
        ignored with ``if_exists``)."""
        if isinstance(topics, str):
            topics = [topics]
        connection = await self._controller()
        response = await connection.request_kio(
            DeleteTopicsRequest(
                topic_names=tuple(topics), timeout=datetime.timedelta(milliseconds=self.request_timeout_ms)
            ),
            DeleteTopicsResponse,
        )
        results = {result.name: int(result.error_code) for result in response.responses}
        for name, code in results.items():
            if code and not (if_exists and code == UNKNOWN_TOPIC_OR_PARTITION):
                raise KafkaError(code, f"delete topic {name!r}")
        return results

    async def list_topics(self, *, internal: bool = False) -> list[str]:
        """Names of all topics (internal ones such as ``__consumer_offsets`` only with ``internal``)."""
        await self._cluster.refresh_metadata(None, allow_auto_create=False)
        return sorted(
            name for name, info in self._cluster.metadata.topics.items() if internal or not info.is_internal
        )

    async def describe_topics(self, topics=None) -> list[TopicDescription]:
        """Partitions, leaders, replicas and ISR of ``topics`` (default: all).

        Raises:
            KafkaError: UNKNOWN_TOPIC_OR_PARTITION for a named topic that does not exist.
        """
        if isinstance(topics, str):
            topics = [topics]
        response = await self._cluster.refresh_metadata(None if topics is None else list(topics), allow_auto_create=False)
        out = []
        for topic in response.topics:
            code = int(topic.error_code)
            if code:
                raise KafkaError(code, f"describe topic {topic.name!r}")
            out.append(
                TopicDescription(
                    topic.name,
                    bool(topic.is_internal),
                    tuple(
                        PartitionDescription(
                            int(p.partition_index),
                            int(p.leader_id),
                            tuple(int(r) for r in p.replica_nodes),
                            tuple(int(r) for r in p.isr_nodes),
                            int(p.error_code),
                        )
                        for p in sorted(topic.partitions, key=lambda p: int(p.partition_index))
                    ),
                )
            )
        return sorted(out, key=lambda d: d.name)

    async def list_offsets(self, requests: dict, *, isolation_level: int = 0) -> dict[TopicPartition, int]:
        """``{(topic, partition): EARLIEST | LATEST | timestamp_ms}`` -> ``{TopicPartition: offset}``.

        For a timestamp, the offset is the first record whose timestamp is >= it, or -1 if none.
        """
        found = await self._cluster.list_offsets(requests, isolation_level=isolation_level)
        return {TopicPartition(*tp): offset for tp, offset in found.items()}
