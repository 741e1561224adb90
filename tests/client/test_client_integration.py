"""The client against a real copyless broker subprocess (the ``broker`` fixture of tests/conftest.py), and
interoperability with aiokafka on the same broker."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from copyless.client import Consumer, Producer, TopicPartition
from copyless.client.conn import Connection
from copyless.protocol.messages import ApiKey
from tests.client import _client_scenarios as scenarios
from tests.support.polling import wait_until_async
from tests.support.subprocesses import as_from_a_terminal


def run(coroutine, loop: str = "uvloop"):
    if loop == "uvloop":
        import uvloop

        return uvloop.run(coroutine)
    return asyncio.run(coroutine)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_round_trip_all_codecs(broker, loop):
    run(scenarios.round_trip_all_codecs(broker.bootstrap), loop)


def test_idempotent_producer(broker):
    run(scenarios.idempotent_producer_stamps_batches(broker.bootstrap))


def test_offsets_and_seeks(broker):
    run(scenarios.offsets_and_seeks(broker.bootstrap))


def test_back_pressure(broker):
    run(scenarios.back_pressure(broker.bootstrap))


def test_large_record_with_small_fetch_size(broker):
    run(scenarios.large_record_with_small_fetch_size(broker.bootstrap))


def _serves_groups(bootstrap: str) -> bool:
    async def probe():
        host, _, port = bootstrap.rpartition(":")
        connection = await Connection.open(host, int(port))
        try:
            return connection.supports(ApiKey.JOIN_GROUP, 5) and connection.supports(ApiKey.SYNC_GROUP, 3)
        finally:
            connection.close()

    return run(probe())


@pytest.mark.parametrize("strategy", ["range", "roundrobin"])
def test_consumer_group(broker, strategy):
    if not _serves_groups(broker.bootstrap):
        pytest.skip("this copyless broker does not advertise JoinGroup v5 / SyncGroup v3 (group APIs not built yet)")
    run(scenarios.group_members_share_partitions(broker.bootstrap, strategy))


def test_interoperates_with_aiokafka(broker):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as AioTopicPartition

    topic = scenarios.unique("interop")

    async def scenario():
        theirs = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, compression_type="gzip")
        await theirs.start()
        try:
            for i in range(100):
                await theirs.send(topic, b"aio-%d" % i, key=b"k", partition=0, headers=[("h", b"1")])
            await theirs.flush()
        finally:
            await theirs.stop()
        async with Producer(broker.bootstrap, compression_type="zstd") as ours:
            for i in range(100):
                await ours.send(topic, b"ours-%d" % i, partition=0)
        # our consumer reads both
        records = await scenarios.consume_exactly(broker.bootstrap, topic, 1, 200)
        assert [r.value for r in records] == [b"aio-%d" % i for i in range(100)] + [b"ours-%d" % i for i in range(100)]
        assert records[0].headers == (("h", b"1"),) and records[0].key == b"k"
        # aiokafka reads what we wrote
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign([AioTopicPartition(topic, 0)])
            seen = []
            while len(seen) < 200:
                batch = await consumer.getmany(timeout_ms=2000)
                assert batch, "aiokafka received nothing"
                for items in batch.values():
                    seen.extend(r.value for r in items)
            assert seen[100:] == [b"ours-%d" % i for i in range(100)]
        finally:
            await consumer.stop()

    run(scenario())


def _copyless(*args, input_bytes=None, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "copyless.broker.cli", *args],
        input=input_bytes,
        capture_output=True,
        timeout=timeout,
    )


def test_cli_topics_produce_consume(broker):
    topic = scenarios.unique("cli")
    bootstrap = ["--bootstrap", broker.bootstrap]
    created = _copyless("topics", "create", topic, "--partitions", "2", *bootstrap)
    assert created.returncode == 0, created.stderr
    listed = _copyless("topics", "list", "--json", *bootstrap)
    assert topic in json.loads(listed.stdout)
    produced = _copyless("produce", topic, *bootstrap, "--count", "5000", "--size", "100", "--json", "-p", "0")
    assert produced.returncode == 0, produced.stderr
    summary = json.loads(produced.stdout.splitlines()[-1])
    assert summary["records"] == 5000 and summary["bytes"] == 500_000
    assert set(summary) == {"records", "bytes", "seconds", "records_per_s", "mb_per_s"}
    lines = _copyless("produce", topic, *bootstrap, "-K", ":", "-p", "1", input_bytes=b"a:one\nb:two\nthree\n")
    assert lines.returncode == 0, lines.stderr
    consumed = _copyless("consume", topic, *bootstrap, "--from-beginning", "-p", "1", "-e", "-K", "=")
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.splitlines() == [b"a=one", b"b=two", b"=three"]
    counted = _copyless("consume", topic, *bootstrap, "--from-beginning", "--count", "5003", "-q", "--json")
    summary = json.loads(counted.stdout.splitlines()[-1])
    assert summary["records"] == 5003 and summary["bytes"] == 500_000 + 13  # a+one, b+two, three
    described = _copyless("topics", "describe", topic, "--json", *bootstrap)
    (document,) = json.loads(described.stdout)
    assert {p["partition"]: p["log_end_offset"] for p in document["partitions"]} == {0: 5000, 1: 3}
    deleted = _copyless("topics", "delete", topic, *bootstrap)
    assert deleted.returncode == 0, deleted.stderr
    missing = _copyless("topics", "describe", "no-such-topic-" + topic, *bootstrap)
    assert missing.returncode == 1 and b"UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr


@pytest.mark.parametrize("mode", ["graceful", "kill"])
def test_producer_retries_across_a_broker_restart(broker_factory, mode):
    broker = broker_factory()
    run(
        scenarios.produce_across_restart(
            broker.bootstrap, lambda: broker.restart(mode), exactly_once=(mode == "graceful")
        )
    )


def test_cli_consume_prints_its_summary_on_ctrl_c(broker):
    import signal

    topic = scenarios.unique("sigint")
    produced = _copyless("produce", topic, "--bootstrap", broker.bootstrap, "--count", "300", "--size", "10")
    assert produced.returncode == 0, produced.stderr
    consumer = subprocess.Popen(
        [sys.executable, "-m", "copyless.broker.cli", "consume", topic, "--bootstrap", broker.bootstrap,
         "--from-beginning", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=as_from_a_terminal,
    )
    try:
        records = [json.loads(consumer.stdout.readline()) for _ in range(300)]  # all consumed; now it idles
        assert [r["offset"] for r in records] == list(range(300))
        assert all(r["value"] == "0123456789" and r["topic"] == topic for r in records), records[:3]
        consumer.send_signal(signal.SIGINT)
        rest, stderr = consumer.communicate(timeout=60)
    finally:
        if consumer.poll() is None:
            consumer.kill()
    assert consumer.returncode == 130, stderr  # 128 + SIGINT, after the summary
    assert rest == b""
    # Not a terminal: the summary is one line on stderr (records go to stdout, one JSON object each).
    assert b"consumed 300 records (3000 bytes)" in stderr


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_getmany_is_cancelled_even_when_data_arrives_in_the_same_step(broker, loop):
    """Ctrl-C cancels the task in getmany; a fetch response may wake getmany's waiter in the same loop step.
    Python 3.11's ``asyncio.wait_for`` then returns the waiter's result and drops the cancellation, and the
    CLI consumer went on polling instead of stopping (a hang of ``copyless consume`` after Ctrl-C)."""

    async def scenario() -> None:
        topic = scenarios.unique("cancel")
        consumer = Consumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest")
        await consumer.start()
        try:
            await consumer._cluster.wait_for_topic(topic, allow_auto_create=True)
            consumer.assign([TopicPartition(topic, 0)])
            task = asyncio.ensure_future(consumer.getmany(timeout_ms=10_000))
            await wait_until_async(lambda: consumer._fetcher._data_waiters, what="getmany to park on its waiter",
                                   timeout_s=10, interval_s=0.01)
            consumer._fetcher.wake_waiters()  # what a fetch response does ...
            task.cancel()             # ... in the same step as the cancellation
            started = asyncio.get_running_loop().time()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), 5)
            assert task.cancelled()
            assert asyncio.get_running_loop().time() - started < 5
        finally:
            await consumer.close()

    run(scenario(), loop)


def test_group_shared_with_aiokafka_members(broker):
    """A copyless consumer and an aiokafka consumer in one group ("roundrobin", Kafka's ConsumerProtocol):
    whichever is leader computes an assignment the other understands; together they own every partition."""
    if not _serves_groups(broker.bootstrap):
        pytest.skip("this copyless broker does not advertise JoinGroup v5 / SyncGroup v3 (group APIs not built yet)")
    from aiokafka import AIOKafkaConsumer

    topic = scenarios.unique("mixed")
    group = scenarios.unique("mixed-group")

    async def scenario():
        from copyless.client import Admin

        async with Admin(broker.bootstrap) as admin:
            await admin.create_topics([topic], num_partitions=4)
        theirs = AIOKafkaConsumer(
            topic, bootstrap_servers=broker.bootstrap, group_id=group, heartbeat_interval_ms=300,
            session_timeout_ms=10_000, auto_offset_reset="earliest",
        )
        ours = Consumer(
            topic, bootstrap_servers=broker.bootstrap, group_id=group, heartbeat_interval_ms=300,
            session_timeout_ms=10_000, partition_assignment_strategy=("roundrobin",), auto_offset_reset="earliest",
        )
        await theirs.start()
        await ours.start()
        try:

            async def split() -> bool:
                await theirs.getmany(timeout_ms=100)
                await ours.getmany(timeout_ms=100)
                mine = {tp.partition for tp in ours.assignment()}
                other = {tp.partition for tp in theirs.assignment()}
                return bool(mine and other and not mine & other and mine | other == {0, 1, 2, 3})

            await wait_until_async(split, what="the four partitions split between the two members", timeout_s=60,
                                   interval_s=0,
                                   detail=lambda: f"ours {ours.assignment()}, theirs {theirs.assignment()}")
            assert len(ours.assignment()) == len(theirs.assignment()) == 2
        finally:
            await ours.close()
            await theirs.stop()

    run(scenario())


def test_consumer_resumes_across_a_broker_restart(broker_factory):
    broker = broker_factory()
    run(scenarios.consume_across_restart(broker.bootstrap, lambda: broker.restart("graceful")))


def test_auto_commit_and_reset_policies(broker):
    if not _serves_groups(broker.bootstrap):
        pytest.skip("this copyless broker does not advertise JoinGroup v5 / SyncGroup v3 (group APIs not built yet)")
    run(scenarios.auto_commit_and_reset_policies(broker.bootstrap))


def test_delivery_timeout_when_the_broker_is_gone(broker_factory):
    from copyless.client import KafkaTimeoutError

    broker = broker_factory()

    async def scenario():
        producer = Producer(broker.bootstrap, delivery_timeout_ms=1500, retry_backoff_ms=50, request_timeout_ms=1000)
        await producer.start()
        try:
            await (await producer.send("gone", b"before", partition=0))
            await asyncio.get_running_loop().run_in_executor(None, broker.stop)
            delivery = await producer.send("gone", b"after", partition=0)
            with pytest.raises(KafkaTimeoutError):
                await asyncio.wait_for(delivery, 30)
        finally:
            await producer.close(timeout_s=5)

    run(scenario())
