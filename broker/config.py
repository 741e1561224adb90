"""Broker configuration: the one registry of settings (``CONFIGS``) and the frozen ``BrokerConfig`` it resolves to.

``CONFIGS`` is the only table of settings: each entry's names (Kafka's, with their synonyms), type, default,
validator, documentation, scope (broker, topic, or a topic config with a broker default), whether it
changes at run time and whether it is sensitive. The security settings are defined with the code that reads
them (``broker.security.settings.SECURITY_CONFIGS``) and added to it, as Kafka's ConfigDef takes SslConfigs'
keys. Everything else is derived from it: ``load_toml`` (``copyless serve --config``), the
topic overrides CreateTopics and the AlterConfigs APIs check (``broker.topics``), DescribeConfigs
(``broker.config_sources``), ``copyless serve --help`` and ``copyless configs``. Adding a setting is one
``define`` call below (and a field of ``BrokerConfig`` when the broker reads it); the machinery is
``broker.config_def``.

Sources of settings, later ones winning: the defaults (``BrokerConfig``'s fields), a TOML file
(``--config``), command-line flags; at run time the dynamic layers of ``broker.config_sources``. The TOML
file uses Kafka's dotted names, quoted (an unquoted dotted key is a TOML table)::

    listen = "0.0.0.0:9092"
    "log.dirs" = "/var/lib/copyless"
    "num.partitions" = 3
    "log.retention.hours" = 168          # or "log.retention.ms" = 604800000
    "log.flush.mode" = "sync"            # acks=all waits for fdatasync

Unknown keys are refused with the key's name (and the likely meant one), so a typo never silently falls
back to a default. The broker reads only the frozen ``BrokerConfig`` (and each partition its ``LogConfig``),
resolved once, never the registry, on its request paths.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from copyless.broker.config_def import (
    AtLeast,
    Between,
    ConfigDef,
    ConfigError,
    ListOf,
    OneOf,
    Scope,
    Supported,
    Synonym,
)
from copyless.broker.config_def import ConfigType as T
from copyless.broker.security.settings import SECURITY_CONFIGS, SecuritySettings, SettingsError, is_security_key

__all__ = ["BrokerConfig", "CONFIGS", "ConfigError", "parse_host_port", "parse_listener", "parse_listener_list",
           "load_toml", "NOT_SETTINGS"]

_HOUR_MS = 3600_000
_LISTENER_NAME = re.compile(r"^[A-Za-z0-9_]+$")
# Kafka's Long.MAX_VALUE: the default of its "never" settings (max.compaction.lag.ms and the like).
_LONG_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class BrokerConfig:
    """Everything the broker reads, resolved once. Names, defaults' meaning, checks and docs: ``CONFIGS``."""

    data_dir: Path = Path("./copyless-data")
    listen_host: str = "127.0.0.1"
    listen_port: int = 9092
    # What Metadata tells clients; None: the bound address.
    advertise_host: str | None = None
    advertise_port: int | None = None
    # Named listeners ((name, host, port), ...). Empty: one listener, PLAINTEXT, on listen_host:listen_port
    # advertised as advertise_host:advertise_port.
    listeners: tuple[tuple[str, str, int], ...] = ()
    advertised_listeners: tuple[tuple[str, str, int], ...] = ()
    inter_broker_listener: str | None = None
    node_id: int = 0
    # None: the embedded single node (topics.json); "etcd://h:p[,h:p...][/chroot]": the cluster kept in etcd.
    metadata: str | None = None
    cluster_id: str | None = None
    # A dead broker's partitions move after about this long. etcd grants no lease under 2 s; 2 s keeps a
    # leader's failure under Kafka's 9 s default by design, and keepalives every third of it tolerate a 1.3 s
    # stall.
    broker_session_timeout_ms: int = 2000
    min_insync_replicas: int = 1
    replica_lag_time_max_ms: int = 30_000
    unclean_leader_election: bool = False
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_max_bytes: int = 1 << 20
    replica_fetch_response_max_bytes: int = 10 << 20
    auto_leader_rebalance: bool = True
    leader_imbalance_check_interval_ms: int = 30_000  # Kafka: 300 s
    replica_high_watermark_checkpoint_interval_ms: int = 5000
    metrics_listen: tuple[str, int] | None = None
    loop: str = "uvloop"
    sendfile: bool = True
    auto_create_topics: bool = True
    num_partitions: int = 1
    default_replication_factor: int = 1
    max_request_bytes: int = 100 * 1024 * 1024
    # SO_SNDBUF of every accepted connection (-1: the kernel's autotuning). Kafka sets 100 KiB. With
    # autotuning a fetch's sendfile queues megabytes at once that the consumer's window cannot take yet;
    # the consumer's own ACKs then transmit them from its softirq, on its CPU: librdkafka read 10 KB
    # records at 0.92 GB/s with 1.9 s of its own kernel CPU per 3.2 GB, against 1.3-1.4 GB/s and 1.3 s at
    # 256 KiB (the kernel doubles it; 64 KiB was slower again, 1 MiB as slow as autotuning).
    socket_send_buffer_bytes: int = 256 * 1024
    socket_receive_buffer_bytes: int = -1
    fetch_max_bytes: int = 55 * 1024 * 1024
    connections_max_idle_ms: int | None = 600_000  # None: never close
    message_max_bytes: int = 1048588
    retention_ms: int | None = 7 * 24 * _HOUR_MS  # None: forever
    retention_bytes: int | None = None  # None: unlimited
    segment_bytes: int = 1 << 30
    segment_ms: int | None = 7 * 24 * _HOUR_MS
    segment_index_bytes: int = 10 * 1024 * 1024
    index_interval_bytes: int = 4096
    flush_messages: int | None = None
    flush_ms: int | None = None
    flush_mode: str = "async"
    message_timestamp_type: str = "CreateTime"
    cleanup_policy: tuple[str, ...] = ("delete",)
    min_cleanable_dirty_ratio: float = 0.5
    delete_retention_ms: int = 86_400_000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = _LONG_MAX
    log_cleaner_enable: bool = True
    log_cleaner_threads: int = 1
    log_cleaner_backoff_ms: int = 15_000
    log_cleaner_dedupe_buffer_size: int = 128 << 20
    log_cleaner_io_max_bytes_per_second: float = 1.7976931348623157e308  # Kafka's Double.MAX_VALUE: unthrottled
    preallocate: bool = False
    prefault_zeros: bool = True
    outrun_pwrite: bool = True
    retention_check_interval_ms: int = 300_000
    stats_interval_s: float = 60.0
    shutdown_timeout_s: float = 30.0
    # Blocking storage calls on the event loop's thread raise (storage/blocking.py): a debugging aid, on
    # under the test suite (copyless serve --check-loop-blocking).
    check_loop_blocking: bool = False
    # Producer ids handed out by InitProducerId are reserved on disk in blocks of this many, so a restart
    # never reuses an id (Kafka's controller allocates blocks of 1000 the same way).
    producer_id_block_size: int = 1000
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1800000
    # None: the mode's default (0 single node, 3000 in a cluster; see ``initial_rebalance_delay``).
    group_initial_rebalance_delay_ms: int | None = None
    group_max_size: int | None = None  # None: unlimited
    offsets_retention_ms: int = 7 * 24 * _HOUR_MS
    offsets_retention_check_interval_ms: int = 600000
    # None: the mode's default (1 single node, 50 in a cluster; see ``offsets_partitions``).
    offsets_topic_num_partitions: int | None = None
    offsets_topic_replication_factor: int = 3
    offsets_topic_segment_bytes: int = 16 * 1024 * 1024
    transaction_max_timeout_ms: int = 900000
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10000
    transactional_id_expiration_ms: int = 7 * 24 * _HOUR_MS
    transaction_remove_expired_transaction_cleanup_interval_ms: int = 3600000
    # None: the mode's default (1 single node, 50 in a cluster; see ``transaction_partitions``).
    transaction_state_log_num_partitions: int | None = None
    transaction_state_log_replication_factor: int = 3
    producer_id_expiration_ms: int = 24 * _HOUR_MS
    producer_id_expiration_check_interval_ms: int = 600000
    # TLS, SASL and ACL settings by Kafka's names, as given, resolved per listener (broker.security.settings).
    security: SecuritySettings = SecuritySettings()

    @property
    def advertised_host(self) -> str:
        return self.advertise_host or self.listen_host

    @property
    def advertised_port(self) -> int:
        return self.advertise_port if self.advertise_port is not None else self.listen_port

    def listener_specs(self) -> tuple[tuple[str, str, int], ...]:
        """Every listener as (name, host, port); the single-listener flags make one named PLAINTEXT."""
        if self.listeners:
            return self.listeners
        return (("PLAINTEXT", self.listen_host, self.listen_port),)

    def advertised_for(self, name: str, bound_host: str, bound_port: int) -> tuple[str, int]:
        """What Metadata tells clients that arrive on listener ``name``, once it is bound."""
        for listener, host, port in self.advertised_listeners:
            if listener == name:
                return host, port
        if not self.listeners and (self.advertise_host is not None or self.advertise_port is not None):
            port = self.advertise_port if self.advertise_port is not None else bound_port
            return self.advertise_host or bound_host, port
        return bound_host, bound_port

    @property
    def inter_broker_listener_name(self) -> str:
        return self.inter_broker_listener or self.listener_specs()[0][0]

    @property
    def clustered(self) -> bool:
        return self.metadata is not None

    @property
    def initial_rebalance_delay(self) -> int:
        """``group.initial.rebalance.delay.ms``, or its default for this mode."""
        if self.group_initial_rebalance_delay_ms is not None:
            return self.group_initial_rebalance_delay_ms
        return 3000 if self.clustered else 0

    @property
    def offsets_partitions(self) -> int:
        """``offsets.topic.num.partitions``, or its default for this mode."""
        if self.offsets_topic_num_partitions is not None:
            return self.offsets_topic_num_partitions
        return 50 if self.clustered else 1

    @property
    def transaction_partitions(self) -> int:
        """``transaction.state.log.num.partitions``, or its default for this mode."""
        if self.transaction_state_log_num_partitions is not None:
            return self.transaction_state_log_num_partitions
        return 50 if self.clustered else 1

    def with_bound_port(self, port: int) -> BrokerConfig:
        """The same settings once the listener is bound (port 0 resolves to a real port)."""
        return dataclasses.replace(self, listen_port=port)

    def with_first_advertised(self) -> BrokerConfig:
        """The first listener's advertised address also as the one-listener settings (the startup line)."""
        first = self.listener_specs()[0][0]
        for name, host, port in self.advertised_listeners:
            if name == first:
                return dataclasses.replace(self, advertise_host=host, advertise_port=port)
        return self

    def log_config(self):
        """The broker-wide defaults of every partition log (``LogConfig``): each setting with a ``log_field``."""
        from copyless.broker.storage.config import LogConfig

        return LogConfig(**{key.log_field: getattr(self, key.field) for key in CONFIGS if key.field and key.log_field})

    def validate(self) -> None:
        """Every setting's validator on its field, then the checks across settings. Raises ConfigError
        naming the first bad setting."""
        for key in CONFIGS.broker_keys():
            if key.field is not None:
                key.check_field(getattr(self, key.field))
        if not 0 <= self.listen_port <= 65535:
            raise ConfigError(f"listen port {self.listen_port} out of range")
        names = [name for name, _host, _port in self.listener_specs()]
        if len(set(names)) != len(names):
            raise ConfigError(f"listener names must be unique, got {names}")
        for name, _host, port in (*self.listener_specs(), *self.advertised_listeners):
            if not _LISTENER_NAME.match(name):
                raise ConfigError(f"listener name {name!r} must be letters, digits and '_'")
            if not 0 <= port <= 65535:
                raise ConfigError(f"port {port} of listener {name} out of range")
        for name, _host, _port in self.advertised_listeners:
            if name not in names:
                raise ConfigError(f"advertised listener {name} has no listener of that name (listeners: {names})")
        if self.inter_broker_listener is not None and self.inter_broker_listener not in names:
            raise ConfigError(f"inter.broker.listener.name {self.inter_broker_listener} is not a listener ({names})")
        try:
            self.security.validate(names)
        except SettingsError as exc:
            raise ConfigError(str(exc)) from None


# BrokerConfig fields that are not settings of their own: set through ``listen`` / ``advertise``, by the
# security settings (``security``), by a flag only (--check-loop-blocking), or fixed.
NOT_SETTINGS = frozenset({"listen_host", "listen_port", "advertise_host", "advertise_port", "security",
                          "check_loop_blocking", "producer_id_block_size"})


def parse_host_port(text: str, *, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` or ``[v6]:PORT`` -> (host, port).

    Raises:
        ConfigError: no port, or a port that is not an integer in 0..65535.
    """
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if not rest.startswith(":"):
            raise ConfigError(f"expected [HOST]:PORT, got {text!r}")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ConfigError(f"expected HOST:PORT, got {text!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"port in {text!r} is not an integer") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"port {port} out of range in {text!r}")
    return host or default_host, port


def parse_listener(text: str) -> tuple[str, str, int]:
    """``NAME=HOST:PORT`` or Kafka's ``NAME://HOST:PORT`` -> (name, host, port). Raises ConfigError."""
    text = text.strip()
    if "://" in text:
        name, _, address = text.partition("://")
    elif "=" in text:
        name, _, address = text.partition("=")
    else:
        name, address = "PLAINTEXT", text  # a bare HOST:PORT is the default listener, as before names
    name = name.strip()
    if not _LISTENER_NAME.match(name):
        raise ConfigError(f"listener name {name!r} must be letters, digits and '_'")
    host, port = parse_host_port(address, default_host="0.0.0.0")
    return name, host, port


def parse_listener_list(value) -> tuple[tuple[str, str, int], ...]:
    """A TOML value: Kafka's comma-separated ``"A://h:p,B://h:p"`` or a list of such strings."""
    if not isinstance(value, (str, list)):
        raise ConfigError("expected NAME://HOST:PORT[,NAME://HOST:PORT...]")
    items = value if isinstance(value, list) else value.split(",")
    return tuple(parse_listener(str(item)) for item in items if str(item).strip())


def _address(raw) -> tuple[str, int]:
    if not isinstance(raw, str):
        raise ConfigError("expected HOST:PORT")
    return parse_host_port(raw.split("://")[-1])


def _listeners_text(value) -> str | None:
    return ",".join(f"{name}://{host}:{port}" for name, host, port in value) or None


def _address_text(value) -> str | None:
    return None if value is None else f"{value[0]}:{value[1]}"


# Kafka's BrokerCompressionType names, read case-insensitively.
_COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")


def _compression_type(raw) -> str:
    if not isinstance(raw, str) or raw.strip().lower() not in _COMPRESSION_TYPES:
        raise ConfigError(f"String must be one of: {', '.join(_COMPRESSION_TYPES)}")
    return raw.strip().lower()


def _etcd_endpoints(name: str, value: str) -> None:
    if not value.startswith("etcd://"):
        raise ConfigError(f"Invalid value {value} for configuration {name}: expected "
                          f"etcd://HOST:PORT[,HOST:PORT...][/CHROOT]")


# --- the registry ---------------------------------------------------------------------------------------------------
# Kafka's names, types and validators (Kafka 3.9's, the version copyless is measured against), with a stricter
# bound only where copyless's storage needs one (said in the entry). ``field``: the BrokerConfig field (its
# default is the setting's); ``log_field``: the LogConfig field a partition log reads it from.

CONFIGS = ConfigDef(defaults=BrokerConfig())
_define = CONFIGS.define

# Identity, listeners, the cluster.
_define("node.id", T.INT, "This broker's id in the cluster.", field="node_id", validator=AtLeast(0),
        synonyms=(Synonym("broker.id"),))
_define("log.dirs", T.STRING, "The data directory: logs, checkpoints, meta.properties (one directory).",
        field="data_dir", parse=Path, text=str, synonyms=(Synonym("log.dir"), Synonym("data_dir")))
_define("listen", T.STRING, "The one PLAINTEXT listener, HOST:PORT (port 0: any free port); "
        "copyless's shorthand for listeners.", default=("127.0.0.1", 9092), parse=_address,
        apply=lambda value: {"listen_host": value[0], "listen_port": value[1]}, text=_address_text,
        read=lambda config: (config.listen_host, config.listen_port))
_define("advertise", T.STRING, "The address Metadata gives clients for the one listener, HOST:PORT "
        "(default: the bound one).", default=None, parse=_address,
        apply=lambda value: {"advertise_host": value[0], "advertise_port": value[1]}, text=_address_text,
        read=lambda config: (config.advertised_host, config.advertised_port)
        if config.advertise_host is not None or config.advertise_port is not None else None)
_define("listeners", T.STRING, "Named listeners to bind, NAME://HOST:PORT,... (default: the one of listen).",
        field="listeners", parse=parse_listener_list, text=_listeners_text,
        apply=lambda value: {"listen_host": value[0][1], "listen_port": value[0][2]} if value else {})
_define("advertised.listeners", T.STRING, "What Metadata gives clients of each listener, NAME://HOST:PORT,...",
        field="advertised_listeners", parse=parse_listener_list, text=_listeners_text)
_define("inter.broker.listener.name", T.STRING, "The listener brokers reach each other on (default: the first).",
        field="inter_broker_listener")
_define("metadata", T.STRING, "Join the cluster kept in etcd, etcd://HOST:PORT[,HOST:PORT...][/ROOT] "
        "(unset: a single node, its metadata in the data dir).", field="metadata", validator=_etcd_endpoints)
_define("cluster.id", T.STRING, "With metadata: the cluster id to create, or to require of the existing one.",
        field="cluster_id")
_define("broker.session.timeout.ms", T.INT, "How long a broker's etcd lease outlives its last keepalive: a dead "
        "broker's partitions move after about this long.",
        field="broker_session_timeout_ms", validator=AtLeast(1000))

# Replication.
_define("min.insync.replicas", T.INT, "Replicas that must hold a write before acks=all is answered.",
        scope=Scope.BOTH, field="min_insync_replicas", validator=AtLeast(1), dynamic=True)
_define("unclean.leader.election.enable", T.BOOLEAN, "Let an out-of-sync replica lead when no in-sync one is "
        "alive (it may lose acknowledged writes).", scope=Scope.BOTH, field="unclean_leader_election", dynamic=True)
_define("replica.lag.time.max.ms", T.LONG, "A follower that has not caught up for this long leaves the ISR.",
        field="replica_lag_time_max_ms", validator=AtLeast(1))
_define("replica.fetch.wait.max.ms", T.INT, "The longest a follower's fetch waits at the leader for new data.",
        field="replica_fetch_wait_max_ms", validator=AtLeast(0))
_define("replica.fetch.max.bytes", T.INT, "Bytes a follower asks for per partition and fetch.",
        field="replica_fetch_max_bytes", validator=AtLeast(0))
_define("replica.fetch.response.max.bytes", T.INT, "Bytes a follower asks for per fetch.",
        field="replica_fetch_response_max_bytes", validator=AtLeast(0))
_define("auto.leader.rebalance.enable", T.BOOLEAN, "Move leadership back to each partition's preferred replica.",
        field="auto_leader_rebalance")
_define("leader.imbalance.check.interval.ms", T.LONG, "How often the controller looks for leaders to move back.",
        field="leader_imbalance_check_interval_ms", validator=AtLeast(1),
        synonyms=(Synonym("leader.imbalance.check.interval.seconds", 1000),))
_define("replica.high.watermark.checkpoint.interval.ms", T.LONG, "How often each high watermark is checkpointed.",
        field="replica_high_watermark_checkpoint_interval_ms", validator=AtLeast(1))
_define("default.replication.factor", T.INT, "Replicas of an auto-created topic's partitions.",
        field="default_replication_factor", validator=AtLeast(1))

# The server.
_define("loop", T.STRING, "The event loop.", field="loop", validator=OneOf(("uvloop", "asyncio")))
_define("sendfile", T.BOOLEAN, "Serve fetched records with sendfile(2); false copies them through Python "
        "(only to measure sendfile against).", field="sendfile")
_define("metrics.listen", T.STRING, "Serve Prometheus metrics on http://HOST:PORT/metrics (unset: off).",
        field="metrics_listen", parse=_address, text=_address_text)
_define("socket.request.max.bytes", T.INT, "The largest request a connection may send; a larger announced "
        "size closes it before the body is read (at least 1 KiB here).", field="max_request_bytes",
        validator=AtLeast(1024))
_define("socket.send.buffer.bytes", T.INT, "SO_SNDBUF of accepted connections (-1: the kernel's autotuning).",
        field="socket_send_buffer_bytes", validator=Between(1024, 1 << 30, also=(-1,)))
_define("socket.receive.buffer.bytes", T.INT, "SO_RCVBUF of accepted connections (-1: the kernel's autotuning).",
        field="socket_receive_buffer_bytes", validator=Between(1024, 1 << 30, also=(-1,)))
_define("fetch.max.bytes", T.INT, "The most bytes one Fetch response carries.", field="fetch_max_bytes",
        validator=AtLeast(1024))
_define("connections.max.idle.ms", T.LONG, "Close a connection idle this long (-1: never).",
        field="connections_max_idle_ms", unlimited=True)
_define("stats.interval.s", T.DOUBLE, "Seconds between the stats log lines (0: none).", field="stats_interval_s",
        validator=AtLeast(0))
_define("shutdown.timeout.s", T.DOUBLE, "Seconds in-flight requests may take to finish at shutdown.",
        field="shutdown_timeout_s", validator=AtLeast(0))

# Topics and their logs: a topic config, the broker's setting its default.
_define("auto.create.topics.enable", T.BOOLEAN, "Create a topic a client asks for that does not exist.",
        field="auto_create_topics")
_define("num.partitions", T.INT, "Partitions of an auto-created topic.", field="num_partitions",
        validator=AtLeast(1))
_define("cleanup.policy", T.LIST, "What happens to old segments: delete (retention deletes them), compact (the "
        "log cleaner keeps each key's latest record; records need a key), or compact,delete (both).",
        scope=Scope.BOTH, broker_name="log.cleanup.policy", field="cleanup_policy", log_field="cleanup_policy",
        validator=ListOf(("delete", "compact")), dynamic=True)
_define("compression.type", T.STRING, "The codec batches are stored with: producer keeps the producer's, any "
        "other recompresses them (broker/record_conversion.py).", scope=Scope.TOPIC, default="producer",
        log_field="compression_type", parse=_compression_type)
_define("retention.ms", T.LONG, "Delete a segment once its newest record is this old (-1: never).",
        scope=Scope.BOTH, broker_name="log.retention.ms", field="retention_ms", log_field="retention_ms",
        validator=AtLeast(-1), unlimited=True, dynamic=True,
        synonyms=(Synonym("log.retention.minutes", 60_000, T.INT), Synonym("log.retention.hours", _HOUR_MS, T.INT)))
_define("retention.bytes", T.LONG, "Delete the oldest segments while a partition holds more (-1: no limit).",
        scope=Scope.BOTH, broker_name="log.retention.bytes", field="retention_bytes", log_field="retention_bytes",
        unlimited=True, dynamic=True)
_define("segment.bytes", T.INT, "A segment's size: the next batch that would not fit rolls a new one; a batch "
        "larger than a segment is refused.", scope=Scope.BOTH, broker_name="log.segment.bytes",
        field="segment_bytes", log_field="segment_bytes", validator=AtLeast(14), dynamic=True)
_define("segment.ms", T.LONG, "Roll a new segment once the active one is this old.", scope=Scope.BOTH,
        broker_name="log.roll.ms", field="segment_ms", log_field="segment_ms", validator=AtLeast(1), dynamic=True,
        synonyms=(Synonym("log.roll.hours", _HOUR_MS, T.INT),))
_define("segment.index.bytes", T.INT, "The largest offset or time index of a segment; a full one rolls the "
        "segment (at least 12 here: one time-index entry).", scope=Scope.BOTH, broker_name="log.index.size.max.bytes",
        field="segment_index_bytes", log_field="segment_index_bytes", validator=AtLeast(12), dynamic=True)
_define("index.interval.bytes", T.INT, "Bytes of batches between two offset-index entries.", scope=Scope.BOTH,
        broker_name="log.index.interval.bytes", field="index_interval_bytes", log_field="index_interval_bytes",
        validator=AtLeast(0), dynamic=True)
_define("flush.messages", T.LONG, "fdatasync a log every this many records (-1: leave it to the page cache).",
        scope=Scope.BOTH, broker_name="log.flush.interval.messages", field="flush_messages",
        log_field="flush_messages", validator=AtLeast(1, also=(-1,)), unlimited=True, dynamic=True)
_define("flush.ms", T.LONG, "fdatasync a log at least this often (-1: leave it to the page cache).",
        scope=Scope.BOTH, broker_name="log.flush.interval.ms", field="flush_ms", log_field="flush_ms",
        validator=AtLeast(0, also=(-1,)), unlimited=True, dynamic=True)
_define("file.delete.delay.ms", T.LONG, "How long a deleted segment's files stay before they are unlinked.",
        scope=Scope.TOPIC, default=60_000, log_field="file_delete_delay_ms", validator=AtLeast(0))
_define("max.message.bytes", T.INT, "The largest record batch a producer may send (at least 64 here).",
        scope=Scope.BOTH, broker_name="message.max.bytes", field="message_max_bytes", log_field="max_message_bytes",
        validator=AtLeast(64), dynamic=True)
_define("message.timestamp.type", T.STRING, "CreateTime keeps the producer's timestamps, LogAppendTime sets "
        "the broker's.", scope=Scope.BOTH, broker_name="log.message.timestamp.type", field="message_timestamp_type",
        log_field="message_timestamp_type", validator=OneOf(("CreateTime", "LogAppendTime")), dynamic=True)
_define("preallocate", T.BOOLEAN, "Give a new segment its whole size in disk blocks at once (default: blocks in "
        "steps ahead of the data).", scope=Scope.BOTH, broker_name="log.preallocate", field="preallocate",
        log_field="preallocate", dynamic=True)
_define("log.flush.mode", T.STRING, "sync: acks=all also waits for the leader's fdatasync, and followers "
        "fdatasync before they report a new log end (group commit).", field="flush_mode", log_field="flush_mode",
        validator=OneOf(("async", "sync")), synonyms=(Synonym("flush_mode"),))
_define("log.prefault.zeros", T.BOOLEAN, "Pre-fault pages by writing zeros before mapping them (false: "
        "MADV_POPULATE_WRITE alone).", field="prefault_zeros", log_field="prefault_zeros")
_define("log.prefault.outrun.pwrite", T.BOOLEAN, "An append past the pre-faulted pages writes them with "
        "pwrite(2) (false: faults them in through the map).", field="outrun_pwrite", log_field="outrun_pwrite")
# Compaction (broker/storage/cleaner.py).
_define("delete.retention.ms", T.LONG, "How long a compacted log keeps a tombstone after the cleaning that first "
        "kept it (the horizon is stored in its batch).", scope=Scope.BOTH,
        broker_name="log.cleaner.delete.retention.ms",
        field="delete_retention_ms", log_field="delete_retention_ms", validator=AtLeast(0), dynamic=True)
_define("min.compaction.lag.ms", T.LONG, "The least age of a segment's newest record before the cleaner may "
        "clean it.", scope=Scope.BOTH, broker_name="log.cleaner.min.compaction.lag.ms", field="min_compaction_lag_ms",
        log_field="min_compaction_lag_ms", validator=AtLeast(0), dynamic=True)
_define("max.compaction.lag.ms", T.LONG, "Clean a log whose first uncleaned segment is this old, whatever its "
        "dirty ratio.", scope=Scope.BOTH, broker_name="log.cleaner.max.compaction.lag.ms",
        field="max_compaction_lag_ms", log_field="max_compaction_lag_ms", validator=AtLeast(1), dynamic=True)
_define("min.cleanable.dirty.ratio", T.DOUBLE, "Clean a log once this share of its cleanable bytes has not been "
        "cleaned yet.", scope=Scope.BOTH, broker_name="log.cleaner.min.cleanable.ratio",
        field="min_cleanable_dirty_ratio", log_field="min_cleanable_dirty_ratio", validator=Between(0, 1),
        dynamic=True)
_define("log.cleaner.enable", T.BOOLEAN, "Run the log cleaner (compacted topics are not cleaned without it).",
        field="log_cleaner_enable")
_define("log.cleaner.threads", T.INT, "Threads cleaning logs (each takes the dirtiest due log).",
        field="log_cleaner_threads", validator=AtLeast(0))
_define("log.cleaner.backoff.ms", T.LONG, "How long a cleaner thread sleeps when no log is due.",
        field="log_cleaner_backoff_ms", validator=AtLeast(0))
_define("log.cleaner.dedupe.buffer.size", T.LONG, "Memory for the cleaners' key maps, shared by the threads "
        "(24 bytes a key; a dirty section with more keys is cleaned in several passes).",
        field="log_cleaner_dedupe_buffer_size", validator=AtLeast(1 << 20))
_define("log.cleaner.io.max.bytes.per.second", T.DOUBLE, "The most bytes a second the cleaners read and write.",
        field="log_cleaner_io_max_bytes_per_second", validator=AtLeast(1))
_define("log.retention.check.interval.ms", T.LONG, "How often retention looks for segments to delete.",
        field="retention_check_interval_ms", validator=AtLeast(1))
# Topic configs accepted and kept, with no effect yet: Kafka's validators, so a value Kafka refuses is refused.
_NO_EFFECT = " Accepted and kept; no effect yet."
_define("message.downconversion.enable", T.BOOLEAN, "Down-convert batches for old clients." + _NO_EFFECT,
        scope=Scope.TOPIC, default=True)
_define("remote.storage.enable", T.BOOLEAN, "Tiered storage (not there yet).", scope=Scope.TOPIC, default=False,
        validator=Supported((False,)))
_define("segment.jitter.ms", T.LONG, "Random jitter taken off segment.ms." + _NO_EFFECT, scope=Scope.TOPIC,
        default=0, validator=AtLeast(0))
_define("message.timestamp.difference.max.ms", T.LONG, "The most a record's timestamp may differ from the "
        "broker's clock." + _NO_EFFECT, scope=Scope.TOPIC, default=_LONG_MAX, validator=AtLeast(0))
_define("message.timestamp.before.max.ms", T.LONG, "The most a record's timestamp may lie in the past."
        + _NO_EFFECT, scope=Scope.TOPIC, default=_LONG_MAX, validator=AtLeast(0))
_define("message.timestamp.after.max.ms", T.LONG, "The most a record's timestamp may lie in the future."
        + _NO_EFFECT, scope=Scope.TOPIC, default=_LONG_MAX, validator=AtLeast(0))
_define("message.format.version", T.STRING, "The record format of old brokers (always v2 here)." + _NO_EFFECT,
        scope=Scope.TOPIC, default="3.0-IV1")
_define("leader.replication.throttled.replicas", T.LIST, "Replicas whose leader side is throttled." + _NO_EFFECT,
        scope=Scope.TOPIC, default=())
_define("follower.replication.throttled.replicas", T.LIST, "Replicas whose follower side is throttled."
        + _NO_EFFECT, scope=Scope.TOPIC, default=())
_define("local.retention.ms", T.LONG, "Tiered storage's local retention." + _NO_EFFECT, scope=Scope.TOPIC,
        default=-2, validator=AtLeast(-2))
_define("local.retention.bytes", T.LONG, "Tiered storage's local retention." + _NO_EFFECT, scope=Scope.TOPIC,
        default=-2, validator=AtLeast(-2))

# Consumer groups.
_define("group.min.session.timeout.ms", T.INT, "The shortest session a consumer may ask for.",
        field="group_min_session_timeout_ms", validator=AtLeast(0))
_define("group.max.session.timeout.ms", T.INT, "The longest session a consumer may ask for.",
        field="group_max_session_timeout_ms", validator=AtLeast(0))
_define("group.initial.rebalance.delay.ms", T.INT, "How long a new group's first members wait for the rest "
        "(default: 0 on a single node, as Kafka's quickstart sets it; Kafka's 3000 in a cluster).",
        field="group_initial_rebalance_delay_ms", validator=AtLeast(0), read=lambda c: c.initial_rebalance_delay)
_define("group.max.size", T.INT, "The most members a group may have (-1: no limit).", field="group_max_size",
        validator=AtLeast(1, also=(-1,)), unlimited=True)
_define("offsets.retention.ms", T.LONG, "Drop a group's committed offsets this long after it empties.",
        field="offsets_retention_ms", validator=AtLeast(1),
        synonyms=(Synonym("offsets.retention.minutes", 60_000, T.INT),))
_define("offsets.retention.check.interval.ms", T.LONG, "How often expired committed offsets are dropped.",
        field="offsets_retention_check_interval_ms", validator=AtLeast(1))
_define("offsets.topic.num.partitions", T.INT, "Partitions of __consumer_offsets (default: 1 on a single node, "
        "which coordinates every group itself; Kafka's 50 in a cluster).", field="offsets_topic_num_partitions",
        validator=AtLeast(1), read=lambda c: c.offsets_partitions)
_define("offsets.topic.segment.bytes", T.INT, "segment.bytes of __consumer_offsets (16 MiB here, ~200,000 "
        "commits; Kafka's 100 MiB): its active segment is what a coordinator replays beyond the compacted keys.",
        field="offsets_topic_segment_bytes", validator=AtLeast(1))
_define("offsets.topic.replication.factor", T.SHORT, "Replicas of __consumer_offsets' partitions (at most the "
        "brokers there are).", field="offsets_topic_replication_factor", validator=AtLeast(1))

# Transactions.
_define("transaction.max.timeout.ms", T.INT, "The longest transaction timeout a producer may ask for "
        "(InitProducerId answers INVALID_TRANSACTION_TIMEOUT above it).", field="transaction_max_timeout_ms",
        validator=AtLeast(1))
_define("transaction.abort.timed.out.transaction.cleanup.interval.ms", T.INT, "How often the transaction "
        "coordinator looks for transactions past their timeout, which it aborts (fencing their producer).",
        field="transaction_abort_timed_out_transaction_cleanup_interval_ms", validator=AtLeast(1))
_define("transactional.id.expiration.ms", T.INT, "How long a transactional id may stay idle (no transaction "
        "open, state unchanged) before its coordinator forgets it, by a tombstone in __transaction_state.",
        field="transactional_id_expiration_ms", validator=AtLeast(1))
_define("transaction.remove.expired.transaction.cleanup.interval.ms", T.INT, "How often the transaction "
        "coordinator looks for transactional ids idle past transactional.id.expiration.ms.",
        field="transaction_remove_expired_transaction_cleanup_interval_ms", validator=AtLeast(1))
_define("producer.id.expiration.ms", T.INT, "How long a partition keeps an idle producer's state (epoch, last "
        "sequences) after its last batch or marker there; one with a transaction open there is kept. A producer "
        "idle longer starts over at any sequence (duplicates of its old batches are no longer recognised).",
        field="producer_id_expiration_ms", validator=AtLeast(1))
_define("producer.id.expiration.check.interval.ms", T.INT, "How often each partition's producers are checked "
        "against producer.id.expiration.ms.", field="producer_id_expiration_check_interval_ms",
        validator=AtLeast(1))
_define("transaction.state.log.num.partitions", T.INT, "Partitions of __transaction_state (default: 1 on a "
        "single node; Kafka's 50 in a cluster).", field="transaction_state_log_num_partitions",
        validator=AtLeast(1), read=lambda c: c.transaction_partitions)
_define("transaction.state.log.replication.factor", T.SHORT, "Replicas of __transaction_state's partitions (at "
        "most the brokers there are).", field="transaction_state_log_replication_factor", validator=AtLeast(1))


# Security: TLS, SASL and ACLs (their entries live with the code that reads them, broker/security/settings.py).
for _key in SECURITY_CONFIGS:
    CONFIGS.add(_key)


# --- the TOML file --------------------------------------------------------------------------------------------------


def _toml_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def _dotted(prefix: str, table: dict):
    """The (dotted name, value) leaves of a TOML table."""
    for key, value in table.items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict):
            yield from _dotted(name, value)
        else:
            yield name, value


def _unquoted_hint(key: str, table: dict, path) -> ConfigError:
    leaves = list(_dotted(key, table))
    shown = "; ".join(f'"{name}" = {_toml_text(value)}' for name, value in leaves[:3])
    known = [name for name, _value in leaves if CONFIGS.broker_key(name) is not None]
    what = f"{leaves[0][0]!r}" if leaves else repr(key)
    return ConfigError(f"{what} in {path} is an unquoted dotted key, which TOML reads as a table [{key}]; quote "
                       f"Kafka's names: {shown}" + ("" if known else " (and no such setting is known)"))


def load_toml(path: str | Path, base: BrokerConfig | None = None) -> BrokerConfig:
    """Apply a TOML file over ``base`` (default: the defaults). Two names of one setting: Kafka's precedence
    (``log.retention.ms`` over ``log.retention.minutes`` over ``log.retention.hours``).

    Raises:
        ConfigError: unreadable file, bad TOML, an unknown key, an unquoted dotted key or a bad value (named).
    """
    base = base or BrokerConfig()
    try:
        with open(path, "rb") as handle:
            table = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from exc
    chosen: dict = {}
    security: dict = {}
    for name, raw in table.items():
        if isinstance(raw, dict):
            raise _unquoted_hint(name, raw, path)
        if is_security_key(name):  # a security setting, or one's listener.name.<listener>. override
            security[name] = raw
            continue
        key = CONFIGS.broker_key(name)
        if key is None:
            raise CONFIGS.unknown(name, str(path))
        rank = CONFIGS.precedence(name)
        if key not in chosen or rank < chosen[key][0]:
            chosen[key] = (rank, name, raw)
    changes: dict = {}
    for key, (_rank, name, raw) in chosen.items():
        try:
            changes.update(key.fields(key.value_of(raw, name)))
        except ConfigError as exc:
            raise ConfigError(f"{exc} (in {path})") from None
    if security:
        # Kept as given: broker.security.settings resolves them per listener, and validate() checks them.
        changes["security"] = SecuritySettings.from_mapping({**dict(base.security.values), **security},
                                                            base.security.add_scram)
    config = dataclasses.replace(base, **changes).with_first_advertised()
    config.validate()
    return config
