"""Transactions checked as Jepsen checks Kafka's, under the nemesis (issue: transactions and exactly-once).

The stage is test_jepsen.py's (``tests.support.nemesis.stage``: three brokers and an etcd on hosts of their
own, etcd behind a proxy), with ``__transaction_state`` on 4 partitions of RF 3. Three topics of 3 partitions,
RF 3, min.insync.replicas 2: the transactions' topic, an input topic and an output topic. The workload, all
librdkafka (confluent-kafka) in threads of the test process:

- two transactional producers, each transaction one record to each of the 3 partitions, committed or
  aborted at random; each record's value names its transaction; the outcome is what the client knows
  (committed, aborted, unknown when the commit raised and nothing settled it). A producer whose error is
  fatal is replaced by a new instance of its transactional id;
- a zombie: a transactional id whose instance writes a transaction and is then fenced by a new instance
  (InitProducerId) before it commits; it then writes again and tries to commit, which must fail. The new
  instance commits one of its own and is the next round's zombie;
- consume-transform-produce: an idempotent producer writes the input topic; a read_committed consumer of a
  group reads it, and a transactional producer writes one output record per input record with the consumed
  offsets sent to the transaction (``send_offsets_to_transaction``), committing (sometimes aborting, then
  rewinding to the committed offsets);
- two read_committed readers of the transactions' and output topics from offset 0, while the faults run.

The nemesis runs six steps seeded from ``COPYLESS_JEPSEN_SEED`` (else at random, printed): kill -9 of a
partition leader, kill -9 of a transaction coordinator's broker, SIGSTOP of a leader past its lease, a
leader cut off from etcd, each leading one step overlapped by another of them, then two pairs drawn at
random; 90 s at most. Then everything is healed, the
producers finish, the last stable offset must reach the high watermark everywhere, every topic is read by
read_committed from 0, and ``tests.support.checker.check_transactions`` judges the history: no aborted or
zombie record read, committed transactions all-or-none and exactly once, unknown ones all-or-none, every
input's output committed exactly once with the group's offsets just past it, no read of a record the final
read does not hold.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition  # noqa: E402

from tests.support.checker import Txn, TxnHistory, TxnRead, check_transactions, txn_counts  # noqa: E402
from tests.support.nemesis import LEASE_S, EtcdCutLeader, Kill, Nemesis, Pause, Step, TxnCoordinatorKill, stage  # noqa: E402
from tests.support.netns import NetLab  # noqa: E402
from tests.support.topics import unique_topic  # noqa: E402

SEED_ENV = "COPYLESS_JEPSEN_SEED"
# Set: librdkafka's debug log of the consume-transform-produce stage's clients goes to stderr.
CTP_DEBUG_ENV = "COPYLESS_CTP_DEBUG"
PARTITIONS = 3
TXN_STATE_PARTITIONS = 4
SCHEDULE_LIMIT_S = 90
TXN_TIMEOUT_MS = 15_000  # a transaction abandoned by a replaced instance ends within the run's tail
CALL_TIMEOUT_S = 20
# Inputs per consume-transform-produce transaction at most (what one consume call returns).
CTP_BATCH = 20
# After the heal the stage must transform the backlog the faults left: it may take as long as it keeps
# committing, but CTP_QUIET_S without a newly covered input is a stall.
CTP_QUIET_S = 30
CTP_CATCH_UP_LIMIT_S = 240


@dataclass
class Recorder:
    """The history as the threads record it, under one lock."""
    txns: list[Txn] = field(default_factory=list)
    reads: list[TxnRead] = field(default_factory=list)
    derived: dict[bytes, bytes] = field(default_factory=dict)
    covered: set[bytes] = field(default_factory=set)  # inputs whose output the client saw committed
    inputs_acked: set[bytes] = field(default_factory=set)
    fencing_failures: list[str] = field(default_factory=list)
    # Replaced producer instances, kept until the run is over. librdkafka 2.16 once corrupted the test
    # process' heap ("tcache_thread_shutdown(): unaligned tcache chunk detected", seed 555830) destroying a
    # fenced instance right after its fatal error; an instance released only after the run cannot race that.
    retired: list = field(default_factory=list)
    ctp_state: str = ""
    errors: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def txn(self, producer: str, txn: str, outcome: str, records: list[tuple[str, int, bytes]]) -> None:
        with self.lock:
            self.txns.append(Txn(producer, txn, outcome, tuple(records)))

    def error(self, where: str, exc: BaseException) -> None:
        error = exc.args[0] if exc.args and hasattr(exc.args[0], "name") else None
        with self.lock:
            self.errors[f"{where}: {error.name() if error is not None else type(exc).__name__}"] += 1


def _producer(bootstrap: str, tid: str, stop: threading.Event, rec: Recorder, old: Producer | None = None,
              extra: dict | None = None) -> Producer:
    """A new instance of ``tid``, initialised (which fences every older one); retried until it works.
    ``old`` (and every instance that failed to start) is retired, not destroyed (``Recorder.retired``)."""
    if old is not None:
        rec.retired.append(old)
    while True:
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid,
                             "transaction.timeout.ms": TXN_TIMEOUT_MS, "linger.ms": 2,
                             "message.timeout.ms": TXN_TIMEOUT_MS, "topic.metadata.refresh.interval.ms": 2000,
                             **(extra or {})})
        try:
            producer.init_transactions(CALL_TIMEOUT_S)
            return producer
        except KafkaException as exc:
            rec.error(f"{tid.rsplit('-', 1)[0]} init", exc)
            rec.retired.append(producer)
            if stop.is_set():
                raise
            time.sleep(0.5)


def _end(producer: Producer, commit: bool, rec: Recorder, where: str) -> tuple[str, bool]:
    """Commit or abort the open transaction: (outcome as far as the client knows, usable afterwards)."""
    try:
        if commit:
            for attempt in range(3):
                try:
                    producer.commit_transaction(CALL_TIMEOUT_S)
                    return "committed", True
                except KafkaException as exc:
                    rec.error(f"{where} commit", exc)
                    if not exc.args[0].retriable() or attempt == 2:
                        raise
        else:
            producer.abort_transaction(CALL_TIMEOUT_S)
            return "aborted", True
    except KafkaException as exc:
        error = exc.args[0]
        if not commit:
            # Never asked to commit, it cannot commit: the new instance's InitProducerId (or the timeout)
            # aborts it.
            rec.error(f"{where} abort", exc)
            return "aborted", False
        if error.txn_requires_abort():
            try:
                # librdkafka: a commit that needs an abort did not take effect, so the abort settles it.
                producer.abort_transaction(CALL_TIMEOUT_S)
                return "aborted", True
            except KafkaException as again:
                rec.error(f"{where} abort after commit", again)
    return "unknown", False


class HungCall(Exception):
    """A librdkafka call still blocked well past its own timeout."""


def _send_offsets(producer: Producer, offsets: list, group_metadata) -> None:
    """``send_offsets_to_transaction``, bounded. librdkafka 2.10 and later can block in it for good, past its
    timeout, once the group's coordinator was decommissioned (a broker left out of a Metadata response while
    it was down): its TxnOffsetCommit waits for that broker handle, whose thread is gone, until some other
    broker changes state (confluentinc/librdkafka#5511, timeout unchecked: #5456). Kafka leaves a dead broker
    out of Metadata too. Raises KafkaException, or HungCall when the call has not returned 10 s after its
    timeout: the instance is then abandoned (retired, never destroyed) and a new one fences it."""
    failure: list[BaseException] = []

    def call() -> None:
        try:
            producer.send_offsets_to_transaction(offsets, group_metadata, CALL_TIMEOUT_S)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=call, daemon=True, name="send-offsets")
    thread.start()
    thread.join(CALL_TIMEOUT_S + 10)
    if thread.is_alive():
        raise HungCall(f"send_offsets_to_transaction still blocked {CALL_TIMEOUT_S + 10} s after its call")
    if failure:
        raise failure[0]


def _transactions(bootstrap: str, topic: str, name: str, seed: int, rec: Recorder, stop: threading.Event) -> None:
    rng = random.Random(seed)
    tid = f"{name}-{seed}"
    producer = _producer(bootstrap, tid, stop, rec)
    number = 0
    while not stop.is_set():
        txn = f"{name}.{number}"
        number += 1
        records = [(topic, p, f"{txn}/{p}".encode()) for p in range(PARTITIONS)]
        commit = rng.random() < 0.6
        try:
            producer.begin_transaction()
            for _topic, p, value in records:
                producer.produce(topic, value, partition=p)
        except (KafkaException, BufferError) as exc:
            rec.error(f"{name} produce", exc)
            commit = False
        outcome, usable = _end(producer, commit, rec, name)
        rec.txn(tid, txn, outcome, records)
        if not usable:
            producer = _producer(bootstrap, tid, stop, rec, producer)  # fences the old one, aborting its transaction
        time.sleep(rng.uniform(0.0, 0.05))
    producer.flush(10)


def _zombies(bootstrap: str, topic: str, seed: int, rec: Recorder, stop: threading.Event) -> None:
    tid = f"zombie-{seed}"
    rng = random.Random(seed)
    current = _producer(bootstrap, tid, stop, rec)
    number = 0
    while not stop.is_set():
        txn = f"zombie.{number}"
        number += 1
        records = [(topic, p, f"{txn}/{p}".encode()) for p in range(PARTITIONS)]
        try:
            current.begin_transaction()
            for _topic, p, value in records:
                current.produce(topic, value, partition=p)
            current.flush(CALL_TIMEOUT_S)
        except KafkaException as exc:
            rec.error("zombie produce", exc)
        try:
            heir = _producer(bootstrap, tid, stop, rec)  # fences ``current``: its open transaction is aborted
        except KafkaException:  # stopped before an heir came up: never asked to commit, so aborted
            rec.txn(f"{tid}#{number}", txn, "aborted", records)
            break
        late = [(topic, p, f"{txn}/late{p}".encode()) for p in range(PARTITIONS)]
        try:
            for _topic, p, value in late:
                current.produce(topic, value, partition=p)
            current.commit_transaction(CALL_TIMEOUT_S)
            rec.fencing_failures.append(f"{txn}: the fenced instance committed")
        except KafkaException as exc:
            rec.error("zombie commit (expected)", exc)
        rec.txn(f"{tid}#{number}", txn, "fenced", records + late)
        rec.retired.append(current)
        current = heir
        heir_txn = f"zombie.{number}.heir"
        heir_records = [(topic, p, f"{heir_txn}/{p}".encode()) for p in range(PARTITIONS)]
        try:
            current.begin_transaction()
            for _topic, p, value in heir_records:
                current.produce(topic, value, partition=p)
        except KafkaException as exc:
            rec.error("heir produce", exc)
        outcome, usable = _end(current, True, rec, "heir")
        rec.txn(f"{tid}#{number + 1}", heir_txn, outcome, heir_records)
        if not usable:
            current = _producer(bootstrap, tid, stop, rec, current)
        stop.wait(rng.uniform(1.0, 3.0))


def _inputs(bootstrap: str, topic: str, rec: Recorder, stop: threading.Event) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 2, "message.timeout.ms": 30_000})

    def delivered(err, message):
        if err is None:
            with rec.lock:
                rec.inputs_acked.add(message.value())

    number = 0
    while not stop.is_set():
        producer.produce(topic, f"in.{number}".encode(), partition=number % PARTITIONS, on_delivery=delivered)
        number += 1
        producer.poll(0)
        time.sleep(0.05)
    producer.flush(30)


def _debug_config() -> dict:
    """librdkafka's debug log (to stderr) for the stage's clients, when ``CTP_DEBUG_ENV`` is set."""
    return {"debug": "eos,protocol,cgrp,topic,broker,fetch"} if os.environ.get(CTP_DEBUG_ENV) else {}


def _transform(bootstrap: str, source: str, sink: str, seed: int, rec: Recorder, stop: threading.Event) -> None:
    rng = random.Random(seed + 1)
    tid, group = f"ctp-{seed}", f"ctp-{seed}"

    def consumer() -> Consumer:
        c = Consumer({**_debug_config(), "bootstrap.servers": bootstrap, "group.id": group,
                      "isolation.level": "read_committed", "enable.auto.commit": False,
                      "auto.offset.reset": "earliest", "session.timeout.ms": 6000, "fetch.wait.max.ms": 100,
                      "topic.metadata.refresh.interval.ms": 2000})
        c.subscribe([source])
        return c

    def rewind(c: Consumer) -> Consumer:
        """Back to the group's committed offsets (what the last committed transaction sent), or a new
        member when they cannot be had."""
        try:
            assigned = c.assignment()
            if assigned:
                for tp in c.committed(assigned, timeout=10):
                    c.seek(TopicPartition(source, tp.partition, tp.offset if tp.offset >= 0 else 0))
            return c
        except KafkaException as exc:
            rec.error("ctp rewind", exc)
            c.close()
            return consumer()

    c = consumer()
    producer = _producer(bootstrap, tid, stop, rec, extra=_debug_config())
    number = 0
    try:
        while not stop.is_set():
            messages = []
            for m in c.consume(num_messages=CTP_BATCH, timeout=0.5):
                if m.error() is None:
                    messages.append(m)
                else:
                    with rec.lock:
                        rec.errors[f"ctp consume: {m.error().name()}"] += 1
            if not messages:
                continue
            txn = f"ctp.{number}"
            number += 1
            records, sources, positions = [], [], {}
            commit = rng.random() < 0.85
            try:
                producer.begin_transaction()
                for m in messages:
                    value = f"{txn}:{m.value().decode()}".encode()
                    with rec.lock:
                        rec.derived[value] = m.value()
                    producer.produce(sink, value, partition=m.partition())
                    records.append((sink, m.partition(), value))
                    sources.append(m.value())
                    positions[m.partition()] = m.offset() + 1
                _send_offsets(producer, [TopicPartition(source, p, o) for p, o in sorted(positions.items())],
                              c.consumer_group_metadata())
            except (KafkaException, BufferError) as exc:
                rec.error("ctp produce", exc)
                commit = False
            except HungCall as exc:
                # Never asked to commit: the new instance's InitProducerId aborts the transaction.
                rec.error("ctp send_offsets_to_transaction hung (librdkafka#5511)", exc)
                rec.txn(tid, txn, "aborted", records)
                producer = _producer(bootstrap, tid, stop, rec, producer, _debug_config())
                c = rewind(c)
                continue
            outcome, usable = _end(producer, commit, rec, "ctp")
            rec.txn(tid, txn, outcome, records)
            if outcome == "committed":
                with rec.lock:
                    rec.covered.update(sources)
            if not usable:
                # A new instance fences the old one; then rewind.
                producer = _producer(bootstrap, tid, stop, rec, producer, _debug_config())
            if outcome != "committed":
                c = rewind(c)
            time.sleep(0.1)
    finally:
        try:  # where the stage stood, for the report
            assigned = c.assignment()
            rec.ctp_state = (f"transactions {number}, assignment {[tp.partition for tp in assigned]}, positions "
                             f"{[(tp.partition, tp.offset) for tp in c.position(assigned)]}")
        except KafkaException as exc:
            rec.ctp_state = f"transactions {number}, assignment unknown: {exc}"
        c.close()


def _reader(bootstrap: str, topics: list[str], name: str, rec: Recorder, stop: threading.Event) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{name}-reader", "isolation.level": "read_committed",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
                  "topic.metadata.refresh.interval.ms": 2000})
    try:
        c.assign([TopicPartition(t, p, 0) for t in topics for p in range(PARTITIONS)])
        while not stop.is_set():
            for m in c.consume(num_messages=500, timeout=0.2):
                if m.error() is None:
                    with rec.lock:
                        rec.reads.append(TxnRead(name, m.topic(), m.partition(), m.offset(), m.value()))
    finally:
        c.close()


def _stable(bootstrap: str, topics: list[str]) -> bool:
    """Every partition's last stable offset at its high watermark (no transaction left open)."""
    committed = Consumer({"bootstrap.servers": bootstrap, "group.id": "lso-probe", "isolation.level": "read_committed"})
    uncommitted = Consumer({"bootstrap.servers": bootstrap, "group.id": "hw-probe",
                            "isolation.level": "read_uncommitted"})
    try:
        for t in topics:
            for p in range(PARTITIONS):
                tp = TopicPartition(t, p)
                if committed.get_watermark_offsets(tp, 5)[1] != uncommitted.get_watermark_offsets(tp, 5)[1]:
                    return False
        return True
    finally:
        committed.close()
        uncommitted.close()


def _read_committed(bootstrap: str, topic: str, notes: list[str],
                    timeout_s: float = 60) -> dict[tuple[str, int], list]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("final"),
                  "isolation.level": "read_committed",
                  "enable.partition.eof": True, "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    out: dict[tuple[str, int], list] = {(topic, p): [] for p in range(PARTITIONS)}
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(at_end) < PARTITIONS and time.monotonic() < deadline:
            for m in c.consume(num_messages=500, timeout=0.5):
                if m.error() is None:
                    out[(topic, m.partition())].append((m.offset(), m.value()))
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(m.partition())
        if len(at_end) < PARTITIONS:
            notes.append(f"{topic}: the final read reached the end of {sorted(at_end)} only in {timeout_s} s")
        return out
    finally:
        c.close()


def _steps(seed: int, tids: list[str]) -> list[Step]:
    """Six steps: each of the four faults leads one and partners another, starting inside its hold; then two
    pairs drawn at random."""
    rng = random.Random(seed)

    def fault(kind: str):
        p = rng.randrange(PARTITIONS)
        if kind == "kill":
            return Kill(p, rng.uniform(0.5, 3.0))
        if kind == "kill-txn-coordinator":
            return TxnCoordinatorKill(p, rng.uniform(0.5, 3.0), transactional_id=rng.choice(tids))
        if kind == "pause-long":
            return Pause(p, LEASE_S + rng.uniform(1.0, 3.0))
        return EtcdCutLeader(p, rng.uniform(1.0, 5.0))

    leads = ["kill", "kill-txn-coordinator", "pause-long", "etcd-cut-leader"]
    partners = leads[1:] + leads[:1]
    rng.shuffle(partners)
    steps = []
    for lead_kind, partner_kind in zip(leads, partners, strict=True):
        lead, partner = fault(lead_kind), fault(partner_kind)
        steps.append(Step([(0.0, lead), (round(rng.uniform(0.0, lead.hold_s), 2), partner)], rng.uniform(1.0, 3.0)))
    for _extra in range(2):  # two more pairs drawn freely: a kind may meet itself (two coordinators killed)
        lead, partner = fault(rng.choice(leads)), fault(rng.choice(leads))
        steps.append(Step([(0.0, lead), (round(rng.uniform(0.0, lead.hold_s), 2), partner)], rng.uniform(1.0, 3.0)))
    return steps


def _catch_up(rec: Recorder) -> tuple[bool, float, int, str]:
    """Wait until every acknowledged input is covered by a committed output: (done, seconds, inputs left,
    why not). Gives up after ``CTP_QUIET_S`` without progress (a stall) or ``CTP_CATCH_UP_LIMIT_S`` in all."""
    started = last_progress = time.monotonic()
    best = None
    while True:
        with rec.lock:
            left = len(rec.inputs_acked - rec.covered)
        now = time.monotonic()
        if left == 0:
            return True, now - started, 0, ""
        if best is None or left < best:
            best, last_progress = left, now
        if now - last_progress > CTP_QUIET_S:
            return False, now - started, left, f"stalled: no input covered for {CTP_QUIET_S} s"
        if now - started > CTP_CATCH_UP_LIMIT_S:
            return False, now - started, left, f"still catching up after {CTP_CATCH_UP_LIMIT_S} s"
        time.sleep(0.5)


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if condition():
                return True
        except Exception:  # noqa: BLE001 - a broker still recovering: ask again
            pass
        time.sleep(0.5)
    return False


# The consume-transform-produce stage once stalled here in 2 of 6 runs: librdkafka's send_offsets_to_transaction
# blocking for good once the group coordinator's broker handle was decommissioned (``_send_offsets``,
# docs/transactions.md). 62-115 s a run on the 2-core CI machine.
# 60-115 s on a 2-core machine: left out of CI's 45 minutes, where the short nemesis run of test_jepsen.py stays;
# `./tests/run.sh -m slow` runs it.
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_transactions_hold_under_overlapping_faults(tmp_path):
    available, why = NetLab.available()
    if not available:
        pytest.skip(why)
    seed = int(os.environ.get(SEED_ENV) or random.randrange(10**6))
    print(f"nemesis seed {seed} (replay: {SEED_ENV}={seed})")
    topic, source, sink = unique_topic("jtxn"), unique_topic("jin"), unique_topic("jout")
    config = {"transaction.state.log.num.partitions": TXN_STATE_PARTITIONS,
              "transaction.state.log.replication.factor": 3}
    with stage(tmp_path, topic, PARTITIONS, seed=seed, config=config) as st:
        cluster = st.cluster
        for name in (source, sink):
            cluster.create_topic(name, PARTITIONS, 3, configs={"min.insync.replicas": "2"})
            cluster.wait_for_isr(name, PARTITIONS, 3)
        bootstrap = ",".join(b.bootstrap for b in cluster.brokers.values())
        rec = Recorder()
        stop_writers, stop_ctp, stop_readers = threading.Event(), threading.Event(), threading.Event()
        tids = [f"alpha-{seed}", f"beta-{seed}", f"zombie-{seed}", f"ctp-{seed}"]
        threads = [threading.Thread(target=_transactions, args=(bootstrap, topic, name, seed + i, rec, stop_writers),
                                    daemon=True) for i, name in enumerate(("alpha", "beta"))]
        threads.append(threading.Thread(target=_zombies, args=(bootstrap, topic, seed, rec, stop_writers), daemon=True))
        threads.append(threading.Thread(target=_inputs, args=(bootstrap, source, rec, stop_writers), daemon=True))
        ctp = threading.Thread(target=_transform, args=(bootstrap, source, sink, seed, rec, stop_ctp), daemon=True)
        readers = [threading.Thread(target=_reader, args=(bootstrap, [topic, sink], f"reader{i}", rec, stop_readers),
                                    daemon=True) for i in range(2)]
        for thread in [*threads, ctp, *readers]:
            thread.start()
        notes: list[str] = []
        nemesis = Nemesis(st)
        try:
            _wait(lambda: len(rec.txns) >= 10 and rec.covered, 60)  # the coordinators exist before the faults
            nemesis.run(iter(_steps(seed, tids)), SCHEDULE_LIMIT_S)
        finally:
            nemesis.heal_everything()
            stop_writers.set()
        for thread in threads:
            thread.join(120)
            if thread.is_alive():
                notes.append(f"writer {thread.name} did not finish within 120 s of the heal")
        with rec.lock:
            backlog = len(rec.inputs_acked - rec.covered)
        caught_up, catch_up_s, left, why = _catch_up(rec)
        catch_up = f"{backlog} inputs to transform once the writers stopped, {catch_up_s:.0f} s to catch up"
        if not caught_up:
            notes.append(f"consume-transform-produce did not commit every acknowledged input ({why}): {left} left")
        stop_ctp.set()
        ctp.join(60)
        if ctp.is_alive():  # where it hangs, for the report
            frame = sys._current_frames().get(ctp.ident)
            notes.append("consume-transform-produce still running 60 s after its stop: "
                         + "".join(traceback.format_stack(frame)[-4:]) if frame else "(no frame)")
        if not _wait(lambda: _stable(bootstrap, [topic, source, sink]), 60):
            notes.append("some partition's last stable offset stayed below its high watermark 60 s after the end")
        group_offsets = None
        probe = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ctp-{seed}",
                          "isolation.level": "read_committed", "enable.auto.commit": False})
        try:
            group_offsets = {tp.partition: tp.offset for tp in probe.committed(
                [TopicPartition(source, p) for p in range(PARTITIONS)], timeout=30)}
        except KafkaException as exc:
            notes.append(f"the group's committed offsets could not be read: {exc}")
        finally:
            probe.close()
        final: dict = {}
        for name in (topic, source, sink):
            final.update(_read_committed(bootstrap, name, notes))
        stop_readers.set()
        for thread in readers:
            thread.join(30)
        with rec.lock:
            history = TxnHistory(txns=list(rec.txns), reads=list(rec.reads), final=final, input_topic=source,
                                 output_topic=sink,
                                 inputs=[v for p in range(PARTITIONS) for _o, v in final[(source, p)]],
                                 derived=dict(rec.derived), group_offsets=group_offsets)
        anomalies = check_transactions(history)
        # Every record of the transactional topics belongs to a recorded transaction (else the checker
        # could not judge it).
        owned = {value for t in history.txns for _t, _p, value in t.records}
        stray = [(key, offset, value) for key, records in final.items() if key[0] != source
                 for offset, value in records if value not in owned]
        if stray:
            notes.append(f"{len(stray)} records read that no recorded transaction wrote: {stray[:5]}")
        outcomes = Counter(t.outcome for t in history.txns)
        report = "\n".join([f"seed {seed}: transactions {dict(outcomes)}, {len(history.reads)} records read live, "
                            f"{len(history.inputs)} inputs, client errors {dict(rec.errors)}; "
                            f"consume-transform-produce at the end: {rec.ctp_state} ({catch_up}); "
                            f"faults {nemesis.injected}; anomalies {txn_counts(anomalies)}",
                            *(f"  anomaly {a}" for a in anomalies[:30]), *(f"  note: {n}" for n in notes),
                            *(f"  fencing: {f}" for f in rec.fencing_failures), "timeline:", *nemesis.timeline,
                            f"replay with {SEED_ENV}={seed}"])
        print(report)

        assert not anomalies, report
        assert not rec.fencing_failures, report
        assert not notes, report
        assert {"kill", "kill-txn-coordinator", "pause-long", "etcd-cut-leader"} <= set(nemesis.injected), report
        # Enough of everything happened to mean something.
        assert outcomes["committed"] >= 20 and outcomes["aborted"] >= 5 and outcomes["fenced"] >= 3, report
        assert len(history.inputs) >= 200 and history.reads, report
