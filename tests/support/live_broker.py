"""An in-process broker on a real socket and a real data dir, run on its own event-loop thread.

In-process (rather than a subprocess, ``tests.support.broker_process``) so tests can read the broker's
counters and state, e.g. that fetched record bytes went out through sendfile. ``LiveBroker.client()`` opens
a ``KafkaWire`` (``tests.support.kio_requests``) to it.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from copyless.broker.config import BrokerConfig
from copyless.broker.server.app import loop_factory, serve
from copyless.broker.state import Broker
from tests.support.kio_requests import KafkaWire


class LiveBroker:
    """A Broker + Server running on a private loop thread."""

    def __init__(self, data_dir: Path, loop_name: str, **overrides) -> None:
        config = BrokerConfig(
            data_dir=data_dir, listen_host="127.0.0.1", listen_port=0, loop=loop_name, stats_interval_s=0,
            segment_bytes=overrides.pop("segment_bytes", 1 << 20), **overrides,
        )
        self.loop_name = loop_name
        self.broker = Broker(config)
        self.broker.startup()
        factory, _ = loop_factory(loop_name)
        self.loop = factory()
        started = threading.Event()
        self.server = None
        self.error: BaseException | None = None

        def main() -> None:
            asyncio.set_event_loop(self.loop)
            future = self.loop.create_future()

            async def runner():
                task = asyncio.ensure_future(serve(self.broker, loop_name, started=future))
                await asyncio.wait({task, future}, return_when=asyncio.FIRST_COMPLETED)
                if not future.done():
                    await task  # serve() failed before listening: raise its error
                self.server = future.result()
                started.set()
                await task

            try:
                self.loop.run_until_complete(runner())
            except BaseException as exc:  # surfaced by stop()
                self.error = exc
                started.set()
            finally:
                self.loop.close()

        self.thread = threading.Thread(target=main, daemon=True)
        self.thread.start()
        started.wait(60)
        if self.error is not None:
            self.broker.shutdown_logs()
            raise self.error
        self.port = self.server.bound_port
        self.stopped = False

    @property
    def stats(self):
        return self.broker.stats

    def call(self, coroutine_function, *args):
        """Run a coroutine on the broker's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine_function(*args), self.loop).result(60)

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        asyncio.run_coroutine_threadsafe(self.server.shutdown(), self.loop).result(60)
        self.thread.join(30)
        if self.error is not None:
            raise self.error

    def client(self) -> KafkaWire:
        return KafkaWire(self.port)
