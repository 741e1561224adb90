"""Shared pieces of the consumer-group tests: a broker with fast group timings, topics and records through
kafka-python, member processes (``group_member.py``) and the events they write, and the coordinator's load.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kio.schema.errors import ErrorCode
from kio.schema.list_groups.v2 import request as lg_rq
from kio.schema.list_groups.v2 import response as lg_rs

from copyless.client.blocking import BlockingClient as GroupsClient
from tests.support.polling import wait_until
from tests.support.subprocesses import python_env

MEMBER_SCRIPT = Path(__file__).with_name("group_member.py")

# Short timings keep the suite fast: a 300 ms join window instead of 3 s, and sessions of 3 s allowed.
GROUP_CONFIG = """\
"group.initial.rebalance.delay.ms" = 300
"group.min.session.timeout.ms" = 1000
"log.segment.bytes" = 1048576
"""


def start_broker(broker_factory, tmp_path: Path, data_dir: Path | None = None):
    config = tmp_path / "groups.toml"
    config.write_text(GROUP_CONFIG)
    return broker_factory(extra_args=("--config", str(config)), data_dir=data_dir)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        admin.close()


def produce(bootstrap: str, topic: str, partitions: int, prefix: str, per_partition: int) -> set[str]:
    """``per_partition`` records to each partition, values ``prefix-partition-i``; returns the values."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    values = set()
    try:
        for i in range(per_partition):
            for partition in range(partitions):
                value = f"{prefix}-{partition}-{i}"
                producer.send(topic, value.encode(), partition=partition)
                values.add(value)
        producer.flush(timeout=30)
    finally:
        producer.close()
    return values


class Member:
    """A group member process running ``group_member.py``."""

    def __init__(self, client: str, bootstrap: str, topic: str, group: str, events: Path, session_ms: int):
        self.client = client
        self.events = events
        self.log = open(events.with_suffix(".log"), "ab")  # noqa: SIM115 (closed by stop(), after the process)
        self.process = subprocess.Popen(
            [sys.executable, str(MEMBER_SCRIPT), client, bootstrap, topic, group, str(events), str(session_ms)],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=python_env(),
        )

    def leave(self, timeout_s: float = 30) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=timeout_s)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop_quietly(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.log.close()

    def log_text(self) -> str:
        path = self.events.with_suffix(".log")
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def read_events(paths) -> list[dict]:
    events = []
    for path in paths:
        if Path(path).exists():
            for line in Path(path).read_text().splitlines():
                if line.strip():
                    events.append(json.loads(line))
    events.sort(key=lambda e: e["t"])
    return events


def wait_until_coordinator_active(bootstrap: str, timeout_s: float = 30.0) -> None:
    """Wait for the coordinator to finish replaying ``__consumer_offsets`` after a start.

    Meanwhile it answers COORDINATOR_LOAD_IN_PROGRESS, as Kafka does. Real clients retry that error; tests
    that send raw group requests call this first (a raw JoinGroup sent during the load failed one CI run).
    Any other ListGroups error fails at once.
    """
    host, port = bootstrap.rsplit(":", 1)

    def loaded() -> bool:
        with GroupsClient(host, int(port)) as client:
            code = client.request(lg_rq.ListGroupsRequest(), lg_rs.ListGroupsResponse).error_code
        assert code in (ErrorCode.none, ErrorCode.coordinator_load_in_progress), f"ListGroups: {code!r}"
        return code == ErrorCode.none

    wait_until(loaded, what="the group coordinator to load", timeout_s=timeout_s, interval_s=0.05)


def recommitted_consumptions(events: list[dict]) -> list[dict]:
    """Consumptions of a record below an offset some member had already committed for its partition.

    A commit event is written only after the broker acknowledged it, and every event carries the system-wide
    monotonic time, so "committed before consumed" is an order between events.
    """
    committed: dict[int, int] = {}
    violations = []
    for event in events:
        if event["event"] == "committed":
            for partition, offset in event["offsets"].items():
                committed[int(partition)] = max(committed.get(int(partition), 0), offset)
        elif event["event"] == "consumed" and event["offset"] < committed.get(event["partition"], 0):
            violations.append(event)
    return violations
