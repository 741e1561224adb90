"""Broker configuration: one frozen dataclass, every limit named with its unit, defaults mirroring Kafka's.

Sources of settings, later ones winning: the defaults below, a TOML file (``--config``), command-line flags.
The TOML file uses Kafka's dotted property names where one exists, so an operator's habits carry over::

    listen = "0.0.0.0:9092"
    advertise = "broker1.example.com:9092"
    data_dir = "/var/lib/copyless"
    loop = "uvloop"                 # or "asyncio"
    sendfile = true
    "node.id" = 0
    "auto.create.topics.enable" = true
    "num.partitions" = 1
    "socket.request.max.bytes" = 104857600
    "fetch.max.bytes" = 57671680
    "log.retention.ms" = 604800000   # or "log.retention.hours" = 168
    "log.retention.bytes" = -1
    "log.segment.bytes" = 1073741824
    "log.flush.mode" = "async"       # "sync": acks=all waits for fdatasync (group commit)
    "message.max.bytes" = 1048588

Unknown keys are refused with the key's name, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from copyless.broker.security.settings import SecuritySettings, SettingsError, is_security_key

__all__ = ["BrokerConfig", "ConfigError", "parse_host_port", "parse_listener", "parse_listener_list", "load_toml"]

_HOUR_MS = 3600_000
_LISTENER_NAME = re.compile(r"^[A-Za-z0-9_]+$")


class ConfigError(ValueError):
    """A setting is malformed or unknown; the message names it."""


@dataclass(frozen=True)
class BrokerConfig:
    """Everything the broker reads at startup. Kafka property names are in the comments."""

    data_dir: Path = Path("./copyless-data")
    listen_host: str = "127.0.0.1"
    listen_port: int = 9092
    # advertised.listeners: what Metadata tells clients; defaults to the bound address.
    advertise_host: str | None = None
    advertise_port: int | None = None
    # listeners / advertised.listeners with names (Kafka's ``NAME://HOST:PORT``): ((name, host, port), ...).
    # Empty: one listener, PLAINTEXT, on listen_host:listen_port advertised as advertise_host:advertise_port.
    listeners: tuple[tuple[str, str, int], ...] = ()
    advertised_listeners: tuple[tuple[str, str, int], ...] = ()
    inter_broker_listener: str | None = None          # inter.broker.listener.name (default: the first)
    node_id: int = 0                                  # node.id
    # Cluster metadata: None = the embedded single node (topics.json); "etcd://h:p[,h:p...][/chroot]" joins
    # the cluster kept in etcd.
    metadata: str | None = None                       # metadata
    cluster_id: str | None = None                     # cluster.id (etcd: must match the cluster's, if set)
    # How long a broker's etcd lease lives without a keepalive: a dead broker's partitions move after about
    # this long. etcd grants no lease under 2 s; 2 s keeps a leader's failure under Kafka's 9 s default
    # (broker.session.timeout.ms) by design, and keepalives every third of it tolerate a 1.3 s stall.
    broker_session_timeout_ms: int = 2000             # broker.session.timeout.ms
    min_insync_replicas: int = 1                      # min.insync.replicas (topic default)
    replica_lag_time_max_ms: int = 30_000             # replica.lag.time.max.ms
    unclean_leader_election: bool = False             # unclean.leader.election.enable (topic default)
    replica_fetch_wait_max_ms: int = 500              # replica.fetch.wait.max.ms
    replica_fetch_max_bytes: int = 1 << 20            # replica.fetch.max.bytes (per partition)
    replica_fetch_response_max_bytes: int = 10 << 20  # replica.fetch.response.max.bytes
    auto_leader_rebalance: bool = True                # auto.leader.rebalance.enable
    leader_imbalance_check_interval_ms: int = 30_000  # leader.imbalance.check.interval.seconds (Kafka: 300 s)
    replica_high_watermark_checkpoint_interval_ms: int = 5000  # replica.high.watermark.checkpoint.interval.ms
    metrics_listen: tuple[str, int] | None = None     # metrics.listen: Prometheus /metrics (None = off)
    loop: str = "uvloop"                              # "uvloop" | "asyncio"
    sendfile: bool = True                             # False = the copying comparison path
    auto_create_topics: bool = True                   # auto.create.topics.enable
    num_partitions: int = 1                           # num.partitions
    default_replication_factor: int = 1               # default.replication.factor (single node: 1)
    max_request_bytes: int = 100 * 1024 * 1024        # socket.request.max.bytes
    # SO_SNDBUF of every accepted connection (-1: the kernel's autotuning). Kafka sets 100 KiB. With
    # autotuning a fetch's sendfile queues megabytes at once that the consumer's window cannot take yet;
    # the consumer's own ACKs then transmit them from its softirq, on its CPU: librdkafka read 10 KB
    # records at 0.92 GB/s with 1.9 s of its own kernel CPU per 3.2 GB, against 1.3-1.4 GB/s and 1.3 s at
    # 256 KiB (the kernel doubles it; 64 KiB was slower again, 1 MiB as slow as autotuning).
    socket_send_buffer_bytes: int = 256 * 1024        # socket.send.buffer.bytes
    socket_receive_buffer_bytes: int = -1             # socket.receive.buffer.bytes (-1: autotuning)
    fetch_max_bytes: int = 55 * 1024 * 1024           # fetch.max.bytes (caps a Fetch's max_bytes)
    connections_max_idle_ms: int | None = 600_000     # connections.max.idle.ms (None = never close)
    message_max_bytes: int = 1048588                  # message.max.bytes (topic max.message.bytes default)
    retention_ms: int | None = 7 * 24 * _HOUR_MS      # log.retention.ms (None = forever)
    retention_bytes: int | None = None                # log.retention.bytes (None = unlimited)
    segment_bytes: int = 1 << 30                      # log.segment.bytes
    segment_ms: int | None = 7 * 24 * _HOUR_MS        # log.roll.ms
    segment_index_bytes: int = 10 * 1024 * 1024       # log.index.size.max.bytes
    index_interval_bytes: int = 4096                  # log.index.interval.bytes
    flush_messages: int | None = None                 # log.flush.interval.messages
    flush_ms: int | None = None                       # log.flush.interval.ms
    flush_mode: str = "async"                         # "async" | "sync" (acks=all waits for fdatasync)
    message_timestamp_type: str = "CreateTime"        # log.message.timestamp.type
    preallocate: bool = False                         # log.preallocate (true: whole segments up front)
    prefault_zeros: bool = True                       # log.prefault.zeros (LogConfig.prefault_zeros)
    outrun_pwrite: bool = True                        # log.prefault.outrun.pwrite (LogConfig.outrun_pwrite)
    retention_check_interval_ms: int = 300_000        # log.retention.check.interval.ms
    stats_interval_s: float = 60.0                    # period of the stats log line (0 = never)
    shutdown_timeout_s: float = 30.0                  # how long in-flight requests may take on SIGTERM
    # Blocking storage calls on the event loop's thread raise (storage/blocking.py): a debugging aid, on
    # under the test suite (copyless serve --check-loop-blocking).
    check_loop_blocking: bool = False
    # Producer ids handed out by InitProducerId are reserved on disk in blocks of this many, so a restart
    # never reuses an id (Kafka's controller allocates blocks of 1000 the same way).
    producer_id_block_size: int = 1000
    # Consumer groups (read by broker.groups; Kafka's names and defaults).
    group_min_session_timeout_ms: int = 6000              # group.min.session.timeout.ms
    group_max_session_timeout_ms: int = 1800000           # group.max.session.timeout.ms
    # group.initial.rebalance.delay.ms: Kafka's default is 3 s (a group's first members wait for the rest to
    # join); its quickstart sets 0 for development, as the embedded single node does here. None: the mode's
    # default (0 single node, 3000 in a cluster; see ``initial_rebalance_delay``).
    group_initial_rebalance_delay_ms: int | None = None
    group_max_size: int | None = None                     # group.max.size (-1 = unlimited)
    offsets_retention_ms: int = 7 * 24 * _HOUR_MS         # offsets.retention.minutes
    offsets_retention_check_interval_ms: int = 600000     # offsets.retention.check.interval.ms
    # offsets.topic.num.partitions: Kafka's default is 50; a single node serves every group itself, so the
    # embedded default is 1 (one log instead of 50). In a cluster the groups spread over the partitions'
    # leaders, and the default is Kafka's (None: the mode's default, see ``offsets_partitions``).
    offsets_topic_num_partitions: int | None = None
    offsets_topic_replication_factor: int = 3             # offsets.topic.replication.factor
    # TLS, SASL and ACL settings by Kafka's names, per listener (broker.security.settings).
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
            return self.advertise_host or bound_host, self.advertise_port if self.advertise_port is not None else bound_port
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
        """``offsets.topic.num.partitions``, or its default for this mode (see the field's comment)."""
        if self.offsets_topic_num_partitions is not None:
            return self.offsets_topic_num_partitions
        return 50 if self.clustered else 1

    def with_bound_port(self, port: int) -> "BrokerConfig":
        """The same settings once the listener is bound (port 0 resolves to a real port)."""
        return dataclasses.replace(self, listen_port=port)

    def log_config(self):
        """The broker-wide defaults of every partition log (``LogConfig``), from the ``log.*`` settings."""
        from copyless.broker.storage.config import LogConfig

        return LogConfig(
            segment_bytes=self.segment_bytes,
            index_interval_bytes=self.index_interval_bytes,
            segment_ms=self.segment_ms,
            segment_index_bytes=self.segment_index_bytes,
            flush_messages=self.flush_messages,
            flush_ms=self.flush_ms,
            flush_mode=self.flush_mode,
            retention_ms=self.retention_ms,
            retention_bytes=self.retention_bytes,
            max_message_bytes=self.message_max_bytes,
            message_timestamp_type=self.message_timestamp_type,
            preallocate=self.preallocate,
            prefault_zeros=self.prefault_zeros,
            outrun_pwrite=self.outrun_pwrite,
        )

    def validate(self) -> None:
        """Raises ConfigError naming the first bad setting."""
        if self.loop not in ("uvloop", "asyncio"):
            raise ConfigError(f"loop must be 'uvloop' or 'asyncio', not {self.loop!r}")
        if self.flush_mode not in ("async", "sync"):
            raise ConfigError(f"log.flush.mode must be 'async' or 'sync', not {self.flush_mode!r}")
        if self.message_timestamp_type not in ("CreateTime", "LogAppendTime"):
            raise ConfigError("log.message.timestamp.type must be CreateTime or LogAppendTime")
        if self.num_partitions < 1:
            raise ConfigError("num.partitions must be >= 1")
        if not 0 <= self.listen_port <= 65535:
            raise ConfigError(f"listen port {self.listen_port} out of range")
        if self.max_request_bytes < 1024:
            raise ConfigError("socket.request.max.bytes must be >= 1024")
        for key, value in (("socket.send.buffer.bytes", self.socket_send_buffer_bytes),
                           ("socket.receive.buffer.bytes", self.socket_receive_buffer_bytes)):
            if value != -1 and not 1024 <= value <= 1 << 30:
                raise ConfigError(f"{key} must be -1 (the kernel's autotuning) or 1024..1 GiB, not {value}")
        if self.message_max_bytes < 64:
            raise ConfigError("message.max.bytes must be >= 64")
        if self.segment_bytes < 1024:
            raise ConfigError("log.segment.bytes must be >= 1024")
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
        if self.metadata is not None and not self.metadata.startswith("etcd://"):
            raise ConfigError(f"metadata must be etcd://HOST:PORT[,HOST:PORT...][/CHROOT], not {self.metadata!r}")
        if self.min_insync_replicas < 1:
            raise ConfigError("min.insync.replicas must be >= 1")
        if self.broker_session_timeout_ms < 1000:
            raise ConfigError("broker.session.timeout.ms must be >= 1000")
        if self.offsets_partitions < 1 or self.offsets_topic_replication_factor < 1:
            raise ConfigError("offsets.topic.num.partitions and offsets.topic.replication.factor must be >= 1")
        try:
            self.security.validate(names)
        except SettingsError as exc:
            raise ConfigError(str(exc)) from None


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
    items = value if isinstance(value, list) else str(value).split(",")
    return tuple(parse_listener(str(item)) for item in items if str(item).strip())


def _optional_ms(value) -> int | None:
    """Kafka writes 'unlimited' as -1."""
    value = int(value)
    return None if value < 0 else value


# TOML key -> (BrokerConfig field, converter). Kafka's names plus a few of copyless's own.
_TOML_KEYS = {
    "data_dir": ("data_dir", Path),
    "log.dirs": ("data_dir", Path),
    "loop": ("loop", str),
    "sendfile": ("sendfile", bool),
    "node.id": ("node_id", int),
    "broker.id": ("node_id", int),
    "auto.create.topics.enable": ("auto_create_topics", bool),
    "num.partitions": ("num_partitions", int),
    "default.replication.factor": ("default_replication_factor", int),
    "socket.request.max.bytes": ("max_request_bytes", int),
    "socket.send.buffer.bytes": ("socket_send_buffer_bytes", int),
    "socket.receive.buffer.bytes": ("socket_receive_buffer_bytes", int),
    "fetch.max.bytes": ("fetch_max_bytes", int),
    "connections.max.idle.ms": ("connections_max_idle_ms", _optional_ms),
    "message.max.bytes": ("message_max_bytes", int),
    "log.retention.ms": ("retention_ms", _optional_ms),
    "log.retention.minutes": ("retention_ms", lambda v: _optional_ms(int(v) * 60_000)),
    "log.retention.hours": ("retention_ms", lambda v: _optional_ms(int(v) * _HOUR_MS)),
    "log.retention.bytes": ("retention_bytes", _optional_ms),
    "log.segment.bytes": ("segment_bytes", int),
    "log.roll.ms": ("segment_ms", _optional_ms),
    "log.roll.hours": ("segment_ms", lambda v: _optional_ms(int(v) * _HOUR_MS)),
    "log.index.interval.bytes": ("index_interval_bytes", int),
    "log.index.size.max.bytes": ("segment_index_bytes", int),
    "log.flush.interval.messages": ("flush_messages", _optional_ms),
    "log.flush.interval.ms": ("flush_ms", _optional_ms),
    "log.flush.mode": ("flush_mode", str),
    "flush_mode": ("flush_mode", str),
    "log.message.timestamp.type": ("message_timestamp_type", str),
    "log.preallocate": ("preallocate", bool),
    "log.prefault.zeros": ("prefault_zeros", bool),
    "log.prefault.outrun.pwrite": ("outrun_pwrite", bool),
    "log.retention.check.interval.ms": ("retention_check_interval_ms", int),
    "stats.interval.s": ("stats_interval_s", float),
    "shutdown.timeout.s": ("shutdown_timeout_s", float),
    "group.min.session.timeout.ms": ("group_min_session_timeout_ms", int),
    "group.max.session.timeout.ms": ("group_max_session_timeout_ms", int),
    "group.initial.rebalance.delay.ms": ("group_initial_rebalance_delay_ms", int),
    "group.max.size": ("group_max_size", _optional_ms),
    "offsets.retention.minutes": ("offsets_retention_ms", lambda v: int(v) * 60_000),
    "offsets.retention.ms": ("offsets_retention_ms", int),
    "offsets.retention.check.interval.ms": ("offsets_retention_check_interval_ms", int),
    "offsets.topic.num.partitions": ("offsets_topic_num_partitions", int),
    "offsets.topic.replication.factor": ("offsets_topic_replication_factor", int),
    "inter.broker.listener.name": ("inter_broker_listener", str),
    "metadata": ("metadata", str),
    "cluster.id": ("cluster_id", str),
    "broker.session.timeout.ms": ("broker_session_timeout_ms", int),
    "min.insync.replicas": ("min_insync_replicas", int),
    "replica.lag.time.max.ms": ("replica_lag_time_max_ms", int),
    "unclean.leader.election.enable": ("unclean_leader_election", bool),
    "replica.fetch.wait.max.ms": ("replica_fetch_wait_max_ms", int),
    "replica.fetch.max.bytes": ("replica_fetch_max_bytes", int),
    "replica.fetch.response.max.bytes": ("replica_fetch_response_max_bytes", int),
    "auto.leader.rebalance.enable": ("auto_leader_rebalance", bool),
    "leader.imbalance.check.interval.seconds": ("leader_imbalance_check_interval_ms", lambda v: int(v) * 1000),
    "leader.imbalance.check.interval.ms": ("leader_imbalance_check_interval_ms", int),
    "replica.high.watermark.checkpoint.interval.ms": ("replica_high_watermark_checkpoint_interval_ms", int),
    "metrics.listen": ("metrics_listen", lambda v: parse_host_port(str(v))),
}


def load_toml(path: str | Path, base: BrokerConfig | None = None) -> BrokerConfig:
    """Apply a TOML file over ``base`` (default: Kafka's defaults).

    Raises:
        ConfigError: unreadable file, bad TOML, an unknown key or a bad value (named in the message).
    """
    base = base or BrokerConfig()
    try:
        with open(path, "rb") as handle:
            table = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from exc
    changes: dict = {}
    security: dict = {}
    for key, value in table.items():
        if is_security_key(key):
            security[key] = value
            continue
        if key == "listen":
            changes["listen_host"], changes["listen_port"] = parse_host_port(str(value).split("://")[-1])
            continue
        if key == "advertise":
            changes["advertise_host"], changes["advertise_port"] = parse_host_port(str(value).split("://")[-1])
            continue
        if key in ("listeners", "advertised.listeners"):
            try:
                parsed = parse_listener_list(value)
            except ConfigError as exc:
                raise ConfigError(f"bad value for {key!r} in {path}: {exc}") from None
            changes["listeners" if key == "listeners" else "advertised_listeners"] = parsed
            if parsed and key == "listeners":
                # The first listener is also the one-listener settings (the startup line, old readers).
                changes["listen_host"], changes["listen_port"] = parsed[0][1], parsed[0][2]
            continue
        if key not in _TOML_KEYS:
            raise ConfigError(f"unknown setting {key!r} in {path}")
        name, convert = _TOML_KEYS[key]
        try:
            changes[name] = convert(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"bad value for {key!r} in {path}: {value!r}") from exc
    if security:
        changes["security"] = SecuritySettings.from_mapping({**dict(base.security.values), **security},
                                                            base.security.add_scram)
    config = dataclasses.replace(base, **changes)
    first = config.listener_specs()[0][0]
    for name, host, port in config.advertised_listeners:
        if name == first:
            config = dataclasses.replace(config, advertise_host=host, advertise_port=port)
    config.validate()
    return config
