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
metadata with leader epochs, offsets by leader); the producer is ``accumulator`` + ``sender`` behind
``producer``, the consumer ``fetcher`` + ``group`` + ``commits`` behind ``consumer``; ``admin`` is the admin
API and ``blocking`` a one-request-at-a-time client for tools; ``cli``/``admin_cli``/``cli_common`` are the
``copyless produce|consume|topics|groups|cluster`` commands.
"""

from copyless.client.admin import Admin, PartitionDescription, TopicDescription
from copyless.client.assignors import TopicPartition
from copyless.client.consumer import Consumer, OffsetOutOfRangeError, RecordTooLargeError
from copyless.client.errors import (
    BufferFullError,
    ClientError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    ProducerClosedError,
    UnsupportedVersionError,
)
from copyless.client.producer import DeliveryFuture, Producer, RecordMetadata
from copyless.client.protocol.fetch_records import ConsumerRecord

__all__ = [
    "Admin",
    "BufferFullError",
    "ClientError",
    "Consumer",
    "ConsumerRecord",
    "DeliveryFuture",
    "KafkaConnectionError",
    "KafkaError",
    "KafkaTimeoutError",
    "OffsetOutOfRangeError",
    "PartitionDescription",
    "Producer",
    "ProducerClosedError",
    "RecordMetadata",
    "RecordTooLargeError",
    "TopicDescription",
    "TopicPartition",
    "UnsupportedVersionError",
]
