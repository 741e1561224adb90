"""copyless client: an asyncio Kafka producer, consumer and admin client, and the kcat-like CLI.

    from copyless.client import Producer, Consumer, Admin

    async with Producer("127.0.0.1:9092") as producer:
        delivery = await producer.send("events", b"value", key=b"key")
        metadata = await delivery                     # RecordMetadata(topic, partition, offset, ...)

    async with Consumer("events", bootstrap_servers="127.0.0.1:9092", group_id="g",
                        auto_offset_reset="earliest") as consumer:
        async for record in consumer:                 # ConsumerRecord(topic, partition, offset, ...)
            ...

Layout: ``protocol/`` is the pure core (framing, RecordBatch, batch building, lazy fetch parsing, gathered
write planning, request codecs, partitioner); ``conn``/``cluster`` are the asyncio shell (connections,
metadata with leader epochs, offsets by leader); the producer is ``accumulator`` + ``sender`` (+ ``transactions`` for a
transactional id) behind ``producer``, the consumer ``fetcher`` + ``group`` + ``commits`` behind ``consumer``; ``admin``
is the admin API and ``blocking`` a one-request-at-a-time client for tools; ``cli``/``admin_cli``/``cli_common`` are the
``copyless produce|consume|topics|groups|cluster`` commands.
"""

# Public name -> the module that defines it. Loaded on first use (PEP 562): a tool that needs one module
# (``copyless inspect`` reads protocol.records) does not load the producer, consumer and admin client.
_EXPORTS = {
    "Admin": "admin", "PartitionDescription": "admin", "TopicDescription": "admin",
    "TopicPartition": "assignors",
    "Consumer": "consumer", "OffsetOutOfRangeError": "consumer", "RecordTooLargeError": "consumer",
    "BufferFullError": "errors", "ClientError": "errors", "KafkaConnectionError": "errors", "KafkaError": "errors",
    "KafkaTimeoutError": "errors", "NotKafkaError": "errors", "ProducerClosedError": "errors",
    "UnsupportedVersionError": "errors", "ProducerFencedError": "errors", "TransactionAbortableError": "errors",
    "TransactionFatalError": "errors", "TransactionStateError": "errors",
    "DeliveryFuture": "producer", "Producer": "producer", "RecordMetadata": "producer",
    "ConsumerRecord": "protocol.fetch_records",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'copyless.client' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"copyless.client.{module}"), name)
