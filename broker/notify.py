"""Wake-ups for long-poll fetches: a fetch waiting for data parks one future on every partition it reads,
and an append to any of them resolves it (Kafka's DelayedFetch purgatory keyed by partition).

There is no polling loop: a waiting fetch costs one future and one timer, and an append costs one dict pop
for its partition. Loop thread only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable

__all__ = ["AppendNotifier"]


class AppendNotifier:
    def __init__(self) -> None:
        self._waiters: dict[Hashable, set[asyncio.Future]] = {}
        self._all: set[asyncio.Future] = set()

    @property
    def waiting(self) -> int:
        return len(self._all)

    def waiting_on(self, key: Hashable) -> int:
        """How many waits are parked on ``key``."""
        return len(self._waiters.get(key, ()))

    def notify(self, key: Hashable) -> None:
        """An append happened on ``key`` (a (topic, partition)); wake every fetch waiting on it."""
        waiters = self._waiters.pop(key, None)
        if waiters:
            for future in waiters:
                if not future.done():
                    future.set_result(True)

    def notify_topic(self, topic: str) -> None:
        for key in [key for key in self._waiters if isinstance(key, tuple) and key and key[0] == topic]:
            self.notify(key)

    def wake_all(self) -> None:
        """Shutdown: every waiting fetch answers now with what it has."""
        for future in list(self._all):
            if not future.done():
                future.set_result(False)

    async def wait(self, keys: Iterable[Hashable], timeout_s: float) -> bool:
        """Wait until an append on one of ``keys``, ``wake_all``, or the timeout. True if woken by an append."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        keys = list(keys)
        for key in keys:
            self._waiters.setdefault(key, set()).add(future)
        self._all.add(future)
        timer = loop.call_later(max(timeout_s, 0.0), _resolve, future)
        try:
            return await future
        finally:
            timer.cancel()
            self._all.discard(future)
            for key in keys:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(future)
                    if not waiters:
                        del self._waiters[key]


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(False)
