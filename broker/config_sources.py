"""Every config the admin APIs name, where its value comes from, and how a change to it is checked.

Kafka resolves a setting through layers, the first that has it winning (``ConfigSource`` numbers as on the
wire)::

    DYNAMIC_TOPIC_CONFIG (1)           the topic's override (topics.json / the topic's etcd key)
    DYNAMIC_BROKER_CONFIG (2)          set at run time for one broker (AlterConfigs, resource name "<id>")
    DYNAMIC_DEFAULT_BROKER_CONFIG (3)  set at run time for every broker (resource name "")
    STATIC_BROKER_CONFIG (4)           the broker's --config file or command line
    DEFAULT_CONFIG (5)                 Kafka's default

A topic config's broker-level synonym (``retention.ms`` <- ``log.retention.ms``) supplies its value when the
topic has none, so changing ``log.retention.ms`` at run time moves every topic that does not override it, as
in Kafka. Only the settings Kafka updates without a restart are dynamic here (the ``log.*`` defaults a log
reads, ``message.max.bytes``, ``min.insync.replicas``, ``unclean.leader.election.enable``); the rest are
read-only, and altering one is INVALID_CONFIG naming it.

Dynamic broker configs are stored as two maps of Kafka names to text, ``""`` (every broker) and ``"<id>"``
(one broker), kept by the metadata backend (``broker-configs.json`` on a single node, one etcd key per map in
a cluster) and handed to ``effective_config``, which makes the ``BrokerConfig`` every layer reads.

Pure: values in, values out. Refusals raise ``InvalidConfig`` (INVALID_CONFIG, 40) with a message naming
the config and the reason.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kio.schema.errors import ErrorCode

from copyless.broker.config import BrokerConfig, ConfigError
from copyless.broker.errors import BrokerError
from copyless.broker.storage.config import LogConfig
from copyless.broker.topics import TopicError, convert_topic_config, parse_topic_configs

__all__ = [
    "DYNAMIC_TOPIC_CONFIG", "DYNAMIC_BROKER_CONFIG", "DYNAMIC_DEFAULT_BROKER_CONFIG", "STATIC_BROKER_CONFIG",
    "DEFAULT_CONFIG", "InvalidConfig", "ConfigEntry", "BROKER_SETTINGS", "TOPIC_CONFIG_NAMES",
    "effective_config", "check_broker_configs", "describe_broker", "describe_topic", "apply_incremental",
    "SET", "DELETE", "APPEND", "SUBTRACT", "check_topic_configs", "DEFAULTS_KEY",
]

DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG = 1, 2, 3
STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 4, 5
# IncrementalAlterConfigs operations (KIP-339).
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
# DescribeConfigs v3+ config types (Kafka's ConfigDef.Type order).
BOOLEAN, STRING, INT, LONG, LIST = 1, 2, 3, 5, 7
DEFAULTS_KEY = ""  # the map of dynamic configs every broker takes


class InvalidConfig(BrokerError):
    code = ErrorCode.invalid_config


@dataclass(frozen=True)
class BrokerSetting:
    """A broker config: its BrokerConfig field, whether it changes at run time, and for a dynamic one the
    topic config whose checks its values pass (the topic config it is the default of, if any)."""

    name: str
    field: str
    config_type: int
    dynamic: bool = False
    topic_name: str | None = None
    parse: Callable[[str, str], Any] | None = None
    text: Callable[[Any], str] | None = None  # how the value is written, when not the plain form


def _as_bool(name: str, text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise InvalidConfig(f"Invalid value {text!r} for configuration {name}: must be true or false")
    return text.lower() == "true"


def _setting(name, field, config_type, topic_name=None, *, dynamic=False, parse=None, text=None) -> BrokerSetting:
    return BrokerSetting(name, field, config_type, dynamic, topic_name, parse, text)


def _listeners(value) -> str | None:
    """Kafka's ``NAME://HOST:PORT,...``; null when no named listeners are set (the one PLAINTEXT listener of
    ``--listen`` then serves)."""
    return ",".join(f"{name}://{host}:{port}" for name, host, port in value) or None


_SETTINGS = (
    _setting("node.id", "node_id", INT),
    _setting("log.dirs", "data_dir", STRING),
    _setting("listeners", "listeners", STRING, text=_listeners),
    _setting("advertised.listeners", "advertised_listeners", STRING, text=_listeners),
    _setting("inter.broker.listener.name", "inter_broker_listener", STRING),
    _setting("metadata", "metadata", STRING),
    _setting("log.flush.mode", "flush_mode", STRING),
    _setting("auto.create.topics.enable", "auto_create_topics", BOOLEAN),
    _setting("num.partitions", "num_partitions", INT),
    _setting("default.replication.factor", "default_replication_factor", INT),
    _setting("socket.request.max.bytes", "max_request_bytes", INT),
    _setting("socket.send.buffer.bytes", "socket_send_buffer_bytes", INT),
    _setting("socket.receive.buffer.bytes", "socket_receive_buffer_bytes", INT),
    _setting("fetch.max.bytes", "fetch_max_bytes", INT),
    _setting("connections.max.idle.ms", "connections_max_idle_ms", LONG),
    _setting("message.max.bytes", "message_max_bytes", INT, "max.message.bytes", dynamic=True),
    _setting("log.retention.ms", "retention_ms", LONG, "retention.ms", dynamic=True),
    _setting("log.retention.bytes", "retention_bytes", LONG, "retention.bytes", dynamic=True),
    _setting("log.segment.bytes", "segment_bytes", INT, "segment.bytes", dynamic=True),
    _setting("log.roll.ms", "segment_ms", LONG, "segment.ms", dynamic=True),
    _setting("log.index.size.max.bytes", "segment_index_bytes", INT, "segment.index.bytes", dynamic=True),
    _setting("log.index.interval.bytes", "index_interval_bytes", INT, "index.interval.bytes", dynamic=True),
    _setting("log.flush.interval.messages", "flush_messages", LONG, "flush.messages", dynamic=True),
    _setting("log.flush.interval.ms", "flush_ms", LONG, "flush.ms", dynamic=True),
    _setting("log.message.timestamp.type", "message_timestamp_type", STRING, "message.timestamp.type",
             dynamic=True),
    _setting("log.preallocate", "preallocate", BOOLEAN, "preallocate", dynamic=True),
    _setting("log.retention.check.interval.ms", "retention_check_interval_ms", LONG),
    _setting("min.insync.replicas", "min_insync_replicas", INT, "min.insync.replicas", dynamic=True),
    _setting("unclean.leader.election.enable", "unclean_leader_election", BOOLEAN,
             "unclean.leader.election.enable", dynamic=True),
    _setting("replica.lag.time.max.ms", "replica_lag_time_max_ms", LONG),
    _setting("replica.fetch.wait.max.ms", "replica_fetch_wait_max_ms", INT),
    _setting("replica.fetch.max.bytes", "replica_fetch_max_bytes", INT),
    _setting("broker.session.timeout.ms", "broker_session_timeout_ms", INT),
    _setting("auto.leader.rebalance.enable", "auto_leader_rebalance", BOOLEAN),
    _setting("leader.imbalance.check.interval.ms", "leader_imbalance_check_interval_ms", LONG),
    _setting("group.min.session.timeout.ms", "group_min_session_timeout_ms", INT),
    _setting("group.max.session.timeout.ms", "group_max_session_timeout_ms", INT),
    _setting("offsets.retention.ms", "offsets_retention_ms", LONG),
    _setting("offsets.retention.check.interval.ms", "offsets_retention_check_interval_ms", LONG),
    _setting("group.max.size", "group_max_size", INT),
    _setting("replica.fetch.response.max.bytes", "replica_fetch_response_max_bytes", INT),
    _setting("replica.high.watermark.checkpoint.interval.ms", "replica_high_watermark_checkpoint_interval_ms", LONG),
    _setting("offsets.topic.replication.factor", "offsets_topic_replication_factor", INT),
)
BROKER_SETTINGS: dict[str, BrokerSetting] = {setting.name: setting for setting in _SETTINGS}
# Broker settings whose value is computed from the mode (single node or cluster) when not set.
_MODE_DEFAULTS = {
    "offsets.topic.num.partitions": ("offsets_partitions", INT),
    "group.initial.rebalance.delay.ms": ("initial_rebalance_delay", INT),
}

# Topic configs in the order DescribeConfigs lists them; each with its broker synonym (None: none, the
# default below applies) and type.
_TOPIC_CONFIGS: dict[str, tuple[str | None, int, str | None]] = {
    "cleanup.policy": (None, LIST, "delete"),
    "compression.type": (None, STRING, "producer"),
    "retention.ms": ("log.retention.ms", LONG, None),
    "retention.bytes": ("log.retention.bytes", LONG, None),
    "segment.bytes": ("log.segment.bytes", INT, None),
    "segment.ms": ("log.roll.ms", LONG, None),
    "segment.index.bytes": ("log.index.size.max.bytes", INT, None),
    "index.interval.bytes": ("log.index.interval.bytes", INT, None),
    "flush.messages": ("log.flush.interval.messages", LONG, None),
    "flush.ms": ("log.flush.interval.ms", LONG, None),
    "file.delete.delay.ms": (None, LONG, "60000"),
    "max.message.bytes": ("message.max.bytes", INT, None),
    "message.timestamp.type": ("log.message.timestamp.type", STRING, None),
    "min.insync.replicas": ("min.insync.replicas", INT, None),
    "unclean.leader.election.enable": ("unclean.leader.election.enable", BOOLEAN, None),
    "preallocate": ("log.preallocate", BOOLEAN, None),
}
TOPIC_CONFIG_NAMES = tuple(_TOPIC_CONFIGS)
# Topic configs that hold comma-separated lists (IncrementalAlterConfigs APPEND / SUBTRACT apply to them).
_LIST_TOPIC_CONFIGS = frozenset({"cleanup.policy", "follower.replication.throttled.replicas",
                                 "leader.replication.throttled.replicas"})

_DEFAULTS = BrokerConfig()


def _text(value) -> str:
    """A BrokerConfig value as Kafka writes it (None is Kafka's -1, "unlimited" / "never")."""
    if value is None:
        return "-1"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _string(value) -> str | None:
    """A string setting: unset is null, as Kafka describes it."""
    return None if value is None else str(value)


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


# --- dynamic broker configs ------------------------------------------------------------------------------------


def _parse_broker_value(setting: BrokerSetting, text: str | None):
    if text is None:
        raise InvalidConfig(f"Null value not supported for broker config {setting.name}")
    try:
        if setting.config_type == BOOLEAN:
            return _as_bool(setting.name, text)
        # A dynamic broker default passes the checks of the topic config it is the default of.
        return convert_topic_config(setting.topic_name, text, shown_as=setting.name)
    except TopicError as exc:
        raise InvalidConfig(exc.message) from None


def check_broker_configs(configs: Mapping[str, str | None]) -> dict[str, Any]:
    """Check one map of dynamic broker configs; returns BrokerConfig field -> value.

    Raises:
        InvalidConfig: an unknown name, a setting that is not dynamic, or a bad value (named).
    """
    fields: dict[str, Any] = {}
    for name, text in configs.items():
        setting = BROKER_SETTINGS.get(name)
        if setting is None:
            if name in _MODE_DEFAULTS:
                raise InvalidConfig(f"Cannot update these configs dynamically: {name} (read-only; set it in the "
                                    f"broker's --config file)")
            raise InvalidConfig(f"Unknown broker config name: {name}")
        if not setting.dynamic:
            raise InvalidConfig(f"Cannot update these configs dynamically: {name} (read-only; set it in the "
                                f"broker's --config file)")
        fields[setting.field] = _parse_broker_value(setting, text)
    return fields


def effective_config(static: BrokerConfig, node_id: int, dynamic: Mapping[str, Mapping[str, str]],
                     current: BrokerConfig | None = None) -> BrokerConfig:
    """``current`` (default ``static``) with every dynamic setting resolved from ``dynamic`` (the ""
    map, then the broker's own map winning), or from ``static`` where neither sets it.

    Raises:
        InvalidConfig: the resulting config is refused as a whole (``BrokerConfig.validate``'s message).
    """
    fields = {setting.field: getattr(static, setting.field) for setting in _SETTINGS if setting.dynamic}
    fields.update(check_broker_configs(dynamic.get(DEFAULTS_KEY, {})))
    fields.update(check_broker_configs(dynamic.get(str(node_id), {})))
    config = dataclasses.replace(current or static, **fields)
    try:
        config.validate()
        config.log_config()
    except (ConfigError, ValueError) as exc:
        raise InvalidConfig(str(exc)) from None
    return config


def _broker_layers(name: str, static: BrokerConfig, node_id: int,
                   dynamic: Mapping[str, Mapping[str, str]]) -> list[tuple[str, str | None, int]]:
    """(name, value, source) for every layer that has broker setting ``name``, strongest first."""
    layers = []
    own = dynamic.get(str(node_id), {})
    defaults = dynamic.get(DEFAULTS_KEY, {})
    if name in own:
        layers.append((name, own[name], DYNAMIC_BROKER_CONFIG))
    if name in defaults:
        layers.append((name, defaults[name], DYNAMIC_DEFAULT_BROKER_CONFIG))
    setting = BROKER_SETTINGS.get(name)
    if setting is not None:
        write = setting.text or (_string if setting.config_type == STRING else _text)
        static_text = write(getattr(static, setting.field))
        default_text = write(getattr(_DEFAULTS, setting.field))
    else:
        attribute, _type = _MODE_DEFAULTS[name]
        static_text = _text(getattr(static, attribute))
        default_text = static_text
    if static_text != default_text:
        layers.append((name, static_text, STATIC_BROKER_CONFIG))
    layers.append((name, default_text, DEFAULT_CONFIG))
    return layers


def describe_broker(static: BrokerConfig, node_id: int, dynamic: Mapping[str, Mapping[str, str]], *,
                    defaults_only: bool = False) -> list[ConfigEntry]:
    """The broker resource's configs. ``defaults_only`` (resource name ""): only the dynamic defaults set,
    as Kafka describes the cluster-wide default resource."""
    entries = []
    if defaults_only:
        for name, value in sorted(dynamic.get(DEFAULTS_KEY, {}).items()):
            setting = BROKER_SETTINGS.get(name)
            entries.append(ConfigEntry(name, value, DYNAMIC_DEFAULT_BROKER_CONFIG, False,
                                       setting.config_type if setting else STRING,
                                       ((name, value, DYNAMIC_DEFAULT_BROKER_CONFIG),)))
        return entries
    names = [*BROKER_SETTINGS, *_MODE_DEFAULTS]
    for name in names:
        layers = _broker_layers(name, static, node_id, dynamic)
        setting = BROKER_SETTINGS.get(name)
        config_type = setting.config_type if setting else _MODE_DEFAULTS[name][1]
        _n, value, source = layers[0]
        entries.append(ConfigEntry(name, value, source, not (setting and setting.dynamic), config_type,
                                   tuple(layers)))
    return entries


def describe_topic(topic_configs: Mapping[str, str], static: BrokerConfig, node_id: int,
                   dynamic: Mapping[str, Mapping[str, str]]) -> list[ConfigEntry]:
    """A topic resource's configs: each topic config the broker knows, then any other override the topic
    carries (accepted configs without an effect here)."""
    entries = []
    for name, (synonym, config_type, fixed_default) in _TOPIC_CONFIGS.items():
        layers: list[tuple[str, str | None, int]] = []
        if name in topic_configs:
            layers.append((name, topic_configs[name], DYNAMIC_TOPIC_CONFIG))
        if synonym is not None:
            layers.extend(_broker_layers(synonym, static, node_id, dynamic))
        else:
            layers.append((name, fixed_default, DEFAULT_CONFIG))
        _n, value, source = layers[0]
        entries.append(ConfigEntry(name, value, source, False, config_type, tuple(layers)))
    for name in sorted(set(topic_configs) - set(_TOPIC_CONFIGS)):
        value = topic_configs[name]
        entries.append(ConfigEntry(name, value, DYNAMIC_TOPIC_CONFIG, False, STRING,
                                   ((name, value, DYNAMIC_TOPIC_CONFIG),)))
    return entries


# --- changes ------------------------------------------------------------------------------------------------------


def apply_incremental(current: Mapping[str, str], operations, *, list_configs=_LIST_TOPIC_CONFIGS) -> dict[str, str]:
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
