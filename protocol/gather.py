"""The outgoing side of a connection as a queue of buffers for gathered writes (``socket.sendmsg``).

Owns: coalescing small buffers, chunking at IOV_MAX, and the bookkeeping after a partial write. Pure: the
shell calls ``iov()``, hands the list to ``sendmsg``, and reports the byte count back with ``advance(n)``.

Rules:
- A buffer of at least ``gather_min_bytes`` is queued as its own iovec (referenced, never copied).
- Smaller buffers are copied into an open ``bytearray`` at the tail, so runs of small pieces (request
  headers, partition prefixes, small values) become one iovec. The crossover is the writev measurement's
  (``batch_builder.GATHER_MIN_VALUE_BYTES``).
- One ``iov()`` returns at most ``IOV_MAX`` (1024 on Linux) buffers: ``sendmsg`` with 1025 fails with
  EMSGSIZE and ``writev`` with EINVAL (reference §3.5, verified on this machine).
- A partial write (``n`` < bytes offered, normal on a non-blocking socket with a full send buffer) drops the
  fully-sent buffers and replaces the partly-sent one with a memoryview of its unsent tail. The common case
  - everything sent - clears the queue in O(1); only a partial write walks the buffers (once).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable

from copyless.protocol.batch_builder import GATHER_MIN_VALUE_BYTES, Payload

__all__ = ["IOV_MAX", "SendQueue"]

try:
    IOV_MAX = os.sysconf("SC_IOV_MAX")
except (ValueError, OSError, AttributeError):  # not POSIX: the Linux value
    IOV_MAX = 1024
if IOV_MAX <= 0:
    IOV_MAX = 1024


class SendQueue:
    """Buffers waiting to be written, in order.

    Args:
        gather_min_bytes: buffers this large or larger keep their own iovec; smaller ones are coalesced.
        iov_max: the most buffers one ``iov()`` returns.
    """

    __slots__ = ("gather_min_bytes", "iov_max", "_buffers", "_open_tail", "queued_bytes")

    def __init__(self, gather_min_bytes: int = GATHER_MIN_VALUE_BYTES, iov_max: int = IOV_MAX) -> None:
        if iov_max < 1:
            raise ValueError("iov_max must be at least 1")
        self.gather_min_bytes = gather_min_bytes
        self.iov_max = iov_max
        self._buffers: deque[Payload] = deque()
        # The bytearray that small buffers are being copied into, or None once it has been handed out by
        # iov() (a memoryview of it may then be alive, and a bytearray with exports cannot grow).
        self._open_tail: bytearray | None = None
        self.queued_bytes = 0

    def __len__(self) -> int:
        return len(self._buffers)

    def __bool__(self) -> bool:
        return self.queued_bytes > 0

    def extend(self, buffers: Iterable[Payload]) -> None:
        """Queue ``buffers`` (bytes-like) after everything already queued."""
        small = self.gather_min_bytes
        queue = self._buffers
        tail = self._open_tail
        total = 0
        for buffer in buffers:
            length = len(buffer)
            if length == 0:
                continue
            total += length
            if length >= small:
                queue.append(buffer)
                tail = None
            elif tail is not None:
                tail += buffer
            else:
                tail = bytearray(buffer)
                queue.append(tail)
        self._open_tail = tail
        self.queued_bytes += total

    def iov(self) -> list[Payload]:
        """The next buffers to offer to ``sendmsg`` (at most ``iov_max``; empty when nothing is queued)."""
        self._open_tail = None
        queue = self._buffers
        if len(queue) <= self.iov_max:
            return list(queue)
        return [queue[i] for i in range(self.iov_max)]

    def advance(self, sent_bytes: int) -> None:
        """Drop ``sent_bytes`` from the front of the queue (after a write returned that many)."""
        if sent_bytes <= 0:
            return
        if sent_bytes > self.queued_bytes:
            raise ValueError(f"advance({sent_bytes}) past the {self.queued_bytes} queued bytes")
        self.queued_bytes -= sent_bytes
        queue = self._buffers
        if self.queued_bytes == 0:
            queue.clear()
            self._open_tail = None
            return
        while sent_bytes:
            head = queue[0]
            length = len(head)
            if sent_bytes >= length:
                queue.popleft()
                sent_bytes -= length
            else:
                queue[0] = memoryview(head)[sent_bytes:]
                if head is self._open_tail:
                    self._open_tail = None
                sent_bytes = 0
