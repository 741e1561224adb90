"""Three real clients in one consumer group on a 6-partition topic: kafka-python, aiokafka and confluent-kafka.

Each member runs in its own process (``tests/support/group_member.py``) with manual, synchronous commits. The
test checks, on a real broker subprocess:

- every produced record is consumed by the group, and all three members got partitions;
- when a member leaves (SIGTERM: its client sends LeaveGroup), records produced afterwards to every
  partition, including the ones it owned, are consumed by the two others;
- when a member is killed with SIGKILL (no LeaveGroup), the broker removes it at its session timeout and its
  partitions move to the last member, which then consumes everything produced afterwards;
- no record below an offset the group had committed for its partition is ever consumed again.
"""

from __future__ import annotations

import time

import pytest

from tests.support.groups import Member, create_topic, produce, read_events, recommitted_consumptions, start_broker
from tests.support.polling import wait_until

PARTITIONS = 6
SESSION_MS = 3000


@pytest.mark.timeout(240)
def test_three_clients_share_leave_and_die(broker_factory, tmp_path):
    broker = start_broker(broker_factory, tmp_path)
    topic, group = "mixed", "mixed-group"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    produced = produce(broker.bootstrap, topic, PARTITIONS, "a", 50)

    paths = {name: tmp_path / f"{name}.jsonl" for name in ("kafka-python", "aiokafka", "confluent")}
    members = {name: Member(name, broker.bootstrap, topic, group, path, SESSION_MS) for name, path in paths.items()}

    def events():
        return read_events(paths.values())

    def consumed_values(since_t: float = 0.0) -> set[str]:
        return {e["value"] for e in events() if e["event"] == "consumed" and e["t"] >= since_t}

    def diagnostics() -> str:
        return "\n".join(f"--- {m.client}\n{m.log_text()}" for m in members.values()) + \
            f"\n--- broker\n{broker.log_tail(3000)}"

    def latest_assignment(client: str) -> list[int]:
        assigned = [e for e in events() if e["event"] == "assigned" and e["client"] == client]
        return assigned[-1]["partitions"] if assigned else []

    try:
        # 1. All three share the topic and the group consumes every record.
        wait_until(lambda: produced <= consumed_values(), what="the group to consume phase a", timeout_s=90.0,
                   interval_s=0.1, detail=diagnostics)
        wait_until(lambda: all(latest_assignment(c) for c in members), what="all three members to own partitions",
                   timeout_s=60.0, interval_s=0.1, detail=diagnostics)
        more = produce(broker.bootstrap, topic, PARTITIONS, "b", 20)
        wait_until(lambda: more <= consumed_values(), what="phase b", timeout_s=60.0, interval_s=0.1,
                   detail=diagnostics)
        owners_b = {c: latest_assignment(c) for c in members}
        assert sorted(p for ps in owners_b.values() for p in ps) == list(range(PARTITIONS)), owners_b

        # 2. aiokafka leaves gracefully: everything produced afterwards is consumed by the other two.
        left_partitions = owners_b["aiokafka"]
        members["aiokafka"].leave()
        left_at = time.monotonic()
        after_leave = produce(broker.bootstrap, topic, PARTITIONS, "c", 20)
        wait_until(lambda: after_leave <= consumed_values(left_at), what="the others to consume phase c",
                   timeout_s=60.0, interval_s=0.1, detail=diagnostics)
        takers = {e["client"] for e in events() if e["event"] == "consumed" and e["t"] >= left_at
                  and e["value"].startswith("c-") and e["partition"] in left_partitions}
        assert takers and takers <= {"kafka-python", "confluent"}, takers

        # 3. kafka-python is killed: after its session timeout the confluent member takes everything.
        members["kafka-python"].kill()
        killed_at = time.monotonic()
        after_kill = produce(broker.bootstrap, topic, PARTITIONS, "d", 20)
        wait_until(lambda: after_kill <= consumed_values(killed_at), what="confluent to consume phase d",
                   timeout_s=90.0, interval_s=0.1, detail=diagnostics)
        consumers_d = {e["client"] for e in events() if e["event"] == "consumed" and e["value"].startswith("d-")}
        assert consumers_d == {"confluent"}, consumers_d
        assert latest_assignment("confluent") == list(range(PARTITIONS))

        # 4. Every record produced was consumed, and nothing the group committed was consumed again.
        assert produced | more | after_leave | after_kill <= consumed_values()
        violations = recommitted_consumptions(events())
        assert not violations, f"committed records consumed again: {violations[:5]}"
    finally:
        for member in members.values():
            member.stop_quietly()
