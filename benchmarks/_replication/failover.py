"""The write stall of a leader's death: a steady acks=all stream, its leader SIGKILLed, the silence timed.

Owns ``measure_failover``: one producer of the project's own client (idempotent, acks=all; the same client
against copyless and against Kafka) writes ``rate_per_s`` records a second into partition 0 of an RF-3 topic
for the whole run, and records when each acknowledgement arrives. Then, ``kills`` times: wait until the
partition has a full ISR and the stream has been acknowledged steadily for ``settle_s``; SIGKILL the
partition's current leader; poll Metadata every 50 ms for the new leader; wait until acknowledgements have
flowed again for a second; start the killed node again (it rejoins as a follower before the next kill).
Each kill gives one row: the new leader's id and when Metadata first named it, the stall
(``timeline.stall``: kill -> acknowledgements again), the silence itself, and how long the restarted node
took to rejoin the ISR. The producer keeps one clock (``time.monotonic``) for kills and acknowledgements.

Checks (raise): every record sent is acknowledged by the end (the client retries through the failover;
a record that failed is a broken promise, not a figure), and no two acknowledgements name one offset.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

from benchmarks._replication.clusters import Cluster
from benchmarks._replication.timeline import stall

METADATA_POLL_S = 0.05
# How long acknowledgements must flow again after the stall before it is called over: long enough that a
# second, shorter silence (the client finding the new leader, then its ISR settling) is inside the window.
RESUMED_FOR_S = 1.0
RESUME_TIMEOUT_S = 90.0  # Kafka: broker.session.timeout.ms 9 s plus its election; copyless: a 2 s lease


async def measure_failover(cluster: Cluster, topic: str, kills: int, *, rate_per_s: int = 200,
                           record_bytes: int = 100, settle_s: float = 2.0,
                           progress: Callable[[str], None] = lambda text: None) -> list[dict[str, Any]]:
    from copyless.client.producer import Producer

    loop = asyncio.get_running_loop()
    acked: list[float] = []
    offsets: list[int] = []
    failures: list[str] = []
    sent = 0

    def delivered(delivery) -> None:
        error = delivery.exception()
        if error is not None:
            failures.append(repr(error))
            return
        acked.append(time.monotonic())
        offsets.append(delivery.result().offset)

    value = os.urandom(record_bytes)
    producer = Producer(cluster.bootstrap, acks="all", linger_ms=1, retry_backoff_ms=50)
    await producer.start()
    stop = asyncio.Event()

    async def stream() -> None:
        nonlocal sent
        interval = 1.0 / rate_per_s
        next_at = loop.time()
        while not stop.is_set():
            delivery = await producer.send(topic, value, partition=0)
            delivery.add_done_callback(delivered)
            sent += 1
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    writer = asyncio.create_task(stream())
    rows = []
    try:
        for number in range(1, kills + 1):
            states = await asyncio.to_thread(cluster.wait_isr, topic, 3)
            leader = states[0][0]
            await _steady(acked, settle_s, writer)
            progress(f"{cluster.name}: kill {number}/{kills}, SIGKILL of leader {leader}")
            kill_at = time.monotonic()
            await asyncio.to_thread(cluster.nodes[leader].kill)
            new_leader, new_leader_s = await asyncio.to_thread(_await_new_leader, cluster, topic, leader, kill_at)
            await _resumed(acked, kill_at, writer)
            measured = stall(acked, kill_at)
            restart_at = time.monotonic()
            await asyncio.to_thread(cluster.restart, leader)
            await asyncio.to_thread(cluster.wait_isr, topic, 3)
            rows.append({"kill": number, "killed": leader, "new_leader": new_leader, "new_leader_s": new_leader_s,
                         "stall_s": measured.resumed_s, "gap_s": measured.gap_s,
                         "rejoin_s": time.monotonic() - restart_at, "failed_records": len(failures)})
        stop.set()
        await writer
        await producer.flush()
    finally:
        stop.set()
        if not writer.done():
            writer.cancel()
        await producer.close(timeout_s=30)
    if failures:
        raise RuntimeError(f"{cluster.name}: {len(failures)} of {sent} acks=all records failed through the "
                           f"failovers, the first: {failures[0]}")
    if len(acked) != sent or len(set(offsets)) != len(offsets):
        raise RuntimeError(f"{cluster.name}: {sent} records sent, {len(acked)} acknowledged at "
                           f"{len(set(offsets))} distinct offsets")
    for row in rows:
        row["records_acked"] = len(acked)
    return rows


async def _steady(acked: list[float], seconds: float, writer: asyncio.Task) -> None:
    """Until acknowledgements have arrived for ``seconds`` without a gap of more than 0.5 s."""
    deadline = time.monotonic() + RESUME_TIMEOUT_S
    while time.monotonic() < deadline:
        _raise_if_done(writer)
        now = time.monotonic()
        recent = [t for t in acked[-5000:] if t >= now - seconds]
        if recent and recent[0] - (now - seconds) < 0.5 and _no_gap(recent, now, 0.5):
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"acknowledgements not steady within {RESUME_TIMEOUT_S:.0f} s")


async def _resumed(acked: list[float], kill_at: float, writer: asyncio.Task) -> None:
    """Until acknowledgements after the kill have flowed without a break for ``RESUMED_FOR_S``."""
    deadline = kill_at + RESUME_TIMEOUT_S
    while time.monotonic() < deadline:
        _raise_if_done(writer)
        now = time.monotonic()
        after = [t for t in acked[-20000:] if t > kill_at]
        window = [t for t in after if t >= now - RESUMED_FOR_S]
        if window and window[0] - (now - RESUMED_FOR_S) < 0.2 and _no_gap(window, now, 0.2):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"acks=all writes not acknowledged again within {RESUME_TIMEOUT_S:.0f} s of the kill")


def _no_gap(times: list[float], now: float, limit: float) -> bool:
    return all(b - a <= limit for a, b in zip(times, times[1:] + [now], strict=True))


def _raise_if_done(writer: asyncio.Task) -> None:
    if writer.done():
        writer.result()  # the producer's error, if it failed
        raise RuntimeError("the producer stopped")


def _await_new_leader(cluster: Cluster, topic: str, old: int, kill_at: float) -> tuple[int | None, float | None]:
    """The first leader other than ``old`` Metadata names, and when (seconds after the kill)."""
    deadline = kill_at + RESUME_TIMEOUT_S
    while time.monotonic() < deadline:
        state = cluster.partition(topic, 0, timeout_s=1.0)
        if state is not None and state[0] >= 0 and state[0] != old:
            return state[0], time.monotonic() - kill_at
        time.sleep(METADATA_POLL_S)
    return None, None
