"""Where each setting's value comes from, as DescribeConfigs reports it, and how a change is checked: derived
from the one registry of settings (``broker.config.CONFIGS``).

Kafka resolves a setting through layers, the first that has it winning (``ConfigSource`` numbers as on the
wire)::

    DYNAMIC_TOPIC_CONFIG (1)           the topic's override (topics.json / the topic's etcd key)
    DYNAMIC_BROKER_CONFIG (2)          set at run time for one broker (AlterConfigs, resource name "<id>")
    DYNAMIC_DEFAULT_BROKER_CONFIG (3)  set at run time for every broker (resource name "")
    STATIC_BROKER_CONFIG (4)           the broker's --config file or command line
    DEFAULT_CONFIG (5)                 the default

A topic config's broker-level synonym (``retention.ms`` <- ``log.retention.ms``) supplies its value when the
topic has none, so changing ``log.retention.ms`` at run time moves every topic that does not override it, as
in Kafka. Only the settings the registry marks dynamic change without a restart (the ``log.*`` defaults a
log reads, ``message.max.bytes``, ``min.insync.replicas``, ``unclean.leader.election.enable``); the rest are
read-only, and altering one is INVALID_CONFIG naming it. A sensitive setting (a password) is described with a
null value in every layer, as Kafka does.

Dynamic broker configs are stored as two maps of Kafka names to text, ``""`` (every broker) and ``"<id>"``
(one broker), kept by the metadata backend (``broker-configs.json`` on a single node, one etcd key per map in
a cluster) and handed to ``effective_config``, which makes the ``BrokerConfig`` every layer reads.

Pure: values in, values out. Refusals raise ``InvalidConfig`` (INVALID_CONFIG, 40) with a message naming
the config and the reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from copyless.broker.config import CONFIGS, BrokerConfig, ConfigError
from copyless.broker.config_def import ConfigDef, ConfigKey, ConfigType
from copyless.broker.errors import BrokerError
from copyless.broker.storage.config import LogConfig
from copyless.broker.topics import parse_topic_configs

__all__ = [
    "DYNAMIC_TOPIC_CONFIG", "DYNAMIC_BROKER_CONFIG", "DYNAMIC_DEFAULT_BROKER_CONFIG", "STATIC_BROKER_CONFIG",
    "DEFAULT_CONFIG", "InvalidConfig", "ConfigEntry", "effective_config", "check_broker_configs",
    "describe_broker", "describe_topic", "apply_incremental", "SET", "DELETE", "APPEND", "SUBTRACT",
    "check_topic_configs", "DEFAULTS_KEY",
]

DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG = 1, 2, 3
STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 4, 5
# IncrementalAlterConfigs operations (KIP-339).
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
DEFAULTS_KEY = ""  # the map of dynamic configs every broker takes


class InvalidConfig(BrokerError):
    code = ErrorCode.invalid_config


@dataclass(frozen=True)
class ConfigEntry:
    """One DescribeConfigs line: the effective value, its source, and the layers below it (synonyms, in
    precedence order, the first being the entry itself)."""

    name: str
    value: str | None
    source: int
    read_only: bool
    config_type: int
    synonyms: tuple[tuple[str, str | None, int], ...]
    sensitive: bool = False
    documentation: str | None = None


# --- dynamic broker configs ------------------------------------------------------------------------------------


def _broker_name(key: ConfigKey) -> str:
    """A broker setting's config name (``broker_config_name``, which is None only for a topic-only setting)."""
    return key.broker_name or key.name


def _field(key: ConfigKey) -> str:
    """The BrokerConfig field a dynamic broker setting sets (every one has a field)."""
    if key.field is None:
        raise InvalidConfig(f"Cannot update these configs dynamically: {key.name} (no broker field)")
    return key.field


def check_broker_configs(configs: Mapping[str, str | None], registry: ConfigDef = CONFIGS) -> dict[str, Any]:
    """Check one map of dynamic broker configs; returns BrokerConfig field -> value.

    Raises:
        InvalidConfig: an unknown name, a setting that is not dynamic, or a bad value (named).
    """
    fields: dict[str, Any] = {}
    for name, text in configs.items():
        key = registry.broker_key(name)
        if key is None:
            raise InvalidConfig(f"Unknown broker config name: {name}")
        if not key.dynamic:
            raise InvalidConfig(f"Cannot update these configs dynamically: {name} (read-only; set it in the "
                                f"broker's --config file)")
        if name != key.broker_config_name:
            raise InvalidConfig(f"Cannot update these configs dynamically: {name} (set {key.broker_config_name} "
                                f"instead)")
        if text is None:
            raise InvalidConfig(f"Null value not supported for broker config {name}")
        try:
            fields[_field(key)] = key.value_of(text, name)
        except ConfigError as exc:
            raise InvalidConfig(str(exc)) from None
    return fields


def effective_config(static: BrokerConfig, node_id: int, dynamic: Mapping[str, Mapping[str, str]],
                     current: BrokerConfig | None = None) -> BrokerConfig:
    """``current`` (default ``static``) with every dynamic setting resolved from ``dynamic`` (the ""
    map, then the broker's own map winning), or from ``static`` where neither sets it.

    Raises:
        InvalidConfig: the resulting config is refused as a whole (``BrokerConfig.validate``'s message).
    """
    fields = {_field(key): getattr(static, _field(key)) for key in CONFIGS.broker_keys() if key.dynamic}
    fields.update(check_broker_configs(dynamic.get(DEFAULTS_KEY, {})))
    fields.update(check_broker_configs(dynamic.get(str(node_id), {})))
    config = dataclasses.replace(current or static, **fields)
    try:
        config.validate()
        config.log_config()
    except (ConfigError, ValueError) as exc:
        raise InvalidConfig(str(exc)) from None
    return config


def _broker_layers(key: ConfigKey, static: BrokerConfig, node_id: int,
                   dynamic: Mapping[str, Mapping[str, str]]) -> list[tuple[str, str | None, int]]:
    """(name, value, source) for every layer that has broker setting ``key``, strongest first."""
    name = _broker_name(key)
    hide = key.is_sensitive
    layers = []
    own = dynamic.get(str(node_id), {})
    defaults = dynamic.get(DEFAULTS_KEY, {})
    if name in own:
        layers.append((name, None if hide else own[name], DYNAMIC_BROKER_CONFIG))
    if name in defaults:
        layers.append((name, None if hide else defaults[name], DYNAMIC_DEFAULT_BROKER_CONFIG))
    static_text = key.text_of(key.current(static))
    if key.read is not None and key.field is not None:
        # A value computed from the mode: its default is what this mode computes with the field unset.
        default_text = key.text_of(key.current(dataclasses.replace(static, **{key.field: key.default})))
    else:
        default_text = key.default_text
    if static_text != default_text:
        layers.append((name, None if hide else static_text, STATIC_BROKER_CONFIG))
    layers.append((name, None if hide else default_text, DEFAULT_CONFIG))
    return layers


def describe_broker(static: BrokerConfig, node_id: int, dynamic: Mapping[str, Mapping[str, str]], *,
                    defaults_only: bool = False, registry: ConfigDef = CONFIGS) -> list[ConfigEntry]:
    """The broker resource's configs: every broker setting of the registry. ``defaults_only`` (resource name
    ""): only the dynamic defaults set, as Kafka describes the cluster-wide default resource."""
    entries = []
    if defaults_only:
        for name, value in sorted(dynamic.get(DEFAULTS_KEY, {}).items()):
            key = registry.broker_key(name)
            hide = key is not None and key.is_sensitive
            entries.append(ConfigEntry(name, None if hide else value, DYNAMIC_DEFAULT_BROKER_CONFIG, False,
                                       key.config_type if key else ConfigType.STRING,
                                       ((name, None if hide else value, DYNAMIC_DEFAULT_BROKER_CONFIG),), hide,
                                       key.doc if key else None))
        return entries
    for key in registry.broker_keys():
        layers = _broker_layers(key, static, node_id, dynamic)
        _n, shown, source = layers[0]
        entries.append(ConfigEntry(_broker_name(key), shown, source, not key.dynamic, key.config_type,
                                   tuple(layers), key.is_sensitive, key.doc))
    return entries


def describe_topic(topic_configs: Mapping[str, str], static: BrokerConfig, node_id: int,
                   dynamic: Mapping[str, Mapping[str, str]], *, registry: ConfigDef = CONFIGS) -> list[ConfigEntry]:
    """A topic resource's configs: each topic config of the registry, then any other override the topic
    carries (stored before the registry knew better)."""
    entries = []
    for key in registry.topic_keys():
        hide = key.is_sensitive
        layers: list[tuple[str, str | None, int]] = []
        if key.name in topic_configs:
            layers.append((key.name, None if hide else topic_configs[key.name], DYNAMIC_TOPIC_CONFIG))
        if key.is_broker:
            layers.extend(_broker_layers(key, static, node_id, dynamic))
        else:
            layers.append((key.name, None if hide else key.default_text, DEFAULT_CONFIG))
        _n, value, source = layers[0]
        entries.append(ConfigEntry(key.name, value, source, False, key.config_type, tuple(layers), hide, key.doc))
    for name in sorted(set(topic_configs) - {key.name for key in registry.topic_keys()}):
        value = topic_configs[name]
        entries.append(ConfigEntry(name, value, DYNAMIC_TOPIC_CONFIG, False, ConfigType.STRING,
                                   ((name, value, DYNAMIC_TOPIC_CONFIG),)))
    return entries


# --- changes ------------------------------------------------------------------------------------------------------


# Configs that hold comma-separated lists: IncrementalAlterConfigs APPEND / SUBTRACT apply to them.
_LIST_CONFIGS = frozenset(name for key in CONFIGS if key.config_type == ConfigType.LIST
                          for name in (key.name, key.broker_config_name) if name)


def apply_incremental(current: Mapping[str, str], operations, *, list_configs=_LIST_CONFIGS) -> dict[str, str]:
    """IncrementalAlterConfigs: ``operations`` [(name, op, value)] applied to ``current`` (a copy returned).

    Raises:
        InvalidConfig: APPEND / SUBTRACT on a config that is not a list, or an unknown operation.
        BrokerError(INVALID_REQUEST): the same name twice in one resource (Kafka's rule).
    """
    result = dict(current)
    seen = set()
    for name, operation, value in operations:
        if name in seen:
            raise BrokerError(ErrorCode.invalid_request, f"Error due to duplicate config keys: {name}")
        seen.add(name)
        if operation == SET:
            if value is None:
                raise InvalidConfig(f"Null value not supported for : {name}")
            result[name] = value
        elif operation == DELETE:
            result.pop(name, None)
        elif operation in (APPEND, SUBTRACT):
            if name not in list_configs:
                verb = "append" if operation == APPEND else "subtract"
                raise InvalidConfig(f"Config value {verb} is not allowed for config key: {name}")
            items = [item for item in result.get(name, "").split(",") if item]
            changes = [item.strip() for item in (value or "").split(",") if item.strip()]
            if operation == APPEND:
                items.extend(item for item in changes if item not in items)
            else:
                items = [item for item in items if item not in changes]
            if items:
                result[name] = ",".join(items)
            else:
                result.pop(name, None)
        else:
            raise InvalidConfig(f"Unknown config operation {operation} for {name}")
    return result


def check_topic_configs(configs: Mapping[str, str | None], replication_factor: int) -> None:
    """A topic's whole set of overrides after a change. Raises InvalidConfig (or TopicError INVALID_CONFIG)."""
    overrides = parse_topic_configs(configs)
    try:
        dataclasses.replace(LogConfig(), **overrides)
    except ValueError as exc:
        raise InvalidConfig(str(exc)) from None
    min_isr = configs.get("min.insync.replicas")
    if min_isr is not None and int(min_isr) > replication_factor:
        raise InvalidConfig(f"min.insync.replicas={min_isr} exceeds the replication factor {replication_factor}")
