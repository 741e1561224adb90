"""One Jepsen-style run: the workload of ``tests.support.kafka_workload`` on a ``tests.support.nemesis``
stage while the nemesis runs a schedule, then everything healed, read back and handed to
``tests.support.checker``. Shared by the suite's short schedule (tests/cluster/test_jepsen.py) and the soak
(``python -m benchmarks.nemesis``).

After the last step every fault is healed and the run waits (bounded, noted when it runs out) for every
replica to be back in every ISR, for the replicas to hold the same bytes, for the poller and the group to
have read up to the final high watermarks; the checker then judges whatever state was reached, so a
replica that never caught up is a ``replica-divergence``, not a hang.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.checker import Anomaly, History, check, counts
from tests.support.groups import Member, read_events
from tests.support.kafka_workload import AckedStream, Poller, history_of, read_partition
from tests.support.log_files import read_partition_log
from tests.support.nemesis import Nemesis, Stage, Step

__all__ = ["RunResult", "run"]


@dataclass
class RunResult:
    seed: int
    history: History
    anomalies: list[Anomaly]
    injected: dict[str, int]
    timeline: list[str]
    stream: AckedStream
    members: list[Member]
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def anomaly_counts(self) -> dict[str, int]:
        return counts(self.anomalies)

    def report(self, limit: int = 20) -> str:
        lines = [f"seed {self.seed}: {len(self.stream.sends)} sent, {len(self.stream.acks)} acknowledged, "
                 f"{len(self.stream.failed)} failed, {len(self.stream.fatal)} fatal producer errors; "
                 f"{len(self.history.polls)} records polled, {len(self.history.ownership)} group assignments; "
                 f"faults {self.injected}"]
        lines += [f"  anomaly {a}" for a in self.anomalies[:limit]]
        if len(self.anomalies) > limit:
            lines.append(f"  ... {len(self.anomalies) - limit} more")
        lines += [f"  note: {n}" for n in self.notes]
        lines += ["timeline:", *self.timeline]
        return "\n".join(lines)


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if condition():
                return True
        except Exception:  # noqa: BLE001 - a broker answering badly mid-recovery: ask again
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def run(stage: Stage, steps: Iterator[Step], seconds: float, *, seed: int, workdir: Path,
        max_steps: int | None = None, rate: float = 90.0, progress=None) -> RunResult:
    cluster, topic, partitions = stage.cluster, stage.topic, stage.partitions
    every_broker = ",".join(b.bootstrap for b in cluster.brokers.values())
    members = [Member(client, every_broker, topic, f"jepsen-{seed}", Path(workdir) / f"{client}.events", 10000)
               for client in ("confluent", "kafka-python")]
    stream = AckedStream(every_broker, topic, partitions, rate=rate)
    poller = Poller(every_broker, topic, partitions)
    nemesis = Nemesis(stage)
    notes: list[str] = []
    began = time.monotonic()
    try:
        stream.start()
        poller.start()
        time.sleep(3)  # writes flowing and the group formed before the first fault
        try:
            if progress is None:
                nemesis.run(steps, seconds, max_steps=max_steps)
            else:
                deadline = time.monotonic() + seconds
                for done, step in enumerate(steps):
                    if time.monotonic() >= deadline or (max_steps is not None and done >= max_steps):
                        break
                    nemesis.run_step(step)
                    progress(nemesis)
        finally:
            nemesis.heal_everything()
            stream.stop()
        nemesis.note(f"stream stopped: {stream.sent} sent, {len(stream.acks)} acknowledged, "
                     f"{len(stream.failed)} failed, fatal producer errors: {len(stream.fatal)}")

        if not _wait(lambda: cluster.wait_for_isr(topic, partitions, 3, timeout_s=1), 120):
            notes.append("the ISR of some partition was not whole 120 s after everything was healed")
        final = {p: read_partition(every_broker, topic, p) for p in range(partitions)}
        for p, records in final.items():
            if [offset for offset, _v in records] != list(range(len(records))):
                notes.append(f"partition {p} read back with gaps")

        def replicas_agree() -> bool:
            for p in range(partitions):
                logs = {b"".join(b.data for b in read_partition_log(broker.data_dir, topic, p))
                        for broker in cluster.brokers.values()}
                if len(logs) != 1:
                    return False
            return True
        if not _wait(replicas_agree, 60):
            notes.append("the replicas did not converge to the same bytes within 60 s")
        if not _wait(lambda: poller.caught_up(final), 60):
            notes.append("the poller did not read up to the final high watermarks within 60 s "
                         f"({poller.progress(final)})")
        poller.stop()
        poller_errors = sorted(set(poller.errors))
        if poller_errors:
            notes.append(f"poller errors: {poller_errors[:5]}")

        acked_values = {a.value.decode() for a in stream.acks}

        def group_consumed_everything() -> bool:
            seen = {e["value"] for e in read_events([m.events for m in members]) if e["event"] == "consumed"}
            return acked_values <= seen
        if not _wait(group_consumed_everything, 120):
            notes.append("the group did not consume every acknowledged record within 120 s")
        for member in members:
            if member.process.poll() is not None:
                notes.append(f"group member {member.client} died: {member.log_text()[-500:]}")
                continue
            try:
                member.leave()
            except subprocess.TimeoutExpired:
                # librdkafka's synchronous commit has no deadline: a member whose coordinator never
                # answers stays in it. Noted (a liveness finding), and the member is killed.
                notes.append(f"group member {member.client} did not leave within 30 s of SIGTERM: "
                             f"{member.log_text()[-400:]}")
                member.kill()
        history = history_of(cluster, topic, partitions, stream, poller, final,
                             member_events=[m.events for m in members])
        anomalies = check(history)
    finally:
        for member in members:
            member.stop_quietly()
        poller.stop()
    return RunResult(seed, history, anomalies, dict(nemesis.injected), nemesis.timeline, stream, members, notes,
                     time.monotonic() - began)
