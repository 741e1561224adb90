"""DescribeConfigs (32) v1-4, AlterConfigs (33) v0-2 and IncrementalAlterConfigs (44) v0-1: topic and
broker configs, read with their sources and changed at run time.

Resources: a topic (type 2, by name) or a broker (type 4; name = a node id, or "" for the dynamic defaults
every broker takes). ``broker.config_sources`` resolves values and sources (DYNAMIC_TOPIC_CONFIG,
DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG), lists the
synonyms and the documentation when asked, and checks every change, all from the registry of settings
(``broker.config.CONFIGS``); a sensitive setting's value is null.

AlterConfigs replaces a resource's whole set of overrides (Kafka's semantics: what the request leaves out is
reset); IncrementalAlterConfigs applies SET / DELETE / APPEND / SUBTRACT to the current set. Either way the
new set is checked as a whole (INVALID_CONFIG with a message naming the config), then handed to the metadata
backend, which persists it (``topics.json`` / ``broker-configs.json``, or etcd) and publishes it; the
partitions take it as Kafka does live: retention and flush policies at once, ``segment.bytes`` for the next
segment, ``min.insync.replicas`` for the next acks=all write. ``validate_only`` checks and changes nothing.

Errors per resource: unknown topic -> UNKNOWN_TOPIC_OR_PARTITION (3); a broker id that is not registered,
or another resource type -> INVALID_REQUEST (42) (broker loggers, client quotas and the like do not exist
here); the same resource twice in one request -> INVALID_REQUEST for each.
"""

from __future__ import annotations

import logging
from collections import Counter

from kio.schema.errors import ErrorCode

from copyless.broker import config_sources as sources
from copyless.broker.errors import BrokerError, error_for
from copyless.broker.handlers.context import RequestContext
from copyless.broker.security import checks
from copyless.broker.security.checks import Operation
from copyless.broker.wire.codecs import NO_THROTTLE, build, response_module

log = logging.getLogger("copyless.configs")

DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 33, 44
TOPIC, BROKER = 2, 4


def _broker_key(broker, name: str) -> str:
    """The dynamic-config key of a broker resource name ("" or a registered node id).

    Raises:
        BrokerError(INVALID_REQUEST): not a node id of this cluster.
    """
    if name == "":
        return ""
    try:
        node_id = int(name)
    except ValueError:
        raise BrokerError(ErrorCode.invalid_request, f"Broker id must be an integer, got {name!r}") from None
    if node_id != broker.node_id and node_id not in broker.metadata.image.brokers:
        raise BrokerError(ErrorCode.invalid_request, f"Unexpected broker id {name!r}: not a registered broker")
    return str(node_id)


def _check_authorized(ctx: RequestContext, resource, operation) -> None:
    """DescribeConfigs / AlterConfigs on the topic, or on the cluster for a broker. Raises BrokerError
    (TOPIC_ / CLUSTER_AUTHORIZATION_FAILED)."""
    if resource.resource_type == TOPIC and not checks.topic(ctx, operation, resource.resource_name):
        raise BrokerError(ErrorCode.topic_authorization_failed, f"Not authorized: {operation.name} on the topic")
    if resource.resource_type == BROKER and not checks.cluster(ctx, operation):
        raise BrokerError(ErrorCode.cluster_authorization_failed, f"Not authorized: {operation.name} on the cluster")


# --- DescribeConfigs -------------------------------------------------------------------------------------------


def _entries(broker, resource) -> list[sources.ConfigEntry]:
    """Raises BrokerError (unknown topic, bad broker id, unsupported type)."""
    if resource.resource_type == TOPIC:
        topic = broker.topic(resource.resource_name)
        if topic is None:
            raise BrokerError(ErrorCode.unknown_topic_or_partition,
                              f"Topic '{resource.resource_name}' does not exist.")
        return sources.describe_topic(topic.configs, broker.static_config, broker.node_id, broker.dynamic_configs)
    if resource.resource_type == BROKER:
        key = _broker_key(broker, resource.resource_name)
        if key not in ("", str(broker.node_id)):
            # Admin clients send a broker resource to that broker; its static settings are only known there.
            raise BrokerError(ErrorCode.invalid_request,
                              f"Broker {key}'s configs are described by broker {key}, not by node {broker.node_id}")
        return sources.describe_broker(broker.static_config, broker.node_id, broker.dynamic_configs,
                                       defaults_only=key == "")
    raise BrokerError(ErrorCode.invalid_request, f"Unsupported resource type {resource.resource_type}")


async def describe_configs(ctx: RequestContext, request):
    broker = ctx.broker
    module = response_module(DESCRIBE_CONFIGS, ctx.api_version)
    include_synonyms = getattr(request, "include_synonyms", False)
    include_documentation = getattr(request, "include_documentation", False)
    results = []
    for resource in request.resources:
        wanted = None if resource.configuration_keys is None else set(resource.configuration_keys)
        code, message, entries = ErrorCode.none, None, []
        try:
            _check_authorized(ctx, resource, Operation.DESCRIBE_CONFIGS)
            entries = _entries(broker, resource)
        except BrokerError as exc:
            code, message = exc.code, exc.message
        configs = tuple(
            build(
                module.DescribeConfigsResourceResult,
                name=entry.name,
                value=entry.value,
                read_only=entry.read_only,
                config_source=entry.source,
                is_default=entry.source == sources.DEFAULT_CONFIG,
                is_sensitive=entry.sensitive,
                synonyms=tuple(module.DescribeConfigsSynonym(name=name, value=value, source=source)
                               for name, value, source in entry.synonyms) if include_synonyms else (),
                config_type=entry.config_type,
                documentation=entry.documentation if include_documentation else None,
            )
            for entry in entries
            if wanted is None or entry.name in wanted
        )
        results.append(build(module.DescribeConfigsResult, error_code=code, error_message=message,
                             resource_type=resource.resource_type, resource_name=resource.resource_name,
                             configs=configs))
    return build(module.DescribeConfigsResponse, throttle_time=NO_THROTTLE, results=tuple(results))


# --- AlterConfigs / IncrementalAlterConfigs ----------------------------------------------------------------------


async def _alter(broker, resource, change, validate_only: bool) -> None:
    """Apply ``change`` (current overrides -> new overrides) to one resource. Raises BrokerError."""
    if resource.resource_type == TOPIC:
        name = resource.resource_name
        topic = broker.topic(name)
        if topic is None:
            raise BrokerError(ErrorCode.unknown_topic_or_partition, f"Topic '{name}' does not exist.")
        configs = change(dict(topic.configs))
        sources.check_topic_configs(configs, len(topic.assignment[0]) if topic.assignment else 1)
        await broker.metadata.alter_topic_configs(name, configs, validate_only=validate_only)
        return
    if resource.resource_type == BROKER:
        key = _broker_key(broker, resource.resource_name)
        configs = change(dict(broker.dynamic_configs.get(key, {})))
        sources.check_broker_configs(configs)
        # The whole result must make a valid broker config, for this broker at least (every broker checks its
        # own when it applies it, and keeps its previous settings if that fails).
        layered = {**broker.dynamic_configs, key: configs}
        sources.effective_config(broker.static_config, broker.node_id, layered, current=broker.config)
        await broker.metadata.alter_broker_configs(key, configs, validate_only=validate_only)
        return
    raise BrokerError(ErrorCode.invalid_request, f"Unsupported resource type {resource.resource_type}")


async def _alter_all(ctx: RequestContext, request, change_for) -> list[tuple[object, ErrorCode, str | None]]:
    counts = Counter((resource.resource_type, resource.resource_name) for resource in request.resources)
    outcomes = []
    for resource in request.resources:
        code, message = ErrorCode.none, None
        try:
            if counts[(resource.resource_type, resource.resource_name)] > 1:
                raise BrokerError(ErrorCode.invalid_request,
                                  f"Error due to duplicate resource {resource.resource_name!r} in one request")
            _check_authorized(ctx, resource, Operation.ALTER_CONFIGS)
            await _alter(ctx.broker, resource, change_for(resource), request.validate_only)
        except Exception as exc:
            code, message = error_for(exc)
        if code != ErrorCode.none:
            log.info("alter configs of %s %r for %s refused: %s %s", "topic" if resource.resource_type == TOPIC
                     else "broker", resource.resource_name, ctx.client_id, code.name, message)
        elif not request.validate_only:
            log.info("configs of %s %r altered by %s", "topic" if resource.resource_type == TOPIC else "broker",
                     resource.resource_name, ctx.client_id)
        outcomes.append((resource, code, message))
    return outcomes


def _respond(ctx: RequestContext, api_key: int, response_name: str, outcomes):
    module = response_module(api_key, ctx.api_version)
    responses = tuple(build(module.AlterConfigsResourceResponse, error_code=code, error_message=message,
                            resource_type=resource.resource_type, resource_name=resource.resource_name)
                      for resource, code, message in outcomes)
    return build(getattr(module, response_name), throttle_time=NO_THROTTLE, responses=responses)


async def alter_configs(ctx: RequestContext, request):
    def change_for(resource):
        # The request's set replaces the current one.
        return lambda _current: {config.name: config.value for config in resource.configs}

    outcomes = await _alter_all(ctx, request, change_for)
    return _respond(ctx, ALTER_CONFIGS, "AlterConfigsResponse", outcomes)


async def incremental_alter_configs(ctx: RequestContext, request):
    def change_for(resource):
        operations = [(config.name, config.config_operation, config.value) for config in resource.configs]
        return lambda current: sources.apply_incremental(current, operations)

    outcomes = await _alter_all(ctx, request, change_for)
    return _respond(ctx, INCREMENTAL_ALTER_CONFIGS, "IncrementalAlterConfigsResponse", outcomes)


HANDLERS = {
    DESCRIBE_CONFIGS: (1, 4, describe_configs),
    ALTER_CONFIGS: (0, 2, alter_configs),
    INCREMENTAL_ALTER_CONFIGS: (0, 1, incremental_alter_configs),
}
