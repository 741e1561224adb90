"""``copyless produce | consume | topics``: a kcat-like command line over the copyless client.

Registered into the ``copyless`` console script by ``add_parsers(subparsers)`` (see ``broker/cli.py``).

    copyless produce TOPIC --bootstrap HOST:PORT            lines from stdin become records (-K: key delimiter)
    copyless produce TOPIC --count N --size BYTES           N synthetic records of BYTES each
    copyless consume TOPIC --bootstrap HOST:PORT [--group G] [--from-beginning] [--count N] [--exit]
    copyless topics list|create|delete|describe ...

With ``--json``, produce and consume end with one JSON line on stdout:
``{"records": N, "bytes": B, "seconds": T, "records_per_s": R, "mb_per_s": M}`` (bytes = key + value bytes;
MB = 10**6 bytes). A progress line is drawn on stderr when stderr is a terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time

__all__ = ["add_parsers", "main"]

DEFAULT_BOOTSTRAP = os.environ.get("COPYLESS_BOOTSTRAP", "127.0.0.1:9092")


def add_parsers(subparsers) -> None:
    """Register ``produce``, ``consume`` and ``topics`` on the ``copyless`` command's subparsers."""
    produce = subparsers.add_parser("produce", help="produce records (stdin lines or synthetic)")
    produce.add_argument("topic")
    _common(produce)
    produce.add_argument("--count", type=int, help="send N synthetic records instead of reading stdin")
    produce.add_argument("--size", type=int, default=100, help="synthetic record value bytes (default 100)")
    produce.add_argument("--acks", default="all", choices=["0", "1", "all", "-1"], help="default all")
    produce.add_argument("-K", "--key-delimiter", help="split each stdin line into key DELIM value")
    produce.add_argument("-p", "--partition", type=int, help="produce to this partition only")
    produce.add_argument("-z", "--compression", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    produce.add_argument("--batch-size", type=int, help="bytes per partition batch (default: the producer's)")
    produce.add_argument("--linger-ms", type=float, default=5)
    produce.add_argument("--no-idempotence", action="store_true", help="disable the idempotent producer")
    produce.set_defaults(func=run_produce)

    consume = subparsers.add_parser("consume", help="consume records and print their values")
    consume.add_argument("topic")
    _common(consume)
    consume.add_argument("-g", "--group", help="consume as a member of this group (commits offsets)")
    consume.add_argument("--from-beginning", action="store_true", help="start at the earliest offset")
    consume.add_argument("--count", type=int, help="stop after N records")
    consume.add_argument("-e", "--exit", action="store_true", help="stop at the end of the log (as kcat -e)")
    consume.add_argument("-p", "--partition", type=int, action="append", help="only these partitions")
    consume.add_argument("-q", "--quiet", action="store_true", help="do not print records")
    consume.add_argument("-K", "--key-delimiter", help="print key DELIM value")
    consume.set_defaults(func=run_consume)

    topics = subparsers.add_parser("topics", help="list, create, delete or describe topics")
    actions = topics.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    listing = actions.add_parser("list", help="topic names")
    _common(listing)
    listing.add_argument("--internal", action="store_true", help="include internal topics")
    create = actions.add_parser("create", help="create topics")
    create.add_argument("names", nargs="+")
    _common(create)
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--replication-factor", type=int, default=1)
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    create.add_argument("--if-not-exists", action="store_true")
    delete = actions.add_parser("delete", help="delete topics")
    delete.add_argument("names", nargs="+")
    _common(delete)
    delete.add_argument("--if-exists", action="store_true")
    describe = actions.add_parser("describe", help="partitions, leaders, replicas and offsets")
    describe.add_argument("names", nargs="*")
    _common(describe)
    for parser in (listing, create, delete, describe):
        parser.set_defaults(func=run_topics)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-b", "--bootstrap", default=DEFAULT_BOOTSTRAP, help=f"HOST:PORT[,...] (default {DEFAULT_BOOTSTRAP})"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _run(coroutine) -> int:
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    try:
        return runner(coroutine)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `copyless consume ... | head`: the reader left; that is not an error
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except Exception as exc:  # a clear one-line error instead of a traceback for expected failures
        from copyless.client.errors import ClientError

        if isinstance(exc, (ClientError, OSError, ValueError)):
            print(f"copyless: error: {exc}", file=sys.stderr)
            return 1
        raise


class _Progress:
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


def _summary(records: int, total_bytes: int, seconds: float) -> dict:
    seconds = max(seconds, 1e-9)
    return {
        "records": records,
        "bytes": total_bytes,
        "seconds": round(seconds, 6),
        "records_per_s": round(records / seconds, 1),
        "mb_per_s": round(total_bytes / seconds / 1e6, 3),
    }


# --- produce ------------------------------------------------------------------------------------------------


def run_produce(args) -> int:
    return _run(_produce(args))


async def _produce(args) -> int:
    from copyless.client.errors import BufferFullError
    from copyless.client.producer import Producer

    options = {"batch_size": args.batch_size} if args.batch_size else {}
    producer = Producer(
        args.bootstrap,
        **options,
        acks=args.acks,
        compression_type=args.compression,
        linger_ms=args.linger_ms,
        enable_idempotence=False if (args.no_idempotence or args.acks not in ("all", "-1")) else None,
    )
    await producer.start()
    records = 0
    total_bytes = 0
    last = None
    progress = _Progress(args.count, "records")
    started = time.perf_counter()
    try:
        if args.partition is None:
            await producer.wait_for_topic(args.topic)
        send_nowait = producer.send_nowait
        topic = args.topic
        partition = args.partition
        if args.count is not None:
            value = (b"0123456789abcdefghijklmnopqrstuvwxyz" * (args.size // 36 + 1))[: args.size]
            for sent in range(args.count):
                try:
                    last = send_nowait(topic, value, partition=partition)
                except BufferFullError:
                    last = await producer.send(topic, value, partition=partition)
                if sent & 1023 == 1023:
                    progress.advance(1024)
                    await asyncio.sleep(0)  # let the sender and the socket run
            records = args.count
            total_bytes = args.count * args.size
            progress.advance(args.count - progress.count)
        else:
            loop = asyncio.get_running_loop()
            stdin = sys.stdin.buffer
            delimiter = args.key_delimiter.encode() if args.key_delimiter else None
            while True:
                try:
                    lines = await loop.run_in_executor(None, stdin.readlines, 1 << 16)
                except asyncio.CancelledError:  # Ctrl-C: send what was read, then print the summary
                    break
                if not lines:
                    break
                for line in lines:
                    line = line.rstrip(b"\r\n")
                    key = None
                    if delimiter is not None and delimiter in line:
                        key, line = line.split(delimiter, 1)
                    try:
                        last = send_nowait(topic, line, key, partition=partition)
                    except BufferFullError:
                        last = await producer.send(topic, line, key, partition=partition)
                    records += 1
                    total_bytes += len(line) + (len(key) if key else 0)
                progress.advance(len(lines))
        await producer.flush()
        if last is not None and producer.acks != 0:
            await last  # raises the delivery error of the last record, if any
    finally:
        progress.close()
        await producer.close()
    seconds = time.perf_counter() - started
    if args.json:
        print(json.dumps(_summary(records, total_bytes, seconds)))
    return 0


# --- consume ------------------------------------------------------------------------------------------------


def run_consume(args) -> int:
    return _run(_consume(args))


async def _consume(args) -> int:
    from copyless.client.consumer import Consumer, TopicPartition

    consumer = Consumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        auto_offset_reset="earliest" if args.from_beginning else "latest",
        client_id="copyless-cli",
    )
    await consumer.start()
    out = sys.stdout.buffer
    delimiter = args.key_delimiter.encode() if args.key_delimiter else None
    records = 0
    total_bytes = 0
    progress = _Progress(args.count, "records")
    started = time.perf_counter()
    # Ctrl-C: stop and still print the summary. The loop's own handler sets a flag the poll loop checks
    # (getmany returns at least every 500 ms), so the stop does not hang on a cancellation alone; it also
    # cancels the task to cut the current wait short. It is removed at once: a second Ctrl-C interrupts.
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    stopping = False
    handler_installed = False

    def stop() -> None:
        nonlocal stopping, handler_installed
        stopping = True
        loop.remove_signal_handler(signal.SIGINT)
        handler_installed = False
        main_task.cancel()

    try:
        loop.add_signal_handler(signal.SIGINT, stop)
        handler_installed = True
    except (NotImplementedError, RuntimeError, ValueError):  # no signals here (not the main thread)
        pass
    try:
        if args.group:
            consumer.subscribe([args.topic])
            # --from-beginning sets auto_offset_reset: partitions with a committed offset resume from it
            # (as kafka-console-consumer does); the others start at the earliest offset.
            await consumer.wait_for_assignment()
        else:
            count = await consumer._cluster.wait_for_topic(args.topic, allow_auto_create=False)
            partitions = args.partition if args.partition else range(count)
            consumer.assign([TopicPartition(args.topic, p) for p in partitions])
        end_offsets = None
        if args.exit:
            end_offsets = await consumer.end_offsets(consumer.assignment())
        while not stopping:
            if end_offsets is not None:
                caught_up = True
                for tp, end in end_offsets.items():
                    if tp in consumer.assignment() and await consumer.position(tp) < end:
                        caught_up = False
                        break
                if caught_up:
                    break
            remaining = None if args.count is None else args.count - records
            if remaining is not None and remaining <= 0:
                break
            try:
                batch = await consumer.getmany(timeout_ms=500, max_records=remaining)
            except asyncio.CancelledError:  # Ctrl-C: stop cleanly and still print the summary
                break
            for tp_records in batch.values():
                for record in tp_records:
                    records += 1
                    size = len(record.value or b"") + len(record.key or b"")
                    total_bytes += size
                    if not args.quiet:
                        if delimiter is not None:
                            out.write((record.key or b"") + delimiter)
                        out.write((record.value or b"") + b"\n")
                progress.advance(len(tp_records))
            if not args.quiet and batch:
                out.flush()
    finally:
        if handler_installed:  # uvloop raises ValueError off the main thread, where none was installed
            loop.remove_signal_handler(signal.SIGINT)
        progress.close()
        await consumer.close()
    seconds = time.perf_counter() - started
    if args.json:
        sys.stdout.flush()
        print(json.dumps(_summary(records, total_bytes, seconds)), flush=True)
    return 0


# --- topics -------------------------------------------------------------------------------------------------


def run_topics(args) -> int:
    return _run(_topics(args))


async def _topics(args) -> int:
    from copyless.client.admin import EARLIEST, LATEST, Admin

    async with Admin(args.bootstrap, client_id="copyless-cli") as admin:
        if args.action == "list":
            names = await admin.list_topics(internal=args.internal)
            if args.json:
                print(json.dumps(names))
            else:
                for name in names:
                    print(name)
        elif args.action == "create":
            configs = {}
            for item in args.config:
                key, separator, value = item.partition("=")
                if not separator:
                    raise ValueError(f"--config expects KEY=VALUE, got {item!r}")
                configs[key] = value
            results = await admin.create_topics(
                args.names,
                num_partitions=args.partitions,
                replication_factor=args.replication_factor,
                configs=configs,
                if_not_exists=args.if_not_exists,
            )
            _report(args, "created", results)
        elif args.action == "delete":
            results = await admin.delete_topics(args.names, if_exists=args.if_exists)
            _report(args, "deleted", results)
        else:
            descriptions = await admin.describe_topics(args.names or None)
            requests = {}
            for description in descriptions:
                for partition in description.partitions:
                    requests[(description.name, partition.partition)] = None
            earliest = await admin.list_offsets({tp: EARLIEST for tp in requests}) if requests else {}
            latest = await admin.list_offsets({tp: LATEST for tp in requests}) if requests else {}
            document = []
            for description in descriptions:
                partitions = []
                for p in description.partitions:
                    tp = (description.name, p.partition)
                    partitions.append(
                        {
                            "partition": p.partition,
                            "leader": p.leader,
                            "replicas": list(p.replicas),
                            "isr": list(p.isr),
                            "log_start_offset": earliest.get(tp),
                            "log_end_offset": latest.get(tp),
                        }
                    )
                document.append({"topic": description.name, "internal": description.internal, "partitions": partitions})
            if args.json:
                print(json.dumps(document))
            else:
                for topic in document:
                    print(f"topic {topic['topic']} partitions {len(topic['partitions'])}")
                    for p in topic["partitions"]:
                        print(
                            f"  partition {p['partition']} leader {p['leader']} replicas {p['replicas']} "
                            f"isr {p['isr']} offsets {p['log_start_offset']}..{p['log_end_offset']}"
                        )
    return 0


def _report(args, verb: str, results: dict) -> None:
    if args.json:
        print(json.dumps(results))
    else:
        for name, code in results.items():
            print(f"{verb} {name}" if code == 0 else f"{name}: error {code}")


def main(argv=None) -> int:
    """Standalone entry point (``python -m copyless.client.cli``) with only the client's subcommands."""
    parser = argparse.ArgumentParser(prog="copyless")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    add_parsers(subparsers)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
