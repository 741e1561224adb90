"""The client against the reference Apache Kafka broker, when asked for (``COPYLESS_REFERENCE_KAFKA=1``) and
the anchor is present: a check of the client's behaviour against Kafka itself, run by hand when the client
changes, not part of the default run (Kafka is a benchmark reference, never a dependency of the suite).

Starts ``../shared/anchors/kafka/run-kafka.sh PORT DIR`` (Kafka 3.9.1, KRaft, single node) on free ports
for this module, runs the same scenarios as against copyless, and kills it. Skipped, with the reason
printed, when the anchor directory or a Java runtime is missing: users of the project don't have it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.client import _client_scenarios as scenarios

ANCHOR = Path(__file__).resolve().parents[2].parent / "shared" / "anchors" / "kafka" / "run-kafka.sh"


def _free_port_pair() -> int:
    """A port P with P and P+1 free (run-kafka.sh puts the KRaft controller on P+1)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port >= 65535:
            continue
        try:
            with socket.socket() as first, socket.socket() as second:
                first.bind(("127.0.0.1", port))
                second.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


@pytest.fixture(scope="module")
def kafka(tmp_path_factory):
    if os.environ.get("COPYLESS_REFERENCE_KAFKA") != "1":
        pytest.skip("the reference Kafka run is opt-in: COPYLESS_REFERENCE_KAFKA=1")
    if not ANCHOR.exists():
        reason = f"reference Kafka not present at {ANCHOR}"
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
    if shutil.which("java") is None:
        reason = "reference Kafka present but no java runtime on PATH"
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
    port = _free_port_pair()
    data_dir = tmp_path_factory.mktemp("kafka")
    started = subprocess.run(
        [str(ANCHOR), str(port), str(data_dir)], capture_output=True, text=True, timeout=120
    )
    if started.returncode != 0:
        log = (data_dir / "kafka.out").read_text(errors="replace")[-3000:] if (data_dir / "kafka.out").exists() else ""
        pytest.fail(f"reference Kafka did not start: {started.stderr}\n{log}")
    pid = int(started.stdout.strip().splitlines()[-1])
    try:
        yield f"127.0.0.1:{port}"
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run(coroutine):
    import uvloop

    return uvloop.run(coroutine)


def test_round_trip_all_codecs_against_kafka(kafka):
    run(scenarios.round_trip_all_codecs(kafka))


def test_idempotent_producer_against_kafka(kafka):
    run(scenarios.idempotent_producer_stamps_batches(kafka))


def test_offsets_and_seeks_against_kafka(kafka):
    run(scenarios.offsets_and_seeks(kafka))


def test_large_record_against_kafka(kafka):
    run(scenarios.large_record_with_small_fetch_size(kafka))


@pytest.mark.parametrize("strategy", ["range", "roundrobin"])
def test_consumer_group_against_kafka(kafka, strategy):
    run(asyncio.wait_for(scenarios.group_members_share_partitions(kafka, strategy), 120))


def test_auto_commit_and_reset_policies_against_kafka(kafka):
    run(asyncio.wait_for(scenarios.auto_commit_and_reset_policies(kafka), 120))
