"""copyless's own client in transactions, against a real broker subprocess: its transactional producer and
its read_committed consumer, checked against each other and against librdkafka's read_committed consumer.

What each test pins down: committed records are read and aborted ones never, also when another producer's
aborted transaction interleaves with committed batches on the same partitions (the consumer skips by the
broker's aborted-transactions list, per producer, up to each abort marker) and control batches never reach
the application; consume-transform-produce commits the consumed offsets with the output, and an aborted
round leaves both unseen; a second producer with the same transactional id fences the first, whose commit
raises ``ProducerFencedError`` and whose records stay invisible; a batch that fails for good makes the
transaction abortable, and the abort bumps the epoch (KIP-360) so the next transaction commits; the broker
bumps the epoch of InitProducerId carrying the current producer id and epoch and rejects a stale one; a
transaction past its timeout is aborted and its producer fenced; the copyless consumer reads librdkafka's
transactions as committed; and ``copyless produce --transactional-id`` commits its input as one
transaction.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from copyless.client.consumer import Consumer
from copyless.client.errors import KafkaError, ProducerFencedError, TransactionAbortableError, TransactionStateError
from copyless.client.producer import Producer
from tests.support.topics import create_topic, unique_topic

pytestmark = pytest.mark.timeout(120)

confluent_kafka = pytest.importorskip("confluent_kafka")
from tests.support.read_back import read_topic_to_end  # noqa: E402


async def _read(bootstrap: str, topic: str, isolation: str, partitions: int = 2) -> list[str]:
    """Every record a copyless consumer hands out from offset 0 until it reaches the end offsets (the last
    stable offset for read_committed), checked once more after it gets there."""
    consumer = Consumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        ends = await consumer.end_offsets(tps)
        seen: list[str] = []
        for _ in range(100):
            batches = await consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for record in records:
                    seen.append(record.value.decode())
            positions = {tp: await consumer.position(tp) for tp in tps}
            if all(positions[tp] >= ends[tp] for tp in tps):
                break
        else:
            raise AssertionError(f"never reached the end offsets {ends} (at {positions}; saw {seen})")
        batches = await consumer.getmany(timeout_ms=300)
        seen += [r.value.decode() for records in batches.values() for r in records]
        return sorted(seen)
    finally:
        await consumer.close()


def _transactional(bootstrap: str, tid: str, **kwargs) -> Producer:
    return Producer(bootstrap, transactional_id=tid, linger_ms=1, **kwargs)


async def _txn(producer: Producer, topic: str, values: list[str], *, commit: bool) -> None:
    producer.begin_transaction()
    for i, value in enumerate(values):
        await producer.send(topic, value.encode(), partition=i % 2)
    if commit:
        await producer.commit_transaction()
    else:
        await producer.flush()  # in the log, so read_committed has something to skip
        await producer.abort_transaction()


def test_commit_and_abort_as_read_committed_consumers_see_them(broker_factory):
    broker = broker_factory()
    topic = unique_topic("ctxn")
    create_topic(broker.bootstrap, topic)

    async def run():
        async with _transactional(broker.bootstrap, unique_topic("tid")) as first, \
                _transactional(broker.bootstrap, unique_topic("tid")) as second:
            await first.init_transactions()
            await second.init_transactions()
            with pytest.raises(TransactionStateError):
                await first.send(topic, b"outside", partition=0)
            await _txn(first, topic, [f"c{i}" for i in range(6)], commit=True)
            await _txn(first, topic, [f"a{i}" for i in range(6)], commit=False)
            # Interleaved on both partitions: second's aborted transaction spans first's committed one.
            second.begin_transaction()
            for i in range(4):
                await second.send(topic, f"x{i}".encode(), partition=i % 2)
            await second.flush()
            await _txn(first, topic, [f"d{i}" for i in range(4)], commit=True)
            await second.send(topic, b"x4", partition=0)
            await second.abort_transaction()
            await _txn(second, topic, ["e0", "e1"], commit=True)
        committed = sorted([f"c{i}" for i in range(6)] + [f"d{i}" for i in range(4)] + ["e0", "e1"])
        everything = sorted(committed + [f"a{i}" for i in range(6)] + [f"x{i}" for i in range(5)])
        assert await _read(broker.bootstrap, topic, "read_committed") == committed
        assert await _read(broker.bootstrap, topic, "read_uncommitted") == everything
        return committed

    committed = asyncio.run(run())
    assert read_topic_to_end(broker.bootstrap, topic, "read_committed") == committed


def test_consume_transform_produce_commits_offsets_with_the_output(broker_factory):
    broker = broker_factory()
    source, sink, group = unique_topic("in"), unique_topic("out"), unique_topic("g")
    create_topic(broker.bootstrap, source, 1)
    create_topic(broker.bootstrap, sink)

    async def run():
        async with Producer(broker.bootstrap) as plain:
            for i in range(10):
                await plain.send(source, f"v{i}".encode(), partition=0)
            await plain.flush()
        consumer = Consumer(source, bootstrap_servers=broker.bootstrap, group_id=group,
                            auto_offset_reset="earliest", enable_auto_commit=False,
                            isolation_level="read_committed")
        async with _transactional(broker.bootstrap, unique_topic("tid")) as producer:
            await producer.init_transactions()
            await consumer.start()
            try:
                await consumer.wait_for_assignment()
                for commit, take in ((True, 6), (False, 4), (True, 4)):
                    got: list = []
                    while len(got) < take:
                        batches = await consumer.getmany(timeout_ms=500, max_records=take - len(got))
                        got += [r for records in batches.values() for r in records]
                    producer.begin_transaction()
                    for record in got:
                        await producer.send(sink, record.value.upper(), partition=record.offset % 2)
                    await producer.send_offsets_to_transaction({(source, 0): got[-1].offset + 1}, consumer)
                    if commit:
                        await producer.commit_transaction()
                        assert await consumer.committed((source, 0)) == got[-1].offset + 1
                    else:
                        await producer.abort_transaction()
                        assert await consumer.committed((source, 0)) == 6
                        consumer.seek((source, 0), 6)  # reprocess the aborted round
            finally:
                await consumer.close()
        assert await _read(broker.bootstrap, sink, "read_committed") == sorted(f"V{i}" for i in range(10))

    asyncio.run(run())


def test_a_second_producer_fences_the_first(broker_factory):
    broker = broker_factory()
    topic = unique_topic("zombie")
    create_topic(broker.bootstrap, topic)
    tid = unique_topic("tid")

    async def run():
        async with _transactional(broker.bootstrap, tid) as zombie, _transactional(broker.bootstrap, tid) as heir:
            await zombie.init_transactions()
            zombie.begin_transaction()
            for i in range(4):
                await zombie.send(topic, f"z{i}".encode(), partition=i % 2)
            await zombie.flush()
            await heir.init_transactions()  # aborts the zombie's transaction and fences it
            assert heir._sender.producer_id == zombie._sender.producer_id
            assert heir._sender.producer_epoch > zombie._sender.producer_epoch
            await zombie.send(topic, b"z4", partition=0)
            with pytest.raises(ProducerFencedError):
                await zombie.commit_transaction()
            with pytest.raises(ProducerFencedError):  # and every call after
                zombie.begin_transaction()
            await _txn(heir, topic, ["h0", "h1"], commit=True)
        assert await _read(broker.bootstrap, topic, "read_committed") == ["h0", "h1"]

    asyncio.run(run())
    assert read_topic_to_end(broker.bootstrap, topic, "read_committed") == ["h0", "h1"]


def test_a_failed_batch_makes_the_transaction_abortable_and_the_abort_bumps_the_epoch(broker_factory):
    broker = broker_factory()
    topic = unique_topic("abortable")
    create_topic(broker.bootstrap, topic, config={"max.message.bytes": "2000"})

    async def run():
        async with _transactional(broker.bootstrap, unique_topic("tid")) as producer:
            await producer.init_transactions()
            producer_id, epoch = producer._sender.producer_id, producer._sender.producer_epoch
            producer.begin_transaction()
            await producer.send(topic, b"small", partition=0)
            too_large = await producer.send(topic, b"y" * 5000, partition=1)
            with pytest.raises(TransactionAbortableError):
                await producer.commit_transaction()
            with pytest.raises(KafkaError):
                await too_large
            await producer.abort_transaction()
            # KIP-360: the same producer id, the next epoch; sequences start again.
            assert (producer._sender.producer_id, producer._sender.producer_epoch) == (producer_id, epoch + 1)
            await _txn(producer, topic, ["after0", "after1"], commit=True)
        assert await _read(broker.bootstrap, topic, "read_committed") == ["after0", "after1"]

    asyncio.run(run())


def test_init_producer_id_with_the_current_id_and_epoch_bumps_the_epoch(broker_factory):
    broker = broker_factory()

    async def run():
        async with _transactional(broker.bootstrap, unique_topic("tid")) as producer:
            await producer.init_transactions()
            txn = producer._txn
            producer_id, epoch = producer._sender.producer_id, producer._sender.producer_epoch
            await txn._init_producer_id(producer_id, epoch)
            assert (producer._sender.producer_id, producer._sender.producer_epoch) == (producer_id, epoch + 1)
            with pytest.raises(KafkaError) as stale:  # the epoch before: a fenced producer asking
                await txn._init_producer_id(producer_id, epoch)
            assert stale.value.code in (47, 90)

    asyncio.run(run())


def test_cli_produces_one_transaction(broker_factory):
    broker = broker_factory()
    topic = unique_topic("cli")
    create_topic(broker.bootstrap, topic)
    lines = "".join(f"line{i}\n" for i in range(5))
    result = subprocess.run(
        [sys.executable, "-m", "copyless", "produce", topic, "-b", broker.bootstrap, "-p", "1",
         "--transactional-id", unique_topic("tid")],
        input=lines, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert asyncio.run(_read(broker.bootstrap, topic, "read_committed")) == sorted(f"line{i}" for i in range(5))

    async def log_end() -> int:
        async with Consumer(bootstrap_servers=broker.bootstrap) as consumer:
            return (await consumer.end_offsets([(topic, 1)]))[(topic, 1)]

    assert asyncio.run(log_end()) == 6  # five records and the COMMIT marker after them


def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(broker_factory):
    broker = broker_factory(config={"transaction.abort.timed.out.transaction.cleanup.interval.ms": 200})
    topic = unique_topic("late")
    create_topic(broker.bootstrap, topic)

    async def run():
        async with _transactional(broker.bootstrap, unique_topic("tid"), transaction_timeout_ms=1000) as producer:
            await producer.init_transactions()
            producer.begin_transaction()
            await producer.send(topic, b"late0", partition=0)
            await producer.flush()
            await asyncio.sleep(2.5)  # the coordinator aborts it at epoch + 1
            with pytest.raises(ProducerFencedError):
                await producer.commit_transaction()
        assert await _read(broker.bootstrap, topic, "read_committed") == []
        assert await _read(broker.bootstrap, topic, "read_uncommitted") == ["late0"]

    asyncio.run(run())


def test_the_copyless_consumer_reads_librdkafkas_transactions_committed(broker_factory):
    from tests.transactions.test_confluent_transactions import _produce_txn, _producer

    broker = broker_factory()
    topic = unique_topic("rdk")
    create_topic(broker.bootstrap, topic)
    producer = _producer(broker.bootstrap, unique_topic("tid"))
    _produce_txn(producer, topic, [f"c{i}" for i in range(4)], commit=True)
    _produce_txn(producer, topic, [f"a{i}" for i in range(4)], commit=False)
    _produce_txn(producer, topic, ["d0", "d1"], commit=True)
    committed = sorted([f"c{i}" for i in range(4)] + ["d0", "d1"])
    assert asyncio.run(_read(broker.bootstrap, topic, "read_committed")) == committed
    assert asyncio.run(_read(broker.bootstrap, topic, "read_uncommitted")) == sorted(
        committed + [f"a{i}" for i in range(4)])
