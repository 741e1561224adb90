"""A small asyncio client for etcd's v3 API: the calls the cluster metadata needs, over several endpoints.

Owns: the gRPC channel to one etcd member at a time (moving to the next endpoint when a call finds the
member unreachable or too slow), per-call deadlines, and the shapes the rest of the cluster code uses:
``KeyValue``, transactions that report the revision they were applied at, leases, and watches that report
each response's revision.

Why not a higher-level library: every conditional write of the cluster needs the revision its transaction
was applied at (a partition state's version is its key's mod_revision; the controller's fencing token is
the controller-epoch key's), which the Python etcd clients drop. ``aetcd`` is used for what it does well:
the generated, maintained gRPC stubs for etcd's protobufs (``aetcd.rpc``), on ``grpc.aio``, which runs on
uvloop. (etcd3 is broken with current protobuf; etcd3aio works too but its generated modules clash with
aetcd's in one process.)

Failure model: a call that cannot reach a quorum (member down, partitioned, etcd restarting) raises
``EtcdUnavailable`` after its deadline; the next call goes to the next endpoint. A call that raised may or
may not have been applied: callers make writes conditional, so retrying one is safe, and read back what
they need to know. Watches end with ``EtcdUnavailable`` (resume from the last revision + 1) or
``WatchCompacted`` (that revision is gone: reload everything).

Loop thread only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from aetcd import rpc

__all__ = ["EtcdClient", "EtcdUnavailable", "WatchCompacted", "KeyValue", "TxnResult", "parse_endpoints",
           "created", "modified", "value_is", "put", "delete", "delete_prefix", "get", "prefix_end"]

log = logging.getLogger("copyless.etcd")

# Codes after which the member is treated as unusable and the next endpoint is tried.
_UNAVAILABLE = {rpc.StatusCode.UNAVAILABLE, rpc.StatusCode.DEADLINE_EXCEEDED, rpc.StatusCode.CANCELLED,
                rpc.StatusCode.UNKNOWN, rpc.StatusCode.INTERNAL}


class EtcdUnavailable(Exception):
    """No etcd member answered within the deadline (or the call failed in transit)."""


class WatchCompacted(Exception):
    """A watch asked for a revision etcd has compacted away: the watcher must reload from scratch."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"revision compacted (oldest kept: {compact_revision})")
        self.compact_revision = compact_revision


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store's revision after the transaction (the mod_revision of what it wrote)
    ranges: list[list[KeyValue]]  # the results of its get operations, in order


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """``host:port[,host:port...]`` (port defaults to 2379). Raises ValueError."""
    endpoints = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep:
            host, port = item, "2379"
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bad etcd endpoint {item!r} (expected HOST:PORT)")
        endpoints.append((host, int(port)))
    if not endpoints:
        raise ValueError("no etcd endpoint given")
    return endpoints


def prefix_end(prefix: bytes) -> bytes:
    """The range end that makes a range read or delete cover every key starting with ``prefix``."""
    end = bytearray(prefix)
    for index in reversed(range(len(end))):
        if end[index] < 0xFF:
            end[index] += 1
            return bytes(end[: index + 1])
    return b"\0"


def _reraise_if_ours() -> None:
    """A CancelledError out of a grpc call is either this task being cancelled (re-raise it) or the call's
    channel closed under it by ``_rotate`` (grpc reports that as a cancelled future): the caller then turns
    it into EtcdUnavailable, so a rotation never kills the task that happened to be waiting."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _kv(message) -> KeyValue:
    return KeyValue(message.key, message.value, message.create_revision, message.mod_revision, message.lease)


# --- transaction parts (pure) ------------------------------------------------------------------------------

def created(key: bytes, revision: int):
    """Compare: the key's create revision is ``revision`` (0: the key does not exist)."""
    return rpc.Compare(key=key, result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, create_revision=revision)


def modified(key: bytes, revision: int):
    """Compare: the key was last written at ``revision`` (0: the key does not exist)."""
    return rpc.Compare(key=key, result=rpc.Compare.EQUAL, target=rpc.Compare.MOD, mod_revision=revision)


def value_is(key: bytes, value: bytes):
    return rpc.Compare(key=key, result=rpc.Compare.EQUAL, target=rpc.Compare.VALUE, value=value)


def put(key: bytes, value: bytes, lease: int = 0):
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))


def delete(key: bytes):
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))


def delete_prefix(prefix: bytes):
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=prefix, range_end=prefix_end(prefix)))


def get(key: bytes):
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=key))


class EtcdClient:
    """One logical connection to an etcd cluster through any of ``endpoints``."""

    def __init__(self, endpoints: Sequence[tuple[str, int]], *, timeout_s: float = 2.0) -> None:
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s
        self._index = 0
        self._channel = None
        self._kv = self._lease = self._watch = None
        self.closed = False
        # Set when a call found the member unusable: a watch stream on the old channel may hang rather than
        # fail (a paused member keeps its TCP connection), so watches restart on the next endpoint then.
        self._rotated = asyncio.Event()
        # Calls made, by method (Range, Txn, Put, LeaseGrant, LeaseKeepAlive, LeaseRevoke, Watch): the
        # stats line shows them, so a reader can check what the hot paths cost in etcd round trips.
        self.calls: dict[str, int] = {}

    @property
    def endpoint(self) -> str:
        host, port = self.endpoints[self._index]
        return f"{host}:{port}"

    def _stubs(self):
        if self.closed:
            raise EtcdUnavailable("client closed")
        if self._channel is None:
            self._channel = rpc.insecure_channel(self.endpoint, options=[
                # A dead member is noticed by the call deadline; reconnect attempts stay quick.
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ])
            self._kv = rpc.KVStub(self._channel)
            self._lease = rpc.LeaseStub(self._channel)
            self._watch = rpc.WatchStub(self._channel)
        return self._kv, self._lease, self._watch

    def _rotate(self, error: BaseException) -> None:
        old = self.endpoint
        channel, self._channel = self._channel, None
        self._kv = self._lease = self._watch = None
        if channel is not None:
            asyncio.get_running_loop().create_task(channel.close())
        self._index = (self._index + 1) % len(self.endpoints)
        self._rotated.set()
        log.info("etcd %s failed (%s); next endpoint: %s", old, error, self.endpoint)

    async def _unary(self, method: str, request, stub_index: int = 0, timeout_s: float | None = None):
        stub = self._stubs()[stub_index]
        self.calls[method] = self.calls.get(method, 0) + 1
        try:
            return await getattr(stub, method)(request, timeout=timeout_s or self.timeout_s)
        except rpc.AioRpcError as exc:
            if exc.code() in _UNAVAILABLE:
                self._rotate(exc.code())
                raise EtcdUnavailable(f"etcd {method} failed: {exc.code().name}: {exc.details()}") from None
            raise
        except asyncio.CancelledError:
            _reraise_if_ours()
            raise EtcdUnavailable(f"etcd {method} cancelled: its channel was closed") from None

    # --- key-value ----------------------------------------------------------------------------------------

    async def get(self, key: bytes) -> tuple[KeyValue | None, int]:
        """(the key's value or None, the store's revision). Linearizable."""
        response = await self._unary("Range", rpc.RangeRequest(key=key))
        return (_kv(response.kvs[0]) if response.kvs else None), response.header.revision

    async def get_prefix(self, prefix: bytes) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` at one revision, and that revision. Linearizable."""
        response = await self._unary("Range", rpc.RangeRequest(key=prefix, range_end=prefix_end(prefix)))
        return [_kv(kv) for kv in response.kvs], response.header.revision

    async def txn(self, compare, success, failure=()) -> TxnResult:
        response = await self._unary("Txn", rpc.TxnRequest(compare=list(compare), success=list(success),
                                                           failure=list(failure)))
        ranges = [[_kv(kv) for kv in op.response_range.kvs] for op in response.responses
                  if op.WhichOneof("response") == "response_range"]
        return TxnResult(response.succeeded, response.header.revision, ranges)

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        response = await self._unary("Put", rpc.PutRequest(key=key, value=value, lease=lease))
        return response.header.revision

    # --- leases -------------------------------------------------------------------------------------------

    async def grant(self, ttl_s: int) -> tuple[int, int]:
        """A new lease: (id, granted ttl in seconds; etcd grants at least its minimum)."""
        response = await self._unary("LeaseGrant", rpc.LeaseGrantRequest(TTL=ttl_s), 1)
        return response.ID, response.TTL

    async def keepalive(self, lease_id: int, timeout_s: float | None = None) -> int:
        """Refresh a lease; returns its TTL in seconds (0 or less: the lease is gone)."""
        stub = self._stubs()[1]
        self.calls["LeaseKeepAlive"] = self.calls.get("LeaseKeepAlive", 0) + 1
        try:
            async for reply in stub.LeaseKeepAlive(iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]),
                                                    timeout=timeout_s or self.timeout_s):
                return reply.TTL
        except rpc.AioRpcError as exc:
            if exc.code() in _UNAVAILABLE:
                self._rotate(exc.code())
                raise EtcdUnavailable(f"etcd keepalive failed: {exc.code().name}") from None
            raise
        except asyncio.CancelledError:
            _reraise_if_ours()
            raise EtcdUnavailable("etcd keepalive cancelled: its channel was closed") from None
        return 0

    async def revoke(self, lease_id: int) -> None:
        try:
            await self._unary("LeaseRevoke", rpc.LeaseRevokeRequest(ID=lease_id), 1)
        except rpc.AioRpcError as exc:
            if "not found" not in (exc.details() or ""):
                raise

    # --- watches ------------------------------------------------------------------------------------------

    async def watch_prefix(self, prefix: bytes, start_revision: int) -> AsyncIterator[tuple[int, list]]:
        """Yield ``(revision, [(is_put, KeyValue), ...])`` per watch response, from ``start_revision`` on.

        The events of one transaction arrive in one response. Ends by raising EtcdUnavailable (resume from
        the last revision seen + 1) or WatchCompacted (reload). Progress notifications carry no events but a
        revision, so an idle watcher's revision still moves.
        """
        stub = self._stubs()[2]
        self.calls["Watch"] = self.calls.get("Watch", 0) + 1
        request = rpc.WatchRequest(create_request=rpc.WatchCreateRequest(
            key=prefix, range_end=prefix_end(prefix), start_revision=start_revision, progress_notify=True))
        self._rotated.clear()
        stream = stub.Watch(iter([request]))
        responses = stream.__aiter__()
        rotated = asyncio.ensure_future(self._rotated.wait())
        try:
            while True:
                following = asyncio.ensure_future(responses.__anext__())
                await asyncio.wait({following, rotated}, return_when=asyncio.FIRST_COMPLETED)
                if rotated.done() or following.cancelled():
                    # Closing the old channel cancels this stream's read (grpc surfaces it as a cancelled
                    # future, not an RPC error): either way the watch resumes on the next endpoint.
                    following.cancel()
                    raise EtcdUnavailable("the etcd member was replaced while watching")
                try:
                    response = following.result()
                except StopAsyncIteration:
                    raise EtcdUnavailable("etcd watch stream ended") from None
                if response.compact_revision:
                    raise WatchCompacted(response.compact_revision)
                if response.canceled:
                    raise EtcdUnavailable(f"watch canceled by etcd: {response.cancel_reason}")
                if response.created:
                    continue
                events = [(event.type == rpc.Event.PUT, _kv(event.kv)) for event in response.events]
                yield response.header.revision, events
        except rpc.AioRpcError as exc:
            self._rotate(exc.code())
            raise EtcdUnavailable(f"etcd watch ended: {exc.code().name}: {exc.details()}") from None
        finally:
            rotated.cancel()
            stream.cancel()

    async def close(self) -> None:
        self.closed = True
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()
