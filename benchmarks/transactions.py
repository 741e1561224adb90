"""Transactions: transactional produce MB/s, commit latency and read_committed consume MB/s, copyless against
Apache Kafka 3.9.1, as ratios within one run.

Brokers: one copyless (``copyless serve``) and, when ``../shared/anchors/kafka`` (or ``--kafka-home``) holds
it, one Kafka 3.9.1 in KRaft mode (``run-kafka.sh``). Without Kafka the benchmark says so and measures
copyless alone; tiny (test) runs never start it.

Workload (the issue's): confluent-kafka (librdkafka) with a transactional id produces transactions of 100
records of 1 KB to a fresh one-partition topic (linger 5 ms), committing each and timing each
``commit_transaction``; produce MB/s counts record values over the whole sequence (begin to last commit);
then a read_committed consumer reads the topic back from offset 0 (MB/s of values). Rounds (``--rounds``:
5; 1 with ``--quick``) run each broker once, the first alternating by round.

Rows: ``round, broker, transactions, records, produce_mb_per_s, commit_p50_ms, commit_p99_ms,
consume_mb_per_s``.
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

from benchmarks._harness import Benchmark, median_interval, percentile
from benchmarks._throughput.brokers import BrokerHandle, start_copyless, start_kafka

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_KAFKA_HOME = REPO_ROOT.parent / "shared" / "anchors" / "kafka"
RECORDS_PER_TXN = 100
RECORD_BYTES = 1000
METRICS = ("produce_mb_per_s", "commit_p50_ms", "commit_p99_ms", "consume_mb_per_s")


def _arguments(parser) -> None:
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5; 1 with --quick)")
    parser.add_argument("--kafka-home", type=Path, default=DEFAULT_KAFKA_HOME,
                        help="the reference Kafka's folder (run-kafka.sh, libs/)")


def _create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the future resolves
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)


def run_one(bench: Benchmark, handle: BrokerHandle, name: str, transactions: int, round_number: int) -> dict:
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

    topic = f"txn-bench-{uuid.uuid4().hex[:10]}"
    _create_topic(handle.bootstrap, topic)
    producer = Producer({"bootstrap.servers": handle.bootstrap, "transactional.id": f"bench-{uuid.uuid4().hex}",
                         "linger.ms": 5})
    producer.init_transactions(60)
    value = b"x" * RECORD_BYTES
    commits = []
    started = time.perf_counter()
    for _ in range(transactions):
        producer.begin_transaction()
        for _ in range(RECORDS_PER_TXN):
            producer.produce(topic, value, partition=0)
        before = time.perf_counter()
        producer.commit_transaction(60)  # flushes, then EndTxn
        commits.append(time.perf_counter() - before)
    produce_s = time.perf_counter() - started
    records = transactions * RECORDS_PER_TXN

    consumer = Consumer({"bootstrap.servers": handle.bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False, "fetch.max.bytes": 52428800})
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen = 0
    started = time.perf_counter()
    deadline = started + 300
    while time.perf_counter() < deadline:
        message = consumer.poll(1.0)
        if message is None:
            continue
        if message.error():
            if message.error().code() == KafkaError._PARTITION_EOF and seen >= records:
                break
            continue
        seen += 1
    consume_s = time.perf_counter() - started
    consumer.close()
    if seen != records:
        raise RuntimeError(f"{name}: read_committed read {seen} of {records} records")
    megabytes = records * RECORD_BYTES / 1e6
    return bench.row(round=round_number, broker=name, transactions=transactions, records=records,
                     produce_mb_per_s=round(megabytes / produce_s, 2),
                     commit_p50_ms=round(percentile(commits, 50) * 1000, 2),
                     commit_p99_ms=round(percentile(commits, 99) * 1000, 2),
                     consume_mb_per_s=round(megabytes / consume_s, 2))


def main(argv=None) -> int:
    bench = Benchmark("transactions", "transactional produce, commit latency and read_committed consume, "
                      "copyless vs Kafka 3.9.1", argv, arguments=_arguments)
    rounds = bench.args.rounds or bench.pick(5, 1, 1)
    transactions = bench.pick(500, 100, 5)
    kafka_home = bench.args.kafka_home
    use_kafka = not bench.tiny and (kafka_home / "libs").is_dir() and shutil.which("java") is not None
    if not use_kafka:
        bench.note("Apache Kafka not measured: " + ("tiny run" if bench.tiny else f"no Kafka at {kafka_home}"))
    brokers: dict[str, BrokerHandle] = {}
    with bench.scratch_dir() as scratch:
        try:
            (scratch / "copyless").mkdir()
            brokers["copyless"] = start_copyless(scratch / "copyless" / "data", scratch / "copyless.log")
            if use_kafka:
                brokers["kafka"] = start_kafka(kafka_home, scratch / "kafka")
            names = list(brokers)
            with bench.progress(rounds * len(names), "runs") as bar:
                for round_number in range(1, rounds + 1):
                    for name in (names if round_number % 2 else list(reversed(names))):
                        run_one(bench, brokers[name], name, transactions, round_number)
                        bar.advance()
        finally:
            for handle in brokers.values():
                handle.stop()
    ratios = _tables(bench, list(brokers), rounds)
    bench.finish(ratios=ratios, extra={"kafka": use_kafka, "records_per_transaction": RECORDS_PER_TXN,
                                       "record_bytes": RECORD_BYTES},
                 columns=["round", "broker", "transactions", "records", *METRICS])
    return 0


def _median(values):
    ordered = sorted(v for v in values if v is not None)
    return ordered[len(ordered) // 2] if ordered else None


def _tables(bench: Benchmark, names, rounds) -> dict:
    medians = [{"broker": name, **{m: _median([r[m] for r in bench.rows if r["broker"] == name]) for m in METRICS}}
               for name in names]
    bench.table("Medians over rounds", medians)
    ratios: dict = {}
    if "kafka" not in names:
        return ratios
    comparisons = []
    for metric in METRICS:
        per_round = []
        for round_number in range(1, rounds + 1):
            ours = [r[metric] for r in bench.rows if r["round"] == round_number and r["broker"] == "copyless"]
            theirs = [r[metric] for r in bench.rows if r["round"] == round_number and r["broker"] == "kafka"]
            if ours and theirs and theirs[0]:
                per_round.append(ours[0] / theirs[0])
        median = _median(per_round)
        interval = median_interval(per_round)
        ratios[f"copyless/kafka {metric}"] = None if median is None else round(median, 3)
        comparisons.append({"metric": metric, "median_ratio": None if median is None else round(median, 3),
                            "interval": None if interval is None else [round(interval.low, 3), round(interval.high, 3)],
                            "verdict": None if interval is None else interval.verdict(),
                            "per_round": [round(x, 3) for x in per_round]})
    bench.table("copyless/Kafka within rounds (for latencies below 1 is better)", comparisons)
    return ratios


if __name__ == "__main__":
    raise SystemExit(main())
