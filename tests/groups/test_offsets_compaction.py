"""``__consumer_offsets`` is compacted: a group that commits the same partitions thousands of times leaves a
log the cleaner brings down to about one record per key, and a coordinator that loads it (a restart)
replays those plus the active segment, not the history. Real broker process, kafka-python commits."""

from __future__ import annotations

import re

from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from tests.support.groups import create_topic
from tests.support.polling import wait_until

TOPIC = "tracked"
PARTITIONS = 5
COMMITS = 1200
SEGMENT_BYTES = 16 << 10
CONFIG = {
    "offsets.topic.num.partitions": 1,
    "offsets.topic.segment.bytes": SEGMENT_BYTES,
    "log.cleaner.backoff.ms": 100,
}
_LOADED = re.compile(r"__consumer_offsets-0: loaded (\d+) group\(s\), (\d+) committed offset\(s\) from (\d+) record")


def offsets_log_bytes(data_dir) -> int:
    return sum(path.stat().st_size for path in (data_dir / "__consumer_offsets-0").glob("*.log"))


def test_commits_to_the_same_keys_are_cleaned_and_the_load_follows_the_keys(broker_factory):
    broker = broker_factory(config=CONFIG)
    create_topic(broker.bootstrap, TOPIC, PARTITIONS)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="compacted", enable_auto_commit=False)
    partitions = [TopicPartition(TOPIC, number) for number in range(PARTITIONS)]
    try:
        for commit in range(1, COMMITS + 1):
            consumer.commit({tp: OffsetAndMetadata(commit * 10 + tp.partition, "", -1) for tp in partitions})
    finally:
        consumer.close()
    written = COMMITS * PARTITIONS
    # Every commit record is over 60 bytes: the history alone would fill dozens of segments.
    wait_until(lambda: offsets_log_bytes(broker.data_dir) < 3 * SEGMENT_BYTES, timeout_s=60,
               what="the cleaner to compact __consumer_offsets",
               detail=lambda: f"it holds {offsets_log_bytes(broker.data_dir)} bytes")
    broker.restart("graceful")
    # The broker answers before the coordinator's replay ends (its groups answer COORDINATOR_LOAD_IN_PROGRESS
    # meanwhile): wait for the second load's line rather than read the log at once.
    wait_until(lambda: len(_LOADED.findall(broker.log_text())) >= 2, timeout_s=60,
               what="the restarted broker to load __consumer_offsets-0", detail=broker.log_text)
    loads = _LOADED.findall(broker.log_text())
    assert len(loads) == 2, loads
    groups, offsets, replayed = map(int, loads[-1])
    assert (groups, offsets) == (1, PARTITIONS)
    # The cleaned segments hold one record per key; the active one (never cleaned) at most a segment's worth.
    assert replayed <= PARTITIONS + SEGMENT_BYTES // 60 < written // 10, (replayed, written)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="compacted", enable_auto_commit=False)
    try:
        assert {tp.partition: consumer.committed(tp) for tp in partitions} == {
            number: COMMITS * 10 + number for number in range(PARTITIONS)}
    finally:
        consumer.close()
