"""Measure how long a consumer group stops consuming a member's partitions when the member dies or leaves.

    python -m tests.groups.rebalance_timing [--rounds 3] [--session-ms 3000 6000]

Not a test (no assertions; timings belong in reports, not in timed tests). Starts a broker subprocess, a
producer writing to all 6 partitions every 20 ms, and three members (kafka-python, aiokafka, confluent-kafka,
``tests/support/group_member.py``). Then, per round, it removes one member (SIGKILL for "death", SIGTERM for
"leave") and reports the time from that moment to the first record of one of the removed member's
partitions, produced after the removal, being consumed by another member; and the longest pause of the
whole group.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from itertools import pairwise
from pathlib import Path

from kafka import KafkaProducer

from tests.support.broker_process import BrokerProcess
from tests.support.groups import GROUP_CONFIG, Member, create_topic, read_events
from tests.support.polling import wait_until

PARTITIONS = 6
CLIENTS = ("kafka-python", "aiokafka", "confluent")


def start_broker(workdir: Path) -> BrokerProcess:
    config = workdir / "broker.toml"
    config.write_text(GROUP_CONFIG)
    # loop=None: the broker's own default event loop, as a user would run it.
    return BrokerProcess(data_dir=workdir / "data", log_path=workdir / "broker.log", loop=None,
                         extra_args=("--config", str(config))).start()


def produce_forever(bootstrap: str, topic: str, stop: threading.Event) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=0)
    sequence = 0
    while not stop.is_set():
        for partition in range(PARTITIONS):
            producer.send(topic, f"{time.monotonic():.6f}-{sequence}".encode(), partition=partition)
        sequence += 1
        time.sleep(0.02)
    producer.close()


def one_round(bootstrap: str, workdir: Path, round_id: str, mode: str, victim: str, session_ms: int) -> dict:
    topic, group = f"timing-{round_id}", f"timing-group-{round_id}"
    create_topic(bootstrap, topic, PARTITIONS)
    stop = threading.Event()
    producer = threading.Thread(target=produce_forever, args=(bootstrap, topic, stop), daemon=True)
    producer.start()
    paths = {c: workdir / f"{round_id}-{c}.jsonl" for c in CLIENTS}
    members = {c: Member(c, bootstrap, topic, group, paths[c], session_ms) for c in CLIENTS}
    try:
        def assignments():
            latest = {}
            for e in read_events(paths.values()):
                if e["event"] == "assigned":
                    latest[e["client"]] = e["partitions"]
            return latest

        wait_until(lambda: len(assignments()) == 3 and all(assignments().values())
                   and sorted(sum(assignments().values(), [])) == list(range(PARTITIONS)), what="a stable group",
                   timeout_s=90.0, interval_s=0.1)
        time.sleep(2.0)  # steady state
        owned = assignments()[victim]
        removed_at = time.monotonic()
        if mode == "death":
            members[victim].kill()
        else:
            members[victim].leave()

        def resumed():
            for e in read_events(p for c, p in paths.items() if c != victim):
                produced_at = float(e["value"].split("-")[0]) if e["event"] == "consumed" else 0
                if e["event"] == "consumed" and e["partition"] in owned and produced_at > removed_at:
                    return e["t"]
            return None

        resumed_at = wait_until(resumed, what="the victim's partitions to be consumed again", timeout_s=120.0,
                                interval_s=0.1)
        time.sleep(1.0)
        consumed_times = [e["t"] for e in read_events(paths.values()) if e["event"] == "consumed"
                          and removed_at - 1 <= e["t"]]
        gaps = [b - a for a, b in pairwise(consumed_times)]
        return {"mode": mode, "victim": victim, "session_ms": session_ms,
                "resume_s": resumed_at - removed_at, "longest_group_pause_s": max(gaps, default=0.0)}
    finally:
        stop.set()
        producer.join(5)
        for member in members.values():
            member.stop_quietly()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--session-ms", type=int, nargs="+", default=[3000, 6000])
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        broker = start_broker(workdir)
        bootstrap = broker.bootstrap
        results = []
        try:
            n = 0
            for session_ms in args.session_ms:
                for mode in ("death", "leave"):
                    for r in range(args.rounds):
                        victim = CLIENTS[(n + r) % 3]
                        result = one_round(bootstrap, workdir, f"{n}", mode, victim, session_ms)
                        n += 1
                        results.append(result)
                        print(f"{mode:5} of {victim:12} session={session_ms} ms: partitions consumed again after "
                              f"{result['resume_s'] * 1000:.0f} ms; longest group pause "
                              f"{result['longest_group_pause_s'] * 1000:.0f} ms", flush=True)
        finally:
            broker.stop()
        for session_ms in args.session_ms:
            for mode in ("death", "leave"):
                values = [r["resume_s"] * 1000 for r in results if r["mode"] == mode and r["session_ms"] == session_ms]
                print(f"summary {mode:5} session={session_ms} ms: median {statistics.median(values):.0f} ms, "
                      f"min {min(values):.0f}, max {max(values):.0f} (n={len(values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
