"""What every ``copyless`` client command shares: ``-b/--bootstrap``, ``--json``, running a coroutine under
uvloop, the error style, progress and summaries, and the argument types (counts, sizes, times).

Errors: one line on stderr, ``copyless COMMAND: error: NAME: what`` for a broker's error code
(``UNKNOWN_TOPIC_OR_PARTITION: topic 'x'``), ``copyless COMMAND: error: what`` otherwise, exit status 1;
a bad argument exits 2 (argparse's usage error). Ctrl-C exits 130 (128 + SIGINT, as the shell and Kafka's
own tools report it), after ``produce`` and ``consume`` print their summary; a closed stdout pipe
(``| head``) exits 0. With ``--json`` the error is also printed as ``{"error": NAME, "code": N, "message":
...}`` on stdout, so scripts never parse stderr.
Progress: a redrawn line on stderr when stderr is a terminal; otherwise nothing until a one-line summary
at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["DEFAULT_BOOTSTRAP", "EXIT_INTERRUPTED", "add_common", "run", "Progress", "summary", "plural",
           "count_arg", "parse_time_ms", "client_security"]

DEFAULT_BOOTSTRAP = os.environ.get("COPYLESS_BOOTSTRAP", "127.0.0.1:9092")
EXIT_INTERRUPTED = 130  # 128 + SIGINT


def count_arg(text: str) -> int:
    """An argparse type: a whole number, 0 or more (``--count``, ``--size``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def parse_time_ms(text: str, option: str = "--from-time") -> int:
    """Milliseconds since the epoch, or an ISO-8601 time (``2026-11-24T10:00:00Z``; without a zone: local
    time, as date(1) reads it) -> milliseconds since the epoch. Raises ValueError naming ``option``."""
    if text.lstrip("-").isdigit():
        return int(text)
    import datetime

    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"{option} expects milliseconds since the epoch or an ISO-8601 time, got {text!r}") from exc
    if moment.tzinfo is None:
        moment = moment.astimezone()
    return int(moment.timestamp() * 1000)


def plural(count: int, noun: str) -> str:
    """``1 record``, ``2 records``, ``0 records``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def add_common(parser: argparse.ArgumentParser, *, json_help: str = "machine-readable output (JSON)") -> None:
    """``-b/--bootstrap`` and ``--json``, the same on every command."""
    parser.add_argument(
        "-b", "--bootstrap", default=DEFAULT_BOOTSTRAP, metavar="HOST:PORT[,...]",
        help=f"brokers to start from, tried in turn (default {DEFAULT_BOOTSTRAP}, or $COPYLESS_BOOTSTRAP)",
    )
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.add_argument("-F", "--properties", metavar="FILE",
                        help="client properties, as kcat -F reads them (security.protocol, sasl.mechanisms, "
                             "sasl.username, sasl.password, ssl.ca.location, ssl.certificate.location, ...)")
    parser.add_argument("-X", dest="properties_set", action="append", default=[], metavar="KEY=VALUE",
                        help="one client property over the -F file (repeatable), e.g. -X security.protocol=SSL")


def client_security(args):
    """The ``ClientSecurity`` of ``-F`` and ``-X``. Raises ValueError (a malformed -X), OSError (a file)."""
    from copyless.client.security import PLAINTEXT, ClientSecurity, read_properties

    properties = read_properties(args.properties) if getattr(args, "properties", None) else {}
    for item in getattr(args, "properties_set", None) or ():
        key, separator, value = item.partition("=")
        if not separator or not key.strip():
            raise ValueError(f"-X expects KEY=VALUE, got {item.split('=')[0]!r}")
        properties[key.strip()] = value
    if not properties:
        return PLAINTEXT
    return ClientSecurity.from_properties(properties)


def run(args, coroutine) -> int:
    """Run ``coroutine`` under uvloop and turn its failure into the error style above."""
    try:
        import uvloop

        runner: Callable[..., Any] = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    command = getattr(args, "command_name", "copyless")
    try:
        return runner(coroutine)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `copyless consume ... | head`: the reader left; that is not an error
        try:
            # kept open: the interpreter flushes and closes sys.stdout at exit
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        except OSError:
            pass
        return 0
    except Exception as exc:
        from copyless.client.errors import ClientError, KafkaError

        if not isinstance(exc, (ClientError, OSError, ValueError, TimeoutError)):
            raise
        if isinstance(exc, KafkaError):
            message = f"{exc.name}: {exc.context}" if exc.context else exc.name
            document = {"error": exc.name, "code": exc.code, "message": exc.context}
        else:
            message = str(exc) or type(exc).__name__
            document = {"error": type(exc).__name__, "code": None, "message": message}
        if getattr(args, "json", False):
            print(json.dumps(document), flush=True)
        print(f"{command}: error: {message}", file=sys.stderr)
        return 1


class Progress:
    """A one-line progress display on stderr, only when stderr is a terminal (redrawn at most 10x/s)."""

    def __init__(self, total: int | None, unit: str) -> None:
        self.total = total
        self.unit = unit
        self.enabled = sys.stderr.isatty()
        self.count = 0
        self.started = time.perf_counter()
        self._drawn = 0.0

    def advance(self, n: int) -> None:
        self.count += n
        if self.enabled:
            now = time.perf_counter()
            if now - self._drawn >= 0.1:
                self._drawn = now
                self._draw(now)

    def _draw(self, now: float) -> None:
        rate = self.count / max(now - self.started, 1e-9)
        if self.total:
            fraction = min(self.count / self.total, 1.0)
            bar = "#" * int(fraction * 30)
            text = f"[{bar:<30}] {self.count}/{self.total} {self.unit} {rate:,.0f}/s"
        else:
            text = f"{self.count} {self.unit} {rate:,.0f}/s"
        sys.stderr.write("\r" + text)
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.perf_counter())
            sys.stderr.write("\n")
            sys.stderr.flush()


def summary(records: int, total_bytes: int, seconds: float) -> dict:
    """The ``--json`` summary: records, bytes (key + value), seconds, records/s, MB/s (10**6 bytes)."""
    seconds = max(seconds, 1e-9)
    return {
        "records": records,
        "bytes": total_bytes,
        "seconds": round(seconds, 6),
        "records_per_s": round(records / seconds, 1),
        "mb_per_s": round(total_bytes / seconds / 1e6, 3),
    }


def print_summary(args, verb: str, document: dict, *, json_on_stdout: bool) -> None:
    """The end of a produce or consume: the JSON summary on stdout, or one line on stderr when stderr is
    not a terminal (a terminal has seen the progress line)."""
    if json_on_stdout:
        sys.stdout.flush()
        print(json.dumps(document), flush=True)
    elif not sys.stderr.isatty():
        print(f"{getattr(args, 'command_name', 'copyless')}: {verb} {plural(document['records'], 'record')} "
              f"({plural(document['bytes'], 'byte')}) in {document['seconds']:.3f} s", file=sys.stderr)
