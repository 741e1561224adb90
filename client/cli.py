"""``copyless produce`` and ``copyless consume``: kcat's -P and -C over the copyless client; and the
registration of every client command (``topics``, ``groups``, ``cluster`` live in ``admin_cli``).

    copyless produce TOPIC [-K :] [-H k=v] [-p N]      each stdin line becomes a record as it arrives
    copyless produce TOPIC --count N --size BYTES      N synthetic records of BYTES each
    copyless produce TOPIC --transactional-id ID       all of it in one transaction (committed at the end)
    copyless consume TOPIC [-g G] [-o beginning|end|N|-N] [--from-time T] [-e] [-f FMT | --json] [-K :]

Output of ``consume``: the value per line (``-K D``: key D value), a kcat-like ``-f`` format, or with
``--json`` one object per record: ``{"topic", "partition", "offset", "timestamp", "key", "value",
"headers"}`` (key, value and header values as UTF-8 text; bytes that are not UTF-8 as ``{"base64": ...}``).
With ``-q --json`` (consume) and ``--json`` (produce) the command prints one summary object instead:
``{"records", "bytes", "seconds", "records_per_s", "mb_per_s"}`` (bytes = key + value; MB = 10**6 bytes).

Ctrl-C (SIGINT) stops both at once, on a terminal or a pipe: ``produce`` sends what it has read (waiting
at most ``STOP_FLUSH_S`` for acknowledgements) and ``consume`` prints what it has received, then each
prints its summary, then both exit 130. A missing or invalid topic, a partition the topic does not have and
an ``-o`` offset outside the partition's log fail at once, saying where the log starts and ends.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from copyless.client.cli_common import (
    EXIT_INTERRUPTED,
    Progress,
    add_common,
    client_security,
    count_arg,
    parse_time_ms,
    print_summary,
    run,
    summary,
)

__all__ = ["add_parsers", "main", "format_record"]

# After Ctrl-C, how long produce waits for what it already sent to be acknowledged.
STOP_FLUSH_S = 1.0
# How often the consume loop looks at its stop flag (getmany's longest wait).
POLL_S = 0.5
OFFSET_OUT_OF_RANGE = 1


def add_parsers(subparsers) -> None:
    """Register ``produce``, ``consume``, ``topics``, ``groups`` and ``cluster``."""
    produce = subparsers.add_parser("produce", help="produce records: stdin lines, or synthetic ones",
                                    description="Each stdin line becomes one record, sent as it arrives.")
    produce.add_argument("topic", help="the topic (created on first use where the broker allows it)")
    add_common(produce, json_help="print one JSON summary line at the end")
    produce.add_argument("-K", "--key-delimiter", metavar="DELIM", help="split each line into KEY DELIM VALUE")
    produce.add_argument("-H", "--header", action="append", default=[], metavar="KEY=VALUE",
                         help="add this header to every record (repeatable)")
    produce.add_argument("-p", "--partition", type=int, help="produce to this partition (default: by key, "
                         "or one partition at a time for unkeyed records)")
    produce.add_argument("--count", type=count_arg, help="send COUNT synthetic records instead of reading stdin")
    produce.add_argument("--size", type=count_arg, default=100, help="value bytes of a synthetic record (default 100)")
    produce.add_argument("--acks", default="all", choices=["0", "1", "all", "-1"],
                         help="acknowledgements to wait for (default all)")
    produce.add_argument("-z", "--compression", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"],
                         help="batch compression codec (default none)")
    produce.add_argument("--batch-size", type=count_arg,
                         help="bytes per partition batch (default: the producer's, 256 KiB)")
    produce.add_argument("--linger-ms", type=float, default=5, help="wait this long for a batch to fill (default 5)")
    produce.add_argument("--no-idempotence", action="store_true", help="turn the idempotent producer off")
    produce.add_argument("--transactional-id", metavar="ID",
                         help="send every record in one transaction of this transactional id: committed at "
                              "the end of input, aborted on Ctrl-C or an error")
    produce.set_defaults(func=run_produce, command_name="copyless produce")

    consume = subparsers.add_parser("consume", help="consume records and print them",
                                    description="Print records as they arrive; Ctrl-C stops.")
    consume.add_argument("topic", help="the topic (must exist)")
    add_common(consume, json_help="one JSON object per record (with -q: one summary line at the end)")
    consume.add_argument("-g", "--group", help="consume as a member of this group (commits offsets)")
    consume.add_argument("-p", "--partition", type=int, action="append",
                         help="only this partition (repeatable; not with --group)")
    consume.add_argument("-o", "--offset", metavar="beginning|end|N|-N",
                         help="start at the earliest offset, the end, offset N, or N before the end "
                              "(not with --group); default: the end, as kcat")
    consume.add_argument("--from-beginning", action="store_true",
                         help="start at the earliest offset (with --group: the partitions without a "
                              "committed offset)")
    consume.add_argument("--from-time", metavar="MS|ISO-8601",
                         help="start at the first record at or after this time: milliseconds since the "
                              "epoch or e.g. 2026-11-24T10:00:00Z (not with --group)")
    consume.add_argument("--count", type=count_arg, help="stop after COUNT records")
    consume.add_argument("-e", "--exit", action="store_true", help="stop at the end of the log (as kcat -e)")
    consume.add_argument("-q", "--quiet", action="store_true", help="do not print records")
    consume.add_argument("-K", "--key-delimiter", metavar="DELIM", help="print KEY DELIM VALUE")
    consume.add_argument("-f", "--format", metavar="FMT",
                         help="kcat-like format: %%t topic, %%p partition, %%o offset, %%T timestamp, %%k key, "
                              "%%s value, %%h headers, %%K key bytes, %%S value bytes, \\n, \\t")
    consume.set_defaults(func=run_consume, command_name="copyless consume")

    from copyless.client import admin_cli, security_cli

    admin_cli.add_parsers(subparsers)
    security_cli.add_parsers(subparsers)


# --- produce ------------------------------------------------------------------------------------------------


def run_produce(args) -> int:
    return run(args, _produce(args))


def _parse_headers(items) -> list[tuple[str, bytes]] | None:
    headers = []
    for item in items:
        key, separator, value = item.partition("=")
        if not separator or not key:
            raise ValueError(f"-H expects KEY=VALUE, got {item!r}")
        headers.append((key, value.encode()))
    return headers or None


def _read_lines(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
    """The stdin reader thread: the complete lines of each read go to ``queue`` at once, as a list (None at
    EOF), so a line piped or typed slowly is sent when it arrives, not when 64 KiB have. ``os.read`` on the
    descriptor, not ``sys.stdin.buffer``: a daemon thread blocked inside the buffered reader holds its lock,
    and the interpreter aborts at exit (after Ctrl-C) when it finds the lock held."""
    fd = sys.stdin.fileno()
    pending = b""

    def put(item) -> bool:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
            return True
        except RuntimeError:  # the loop is gone
            return False

    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except OSError:
            break
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        if lines and not put(lines):
            return
    if pending:
        put([pending])
    put(None)


def _current_task() -> asyncio.Task[object]:
    task = asyncio.current_task()
    assert task is not None  # the commands run as the loop's main task
    return task


def _install_stop(on_stop: Callable[[], object]) -> Callable[[], None]:
    """SIGINT calls ``on_stop()`` once (the loop's own handler); returns the function that removes it."""
    loop = asyncio.get_running_loop()
    installed = False

    def handler() -> None:
        remove()
        on_stop()

    def remove() -> None:
        nonlocal installed
        if installed:
            installed = False
            loop.remove_signal_handler(signal.SIGINT)

    try:
        loop.add_signal_handler(signal.SIGINT, handler)
        installed = True
    except (NotImplementedError, RuntimeError, ValueError):  # no signals here (not the main thread)
        pass
    return remove


async def _produce(args) -> int:
    from copyless.client.errors import BufferFullError, TransactionAbortableError
    from copyless.client.producer import Producer

    headers = _parse_headers(args.header)
    options = {"batch_size": args.batch_size} if args.batch_size else {}
    producer = Producer(
        args.bootstrap,
        **options,
        acks=args.acks,
        compression_type=args.compression,
        linger_ms=args.linger_ms,
        enable_idempotence=False if (args.no_idempotence or args.acks not in ("all", "-1")) else None,
        transactional_id=args.transactional_id,
        security=client_security(args),
    )
    await producer.start()
    if args.transactional_id is not None:
        await producer.init_transactions()
        producer.begin_transaction()
    records = 0
    total_bytes = 0
    last = None
    progress = Progress(args.count, "records")
    started = time.perf_counter()
    stopping = asyncio.Event()
    main_task = _current_task()

    def stop() -> None:
        stopping.set()
        main_task.cancel()

    remove_handler = _install_stop(stop)
    try:
        topic, partition = args.topic, args.partition
        # Fails at once for an invalid name (INVALID_TOPIC_EXCEPTION) and checks -p against the topic.
        count = await producer.wait_for_topic(topic)
        if partition is not None and not 0 <= partition < count:
            from copyless.client.errors import KafkaError

            raise KafkaError(3, f"topic {topic!r} has no partition {partition} (it has {count}: 0..{count - 1})")
        send_nowait = producer.send_nowait
        try:
            if args.count is not None:
                value = (b"0123456789abcdefghijklmnopqrstuvwxyz" * (args.size // 36 + 1))[: args.size]
                for sent in range(args.count):
                    try:
                        last = send_nowait(topic, value, partition=partition, headers=headers)
                    except BufferFullError:
                        last = await producer.send(topic, value, partition=partition, headers=headers)
                    records += 1
                    if sent & 1023 == 1023:
                        progress.advance(1024)
                        await asyncio.sleep(0)  # let the sender and the socket run
                total_bytes = records * args.size
                progress.advance(records - progress.count)
            else:
                loop = asyncio.get_running_loop()
                queue: asyncio.Queue = asyncio.Queue()
                threading.Thread(target=_read_lines, args=(loop, queue), name="stdin", daemon=True).start()
                delimiter = args.key_delimiter.encode() if args.key_delimiter else None
                while True:
                    lines = await queue.get()
                    if lines is None:
                        break
                    for line in lines:
                        line = line.rstrip(b"\r")
                        key = None
                        if delimiter is not None and delimiter in line:
                            key, line = line.split(delimiter, 1)
                        last = await producer.send(topic, line, key, partition=partition, headers=headers)
                        records += 1
                        total_bytes += len(line) + (len(key) if key else 0)
                    progress.advance(len(lines))
                    if queue.empty():
                        producer.flush_nowait()  # what has arrived goes out now, not after linger or at EOF
        except asyncio.CancelledError:
            if not stopping.is_set():
                raise
            _current_task().uncancel()
        if stopping.is_set():
            try:
                async with asyncio.timeout(STOP_FLUSH_S):
                    if args.transactional_id is not None:
                        await producer.abort_transaction()
                    else:
                        await producer.flush()
            except TimeoutError:
                pass
        elif args.transactional_id is not None:
            try:
                await producer.commit_transaction()
            except TransactionAbortableError:
                await producer.abort_transaction()
                raise
        else:
            await producer.flush()
            if last is not None and producer.acks != 0:
                await last  # raises the delivery error of the last record, if any
    finally:
        remove_handler()
        progress.close()
        await producer.close(timeout_s=STOP_FLUSH_S if stopping.is_set() else None)
    seconds = time.perf_counter() - started
    print_summary(args, "produced", summary(records, total_bytes, seconds), json_on_stdout=args.json)
    # Ctrl-C stops a producer reading a terminal: what was read is sent, and the exit status says it was
    # interrupted (Ctrl-D, end of input, exits 0).
    return EXIT_INTERRUPTED if stopping.is_set() else 0


# --- consume ------------------------------------------------------------------------------------------------


def run_consume(args) -> int:
    return run(args, _consume(args))


def _text(data: bytes | None):
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def record_json(record) -> str:
    """One record as the ``--json`` object."""
    return json.dumps({
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": _text(record.key),
        "value": _text(record.value),
        "headers": [[name, _text(value)] for name, value in record.headers],
    })


def format_record(fmt: str, record) -> bytes:
    """kcat's ``-f``: %t %p %o %T %k %s %h %K %S %% and the escapes \\n \\t \\\\ (an unknown %x is kept)."""
    out = bytearray()
    i = 0
    length = len(fmt)
    while i < length:
        char = fmt[i]
        if char == "%" and i + 1 < length:
            code = fmt[i + 1]
            i += 2
            if code == "t":
                out += record.topic.encode()
            elif code == "p":
                out += str(record.partition).encode()
            elif code == "o":
                out += str(record.offset).encode()
            elif code == "T":
                out += str(record.timestamp).encode()
            elif code == "k":
                out += record.key or b""
            elif code == "s":
                out += record.value or b""
            elif code == "K":
                out += str(len(record.key) if record.key is not None else -1).encode()
            elif code == "S":
                out += str(len(record.value) if record.value is not None else -1).encode()
            elif code == "h":
                out += b",".join(name.encode() + b"=" + (value or b"") for name, value in record.headers)
            elif code == "%":
                out += b"%"
            else:
                out += ("%" + code).encode()
        elif char == "\\" and i + 1 < length:
            code = fmt[i + 1]
            i += 2
            out += {"n": b"\n", "t": b"\t", "\\": b"\\", "r": b"\r"}.get(code, ("\\" + code).encode())
        else:
            out += char.encode()
            i += 1
    return bytes(out)


def _parse_offset(text: str) -> str | int:
    if text in ("beginning", "earliest", "end", "latest"):
        return text
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"-o expects beginning, end, N or -N, got {text!r}") from None


def _check_offset(offset: int, tp, start: int, end: int) -> None:
    """``-o N`` must lie in the partition's log: between its log start and its log end (the next offset)."""
    from copyless.client.errors import KafkaError

    where = f"{tp.topic}-{tp.partition}"
    held = f"offsets {start}..{end - 1}" if end > start else "no records"
    if offset > end:
        raise KafkaError(OFFSET_OUT_OF_RANGE, f"-o {offset} is past the end of {where}: its log end offset is {end} "
                                              f"({held}; -o end waits for the next record)")
    if offset < start:
        raise KafkaError(OFFSET_OUT_OF_RANGE, f"-o {offset} is before the start of {where}: its log start offset "
                                              f"is {start} ({held}; -o beginning starts there)")


async def _position_partitions(consumer, tps, args) -> None:
    """Apply -o / --from-time / --from-beginning to manually assigned partitions."""
    if args.from_time is not None:
        found = await consumer.offsets_for_times({tp: parse_time_ms(args.from_time) for tp in tps})
        after = [tp for tp, offset in found.items() if offset is None]
        for tp, offset in found.items():
            if offset is not None:
                consumer.seek(tp, offset)
        if after:
            consumer.seek_to_end(*after)
        return
    offset = _parse_offset(args.offset) if args.offset is not None else ("beginning" if args.from_beginning else None)
    if offset is None:
        return  # auto_offset_reset (latest) applies
    if isinstance(offset, str):  # beginning, earliest, end or latest
        if offset in ("beginning", "earliest"):
            consumer.seek_to_beginning(*tps)
        else:
            consumer.seek_to_end(*tps)
    elif offset >= 0:
        starts = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            _check_offset(offset, tp, starts[tp], ends[tp])
            consumer.seek(tp, offset)
    else:
        ends = await consumer.end_offsets(tps)
        starts = await consumer.beginning_offsets(tps)
        for tp in tps:
            consumer.seek(tp, max(ends[tp] + offset, starts[tp]))


async def _consume(args) -> int:
    from copyless.client.consumer import Consumer, TopicPartition
    from copyless.client.errors import KafkaError

    if args.group and (args.partition or args.offset is not None or args.from_time is not None):
        raise ValueError("-p, -o and --from-time choose partitions and offsets by hand: not with --group")
    fmt = args.format
    if fmt is not None and args.json:
        raise ValueError("-f and --json are two output formats: choose one")
    consumer = Consumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        auto_offset_reset="earliest" if args.from_beginning else "latest",
        client_id="copyless-cli",
        security=client_security(args),
    )
    await consumer.start()
    out = sys.stdout.buffer
    delimiter = args.key_delimiter.encode() if args.key_delimiter else None
    records = 0
    total_bytes = 0
    progress = Progress(args.count, "records")
    started = time.perf_counter()
    # Ctrl-C: the loop's own handler sets a flag the poll loop checks (getmany returns at least every
    # POLL_S) and cancels the task to cut the current wait short; a second Ctrl-C interrupts.
    main_task = _current_task()
    stopping = False

    def stop() -> None:
        nonlocal stopping
        stopping = True
        main_task.cancel()

    remove_handler = _install_stop(stop)
    try:
        # A missing topic fails at once, as kcat's does (no waiting for it to appear).
        count = await consumer._cluster.wait_for_topic(args.topic, 10_000, allow_auto_create=False,
                                                        fail_if_missing=True)
        if args.group:
            consumer.subscribe([args.topic])
            # --from-beginning sets auto_offset_reset: partitions with a committed offset resume from it
            # (as kafka-console-consumer does); the others start at the earliest offset.
            await consumer.wait_for_assignment()
        else:
            partitions = args.partition if args.partition else list(range(count))
            missing = [p for p in partitions if not 0 <= p < count]
            if missing:
                raise KafkaError(3, f"topic {args.topic!r} has no partition {missing[0]} "
                                    f"(it has {count}: 0..{count - 1})")
            tps = [TopicPartition(args.topic, p) for p in partitions]
            consumer.assign(tps)
            await _position_partitions(consumer, tps, args)
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
            batch = await consumer.getmany(timeout_ms=int(POLL_S * 1000), max_records=remaining)
            for tp_records in batch.values():
                for record in tp_records:
                    records += 1
                    total_bytes += len(record.value or b"") + len(record.key or b"")
                    if args.quiet:
                        continue
                    if args.json:
                        out.write(record_json(record).encode() + b"\n")
                    elif fmt is not None:
                        out.write(format_record(fmt, record))
                    else:
                        if delimiter is not None:
                            out.write((record.key or b"") + delimiter)
                        out.write((record.value or b"") + b"\n")
                progress.advance(len(tp_records))
            if not args.quiet and batch:
                out.flush()
    except asyncio.CancelledError:  # Ctrl-C: stop cleanly, print what was read and the summary
        if not stopping:
            raise
        _current_task().uncancel()
    finally:
        remove_handler()
        progress.close()
        try:
            out.flush()
        except BrokenPipeError:
            pass
        try:
            async with asyncio.timeout(STOP_FLUSH_S if stopping else None):
                await consumer.close()
        except TimeoutError:
            pass
    seconds = time.perf_counter() - started
    print_summary(args, "consumed", summary(records, total_bytes, seconds), json_on_stdout=args.json and args.quiet)
    # Ctrl-C stops a tail: what was read is printed, and the exit status says it was interrupted (-e, --count
    # and the end of a pipe exit 0).
    return EXIT_INTERRUPTED if stopping else 0


def main(argv=None) -> int:
    """Standalone entry point (``python -m copyless.client.cli``) with only the client's subcommands."""
    import argparse

    parser = argparse.ArgumentParser(prog="copyless")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    add_parsers(subparsers)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
