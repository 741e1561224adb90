"""Client scenarios shared by the copyless-broker and reference-Kafka integration tests.

Each scenario is a coroutine taking a bootstrap address; it asserts as it goes and returns nothing.
"""

from __future__ import annotations

import asyncio
import uuid

from copyless.client import Admin, BufferFullError, Consumer, Producer, TopicPartition
from copyless.protocol.partitioner import partition_for_key
from tests.support.polling import gather_async, wait_until_async

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def consume_exactly(bootstrap: str, topic: str, partitions: int, count: int, **kwargs) -> list:
    consumer = Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", **kwargs)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])

        async def fetch():
            return [r for records in (await consumer.getmany(timeout_ms=1000)).values() for r in records]

        out = await gather_async(fetch, count=count, timeout_s=60)
        assert len(out) >= count, f"only {len(out)} of {count} records arrived"
        # nothing beyond what was produced
        extra = await consumer.getmany(timeout_ms=300)
        assert not extra, extra
        return out
    finally:
        await consumer.close()


async def round_trip_all_codecs(bootstrap: str) -> None:
    """Keyed and unkeyed records, headers, large (gathered) values, every codec; read back exactly."""
    topic = unique("codecs")
    async with Admin(bootstrap) as admin:
        await admin.create_topics([topic], num_partitions=3)
    expected = {}
    for codec in CODECS:
        async with Producer(bootstrap, compression_type=codec, linger_ms=20) as producer:
            futures = []
            for i in range(400):
                key = None if i % 4 == 0 else b"key-%d" % (i % 17)
                value = (b"%s-%d|" % (codec.encode(), i)) * (1 if i % 50 else 500)  # some values > 2 KiB
                headers = [("codec", codec.encode()), ("n", None)] if i % 3 == 0 else None
                futures.append((key, value, headers, await producer.send(topic, value, key, headers=headers)))
            await producer.flush()
            for key, value, headers, future in futures:
                metadata = await future
                assert metadata.offset >= 0
                if key is not None:  # Kafka's murmur2 placement, as the Java client would choose
                    assert metadata.partition == partition_for_key(key, 3)
                expected[(metadata.partition, metadata.offset)] = (key, value, tuple(headers or ()))
    got = await consume_exactly(bootstrap, topic, 3, len(expected))
    assert {(r.partition, r.offset): (r.key, r.value, r.headers) for r in got} == expected
    # per partition, offsets come in order without gaps
    for partition in range(3):
        offsets = [r.offset for r in got if r.partition == partition]
        assert offsets == list(range(len(offsets)))


async def idempotent_producer_stamps_batches(bootstrap: str) -> None:
    topic = unique("idem")
    async with Producer(bootstrap, linger_ms=1, batch_size=2048) as producer:
        assert producer.enable_idempotence and producer._sender.producer_id >= 0
        futures = [await producer.send(topic, b"x" * 100, partition=0) for _ in range(500)]
        await producer.flush()
        offsets = [(await f).offset for f in futures]
    assert offsets == list(range(500))
    records = await consume_exactly(bootstrap, topic, 1, 500)
    assert [r.offset for r in records] == list(range(500))


async def offsets_and_seeks(bootstrap: str) -> None:
    topic = unique("offsets")
    async with Admin(bootstrap) as admin:
        await admin.create_topics([topic], num_partitions=1)
        async with Producer(bootstrap) as producer:
            for i in range(30):
                await producer.send(topic, b"%d" % i, partition=0, timestamp_ms=1_000_000 + i * 10)
            await producer.flush()
        tp = TopicPartition(topic, 0)
        assert await admin.list_offsets({tp: -2}) == {tp: 0}
        assert await admin.list_offsets({tp: -1}) == {tp: 30}
        assert await admin.list_offsets({tp: 1_000_000 + 95}) == {tp: 10}  # first timestamp >= 1_000_095
        assert await admin.list_offsets({tp: 9_999_999}) == {tp: -1}
        descriptions = await admin.describe_topics([topic])
        assert [p.partition for p in descriptions[0].partitions] == [0]
        assert topic in await admin.list_topics()
    consumer = Consumer(bootstrap_servers=bootstrap, auto_offset_reset="latest")
    await consumer.start()
    try:
        consumer.assign([tp])
        assert await consumer.position(tp) == 30  # "latest"
        assert await consumer.getmany(timeout_ms=200) == {}
        consumer.seek(tp, 25)
        got = []
        while len(got) < 5:
            got += (await consumer.getmany(timeout_ms=1000)).get(tp, [])
        assert [r.value for r in got] == [b"25", b"26", b"27", b"28", b"29"]
        consumer.seek_to_beginning(tp)
        first = await consumer.getone()
        assert (first.offset, first.value, first.timestamp) == (0, b"0", 1_000_000)
        consumer.seek_to_end(tp)
        assert await consumer.position(tp) == 30
        assert (await consumer.offsets_for_times({tp: 1_000_000 + 201})) == {tp: 21}
    finally:
        await consumer.close()
    async with Admin(bootstrap) as admin:
        await admin.delete_topics([topic])


async def back_pressure(bootstrap: str) -> None:
    """buffer_memory bounds what is buffered: send_nowait refuses, send waits for acknowledgements."""
    topic = unique("pressure")
    async with Producer(bootstrap, buffer_memory=8 * 1024, batch_size=1024, linger_ms=10_000) as producer:
        await producer.wait_for_topic(topic)
        refused = False
        sent = 0
        for _ in range(200):
            try:
                producer.send_nowait(topic, b"v" * 200, partition=0)
                sent += 1
            except BufferFullError:
                refused = True
                break
        assert refused and 0 < sent < 200  # ~8 batches of 1 KiB, then the budget is spent
        assert producer._accumulator.reserved_bytes <= 8 * 1024 + 1024
        # send() waits until the broker acknowledges earlier batches, then goes through.
        last = await asyncio.wait_for(producer.send(topic, b"last", partition=0), 30)
        producer.flush_nowait()
        assert (await asyncio.wait_for(last, 30)).offset == sent
    # Large batches reserve their real size once full, so buffer_memory still bounds what is buffered
    # (no await in the loop: the sender cannot drain anything meanwhile, so only the bound can stop it).
    async with Producer(bootstrap, buffer_memory=1 << 20, batch_size=256 * 1024, linger_ms=60_000) as producer:
        await producer.wait_for_topic(topic)
        appended = 0
        try:
            while appended < 100 << 20:
                producer.send_nowait(topic, b"w" * 1000, partition=0)
                appended += 1000
        except BufferFullError:
            pass
        assert appended <= (1 << 20) + 256 * 1024, appended
        await producer.flush()


async def large_record_with_small_fetch_size(bootstrap: str) -> None:
    topic = unique("large")
    value = bytes(range(256)) * 1200  # 300 KiB, one record, one batch
    async with Producer(bootstrap, max_request_size=1 << 21) as producer:
        await (await producer.send(topic, value, partition=0))
        await (await producer.send(topic, b"after", partition=0))
    got = await consume_exactly(bootstrap, topic, 1, 2, max_partition_fetch_bytes=16 * 1024)
    assert [r.value for r in got] == [value, b"after"]


async def group_members_share_partitions(bootstrap: str, strategy: str) -> None:
    """Two members of one group split 4 partitions (range or roundrobin), commit, and a third member that
    joins after they leave resumes from the committed offsets."""
    topic = unique("group")
    group = unique("g")
    async with Admin(bootstrap) as admin:
        await admin.create_topics([topic], num_partitions=4)
    async with Producer(bootstrap) as producer:
        for i in range(200):
            await producer.send(topic, b"%d" % i, partition=i % 4)
        await producer.flush()
    kwargs = dict(
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        partition_assignment_strategy=(strategy,),
        heartbeat_interval_ms=300,
        session_timeout_ms=10_000,
    )
    first = Consumer(topic, **kwargs)
    second = Consumer(topic, **kwargs)
    await first.start()
    await second.start()
    try:
        seen = {}

        async def settled() -> bool:
            for member in (first, second):
                batch = await member.getmany(timeout_ms=200)
                for records in batch.values():
                    for record in records:
                        seen[(record.partition, record.offset)] = member
            a, b = first.assignment(), second.assignment()
            return bool(a and b and not a & b and len(a | b) == 4 and len(seen) == 200)

        await wait_until_async(settled, what="the group to settle on two members", timeout_s=60, interval_s=0,
                               detail=lambda: f"assignments {first.assignment()} and {second.assignment()}, "
                                              f"{len(seen)} of 200 records read")
        assert {tp.partition for tp in first.assignment() | second.assignment()} == {0, 1, 2, 3}
        assert len(first.assignment()) == len(second.assignment()) == 2
        await first.commit()
        await second.commit()
        for partition in range(4):
            owner = first if TopicPartition(topic, partition) in first.assignment() else second
            assert await owner.committed(TopicPartition(topic, partition)) == 50
    finally:
        await first.close()
        await second.close()
    async with Producer(bootstrap) as producer:
        await producer.send(topic, b"new", partition=2)
    third = Consumer(topic, **kwargs)
    await third.start()
    try:
        record = await asyncio.wait_for(third.getone(), 60)
        assert (record.partition, record.offset, record.value) == (2, 50, b"new")
    finally:
        await third.close()


async def produce_across_restart(bootstrap: str, restart, *, exactly_once: bool) -> None:
    """Records sent before, during and after a broker restart (``restart()`` runs in a worker thread) are
    all acknowledged after retries and all readable afterwards; with ``exactly_once`` none is written twice
    (idempotence: a retried batch keeps its sequence number)."""
    topic = unique("restart")
    loop = asyncio.get_running_loop()
    async with Producer(bootstrap, linger_ms=2, batch_size=4096, retry_backoff_ms=50,
                        request_timeout_ms=15_000) as producer:
        futures = []

        async def send_some(count: int) -> None:
            for _ in range(count):
                futures.append(await producer.send(topic, b"%06d" % len(futures), partition=0))
            await asyncio.sleep(0.01)

        await send_some(500)
        await producer.flush()
        restarting = loop.run_in_executor(None, restart)
        while not restarting.done():  # keep records in flight while the broker goes away and comes back
            await send_some(50)
        await restarting
        await send_some(500)
        await asyncio.wait_for(producer.flush(), 120)
        offsets = [(await f).offset for f in futures]
    total = len(futures)
    interruptions = producer.stats["retries"] + producer.stats["connect_failures"]
    assert interruptions > 0, "the restart did not interrupt anything: the test proved nothing"
    got = await consume_exactly(bootstrap, topic, 1, total if exactly_once else len(set(offsets)))
    values = [r.value for r in got]
    assert set(values) == {b"%06d" % i for i in range(total)}
    if exactly_once:
        assert len(values) == total and sorted(offsets) == list(range(total))


async def consume_across_restart(bootstrap: str, restart) -> None:
    """A consumer keeps its position through a broker restart: reconnects, refetches, no gap, no repeat."""
    topic = unique("consume-restart")
    async with Producer(bootstrap) as producer:
        for i in range(2000):
            await producer.send(topic, b"%d" % i, partition=0)
        await producer.flush()
    consumer = Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", retry_backoff_ms=50)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        got = []
        while len(got) < 1000:
            got += (await consumer.getmany(timeout_ms=1000, max_records=1000 - len(got))).get(tp, [])
        await asyncio.get_running_loop().run_in_executor(None, restart)

        async def fetch():
            return (await consumer.getmany(timeout_ms=1000)).get(tp, [])

        got += await gather_async(fetch, count=2000 - len(got), timeout_s=60)
        assert len(got) >= 2000, f"stuck at {len(got)} after the restart"
        assert [r.offset for r in got] == list(range(2000))
        assert [r.value for r in got] == [b"%d" % i for i in range(2000)]
    finally:
        await consumer.close()


async def auto_commit_and_reset_policies(bootstrap: str) -> None:
    """Auto-commit stores the position (periodically and on close); a new member of the group resumes
    there; auto_offset_reset="none" refuses to guess."""
    topic = unique("autocommit")
    group = unique("ac")
    async with Producer(bootstrap) as producer:
        for i in range(100):
            await producer.send(topic, b"%d" % i, partition=0)
        await producer.flush()
    common = dict(bootstrap_servers=bootstrap, group_id=group, heartbeat_interval_ms=300, session_timeout_ms=10_000)
    first = Consumer(topic, auto_offset_reset="earliest", auto_commit_interval_ms=100, **common)
    await first.start()
    try:
        got = []

        async def sixty_read() -> bool:  # never past 60: closing commits the position
            for records in (await first.getmany(timeout_ms=500, max_records=60 - len(got))).values():
                got.extend(records)
            return len(got) >= 60

        await wait_until_async(sixty_read, what="the first 60 records", timeout_s=60, interval_s=0,
                               detail=lambda: f"{len(got)} read")
        assert [r.offset for r in got] == list(range(60))
    finally:
        await first.close()  # commits position 60
    second = Consumer(topic, auto_offset_reset="none", enable_auto_commit=False, **common)
    await second.start()
    try:
        record = await asyncio.wait_for(second.getone(), 60)
        assert record.offset == 60
        assert await second.committed(TopicPartition(topic, 0)) == 60
    finally:
        await second.close()
    stranger = Consumer(bootstrap_servers=bootstrap, group_id=unique("empty"), auto_offset_reset="none")
    await stranger.start()
    try:
        stranger.assign([TopicPartition(topic, 0)])
        try:
            await stranger.position(TopicPartition(topic, 0))
            refused = False
        except Exception as exc:  # no committed offset and no reset policy: an error, not a guess
            refused = "auto_offset_reset" in str(exc)
        assert refused
    finally:
        await stranger.close()
