"""A gRPC proxy in front of a real etcd that can lose the answer of a call etcd has applied.

A TCP-level proxy (``tests.support.proxy``) can only cut or stall a whole connection, and the brokers keep
their lease, their watch and their writes on one connection: stalling it stalls everything. This proxy
forwards each gRPC call of etcd's v3 API on its own (unary calls as calls, the Watch and LeaseKeepAlive
streams as streams, bytes untouched), so a test can pick out one call, let etcd apply it, and then drop its
answer: the caller's deadline passes and it sees the "maybe applied" outcome every etcd client must handle.

    proxy = EtcdFaultProxy(etcd.endpoint).start()
    cluster = Cluster(workdir, proxy, 2)                 # brokers reach etcd through the proxy only
    rule = proxy.lose_answer(TXN, b'{"broker_id": 2}')  # the next Txn whose request holds those bytes

``hold_watches()`` keeps every Watch stream's answers at the proxy until ``release_watches()`` (they are then
delivered in order): the brokers' images stand still while their calls still go through, as when etcd's
watch path lags its writes. ``delay_s`` (0 unless set) slows etcd down as seen through the proxy: every
unary call, and every message of a stream in either direction, waits that long first (streams stay in
order). ``host`` picks the address the proxy listens on (a NetLab's bridge address, for brokers on hosts of
a lab). A rule matches raw request bytes (the protobuf carries keys and values verbatim). ``url()`` stands in for
``EtcdProcess.url`` so a ``Cluster`` can be pointed at the proxy. The proxy runs its own event loop on a
thread of the test process.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

import grpc
from grpc import aio

from tests.support.etcd import unique_root

__all__ = ["EtcdFaultProxy", "TXN", "LostAnswer"]

TXN = "/etcdserverpb.KV/Txn"
WATCH = "/etcdserverpb.Watch/Watch"
# etcd's bidirectional streams; every other method the brokers use is unary.
_STREAMS = {"/etcdserverpb.Watch/Watch", "/etcdserverpb.Lease/LeaseKeepAlive"}
# How long a lost answer is held before the proxy fails the call: past every broker's call deadline.
HOLD_S = 3.0


@dataclass
class LostAnswer:
    """Lose the answers of the next ``count`` calls of ``method`` whose request contains ``needle``."""

    method: str
    needle: bytes
    count: int = 1
    # Also hold every Watch stream from the moment the call is matched, before etcd sees it: no image can
    # carry the applied change to the caller until ``release_watches``.
    hold_watches: bool = False
    lost: list[bytes] = field(default_factory=list)  # the requests whose answers were dropped, applied

    def matches(self, method: str, request: bytes) -> bool:
        return self.count > len(self.lost) and method == self.method and self.needle in request


class EtcdFaultProxy:
    def __init__(self, target: str, host: str = "127.0.0.1") -> None:
        self.target = target
        self.host = host
        self.port = 0
        self.delay_s = 0.0
        self.rules: list[LostAnswer] = []
        self.calls = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="etcd-proxy", daemon=True)
        self._server: aio.Server | None = None
        self._channel: aio.Channel | None = None
        self._lock = threading.Lock()
        self._watches_flowing: asyncio.Event | None = None  # made on the proxy's loop

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def url(self, root: str | None = None) -> str:
        return f"etcd://{self.endpoint}/{root or unique_root()}"

    def start(self) -> EtcdFaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    async def _start(self) -> None:
        self._watches_flowing = asyncio.Event()
        self._watches_flowing.set()
        self._channel = aio.insecure_channel(self.target)
        self._server = aio.server()
        self._server.add_generic_rpc_handlers([_Handler(self)])
        self.port = self._server.add_insecure_port(f"{self.host}:0")
        await self._server.start()

    def lose_answer(self, method: str, needle: bytes, count: int = 1, *, hold_watches: bool = False) -> LostAnswer:
        rule = LostAnswer(method, needle, count, hold_watches=hold_watches)
        with self._lock:
            self.rules.append(rule)
        return rule

    def hold_watches(self) -> None:
        """Keep the Watch streams' answers here from now on (see the module docstring)."""
        asyncio.run_coroutine_threadsafe(self._set_watches(False), self._loop).result(10)

    def release_watches(self) -> None:
        asyncio.run_coroutine_threadsafe(self._set_watches(True), self._loop).result(10)

    async def _set_watches(self, flowing: bool) -> None:
        assert self._watches_flowing is not None
        if flowing:
            self._watches_flowing.set()
        else:
            self._watches_flowing.clear()

    def _rule_for(self, method: str, request: bytes) -> LostAnswer | None:
        with self._lock:
            for rule in self.rules:
                if rule.matches(method, request):
                    return rule
        return None

    def close(self) -> None:
        async def stop():
            if self._server is not None:
                await self._server.stop(0)
            if self._channel is not None:
                await self._channel.close()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, proxy: EtcdFaultProxy) -> None:
        self.proxy = proxy

    def service(self, details):
        method = details.method
        if method in _STREAMS:
            return grpc.stream_stream_rpc_method_handler(self._stream(method))
        return grpc.unary_unary_rpc_method_handler(self._unary(method))

    def _unary(self, method: str):
        proxy = self.proxy

        async def forward(request: bytes, context) -> bytes:
            proxy.calls += 1
            if proxy.delay_s > 0:
                await asyncio.sleep(proxy.delay_s)
            rule = proxy._rule_for(method, request)
            if rule is not None:
                # Claimed before the call goes out, so two racing calls never both count against one rule.
                with proxy._lock:
                    rule.lost.append(request)
                if rule.hold_watches:
                    await proxy._set_watches(False)
            answer = await proxy._channel.unary_unary(method)(request, timeout=30)
            if rule is not None:
                # etcd has applied it; the caller never learns so.
                await asyncio.sleep(HOLD_S)
                await context.abort(grpc.StatusCode.UNAVAILABLE, "answer lost by the test proxy")
            return answer

        return forward

    def _stream(self, method: str):
        proxy = self.proxy

        async def forward(requests, context):
            proxy.calls += 1

            async def slowed():
                async for request in requests:
                    if proxy.delay_s > 0:
                        await asyncio.sleep(proxy.delay_s)
                    yield request

            upstream = proxy._channel.stream_stream(method)(slowed())
            async for answer in upstream:
                if method == WATCH:
                    await proxy._watches_flowing.wait()
                if proxy.delay_s > 0:
                    await asyncio.sleep(proxy.delay_s)
                yield answer

        return forward
