"""The log cleaner's counters on ``/metrics``, checked against the segment files of a real broker process:
one cleaning of a compacted topic read every sealed byte twice (its key map, then its copy) and wrote what the
cleaned segment holds, removed the records the files lost, and left a dirty ratio of 0; more records under a
high ``min.cleanable.dirty.ratio`` are left dirty, and the max dirty ratio gauge says how dirty, as the files
say. The topic is produced with ``min.compaction.lag.ms`` of an hour (nothing cleanable), then altered to 0,
so exactly one cleaning happens."""

from __future__ import annotations

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from copyless.broker.storage.cleaner import read_cleaner_checkpoint
from tests.support.batches import records_of
from tests.support.log_files import read_partition_log
from tests.support.metrics import metrics_address, scrape, value
from tests.support.polling import wait_until
from tests.support.topics import unique_topic

KEYS = 12
SEGMENT_BYTES = 8 << 10


def produce(bootstrap: str, topic: str, rounds: range) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 4096})
    errors = []
    for round_number in rounds:
        for key in range(KEYS):
            producer.produce(topic, key=b"key-%02d" % key, value=(b"%d:%d:" % (round_number, key)).ljust(160, b"v"),
                             partition=0, on_delivery=lambda error, _m: error and errors.append(error))
        producer.poll(0)
    assert producer.flush(30) == 0 and not errors, errors[:3]


def alter(bootstrap: str, topic: str, configs: dict) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = [ConfigEntry(name, setting, incremental_operation=AlterConfigOpType.SET)
               for name, setting in configs.items()]
    resource = ConfigResource("topic", topic, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def read_log(proc, topic: str, end: int) -> list:
    """The partition's batches once its named segment files hold every offset below ``end`` (a rolled
    segment takes its offset name on a worker thread, after the append that filled it)."""
    return wait_until(lambda: (batches := read_partition_log(proc.data_dir, topic, 0)) and
                      batches[-1].last_offset == end - 1 and batches, what=f"the log files up to offset {end}",
                      timeout_s=10)


def sealed(directory, batches) -> tuple[list, int]:
    """The batches of the sealed segments (all but the active, the last ``.log``) and the active's base."""
    active = max(int(path.name[:20]) for path in directory.glob("[0-9]" * 20 + ".log"))
    return [batch for batch in batches if batch.base_offset < active], active


def test_cleaner_counters_follow_the_files(broker_factory):
    proc = broker_factory(extra_args=("--metrics-listen", "127.0.0.1:0"), config={"log.cleaner.backoff.ms": 100})
    address = metrics_address(proc)
    before = scrape(address)
    for name in ("cleanings", "failures", "bytes_read", "bytes_written", "records_removed"):
        assert value(before, f"copyless_log_cleaner_{name}_total") == 0, name
    assert value(before, "copyless_log_cleaner_max_dirty_ratio") == 0

    topic = unique_topic("cm")
    configs = {"cleanup.policy": "compact", "segment.bytes": str(SEGMENT_BYTES), "min.cleanable.dirty.ratio": "0.01",
               "min.compaction.lag.ms": str(3600_000)}
    admin = AdminClient({"bootstrap.servers": proc.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(30)
    produce(proc.bootstrap, topic, range(30))
    directory = proc.data_dir / f"{topic}-0"
    batches, active = sealed(directory, read_log(proc, topic, 30 * KEYS))
    assert len(list(directory.glob("[0-9]" * 20 + ".log"))) > 5
    sealed_bytes = sum(len(batch.data) for batch in batches)
    sealed_records = len(records_of(b"".join(batch.data for batch in batches)))
    labels = {"topic": topic, "partition": "0"}
    assert value(scrape(address), "copyless_partition_cleanings_total", **labels) == 0

    alter(proc.bootstrap, topic, {"min.compaction.lag.ms": "0"})
    samples = wait_until(lambda: (s := scrape(address)) and value(s, "copyless_log_cleaner_cleanings_total") >= 1 and s,
                         what="one cleaning", timeout_s=30)
    after, active_after = sealed(directory, read_log(proc, topic, 30 * KEYS))
    assert active_after == active
    assert read_cleaner_checkpoint(directory) == active
    assert value(samples, "copyless_log_cleaner_cleanings_total") == 1
    assert value(samples, "copyless_partition_cleanings_total", **labels) == 1
    assert value(samples, "copyless_log_cleaner_failures_total") == 0
    # The map's pass and the copy's each read every sealed byte once; what was written is what the cleaned
    # segments hold now.
    assert value(samples, "copyless_log_cleaner_bytes_read_total") == 2 * sealed_bytes
    written = sum(len(batch.data) for batch in after)
    assert 0 < written < sealed_bytes / 3
    assert value(samples, "copyless_log_cleaner_bytes_written_total") == written
    assert value(samples, "copyless_log_cleaner_records_removed_total") == \
        sealed_records - len(records_of(b"".join(batch.data for batch in after)))
    assert 0 < value(samples, "copyless_log_cleaner_last_duration_seconds") <= \
        value(samples, "copyless_log_cleaner_busy_seconds_total")
    wait_until(lambda: value(scrape(address), "copyless_log_cleaner_max_dirty_ratio") == 0,
               what="the cleaned log's dirty ratio", timeout_s=10)

    # More rounds, under a ratio they never reach: left dirty, and the gauge is dirty / cleanable bytes.
    alter(proc.bootstrap, topic, {"min.cleanable.dirty.ratio": "0.99"})
    produce(proc.bootstrap, topic, range(30, 45))
    batches, _ = sealed(directory, read_log(proc, topic, 45 * KEYS))
    clean = sum(len(batch.data) for batch in batches if batch.base_offset < active)
    dirty = sum(len(batch.data) for batch in batches if batch.base_offset >= active)
    assert clean and dirty
    expected = dirty / (clean + dirty)
    samples = wait_until(
        lambda: (s := scrape(address))
        and abs(value(s, "copyless_log_cleaner_max_dirty_ratio") - expected) < 1e-5 and s,
        what=f"a max dirty ratio of {expected:.4f}", timeout_s=10,
        detail=lambda: value(scrape(address), "copyless_log_cleaner_max_dirty_ratio"))
    assert value(samples, "copyless_log_cleaner_cleanings_total") == 1
