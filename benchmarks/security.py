"""What TLS costs: produce and consume MB/s and broker CPU per GB, PLAINTEXT against SASL_SSL (SCRAM-SHA-512),
on copyless and on Apache Kafka 3.9.1 configured the same way, as ratios within one run.

Brokers: one copyless (``copyless serve`` with a PLAINTEXT and a SASL_SSL listener, SCRAM-SHA-512, no
authorizer) and, when ``../shared/anchors/kafka`` (or ``--kafka-home``) holds it, one Kafka 3.9.1 in KRaft
mode with the same two listeners (PEM keystore and truststore from the same CA, ``SCRAM-SHA-512`` with the
user made by ``kafka-storage format --add-scram``, no authorizer). Without Kafka the benchmark says so and
measures copyless alone; tiny (test) runs never start it.

Workload (as ``benchmarks/throughput.py``'s targets): confluent-kafka (librdkafka) produces N records of
100 B, 1 KB or 10 KB to a fresh one-partition topic (acks=1, linger 5 ms), flushes, then a consumer reads them
back from offset 0; MB/s counts record values (1 MB = 10^6 bytes), and the broker's CPU seconds over each
window give CPU-s per GB. Rounds (``--rounds``: 5; 1 with ``--quick``) each run every (record size, broker,
protocol) once, brokers in turn, the first alternating by round, so every ratio compares runs seconds apart;
tables give medians over rounds and, per round, the ratios SASL_SSL / PLAINTEXT (the cost of TLS on each
broker) and copyless / Kafka (per protocol), with the median's sign-test interval.

Where the kernel has no ``tls`` module (this machine), copyless copies fetched records through OpenSSL on
SASL_SSL (``docs/security.md``): its consume figures under TLS are the copying path's; the run says which
path its broker used (``tls_path``). Kafka always copies through its SSL engine.

Rows: ``round, broker, protocol, record_bytes, records, produce_mb_per_s, consume_mb_per_s,
broker_produce_cpu_s_per_gb, broker_consume_cpu_s_per_gb``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from benchmarks._harness import Benchmark, cpu_seconds, median_interval
from benchmarks._throughput.brokers import BrokerHandle, start_copyless

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_KAFKA_HOME = REPO_ROOT.parent / "shared" / "anchors" / "kafka"
RECORD_SIZES = (100, 1000, 10_000)
PASSWORD = "bench-secret"
PROTOCOLS = ("PLAINTEXT", "SASL_SSL")
STARTUP_TIMEOUT_S = 90.0


def _arguments(parser) -> None:
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5; 1 with --quick)")
    parser.add_argument("--kafka-home", type=Path, default=DEFAULT_KAFKA_HOME,
                        help="the reference Kafka's folder (run-kafka.sh, libs/)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _client_config(protocol: str, certs: Path) -> dict:
    if protocol == "PLAINTEXT":
        return {}
    return {"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "bench",
            "sasl.password": PASSWORD, "ssl.ca.location": str(certs / "ca.pem")}


# --- brokers ---------------------------------------------------------------------------------------------------


def start_secure_copyless(scratch: Path, certs: Path) -> tuple[BrokerHandle, dict[str, str], str]:
    """copyless with PLAINTEXT and SASL_SSL listeners. Returns (handle, {protocol: bootstrap}, TLS path)."""
    config = scratch / "copyless.toml"
    config.write_text(
        '"listener.security.protocol.map" = "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL"\n'
        '"sasl.enabled.mechanisms" = "SCRAM-SHA-512"\n'
        f'"ssl.keystore.location" = "{certs / "broker.pem"}"\n'
        f'"ssl.truststore.location" = "{certs / "ca.pem"}"\n'
        f'"add.scram" = ["SCRAM-SHA-512=[name=bench,password={PASSWORD}]"]\n')
    data = scratch / "copyless-data"
    data.mkdir()
    handle = start_copyless(data, scratch / "copyless.log", extra_args=(
        "--config", str(config), "--listener", "PLAINTEXT=127.0.0.1:0", "--listener", "SASL_SSL=127.0.0.1:0"))
    text = (scratch / "copyless.log").read_text(errors="replace")
    serving = [line for line in text.splitlines() if "serving: listeners=" in line][-1]
    addresses = {}
    for item in serving.split("serving: listeners=")[1].split(" advertised=")[0].split():
        name, _, rest = item.partition("=")
        addresses[name] = rest.split("->")[0]
    path = "kTLS sendfile" if "TLS by kTLS" in text else "copying through OpenSSL"
    return handle, addresses, path


def start_secure_kafka(kafka_home: Path, scratch: Path, certs: Path) -> tuple[BrokerHandle, dict[str, str]]:
    """Kafka 3.9.1 (KRaft, one node) with PLAINTEXT and SASL_SSL/SCRAM-SHA-512 listeners, as copyless's."""
    plain, secure, controller = _free_port(), _free_port(), _free_port()
    data = scratch / "kafka-data"
    data.mkdir()
    properties = data / "server.properties"
    properties.write_text(f"""process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{plain},SASL_SSL://127.0.0.1:{secure},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{plain},SASL_SSL://127.0.0.1:{secure}
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL
inter.broker.listener.name=PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PEM
ssl.keystore.location={certs / "broker.pem"}
ssl.truststore.type=PEM
ssl.truststore.location={certs / "ca.pem"}
log.dirs={data / "log"}
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
file.delete.delay.ms=0
""")
    classpath = str(kafka_home / "libs" / "*")
    cluster_id = subprocess.run(["java", "-cp", classpath, "kafka.tools.StorageTool", "random-uuid"],
                                capture_output=True, text=True, timeout=120).stdout.strip().splitlines()[-1]
    subprocess.run(["java", "-cp", classpath, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c",
                    str(properties), "--add-scram", f"SCRAM-SHA-512=[name=bench,password={PASSWORD}]"],
                   check=True, capture_output=True, timeout=120)
    with open(data / "kafka.out", "ab") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(["java", "-Xmx1g", f"-Dlog4j.configuration=file:{kafka_home / 'log4j.properties'}",
                                    "-cp", classpath, "kafka.Kafka", str(properties)],
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    handle = BrokerHandle("kafka", f"127.0.0.1:{plain}", process=process, log_path=data / "kafka.out")
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        try:
            with socket.create_connection(("127.0.0.1", secure), timeout=1):
                break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                handle.stop()
                raise RuntimeError(f"Kafka did not start; see {data / 'kafka.out'}") from None
            time.sleep(0.5)
    return handle, {"PLAINTEXT": f"127.0.0.1:{plain}", "SASL_SSL": f"127.0.0.1:{secure}"}


# --- one workload ------------------------------------------------------------------------------------------------


def produce(bootstrap: str, config: dict, topic: str, size: int, count: int) -> float:
    """Seconds to produce ``count`` records of ``size`` bytes and flush (acks=1, linger 5 ms)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 5, "batch.size": 1 << 20,
                         "queue.buffering.max.kbytes": 1 << 20, **config})
    value = os.urandom(size)
    # Metadata (and, on SASL_SSL, the handshake and authentication) before the clock starts.
    producer.produce(topic, value)
    producer.flush(60)
    started = time.perf_counter()
    for _ in range(count - 1):
        while True:
            try:
                producer.produce(topic, value)
                break
            except BufferError:
                producer.poll(0.01)
    remaining = producer.flush(120)
    elapsed = time.perf_counter() - started
    if remaining:
        raise RuntimeError(f"{remaining} records not delivered")
    return elapsed


def consume(bootstrap: str, config: dict, topic: str, count: int) -> float:
    """Seconds to read ``count`` records from offset 0 (the connection is made before the clock starts)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "fetch.max.bytes": 50 << 20,
                         "max.partition.fetch.bytes": 10 << 20, **config})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        first = None
        while first is None:
            message = consumer.poll(5)
            if message is not None and not message.error():
                first = message
        started = time.perf_counter()
        seen = 1
        while seen < count:
            batch = consumer.consume(num_messages=min(10_000, count - seen), timeout=5)
            if not batch:
                raise RuntimeError(f"consumer stalled at {seen} of {count}")
            seen += sum(1 for m in batch if not m.error())
        return time.perf_counter() - started
    finally:
        consumer.close()


def run_one(bench: Benchmark, broker: BrokerHandle, name: str, protocol: str, bootstrap: str, certs: Path,
            size: int, total_bytes: int, round_number: int) -> dict:
    config = _client_config(protocol, certs)
    count = max(100, total_bytes // size)
    topic = f"sec-{name}-{protocol.lower()}-{size}-{uuid.uuid4().hex[:6]}"
    bench.settle()
    pid = broker.cpu_pid
    cpu_before = cpu_seconds(pid)
    produce_s = produce(bootstrap, config, topic, size, count)
    cpu_mid = cpu_seconds(pid)
    consume_s = consume(bootstrap, config, topic, count)
    cpu_after = cpu_seconds(pid)
    gigabytes = (count - 1) * size / 1e9
    return bench.row(round=round_number, broker=name, protocol=protocol, record_bytes=size, records=count,
                     produce_mb_per_s=round((count - 1) * size / produce_s / 1e6, 2),
                     consume_mb_per_s=round((count - 1) * size / consume_s / 1e6, 2),
                     broker_produce_cpu_s_per_gb=round((cpu_mid - cpu_before) / gigabytes, 3),
                     broker_consume_cpu_s_per_gb=round((cpu_after - cpu_mid) / gigabytes, 3))


# --- the run ----------------------------------------------------------------------------------------------------


def _median(values):
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else None


def main(argv=None) -> int:
    bench = Benchmark("security", "the cost of TLS: PLAINTEXT vs SASL_SSL/SCRAM-SHA-512, copyless vs Kafka 3.9.1",
                      argv, arguments=_arguments)
    rounds = bench.args.rounds or bench.pick(5, 1, 1)
    total_bytes = bench.pick(200_000_000, 30_000_000, 1_000_000)
    sizes = bench.pick(RECORD_SIZES, RECORD_SIZES, (1000,))
    kafka_home = bench.args.kafka_home
    use_kafka = not bench.tiny and (kafka_home / "libs").is_dir() and shutil.which("java") is not None
    if not use_kafka:
        bench.note("Apache Kafka not measured: " + ("tiny run" if bench.tiny else f"no Kafka at {kafka_home}"))
    brokers: dict[str, tuple[BrokerHandle, dict[str, str]]] = {}
    with bench.scratch_dir() as scratch:
        certs = scratch / "certs"
        subprocess.run([str(REPO_ROOT / "cluster" / "make-certs.sh"), str(certs), "broker:localhost,IP:127.0.0.1"],
                       check=True, capture_output=True, timeout=60)
        try:
            handle, addresses, tls_path = start_secure_copyless(scratch, certs)
            brokers["copyless"] = (handle, addresses)
            bench.note(f"copyless served SASL_SSL fetches by {tls_path}")
            if use_kafka:
                brokers["kafka"] = start_secure_kafka(kafka_home, scratch, certs)
            names = list(brokers)
            with bench.progress(rounds * len(sizes) * len(names) * len(PROTOCOLS), "runs") as bar:
                for round_number in range(1, rounds + 1):
                    order = names if round_number % 2 else list(reversed(names))
                    for size in sizes:
                        for name in order:
                            handle, addresses = brokers[name]
                            for protocol in PROTOCOLS:
                                run_one(bench, handle, name, protocol, addresses[protocol], certs, size,
                                        total_bytes, round_number)
                                bar.advance()
        finally:
            for handle, _addresses in brokers.values():
                handle.stop()
    ratios = _tables(bench, sizes, list(brokers), rounds)
    bench.finish(ratios=ratios, extra={"tls_path": tls_path, "kafka": use_kafka},
                 columns=["round", "broker", "protocol", "record_bytes", "records", "produce_mb_per_s",
                          "consume_mb_per_s", "broker_produce_cpu_s_per_gb", "broker_consume_cpu_s_per_gb"],
                 chart=lambda fig: _chart(fig, bench.rows, sizes, list(brokers)))
    return 0


def _rows(bench, **match):
    return [r for r in bench.rows if all(r.get(k) == v for k, v in match.items())]


def _tables(bench: Benchmark, sizes, names, rounds) -> dict:
    metrics = ("produce_mb_per_s", "consume_mb_per_s", "broker_produce_cpu_s_per_gb", "broker_consume_cpu_s_per_gb")
    medians = []
    for size in sizes:
        for name in names:
            for protocol in PROTOCOLS:
                rows = _rows(bench, broker=name, protocol=protocol, record_bytes=size)
                medians.append({"record_bytes": size, "broker": name, "protocol": protocol,
                                **{m: _median([r[m] for r in rows]) for m in metrics}})
    bench.table("Medians over rounds", medians)
    ratios: dict = {}
    comparisons = []
    pairs = [(f"{name} SASL_SSL/PLAINTEXT", dict(broker=name, protocol="SASL_SSL"),
              dict(broker=name, protocol="PLAINTEXT")) for name in names]
    if "kafka" in names:
        pairs += [(f"copyless/kafka {protocol}", dict(broker="copyless", protocol=protocol),
                   dict(broker="kafka", protocol=protocol)) for protocol in PROTOCOLS]
    for label, top, bottom in pairs:
        for size in sizes:
            for metric in metrics:
                per_round = []
                for round_number in range(1, rounds + 1):
                    a = _rows(bench, round=round_number, record_bytes=size, **top)
                    b = _rows(bench, round=round_number, record_bytes=size, **bottom)
                    if a and b and b[0][metric]:
                        per_round.append(a[0][metric] / b[0][metric])
                interval = median_interval(per_round)
                median = _median(per_round)
                ratios[f"{label} {metric} {size}B"] = None if median is None else round(median, 3)
                comparisons.append({"comparison": label, "record_bytes": size, "metric": metric,
                                    "median_ratio": None if median is None else round(median, 3),
                                    "interval": None if interval is None else [round(interval.low, 3),
                                                                               round(interval.high, 3)],
                                    "verdict": None if interval is None else interval.verdict(),
                                    "per_round": [round(x, 3) for x in per_round]})
    bench.table("Ratios within rounds (CPU ratios below 1 mean less CPU per GB)", comparisons)
    return ratios


def _chart(fig, rows, sizes, names) -> None:
    axes = fig.subplots(1, 2)
    for ax, metric in zip(axes, ("produce_mb_per_s", "consume_mb_per_s"), strict=True):
        labels, values = [], []
        for size in sizes:
            for name in names:
                for protocol in PROTOCOLS:
                    found = [r[metric] for r in rows if r["broker"] == name and r["protocol"] == protocol
                             and r["record_bytes"] == size]
                    labels.append(f"{name}\n{protocol}\n{size} B")
                    values.append(_median(found) or 0)
        ax.bar(range(len(values)), values)
        ax.set_xticks(range(len(values)))
        ax.set_xticklabels(labels, fontsize=6)
        ax.set_title(metric.replace("_", " "))
        ax.set_ylabel("MB/s (median over rounds)")
    fig.set_size_inches(14, 5)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
