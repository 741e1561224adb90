"""Request helpers shared by the broker tests: kio-encoded CreateTopics / Produce / Fetch over ``KafkaWire``."""

from __future__ import annotations

import datetime
import time

from copyless.client.protocol.records import decode_records, iter_batches
from kio.schema.create_topics.v4 import request as create_v4
from kio.schema.fetch.v11 import request as fetch_v11
from kio.schema.produce.v8 import request as produce_v8

MS = datetime.timedelta(milliseconds=1)


def create_topic(client, name: str, partitions: int = 1, configs=()):
    response = client.request(
        create_v4.CreateTopicsRequest(
            topics=(
                create_v4.CreatableTopic(
                    name=name, num_partitions=partitions, replication_factor=1, assignments=(),
                    configs=tuple(create_v4.CreatableTopicConfig(name=k, value=v) for k, v in configs),
                ),
            ),
            timeout=1000 * MS,
            validate_only=False,
        )
    )
    return response.topics[0]


def produce(client, topic: str, records_by_partition: dict, acks: int = 1, module=produce_v8):
    request = module.ProduceRequest(
        transactional_id=None, acks=acks, timeout=5000 * MS,
        topic_data=(
            module.TopicProduceData(
                name=topic,
                partition_data=tuple(
                    module.PartitionProduceData(index=partition, records=records)
                    for partition, records in records_by_partition.items()
                ),
            ),
        ),
    )
    if acks == 0:
        client.send(request)
        return None
    return client.request(request)


def fetch(client, topic: str, offsets: dict, *, max_wait_ms=0, min_bytes=1, max_bytes=50 << 20,
          partition_max_bytes=1 << 20, module=fetch_v11):
    fields = dict(
        max_wait=max_wait_ms * MS, min_bytes=min_bytes, max_bytes=max_bytes, isolation_level=0,
        topics=(
            module.FetchTopic(
                topic=topic,
                partitions=tuple(
                    module.FetchPartition(partition=p, fetch_offset=o, partition_max_bytes=partition_max_bytes)
                    for p, o in offsets.items()
                ),
            ),
        ),
    )
    if module is fetch_v11:
        fields.update(session_id=0, session_epoch=-1, forgotten_topics_data=(), rack_id="")
    return client.request(module.FetchRequest(**fields))


def eventually(predicate, timeout_s: float = 10.0) -> bool:
    """The broker thread updates counters just after the kernel took the bytes; give it that moment."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def values_of(records: bytes) -> list[bytes]:
    out = []
    for position, _header in iter_batches(records):
        out += [r.value for r in decode_records(records, position)]
    return out
