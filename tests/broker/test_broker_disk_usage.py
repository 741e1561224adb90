"""A broker's disk follows its data: 100 idle partitions with Kafka's default 1 GiB segments hold under
1 GiB of blocks (each segment file keeps its logical size, but owns blocks only for a first step of a few
MiB, see LogConfig.preallocate_*), where whole preallocated segments held 100 GiB."""

from __future__ import annotations

import os

from kio.schema.errors import ErrorCode

from tests.support.batches import build_batch
from tests.support.kio_requests import KafkaWire, create_topic, produce
from tests.support.polling import wait_until
from tests.support.topics import unique_topic

GIB = 1 << 30
PARTITIONS = 100


def blocks_under(directory) -> tuple[int, int]:
    """(bytes of blocks owned, apparent bytes) of every file under ``directory``."""
    owned = apparent = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                stat = os.stat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            owned += stat.st_blocks * 512
            apparent += stat.st_size
    return owned, apparent


def test_a_hundred_idle_partitions_hold_under_a_gib(broker_factory):
    broker = broker_factory(config={"log.segment.bytes": GIB})
    client = KafkaWire(broker.port)
    try:
        topic = unique_topic("idle")
        assert create_topic(client, topic, PARTITIONS).error_code == ErrorCode.none
        # A record in a few of them: a partition that took a little data is still idle.
        for partition in range(0, PARTITIONS, 10):
            response = produce(client, topic, {partition: build_batch([b"x" * 1000] * 10)})
            assert response.responses[0].partition_responses[0].error_code == ErrorCode.none
    finally:
        client.close()
    directories = [broker.data_dir / f"{topic}-{partition}" for partition in range(PARTITIONS)]
    wait_until(lambda: all(d.is_dir() for d in directories), what="every partition's directory", timeout_s=60)
    owned, apparent = blocks_under(broker.data_dir)
    assert apparent >= PARTITIONS * GIB, "each active segment has its logical size (one map covers it)"
    assert owned < GIB, f"{PARTITIONS} idle partitions hold {owned / GIB:.2f} GiB of blocks"
