"""The failover demo (cluster/demo.sh): its verdict, and the demo run against the compose cluster on the real engine.

Invariants: the verdict (``check`` in cluster/demo.py, pure) passes a run where every acknowledged record was read
once at its acknowledged offset, and fails one that lost a record, wrote one twice, acknowledged a partition's
records out of order, or read other bytes at an acknowledged offset; a group's redelivery of an offset it had read
(resuming from its last commit) is counted, not failed. Against a fresh compose cluster the demo kills partition
0's leader, a new leader takes writes within seconds, the killed broker comes back into the ISR, and the demo ends
with exit status 0 and its PASS verdict, nothing acknowledged lost.

The verdict tests need no Docker; the demo run needs the engine and the brokers' etcd mode (skips otherwise).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

from tests.docker import docker_harness as harness


def _demo_module():
    """cluster/demo.py is a script, not an installed module: loaded from its path."""
    spec = importlib.util.spec_from_file_location("copyless_cluster_demo", harness.CLUSTER_DIR / "demo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


demo = _demo_module()


def _clean_run(records_per_partition: int = 4):
    """Acks and deliveries of a run with nothing wrong: record i to partition i % 3, offsets in send order."""
    acks, deliveries = [], []
    for sequence in range(3 * records_per_partition):
        partition, offset = sequence % 3, sequence // 3
        value = f"v{sequence}".encode()
        acks.append(demo.Ack(sequence, partition, offset, value))
        deliveries.append(demo.Delivery(partition, offset, value))
    return acks, deliveries


def test_verdict_passes_a_clean_run_and_counts_a_redelivery():
    acks, deliveries = _clean_run()
    verdict = demo.check(acks, deliveries)
    assert verdict.ok and verdict.read == 12 and verdict.per_partition == {0: 4, 1: 4, 2: 4}
    assert verdict.summary().startswith("PASS: 12 records acknowledged")

    # The group resumed partition 1 from an older commit: offsets 1..3 delivered again, same bytes.
    again = [d for d in deliveries if d.partition == 1 and d.offset >= 1]
    verdict = demo.check(acks, deliveries + again)
    assert verdict.ok and verdict.redelivered == 3
    assert "3 read twice by the group" in verdict.summary()


def test_verdict_fails_a_lost_record():
    acks, deliveries = _clean_run()
    deliveries = [d for d in deliveries if (d.partition, d.offset) != (2, 3)]
    verdict = demo.check(acks, deliveries)
    assert not verdict.ok and [(a.partition, a.offset) for a in verdict.lost] == [(2, 3)]
    assert verdict.summary().startswith("FAIL: 1 acknowledged records lost (first: partition 2 offset 3)")


def test_verdict_fails_a_record_written_twice():
    acks, deliveries = _clean_run()
    # The log holds v3 (partition 0, offset 1) again at offset 4: a retry the broker did not deduplicate.
    deliveries.append(demo.Delivery(0, 4, b"v3"))
    verdict = demo.check(acks, deliveries)
    assert not verdict.ok and verdict.duplicated == [(b"v3", [(0, 1), (0, 4)])]


def test_verdict_fails_acknowledgements_out_of_send_order():
    acks, deliveries = _clean_run()
    # Records 0 and 3 (both partition 0) acknowledged at swapped offsets: the log reordered the producer's sends.
    swapped = {0: 1, 3: 0}
    acks = [demo.Ack(a.sequence, a.partition, swapped.get(a.sequence, a.offset), a.value) for a in acks]
    deliveries = [demo.Delivery(0, 0, b"v3"), demo.Delivery(0, 1, b"v0")] + [
        d for d in deliveries if (d.partition, d.offset) not in ((0, 0), (0, 1))]
    verdict = demo.check(acks, deliveries)
    assert not verdict.ok and not verdict.lost
    assert verdict.out_of_order == ["partition 0: record 3 acknowledged at offset 0, after record 0 at 1"]


def test_verdict_fails_other_bytes_at_an_acknowledged_offset_and_an_empty_run():
    acks, deliveries = _clean_run()
    deliveries = [demo.Delivery(d.partition, d.offset, b"other" if (d.partition, d.offset) == (1, 0) else d.value)
                  for d in deliveries]
    verdict = demo.check(acks, deliveries)
    assert not verdict.ok and [(a.partition, a.offset, got) for a, got in verdict.mismatched] == [(1, 0, b"other")]
    assert not demo.check([], []).ok


@pytest.mark.slow  # a compose cluster's whole demo: the cluster tests of test_docker_cluster.py stay in CI
@pytest.mark.timeout(900)
@pytest.mark.usefixtures("cluster_mode")
def test_demo_ends_with_its_verdict_on_the_compose_cluster(compose_project):
    project = compose_project("cluster")
    project.timed_up(label="cluster (3 etcd + 3 brokers)")
    env = dict(os.environ, PYTHON=sys.executable)
    result = harness.run([str(harness.CLUSTER_DIR / "demo.sh"), "--project", project.name,
                          "--bootstrap", project.bootstrap(), "--json", "--timeout", "600"],
                         timeout_s=700, check=False, env=env)
    output = result.stdout + result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else {}
    harness.TIMINGS.append(f"demo ({project.name}): {summary.get('timeline')}")
    assert result.returncode == 0, output
    assert "\nverdict: PASS: " in result.stdout, output
    assert summary["ok"] is True and summary["lost"] == summary["duplicated"] == summary["out_of_order"] == 0
    assert summary["acknowledged"] > 0 and summary["read"] >= summary["acknowledged"]
    timeline = summary["timeline"]
    # The leader's etcd lease is 2 s: a new leader and a write through it within seconds (30: a loaded machine).
    assert 0 < timeline["new_leader"] < 30 and 0 < timeline["first_write"] < 30, timeline
    assert timeline["restart"] < timeline["healthy"] <= timeline["in_isr"], timeline
    # The killed broker is back in partition 0's ISR and serving.
    victim = harness.broker_service(summary["victim"])
    assert project.state(victim).health == "healthy"
    assert summary["victim"] in harness.describe_partitions(project.bootstrap(), summary["topic"])[0].isr
