"""The ``copyless`` console script: one entry point whose subcommands live with the code they drive.

Each area registers its own subcommands through an ``add_parsers(subparsers)`` function and sets
``func`` on its parsers; modules are imported lazily so ``copyless produce`` never loads the broker.

    copyless serve ...                                 broker.server.cli
    copyless configs ...                               broker.config_cli (every setting)
    copyless inspect ...                               broker.inspect_log
    copyless produce|consume ...                       client.cli
    copyless topics|groups|cluster ...                 client.admin_cli (registered by client.cli)
"""

from __future__ import annotations

import argparse
import importlib
import sys

# A module that is not there yet is skipped, so a partial checkout still runs.
_COMMAND_MODULES = (
    "copyless.broker.server.cli",
    "copyless.broker.config_cli",
    "copyless.broker.inspect_log",
    "copyless.client.cli",
)


def build_parser() -> argparse.ArgumentParser:
    from copyless import __version__

    parser = argparse.ArgumentParser(prog="copyless",
                                     description="copyless: a Kafka-protocol broker (serve) and its client.")
    parser.add_argument("-V", "--version", action="version", version=f"copyless {__version__}",
                        help="print the version and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue
            raise
        module.add_parsers(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
