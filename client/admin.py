"""The asyncio admin client: topics, configs, partitions, records, groups and the cluster.

Owns the admin API and where each request goes, as Kafka routes them: topic creation and deletion,
CreatePartitions and IncrementalAlterConfigs to the controller named in Metadata (``controller_id``);
DescribeConfigs and DescribeCluster to any broker; ListOffsets (-2 earliest, -1 latest, or a timestamp:
the first offset whose record timestamp is >= it) and DeleteRecords to each partition's leader;
DescribeGroups, OffsetFetch, OffsetCommit, DeleteGroups and OffsetDelete to the group's coordinator
(``group.GroupCoordinator``, which finds it again when it moves); ListGroups to every broker; ACLs and SCRAM
credentials (``admin_security``) to any broker.
Versions are the non-flexible ones (DescribeCluster has none: v0, with the flexible headers).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from kio.schema.create_partitions.v1 import request as cp_rq
from kio.schema.create_partitions.v1 import response as cp_rs
from kio.schema.create_topics.v3.request import CreatableTopic, CreatableTopicConfig, CreateTopicsRequest
from kio.schema.create_topics.v3.response import CreateTopicsResponse
from kio.schema.delete_groups.v1 import request as dgr_rq
from kio.schema.delete_groups.v1 import response as dgr_rs
from kio.schema.delete_records.v1 import request as dr_rq
from kio.schema.delete_records.v1 import response as dr_rs
from kio.schema.delete_topics.v3.request import DeleteTopicsRequest
from kio.schema.delete_topics.v3.response import DeleteTopicsResponse
from kio.schema.describe_cluster.v0 import request as dcl_rq
from kio.schema.describe_cluster.v0 import response as dcl_rs
from kio.schema.describe_configs.v1 import request as dc_rq
from kio.schema.describe_configs.v1 import response as dc_rs
from kio.schema.describe_groups.v4 import request as dg_rq
from kio.schema.describe_groups.v4 import response as dg_rs
from kio.schema.describe_transactions.v0 import request as dt_rq
from kio.schema.incremental_alter_configs.v0 import request as ia_rq
from kio.schema.incremental_alter_configs.v0 import response as ia_rs
from kio.schema.list_groups.v2 import request as lg_rq
from kio.schema.list_groups.v2 import response as lg_rs
from kio.schema.list_transactions.v0 import request as lt_rq
from kio.schema.list_transactions.v0 import response as lt_rs
from kio.schema.offset_commit.v3 import request as oc_rq
from kio.schema.offset_commit.v3 import response as oc_rs
from kio.schema.offset_delete.v0 import request as od_rq
from kio.schema.offset_delete.v0 import response as od_rs
from kio.schema.offset_fetch.v5 import request as of5_rq
from kio.schema.offset_fetch.v5 import response as of5_rs
from kio.schema.types import GroupId, TopicName, TransactionalId
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64, i64Timedelta

from copyless.client.admin_security import Acl, SecurityAdmin
from copyless.client.assignors import TopicPartition, decode_assignment
from copyless.client.cluster import COORDINATOR_ERRORS, Cluster
from copyless.client.conn import DEFAULT_REQUEST_TIMEOUT_MS
from copyless.client.errors import KafkaError
from copyless.client.group import GroupCoordinator
from copyless.client.security import resolve as resolve_security

__all__ = ["Admin", "Acl", "TopicDescription", "PartitionDescription", "ConfigEntry", "ClusterDescription",
           "GroupDescription", "GroupMember", "GroupOffset", "EARLIEST", "LATEST"]

EARLIEST = -2
LATEST = -1
TOPIC_ALREADY_EXISTS = 36
UNKNOWN_TOPIC_OR_PARTITION = 3
TOPIC_RESOURCE = 2  # DescribeConfigs / AlterConfigs resource type (4: broker)
# DescribeConfigs' config_source values (KIP-226).
_CONFIG_SOURCES = {
    -1: "UNKNOWN", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG", 3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG", 6: "DYNAMIC_BROKER_LOGGER_CONFIG",
}


@dataclass(frozen=True, order=True)
class TransactionListing:
    transactional_id: str
    producer_id: int
    state: str
    coordinator: int


@dataclass(frozen=True)
class TransactionDescription:
    transactional_id: str
    coordinator: int
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    start_ms: int  # -1: no transaction started
    partitions: tuple


@dataclass(frozen=True)
class PartitionDescription:
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    error_code: int
    leader_epoch: int = -1  # -1 from a broker without Metadata v7


@dataclass(frozen=True)
class TopicDescription:
    name: str
    internal: bool
    partitions: tuple[PartitionDescription, ...]


@dataclass(frozen=True)
class ConfigEntry:
    name: str
    value: str | None
    source: str  # DYNAMIC_TOPIC_CONFIG (set on the topic), DEFAULT_CONFIG, STATIC_BROKER_CONFIG, ...
    read_only: bool
    sensitive: bool


@dataclass(frozen=True)
class ClusterDescription:
    cluster_id: str | None
    controller_id: int
    brokers: tuple  # ((node_id, host, port, rack), ...)


@dataclass(frozen=True)
class GroupMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    host: str
    assignment: tuple  # (TopicPartition, ...)


@dataclass(frozen=True)
class GroupOffset:
    topic: str
    partition: int
    committed_offset: int | None
    log_end_offset: int | None
    lag: int | None
    member_id: str | None
    host: str | None
    client_id: str | None


@dataclass(frozen=True)
class GroupDescription:
    group: str
    state: str
    protocol_type: str
    protocol: str
    members: tuple  # (GroupMember, ...)
    offsets: tuple  # (GroupOffset, ...): every partition with a committed offset or an owner


class Admin(SecurityAdmin):
    """Args: bootstrap_servers, client_id, request_timeout_ms, and security (or the Producer's security
    options). Use as ``async with Admin(...) as admin``. ACL and SCRAM calls: ``client.admin_security``."""

    def __init__(
        self,
        bootstrap_servers,
        *,
        client_id: str = "copyless-admin",
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        security=None,
        **security_options,
    ) -> None:
        self._cluster = Cluster(bootstrap_servers, client_id=client_id, request_timeout_ms=request_timeout_ms,
                                security=resolve_security(security, security_options))
        self.request_timeout_ms = request_timeout_ms

    async def start(self) -> None:
        await self._cluster.start()

    async def close(self) -> None:
        await self._cluster.close()

    async def __aenter__(self) -> Admin:
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
                    num_partitions=i32(num_partitions),
                    replication_factor=i16(replication_factor),
                    assignments=(),
                    configs=tuple(CreatableTopicConfig(name=k, value=str(v)) for k, v in (configs or {}).items()),
                )
                for name in topics
            ),
            timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=self.request_timeout_ms)),
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
                topic_names=tuple(topics),
                timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=self.request_timeout_ms))
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
        response = await self._cluster.refresh_metadata(None if topics is None else list(topics),
                                                        allow_auto_create=False)
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
                            int(getattr(p, "leader_epoch", -1)),
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

    # --- configs ----------------------------------------------------------------------------------------------

    async def describe_configs(self, topic: str) -> list[ConfigEntry]:
        """Every config of ``topic`` with its value and source (DescribeConfigs v1).

        Raises:
            KafkaError: UNKNOWN_TOPIC_OR_PARTITION, or the broker's error for the resource.
        """
        connection = await self._cluster.any_connection()
        response = await connection.request_kio(
            dc_rq.DescribeConfigsRequest(
                resources=(dc_rq.DescribeConfigsResource(resource_type=i8(TOPIC_RESOURCE), resource_name=topic,
                                                         configuration_keys=None),),
                include_synonyms=False,
            ),
            dc_rs.DescribeConfigsResponse,
        )
        out = []
        for result in response.results:
            if int(result.error_code):
                raise KafkaError(int(result.error_code),
                                 f"describe configs of {topic!r}: {result.error_message or ''}".rstrip(": "))
            for config in result.configs:
                source = _CONFIG_SOURCES.get(int(config.config_source), "UNKNOWN")
                out.append(ConfigEntry(config.name, config.value, source,
                                       bool(config.read_only), bool(config.is_sensitive)))
        return sorted(out, key=lambda c: c.name)

    async def alter_configs(self, topic: str, *, set: dict[str, str] | None = None, delete=(),
                            validate_only=False) -> None:
        """Set and delete (revert to the default) configs of ``topic`` (IncrementalAlterConfigs v0, to the
        controller). Other configs are left as they are.

        Raises:
            KafkaError: INVALID_CONFIG, UNKNOWN_TOPIC_OR_PARTITION, ... with the broker's message.
        """
        configs = tuple(ia_rq.AlterableConfig(name=k, config_operation=i8(0),
                                              value=str(v)) for k, v in (set or {}).items())
        configs += tuple(ia_rq.AlterableConfig(name=k, config_operation=i8(1), value=None) for k in delete)
        connection = await self._controller()
        response = await connection.request_kio(
            ia_rq.IncrementalAlterConfigsRequest(
                resources=(ia_rq.AlterConfigsResource(resource_type=i8(TOPIC_RESOURCE), resource_name=topic,
                                                      configs=configs),),
                validate_only=validate_only,
            ),
            ia_rs.IncrementalAlterConfigsResponse,
        )
        for result in response.responses:
            if int(result.error_code):
                raise KafkaError(int(result.error_code),
                                 f"alter configs of {topic!r}: {result.error_message or ''}".rstrip(": "))

    # --- partitions and records -------------------------------------------------------------------------------

    async def create_partitions(self, topic: str, total: int, *, validate_only: bool = False) -> None:
        """Grow ``topic`` to ``total`` partitions (CreatePartitions v1, to the controller).

        Raises:
            KafkaError: INVALID_PARTITIONS (not more than it has), UNKNOWN_TOPIC_OR_PARTITION, ...
        """
        connection = await self._controller()
        response = await connection.request_kio(
            cp_rq.CreatePartitionsRequest(
                topics=(cp_rq.CreatePartitionsTopic(name=TopicName(topic), count=i32(total), assignments=None),),
                timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=self.request_timeout_ms)),
                validate_only=validate_only,
            ),
            cp_rs.CreatePartitionsResponse,
        )
        for result in response.results:
            if int(result.error_code):
                raise KafkaError(int(result.error_code),
                                 f"add partitions to {topic!r}: {result.error_message or ''}".rstrip(": "))
        await self._cluster.refresh_metadata([topic], allow_auto_create=False)

    async def delete_records(self, offsets: dict) -> dict[TopicPartition, int]:
        """Delete the records before ``{(topic, partition): offset}`` (-1: the high watermark) with
        DeleteRecords v1, to each partition's leader. Returns each partition's new log start offset.

        Raises:
            KafkaError: OFFSET_OUT_OF_RANGE (past the high watermark), NOT_LEADER_OR_FOLLOWER, ...
        """
        by_leader: dict[int, dict[str, list]] = {}
        for (topic, partition), offset in offsets.items():
            await self._cluster.wait_for_topic(topic, 10_000, allow_auto_create=False, fail_if_missing=True)
            leader = self._cluster.metadata.leader(topic, int(partition))
            if leader < 0:
                raise KafkaError(UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition}")
            by_leader.setdefault(leader, {}).setdefault(topic, []).append(
                dr_rq.DeleteRecordsPartition(partition_index=i32(int(partition)), offset=i64(int(offset))))
        out: dict[TopicPartition, int] = {}
        for leader, topics in by_leader.items():
            connection = await self._cluster.connection(leader)
            response = await connection.request_kio(
                dr_rq.DeleteRecordsRequest(
                    topics=tuple(dr_rq.DeleteRecordsTopic(name=TopicName(t),
                                                          partitions=tuple(p)) for t, p in topics.items()),
                    timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=self.request_timeout_ms)),
                ),
                dr_rs.DeleteRecordsResponse,
            )
            for topic in response.topics:
                for partition in topic.partitions:
                    if int(partition.error_code):
                        raise KafkaError(int(partition.error_code),
                                         f"delete records of {topic.name}-{partition.partition_index}")
                    out[TopicPartition(topic.name, int(partition.partition_index))] = int(partition.low_watermark)
        return out

    # --- cluster ----------------------------------------------------------------------------------------------

    async def describe_cluster(self) -> ClusterDescription:
        """Cluster id, controller and brokers: DescribeCluster v0 where the broker has it, else Metadata."""
        connection = await self._cluster.any_connection()
        if connection.supports(60, 0):
            response = await connection.request_kio(
                dcl_rq.DescribeClusterRequest(include_cluster_authorized_operations=False),
                dcl_rs.DescribeClusterResponse,
            )
            if int(response.error_code):
                raise KafkaError(int(response.error_code),
                                 f"describe cluster: {response.error_message or ''}".rstrip(": "))
            brokers = tuple(sorted((int(b.broker_id), b.host, int(b.port), b.rack) for b in response.brokers))
            return ClusterDescription(response.cluster_id, int(response.controller_id), brokers)
        await self._cluster.refresh_metadata([])
        metadata = self._cluster.metadata
        brokers = tuple(sorted((node, host, port, None) for node, (host, port) in metadata.brokers.items()))
        return ClusterDescription(metadata.cluster_id, metadata.controller_id, brokers)

    # --- transactions -----------------------------------------------------------------------------------------

    async def list_transactions(self) -> list[TransactionListing]:
        """Every transactional id of the cluster with its producer id and state, asking every broker (each
        lists the ids it coordinates; ListTransactions v0)."""
        await self._cluster.refresh_metadata([])
        found = []
        for node_id in sorted(self._cluster.metadata.brokers):
            connection = await self._cluster.connection(node_id)
            response = await connection.request_kio(
                lt_rq.ListTransactionsRequest(state_filters=(), producer_id_filters=()), lt_rs.ListTransactionsResponse)
            if int(response.error_code):
                raise KafkaError(int(response.error_code), f"list transactions on broker {node_id}")
            found += [TransactionListing(t.transactional_id, t.producer_id, t.transaction_state, node_id)
                      for t in response.transaction_states]
        return sorted(found)

    async def describe_transaction(self, transactional_id: str) -> TransactionDescription:
        """The id's state from its coordinator (DescribeTransactions v0 to every broker until the one that
        coordinates it answers). Raises KafkaError (TRANSACTIONAL_ID_NOT_FOUND, ...)."""
        await self._cluster.refresh_metadata([])
        last = None
        for node_id in sorted(self._cluster.metadata.brokers):
            connection = await self._cluster.connection(node_id)
            from copyless.protocol.messages import encode_kio

            request = dt_rq.DescribeTransactionsRequest(transactional_ids=(TransactionalId(transactional_id),))
            # Decoded by hand: the start time is -1 for an id with no transaction started, as Kafka sends
            # it, which kio's timestamp reader refuses.
            state = await connection.request(int(request.__api_key__), [b"\x00" + encode_kio(request)],
                                          _decode_describe_transactions, version=int(request.__version__))
            code = state[0]
            if code in COORDINATOR_ERRORS:
                last = code
                continue
            if code:
                raise KafkaError(code, f"describe transactional id {transactional_id!r}")
            return TransactionDescription(transactional_id, node_id, *state[1:])
        raise KafkaError(last if last is not None else 15, f"no coordinator for {transactional_id!r}")

    # --- groups -----------------------------------------------------------------------------------------------

    def _group(self, group_id: str) -> GroupCoordinator:
        return GroupCoordinator(self._cluster, group_id, self._cluster.retry_backoff_ms)

    async def list_groups(self) -> list[tuple[str, str]]:
        """``[(group_id, protocol_type)]`` of every group, asking every broker (each lists the groups it
        coordinates; ListGroups v2)."""
        await self._cluster.refresh_metadata([])
        found: dict[str, str] = {}
        for node_id in sorted(self._cluster.metadata.brokers):
            connection = await self._cluster.connection(node_id)
            response = await connection.request_kio(lg_rq.ListGroupsRequest(), lg_rs.ListGroupsResponse)
            if int(response.error_code):
                raise KafkaError(int(response.error_code), f"list groups on broker {node_id}")
            for group in response.groups:
                found[group.group_id] = group.protocol_type
        return sorted(found.items())

    async def describe_group(self, group_id: str) -> GroupDescription:
        """State, members (with their assignments) and every committed offset with its log end offset and
        lag (DescribeGroups v4 and OffsetFetch v5 to the coordinator, ListOffsets to the leaders)."""
        coordinator = self._group(group_id)

        def check_described(response) -> None:
            code = int(response.groups[0].error_code)
            if code:
                raise KafkaError(code, f"describe group {group_id!r}")

        described = (await coordinator.request(
            dg_rq.DescribeGroupsRequest(groups=(GroupId(group_id),), include_authorized_operations=False),
            dg_rs.DescribeGroupsResponse, check_described)).groups[0]

        def check_fetched(response) -> None:
            if int(response.error_code):
                raise KafkaError(int(response.error_code), f"offsets of group {group_id!r}")

        fetched = await coordinator.request(of5_rq.OffsetFetchRequest(group_id=GroupId(group_id), topics=None),
                                            of5_rs.OffsetFetchResponse, check_fetched)
        members = []
        owners: dict[TopicPartition, GroupMember] = {}
        for m in described.members:
            assigned = decode_assignment_lenient(m.member_assignment) if described.protocol_type == "consumer" else []
            member = GroupMember(m.member_id, m.group_instance_id, m.client_id, m.client_host, tuple(assigned))
            members.append(member)
            for tp in assigned:
                owners[tp] = member
        committed: dict[TopicPartition, int] = {}
        for topic in fetched.topics:
            for p in topic.partitions:
                if int(p.error_code) == 0 and int(p.committed_offset) >= 0:
                    committed[TopicPartition(topic.name, int(p.partition_index))] = int(p.committed_offset)
        tps = sorted(set(committed) | set(owners))
        ends: dict[TopicPartition, int] = {}
        if tps:
            try:
                latest = await self._cluster.list_offsets({tp: LATEST for tp in tps})
                ends = {TopicPartition(*tp): o for tp, o in latest.items()}
            except KafkaError:  # a topic deleted since: show the rest
                ends = {}
        rows = []
        for tp in tps:
            owner = owners.get(tp)
            current, end = committed.get(tp), ends.get(tp)
            rows.append(GroupOffset(tp.topic, tp.partition, current, end,
                                    end - current if current is not None and end is not None else None,
                                    owner.member_id if owner else None, owner.host if owner else None,
                                    owner.client_id if owner else None))
        return GroupDescription(group_id, described.group_state, described.protocol_type, described.protocol_data,
                                tuple(members), tuple(rows))

    async def alter_group_offsets(self, group_id: str, offsets: dict) -> None:
        """Commit ``{(topic, partition): offset}`` for ``group_id`` as an admin (generation -1, no member):
        the coordinator accepts it only while the group has no active members (Kafka's rule, so a reset
        cannot race a running consumer).

        Raises:
            KafkaError: UNKNOWN_MEMBER_ID / REBALANCE_IN_PROGRESS when the group has members, ...
        """
        topics: dict[str, list] = {}
        for (topic, partition), offset in offsets.items():
            topics.setdefault(topic, []).append(oc_rq.OffsetCommitRequestPartition(
                partition_index=i32(int(partition)), committed_offset=i64(int(offset)), committed_metadata=""))

        def check(response) -> None:
            for topic in response.topics:
                for p in topic.partitions:
                    if int(p.error_code):
                        raise KafkaError(int(p.error_code),
                                         f"commit {topic.name}-{p.partition_index} for group {group_id!r}")

        await self._group(group_id).request(
            oc_rq.OffsetCommitRequest(group_id=GroupId(group_id), generation_id_or_member_epoch=i32(-1), member_id="",
                                      retention_time=i64Timedelta.parse(datetime.timedelta(milliseconds=-1)),
                                      topics=tuple(oc_rq.OffsetCommitRequestTopic(name=TopicName(t),
                                                                                  partitions=tuple(p))
                                                   for t, p in topics.items())),
            oc_rs.OffsetCommitResponse, check)

    async def delete_groups(self, group_ids) -> dict[str, int]:
        """Delete groups (DeleteGroups v1, each to its coordinator); a group must have no members.
        Returns ``{group: error_code}``; raises the first error (GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP, ...)."""
        results: dict[str, int] = {}
        for group_id in ([group_ids] if isinstance(group_ids, str) else group_ids):
            response = await self._group(group_id).request(
                dgr_rq.DeleteGroupsRequest(groups_names=(GroupId(group_id),)), dgr_rs.DeleteGroupsResponse,
                lambda response: _raise_coordinator_error(response.results))
            for result in response.results:
                results[result.group_id] = int(result.error_code)
        for group_id, code in results.items():
            if code:
                raise KafkaError(code, f"delete group {group_id!r}")
        return results

    async def delete_group_offsets(self, group_id: str, partitions) -> None:
        """Delete the committed offsets of ``partitions`` for ``group_id`` (OffsetDelete v0); the group
        must not be subscribed to their topics."""
        topics: dict[str, list] = {}
        for topic, partition in partitions:
            topics.setdefault(topic, []).append(od_rq.OffsetDeleteRequestPartition(partition_index=i32(int(partition))))

        def check(response) -> None:
            if int(response.error_code):
                raise KafkaError(int(response.error_code), f"delete offsets of group {group_id!r}")
            for topic in response.topics:
                for p in topic.partitions:
                    if int(p.error_code):
                        raise KafkaError(int(p.error_code),
                                         f"delete offset {topic.name}-{p.partition_index} of {group_id!r}")

        await self._group(group_id).request(
            od_rq.OffsetDeleteRequest(group_id=GroupId(group_id), topics=tuple(
                od_rq.OffsetDeleteRequestTopic(name=TopicName(t), partitions=tuple(p)) for t, p in topics.items())),
            od_rs.OffsetDeleteResponse, check)


def _raise_coordinator_error(results) -> None:
    """Raise a coordinator error of a per-group result so ``GroupCoordinator.request`` retries it."""
    for result in results:
        if int(result.error_code) in COORDINATOR_ERRORS:
            raise KafkaError(int(result.error_code), f"group {result.group_id!r}")


def decode_assignment_lenient(data: bytes) -> list[TopicPartition]:
    """A member's assignment in the consumer protocol, or [] when it is not in that format."""
    try:
        return sorted(decode_assignment(data))
    except Exception:
        return []


def _decode_describe_transactions(frame, offset: int = 0):
    """The first state of a DescribeTransactionsResponse v0 (flexible; response header v1): (error code,
    state, producer id, epoch, timeout ms, start ms, partitions). Pure."""
    import struct

    def uvarint(at: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            byte = frame[at]
            at += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value, at
            shift += 7

    def compact_string(at: int) -> tuple[str, int]:
        length, at = uvarint(at)
        return bytes(frame[at:at + length - 1]).decode(), at + max(length - 1, 0)

    at = offset + 1 + 4  # the header's tagged fields, throttle_time_ms
    _count, at = uvarint(at)
    (code,) = struct.unpack_from(">h", frame, at)
    _transactional_id, at = compact_string(at + 2)
    state, at = compact_string(at)
    timeout_ms, start_ms, producer_id, epoch = struct.unpack_from(">iqqh", frame, at)
    at += 22
    topics, at = uvarint(at)
    partitions = []
    for _ in range(max(topics - 1, 0)):
        topic, at = compact_string(at)
        count, at = uvarint(at)
        for _ in range(max(count - 1, 0)):
            partitions.append(TopicPartition(topic, struct.unpack_from(">i", frame, at)[0]))
            at += 4
        _tags, at = uvarint(at)
    return code, state, producer_id, epoch, timeout_ms, start_ms, tuple(partitions)
