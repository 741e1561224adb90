"""Gathered writes: SendQueue's buffer plan (coalescing, IOV_MAX chunks, partial-write bookkeeping), checked
as properties and then driven through sendmsg on a real non-blocking socketpair with a tiny send buffer."""

import socket
import threading
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from copyless.protocol.gather import IOV_MAX, SendQueue

buffer_lists = st.lists(st.binary(max_size=600), max_size=60)


@settings(max_examples=150, deadline=None)
@given(buffer_lists, st.integers(min_value=1, max_value=512), st.integers(min_value=1, max_value=8))
def test_plan_preserves_bytes_and_coalesces_only_small_runs(buffers, gather_min_bytes, iov_max):
    queue = SendQueue(gather_min_bytes, iov_max=iov_max)
    queue.extend(buffers)
    assert queue.queued_bytes == sum(map(len, buffers))
    planned = list(queue._buffers)
    assert b"".join(bytes(b) for b in planned) == b"".join(buffers)
    large = [b for b in buffers if len(b) >= gather_min_bytes]
    # Large buffers are queued as themselves (no copy), in order.
    assert [b for b in planned if isinstance(b, bytes)] == large
    assert all(a is b for a, b in zip([b for b in planned if isinstance(b, bytes)], large, strict=True))
    # No two coalesced pieces are adjacent: every run of small buffers became one.
    for first, second in pairwise(planned):
        assert isinstance(first, bytes) or isinstance(second, bytes)
    assert len(queue.iov()) <= iov_max


@settings(max_examples=150, deadline=None)
@given(buffer_lists, st.lists(st.integers(min_value=0, max_value=700), max_size=80), st.integers(1, 5))
def test_partial_writes_resume_exactly(buffers, writes, iov_max):
    """Simulated short writes of arbitrary sizes: what is sent, in order, is exactly what was queued."""
    queue = SendQueue(64, iov_max=iov_max)
    queue.extend(buffers)
    expected = b"".join(buffers)
    sent = bytearray()
    for limit in writes + [1 << 30] * (len(buffers) + 2):
        if not queue:
            break
        offered = b"".join(bytes(b) for b in queue.iov())
        assert offered  # iov() never returns an empty plan while bytes are queued
        count = min(limit, len(offered))
        sent += offered[:count]
        queue.advance(count)
    assert bytes(sent) == expected
    assert queue.queued_bytes == 0 and len(queue) == 0


def test_appending_after_a_partial_write_of_the_open_tail():
    queue = SendQueue(1000)
    queue.extend([b"abc", b"def"])  # one coalesced tail
    iov = queue.iov()
    queue.advance(2)
    del iov
    queue.extend([b"ghi"])  # must not grow a bytearray a memoryview still points into
    assert b"".join(bytes(b) for b in queue.iov()) == b"cdefghi"


def _drive_socketpair(buffers, iov_max):
    """sendmsg the queue into a non-blocking socket with a small buffer while a thread drains the peer."""
    sender, receiver = socket.socketpair()
    sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sender.setblocking(False)
    expected = b"".join(buffers)
    received = bytearray()

    def drain():
        while len(received) < len(expected):
            chunk = receiver.recv(1 << 16)
            if not chunk:
                break
            received.extend(chunk)

    thread = threading.Thread(target=drain)
    thread.start()
    queue = SendQueue(512, iov_max=iov_max)
    queue.extend(buffers)
    partial_writes = 0
    calls = 0
    try:
        while queue:
            iov = queue.iov()
            assert len(iov) <= iov_max
            try:
                count = sender.sendmsg(iov)
            except BlockingIOError:
                count = 0
            calls += 1
            if 0 < count < sum(map(len, iov)):
                partial_writes += 1
            queue.advance(count)
    finally:
        thread.join(timeout=30)
        sender.close()
        receiver.close()
    assert bytes(received) == expected
    return partial_writes, calls


def test_real_socket_partial_writes_and_iov_max():
    # 3000 buffers of 2 KiB (all "large": one iovec each) into a 4 KiB socket buffer: more buffers than
    # IOV_MAX per call and many short writes; the bytes must arrive complete and in order.
    buffers = [bytes([i % 251]) * 2048 for i in range(3000)]
    partial_writes, calls = _drive_socketpair(buffers, IOV_MAX)
    assert partial_writes > 0  # the tiny buffer really forced short writes
    assert calls > 3


def test_sendmsg_refuses_more_than_iov_max_buffers_so_the_plan_must_chunk():
    sender, receiver = socket.socketpair()
    try:
        try:
            sender.sendmsg([b"x"] * (IOV_MAX + 1))
            refused = False
        except OSError:
            refused = True
        assert refused, "the kernel accepted more than IOV_MAX iovecs; the chunking would be untested"
        queue = SendQueue(1, iov_max=IOV_MAX)
        queue.extend([b"x"] * (IOV_MAX + 1))
        assert len(queue.iov()) == IOV_MAX
    finally:
        sender.close()
        receiver.close()


@settings(max_examples=15, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=3000), min_size=1, max_size=200), st.integers(1, 64))
def test_real_socket_random_buffers(buffers, iov_max):
    _drive_socketpair(buffers, iov_max)
