"""benchmarks.compaction_vs_kafka reads Kafka's cleaner summary (the tiny run of test_bench_modules never starts
Kafka, so its parser is checked here against text in the layout of Kafka 3.9's ``LogCleaner.recordStats``)."""

from __future__ import annotations

import pytest

from benchmarks.compaction_vs_kafka import MIB, copyless_cleanings, kafka_cleanings

# Two cleanings as kafka.out holds them: one of another log, then a large one (thousands separators).
KAFKA_OUT = """\
[2026-11-28 04:20:01,100] INFO [kafka-log-cleaner-thread-0]:
\tLog cleaner thread 0 cleaned log other-0 (dirty section = [0, 120])
\t0.1 MB of log processed in 0.0 seconds (12.5 MB/sec).
\tIndexed 0.1 MB in 0.0 seconds (20.0 Mb/sec, 60.0% of total time)
\tBuffer utilization: 0.0%
\tCleaned 0.1 MB in 0.0 seconds (31.0 Mb/sec, 40.0% of total time)
\tStart size: 0.1 MB (120 messages)
\tEnd size: 0.0 MB (10 messages)
\t90.0% size reduction (91.7% fewer messages)
 (kafka.log.LogCleaner)
[2026-11-28 04:20:09,512] INFO [kafka-log-cleaner-thread-0]:
\tLog cleaner thread 0 cleaned log compacted-r0-0 (dirty section = [99876, 1000000])
\t1,001.5 MB of log processed in 4.3 seconds (232.9 MB/sec).
\tIndexed 901.3 MB in 1.9 seconds (474.4 Mb/sec, 44.2% of total time)
\tBuffer utilization: 17.6%
\tCleaned 1,001.5 MB in 2.4 seconds (417.3 Mb/sec, 55.8% of total time)
\tStart size: 1,001.5 MB (1,000,000 messages)
\tEnd size: 100.2 MB (100,000 messages)
\t90.0% size reduction (90.0% fewer messages)
 (kafka.log.LogCleaner)
"""


def test_kafka_summary_is_read_per_log_with_the_elapsed_time_from_the_rate():
    found = kafka_cleanings(KAFKA_OUT)
    assert [c.log for c in found] == ["other-0", "compacted-r0-0"]
    big = found[1]
    assert big.dirty_bytes == pytest.approx(901.3 * MIB)
    assert big.log_bytes == pytest.approx(1001.5 * MIB)
    assert big.end_bytes == pytest.approx(100.2 * MIB)
    # 1,001.5 MB at 232.9 MB/s: 4.300 s, more precise than the printed "4.3".
    assert big.seconds == pytest.approx(1001.5 / 232.9)


def test_copyless_line_is_read():
    line = ("2026-11-28 04:20:01,100 INFO copyless.storage.cleaner: compacted-r0-0: cleaned offsets [0, 99990) in "
            "1.234 s: 100 segment(s) -> 12, 104857600 -> 10485760 bytes (94371840 dirty bytes mapped), 10000 keys, "
            "90000 records and 0 tombstones removed\n")
    (found,) = copyless_cleanings(line)
    assert (found.log, found.dirty_bytes, found.log_bytes, found.end_bytes, found.seconds) == (
        "compacted-r0-0", 94371840, 104857600, 10485760, 1.234)
