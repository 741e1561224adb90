"""A Jepsen-style check of the cluster's promises under overlapping faults (issue: replication that survives
overlapping faults, "The nemesis and the checker").

Three brokers and an etcd, each on a host of its own (``tests.support.nemesis.stage``: network namespaces,
etcd behind a proxy that can slow it, each data dir on a tmpfs that can fill up); a topic of 3 partitions,
RF 3, min.insync.replicas 2. The workload (``tests.support.kafka_workload``): an idempotent acks=all
librdkafka producer, a plain consumer reading every partition from 0, and a consumer group of two members
(librdkafka and kafka-python processes) committing synchronously.

The nemesis runs a short schedule seeded from ``COPYLESS_JEPSEN_SEED`` (else at random, printed so a failing
run can be replayed): one step per core fault kind (kill -9, SIGSTOP past and within the lease, a leader cut
off from etcd, a follower cut off, slow etcd, power loss, two failovers 0-1000 ms apart), each overlapped by
a partner drawn from every kind. Then everything is healed and ``tests.support.checker`` judges the
history: no acknowledged record lost, duplicated or moved, no offset seen with two records, no read of a
record later truncated, sends and polls in order without skips, replicas byte-identical below the high
watermark, one leader per partition epoch, one owner per partition in the group. Besides the checker:
the group consumed every acknowledged record and committed nothing past the final log end, and followers
were served by sendfile. ``python -m benchmarks.nemesis`` runs the same thing for minutes.
"""

from __future__ import annotations

import os
import random

import pytest

from tests.support.groups import read_events
from tests.support.jepsen import run
from tests.support.nemesis import CORE_KINDS, KINDS, schedule, stage
from tests.support.netns import NetLab
from tests.support.topics import unique_topic

SEED_ENV = "COPYLESS_JEPSEN_SEED"
PARTITIONS = 3
# One step per core kind with its partner: 8 steps of 5-12 s with settling and calm, 80-110 s in all.
SCHEDULE_LIMIT_S = 130


@pytest.mark.timeout(600)
def test_acknowledged_records_survive_overlapping_faults(tmp_path):
    available, why = NetLab.available()
    if not available:
        pytest.skip(why)
    seed = int(os.environ.get(SEED_ENV) or random.randrange(10**6))
    print(f"nemesis seed {seed} (replay: {SEED_ENV}={seed})")
    topic = unique_topic("jepsen")
    with stage(tmp_path, topic, PARTITIONS, seed=seed) as st:
        result = run(st, schedule(seed, KINDS, PARTITIONS, first=CORE_KINDS), SCHEDULE_LIMIT_S, seed=seed,
                     workdir=tmp_path, max_steps=len(CORE_KINDS))
        print(result.report())
        replay = f"\n\nreplay with {SEED_ENV}={seed}\n{result.report()}"

        assert not result.anomalies, f"{len(result.anomalies)} anomalies: {result.anomaly_counts}{replay}"
        assert set(CORE_KINDS) <= set(result.injected), f"faults injected: {result.injected}{replay}"
        assert len(result.stream.acks) > 90 * 20, f"too few acknowledged records to mean much{replay}"
        assert not result.notes, f"the cluster did not recover: {result.notes}{replay}"
        # The group read everything and committed nothing past the final log end.
        assert any(o.member.startswith("member-") for o in result.history.ownership), "the group never formed"
        final = result.history.final
        beyond = [(e["client"], p, offset) for e in read_events([m.events for m in result.members])
                  if e["event"] == "committed" for p, offset in e["offsets"].items() if offset > len(final[int(p)])]
        assert not beyond, f"commits past the final log end: {beyond[:10]}{replay}"
        # Followers were served by sendfile.
        stats = {n: b.stats_json() for n, b in st.cluster.brokers.items()}
        assert {n: s["replica_copied_bytes"] for n, s in stats.items()} == {n: 0 for n in stats}
        assert sum(s["replica_sendfile_bytes"] for s in stats.values()) > 0
