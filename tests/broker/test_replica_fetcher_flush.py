"""The replica fetcher's wait for the fdatasync of replicated records under --flush-mode sync is bounded: a
flush that outlasts ``FLUSH_WAIT_S`` stalls only its own partition (not fetched, so its log end is not
reported, until the flush ends), never the fetch loop of every partition from that leader."""

from __future__ import annotations

import asyncio
import concurrent.futures
from types import SimpleNamespace

from copyless.broker.cluster import replica_fetcher
from copyless.broker.cluster.replica_fetcher import ReplicaFetcher, _Follow


class FlushLog:
    def __init__(self, future: concurrent.futures.Future) -> None:
        self.future = future

    def flush(self) -> concurrent.futures.Future:
        return self.future


def test_a_stalled_flush_stalls_only_its_partition(monkeypatch):
    monkeypatch.setattr(replica_fetcher, "FLUSH_WAIT_S", 0.2)
    stalled, quick = concurrent.futures.Future(), concurrent.futures.Future()
    quick.set_result(None)
    slow_partition = SimpleNamespace(key=("t", 0), log=FlushLog(stalled))
    fast_partition = SimpleNamespace(key=("t", 1), log=FlushLog(quick))
    fetcher = ReplicaFetcher(SimpleNamespace(node_id=2), 1)
    follows = {p.key: _Follow(p, 3, needs_truncation=False) for p in (slow_partition, fast_partition)}

    async def scenario():
        loop = asyncio.get_running_loop()
        started = loop.time()
        await fetcher._wait_flushed([slow_partition, fast_partition], follows)
        waited = loop.time() - started
        assert follows[("t", 0)].flushing is not None and follows[("t", 1)].flushing is None
        stalled.set_result(None)  # the disk comes back
        for _ in range(100):
            if follows[("t", 0)].flushing is None:
                break
            await asyncio.sleep(0.01)
        return waited

    waited = asyncio.run(scenario())
    assert 0.2 <= waited < 2.0
    assert follows[("t", 0)].flushing is None  # fetched again once its records are durable
