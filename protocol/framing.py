"""Kafka's size-delimited framing: every request and response is ``int32 size`` followed by ``size`` bytes.

Sans-IO (h11 style): feed bytes as they arrive, take whole frames out. Shared by the broker (requests) and
the client (responses). ``FrameBuffer`` owns one growable buffer and compacts it lazily, so a stream of
small frames costs one memmove per buffer's worth of data rather than one per frame.
"""

from __future__ import annotations

import struct

__all__ = ["FrameBuffer", "FrameTooLargeError", "NEED_DATA"]

_SIZE = struct.Struct(">i")

NEED_DATA = None
# take_partial hands out frames of at least this size for direct receive; smaller ones are cheap to copy.
DIRECT_MIN_BYTES = 64 * 1024


class FrameTooLargeError(ValueError):
    """The peer announced a frame over the limit (or a negative size): the connection must be closed."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class FrameBuffer:
    """Accumulates stream bytes and yields complete frames (without their 4-byte size prefix).

    Args:
        max_frame_bytes: frames announcing more are refused with ``FrameTooLargeError`` before any of
            their body is buffered, which bounds memory per connection (Kafka ``socket.request.max.bytes``).
    """

    __slots__ = ("_buffer", "_start", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = 100 * 1024 * 1024) -> None:
        self._buffer = bytearray()
        self._start = 0
        self.max_frame_bytes = max_frame_bytes

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes."""
        self._buffer += data

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer) - self._start

    def take_partial(self) -> tuple[bytearray, int] | None:
        """Move an incomplete large frame out of the buffer: ``(frame, filled)`` where ``frame`` is a bytearray
        of the frame's body size whose first ``filled`` bytes are the body bytes buffered so far; the caller
        receives the rest straight into it (``recv_into``) and then owns a whole frame. The buffer is left
        empty. None when the next frame is complete, small (< DIRECT_MIN_BYTES), its size header has not
        arrived or is invalid (next_frame raises on that), or less than an eighth of its body has arrived.

        Why: through feed + next_frame every byte of a request is copied twice in Python before the handler
        sees it (into the growing buffer, then out as bytes), which was a fifth of the broker's loop-thread
        samples under 1 MiB produce requests. The eighth bounds what a client can make the broker allocate
        ahead of the data it sends, the same bound per connection as before (one frame).
        """
        buffer = self._buffer
        with memoryview(buffer) as view:
            partial = self._direct_frame(view[self._start:])
        if partial is not None:
            buffer.clear()
            self._start = 0
        return partial

    def take_partial_of(self, data: bytes | bytearray | memoryview) -> tuple[bytearray, int] | None:
        """``take_partial`` for bytes just received and not fed: with nothing buffered, and ``data`` the start of
        a large frame that it does not complete (the conditions of ``take_partial``), the frame is built
        straight from ``data``. None otherwise, and the caller feeds ``data``.

        Why: a 1 MiB produce request arrives 256 KiB at a time in the broker's shared receive buffer; fed, its
        first chunk was copied into this buffer and out again into the frame, 7% of the loop thread's samples
        under 10 KB produce. From here it is copied once.
        """
        if self._start != len(self._buffer):
            return None
        with memoryview(data) as view:
            return self._direct_frame(view)

    def _direct_frame(self, view: memoryview) -> tuple[bytearray, int] | None:
        """``(frame, filled)`` for ``view`` holding the start of a frame that goes out for direct receive (see
        take_partial), its body's first bytes copied in; None for any other frame."""
        body = len(view) - 4
        if body < 0:
            return None
        (size,) = _SIZE.unpack_from(view, 0)
        if not (DIRECT_MIN_BYTES <= size <= self.max_frame_bytes and size > body and body * 8 >= size):
            return None
        frame = bytearray(size)
        frame[:body] = view[4:]
        return frame, body

    def next_frame(self) -> bytes | None:
        """The next complete frame's body, or ``NEED_DATA`` (None).

        Raises:
            FrameTooLargeError: the next frame's size is negative or over ``max_frame_bytes``.
        """
        buffer = self._buffer
        start = self._start
        available = len(buffer) - start
        if available < 4:
            return NEED_DATA
        (size,) = _SIZE.unpack_from(buffer, start)
        if size < 0 or size > self.max_frame_bytes:
            raise FrameTooLargeError(size, self.max_frame_bytes)
        if available < 4 + size:
            return NEED_DATA
        # One copy: slicing the bytearray itself would copy twice (a bytearray slice, then bytes()).
        with memoryview(buffer) as view:
            frame = bytes(view[start + 4 : start + 4 + size])
        start += 4 + size
        # Compact once the consumed prefix dominates; avoids O(n^2) memmoves on pipelined small frames.
        if start == len(buffer):
            buffer.clear()
            start = 0
        elif start > 65536 and start * 2 > len(buffer):
            del buffer[:start]
            start = 0
        self._start = start
        return frame
