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
import tomllib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BrokerConfig", "ConfigError", "parse_host_port", "load_toml"]

_HOUR_MS = 3600_000


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
    node_id: int = 0                                  # node.id
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
    retention_check_interval_ms: int = 300_000        # log.retention.check.interval.ms
    stats_interval_s: float = 60.0                    # period of the stats log line (0 = never)
    shutdown_timeout_s: float = 30.0                  # how long in-flight requests may take on SIGTERM
    # Producer ids handed out by InitProducerId are reserved on disk in blocks of this many, so a restart
    # never reuses an id (Kafka's controller allocates blocks of 1000 the same way).
    producer_id_block_size: int = 1000
    # Consumer groups (read by broker.groups; Kafka's names and defaults).
    group_min_session_timeout_ms: int = 6000              # group.min.session.timeout.ms
    group_max_session_timeout_ms: int = 1800000           # group.max.session.timeout.ms
    group_initial_rebalance_delay_ms: int = 3000          # group.initial.rebalance.delay.ms
    group_max_size: int | None = None                     # group.max.size (-1 = unlimited)
    offsets_retention_ms: int = 7 * 24 * _HOUR_MS         # offsets.retention.minutes
    offsets_retention_check_interval_ms: int = 600000     # offsets.retention.check.interval.ms
    offsets_topic_num_partitions: int = 1                 # offsets.topic.num.partitions

    @property
    def advertised_host(self) -> str:
        return self.advertise_host or self.listen_host

    @property
    def advertised_port(self) -> int:
        return self.advertise_port if self.advertise_port is not None else self.listen_port

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
    for key, value in table.items():
        if key in ("listen", "listeners"):
            changes["listen_host"], changes["listen_port"] = parse_host_port(str(value).split("://")[-1])
            continue
        if key in ("advertise", "advertised.listeners"):
            changes["advertise_host"], changes["advertise_port"] = parse_host_port(str(value).split("://")[-1])
            continue
        if key not in _TOML_KEYS:
            raise ConfigError(f"unknown setting {key!r} in {path}")
        name, convert = _TOML_KEYS[key]
        try:
            changes[name] = convert(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"bad value for {key!r} in {path}: {value!r}") from exc
    config = dataclasses.replace(base, **changes)
    config.validate()
    return config
