"""Kafka's ``kafka-topics.sh`` arguments, carried out by ``copyless topics``: what librdkafka's tests run.

librdkafka's tests (0045, 0052, 0077) shell out to ``$KAFKA_PATH/bin/kafka-topics.sh --bootstrap-server
BROKERS`` with ``--create --topic T --partitions N --replication-factor R --config K=V``, ``--alter --topic T
--partitions N`` and ``--delete --topic T``. This maps each onto the CLI (``topics create``,
``add-partitions --total``, ``delete``, plus ``--list`` and ``--describe``); anything else exits 2 naming the
arguments, as Kafka's tool does for options it does not know.
"""

from __future__ import annotations

import argparse
import sys

from copyless.broker import cli


def translate(argv: list[str]) -> list[str]:
    """kafka-topics.sh arguments -> ``copyless`` arguments. Raises SystemExit(2) on what it cannot map."""
    parser = argparse.ArgumentParser(prog="kafka-topics.sh")
    parser.add_argument("--bootstrap-server", required=True)
    action = parser.add_mutually_exclusive_group(required=True)
    for name in ("create", "alter", "delete", "list", "describe"):
        action.add_argument(f"--{name}", action="store_true")
    parser.add_argument("--topic")
    parser.add_argument("--partitions", type=int)
    parser.add_argument("--replication-factor", type=int)
    parser.add_argument("--config", action="append", default=[])
    parser.add_argument("--if-not-exists", action="store_true")
    parser.add_argument("--if-exists", action="store_true")
    args = parser.parse_args(argv)
    bootstrap = ["--bootstrap", args.bootstrap_server]
    if args.list:
        return ["topics", "list", *bootstrap]
    if not args.topic:
        parser.error("--topic is required")
    if args.create:
        command = ["topics", "create", *bootstrap, args.topic]
        if args.partitions is not None:
            command += ["--partitions", str(args.partitions)]
        if args.replication_factor is not None:
            command += ["--replication-factor", str(args.replication_factor)]
        for config in args.config:
            command += ["--config", config]
        return command + (["--if-not-exists"] if args.if_not_exists else [])
    if args.alter:
        if args.partitions is None or args.config:
            parser.error("--alter takes --partitions only (Kafka 3 moved config changes to kafka-configs.sh)")
        return ["topics", "add-partitions", *bootstrap, args.topic, "--total", str(args.partitions)]
    if args.delete:
        return ["topics", "delete", *bootstrap, args.topic] + (["--if-exists"] if args.if_exists else [])
    return ["topics", "describe", *bootstrap, args.topic]


if __name__ == "__main__":
    sys.exit(cli.main(translate(sys.argv[1:])))
