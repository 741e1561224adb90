"""The failover demo: kill the broker leading a partition of the running compose cluster, and show that every
acknowledged record survives.

Against the cluster that ``cluster/up.sh`` started (docker-compose.yml: etcd1-3, broker1-3), from the host:

1. creates a topic with 3 partitions, replication factor 3 and min.insync.replicas 2 (``copyless topics
   create``) and waits until every partition has its three replicas in sync;
2. runs an idempotent acks=all producer (``copyless.Producer``, one record every ``--interval-ms`` to
   partitions 0, 1, 2 in turn) and a consumer group (``copyless.Consumer``) reading the topic;
3. ``docker kill``s the container of the broker leading partition 0 (SIGKILL: no clean shutdown), then prints
   a timeline relative to that kill: the new leader and its leader epoch (read from etcd, where the
   controller writes it), the first write to partition 0 acknowledged after the kill, ``docker start`` of
   the killed container, its healthcheck passing, and the broker back in the partition's ISR;
4. stops producing, lets the group read to the end, and prints a verdict: every acknowledged record read
   back exactly once, at the offset its acknowledgement named, with offsets increasing in each partition.

Exit status: 0 only on that verdict; 1 when a check failed (the verdict line says which); 2 when the demo
could not run (no cluster, no docker). ``--json`` adds one line with the timeline and the verdict's counts.

Layout: ``check`` is the verdict, a pure function of what the producer had acknowledged and what the group
read (no I/O; the tests feed it lost, duplicated and reordered records). ``Compose`` drives the docker
command line (containers found by their compose labels, so compose 1.29 and v2 both work) through asyncio
subprocesses; the rest is the asyncio shell: producer and consumer tasks, and ``failover``, which kills,
polls metadata and restarts. Nothing outlives the demo but its topic (``demo-<time>``, so runs never meet
each other's data) and its group's committed offsets.

Usage: cluster/demo.sh [--project NAME] [--bootstrap HOST:PORT,...] [--interval-ms N] [--timeout S] [--json]
                      [--secure | -F PROPERTIES]

Against ``cluster/up.sh --secure``, ``--secure`` connects with the project's ``cluster/.secure/<project>/
admin.properties`` (SASL_SSL, SCRAM-SHA-512, the cluster's CA); ``-F`` names another properties file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

PARTITIONS = 3
REPLICATION_FACTOR = 3
MIN_INSYNC_REPLICAS = 2
# The compose file's etcd layout root (no chroot in the --metadata URL) and its broker services.
ETCD_ROOT = "copyless"
# The clients' TLS and SASL settings (--secure / -F); None: PLAINTEXT.
SECURITY = None
ETCD_SERVICES = ("etcd1", "etcd2", "etcd3")
PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"
# Metadata is polled this often for the new leader and the ISR: timeline entries are accurate to about
# this plus one Metadata round trip (~5 ms here).
POLL_INTERVAL_S = 0.1
# Bounds on each phase. A leader's etcd lease is 2 s (broker.session.timeout.ms), so a new leader is
# expected within ~3 s; 60 s tolerates a loaded machine and still ends a broken run.
NEW_LEADER_TIMEOUT_S = 60.0
FIRST_WRITE_TIMEOUT_S = 60.0
HEALTHY_TIMEOUT_S = 120.0
ISR_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 90.0
# Writes go on this long before the kill (the group joins: group.initial.rebalance.delay.ms is 3 s in a
# cluster), between the first write after the kill and the restart, and after the broker rejoined.
WARM_UP_S = 5.0
DOWN_AFTER_FIRST_WRITE_S = 3.0
AFTER_REJOIN_S = 3.0


# ---- the verdict (pure) ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ack:
    """A record the producer sent (``sequence``: its send order) and the broker acknowledged."""

    sequence: int
    partition: int
    offset: int
    value: bytes


@dataclass(frozen=True)
class Delivery:
    """A record the consumer group handed to the application, in the order it did."""

    partition: int
    offset: int
    value: bytes


@dataclass
class Verdict:
    acknowledged: int
    read: int = 0  # distinct (partition, offset) read
    lost: list[Ack] = field(default_factory=list)  # acknowledged, never read at its offset
    mismatched: list[tuple[Ack, bytes]] = field(default_factory=list)  # read at its offset, other bytes
    duplicated: list[tuple[bytes, list[tuple[int, int]]]] = field(default_factory=list)  # one value, 2+ offsets
    out_of_order: list[str] = field(default_factory=list)  # offsets not increasing
    redelivered: int = 0  # deliveries of an offset already read, same bytes (group resumed from a commit)
    unacknowledged_present: int = 0  # records in the log whose send was not acknowledged (a failed attempt)
    per_partition: dict[int, int] = field(default_factory=dict)  # acknowledged records per partition

    @property
    def ok(self) -> bool:
        return self.acknowledged > 0 and not (self.lost or self.mismatched or self.duplicated or self.out_of_order)

    def summary(self) -> str:
        shares = ", ".join(f"{p}: {n:,}" for p, n in sorted(self.per_partition.items()))
        if self.ok:
            line = (f"PASS: {self.acknowledged:,} records acknowledged ({shares}); every one read back exactly "
                    f"once, at its acknowledged offset, in order; nothing lost, nothing duplicated")
        else:
            problems = []
            if self.acknowledged == 0:
                problems.append("nothing was acknowledged")
            if self.lost:
                problems.append(f"{len(self.lost):,} acknowledged records lost (first: partition "
                                f"{self.lost[0].partition} offset {self.lost[0].offset})")
            if self.mismatched:
                ack, got = self.mismatched[0]
                problems.append(f"{len(self.mismatched):,} offsets hold other bytes than acknowledged (first: "
                                f"partition {ack.partition} offset {ack.offset}: {ack.value!r} != {got!r})")
            if self.duplicated:
                value, places = self.duplicated[0]
                problems.append(f"{len(self.duplicated):,} records written twice (first: {value!r} at {places})")
            if self.out_of_order:
                problems.append(f"{len(self.out_of_order):,} out of order (first: {self.out_of_order[0]})")
            line = f"FAIL: {'; '.join(problems)}; {self.acknowledged:,} acknowledged, {self.read:,} read"
        extras = []
        if self.redelivered:
            extras.append(f"{self.redelivered:,} read twice by the group (resumed from its last committed offset)")
        if self.unacknowledged_present:
            extras.append(f"{self.unacknowledged_present:,} records whose send failed are in the log too")
        return line + (f" ({'; '.join(extras)})" if extras else "")


def check(acknowledged: list[Ack], deliveries: list[Delivery]) -> Verdict:
    """The demo's verdict on one run.

    Args:
        acknowledged: every record the producer saw acknowledged, in any order.
        deliveries: every record the group delivered, in delivery order (redeliveries included).

    Returns: a Verdict; ``ok`` when each acknowledged record was read at its acknowledged partition and offset
    with its bytes, no value sits at two offsets, each partition's acknowledged offsets increase with send
    order, and the group's first readings of a partition's offsets increase. A delivery of an offset already
    read (after a rebalance the group resumes from its last commit) is counted, not a failure, when its bytes
    are the ones read before. Pure; O(records).
    """
    verdict = Verdict(acknowledged=len(acknowledged))
    read: dict[tuple[int, int], bytes] = {}
    highest: dict[int, int] = {}
    for delivery in deliveries:
        place = (delivery.partition, delivery.offset)
        if place in read:
            if read[place] == delivery.value:
                verdict.redelivered += 1
            else:
                verdict.out_of_order.append(f"partition {delivery.partition} offset {delivery.offset} read twice "
                                            f"with different bytes")
            continue
        if delivery.offset <= highest.get(delivery.partition, -1):
            verdict.out_of_order.append(f"partition {delivery.partition}: offset {delivery.offset} first read "
                                        f"after offset {highest[delivery.partition]}")
        highest[delivery.partition] = max(delivery.offset, highest.get(delivery.partition, -1))
        read[place] = delivery.value
    verdict.read = len(read)

    places_of_value: dict[bytes, list[tuple[int, int]]] = {}
    for place, value in read.items():
        places_of_value.setdefault(value, []).append(place)
    verdict.duplicated = [(value, sorted(places)) for value, places in places_of_value.items() if len(places) > 1]

    acknowledged_values = set()
    for ack in acknowledged:
        acknowledged_values.add(ack.value)
        verdict.per_partition[ack.partition] = verdict.per_partition.get(ack.partition, 0) + 1
        got = read.get((ack.partition, ack.offset))
        if got is None:
            verdict.lost.append(ack)
        elif got != ack.value:
            verdict.mismatched.append((ack, got))
    verdict.lost.sort(key=lambda a: (a.partition, a.offset))
    verdict.unacknowledged_present = sum(1 for value in read.values() if value not in acknowledged_values)

    by_partition: dict[int, list[Ack]] = {}
    for ack in sorted(acknowledged, key=lambda a: a.sequence):
        by_partition.setdefault(ack.partition, []).append(ack)
    for partition, acks in by_partition.items():
        for before, after in pairwise(acks):
            if after.offset <= before.offset:
                verdict.out_of_order.append(f"partition {partition}: record {after.sequence} acknowledged at "
                                            f"offset {after.offset}, after record {before.sequence} at {before.offset}")
    return verdict


# ---- docker ---------------------------------------------------------------------------------------------------


class DemoError(RuntimeError):
    """The demo cannot go on (no cluster, a command failed, a phase timed out)."""


async def _run(*cmd: str, timeout_s: float = 60.0, check: bool = True) -> tuple[int, str]:
    """Run a command without blocking the loop; returns (exit status, stdout + stderr)."""
    process = await asyncio.create_subprocess_exec(
        *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        async with asyncio.timeout(timeout_s):
            output, _ = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise DemoError(f"{' '.join(cmd)} did not finish within {timeout_s:.0f} s") from None
    text = output.decode(errors="replace")
    if check and process.returncode != 0:
        raise DemoError(f"{' '.join(cmd)} exited with {process.returncode}: {text.strip()}")
    return process.returncode, text


@dataclass
class Compose:
    """The compose project's containers, found by label (compose 1.29 names them p_s_1, v2 p-s-1)."""

    project: str

    async def container(self, service: str) -> str:
        _, out = await _run("docker", "ps", "-a", "-q", "--filter", f"label={PROJECT_LABEL}={self.project}",
                            "--filter", f"label={SERVICE_LABEL}={service}")
        ids = out.split()
        if len(ids) != 1:
            raise DemoError(f"compose project {self.project!r} has {len(ids)} containers for {service} "
                            f"(is the cluster up? cluster/up.sh)")
        return ids[0]

    async def status(self, service: str) -> tuple[str, str]:
        """(State.Status, Health.Status) of the service's container."""
        _, out = await _run("docker", "inspect", "--format",
                            "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}",
                            await self.container(service))
        status, _, health = out.strip().partition(" ")
        return status, health

    async def kill(self, service: str) -> None:
        await _run("docker", "kill", await self.container(service))

    async def start(self, service: str) -> None:
        await _run("docker", "start", await self.container(service))

    async def etcdctl(self, *args: str) -> str:
        """etcdctl inside the first running etcd container, against the whole etcd cluster."""
        endpoints = ",".join(f"http://{name}:2379" for name in ETCD_SERVICES)
        last = None
        for service in ETCD_SERVICES:
            try:
                if (await self.status(service))[0] != "running":
                    continue
                _, out = await _run("docker", "exec", await self.container(service), "etcdctl",
                                    f"--endpoints={endpoints}", "--command-timeout=5s", *args, timeout_s=30)
                return out
            except DemoError as exc:
                last = exc
        raise DemoError(f"no etcd container answered etcdctl {' '.join(args)}: {last}")

    async def partition_state(self, topic: str, partition: int) -> dict:
        """The partition's state as the controller wrote it in etcd: leader, leader_epoch, isr."""
        cluster_id = (await self.etcdctl("get", f"/{ETCD_ROOT}/cluster_id", "--print-value-only")).strip()
        cluster_id = cluster_id.strip('"')
        out = await self.etcdctl("get", f"/{ETCD_ROOT}/{cluster_id}/partitions/{topic}/{partition}",
                                 "--print-value-only")
        try:
            return json.loads(out)
        except ValueError:
            raise DemoError(f"no partition state in etcd for {topic}-{partition}: {out.strip()!r}") from None


def broker_service(node_id: int) -> str:
    """docker-compose.yml runs node ids 1, 2, 3 as services broker1, broker2, broker3."""
    return f"broker{node_id}"


# ---- the run --------------------------------------------------------------------------------------------------


class Timeline:
    """Events with their time relative to the kill; printed in time order (``hold`` keeps an event back until
    ``show``, for events detected in another order than they happened)."""

    def __init__(self) -> None:
        self.kill_at: float | None = None
        self.events: list[tuple[str, float, str]] = []  # (name, seconds after the kill, text)
        self._held: list[tuple[str, float, str]] = []

    def add(self, name: str, text: str, at: float | None = None, *, hold: bool = False) -> None:
        assert self.kill_at is not None
        event = (name, (time.monotonic() if at is None else at) - self.kill_at, text)
        self.events.append(event)
        self._held.append(event)
        if not hold:
            self.show()

    def show(self) -> None:
        for _, seconds, text in sorted(self._held, key=lambda event: event[1]):
            print(f"  {seconds:+8.3f} s  {text}", flush=True)
        self._held.clear()


@dataclass
class Run:
    bootstrap: str
    topic: str
    interval_s: float
    acknowledged: list[Ack] = field(default_factory=list)
    send_times: dict[int, float] = field(default_factory=dict)  # sequence -> monotonic time of the send
    ack_times: dict[int, float] = field(default_factory=dict)  # sequence -> monotonic time of the ack
    producer_stats: dict = field(default_factory=dict)
    failed: list[tuple[int, str]] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    sent: int = 0
    stop_producing: asyncio.Event = field(default_factory=asyncio.Event)
    stop_consuming: asyncio.Event = field(default_factory=asyncio.Event)
    first_ack_after_kill: asyncio.Event = field(default_factory=asyncio.Event)
    kill_at: float | None = None
    drain_s: float = DRAIN_TIMEOUT_S  # how long the producer's close may wait for acknowledgements


async def produce(run: Run) -> None:
    """Send one record every ``interval_s`` (partitions 0, 1, 2 in turn) until told to stop; then flush, for
    at most DRAIN_TIMEOUT_S (a send not acknowledged by then counts as failed, never as acknowledged)."""
    from copyless import Producer

    producer = Producer(run.bootstrap, linger_ms=2, enable_idempotence=True, acks="all",
                        delivery_timeout_ms=int(DRAIN_TIMEOUT_S * 1000), security=SECURITY)
    await producer.start()
    try:
        next_at = time.monotonic()
        while not run.stop_producing.is_set():
            sequence = run.sent
            value = f"{run.topic}-{sequence:07d}".encode()
            run.send_times[sequence] = time.monotonic()
            delivery = await producer.send(run.topic, value, key=b"k%d" % sequence, partition=sequence % PARTITIONS)
            delivery.add_done_callback(lambda d, s=sequence, v=value: _acknowledged(run, s, v, d))
            run.sent += 1
            next_at += run.interval_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        await producer.close(timeout_s=run.drain_s)
        run.producer_stats = dict(producer.stats)


def _acknowledged(run: Run, sequence: int, value: bytes, delivery) -> None:
    error = delivery.exception()
    if error is not None:
        run.failed.append((sequence, repr(error)))
        return
    metadata = delivery.result()
    now = time.monotonic()
    run.acknowledged.append(Ack(sequence, metadata.partition, metadata.offset, value))
    run.ack_times[sequence] = now
    if run.kill_at is not None and metadata.partition == 0 and now > run.kill_at:
        run.first_ack_after_kill.set()


async def consume(run: Run, group: str) -> None:
    """Read the topic as a member of ``group`` until told to stop, recording every delivery in order."""
    from copyless import Consumer

    consumer = Consumer(run.topic, bootstrap_servers=run.bootstrap, group_id=group, auto_offset_reset="earliest",
                        security=SECURITY)
    await consumer.start()
    try:
        while not run.stop_consuming.is_set():
            for records in (await consumer.getmany(timeout_ms=200)).values():
                run.deliveries += [Delivery(r.partition, r.offset, bytes(r.value or b"")) for r in records]
    finally:
        await consumer.close()


async def describe(bootstrap: str, topic: str):
    """partition -> PartitionDescription, asked through a fresh admin client (a cached connection to a killed
    broker would only time out; its published port refuses at once, and another broker answers)."""
    from copyless import Admin

    async with asyncio.timeout(5):
        async with Admin(bootstrap, request_timeout_ms=3000, security=SECURITY) as admin:
            (description,) = await admin.describe_topics(topic)
    return {p.partition: p for p in description.partitions}


async def wait_for(condition, timeout_s: float, what: str):
    """Poll the async ``condition`` every POLL_INTERVAL_S until it returns something truthy; return it."""
    deadline = time.monotonic() + timeout_s
    last_error = None
    while time.monotonic() < deadline:
        try:
            result = await condition()
            if result:
                return result
        except Exception as exc:  # a broker or etcd mid-failover (refused, timed out, an error code): ask again
            last_error = exc
        await asyncio.sleep(POLL_INTERVAL_S)
    raise DemoError(f"{what}: not within {timeout_s:.0f} s" + (f" (last error: {last_error!r})" if last_error else ""))


async def finish(task: asyncio.Task, timeout_s: float, what: str) -> None:
    """Wait for a task told to stop; report (never raise) its failure or its not stopping in time."""
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        print(f"demo: {what} did not stop within {timeout_s:.0f} s", flush=True)
    elif task.exception() is not None:
        print(f"demo: {what} failed: {task.exception()!r}", flush=True)


async def failover(args, compose: Compose, run: Run, timeline: Timeline) -> int:
    """Kill partition 0's leader and follow the failover to the broker's return to the ISR. Returns the
    victim's node id. Raises DemoError when a phase does not happen in time."""
    topic = run.topic
    await asyncio.sleep(WARM_UP_S)
    if not run.acknowledged:
        raise DemoError(f"no acks=all write acknowledged in the first {WARM_UP_S:.0f} s (sent {run.sent:,}, "
                        f"failed {len(run.failed):,}): the replicas do not keep up; see cluster/compose.sh logs")
    before = await describe(args.bootstrap, topic)
    victim = before[0].leader
    victim_service = broker_service(victim)
    old_state = await compose.partition_state(topic, 0)
    print(f"demo: {len(run.acknowledged):,} records acknowledged so far; partition 0 is led by broker {victim} "
          f"(epoch {old_state['leader_epoch']}, ISR {list(before[0].isr)})")
    print("timeline (seconds from the kill):", flush=True)

    # Time 0 is when `docker kill` returned: the broker is dead by then, so no acknowledgement after it can
    # come from the old leader (one sent while the command ran, ~0.1 s here, would otherwise count).
    await compose.kill(victim_service)
    kill_at = time.monotonic()
    run.kill_at = timeline.kill_at = kill_at
    timeline.add("kill", f"docker kill {victim_service} (broker {victim}, leader of partition 0)", at=kill_at)

    async def new_leader():
        partition = (await describe(args.bootstrap, topic))[0]
        return partition if partition.leader >= 0 and partition.leader != victim else None

    elected = await wait_for(new_leader, NEW_LEADER_TIMEOUT_S, "a new leader for partition 0")
    elected_at = time.monotonic()
    state = await compose.partition_state(topic, 0)
    # Shown with the first write after the kill: the poll may see the new leader after that write's ack.
    timeline.add("new_leader", f"partition 0: new leader broker {elected.leader}, epoch {state['leader_epoch']}, "
                               f"ISR {list(elected.isr)}", at=elected_at, hold=True)

    try:
        async with asyncio.timeout(FIRST_WRITE_TIMEOUT_S):
            await run.first_ack_after_kill.wait()
    except TimeoutError:
        timeline.show()
        raise DemoError(f"no write to partition 0 acknowledged within {FIRST_WRITE_TIMEOUT_S:.0f} s of the kill") \
            from None
    first = min((a for a in run.acknowledged if a.partition == 0 and run.ack_times[a.sequence] > kill_at),
                key=lambda a: run.ack_times[a.sequence])
    timeline.add("first_write", f"partition 0: first write acknowledged after the kill (offset {first.offset}, "
                                f"record {first.sequence})", at=run.ack_times[first.sequence])

    await asyncio.sleep(DOWN_AFTER_FIRST_WRITE_S)
    restart_at = time.monotonic()
    await compose.start(victim_service)
    timeline.add("restart", f"docker start {victim_service}", at=restart_at)

    async def healthy():
        return await compose.status(victim_service) == ("running", "healthy")

    await wait_for(healthy, HEALTHY_TIMEOUT_S, f"{victim_service} healthy again")
    timeline.add("healthy", f"{victim_service} healthy (answers ApiVersions)")

    async def rejoined():
        partitions = await describe(args.bootstrap, topic)
        return partitions if victim in partitions[0].isr else None

    partitions = await wait_for(rejoined, ISR_TIMEOUT_S, f"broker {victim} back in partition 0's ISR")
    state = await compose.partition_state(topic, 0)
    timeline.add("in_isr", f"partition 0: broker {victim} back in the ISR {list(partitions[0].isr)} (leader "
                           f"broker {partitions[0].leader}, epoch {state['leader_epoch']})")
    await asyncio.sleep(AFTER_REJOIN_S)
    return victim


async def demo(args) -> int:
    compose = Compose(args.project)
    topic = args.topic or f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"demo: compose project {args.project}, brokers at {args.bootstrap}")
    await compose.container("broker1")  # a clear error when the project does not run
    await _run(sys.executable, "-m", "copyless", "topics", "create", topic, "--partitions", str(PARTITIONS),
               "--replication-factor", str(REPLICATION_FACTOR), "--config",
               f"min.insync.replicas={MIN_INSYNC_REPLICAS}", "--bootstrap", args.bootstrap,
               *(["-F", args.properties] if args.properties else []))

    async def all_in_sync():
        partitions = await describe(args.bootstrap, topic)
        return partitions if len(partitions) == PARTITIONS and all(
            p.leader >= 0 and len(p.isr) == REPLICATION_FACTOR for p in partitions.values()) else None

    partitions = await wait_for(all_in_sync, 60, f"topic {topic}: every partition with 3 replicas in sync")
    print(f"demo: topic {topic}: {PARTITIONS} partitions, replication factor {REPLICATION_FACTOR}, "
          f"min.insync.replicas {MIN_INSYNC_REPLICAS}; leaders "
          + ", ".join(f"p{p}: broker {d.leader}" for p, d in sorted(partitions.items())))

    run = Run(args.bootstrap, topic, args.interval_ms / 1000)
    group = f"{topic}-readers"
    producer_task = asyncio.create_task(produce(run))
    consumer_task = asyncio.create_task(consume(run, group))
    print(f"demo: producing a record every {args.interval_ms:g} ms (idempotent, acks=all); consumer group {group}")
    timeline = Timeline()
    error: DemoError | None = None
    victim = None
    try:
        victim = await failover(args, compose, run, timeline)
    except DemoError as exc:
        error = exc
        run.drain_s = 5.0  # the run has failed already: what is still unacknowledged changes nothing
    run.stop_producing.set()
    await finish(producer_task, DRAIN_TIMEOUT_S + 10, "the producer")
    # The group reads on until it has every acknowledged offset (or the bound passes).
    wanted = {(a.partition, a.offset) for a in run.acknowledged}
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while error is None and time.monotonic() < deadline and not consumer_task.done():
        if wanted <= {(d.partition, d.offset) for d in run.deliveries}:
            break
        await asyncio.sleep(0.25)
    run.stop_consuming.set()
    await finish(consumer_task, 30, "the consumer group")

    verdict = check(run.acknowledged, run.deliveries)
    if run.failed:
        print(f"demo: {len(run.failed):,} sends not acknowledged (first: record {run.failed[0][0]}: "
              f"{run.failed[0][1]}); acks=all promised nothing about them")
    print(f"demo: sent {run.sent:,}, acknowledged {len(run.acknowledged):,}, the group read "
          f"{len(run.deliveries):,}")
    longest_wait = None
    if run.acknowledged:
        ack = max(run.acknowledged, key=lambda a: run.ack_times[a.sequence] - run.send_times[a.sequence])
        seconds = run.ack_times[ack.sequence] - run.send_times[ack.sequence]
        longest_wait = (seconds, ack)
        print(f"demo: the producer retried {run.producer_stats.get('retries', 0):,} batch(es); the longest a record "
              f"waited for its acknowledgement: {seconds:.3f} s (partition {ack.partition}, record {ack.sequence})")
    ok = error is None and verdict.ok
    if error is None:
        print(f"verdict: {verdict.summary()}", flush=True)
    else:
        print(f"verdict: FAIL: {error} ({verdict.acknowledged:,} acknowledged, {verdict.read:,} read, "
              f"{len(verdict.lost):,} lost)", flush=True)
    if args.json:
        print(json.dumps({
            "ok": ok,
            "error": str(error) if error else None,
            "topic": topic,
            "victim": victim,
            "timeline": {name: round(seconds, 3) for name, seconds, _ in timeline.events},
            "sent": run.sent,
            "acknowledged": len(run.acknowledged),
            "failed": len(run.failed),
            "retries": run.producer_stats.get("retries", 0),
            "longest_wait_s": round(longest_wait[0], 3) if longest_wait else None,
            "read": verdict.read,
            "redelivered": verdict.redelivered,
            "lost": len(verdict.lost),
            "mismatched": len(verdict.mismatched),
            "duplicated": len(verdict.duplicated),
            "out_of_order": len(verdict.out_of_order),
        }), flush=True)
    return 0 if ok else 1


def default_bootstrap() -> str:
    """The compose file's published ports (COPYLESS_BROKER{1,2,3}_PORT, as cluster/up.sh prints them)."""
    return ",".join(f"127.0.0.1:{os.environ.get(f'COPYLESS_BROKER{n}_PORT', 19091 + n)}" for n in (1, 2, 3))


def _give_up(timeout_s: float) -> None:
    print(f"verdict: FAIL: the demo did not finish within {timeout_s:.0f} s", flush=True)
    os._exit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cluster/demo.sh", description=__doc__.splitlines()[0])
    parser.add_argument("--project", default=os.environ.get("COMPOSE_PROJECT_NAME", "copyless"),
                        help="compose project name (default: copyless, as cluster/up.sh names it)")
    parser.add_argument("--bootstrap", default=default_bootstrap(), help="the brokers' published addresses")
    parser.add_argument("--topic", help="topic to create (default demo-<date>-<time>)")
    parser.add_argument("--interval-ms", type=float, default=10.0, help="one record every N ms (default 10)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="give up (exit 1) after this many seconds whatever happens (default 600)")
    parser.add_argument("--json", action="store_true", help="also print the timeline and counts as one JSON line")
    parser.add_argument("-F", "--properties", metavar="FILE",
                        help="client properties (security.protocol, sasl.*, ssl.*), as kcat -F reads them")
    parser.add_argument("--secure", action="store_true",
                        help="against cluster/up.sh --secure: -F cluster/.secure/<project>/admin.properties")
    args = parser.parse_args(argv)
    if args.secure and not args.properties:
        args.properties = str(Path(__file__).resolve().parent / ".secure" / args.project / "admin.properties")
    if args.properties:
        from copyless.client.security import ClientSecurity, read_properties

        global SECURITY
        SECURITY = ClientSecurity.from_properties(read_properties(args.properties))
    # A last bound on the whole run: a client stuck past every phase's own timeout still ends the demo.
    watchdog = threading.Timer(args.timeout, _give_up, (args.timeout,))
    watchdog.daemon = True
    watchdog.start()
    try:
        return asyncio.run(demo(args))
    except DemoError as exc:
        print(f"demo: cannot run: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"demo: cannot run: {exc!r} (is the cluster up? cluster/up.sh)", file=sys.stderr)
        return 2
    finally:
        watchdog.cancel()


if __name__ == "__main__":
    sys.exit(main())
