"""Test helpers: an in-process broker on a real socket and a real data dir, run on its own event-loop
thread, and a small blocking Kafka client that encodes requests and decodes responses with kio.

In-process (rather than a subprocess) so tests can read the broker's counters, e.g. that fetched record
bytes went out through sendfile.
"""

from __future__ import annotations

import asyncio
import io
import socket
import struct
import threading
from pathlib import Path

from kio.index import load_response_schema
from kio.serial import entity_reader, entity_writer

from copyless.broker.config import BrokerConfig
from copyless.broker.server.app import loop_factory, serve
from copyless.broker.state import Broker


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

    def client(self) -> "KafkaWire":
        return KafkaWire(self.port)


class KafkaWire:
    """A blocking Kafka-protocol client: kio entities in, kio entities out (response header v0)."""

    def __init__(self, port: int, client_id: str = "wire-test") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.client_id = client_id.encode()
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def frame(self, entity, correlation_id: int | None = None) -> bytes:
        buffer = io.BytesIO()
        entity_writer(type(entity))(buffer, entity)
        return self.raw_frame(entity.__api_key__, entity.__version__, buffer.getvalue(), correlation_id)

    def raw_frame(self, api_key: int, version: int, body: bytes, correlation_id: int | None = None) -> bytes:
        if correlation_id is None:
            self.correlation_id += 1
            correlation_id = self.correlation_id
        header = struct.pack(">hhih", api_key, version, correlation_id, len(self.client_id)) + self.client_id
        return struct.pack(">i", len(header) + len(body)) + header + body

    def send(self, entity) -> int:
        self.sock.sendall(self.frame(entity))
        return self.correlation_id

    def read_frame(self) -> bytes:
        size = struct.unpack(">i", self.recv_exactly(4))[0]
        return self.recv_exactly(size)

    def recv_exactly(self, count: int) -> bytes:
        chunks = []
        while count:
            chunk = self.sock.recv(count)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            chunks.append(chunk)
            count -= len(chunk)
        return b"".join(chunks)

    def receive(self, api_key: int, version: int):
        frame = self.read_frame()
        (correlation_id,) = struct.unpack_from(">i", frame)
        body, consumed = entity_reader(load_response_schema(api_key, version))(frame, 4)
        assert consumed == len(frame) - 4, "response has trailing bytes"
        return correlation_id, body

    def request(self, entity):
        correlation_id = self.send(entity)
        got, body = self.receive(entity.__api_key__, entity.__version__)
        assert got == correlation_id
        return body

    def is_closed(self, timeout_s: float = 10.0) -> bool:
        """True when the broker closed this connection (EOF) within the timeout."""
        self.sock.settimeout(timeout_s)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False
