"""``copyless serve``: run the broker.

    copyless serve [--data-dir DIR] [--listen HOST:PORT] [--advertise HOST:PORT] [--config FILE.toml]
                   [--loop uvloop|asyncio] [--no-sendfile] [--flush-mode async|sync]
                   [--num-partitions N] [--no-auto-create-topics] [--node-id N] [--log-level LEVEL]
    a cluster member:
    copyless serve --node-id N --metadata etcd://HOST:PORT[,HOST:PORT...][/ROOT]
                   [--listener NAME=HOST:PORT ...] [--advertise NAME=HOST:PORT ...]
                   [--inter-broker-listener NAME] [--cluster-id ID]
    security (TLS, SASL, ACLs: Kafka's settings in the TOML file, see ``broker.security.settings``):
                   [--add-scram 'SCRAM-SHA-512=[name=admin,password=...]']

Flags override the TOML file, which overrides Kafka's defaults (see ``broker.config``). The first line on
stdout is ``copyless listening on HOST:PORT ...`` once the listener is bound (``--listen 127.0.0.1:0``
picks a free port and the line shows which).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path

from copyless.broker.config import BrokerConfig, ConfigError, load_toml, parse_host_port, parse_listener

__all__ = ["add_parsers", "config_from_args", "main_serve"]


def add_parsers(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the broker",
        description="Run a copyless broker speaking the Kafka protocol.",
    )
    parser.add_argument("--data-dir", type=Path, help="log directory (default ./copyless-data)")
    parser.add_argument("--listen", metavar="HOST:PORT", help="address to bind (default 127.0.0.1:9092; port 0 = any free)")
    parser.add_argument("--advertise", metavar="[NAME=]HOST:PORT", action="append",
                        help="address clients are told to connect to; NAME=HOST:PORT for a named listener "
                             "(repeatable)")
    parser.add_argument("--listener", metavar="NAME=HOST:PORT", action="append",
                        help="a named listener to bind (repeatable; Kafka's listeners=NAME://HOST:PORT): clients on "
                             "it are told the addresses advertised for NAME")
    parser.add_argument("--inter-broker-listener", metavar="NAME",
                        help="the listener brokers use to reach each other (default: the first)")
    parser.add_argument("--metadata", metavar="etcd://HOST:PORT[,...][/ROOT]",
                        help="join the cluster kept in etcd (default: a single node with its metadata in the data dir)")
    parser.add_argument("--cluster-id", metavar="ID",
                        help="with --metadata: the cluster id to create, or to require of the existing cluster")
    parser.add_argument("--add-scram", metavar="MECHANISM=[name=USER,password=PASSWORD]", action="append",
                        help="create this SCRAM credential at start-up unless the user has one for the mechanism "
                             "(kafka-storage format --add-scram syntax; repeatable): the first admin")
    parser.add_argument("--metrics-listen", metavar="HOST:PORT",
                        help="serve Prometheus metrics on http://HOST:PORT/metrics")
    parser.add_argument("--config", type=Path, metavar="FILE", help="TOML file with broker settings (Kafka names)")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), help="event loop (default uvloop when installed)")
    parser.add_argument(
        "--no-sendfile", action="store_true",
        help="serve fetched records by copying them through Python (only to measure sendfile against)",
    )
    parser.add_argument("--flush-mode", choices=("async", "sync"), help="sync: acks=all waits for fdatasync")
    parser.add_argument("--num-partitions", type=int, help="partitions of auto-created topics (default 1)")
    parser.add_argument("--no-auto-create-topics", action="store_true", help="disable auto.create.topics.enable")
    parser.add_argument("--node-id", type=int, help="node.id (default 0)")
    parser.add_argument("--check-loop-blocking", action="store_true",
                        help="fail any blocking storage call made on the event loop's thread (a debugging aid)")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    parser.set_defaults(func=main_serve)


def config_from_args(args) -> BrokerConfig:
    """Raises ConfigError."""
    config = load_toml(args.config) if args.config else BrokerConfig()
    changes: dict = {}
    if args.data_dir is not None:
        changes["data_dir"] = args.data_dir
    if args.listen:
        changes["listen_host"], changes["listen_port"] = parse_host_port(args.listen)
    named_advertised = []
    for item in args.advertise or ():
        if "=" in item or "://" in item:
            named_advertised.append(parse_listener(item))
        else:
            changes["advertise_host"], changes["advertise_port"] = parse_host_port(item)
    if args.listener:
        listeners = tuple(parse_listener(item) for item in args.listener)
        changes["listeners"] = listeners
        changes["listen_host"], changes["listen_port"] = listeners[0][1], listeners[0][2]
    if named_advertised:
        changes["advertised_listeners"] = tuple(named_advertised)
    if args.inter_broker_listener:
        changes["inter_broker_listener"] = args.inter_broker_listener
    if args.metadata:
        changes["metadata"] = args.metadata
    if args.cluster_id:
        changes["cluster_id"] = args.cluster_id
    if args.metrics_listen:
        changes["metrics_listen"] = parse_host_port(args.metrics_listen)
    if args.loop:
        changes["loop"] = args.loop
    if args.no_sendfile:
        changes["sendfile"] = False
    if args.flush_mode:
        changes["flush_mode"] = args.flush_mode
    if args.num_partitions is not None:
        changes["num_partitions"] = args.num_partitions
    if args.no_auto_create_topics:
        changes["auto_create_topics"] = False
    if args.node_id is not None:
        changes["node_id"] = args.node_id
    if args.check_loop_blocking:
        changes["check_loop_blocking"] = True
    if args.add_scram:
        changes["security"] = dataclasses.replace(config.security,
                                                  add_scram=config.security.add_scram + tuple(args.add_scram))
    config = dataclasses.replace(config, **changes)
    first = config.listener_specs()[0][0]
    for name, host, port in config.advertised_listeners:
        if name == first:
            config = dataclasses.replace(config, advertise_host=host, advertise_port=port)
    config.validate()
    return config


def main_serve(args) -> int:
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"copyless serve: {exc}", file=sys.stderr)
        return 2
    from copyless.broker.server.app import run

    return run(config)
