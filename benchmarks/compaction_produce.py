"""Produce throughput on a compacted topic while the cleaner runs, against the same topic with ``delete``.

What is measured: one copyless broker process (``copyless.broker serve``, its cleaner on with a 200 ms backoff)
and two topics of one partition and 1 MiB segments, ``cleanup.policy=compact`` (``min.cleanable.dirty.ratio``
0.1, so the cleaner is due again after every few segments) and ``delete``. Rounds alternate between them
(compact, delete, delete, compact, ...: neither always goes first): confluent-kafka produces N records of 1 KB
values keyed over 10,000 keys (acks=1, linger 5 ms), timed from the first send to the last acknowledgement.
Per round: MB/s (wall), the broker's CPU seconds per GB produced (/proc, its cleaner thread included: the
cost the cleaner adds to produce), and the cleanings the broker logged during the round. Each round starts once
the cleaner has been idle for 2 s, so a delete round carries no cleaning of the compacted topic. The compacted topic's
produce path also decodes every batch to refuse records without a key (Kafka's LogValidator does the same).

Ratios: compact / delete of the median MB/s (target at least 0.9) and of the median broker CPU s per GB. The
machine is shared: the rounds alternate so both policies see the same load; the load average is recorded.
"""

from __future__ import annotations

import logging
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import Benchmark, cpu_seconds
from benchmarks._throughput.brokers import start_copyless

KEYS = 10_000
VALUE_BYTES = 1000
_CLEANED = re.compile(r"cleaned offsets \[")
BROKER_CONFIG = """\
"log.cleaner.backoff.ms" = 200
"""


def _create_topics(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    common = {"segment.bytes": str(1 << 20)}
    futures = admin.create_topics([
        NewTopic("compacted", 1, 1, config={**common, "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1"}),
        NewTopic("deleted", 1, 1, config={**common, "cleanup.policy": "delete"}),
    ])
    for future in futures.values():
        future.result(60)


def _produce(bootstrap: str, topic: str, count: int, seed: int) -> float:
    """Seconds to produce ``count`` keyed records and have them all acknowledged."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 5, "batch.size": 1 << 20,
                         "queue.buffering.max.kbytes": 1 << 20})
    value = os.urandom(VALUE_BYTES)
    keys = [b"key-%06d" % ((seed * 7919 + number * 104_729) % KEYS) for number in range(count)]
    producer.produce(topic, value, key=b"warm-up")  # metadata before the clock starts
    producer.flush(60)
    failures = []
    started = time.perf_counter()
    for key in keys:
        while True:
            try:
                producer.produce(topic, value, key=key,
                                 on_delivery=lambda err, _msg: failures.append(err) if err else None)
                break
            except BufferError:
                producer.poll(0.01)
    remaining = producer.flush(300)
    elapsed = time.perf_counter() - started
    if remaining or failures:
        raise RuntimeError(f"{remaining} records not delivered, {len(failures)} failed: {failures[:3]}")
    return elapsed


def _wait_for_idle_cleaner(log_path: Path, quiet_s: float = 2.0, timeout_s: float = 120.0) -> None:
    """Until no cleaning has finished for ``quiet_s`` (ten of the cleaner's 200 ms backoffs)."""
    deadline = time.monotonic() + timeout_s
    seen, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        count = len(_CLEANED.findall(log_path.read_text(errors="replace")))
        if count != seen:
            seen, since = count, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the cleaner was still busy after {timeout_s} s")


def main(argv=None) -> dict[str, Any]:
    logging.basicConfig(level=logging.WARNING)
    bench = Benchmark("compaction_produce", "produce throughput on a compacted topic while the cleaner runs, "
                      "against the same topic with delete", argv)
    count = bench.pick(200_000, 50_000, 5_000)
    pairs = bench.pick(3, 3, 1)
    order = []
    for number in range(pairs):
        order += ["compact", "delete"] if number % 2 == 0 else ["delete", "compact"]
    load_before = os.getloadavg()
    with bench.scratch_dir() as scratch:
        scratch = Path(scratch).resolve()  # the broker runs in its own working directory
        config_path = scratch / "broker.toml"
        config_path.write_text(BROKER_CONFIG)
        (scratch / "data").mkdir()
        log_path = scratch / "broker.log"
        broker = start_copyless(scratch / "data", log_path, extra_args=("--config", str(config_path)))
        try:
            _create_topics(broker.bootstrap)
            with bench.progress(len(order), "rounds") as bar:
                for number, policy in enumerate(order):
                    topic = "compacted" if policy == "compact" else "deleted"
                    cleanings_before = len(_CLEANED.findall(log_path.read_text(errors="replace")))
                    cpu_before = cpu_seconds(broker.cpu_pid)
                    seconds = _produce(broker.bootstrap, topic, count, seed=number)
                    cpu = cpu_seconds(broker.cpu_pid) - cpu_before
                    cleanings = len(_CLEANED.findall(log_path.read_text(errors="replace"))) - cleanings_before
                    # The next round starts with the cleaner idle: a delete round never pays for the cleaning
                    # of the compact round before it.
                    _wait_for_idle_cleaner(log_path)
                    produced = count * VALUE_BYTES
                    bench.row(round=number, policy=policy, records=count, seconds=round(seconds, 3),
                              mb_per_s=round(produced / seconds / 1e6, 2),
                              broker_cpu_s_per_gb=round(cpu / (produced / 1e9), 2), cleanings=cleanings)
                    bar.advance(1)
        finally:
            broker.stop()
    load_after = os.getloadavg()

    def median(policy: str, key: str) -> float:
        return statistics.median(r[key] for r in bench.rows if r["policy"] == policy)

    ratios = {
        "mb_per_s_compact": median("compact", "mb_per_s"),
        "mb_per_s_delete": median("delete", "mb_per_s"),
        "mb_per_s_compact_over_delete": round(median("compact", "mb_per_s") / median("delete", "mb_per_s"), 3),
        "cpu_s_per_gb_compact_over_delete": round(median("compact", "broker_cpu_s_per_gb")
                                                  / median("delete", "broker_cpu_s_per_gb"), 3),
        "cleanings_during_compact_rounds": sum(r["cleanings"] for r in bench.rows if r["policy"] == "compact"),
    }
    bench.note(f"{count:,} records of {VALUE_BYTES} B over {KEYS:,} keys a round, rounds {', '.join(order)}; "
               f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after (2 cores)")

    def chart(fig) -> None:
        left, right = fig.subplots(1, 2)
        for axis, key, label in ((left, "mb_per_s", "produce MB/s"), (right, "broker_cpu_s_per_gb", "broker CPU s/GB")):
            for policy, color in (("compact", "tab:green"), ("delete", "tab:gray")):
                rows = [r for r in bench.rows if r["policy"] == policy]
                axis.scatter([r["round"] for r in rows], [r[key] for r in rows], color=color, label=policy)
            axis.set_xlabel("round")
            axis.set_ylabel(label)
            axis.set_ylim(bottom=0)
            axis.legend()
        fig.suptitle("produce while the cleaner runs: compact vs delete", fontsize=11)

    return bench.finish(ratios=ratios, chart=chart, extra={"records_per_round": count, "keys": KEYS},
                        columns=["round", "policy", "records", "seconds", "mb_per_s", "broker_cpu_s_per_gb",
                                 "cleanings"])


if __name__ == "__main__":
    main()
