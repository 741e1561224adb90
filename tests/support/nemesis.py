"""The nemesis of the fault tests: faults as small objects that start and heal, and a seeded scheduler that
makes them overlap.

The stage (``Stage``, built by ``stage()``): three brokers and an etcd, each on a host of its own in a
``NetLab`` (network namespaces on a bridge), the brokers reaching etcd only through an ``EtcdFaultProxy``
listening on the bridge's address (so etcd can be slowed down call by call), and each broker's data dir on a
tmpfs of its own (so one disk can really fill up). Clients run in the test process and reach every broker.

A fault (``Fault``) names its kind and how long it holds; ``start(stage)`` picks its target from the
cluster as it is then (the leader of a partition, a follower, the controller) and breaks it, ``heal(stage)``
undoes exactly that. Faults compose: the stage counts cuts, pauses and delays, so two faults on one link or
one process heal independently, and a heal never revives what another fault still holds down (a restart
happens only where the process is dead).

    kill              kill -9 of a partition leader; restarted at heal
    pause-long        SIGSTOP of a leader past its lease (2 s) plus a margin: it wakes as a zombie
    pause-short       SIGSTOP within the lease: nobody replaces it
    etcd-cut-leader   a leader cut off from etcd (its lease runs out; its followers still reach it)
    peers-cut-leader  a leader that reaches etcd but not its followers
    follower-cut      a follower cut off from etcd and both peers
    slow-etcd         every etcd call and stream message delayed 0.05-0.6 s (the proxy); a broker's
                      etcd deadline is a third of its lease, 0.67 s: slower than that is a cut
    stall-etcd        etcd SIGSTOPped
    disk-full         a follower's disk filled to the last byte
    power-loss        kill -9, every log cut to its last flushed offset, and a restart in another boot
    double-failover   the leader killed, then the new leader killed 0-1000 ms after it took over
    controller-and-leader  the controller and a partition leader killed together
    kill-txn-coordinator   kill -9 of the broker coordinating a transactional id (the leader of its
                      ``__transaction_state`` partition); restarted at heal. Not drawn by ``schedule``: the
                      transactional test builds its steps with it (``TxnCoordinatorKill``)

``schedule(seed, kinds)`` yields steps forever, a function of the seed only: each step is one to three
faults whose starts fall inside the first one's hold, so they overlap. ``Nemesis.run(steps, seconds)``
executes them (targets depend on the cluster at the time), waits for leaders after each step and keeps a
timeline and the count of faults injected by kind. ``heal_everything`` undoes whatever is still active.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.broker_process import BrokerStartError
from tests.support.cluster import Cluster, MetadataView, read_metadata
from tests.support.etcd import EtcdProcess, require_etcd
from tests.support.etcd_proxy import EtcdFaultProxy
from tests.support.netns import NetLab
from tests.support.power_loss import in_another_boot, lose_unflushed
from tests.support.tmpfs import mounted_tmpfs, take_every_free_byte

__all__ = ["Stage", "stage", "Fault", "Kill", "Pause", "EtcdCutLeader", "TxnCoordinatorKill", "KINDS", "CORE_KINDS",
           "schedule", "Nemesis", "NoTarget"]

LEASE_S = 2.0  # broker.session.timeout.ms of CLUSTER_TEST_CONFIG
# Each broker's disk: the logs of a test topic and of __consumer_offsets need a few MiB each (segments own
# blocks in steps ahead of the writer), and a full disk is a filler file sized to the free space.
DISK_MIB = 96


class NoTarget(Exception):
    """The cluster offers nothing for this fault to hit right now (no leader known, every broker down)."""


@dataclass
class Stage:
    cluster: Cluster
    lab: NetLab
    etcd: EtcdProcess
    proxy: EtcdFaultProxy
    topic: str
    partitions: int
    workdir: Path
    disks: dict[int, Path]
    rng: random.Random = field(default_factory=random.Random)
    _pauses: dict[int, int] = field(default_factory=dict)  # node -> active pause faults
    _cuts: dict[tuple, int] = field(default_factory=dict)  # link -> active faults cutting it
    _delays: list[float] = field(default_factory=list)
    _etcd_stops: int = 0
    _starting: dict[int, threading.Thread] = field(default_factory=dict)
    _base_wrappers: dict[int, tuple[str, ...]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._base_wrappers = {n: b.wrapper for n, b in self.cluster.brokers.items()}

    # -- reading the cluster ---------------------------------------------------------------------------------
    def view(self) -> MetadataView | None:
        """Metadata from every reachable broker merged: per partition, the answer with the highest leader
        epoch (a broker cut off from etcd may still name an old leader)."""
        best: MetadataView | None = None
        for node, broker in self.cluster.brokers.items():
            if not broker.alive() or self._pauses.get(node):
                continue
            try:
                view = read_metadata(broker.bootstrap, [self.topic], timeout_s=2.0)
            except Exception:  # noqa: BLE001 - a timeout, a reset, a torn answer: no answer from this one
                continue
            if best is None:
                best = view
                continue
            mine, theirs = best.topics.get(self.topic, {}), view.topics.get(self.topic, {})
            for p, part in theirs.items():
                if p not in mine or part.leader_epoch > mine[p].leader_epoch:
                    mine[p] = part
            if best.controller_id <= 0:
                best.controller_id = view.controller_id
        return best

    def leader(self, partition: int) -> int:
        view = self.view()
        part = view.topics.get(self.topic, {}).get(partition) if view else None
        if part is None or part.leader <= 0 or not self.cluster.brokers[part.leader].alive():
            raise NoTarget(f"no live leader of partition {partition}")
        return part.leader

    def follower(self, partition: int) -> int:
        view = self.view()
        part = view.topics.get(self.topic, {}).get(partition) if view else None
        candidates = [n for n in (part.replicas if part else self.cluster.brokers) if part is None or n != part.leader]
        candidates = [n for n in candidates if self.cluster.brokers[n].alive()]
        if not candidates:
            raise NoTarget(f"no live follower of partition {partition}")
        return self.rng.choice(sorted(candidates))

    def txn_coordinator(self, transactional_id: str) -> int:
        """The live broker leading ``transactional_id``'s partition of ``__transaction_state`` (the highest
        leader epoch any reachable broker reports)."""
        from copyless.broker.txn.log import TXN_TOPIC, partition_for
        best = None
        for node, broker in self.cluster.brokers.items():
            if not broker.alive() or self._pauses.get(node):
                continue
            try:
                parts = read_metadata(broker.bootstrap, [TXN_TOPIC], timeout_s=2.0).topics.get(TXN_TOPIC, {})
            except Exception:  # noqa: BLE001 - no answer from this one
                continue
            if not parts:
                continue
            part = parts.get(partition_for(transactional_id, len(parts)))
            if part is not None and part.leader > 0 and (best is None or part.leader_epoch > best.leader_epoch):
                best = part
        if best is None or not self.cluster.brokers[best.leader].alive():
            raise NoTarget(f"no live coordinator of {transactional_id}")
        return best.leader

    def controller(self) -> int:
        view = self.view()
        if view is None or view.controller_id <= 0 or not self.cluster.brokers[view.controller_id].alive():
            raise NoTarget("no live controller")
        return view.controller_id

    def note(self, text: str) -> None:
        self.notes.append(text)

    # -- breaking and healing, counted so that faults compose ---------------------------------------------
    def kill(self, node: int) -> None:
        broker = self.cluster.brokers[node]
        if broker.alive():
            broker.kill()
        self._pauses.pop(node, None)

    def revive(self, node: int, *, wait: bool = False) -> bool:
        """Start ``node`` again if it is dead. In the background unless ``wait``: a broker does not listen
        before it reaches etcd, and the heal that lets it (an etcd SIGCONT, a cut healed) may be the next
        event of the schedule. With ``wait``, False (noted) if it would not start."""
        broker = self.cluster.brokers[node]
        starting = self._starting.get(node)
        if starting is not None and starting.is_alive():
            if not wait:
                return True
            starting.join()
        if broker.alive():
            return True
        if not wait:
            thread = threading.Thread(target=self._start, args=(node,), name=f"start-broker-{node}", daemon=True)
            self._starting[node] = thread
            thread.start()
            return True
        return self._start(node)

    def _start(self, node: int) -> bool:
        broker = self.cluster.brokers[node]
        try:
            broker.start(port=broker.port)
            return True
        except (BrokerStartError, OSError, RuntimeError) as exc:
            self.note(f"broker {node} did not start: {str(exc)[-300:]}")
            return False

    def pause(self, node: int) -> object:
        broker = self.cluster.brokers[node]
        os.kill(broker.pid, signal.SIGSTOP)
        self._pauses[node] = self._pauses.get(node, 0) + 1
        return broker.process

    def resume(self, node: int, process: object) -> None:
        broker = self.cluster.brokers[node]
        if broker.process is not process or not broker.alive():
            return  # killed (and maybe restarted) meanwhile: nothing of this pause is left
        self._pauses[node] = self._pauses.get(node, 1) - 1
        if self._pauses[node] <= 0:
            self._pauses.pop(node, None)
            os.kill(broker.pid, signal.SIGCONT)

    def _host(self, node: int):
        return self.cluster.hosts[node]

    def cut(self, a: int | str, b: int | str) -> None:
        """Cut broker ``a`` from broker ``b``, or from etcd when ``b`` is "etcd"."""
        key = (a, b) if b == "etcd" else tuple(sorted((a, b)))
        self._cuts[key] = self._cuts.get(key, 0) + 1
        if self._cuts[key] == 1:
            if b == "etcd":
                self.lab.cut_port(self._host(a), self.proxy.host, self.proxy.port)
            else:
                self.lab.cut(self._host(a), self._host(b))

    def uncut(self, a: int | str, b: int | str) -> None:
        key = (a, b) if b == "etcd" else tuple(sorted((a, b)))
        if not self._cuts.get(key):
            return
        self._cuts[key] -= 1
        if self._cuts[key] == 0:
            del self._cuts[key]
            if b == "etcd":
                self.lab.uncut_port(self._host(a), self.proxy.host, self.proxy.port)
            else:
                self.lab.uncut(self._host(a), self._host(b))

    def slow_etcd(self, delay_s: float) -> None:
        self._delays.append(delay_s)
        self.proxy.delay_s = max(self._delays)

    def unslow_etcd(self, delay_s: float) -> None:
        if delay_s in self._delays:
            self._delays.remove(delay_s)
        self.proxy.delay_s = max(self._delays, default=0.0)

    def stop_etcd(self) -> None:
        self._etcd_stops += 1
        if self._etcd_stops == 1:
            self.etcd.pause()

    def cont_etcd(self) -> None:
        if self._etcd_stops:
            self._etcd_stops -= 1
            if self._etcd_stops == 0:
                self.etcd.resume()

    def fill_disk(self, node: int) -> Path:
        filler = self.disks[node] / f"filler-{self.rng.randrange(10**9)}"
        take_every_free_byte(filler)
        return filler

    def require_redundancy(self, node: int) -> None:
        """A power loss of the last in-sync replica of a partition leaves it offline for good (its data may
        be incomplete, and nobody else has it: ``broker.cluster.incarnation``), which ends the run's
        usefulness, not its safety: such a power loss is not started."""
        view = self.view()
        parts = view.topics.get(self.topic, {}) if view else {}
        if len(parts) != self.partitions:
            raise NoTarget("the partitions' ISRs are unknown")
        for p, part in sorted(parts.items()):
            if not set(part.isr) - {node}:
                raise NoTarget(f"broker {node} is the only in-sync replica of p{p}")

    def power_loss(self, node: int) -> int:
        self.require_redundancy(node)
        self.kill(node)
        broker = self.cluster.brokers[node]
        zeroed = lose_unflushed(broker.data_dir)
        in_another_boot(broker, self.workdir, base=self._base_wrappers[node])
        return zeroed

    def heal_everything(self) -> None:
        """Every link, pause, delay and disk back to normal, and every broker running."""
        self.lab.heal()
        self._cuts.clear()
        self._delays.clear()
        self.proxy.delay_s = 0.0
        while self._etcd_stops:
            self.cont_etcd()
        for disk in self.disks.values():
            for filler in disk.glob("filler-*"):
                filler.unlink()
        for broker in self.cluster.brokers.values():
            if broker.alive():
                os.kill(broker.pid, signal.SIGCONT)
        self._pauses.clear()
        for _attempt in range(3):
            if all(self.revive(node, wait=True) for node in self.cluster.brokers):
                return
            time.sleep(2)


# -- the faults --------------------------------------------------------------------------------------------

@dataclass
class Fault:
    kind = "fault"
    partition: int
    hold_s: float

    def start(self, stage: Stage) -> str:
        raise NotImplementedError

    def heal(self, stage: Stage) -> str:
        raise NotImplementedError


@dataclass
class Kill(Fault):
    kind = "kill"
    node: int = 0

    def start(self, stage):
        self.node = stage.leader(self.partition)
        stage.kill(self.node)
        return f"kill -9 broker {self.node} (leader of p{self.partition})"

    def heal(self, stage):
        stage.revive(self.node)
        return f"broker {self.node} restarted"


@dataclass
class Pause(Fault):
    kind = "pause-long"
    node: int = 0
    process: object = None

    def start(self, stage):
        self.node = stage.leader(self.partition)
        self.process = stage.pause(self.node)
        return f"SIGSTOP broker {self.node} (leader of p{self.partition}) for {self.hold_s:.2f} s"

    def heal(self, stage):
        stage.resume(self.node, self.process)
        return f"SIGCONT broker {self.node}"


@dataclass
class ShortPause(Pause):
    kind = "pause-short"


@dataclass
class EtcdCutLeader(Fault):
    kind = "etcd-cut-leader"
    node: int = 0

    def start(self, stage):
        self.node = stage.leader(self.partition)
        stage.cut(self.node, "etcd")
        return f"broker {self.node} (leader of p{self.partition}) cut off from etcd"

    def heal(self, stage):
        stage.uncut(self.node, "etcd")
        return f"broker {self.node} reaches etcd again"


@dataclass
class PeersCutLeader(Fault):
    kind = "peers-cut-leader"
    node: int = 0
    others: tuple[int, ...] = ()

    def start(self, stage):
        self.node = stage.leader(self.partition)
        self.others = tuple(n for n in stage.cluster.brokers if n != self.node)
        for other in self.others:
            stage.cut(self.node, other)
        return f"broker {self.node} (leader of p{self.partition}) cut off from brokers {list(self.others)}"

    def heal(self, stage):
        for other in self.others:
            stage.uncut(self.node, other)
        return f"broker {self.node} reaches its peers again"


@dataclass
class FollowerCut(Fault):
    kind = "follower-cut"
    node: int = 0
    others: tuple[int, ...] = ()

    def start(self, stage):
        self.node = stage.follower(self.partition)
        self.others = tuple(n for n in stage.cluster.brokers if n != self.node)
        for other in self.others:
            stage.cut(self.node, other)
        stage.cut(self.node, "etcd")
        return f"broker {self.node} (follower of p{self.partition}) isolated"

    def heal(self, stage):
        for other in self.others:
            stage.uncut(self.node, other)
        stage.uncut(self.node, "etcd")
        return f"broker {self.node} back on the network"


@dataclass
class SlowEtcd(Fault):
    kind = "slow-etcd"
    delay_s: float = 0.5

    def start(self, stage):
        stage.slow_etcd(self.delay_s)
        return f"etcd slowed by {self.delay_s:.2f} s a call"

    def heal(self, stage):
        stage.unslow_etcd(self.delay_s)
        return "etcd at speed"


@dataclass
class StallEtcd(Fault):
    kind = "stall-etcd"

    def start(self, stage):
        stage.stop_etcd()
        return f"etcd SIGSTOPped for {self.hold_s:.2f} s"

    def heal(self, stage):
        stage.cont_etcd()
        return "etcd SIGCONT"


@dataclass
class DiskFull(Fault):
    kind = "disk-full"
    node: int = 0
    filler: Path | None = None

    def start(self, stage):
        self.node = stage.follower(self.partition)
        self.filler = stage.fill_disk(self.node)
        return f"broker {self.node}'s disk (follower of p{self.partition}) full"

    def heal(self, stage):
        if self.filler is not None:
            self.filler.unlink(missing_ok=True)
        revived = stage.revive(self.node)
        return f"broker {self.node}'s disk has room again" + ("" if revived else " (it did not restart)")


@dataclass
class PowerLoss(Fault):
    kind = "power-loss"
    node: int = 0
    leader: bool = True

    def start(self, stage):
        self.node = stage.leader(self.partition) if self.leader else stage.follower(self.partition)
        zeroed = stage.power_loss(self.node)
        role = "leader" if self.leader else "follower"
        return f"power loss of broker {self.node} ({role} of p{self.partition}): {zeroed} unflushed bytes gone"

    def heal(self, stage):
        stage.revive(self.node)
        return f"broker {self.node} restarted in another boot"


@dataclass
class DoubleFailover(Fault):
    kind = "double-failover"
    gap_s: float = 0.0
    nodes: tuple[int, ...] = ()

    def start(self, stage):
        first = stage.leader(self.partition)
        stage.kill(first)
        self.nodes = (first,)
        deadline = time.monotonic() + LEASE_S + 8
        second = None
        while time.monotonic() < deadline:
            try:
                candidate = stage.leader(self.partition)
            except NoTarget:
                candidate = None
            if candidate is not None and candidate != first:
                second = candidate
                break
            time.sleep(0.05)
        if second is None:
            return f"kill -9 broker {first} (leader of p{self.partition}); no new leader to kill"
        time.sleep(self.gap_s)
        stage.kill(second)
        self.nodes = (first, second)
        return (f"kill -9 broker {first} (leader of p{self.partition}), then its successor {second} "
                f"{self.gap_s * 1000:.0f} ms after it took over")

    def heal(self, stage):
        for node in self.nodes:
            stage.revive(node)
        return f"brokers {list(self.nodes)} restarted"


@dataclass
class ControllerAndLeader(Fault):
    kind = "controller-and-leader"
    nodes: tuple[int, ...] = ()

    def start(self, stage):
        controller = stage.controller()
        view = stage.view()
        leaders = [part.leader for _p, part in sorted(view.topics.get(stage.topic, {}).items())] if view else []
        leader = next((n for n in [stage.leader(self.partition), *leaders]
                       if n > 0 and n != controller and stage.cluster.brokers[n].alive()), None)
        if leader is None:
            leader = next(n for n in stage.cluster.brokers if n != controller)
        self.nodes = (controller, leader)
        for node in self.nodes:  # both signals first, then the reaping: the two die together
            with contextlib.suppress(ProcessLookupError):
                if stage.cluster.brokers[node].alive():
                    os.kill(stage.cluster.brokers[node].pid, signal.SIGKILL)
        for node in self.nodes:
            stage.kill(node)
        return f"kill -9 the controller {controller} and broker {leader} (a partition leader) together"

    def heal(self, stage):
        for node in self.nodes:
            stage.revive(node)
        return f"brokers {list(self.nodes)} restarted"


@dataclass
class TxnCoordinatorKill(Fault):
    kind = "kill-txn-coordinator"
    transactional_id: str = ""
    node: int = 0

    def start(self, stage):
        self.node = stage.txn_coordinator(self.transactional_id)
        stage.kill(self.node)
        return f"kill -9 broker {self.node} (transaction coordinator of {self.transactional_id})"

    def heal(self, stage):
        stage.revive(self.node)
        return f"broker {self.node} restarted"


def _draw(kind: str, rng: random.Random, partitions: int) -> Fault:
    p = rng.randrange(partitions)
    if kind == "kill":
        return Kill(p, rng.uniform(0.5, 3.0))
    if kind == "pause-long":
        return Pause(p, LEASE_S + rng.uniform(1.0, 3.5))
    if kind == "pause-short":
        return ShortPause(p, rng.uniform(0.3, LEASE_S * 0.6))
    if kind == "etcd-cut-leader":
        return EtcdCutLeader(p, rng.uniform(1.0, 6.0))
    if kind == "peers-cut-leader":
        return PeersCutLeader(p, rng.uniform(1.0, 6.0))
    if kind == "follower-cut":
        return FollowerCut(p, rng.uniform(1.0, 6.0))
    if kind == "slow-etcd":
        return SlowEtcd(p, rng.uniform(2.0, 6.0), delay_s=rng.uniform(0.05, 0.6))
    if kind == "stall-etcd":
        return StallEtcd(p, rng.uniform(0.5, 4.0))
    if kind == "disk-full":
        return DiskFull(p, rng.uniform(2.0, 6.0))
    if kind == "power-loss":
        return PowerLoss(p, rng.uniform(0.5, 3.0), leader=rng.random() < 0.6)
    if kind == "double-failover":
        return DoubleFailover(p, rng.uniform(0.5, 2.0), gap_s=rng.uniform(0.0, 1.0))
    if kind == "controller-and-leader":
        return ControllerAndLeader(p, rng.uniform(0.5, 2.5))
    raise ValueError(f"unknown fault kind {kind!r}")


KINDS = ("kill", "pause-long", "pause-short", "etcd-cut-leader", "peers-cut-leader", "follower-cut", "slow-etcd",
         "stall-etcd", "disk-full", "power-loss", "double-failover", "controller-and-leader")
CORE_KINDS = ("kill", "pause-long", "pause-short", "etcd-cut-leader", "follower-cut", "slow-etcd", "power-loss",
              "double-failover")


@dataclass
class Step:
    faults: list[tuple[float, Fault]]  # (start offset in the step, fault)
    quiet_s: float


def schedule(seed: int, kinds: tuple[str, ...] = KINDS, partitions: int = 3,
             first: tuple[str, ...] = ()) -> Iterator[Step]:
    """Steps forever, a function of the seed only: each one to three faults, the later ones starting inside
    the first one's hold. ``first`` kinds come one per step first (in that order), each with a partner."""
    rng = random.Random(seed)
    queue = list(first)
    while True:
        if queue:
            chosen = [queue.pop(0), rng.choice(kinds)]
        else:
            chosen = [rng.choice(kinds) for _ in range(rng.choices((1, 2, 3), weights=(3, 5, 2))[0])]
        faults = [_draw(kind, rng, partitions) for kind in chosen]
        lead = faults[0]
        timed = [(0.0, lead)] + [(round(rng.uniform(0.0, lead.hold_s), 2), f) for f in faults[1:]]
        yield Step(timed, rng.uniform(1.0, 3.0))


class Nemesis:
    """Runs steps of a ``schedule`` on a ``Stage``; see the module docstring."""

    def __init__(self, stage: Stage) -> None:
        self.stage = stage
        self.timeline: list[str] = []
        self.injected: dict[str, int] = {}
        self.active: list[Fault] = []
        self._t0 = time.monotonic()

    def note(self, text: str) -> None:
        self.timeline.append(f"{time.monotonic() - self._t0:7.2f}s {text}")
        while self.stage.notes:  # notes of background restarts too: taken one by one, none lost
            self.timeline.append(f"{time.monotonic() - self._t0:7.2f}s   {self.stage.notes.pop(0)}")

    def run(self, steps: Iterator[Step], seconds: float, *, max_steps: int | None = None) -> None:
        deadline = time.monotonic() + seconds
        for done, step in enumerate(steps):
            if time.monotonic() >= deadline or (max_steps is not None and done >= max_steps):
                break
            self.run_step(step)

    def run_step(self, step: Step) -> None:
        begin = time.monotonic()
        events = []
        for offset, fault in step.faults:
            events.append((offset, 0, "start", fault))
            events.append((offset + fault.hold_s, 1, "heal", fault))
        events.sort(key=lambda e: (e[0], e[1]))
        started: set[int] = set()
        for at, _order, what, fault in events:
            pause_s = begin + at - time.monotonic()
            if pause_s > 0:
                time.sleep(pause_s)
            if what == "start":
                try:
                    self.note(f"{fault.kind}: " + fault.start(self.stage))
                except NoTarget as exc:
                    self.note(f"{fault.kind}: not started ({exc})")
                    continue
                except Exception as exc:  # noqa: BLE001 - a target that died under another fault: go on
                    self.note(f"{fault.kind}: start failed: {exc!r}")
                    continue
                started.add(id(fault))
                self.active.append(fault)
                self.injected[fault.kind] = self.injected.get(fault.kind, 0) + 1
            elif id(fault) in started:
                try:
                    self.note(f"{fault.kind}: " + fault.heal(self.stage))
                except Exception as exc:  # noqa: BLE001 - heal_everything at the end is the backstop
                    self.note(f"{fault.kind}: heal failed: {exc!r}")
                self.active = [f for f in self.active if f is not fault]
        self.settle()
        time.sleep(step.quiet_s)

    def settle(self, timeout_s: float = 30) -> None:
        """Until every partition has a live leader again (noted, not failed, if it takes too long)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            view = self.stage.view()
            parts = view.topics.get(self.stage.topic, {}) if view else {}
            if len(parts) == self.stage.partitions and all(
                    p.leader > 0 and self.stage.cluster.brokers[p.leader].alive() for p in parts.values()):
                return
            time.sleep(0.2)
        self.note(f"a partition still had no leader {timeout_s:.0f} s after the step")

    def heal_everything(self) -> None:
        for fault in list(reversed(self.active)):
            try:
                self.note(f"{fault.kind}: " + fault.heal(self.stage))
            except Exception as exc:  # noqa: BLE001 - healing goes on; heal_everything below is the backstop
                self.note(f"{fault.kind}: heal failed: {exc!r}")
        self.active.clear()
        self.stage.heal_everything()
        self.note("everything healed")


@contextlib.contextmanager
def stage(workdir: Path, topic: str, partitions: int = 3, *, seed: int = 0,
          config: dict | None = None) -> Iterator[Stage]:
    """Three brokers and an etcd on hosts of a NetLab, etcd behind a proxy, each data dir on a tmpfs, and
    ``topic`` created (RF 3, min.insync.replicas 2) with a whole ISR. Torn down on exit. Raises
    ``RuntimeError`` where namespaces cannot be made (the caller skips)."""
    require_etcd()
    available, why = NetLab.available()
    if not available:
        raise RuntimeError(why)
    NetLab.remove_leftovers()
    workdir = Path(workdir)
    lab = NetLab().start()
    etcd = proxy = cluster = None
    with contextlib.ExitStack() as stack:
        try:
            etcd_host = lab.add_host("etcd")
            etcd = EtcdProcess(workdir / "etcd", host=etcd_host.address, wrapper=tuple(lab.command(etcd_host, [])))
            etcd.start()
            proxy = EtcdFaultProxy(etcd.endpoint, host=lab.gateway).start()
            cluster = Cluster(workdir / "cluster", proxy, 3, config=config, lab=lab)
            disks = {}
            for node, broker in cluster.brokers.items():
                disks[node] = stack.enter_context(mounted_tmpfs(workdir / f"disk{node}", DISK_MIB))
                broker.data_dir = disks[node] / "data"
            cluster.start()
            cluster.create_topic(topic, partitions, 3, configs={"min.insync.replicas": "2"})
            cluster.wait_for_isr(topic, partitions, 3)
            yield Stage(cluster, lab, etcd, proxy, topic, partitions, workdir, disks, rng=random.Random(seed))
        finally:
            try:
                lab.heal()
                if etcd is not None and etcd.process is not None and etcd.process.poll() is None:
                    etcd.resume()
                if cluster is not None:
                    cluster.stop()
                if proxy is not None:
                    proxy.close()
                if etcd is not None:
                    etcd.stop()
            finally:
                lab.close()
