"""docs/on-disk.md lists every file a data dir holds: a real single-node broker takes a plain topic, a
compacted topic its cleaner cleans, a transactional producer, a consumer group, a SCRAM user, a dynamic
broker config and a deleted topic (through the ``copyless`` CLI and confluent-kafka's admin client), and its
data dir, read while it runs and after a clean shutdown, holds no file the page does not name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.on_disk import listed_names, unlisted
from tests.support.polling import wait_until

COPYLESS = str(Path(sys.executable).parent / "copyless")


def _cli(*args: str, input: str | None = None) -> str:
    done = subprocess.run([COPYLESS, *args], input=input, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{args}: {done.stderr}"
    return done.stdout


def test_the_page_lists_every_file_a_single_nodes_data_dir_holds(broker_factory, tmp_path):
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    proc = broker_factory(config={"log.cleaner.backoff.ms": 200})
    data, b = proc.data_dir, ("-b", proc.bootstrap)
    seen: set[str] = set()
    _cli("topics", "create", "orders", *b)
    _cli("produce", "orders", "--count", "100", "--size", "100", *b)
    _cli("topics", "create", "state", "--config", "cleanup.policy=compact", "--config", "segment.bytes=16384",
         "--config", "min.cleanable.dirty.ratio=0.01", *b)
    keyed = "".join(f"k{i}:{'v' * 40}\n" for i in range(200))
    for _ in range(6):
        _cli("produce", "state", "-K", ":", *b, input=keyed)
        seen |= listed_names(data)
    _cli("produce", "orders", "--transactional-id", "tx-1", *b, input="one\ntwo\n")
    _cli("consume", "orders", "-g", "billing", "--from-beginning", "-e", "-q", *b)
    password = tmp_path / "password"
    password.write_text("secret\n")
    _cli("users", "set", "alice", "--password-file", str(password), *b)
    admin = AdminClient({"bootstrap.servers": proc.bootstrap})
    resource = ConfigResource("broker", "0", incremental_configs=[
        ConfigEntry("log.retention.ms", "86400000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(30)
    _cli("topics", "create", "gone", *b)
    _cli("topics", "delete", "gone", *b)
    seen |= listed_names(data)
    wait_until(lambda: (data / "state-0" / "cleaner-offset-checkpoint").exists(), what="the cleaner's first pass",
               timeout_s=60)
    seen |= listed_names(data)
    del admin  # its threads would keep reconnecting to the stopped broker
    assert proc.stop() == 0
    seen |= listed_names(data)

    # The scenario made what it set out to make ...
    assert {"transactional", "00000000000000000000.snapshot", "cleaner-offset-checkpoint", "security.json",
            "broker-configs.json", "topics.json",
            "producer-id-block", ".copyless_cleanshutdown", "recovery-point-offset-checkpoint",
            "__consumer_offsets-<n>/", "__transaction_state-<n>/", "*.deleted"} <= seen, seen
    # ... and the page names each file of it.
    missing = unlisted(seen)
    assert not missing, f"docs/on-disk.md does not list {sorted(missing)}"
