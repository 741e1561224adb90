"""The workload of the fault tests, and the history it leaves for ``tests.support.checker``.

- ``AckedStream``: an idempotent acks=all librdkafka producer on a thread of its own, about ``rate``
  records a second, value = a global sequence number (``%09d``), to partition ``sequence % partitions``;
  every send and every acknowledgement is kept. A fatal idempotence error retires that producer (what it
  held fails) and a new one, a new producer id and a new name in the history, goes on.
- ``Poller``: a plain consumer (librdkafka, ``assign`` from offset 0, no group) reading every partition for
  the whole run; every record it is handed is a poll, its start a seek to 0.
- group members (``tests.support.groups.Member``: a librdkafka and a kafka-python process) consuming with
  synchronous commits; their "consumed" events are polls, each "assigned" a seek to an offset the history
  does not know, and assigned .. revoked the interval they held a partition.

``read_partition`` reads a partition back from 0 to its high watermark; ``history_of`` gathers everything
(the final logs, each broker's segment files, each broker's "leader at epoch" log lines) into a
``History``.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tests.support.checker import Ack, History, LeaderClaim, Ownership, Poll, ReplicaBatch, Seek, Send
from tests.support.groups import read_events
from tests.support.log_files import read_partition_log
from tests.support.polling import wait_until

__all__ = ["AckedStream", "Poller", "read_partition", "history_of", "LEADER_LINE"]

LEADER_LINE = re.compile(r"(?P<topic>\S+)-(?P<partition>\d+): leader at epoch (?P<epoch>\d+) from offset \d+")


@dataclass
class AckedStream:
    bootstrap: str
    topic: str
    partitions: int
    rate: float = 90.0
    sends: list[Send] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    fatal: list[str] = field(default_factory=list)
    sent: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._errors: list[KafkaError] = []
        self._producers = 0
        self._thread = threading.Thread(target=self._run, name="acked-stream", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, flush_s: float = 120) -> None:
        self._flush_s = flush_s
        self._stop.set()
        self._thread.join(timeout=flush_s + 30)
        assert not self._thread.is_alive(), "the producer did not finish flushing"

    def _new_producer(self) -> tuple[Producer, str]:
        self._producers += 1
        return Producer({
            "bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            # Long enough to ride out overlapping faults: records fail only if a partition stays
            # unavailable this long.
            "message.timeout.ms": 60000, "socket.timeout.ms": 10000,
            "topic.metadata.refresh.interval.ms": 2000, "error_cb": self._on_error,
        }), f"producer{self._producers}"

    def _on_error(self, error: KafkaError) -> None:
        # Kept raw and read later: librdkafka may call this while a Python exception is pending, and any
        # call that checks for one (str(), a method) then fails with SystemError.
        self._errors.append(error)

    def _delivered(self, name: str, sequence: int):
        def report(error, message) -> None:
            if error is None:
                self.acks.append(Ack(name, sequence, message.partition(), message.offset(), message.value()))
            else:
                self.failed[sequence] = str(error)
        return report

    def _run(self) -> None:
        producer, name = self._new_producer()
        fatal_seen = 0
        interval_s = 1.0 / self.rate
        next_send = time.monotonic()
        while not self._stop.is_set():
            try:
                fatal = [error for error in self._errors[fatal_seen:] if error.fatal()]
                fatal_seen = len(self._errors)
                if fatal:
                    raise KafkaException(fatal[0])
                value = b"%09d" % self.sent
                partition = self.sent % self.partitions
                try:
                    producer.produce(self.topic, value, partition=partition,
                                     on_delivery=self._delivered(name, self.sent))
                except BufferError:
                    producer.poll(0.1)
                    continue
                self.sends.append(Send(name, self.sent, partition, value))
                self.sent += 1
                producer.poll(0)
                next_send += interval_s
                pause_s = next_send - time.monotonic()
                if pause_s > 0:
                    producer.poll(pause_s)
                else:
                    next_send = time.monotonic()
            except KafkaException as exc:
                self.fatal.append(str(exc))
                self._retire(producer)
                producer, name = self._new_producer()
        self._retire(producer, flush_s=getattr(self, "_flush_s", 120))

    def _retire(self, producer: Producer, flush_s: float = 10) -> None:
        try:
            producer.flush(flush_s)
        except KafkaException as exc:
            self.fatal.append(str(exc))
            try:
                producer.purge()
                producer.flush(10)
            except KafkaException:
                pass


@dataclass
class Poller:
    """A plain consumer of every partition from offset 0, on a thread of its own (see the module docstring).
    Offsets out of range are not reset silently: librdkafka's ``auto.offset.reset`` is ``earliest``, so a
    reset shows as a poll going back to a lower offset, which the checker reports."""

    bootstrap: str
    topic: str
    partitions: int
    name: str = "poller"
    polls: list[Poll] = field(default_factory=list)
    seeks: list[Seek] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._index = 0
        self._thread = threading.Thread(target=self._run, name="poller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _reached(self) -> dict[int, int]:
        reached: dict[int, int] = {}
        for poll in list(self.polls):
            reached[poll.partition] = max(reached.get(poll.partition, -1), poll.offset)
        return reached

    def caught_up(self, final: dict[int, list]) -> bool:
        reached = self._reached()
        return all(reached.get(p, -1) >= len(records) - 1 for p, records in final.items())

    def progress(self, final: dict[int, list]) -> str:
        """Where the poller is against the final logs, per partition: for a note when it did not catch up."""
        reached = self._reached()
        last = self.polls[-1:]
        return ", ".join(f"p{p} polled to {reached.get(p, -1)} of {len(records) - 1}" for p, records in final.items()) \
            + (f"; last poll at index {last[0].index}" if last else "; nothing polled")

    def _run(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"{self.name}-{self.topic}",
                             "enable.auto.commit": False, "auto.offset.reset": "earliest",
                             "fetch.wait.max.ms": 100, "topic.metadata.refresh.interval.ms": 2000})
        try:
            consumer.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
            for p in range(self.partitions):
                self.seeks.append(Seek(self.name, self._index, p, 0))
                self._index += 1
            while not self._stop.is_set():
                for message in consumer.consume(num_messages=500, timeout=0.2):
                    error = message.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            self.errors.append(str(error))
                        continue
                    self.polls.append(Poll(self.name, self._index, message.partition(), message.offset(),
                                           message.value()))
                    self._index += 1
        finally:
            consumer.close()


def read_partition(bootstrap: str, topic: str, partition: int, timeout_s: float = 60) -> list[tuple[int, bytes]]:
    """Every record of one partition, from offset 0 to its high watermark, with a plain consumer. Leadership
    may still move (the preferred leader takes its partitions back): errors saying so are retried."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"final-reader-{partition}",
                         "enable.auto.commit": False, "enable.partition.eof": True, "fetch.wait.max.ms": 100})
    try:
        def high_watermark():
            try:
                return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            except KafkaException:
                # Leadership still moving after the faults (not leader, unknown partition while leaderless):
                # asked again until the deadline, which then names what was awaited.
                return None
        _low, high = wait_until(high_watermark, what=f"partition {partition}'s high watermark", timeout_s=timeout_s)
        consumer.assign([TopicPartition(topic, partition, 0)])
        out: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + timeout_s
        while (not out or out[-1][0] < high - 1) and high > 0 and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=1000, timeout=0.5):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF or error.retriable():
                        continue
                    raise AssertionError(f"reading partition {partition}: {error}")
                out.append((message.offset(), message.value()))
        return out
    finally:
        consumer.close()


def group_history(event_paths, end_t: float) -> tuple[list[Poll], list[Seek], list[Ownership]]:
    """The group members' events as polls, seeks (each assignment) and ownership intervals."""
    polls: list[Poll] = []
    seeks: list[Seek] = []
    ownership: list[Ownership] = []
    held: dict[tuple[str, int], float] = {}
    index: dict[str, int] = {}
    for event in read_events(event_paths):
        member = f"member-{event.get('client', '?')}"
        i = index[member] = index.get(member, -1) + 1
        kind = event["event"]
        if kind == "consumed":
            polls.append(Poll(member, i, event["partition"], event["offset"], event["value"].encode()))
        elif kind == "assigned":
            for p in event["partitions"]:
                seeks.append(Seek(member, i, p, None))
                held.setdefault((member, p), event["t"])
        elif kind in ("revoked", "closed"):
            for (who, p), start in list(held.items()):
                if who == member and (kind == "closed" or p in event.get("partitions", ())):
                    ownership.append(Ownership(member, p, start, event["t"]))
                    del held[(who, p)]
    for (member, p), start in held.items():
        ownership.append(Ownership(member, p, start, end_t))
    return polls, seeks, ownership


def history_of(cluster, topic: str, partitions: int, stream: AckedStream, poller: Poller | None,
               final: dict[int, list[tuple[int, bytes]]], member_events=(), end_t: float | None = None) -> History:
    history = History(topic=topic, sends=list(stream.sends), acks=list(stream.acks), final=final)
    if poller is not None:
        history.polls += poller.polls
        history.seeks += poller.seeks
    polls, seeks, ownership = group_history(member_events, end_t if end_t is not None else time.monotonic())
    history.polls += polls
    history.seeks += seeks
    history.ownership = ownership
    for p in range(partitions):
        history.replicas[p] = {
            node: [ReplicaBatch(b.base_offset, b.last_offset, b.data)
                   for b in read_partition_log(broker.data_dir, topic, p)]
            for node, broker in cluster.brokers.items()}
    for node, broker in cluster.brokers.items():
        for match in LEADER_LINE.finditer(broker.log_text()):
            history.leaders.append(LeaderClaim(node, match["topic"], int(match["partition"]), int(match["epoch"])))
    return history
