"""Delivery handles against a real copyless broker: one future per batch, one small handle per record.

Every record's handle must resolve to its own offset (base offset + its place in the batch) and
timestamp, whichever path appended it (the no-key fast path or the general one); a failed batch must
fail every one of its handles with the broker's error. Timestamps are the clock's millisecond at each
send on every path, and each acknowledgement refills the in-flight window from the read handler.
"""

from __future__ import annotations

import asyncio
import time

import uvloop

from copyless.client import Admin, DeliveryFuture, KafkaError, Producer
from tests.client import _client_scenarios as scenarios


def test_every_handle_resolves_to_its_own_offset_and_timestamp(broker):
    async def scenario():
        topic = scenarios.unique("handles")
        async with Admin(broker.bootstrap) as admin:
            await admin.create_topics([topic], num_partitions=2)
        # 2 KiB batches: ~18 records of 100 B each, so the 600 records span many batches per partition.
        async with Producer(broker.bootstrap, acks=1, batch_size=2048, linger_ms=50) as producer:
            sent = []
            for i in range(600):
                partition = (i // 7) % 2
                value = b"%04d" % i + b"x" * (96 if i % 5 else 20)
                key = b"k%d" % i if i % 11 == 0 else None
                headers = [("n", b"%d" % i)] if i % 13 == 0 else None
                timestamp = 1_700_000_000_000 + i if i % 3 == 0 else None
                handle = await producer.send(
                    topic, value, key, partition=partition, timestamp_ms=timestamp, headers=headers
                )
                assert isinstance(handle, DeliveryFuture)
                sent.append((partition, value, timestamp, handle))
            called = []
            sent[0][3].add_done_callback(called.append)
            await producer.flush()
            assert called == [sent[0][3]]
            metadata = []
            for partition, _value, timestamp, handle in sent:
                assert handle.done() and handle.exception() is None
                result = await handle
                assert result == handle.result()
                assert (result.topic, result.partition) == (topic, partition)
                if timestamp is not None:
                    assert result.timestamp == timestamp
                metadata.append(result)
        for partition in range(2):
            offsets = [m.offset for m in metadata if m.partition == partition]
            assert offsets == list(range(len(offsets)))  # every record its own offset, in send order
        got = await scenarios.consume_exactly(broker.bootstrap, topic, 2, len(sent))
        stored = {(r.partition, r.offset): (r.value, r.timestamp) for r in got}
        for (_, value, _, _), result in zip(sent, metadata, strict=True):
            assert stored[(result.partition, result.offset)] == (value, result.timestamp)

    uvloop.run(scenario())


def test_a_failed_batch_fails_every_handle(broker):
    async def scenario():
        topic = scenarios.unique("too-large")
        async with Admin(broker.bootstrap) as admin:
            # Batches of a few 100-byte records exceed this: the broker refuses them whole.
            await admin.create_topics([topic], num_partitions=1, configs={"max.message.bytes": "1000"})
        async with Producer(broker.bootstrap, acks=1, linger_ms=1000) as producer:
            handles = [await producer.send(topic, b"v" * 100, partition=0) for _ in range(50)]
            await producer.flush()
            for handle in handles:
                assert handle.done()
                error = handle.exception()
                assert isinstance(error, KafkaError) and error.code == 10  # MESSAGE_TOO_LARGE
                try:
                    await handle
                except KafkaError as raised:
                    assert raised is error
                else:
                    raise AssertionError("a record of a refused batch was reported delivered")
            # The producer still works for records that fit.
            alone = await producer.send_and_wait(topic, b"small", partition=0)
            assert alone.offset == 0

    uvloop.run(scenario())


def _cpython_time(ns: int) -> float:
    """``time.time()`` for a clock reading of ``ns`` (CPython's ``_PyTime_AsSecondsDouble``)."""
    return float(ns // 1_000_000_000) if ns % 1_000_000_000 == 0 else float(ns) / 1e9


def test_record_timestamps_are_the_clock_millisecond_on_every_path(broker, monkeypatch):
    """The no-key fast path stamps a record from a clock reading tested against its run's millisecond:
    every record must still get exactly ``time_ns() // 1_000_000`` at its send - across millisecond
    boundaries (readings exactly on one, and whole seconds), after explicit past and future timestamps,
    and when the clock steps back - through ``send`` and ``send_nowait`` alike."""
    import copyless.client.accumulator as producer_module  # the clock the per-record path reads

    clock = [0]
    monkeypatch.setattr(producer_module, "_time_ns", lambda: clock[0])
    monkeypatch.setattr(producer_module, "_time", lambda: _cpython_time(clock[0]))
    second = 1_700_000_000 * 1_000_000_000  # a whole second, in ns
    ms = 1_000_000
    steps = [  # (clock ns, explicit timestamp or None)
        *[(second + 100_000 + i, None) for i in range(5)],
        (second + 200_000, second // ms + 60_000),  # a future explicit timestamp starts a run ...
        *[(second + 300_000 + i, None) for i in range(3)],  # ... that clock readings must not join
        (second + ms - 1, None),  # the last nanosecond of the millisecond
        (second + ms, None),  # the first of the next: a new millisecond
        (second + ms + 1, None),
        (second + 2 * ms - 1, None),
        (second + 5 * ms + 7, None),
        (second + 3 * ms, None),  # the clock steps back
        (second + 3 * ms + 5, None),
        (second + 3 * ms + 9, second // ms + 3),  # an explicit timestamp equal to the clock's millisecond
        (second + 3 * ms + 10, None),
        (second + 1_000 * ms - 1, None),  # up to and across the next whole second
        (second + 1_000 * ms, None),
        (second + 1_000 * ms + 1, None),
        (second - 1, None),  # and back across the previous one
        (second, None),
        *[(second + 1_000 * ms + 500_000 + i, None) for i in range(200)],  # a long run (past 64 offsets)
    ]

    async def scenario():
        topic = scenarios.unique("clock")
        async with Admin(broker.bootstrap) as admin:
            await admin.create_topics([topic], num_partitions=1)
        async with Producer(broker.bootstrap, acks=1, linger_ms=10_000) as producer:
            await producer.wait_for_topic(topic)
            sent = []
            for i, (now, explicit) in enumerate(steps):
                clock[0] = now
                value = b"%05d" % i + b"x" * 95
                if i % 2:
                    handle = producer.send_nowait(topic, value, partition=0, timestamp_ms=explicit)
                else:
                    handle = await producer.send(topic, value, partition=0, timestamp_ms=explicit)
                sent.append((value, explicit if explicit is not None else now // ms, handle))
            await producer.flush()
            for value, expected, handle in sent:
                assert (await handle).timestamp == expected, (value[:5], expected)
        got = await scenarios.consume_exactly(broker.bootstrap, topic, 1, len(sent))
        assert [(r.value, r.timestamp) for r in got] == [(value, expected) for value, expected, _ in sent]

    uvloop.run(scenario())


def test_acknowledgements_keep_the_in_flight_window_full(broker):
    """A producer whose application yields rarely still pipelines: each acknowledgement refills the
    in-flight window from the connection's read handler, so full batches do not pile up behind the
    application's next yield (they did, one request per two yields)."""

    async def scenario():
        topic = scenarios.unique("window")
        async with Admin(broker.bootstrap) as admin:
            await admin.create_topics([topic], num_partitions=1)
        async with Producer(broker.bootstrap, acks=1, batch_size=4096, linger_ms=5) as producer:
            await producer.wait_for_topic(topic)
            value = b"v" * 100
            handles = []
            for _round in range(40):
                for _ in range(150):  # ~4 full batches between yields
                    handles.append(producer.send_nowait(topic, value, partition=0))
                time.sleep(0.01)  # busy without yielding (the broker answers meanwhile), then yield once
                await asyncio.sleep(0)
            queued = sum(len(queue) for queue in producer._accumulator.batches.values())
            await producer.flush()
            offsets = [(await handle).offset for handle in handles]
        assert offsets == list(range(len(handles)))
        # 40 rounds of ~4 batches: with 5 requests per two yields ~60 batches would still be queued.
        assert queued <= 15, queued

    uvloop.run(scenario())


def test_an_acknowledgement_sends_the_next_batch_before_the_application_runs_again(broker):
    """The response handler itself refills the in-flight window: by the time the application's task
    resumes after the yield in which a response was read, the next ready batch is already sent (waking
    the sender task instead would send it only after the application's next step)."""

    async def scenario():
        topic = scenarios.unique("refill")
        async with Admin(broker.bootstrap) as admin:
            await admin.create_topics([topic], num_partitions=1)
        async with Producer(
            broker.bootstrap, acks=1, batch_size=2048, linger_ms=10_000, max_in_flight_requests_per_connection=1
        ) as producer:
            await producer.wait_for_topic(topic)
            handles = [producer.send_nowait(topic, b"v" * 100, partition=0) for _ in range(60)]  # 3+ batches
            before = producer.stats["requests"]
            await asyncio.sleep(0)  # the sender sends the first full batch; the window (1) is full
            assert producer.stats["requests"] == before + 1
            time.sleep(0.5)  # the broker answers meanwhile; nothing reads the answer yet
            await asyncio.sleep(0)  # one pass of the event loop: the answer is read ...
            assert producer.stats["requests"] == before + 2  # ... and the next batch is already out
            await producer.flush()
            assert [(await handle).offset for handle in handles] == list(range(60))

    uvloop.run(scenario())
