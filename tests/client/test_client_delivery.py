"""Delivery handles against a real copyless broker: one future per batch, one small handle per record.

Every record's handle must resolve to its own offset (base offset + its place in the batch) and
timestamp, whichever path appended it (the no-key fast path or the general one); a failed batch must
fail every one of its handles with the broker's error.
"""

from __future__ import annotations

import uvloop

from client import Admin, DeliveryFuture, KafkaError, Producer

import _client_scenarios as scenarios


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
            for partition, value, timestamp, handle in sent:
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
        for (_, value, _, _), result in zip(sent, metadata):
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
