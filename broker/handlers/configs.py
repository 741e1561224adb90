"""DescribeConfigs (32) v1-2: effective topic and broker configs, for admin tools.

Topic resources (type 2) list every topic config the log implements with its effective value; a value set
on the topic reports source DYNAMIC_TOPIC_CONFIG (1), the rest DEFAULT_CONFIG (5), with the broker default
as a synonym when ``include_synonyms``. The broker resource (type 4, name = node id, or "" for the default)
lists the broker settings that have Kafka names, source STATIC_BROKER_CONFIG (4). Unknown topic ->
UNKNOWN_TOPIC_OR_PARTITION (3); another broker's id or another resource type -> INVALID_REQUEST (42).
Read-only: there is no AlterConfigs.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from copyless.broker.handlers.context import RequestContext
from copyless.broker.wire.codecs import NO_THROTTLE, build, response_module

API_KEY = 32
TOPIC, BROKER = 2, 4
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5

# Kafka topic config name -> LogConfig field (None values are Kafka's -1, "unlimited" / "never").
_TOPIC_FIELDS = {
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "segment.index.bytes": "segment_index_bytes",
    "index.interval.bytes": "index_interval_bytes",
    "flush.messages": "flush_messages",
    "flush.ms": "flush_ms",
    "file.delete.delay.ms": "file_delete_delay_ms",
    "max.message.bytes": "max_message_bytes",
    "message.timestamp.type": "message_timestamp_type",
    "preallocate": "preallocate",
}
_TOPIC_FIXED = {"cleanup.policy": "delete", "compression.type": "producer"}
# Broker config name -> BrokerConfig field.
_BROKER_FIELDS = {
    "node.id": "node_id",
    "auto.create.topics.enable": "auto_create_topics",
    "num.partitions": "num_partitions",
    "default.replication.factor": "default_replication_factor",
    "socket.request.max.bytes": "max_request_bytes",
    "fetch.max.bytes": "fetch_max_bytes",
    "message.max.bytes": "message_max_bytes",
    "log.retention.ms": "retention_ms",
    "log.retention.bytes": "retention_bytes",
    "log.segment.bytes": "segment_bytes",
    "log.roll.ms": "segment_ms",
    "log.index.size.max.bytes": "segment_index_bytes",
    "log.index.interval.bytes": "index_interval_bytes",
    "log.flush.interval.messages": "flush_messages",
    "log.flush.interval.ms": "flush_ms",
    "log.message.timestamp.type": "message_timestamp_type",
    "log.preallocate": "preallocate",
    "log.retention.check.interval.ms": "retention_check_interval_ms",
    "min.insync.replicas": "min_insync_replicas",
    "unclean.leader.election.enable": "unclean_leader_election",
    "replica.lag.time.max.ms": "replica_lag_time_max_ms",
    "broker.session.timeout.ms": "broker_session_timeout_ms",
    "offsets.topic.num.partitions": "offsets_partitions",
    "offsets.topic.replication.factor": "offsets_topic_replication_factor",
}


def _text(value) -> str:
    if value is None:
        return "-1"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def topic_configs(broker, topic) -> list[tuple[str, str, int, str]]:
    """(name, value, source, broker default) for each config of ``topic``. Pure over the broker state."""
    effective = broker.log_config_for(topic)
    defaults = broker.default_log_config()
    entries = []
    for name, field_name in _TOPIC_FIELDS.items():
        source = DYNAMIC_TOPIC_CONFIG if name in topic.configs else DEFAULT_CONFIG
        entries.append((name, _text(getattr(effective, field_name)), source, _text(getattr(defaults, field_name))))
    config = broker.config
    replication_defaults = {"min.insync.replicas": _text(config.min_insync_replicas),
                            "unclean.leader.election.enable": _text(config.unclean_leader_election)}
    for name, value in (*_TOPIC_FIXED.items(), *replication_defaults.items()):
        source = DYNAMIC_TOPIC_CONFIG if name in topic.configs else DEFAULT_CONFIG
        entries.append((name, topic.configs.get(name, value), source, value))
    return entries


def _synonyms(module, name: str, value: str, source: int, default: str | None) -> tuple:
    """Kafka lists the config itself, then what it overrides, in order of precedence."""
    synonyms = [module.DescribeConfigsSynonym(name=name, value=value, source=source)]
    if source == DYNAMIC_TOPIC_CONFIG and default is not None:
        synonyms.append(module.DescribeConfigsSynonym(name=name, value=default, source=DEFAULT_CONFIG))
    return tuple(synonyms)


async def handle(ctx: RequestContext, request):
    broker = ctx.broker
    module = response_module(API_KEY, ctx.api_version)
    include_synonyms = getattr(request, "include_synonyms", False)
    results = []
    for resource in request.resources:
        wanted = None if resource.configuration_keys is None else set(resource.configuration_keys)
        code, message, entries = ErrorCode.none, None, []
        if resource.resource_type == TOPIC:
            topic = broker.topic(resource.resource_name)
            if topic is None:
                code, message = ErrorCode.unknown_topic_or_partition, f"Topic '{resource.resource_name}' does not exist."
            else:
                entries = topic_configs(broker, topic)
        elif resource.resource_type == BROKER:
            if resource.resource_name not in ("", str(broker.node_id)):
                code, message = ErrorCode.invalid_request, f"Unexpected broker id {resource.resource_name!r}"
            else:
                entries = [
                    (name, _text(getattr(broker.config, field_name)), STATIC_BROKER_CONFIG, None)
                    for name, field_name in _BROKER_FIELDS.items()
                ]
        else:
            code, message = ErrorCode.invalid_request, f"Unsupported resource type {resource.resource_type}"
        configs = tuple(
            build(
                module.DescribeConfigsResourceResult,
                name=name,
                value=value,
                read_only=resource.resource_type == BROKER,
                config_source=source,
                is_default=source == DEFAULT_CONFIG,
                is_sensitive=False,
                synonyms=_synonyms(module, name, value, source, default) if include_synonyms else (),
            )
            for name, value, source, default in entries
            if wanted is None or name in wanted
        )
        results.append(
            build(
                module.DescribeConfigsResult,
                error_code=code,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
                configs=configs,
            )
        )
    return build(module.DescribeConfigsResponse, throttle_time=NO_THROTTLE, results=tuple(results))


HANDLERS = {API_KEY: (1, 2, handle)}
