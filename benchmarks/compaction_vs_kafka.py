"""Cleaning throughput against Kafka's cleaner: MB/s of dirty log cleaned at a dirty ratio of 0.9.

What is measured: one copyless broker process (``copyless.broker serve``) and, when ``--kafka-home`` holds
the reference Apache Kafka 3.9.1 (``run-kafka.sh PORT DATA_DIR``) and java is on the PATH, one Kafka broker,
both started once, each cleaner backing off 200 ms when idle (copyless's ``log.cleaner.backoff.ms`` in its
config file; Kafka's as a dynamic broker config) and Kafka's ``kafka.log.LogCleaner`` logger raised to INFO
(run-kafka.sh logs at WARN, which hides the cleaner's summary) with Kafka's own ``ConfigCommand``.

The same workload goes to both, on a fresh topic of one partition a round (``cleanup.policy=compact``,
``segment.bytes`` small enough that all but the last segment are sealed, ``min.compaction.lag.ms`` 0):
confluent-kafka (acks=1, linger 5 ms, batches up to 128 KiB, no compression) writes passes of K keys with 1 KB
values, every key once a pass, in a different order each pass. One pass, then the broker's cleaner cleans it
(``min.cleanable.dirty.ratio`` 0.01) and goes idle: the log's clean part. Then ``min.cleanable.dirty.ratio``
goes to 0.99 (so neither cleaner starts early) and nine more passes are written: a dirty ratio of 0.9 over
the sealed segments. Then ``min.cleanable.dirty.ratio`` goes to 0.5 (IncrementalAlterConfigs, the same
request for both) and the next cleaning of the topic is the one measured, from each broker's own figures:

- Kafka: its cleaner's summary (``Log cleaner thread 0 cleaned log T-0 (dirty section = [a, b])``,
  ``X MB of log processed in Y seconds (Z MB/sec)``, ``Indexed D MB``, ``Start size``/``End size``).
  The elapsed time is X / Z (the printed seconds have one decimal); D is the dirty section (MiB).
- copyless: its cleaner's line (``T-0: cleaned offsets [a, b) in S s: ..., R -> W bytes (D dirty bytes
  mapped)``): S is the whole cleaning, the swap included, as Kafka's elapsed time is.

Per round and broker: the dirty MB cleaned (MiB, the map's pass), the log MB the copy read (every sealed
segment up to the map's end: clean and dirty), the dirty ratio D / log, the cleaning's seconds, MB/s of dirty
log cleaned (D / seconds, the issue's figure), MB/s of log processed (Kafka's own figure) and the MB left.
The order of the two brokers alternates by round (copyless first, then Kafka first, ...): ratios
copyless / Kafka of the dirty MB/s per round, and their median. The cleaner reads from the page cache (the log
was just written), so this is the cleaners' CPU cost, not a disk's. Full: 100,000 keys (900 MiB dirty),
8 MiB segments; ``--quick``: 10,000 keys, 1 MiB segments; both three rounds. Tiny (the test suite): 500 keys,
one round, copyless alone (the test suite never needs Kafka).

Rows: ``round, broker, order, keys, dirty_mb, log_mb, dirty_ratio, seconds, dirty_mb_per_s, log_mb_per_s,
end_mb, wall_s`` (``wall_s``: from the ratio's change to the cleaning's line, the cleaner's backoff included).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._harness import Benchmark
from benchmarks._throughput.brokers import DEFAULT_KAFKA_HOME, BrokerHandle, start_copyless, start_kafka

MIB = 1 << 20
VALUE_BYTES = 1000
DIRTY_PASSES = 9  # after one clean pass: a dirty ratio of 9 / 10
BACKOFF_MS = 200
# The producer's batches: below the smallest segment (tiny mode's 256 KiB), the same in every mode.
BATCH_BYTES = 128 << 10
# Kafka's summary, one multi-line message (``%,.1f``: thousands separators).
_NUMBER = r"([\d,]+(?:\.\d+)?)"
_KAFKA_CLEANED = re.compile(
    r"cleaned log (?P<log>\S+) \(dirty section = \[(?P<start>\d+), (?P<end>\d+)\]\)\s+"
    rf"{_NUMBER} MB of log processed in {_NUMBER} seconds \({_NUMBER} MB/sec\)\.\s+"
    rf"Indexed {_NUMBER} MB in.*?Start size: {_NUMBER} MB \(([\d,]+) messages\)\s+"
    rf"End size: {_NUMBER} MB \(([\d,]+) messages\)", re.S)
_COPYLESS_CLEANED = re.compile(
    r"(?P<log>\S+): cleaned offsets \[(?P<start>\d+), (?P<end>\d+)\) in (?P<seconds>[\d.]+) s: \d+ segment\(s\) -> "
    r"\d+, (?P<read>\d+) -> (?P<written>\d+) bytes \((?P<dirty>\d+) dirty bytes mapped\)")
COPYLESS_CONFIG = f'"log.cleaner.backoff.ms" = {BACKOFF_MS}\n'


@dataclass
class Cleaning:
    """One cleaning, as its broker reported it."""

    log: str
    dirty_bytes: float
    log_bytes: float  # what the copy read: every segment up to the map's end
    end_bytes: float
    seconds: float


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def kafka_cleanings(text: str) -> list[Cleaning]:
    found = []
    for match in _KAFKA_CLEANED.finditer(text):
        processed, seconds, rate, indexed, start_mb, _, end_mb, _ = match.groups()[3:]
        processed_mb, rate_mb = _number(processed), _number(rate)
        # Kafka prints the seconds with one decimal; the rate has four significant digits at these sizes.
        elapsed = processed_mb / rate_mb if rate_mb > 0 else _number(seconds)
        found.append(Cleaning(match["log"], _number(indexed) * MIB, processed_mb * MIB, _number(end_mb) * MIB, elapsed))
    return found


def copyless_cleanings(text: str) -> list[Cleaning]:
    return [Cleaning(m["log"], int(m["dirty"]), int(m["read"]), int(m["written"]), float(m["seconds"]))
            for m in _COPYLESS_CLEANED.finditer(text)]


class Side:
    """One broker under test: its handle, its log and how to read its cleanings from it."""

    def __init__(self, name: str, handle: BrokerHandle, log_path: Path, parse):
        self.name = name
        self.handle = handle
        self.log_path = log_path
        self.parse = parse

    def cleanings(self, topic: str) -> list[Cleaning]:
        text = self.log_path.read_text(errors="replace")
        return [c for c in self.parse(text) if c.log == f"{topic}-0"]


def _wait_all(admin, futures: dict) -> None:
    """Every admin request's result (``admin`` stays referenced until then: a client destroyed early fails its
    futures with _DESTROY)."""
    for future in futures.values():
        future.result(60)
    del admin


def _admin(bootstrap: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def _set_topic(bootstrap: str, topic: str, **config: str) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    entries = [ConfigEntry(name.replace("_", "."), value, incremental_operation=AlterConfigOpType.SET)
               for name, value in config.items()]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    admin = _admin(bootstrap)
    _wait_all(admin, admin.incremental_alter_configs([resource]))


def _create_topic(bootstrap: str, topic: str, segment_bytes: int) -> None:
    from confluent_kafka.admin import NewTopic

    config = {"cleanup.policy": "compact", "segment.bytes": str(segment_bytes), "min.compaction.lag.ms": "0",
              "min.cleanable.dirty.ratio": "0.01"}
    admin = _admin(bootstrap)
    _wait_all(admin, admin.create_topics([NewTopic(topic, 1, 1, config=config)]))


def _delete_topic(bootstrap: str, topic: str) -> None:
    admin = _admin(bootstrap)
    _wait_all(admin, admin.delete_topics([topic]))


def _produce(bootstrap: str, topic: str, keys: int, passes: range) -> None:
    """Every key once a pass, in a different order each pass (a stride coprime with ``keys``)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 5, "batch.size": BATCH_BYTES,
                         "queue.buffering.max.kbytes": 1 << 20, "compression.type": "none"})
    value = os.urandom(VALUE_BYTES)
    failures = []

    def delivered(err, _msg):
        if err:
            failures.append(err)

    stride = 104_729  # a prime: coprime with every key count here, so a pass visits each key once
    for number in passes:
        for index in range(keys):
            key = b"key-%08d" % ((number * 7_919 + index * stride) % keys)
            while True:
                try:
                    producer.produce(topic, value, key=key, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.01)
    remaining = producer.flush(300)
    if remaining or failures:
        raise RuntimeError(f"{remaining} records not delivered, {len(failures)} failed: {failures[:3]}")


def _wait_cleaned_and_idle(side: Side, topic: str, seen: int, quiet_s: float, timeout_s: float = 300.0) -> None:
    """Until the topic has more cleanings than ``seen`` and none finished for ``quiet_s``."""
    deadline = time.monotonic() + timeout_s
    count, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = len(side.cleanings(topic))
        if now != count:
            count, since = now, time.monotonic()
        elif count > seen and time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{side.name}: no idle cleaner for {topic} within {timeout_s:.0f} s "
                       f"({count} cleanings seen, {seen} before)")


def _measure(bench: Benchmark, side: Side, topic: str, keys: int, segment_bytes: int) -> dict[str, Any]:
    bootstrap = side.handle.bootstrap
    quiet_s = 1.5
    _create_topic(bootstrap, topic, segment_bytes)
    _produce(bootstrap, topic, keys, range(1))
    _wait_cleaned_and_idle(side, topic, 0, quiet_s)
    _set_topic(bootstrap, topic, min_cleanable_dirty_ratio="0.99")
    _produce(bootstrap, topic, keys, range(1, 1 + DIRTY_PASSES))
    bench.settle()
    before = len(side.cleanings(topic))
    time.sleep(2 * BACKOFF_MS / 1000)  # a cleaning would show now: the 0.99 ratio must hold it back
    if len(side.cleanings(topic)) != before:
        raise RuntimeError(f"{side.name} cleaned {topic} before its ratio was lowered")
    started = time.monotonic()
    _set_topic(bootstrap, topic, min_cleanable_dirty_ratio="0.5")
    deadline = started + 300
    while len(side.cleanings(topic)) == before:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{side.name} did not clean {topic} within 300 s")
        time.sleep(0.02)
    wall = time.monotonic() - started
    cleaning = side.cleanings(topic)[before]
    _delete_topic(bootstrap, topic)
    return {"keys": keys, "dirty_mb": round(cleaning.dirty_bytes / MIB, 1),
            "log_mb": round(cleaning.log_bytes / MIB, 1),
            "dirty_ratio": round(cleaning.dirty_bytes / cleaning.log_bytes, 3) if cleaning.log_bytes else None,
            "seconds": round(cleaning.seconds, 3),
            "dirty_mb_per_s": round(cleaning.dirty_bytes / MIB / cleaning.seconds, 1),
            "log_mb_per_s": round(cleaning.log_bytes / MIB / cleaning.seconds, 1),
            "end_mb": round(cleaning.end_bytes / MIB, 2), "wall_s": round(wall, 2)}


class BackoffNotSet(RuntimeError):
    """Kafka refused the dynamic ``log.cleaner.backoff.ms``."""


def _raise_kafka_cleaner_logging(kafka_home: Path, bootstrap: str) -> None:
    """``kafka.log.LogCleaner`` to INFO and the cleaner's backoff to BACKOFF_MS on the running broker (node 1)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    command = ["java", "-cp", str(kafka_home / "libs" / "*"), "kafka.admin.ConfigCommand", "--bootstrap-server",
               bootstrap, "--entity-type", "broker-loggers", "--entity-name", "1", "--alter", "--add-config",
               "kafka.log.LogCleaner=INFO"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if completed.returncode != 0:
        raise RuntimeError(f"ConfigCommand failed: {completed.stderr.strip()[-2000:]}")
    entry = ConfigEntry("log.cleaner.backoff.ms", str(BACKOFF_MS), incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[entry])
    admin = _admin(bootstrap)
    try:
        _wait_all(admin, admin.incremental_alter_configs([resource]))
    except Exception as exc:  # only the waits grow (Kafka's default backoff is 15 s): the figures stand
        raise BackoffNotSet(str(exc)) from exc



def _kafka_available(bench: Benchmark) -> tuple[bool, str]:
    if bench.tiny:
        return False, "not used in tiny mode (copyless alone)"
    if bench.args.no_kafka:
        return False, "skipped (--no-kafka)"
    home = bench.args.kafka_home
    if not (home / "run-kafka.sh").exists() or shutil.which("java") is None:
        return False, f"not found at {home} (or no java): copyless measured alone"
    return True, f"Apache Kafka from {os.path.relpath(home, Path(__file__).resolve().parents[1])}"


def main(argv=None) -> dict[str, Any]:
    logging.basicConfig(level=logging.WARNING)

    def arguments(parser) -> None:
        parser.add_argument("--kafka-home", type=Path, default=DEFAULT_KAFKA_HOME,
                            help="reference Apache Kafka (run-kafka.sh); default ../shared/anchors/kafka")
        parser.add_argument("--no-kafka", action="store_true", help="copyless alone")

    bench = Benchmark("compaction_vs_kafka", "MB/s of dirty log cleaned at a dirty ratio of 0.9, 1 KB values: "
                      "copyless's cleaner against Kafka's", argv, arguments=arguments)
    keys = bench.pick(100_000, 10_000, 500)
    segment_bytes = bench.pick(8 * MIB, 1 * MIB, 256 << 10)
    rounds = bench.pick(3, 3, 1)
    use_kafka, kafka_state = _kafka_available(bench)
    bench.note(f"reference Kafka: {kafka_state}")
    load_before = os.getloadavg()
    with bench.scratch_dir() as scratch, contextlib.ExitStack() as stack:
        scratch = Path(scratch).resolve()
        needed = (1 + DIRTY_PASSES) * keys * (VALUE_BYTES + 80) * 2 * (2 if use_kafka else 1)
        if bench.disk_scale(needed, scratch, what="one topic a broker and its cleaned copy") < 1.0:
            raise SystemExit("not enough free disk for the workload")
        config_path = scratch / "copyless.toml"
        config_path.write_text(COPYLESS_CONFIG)
        (scratch / "copyless-data").mkdir()
        copyless_log = scratch / "copyless.log"
        handle = start_copyless(scratch / "copyless-data", copyless_log, extra_args=("--config", str(config_path)))
        stack.callback(handle.stop)
        sides = [Side("copyless", handle, copyless_log, copyless_cleanings)]
        if use_kafka:
            try:
                kafka = start_kafka(bench.args.kafka_home, scratch / "kafka-data")
                stack.callback(kafka.stop)
                try:
                    _raise_kafka_cleaner_logging(bench.args.kafka_home, kafka.bootstrap)
                except BackoffNotSet as exc:
                    bench.note(f"Kafka's log.cleaner.backoff.ms stays at its default: {exc}")
                sides.append(Side("kafka", kafka, kafka.log_path, kafka_cleanings))
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                kafka_state = f"failed to start: {exc}"
                bench.note(f"reference Kafka {kafka_state}")
        with bench.progress(rounds * len(sides), "cleanings") as bar:
            for number in range(rounds):
                order = sides if number % 2 == 0 else sides[::-1]
                for position, side in enumerate(order):
                    row = _measure(bench, side, f"compacted-r{number}", keys, segment_bytes)
                    bench.row(round=number, broker=side.name, order=position, **row)
                    bar.advance(1)
    load_after = os.getloadavg()

    def rows_of(broker: str) -> list[dict[str, Any]]:
        return [r for r in bench.rows if r["broker"] == broker]

    ratios: dict[str, Any] = {"dirty_mb_per_s_copyless": statistics.median(r["dirty_mb_per_s"]
                                                                           for r in rows_of("copyless"))}
    per_round = []
    if rows_of("kafka"):
        ratios["dirty_mb_per_s_kafka"] = statistics.median(r["dirty_mb_per_s"] for r in rows_of("kafka"))
        for number in range(rounds):
            mine = next(r for r in rows_of("copyless") if r["round"] == number)
            theirs = next(r for r in rows_of("kafka") if r["round"] == number)
            per_round.append({"round": number, "first": "copyless" if mine["order"] == 0 else "kafka",
                              "copyless_mb_per_s": mine["dirty_mb_per_s"], "kafka_mb_per_s": theirs["dirty_mb_per_s"],
                              "copyless_over_kafka": round(mine["dirty_mb_per_s"] / theirs["dirty_mb_per_s"], 3)})
        ratios["copyless_over_kafka_dirty_mb_per_s"] = statistics.median(r["copyless_over_kafka"] for r in per_round)
        bench.table("copyless / Kafka, MB/s of dirty log cleaned, per round (target at least 1.0)", per_round)
    bench.note(f"{keys:,} keys of {VALUE_BYTES} B values, 1 clean pass + {DIRTY_PASSES} dirty, "
               f"{segment_bytes // 1024} KiB segments; load average {load_before[0]:.1f} before, "
               f"{load_after[0]:.1f} after (2 cores)")

    def chart(fig) -> None:
        axis = fig.subplots(1, 1)
        for broker, color in (("copyless", "tab:green"), ("kafka", "tab:gray")):
            chosen = rows_of(broker)
            if chosen:
                axis.plot([r["round"] for r in chosen], [r["dirty_mb_per_s"] for r in chosen], "o-", color=color,
                          label=broker)
        axis.set_xlabel("round")
        axis.set_ylabel("MB/s of dirty log cleaned")
        axis.set_ylim(bottom=0)
        axis.legend()
        ratio = ratios.get("copyless_over_kafka_dirty_mb_per_s")
        fig.suptitle(f"cleaning {keys:,} keys x 1 KB at a dirty ratio of 0.9"
                     + (f": copyless/Kafka {ratio:.2f} (median)" if ratio is not None else ""), fontsize=11)

    return bench.finish(ratios=ratios, chart=chart,
                        extra={"keys": keys, "segment_bytes": segment_bytes, "kafka": kafka_state,
                               "per_round": per_round},
                        columns=["round", "broker", "order", "keys", "dirty_mb", "log_mb", "dirty_ratio", "seconds",
                                 "dirty_mb_per_s", "log_mb_per_s", "end_mb", "wall_s"])


if __name__ == "__main__":
    main()
