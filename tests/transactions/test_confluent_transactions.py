"""Transactions through librdkafka (confluent-kafka) against a real broker subprocess: a transactional
producer and read_committed consumers.

What each test pins down: committed records are seen and aborted ones never by read_committed (and both by
read_uncommitted); an open transaction holds read_committed consumers at its first offset (the LSO), even
for records committed after it by another producer; a producer killed with -9 mid-transaction has its
transaction aborted by the coordinator's timeout, and only then do the records behind it become visible; a
second producer with the same transactional id fences the first (its commit fails fatally, its records are
aborted); consumed offsets sent in a transaction are visible to the group only once it commits; and a broker
killed with -9 comes back with the open transaction still holding the LSO and the aborted transactions
still hidden.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from tests.support.polling import wait_until  # noqa: E402
from tests.support.read_back import read_topic_to_end  # noqa: E402
from tests.support.topics import create_topic, unique_topic  # noqa: E402

pytestmark = pytest.mark.timeout(120)

# The coordinator looks for timed-out transactions this often (Kafka's default: 10 s).
FAST_TIMEOUTS = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": 200}


def _producer(bootstrap: str, transactional_id: str, timeout_ms: int = 60_000) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "transaction.timeout.ms": timeout_ms, "linger.ms": 5})
    producer.init_transactions(30)
    return producer


def _produce_txn(producer: Producer, topic: str, values: list[str], *, commit: bool) -> None:
    producer.begin_transaction()
    for i, value in enumerate(values):
        producer.produce(topic, value.encode(), partition=i % 2)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def test_commit_and_abort_are_seen_as_committed(broker_factory):
    broker = broker_factory()
    topic = unique_topic("txn")
    create_topic(broker.bootstrap, topic)
    producer = _producer(broker.bootstrap, unique_topic("tid"))
    _produce_txn(producer, topic, [f"c{i}" for i in range(6)], commit=True)
    _produce_txn(producer, topic, [f"a{i}" for i in range(6)], commit=False)
    _produce_txn(producer, topic, [f"d{i}" for i in range(4)], commit=True)
    committed = sorted([f"c{i}" for i in range(6)] + [f"d{i}" for i in range(4)])
    assert read_topic_to_end(broker.bootstrap, topic, "read_committed") == committed
    assert read_topic_to_end(broker.bootstrap, topic, "read_uncommitted") == sorted(
        committed + [f"a{i}" for i in range(6)])


def test_open_transaction_holds_read_committed_at_its_first_offset(broker_factory):
    broker = broker_factory()
    topic = unique_topic("txn-lso")
    create_topic(broker.bootstrap, topic)
    first = _producer(broker.bootstrap, unique_topic("tid"))
    second = _producer(broker.bootstrap, unique_topic("tid"))
    _produce_txn(first, topic, ["before0", "before1"], commit=True)
    first.begin_transaction()
    first.produce(topic, b"open0", partition=0)
    first.produce(topic, b"open1", partition=1)
    first.flush(30)
    # Committed after the open transaction began: behind its first offset, so not yet readable.
    _produce_txn(second, topic, ["after0", "after1"], commit=True)
    assert read_topic_to_end(broker.bootstrap, topic, "read_committed") == ["before0", "before1"]
    assert read_topic_to_end(broker.bootstrap, topic, "read_uncommitted") == sorted(
        ["before0", "before1", "open0", "open1", "after0", "after1"])
    first.commit_transaction(30)
    assert read_topic_to_end(broker.bootstrap, topic, "read_committed") == sorted(
        ["before0", "before1", "open0", "open1", "after0", "after1"])


_CRASHING_PRODUCER = textwrap.dedent("""
    import sys, time
    from confluent_kafka import Producer
    bootstrap, topic, tid = sys.argv[1:4]
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "transaction.timeout.ms": 6000})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(4):
        p.produce(topic, f"lost{i}".encode(), partition=i % 2)
    p.flush(30)
    print("ready", flush=True)
    time.sleep(120)
""")


def test_a_killed_producer_is_aborted_by_its_timeout(broker_factory):
    broker = broker_factory(config=FAST_TIMEOUTS)
    topic = unique_topic("txn-crash")
    create_topic(broker.bootstrap, topic)
    tid = unique_topic("tid")
    child = subprocess.Popen([sys.executable, "-c", _CRASHING_PRODUCER, broker.bootstrap, topic, tid],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
    finally:
        child.kill()
        child.wait(10)
    other = _producer(broker.bootstrap, unique_topic("tid"))
    _produce_txn(other, topic, ["kept0", "kept1"], commit=True)
    # Until its 6 s timeout aborts it, the dead producer's transaction holds the LSO below "kept*".
    assert read_topic_to_end(broker.bootstrap, topic, "read_committed") == []
    wait_until(lambda: read_topic_to_end(broker.bootstrap, topic, "read_committed") == ["kept0", "kept1"], timeout_s=30,
               interval_s=0.5, what="the killed producer's transaction aborted by its timeout")
    assert sorted(read_topic_to_end(broker.bootstrap, topic, "read_uncommitted")) == sorted(
        ["kept0", "kept1"] + [f"lost{i}" for i in range(4)])
    assert "open for more than 6000 ms aborted" in broker.log_text()
    # The same transactional id starts again (epoch bumped past the fenced one) and commits.
    again = _producer(broker.bootstrap, tid)
    _produce_txn(again, topic, ["again0"], commit=True)
    assert "again0" in read_topic_to_end(broker.bootstrap, topic, "read_committed")


def test_a_second_producer_with_the_same_id_fences_the_first(broker_factory):
    broker = broker_factory()
    topic = unique_topic("txn-zombie")
    create_topic(broker.bootstrap, topic)
    tid = unique_topic("tid")
    zombie = _producer(broker.bootstrap, tid)
    zombie.begin_transaction()
    zombie.produce(topic, b"zombie0", partition=0)
    zombie.flush(30)
    successor = _producer(broker.bootstrap, tid)  # aborts the zombie's transaction, bumps the epoch
    _produce_txn(successor, topic, ["new0", "new1"], commit=True)
    with pytest.raises(KafkaException) as raised:
        zombie.produce(topic, b"zombie1", partition=1)
        zombie.commit_transaction(30)
    error = raised.value.args[0]
    assert error.fatal() or error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                             KafkaError.INVALID_PRODUCER_EPOCH), error
    assert read_topic_to_end(broker.bootstrap, topic, "read_committed") == ["new0", "new1"]
    assert "zombie1" not in read_topic_to_end(broker.bootstrap, topic, "read_uncommitted")


def _committed(bootstrap: str, group: str, topic: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return [tp.offset for tp in consumer.committed([TopicPartition(topic, p) for p in range(2)], timeout=20)]
    finally:
        consumer.close()


def test_offsets_sent_in_a_transaction_show_only_on_commit(broker_factory):
    broker = broker_factory()
    source, sink = unique_topic("src"), unique_topic("sink")
    create_topic(broker.bootstrap, source)
    create_topic(broker.bootstrap, sink)
    group = unique_topic("ctp")
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    producer = _producer(broker.bootstrap, unique_topic("tid"))
    try:
        metadata = consumer.consumer_group_metadata()
        producer.begin_transaction()
        producer.produce(sink, b"out-aborted", partition=0)
        producer.send_offsets_to_transaction([TopicPartition(source, 0, 5), TopicPartition(source, 1, 7)], metadata, 30)
        producer.abort_transaction(30)
        assert _committed(broker.bootstrap, group, source) == [-1001, -1001]
        producer.begin_transaction()
        producer.produce(sink, b"out-committed", partition=0)
        producer.send_offsets_to_transaction([TopicPartition(source, 0, 3), TopicPartition(source, 1, 4)], metadata, 30)
        producer.commit_transaction(30)
        assert _committed(broker.bootstrap, group, source) == [3, 4]
    finally:
        consumer.close()
    # The offsets' transaction state survives a restart: rebuilt from __consumer_offsets' log.
    broker.restart("kill")
    assert _committed(broker.bootstrap, group, source) == [3, 4]
    assert read_topic_to_end(broker.bootstrap, sink, "read_committed") == ["out-committed"]


def test_a_restart_recovers_the_open_and_the_aborted_transactions(broker_factory):
    broker = broker_factory(config=FAST_TIMEOUTS)
    topic = unique_topic("txn-restart")
    create_topic(broker.bootstrap, topic)
    producer = _producer(broker.bootstrap, unique_topic("tid"))
    _produce_txn(producer, topic, ["c0", "c1"], commit=True)
    _produce_txn(producer, topic, ["a0", "a1"], commit=False)
    tid = unique_topic("tid")
    child = subprocess.Popen([sys.executable, "-c", _CRASHING_PRODUCER.replace("6000", "8000"), broker.bootstrap,
                              topic, tid], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
    finally:
        child.kill()
        child.wait(10)
    _produce_txn(producer, topic, ["d0", "d1"], commit=True)
    assert read_topic_to_end(broker.bootstrap, topic, "read_committed") == ["c0", "c1"]
    broker.restart("kill")
    # After the restart: the aborted transaction is still hidden, the open one still holds the LSO ...
    assert read_topic_to_end(broker.bootstrap, topic, "read_committed") == ["c0", "c1"]
    assert "open transaction(s), last stable offset" in broker.log_text()
    # ... until the coordinator, which recovered it Ongoing, aborts it at its timeout.
    wait_until(lambda: read_topic_to_end(broker.bootstrap, topic, "read_committed") == ["c0", "c1", "d0", "d1"],
               timeout_s=40, interval_s=0.5, what="the open transaction aborted after the restart")
    assert len(read_topic_to_end(broker.bootstrap, topic, "read_uncommitted")) == 10


def test_read_committed_records_still_leave_by_sendfile(broker_factory):
    """The LSO and the aborted list change where a region ends and what the header says, never the path:
    every fetched record byte is counted by the broker as sent with sendfile, none as copied."""
    broker = broker_factory(config={"stats.interval.s": 0.5})
    topic = unique_topic("txn-zero-copy")
    create_topic(broker.bootstrap, topic)
    producer = _producer(broker.bootstrap, unique_topic("tid"))
    big = [f"{i:04d}" + "x" * 2000 for i in range(100)]
    _produce_txn(producer, topic, big, commit=True)
    _produce_txn(producer, topic, ["aborted"] * 10, commit=False)
    since = broker.log_size()
    assert read_topic_to_end(broker.bootstrap, topic, "read_committed") == sorted(big)
    stats = wait_until(lambda: (lambda s: s if s and s.get("fetch_sendfile_bytes", 0) >= 200_000 else None)(
        broker.stats(since)), what="a stats line counting the fetches", timeout_s=15, interval_s=0.2)
    assert stats["fetch_copied_bytes"] == 0, stats


def test_metrics_count_transactions_and_show_the_lso(broker_factory):
    from tests.support.metrics import metrics_address, scrape, value

    broker = broker_factory(extra_args=("--metrics-listen", "127.0.0.1:0"))
    address = metrics_address(broker)
    topic = unique_topic("txn-metrics")
    create_topic(broker.bootstrap, topic)
    producer = _producer(broker.bootstrap, unique_topic("tid"))
    _produce_txn(producer, topic, ["c0", "c1"], commit=True)
    _produce_txn(producer, topic, ["a0", "a1"], commit=False)
    producer.begin_transaction()
    producer.produce(topic, b"open", partition=0)
    producer.flush(30)
    samples = wait_until(lambda: (s := scrape(address)) and value(s, "copyless_transactions_total",
                                                                     outcome="aborted") == 1 and s,
                         what="the abort counted", timeout_s=10)
    assert value(samples, "copyless_transactions_total", outcome="committed") == 1
    assert value(samples, "copyless_transaction_markers_total") == 4  # two partitions, two transactions
    assert value(samples, "copyless_open_transactions") == 1
    # Partition 0: c0, COMMIT, a0, ABORT, then the open transaction's first batch at offset 4.
    assert value(samples, "copyless_partition_last_stable_offset", topic=topic, partition="0") == 4
    assert value(samples, "copyless_partition_high_watermark", topic=topic, partition="0") == 5
    producer.commit_transaction(30)
    samples = wait_until(lambda: (s := scrape(address)) and value(s, "copyless_open_transactions") == 0 and s,
                         what="the transaction closed", timeout_s=10)
    assert value(samples, "copyless_partition_last_stable_offset", topic=topic, partition="0") == 6


def _member(bootstrap: str, group: str, topic: str, **config) -> Consumer:
    """A consumer that has joined ``group`` and holds an assignment of ``topic``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "session.timeout.ms": 6000, **config})
    consumer.subscribe([topic])
    wait_until(lambda: consumer.poll(0.2) is None and bool(consumer.assignment()), timeout_s=30, interval_s=0,
               what="an assignment")
    return consumer


def test_a_zombie_whose_consumer_left_the_group_cannot_commit_offsets(broker_factory):
    """KIP-447: TxnOffsetCommit v3 carries the consumer's generation and member id; once that member has
    left the group, the producer holding its metadata is refused and its transaction must abort."""
    broker = broker_factory()
    source, sink = unique_topic("src"), unique_topic("sink")
    create_topic(broker.bootstrap, source)
    create_topic(broker.bootstrap, sink)
    group = unique_topic("zombie")
    old = _member(broker.bootstrap, group, source)
    stale = old.consumer_group_metadata()
    old.close()  # leaves: the group moves on without that member
    new = _member(broker.bootstrap, group, source)
    producer = _producer(broker.bootstrap, unique_topic("tid"))
    try:
        producer.begin_transaction()
        producer.produce(sink, b"from-the-zombie", partition=0)
        with pytest.raises(KafkaException) as raised:
            producer.send_offsets_to_transaction([TopicPartition(source, 0, 5)], stale, 30)
        error = raised.value.args[0]
        assert error.code() in (KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION), error
        assert error.txn_requires_abort(), error
        producer.abort_transaction(30)
        # The live member's metadata is accepted.
        producer.begin_transaction()
        producer.produce(sink, b"from-the-member", partition=0)
        producer.send_offsets_to_transaction([TopicPartition(source, 0, 5)], new.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
    finally:
        new.close()
    assert _committed(broker.bootstrap, group, source) == [5, -1001]
    assert read_topic_to_end(broker.bootstrap, sink, "read_committed") == ["from-the-member"]


def test_a_read_committed_member_taking_over_mid_transaction_starts_at_the_pending_offset(broker_factory):
    """KIP-447: librdkafka's read_committed consumer asks OffsetFetch with require_stable; while a
    transaction holds the group's offset for the partition, it is told UNSTABLE_OFFSET_COMMIT and asks again,
    so it starts at the offset the transaction commits, never at the one before (which would transform the
    records in between twice)."""
    broker = broker_factory()
    source, sink = unique_topic("src"), unique_topic("sink")
    create_topic(broker.bootstrap, source, partitions=1)
    create_topic(broker.bootstrap, sink)
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        plain.produce(source, b"in%d" % i, partition=0)
    plain.flush(30)
    group = unique_topic("takeover")
    committer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    committer.commit(offsets=[TopicPartition(source, 0, 2)], asynchronous=False)
    producer = _producer(broker.bootstrap, unique_topic("tid"))
    producer.begin_transaction()
    producer.produce(sink, b"out2-4", partition=0)
    producer.send_offsets_to_transaction([TopicPartition(source, 0, 5)], committer.consumer_group_metadata(), 30)
    committer.close()
    # The transaction is open: a new read_committed member takes the partition over.
    taker = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False,
                      "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    try:
        taker.subscribe([source])
        early = [m for m in (taker.poll(0.5) for _ in range(8)) if m is not None and not m.error()]
        assert early == [], [(m.offset(), m.value()) for m in early]
        producer.commit_transaction(30)
        first = wait_until(lambda: (lambda m: m if m is not None and not m.error() else None)(taker.poll(0.5)),
                           timeout_s=30, interval_s=0, what="a record after the commit")
        assert first.offset() == 5, (first.offset(), first.value())
    finally:
        taker.close()


def test_records_deleted_past_an_open_transaction_move_the_lso_to_the_log_start(broker_factory):
    """Kafka 3.9 bounds retention and DeleteRecords by the high watermark only, not by the LSO
    (``UnifiedLog.deletableSegments``, ``maybeIncrementLogStartOffset``), and the first unstable offset is
    then the log start (``maybeIncrementFirstUnstableOffset``): the LSO never falls below the log start, so
    read_committed consumers never see a range whose end is before its beginning."""
    broker = broker_factory()
    topic = unique_topic("txn-deleted")
    create_topic(broker.bootstrap, topic, partitions=1)
    producer = _producer(broker.bootstrap, unique_topic("tid"))
    producer.begin_transaction()
    producer.produce(topic, b"t0", partition=0)
    producer.flush(30)
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    for value in (b"p1", b"p2"):
        plain.produce(topic, value, partition=0)
    plain.flush(30)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    [(_tp, future)] = admin.delete_records([TopicPartition(topic, 0, 2)]).items()
    assert future.result(30).low_watermark == 2
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique_topic("reader"),
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        # While the transaction is open: the LSO is the log start (2), not its first offset (0).
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=20, cached=False) == (2, 2)
        producer.commit_transaction(30)
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=20, cached=False) == (2, 4)
        consumer.assign([TopicPartition(topic, 0, 2)])
        first = wait_until(lambda: (lambda m: m if m is not None and not m.error() else None)(consumer.poll(0.5)),
                           timeout_s=20, interval_s=0, what="the record after the log start")
        assert (first.offset(), first.value()) == (2, b"p2")
    finally:
        consumer.close()


def _replayed(log_text: str) -> int:
    """The batches the last start-up replayed to load producer state (its "broker state loaded" line)."""
    lines = [line for line in log_text.splitlines() if "broker state loaded" in line]
    return int(lines[-1].split("batches replayed=")[1].split()[0])


def test_restarts_load_transactions_from_snapshots_and_aborted_transaction_indexes(broker_factory):
    """A transactional partition of many segments: after a clean shutdown the restart replays no batch (the
    snapshots written at shutdown), after a kill -9 only the batches after the last roll's snapshot; both
    times read_committed reads exactly the committed records (the aborted ones come from the .txnindex
    files), and a transaction open across the kill is still open, then committed."""
    broker = broker_factory()
    topic = unique_topic("snapshots")
    create_topic(broker.bootstrap, topic, config={"segment.bytes": str(64 << 10)})
    producer = _producer(broker.bootstrap, unique_topic("tid"))
    committed = []
    for number in range(100):
        values = [f"{number}-{i}-" + "x" * 1000 for i in range(10)]
        _produce_txn(producer, topic, values, commit=number % 3 != 1)
        committed += values if number % 3 != 1 else []
    directory = broker.data_dir / f"{topic}-0"
    assert len(list(directory.glob("*.log"))) >= 5
    assert list(directory.glob("*.txnindex")) and list(directory.glob("*.snapshot"))

    broker.restart("graceful")
    assert _replayed(broker.log_text()) == 0
    assert sorted(read_topic_to_end(broker.bootstrap, topic, "read_committed")) == sorted(committed)

    producer = _producer(broker.bootstrap, unique_topic("tid"))
    for number in range(100, 110):
        values = [f"{number}-{i}-" + "x" * 1000 for i in range(10)]
        _produce_txn(producer, topic, values, commit=number % 3 != 1)
        committed += values if number % 3 != 1 else []
    producer.begin_transaction()
    for i in range(4):
        producer.produce(topic, f"open-{i}".encode(), partition=i % 2)
    producer.flush(30)
    broker.restart("kill")
    # A scan of the whole log would read more than the topic's 220 markers alone.
    replayed = _replayed(broker.log_text())
    assert 0 < replayed < 2 * 110, f"replayed {replayed} batches"
    assert sorted(read_topic_to_end(broker.bootstrap, topic, "read_committed")) == sorted(committed)
    producer.commit_transaction(60)
    committed += [f"open-{i}" for i in range(4)]
    assert sorted(read_topic_to_end(broker.bootstrap, topic, "read_committed")) == sorted(committed)


def test_a_data_dir_written_before_snapshots_loads_by_the_scan_and_then_has_them(broker_factory):
    """Upgrade: a data dir with no .snapshot and no .txnindex file (what the broker wrote before them; the
    `transactional` file is there) loads by the whole-log scan, reads the same, and the next start has a
    snapshot at the log end to start from."""
    broker = broker_factory()
    topic = unique_topic("upgrade")
    create_topic(broker.bootstrap, topic, config={"segment.bytes": str(64 << 10)})
    producer = _producer(broker.bootstrap, unique_topic("tid"))
    committed = []
    for number in range(30):
        values = [f"{number}-{i}-" + "x" * 1000 for i in range(10)]
        _produce_txn(producer, topic, values, commit=number % 3 != 1)
        committed += values if number % 3 != 1 else []
    port = broker.port
    assert broker.stop() == 0
    removed = [path for pattern in ("*/*.snapshot", "*/*.txnindex") for path in broker.data_dir.glob(pattern)]
    assert any(path.suffix == ".txnindex" for path in removed)
    for path in removed:
        path.unlink()
    assert (broker.data_dir / f"{topic}-0" / "transactional").exists()
    broker.start(port=port)
    assert _replayed(broker.log_text()) > 2 * 30  # every batch, the topic's 60 markers among them
    assert sorted(read_topic_to_end(broker.bootstrap, topic, "read_committed")) == sorted(committed)
    assert list((broker.data_dir / f"{topic}-0").glob("*.txnindex"))
    broker.restart("graceful")
    assert _replayed(broker.log_text()) == 0
    assert sorted(read_topic_to_end(broker.bootstrap, topic, "read_committed")) == sorted(committed)
