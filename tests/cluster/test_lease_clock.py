"""A broker's lease deadline runs on CLOCK_BOOTTIME (``broker.cluster.etcd_metadata.lease_clock``).

While a machine is suspended CLOCK_MONOTONIC stops and CLOCK_BOOTTIME goes on, as etcd's own clock does on
the machine that is not suspended. The test registers a broker's metadata backend with a real etcd, then
stops the monotonic clock the process reads (what a suspend does to it) and lets real time pass beyond the
lease: the broker must no longer count its lease valid, since etcd has let it expire meanwhile. On the
monotonic clock it counted the lease valid for the whole TTL after waking, leading partitions a successor
already led.
"""

from __future__ import annotations

import asyncio
import time
import types

from copyless.broker.cluster.etcd_metadata import EtcdMetadata
from copyless.broker.cluster.keys import Layout
from copyless.broker.config import BrokerConfig
from tests.support.etcd import unique_root


async def _register(endpoint: str, data_dir) -> EtcdMetadata:
    root = unique_root()
    broker = types.SimpleNamespace(
        node_id=1, data_dir=data_dir,
        config=BrokerConfig(metadata=f"etcd://{endpoint}/{root}", broker_session_timeout_ms=2000),
        advertised_listeners=lambda: {"PLAINTEXT": ("127.0.0.1", 9092)},
        replicas=types.SimpleNamespace(new_broker_epoch=lambda epoch: None))
    metadata = EtcdMetadata(broker)
    metadata.layout = Layout(root, "cluster")
    metadata.directory_id = "suspended"
    try:
        await metadata._register()
    finally:
        await metadata.client.close()
    return metadata


def test_a_lease_is_not_counted_valid_across_a_suspend(etcd_server, tmp_path, monkeypatch):
    metadata = asyncio.run(_register(etcd_server.endpoint, tmp_path))
    assert metadata.lease_valid()
    stopped = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: stopped)  # suspended: the monotonic clock stands still
    time.sleep(metadata.ttl_s + 0.5)  # ... while etcd's time passes beyond the lease
    assert not metadata.lease_valid(), "the lease was still counted valid after it ran out in etcd"
