"""The single-broker container (docker-compose.single.yml) on the real Docker engine, driven from the host.

Invariants: from a clean state (no container, no volume of the project) `up` gives a healthy broker that the
host reaches on the published port, advertising that same address; records produced from the host through
the project's CLI and client read back whole and in order; SIGTERM through `compose stop` ends in the
broker's clean shutdown; after `down` (containers and network gone, volume kept) and `up` the records are
still there and new ones continue the offsets.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from tests.docker import docker_harness as harness

pytestmark = pytest.mark.timeout(900)


def test_single_broker_from_a_clean_state_serves_the_host(compose_project):
    project = compose_project("single")
    assert project.volumes() == [] and project.container("copyless") is None

    project.timed_up(label="single broker")

    assert project.volumes() == [f"{project.name}_copyless-data"]
    bootstrap = project.bootstrap()
    # The probe the healthcheck runs inside the container also passes from the host, through the port.
    health = harness.run([sys.executable, str(harness.CLUSTER_DIR / "health.py"), bootstrap], check=False)
    assert health.returncode == 0, health.stderr
    if shutil.which("kcat"):
        assert harness.metadata_brokers(bootstrap) == {0: bootstrap}

    # The CLI from the host: stdin lines in, the same lines out.
    lines = [f"line-{i}" for i in range(50)]
    project.cli("produce", "-b", bootstrap, "cli-topic", input_text="\n".join(lines) + "\n")
    # --json: one object per record on stdout (the summary goes to stderr).
    out = project.cli("consume", "-b", bootstrap, "--from-beginning", "-e", "--json", "cli-topic").stdout.splitlines()
    records = [json.loads(line) for line in out]
    assert [(r["topic"], r["partition"], r["offset"], r["value"]) for r in records] == [
        ("cli-topic", 0, offset, line) for offset, line in enumerate(lines)]

    # The client library: keys, offsets and values.
    values = [f"value-{i}".encode() * 10 for i in range(200)]
    acknowledged = harness.produce(bootstrap, "client-topic", values)
    assert acknowledged == [(0, offset) for offset in range(len(values))]
    records = harness.consume(bootstrap, "client-topic", [0], len(values))
    assert [(offset, key, value) for _, offset, key, value in records] == [
        (offset, b"k%d" % offset, value) for offset, value in enumerate(values)
    ]


def test_single_broker_keeps_its_data_across_down_and_up(compose_project):
    project = compose_project("single")
    project.timed_up(label="single broker")
    first = [b"before-%d" % i for i in range(100)]
    assert harness.produce(project.bootstrap(), "kept", first)[-1] == (0, len(first) - 1)

    # stop = SIGTERM with the grace period: the broker must shut down cleanly, not be killed at the deadline.
    project.stop()
    state = project.wait_state("copyless", ("exited",))
    logs = project.logs("copyless")
    assert state.exit_code == 0, logs[-3000:]
    assert "clean-shutdown marker written" in logs, logs[-3000:]

    project.down()
    assert project.container("copyless") is None
    assert project.volumes() == [f"{project.name}_copyless-data"]

    project.timed_up(label="single broker, second up")
    second = [b"after-%d" % i for i in range(10)]
    assert harness.produce(project.bootstrap(), "kept", second) == [(0, len(first) + i) for i in range(len(second))]
    records = harness.consume(project.bootstrap(), "kept", [0], len(first) + len(second))
    assert [(offset, value) for _, offset, _, value in records] == list(enumerate(first + second))
