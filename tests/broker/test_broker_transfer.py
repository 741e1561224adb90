"""The socket writer on real files and real sockets: gathered bytes, sendfile for slices, partial writes
under a full socket buffer, the copying comparison path, and warming cold ranges off the loop."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from copyless.broker.server.app import loop_factory
from copyless.broker.server.transfer import is_cached, send_segments, warm
from copyless.broker.stats import BrokerStats


class Region:
    """A (fd, position, length) region of a real file, shaped like storage's FileSlice."""

    def __init__(self, fd: int, position: int, length: int) -> None:
        self.fd, self.position, self.length = fd, position, length

    def read_bytes(self) -> bytes:
        return os.pread(self.fd, self.length, self.position)


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "segment.log"
    content = os.urandom(3 * 1024 * 1024 + 123)
    path.write_bytes(content)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)  # clean pages, so POSIX_FADV_DONTNEED can evict them
    yield fd, content
    os.close(fd)


def evicted(fd: int, region: Region) -> bool:
    """Drop the file's clean pages from the page cache. The advice is best effort (a page that is briefly
    referenced stays), so it is given up to three times before the caller gives up on a cold region."""
    for _ in range(3):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if not is_cached(region):
            return True
        time.sleep(0.05)
    return False


def run_transfer(loop_name: str, segments, use_sendfile: bool, receive_bytes: int):
    """Send ``segments`` through a real TCP connection; a thread reads slowly so the sender sees EAGAIN."""
    stats = BrokerStats()
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.socket()
    # Small buffers on both ends: a 2.6 MB response cannot fit, so the sender must wait for EAGAIN to clear.
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    client.connect(listener.getsockname())
    server_side, _ = listener.accept()
    listener.close()
    server_side.setblocking(False)
    server_side.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    received = bytearray()

    def reader():
        time.sleep(0.1)  # let the sender fill both buffers first
        while len(received) < receive_bytes:
            chunk = client.recv(32 * 1024)
            if not chunk:
                break
            received.extend(chunk)

    thread = threading.Thread(target=reader)
    thread.start()
    factory, _ = loop_factory(loop_name)
    loop = factory()
    try:
        loop.run_until_complete(send_segments(loop, server_side, segments, stats, use_sendfile=use_sendfile))
    finally:
        loop.close()
    thread.join(30)
    client.close()
    server_side.close()
    return bytes(received), stats


@pytest.mark.parametrize("loop_name", ["uvloop", "asyncio"])
def test_sendfile_and_gathered_bytes_in_order(loop_name, data_file):
    fd, content = data_file
    segments = [b"head", Region(fd, 10, 2_000_000), b"mid" * 5000, Region(fd, 2_500_000, 600_000), b"", b"tail"]
    expected = b"head" + content[10:2_000_010] + b"mid" * 5000 + content[2_500_000:3_100_000] + b"tail"
    received, stats = run_transfer(loop_name, segments, True, len(expected))
    assert received == expected
    assert stats.fetch_sendfile_bytes == 2_600_000 and stats.fetch_copied_bytes == 0
    assert stats.response_bytes == len(expected) - 2_600_000
    assert stats.write_eagain_waits > 0  # a 64 KiB send buffer cannot take 2 MB at once


@pytest.mark.parametrize("loop_name", ["uvloop", "asyncio"])
def test_copy_path_counts_copied_bytes(loop_name, data_file):
    fd, content = data_file
    segments = [b"h", Region(fd, 0, 1_000_000), b"t"]
    received, stats = run_transfer(loop_name, segments, False, 1_000_002)
    assert received == b"h" + content[:1_000_000] + b"t"
    assert stats.fetch_copied_bytes == 1_000_000 and stats.fetch_sendfile_bytes == 0


def test_many_small_buffers_exceeding_iov_max(data_file):
    pieces = [bytes([n % 251]) * 7 for n in range(3000)]  # more buffers than IOV_MAX (1024)
    received, stats = run_transfer("uvloop", pieces, True, 21000)
    assert received == b"".join(pieces)


def test_cold_region_detected_and_warmed(data_file):
    fd, _content = data_file
    region = Region(fd, 0, 3 * 1024 * 1024)
    if not evicted(fd, region):
        pytest.skip("this filesystem keeps the pages (or has no RWF_NOWAIT)")
    warm(region)
    assert is_cached(region)


def test_cold_region_warmed_before_sendfile(data_file):
    # A probe that misses starts readahead, and on this VM's disk that read can finish before the transfer
    # probes the region itself: then the region is warm again and no warm-up is due (1 run in 12 here, a
    # third of runs when the eviction was checked with mincore). So the region is evicted afresh up to five
    # times; one transfer must find it cold and count the warm-up, and every transfer must send the same
    # bytes by sendfile alone.
    fd, content = data_file
    region = Region(fd, 0, 1_500_000)
    warmups = []
    for _ in range(5):
        if not evicted(fd, region):
            pytest.skip("this filesystem keeps the pages (or has no RWF_NOWAIT)")
        received, stats = run_transfer("uvloop", [b"x", region], True, 1_500_001)
        assert received == b"x" + content[:1_500_000]
        assert stats.fetch_sendfile_bytes == 1_500_000 and stats.fetch_copied_bytes == 0
        warmups.append(stats.fetch_cold_warmups)
        if stats.fetch_cold_warmups:
            break
    assert warmups[-1] == 1, f"no transfer found the region cold: warm-ups {warmups}"
