"""Broker settings: TOML with Kafka's names, flags on top, clear errors for typos."""

from __future__ import annotations

import argparse

import pytest

from copyless.broker.config import BrokerConfig, ConfigError, load_toml, parse_host_port
from copyless.broker.server.cli import add_parsers, config_from_args


def parse(argv):
    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers())
    return parser.parse_args(argv)


def test_defaults_mirror_kafka():
    config = BrokerConfig()
    assert config.auto_create_topics and config.num_partitions == 1
    assert config.message_max_bytes == 1048588
    assert config.retention_ms == 7 * 24 * 3600 * 1000
    assert config.max_request_bytes == 100 * 1024 * 1024


@pytest.mark.parametrize("text,expected", [("127.0.0.1:0", ("127.0.0.1", 0)), (":9092", ("127.0.0.1", 9092)),
                                           ("[::1]:19092", ("::1", 19092)), ("host.example:1", ("host.example", 1))])
def test_host_port(text, expected):
    assert parse_host_port(text) == expected


@pytest.mark.parametrize("text", ["nohost", "h:port", "h:70000"])
def test_bad_host_port(text):
    with pytest.raises(ConfigError):
        parse_host_port(text)


def test_toml_then_flags(tmp_path):
    path = tmp_path / "broker.toml"
    path.write_text(
        'listen = "127.0.0.1:19999"\n"log.retention.hours" = 1\n"num.partitions" = 3\n"log.flush.mode" = "sync"\n'
        '"group.initial.rebalance.delay.ms" = 0\n"log.retention.bytes" = -1\n'
    )
    config = config_from_args(parse(["serve", "--config", str(path), "--listen", "127.0.0.1:0", "--no-sendfile",
                                     "--data-dir", str(tmp_path / "d")]))
    assert config.listen_port == 0 and config.retention_ms == 3600_000 and config.num_partitions == 3
    assert config.flush_mode == "sync" and not config.sendfile and config.retention_bytes is None
    assert config.group_initial_rebalance_delay_ms == 0


def test_unknown_toml_key_is_named(tmp_path):
    path = tmp_path / "broker.toml"
    path.write_text('"log.retention.hourz" = 1\n')
    with pytest.raises(ConfigError, match="log.retention.hourz"):
        load_toml(path)


def test_bad_values_rejected(tmp_path):
    path = tmp_path / "broker.toml"
    path.write_text('loop = "trio"\n')
    with pytest.raises(ConfigError, match="loop"):
        load_toml(path)
    path.write_text("not toml = = =\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(path)


def test_kafka_listener_syntax(tmp_path):
    path = tmp_path / "broker.toml"
    path.write_text('listeners = "PLAINTEXT://0.0.0.0:19093"\n"advertised.listeners" = "PLAINTEXT://kafka.example:9093"\n')
    config = load_toml(path)
    assert (config.listen_host, config.listen_port) == ("0.0.0.0", 19093)
    assert (config.advertised_host, config.advertised_port) == ("kafka.example", 9093)


def test_socket_buffer_settings(tmp_path):
    path = tmp_path / "broker.toml"
    path.write_text('"socket.send.buffer.bytes" = -1\n"socket.receive.buffer.bytes" = 102400\n')
    config = load_toml(path)
    assert (config.socket_send_buffer_bytes, config.socket_receive_buffer_bytes) == (-1, 102400)
    for bad in (0, 100, -2):
        path.write_text(f'"socket.send.buffer.bytes" = {bad}\n')
        with pytest.raises(ConfigError, match="socket.send.buffer.bytes"):
            load_toml(path)
