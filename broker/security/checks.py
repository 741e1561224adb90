"""The authorization checks handlers make: one function per resource kind, each answering "may this
request's principal do this?" through ``broker.security`` (every answer is True when no authorizer is
configured). Pure over the context: no I/O.

Which check each API makes, and the error it answers with, follow Kafka's ``KafkaApis``:

    Produce           Write on each topic (TOPIC_AUTHORIZATION_FAILED per partition); a transactional
                      producer's Write on its transactional id
    Fetch             a consumer: Read on each topic; a follower (replica_id >= 0): ClusterAction on the
                      cluster, else TOPIC_AUTHORIZATION_FAILED on every partition
    ListOffsets, OffsetForLeaderEpoch (consumer), Metadata
                      Describe on each topic; Metadata leaves the topics a principal may not Describe out
                      of an all-topics answer and answers TOPIC_AUTHORIZATION_FAILED for the named ones
    OffsetForLeaderEpoch (follower)   ClusterAction on the cluster
    Metadata auto-create, CreateTopics   Create on the cluster or on the topic
    DeleteTopics, DeleteRecords       Delete on the topic
    CreatePartitions                  Alter on the topic
    DescribeConfigs / AlterConfigs / IncrementalAlterConfigs
                      DescribeConfigs / AlterConfigs on the topic, or on the cluster for brokers
    FindCoordinator   Describe on the group (or transactional id)
    JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit   Read on the group (GROUP_AUTHORIZATION_FAILED);
                      OffsetCommit also Read on each topic
    OffsetFetch       Describe on the group; Describe on each topic (unauthorized topics are left out)
    DescribeGroups    Describe on each group; ListGroups: every group when Describe on the cluster, else
                      the groups the principal may Describe
    DeleteGroups      Delete on each group; OffsetDelete: Delete on the group, Read on each topic
    InitProducerId    Write on the transactional id, or (idempotent) IdempotentWrite on the cluster or
                      Write on some topic
    DescribeCluster, DescribeAcls, DescribeUserScramCredentials   Describe on the cluster
    ElectLeaders, CreateAcls, DeleteAcls, AlterUserScramCredentials   Alter on the cluster
"""

from __future__ import annotations

from copyless.broker.security.acl import CLUSTER_NAME, Operation, ResourceType

__all__ = ["topic", "group", "cluster", "transactional_id", "any_topic", "enabled", "denied_topics", "Operation"]


def enabled(ctx) -> bool:
    """Whether an authorizer is configured (handlers may skip per-resource work when not)."""
    return ctx.broker.security.authorizer is not None


def topic(ctx, operation: Operation, name: str) -> bool:
    return ctx.broker.security.authorize(ctx.principal, ctx.client_host, operation, ResourceType.TOPIC, name)


def group(ctx, operation: Operation, name: str) -> bool:
    return ctx.broker.security.authorize(ctx.principal, ctx.client_host, operation, ResourceType.GROUP, name)


def cluster(ctx, operation: Operation) -> bool:
    return ctx.broker.security.authorize(ctx.principal, ctx.client_host, operation, ResourceType.CLUSTER,
                                         CLUSTER_NAME)


def transactional_id(ctx, operation: Operation, name: str) -> bool:
    return ctx.broker.security.authorize(ctx.principal, ctx.client_host, operation, ResourceType.TRANSACTIONAL_ID,
                                         name)


def any_topic(ctx, operation: Operation) -> bool:
    """Allowed on at least one topic (Kafka's ``authorizeByResourceType``)."""
    return ctx.broker.security.authorize_any(ctx.principal, ctx.client_host, operation, ResourceType.TOPIC)


def denied_topics(ctx, operation: Operation, names) -> frozenset[str]:
    """The names among ``names`` the principal may not ``operation`` (empty, at no cost, without an
    authorizer): handlers answer those TOPIC_AUTHORIZATION_FAILED and serve the rest."""
    if ctx.broker.security.authorizer is None:
        return frozenset()
    return frozenset(name for name in set(names) if not topic(ctx, operation, name))
