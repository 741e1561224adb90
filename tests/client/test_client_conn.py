"""The connection shell on real sockets, under uvloop and the stdlib loop: a large gathered request into a
slowly-reading peer (partial writes, EAGAIN, add_writer resumption, more buffers than IOV_MAX), FIFO
response matching, and every in-flight request failing when the peer goes away."""

import asyncio
import hashlib
import struct

import pytest

from copyless.client.conn import Connection
from copyless.client.errors import KafkaConnectionError
from copyless.protocol.messages import ApiKey


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slow: bool) -> None:
    """A peer speaking just enough Kafka framing: ApiVersions v0 -> empty list; anything else -> sha256
    of the request body, read in small slices with pauses so the client's socket buffer fills up."""
    try:
        while True:
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            request = bytearray()
            while len(request) < size:
                request += await reader.read(min(65536, size - len(request)))
                if slow:
                    await asyncio.sleep(0.001)
            api_key, _version, correlation_id, client_id_length = struct.unpack_from(">hhih", request)
            body = bytes(request[10 + client_id_length :])
            if api_key == ApiKey.API_VERSIONS:
                payload = struct.pack(">ihi", correlation_id, 0, 0)
            elif api_key == ApiKey.METADATA and body == b"close":
                writer.close()
                return
            else:
                payload = struct.pack(">i", correlation_id) + hashlib.sha256(body).digest()
            writer.write(struct.pack(">i", len(payload)) + payload)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def _run(loop_name, coroutine):
    if loop_name == "uvloop":
        import uvloop

        return uvloop.run(coroutine)
    return asyncio.run(coroutine)


@pytest.mark.parametrize("loop_name", ["uvloop", "asyncio"])
def test_large_gathered_requests_survive_partial_writes(loop_name):
    async def scenario():
        server = await asyncio.start_server(lambda r, w: _serve(r, w, slow=True), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        connection = await Connection.open("127.0.0.1", port)
        try:
            # 3000 separate 4 KiB buffers (> IOV_MAX per sendmsg, 12 MiB: far beyond the socket buffer)
            # plus small pieces to coalesce, pipelined with two small requests behind it.
            big = []
            for i in range(3000):
                big.append(bytes([i % 256]) * 4096)
                big.append(b"%d," % i)
            expected_big = hashlib.sha256(b"".join(big)).digest()

            def digest(frame, offset):
                return bytes(frame[offset:])

            first = connection.send(ApiKey.PRODUCE, big, digest, check_version=False)
            assert connection.queued_bytes > 0  # the socket could not take it all at once
            second = connection.send(ApiKey.PRODUCE, [b"small"], digest, check_version=False)
            third = connection.send(ApiKey.PRODUCE, [b"tiny", b"er"], digest, check_version=False)
            results = await asyncio.wait_for(asyncio.gather(first, second, third), 60)
            assert results == [expected_big, hashlib.sha256(b"small").digest(), hashlib.sha256(b"tinyer").digest()]
            assert connection.queued_bytes == 0
        finally:
            connection.close()
            server.close()
            await server.wait_closed()

    _run(loop_name, scenario())


@pytest.mark.parametrize("loop_name", ["uvloop", "asyncio"])
def test_in_flight_requests_fail_when_the_peer_closes(loop_name):
    async def scenario():
        server = await asyncio.start_server(lambda r, w: _serve(r, w, slow=False), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        connection = await Connection.open("127.0.0.1", port)
        try:
            ok = connection.send(ApiKey.PRODUCE, [b"a"], lambda f, o: bytes(f[o:]), check_version=False)
            doomed = connection.send(ApiKey.METADATA, [b"close"], lambda f, o: bytes(f[o:]), check_version=False)
            after = connection.send(ApiKey.PRODUCE, [b"b"], lambda f, o: bytes(f[o:]), check_version=False)
            assert await ok == hashlib.sha256(b"a").digest()
            for future in (doomed, after):
                with pytest.raises(KafkaConnectionError):
                    await asyncio.wait_for(future, 30)
            assert connection.closed
            with pytest.raises(KafkaConnectionError):
                connection.send(ApiKey.PRODUCE, [b"c"], None, check_version=False)
        finally:
            connection.close()
            server.close()
            await server.wait_closed()

    _run(loop_name, scenario())


@pytest.mark.parametrize("loop_name", ["uvloop", "asyncio"])
def test_on_response_callbacks_are_called_once_from_the_read_handler(loop_name):
    """``send(on_response=...)``: no future; the callback gets (result, None) while the response is being
    dispatched (the request behind it still in flight), and (None, error) exactly once when the
    connection goes away."""

    async def scenario():
        server = await asyncio.start_server(lambda r, w: _serve(r, w, slow=False), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        connection = await Connection.open("127.0.0.1", port)
        calls = []
        try:
            decode = lambda f, o: bytes(f[o:])  # noqa: E731
            returned = connection.send(
                ApiKey.PRODUCE,
                [b"a"],
                decode,
                check_version=False,
                on_response=lambda r, e: calls.append(("a", r, e, connection.in_flight_count)),
            )
            assert returned is None
            # A plain future behind it resolves after the callback ran (responses are read in order).
            plain = connection.send(ApiKey.PRODUCE, [b"b"], decode, check_version=False)
            plain.add_done_callback(lambda _f: calls.append(("b done", len(calls))))
            await asyncio.wait_for(plain, 30)
            assert calls[0] == ("a", hashlib.sha256(b"a").digest(), None, 1)
            doomed = []
            connection.send(
                ApiKey.METADATA, [b"close"], decode, check_version=False, on_response=lambda r, e: doomed.append((r, e))
            )
            connection.send(
                ApiKey.PRODUCE, [b"c"], decode, check_version=False, on_response=lambda r, e: doomed.append((r, e))
            )
            for _ in range(3000):
                if len(doomed) == 2:
                    break
                await asyncio.sleep(0.01)
            assert len(doomed) == 2 and all(r is None and isinstance(e, KafkaConnectionError) for r, e in doomed)
            assert connection.closed
            connection.close()  # closing again calls nothing twice
            assert len(doomed) == 2
        finally:
            connection.close()
            server.close()
            await server.wait_closed()
        assert calls[1] == ("b done", 1)

    _run(loop_name, scenario())
