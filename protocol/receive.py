"""Response framing into reusable buffers: the incoming side of a client connection.

Owns: where received bytes land (``get_buffer`` / ``buffer_updated``, the ``asyncio.BufferedProtocol``
shape, so a socket's ``recv_into`` writes straight into it) and cutting the stream into frames
(``int32 size`` + body, Kafka's framing). Pure: no sockets.

Two kinds of frame:
- Small frames (produce acks, metadata, group replies: tens to hundreds of bytes) are read in chunks into one
  reusable ``bytearray`` and handed out as ``bytes`` copies (a copy of a few hundred bytes is cheaper than
  any bookkeeping).
- Large frames (above ``large_frame_bytes``: fetch responses) are read *directly* into a leased buffer from a
  small pool - the bytes already in the chunk buffer are copied once, then ``recv_into`` targets exactly the
  rest of the frame, so record data is never copied between Python buffers. The consumer holds the lease
  while it parses batches lazily and returns it with ``LeasedFrame.release()``; with the consumer keeping
  up, two buffers alternate and a fetch costs no allocation at all.
"""

from __future__ import annotations

import struct

from copyless.protocol.framing import FrameTooLargeError

__all__ = ["BufferPool", "LeasedFrame", "ReceiveBuffer"]

_SIZE = struct.Struct(">i")


class BufferPool:
    """A free list of ``bytearray``s reused for large frames. ``take(n)`` grows a reused buffer if needed."""

    __slots__ = ("_free", "max_free", "allocations")

    def __init__(self, max_free: int = 4) -> None:
        self._free: list[bytearray] = []
        self.max_free = max_free
        self.allocations = 0  # buffers created (a test and a benchmark read this to prove reuse)

    def take(self, size: int) -> bytearray:
        if self._free:
            buffer = self._free.pop()
            if len(buffer) >= size:
                return buffer
            try:
                buffer.extend(bytes(size - len(buffer) + (size >> 3)))
                return buffer
            except BufferError:  # a view of it is still alive somewhere: leave it to the GC
                pass
        self.allocations += 1
        # Round up so slightly larger responses later still fit without a resize.
        return bytearray(max(size, 1 << 16) + (size >> 3))

    def give(self, buffer: bytearray) -> None:
        if len(self._free) < self.max_free:
            self._free.append(buffer)


class LeasedFrame:
    """One large frame held in a pooled buffer. ``view`` is valid until ``release()``."""

    __slots__ = ("view", "_buffer", "_pool")

    def __init__(self, buffer: bytearray, size: int, pool: BufferPool) -> None:
        self._buffer: bytearray | None = buffer
        self._pool = pool
        self.view = memoryview(buffer)[:size]

    def __len__(self) -> int:
        return len(self.view)

    def release(self) -> None:
        """Return the buffer to the pool (idempotent). Any memoryview derived from ``view`` must be gone."""
        buffer = self._buffer
        if buffer is None:
            return
        self._buffer = None
        self.view.release()
        try:
            self._pool.give(buffer)
        except BufferError:  # pragma: no cover - a derived view outlived the lease: let GC take the buffer
            pass


class ReceiveBuffer:
    """Cuts a byte stream into frames, reading large ones straight into pooled buffers.

    Args:
        chunk_bytes: size of the reusable buffer for small frames (also the largest single recv).
        large_frame_bytes: frames above this are read into a leased buffer.
        max_frame_bytes: frames announcing more raise ``FrameTooLargeError`` (the connection must close).
    """

    __slots__ = (
        "_chunk",
        "_start",
        "_end",
        "large_frame_bytes",
        "max_frame_bytes",
        "pool",
        "_large",
        "_large_size",
        "_large_have",
    )

    def __init__(
        self,
        chunk_bytes: int = 256 * 1024,
        large_frame_bytes: int = 32 * 1024,
        max_frame_bytes: int = 256 * 1024 * 1024,
        pool: BufferPool | None = None,
    ) -> None:
        if large_frame_bytes + 4 > chunk_bytes:
            raise ValueError("chunk_bytes must hold a whole small frame")
        self._chunk = bytearray(chunk_bytes)
        self._start = 0
        self._end = 0
        self.large_frame_bytes = large_frame_bytes
        self.max_frame_bytes = max_frame_bytes
        self.pool = pool if pool is not None else BufferPool()
        self._large: bytearray | None = None
        self._large_size = 0
        self._large_have = 0

    def get_buffer(self) -> memoryview:
        """Where the next ``recv_into`` should write (never past the end of a large frame)."""
        if self._large is not None:
            return memoryview(self._large)[self._large_have : self._large_size]
        chunk = self._chunk
        if self._start == self._end:
            self._start = self._end = 0
        elif len(chunk) - self._end < 4096:
            # Move the partial frame to the front; it is at most one small frame (< large_frame_bytes).
            remaining = self._end - self._start
            chunk[:remaining] = chunk[self._start : self._end]
            self._start, self._end = 0, remaining
        return memoryview(chunk)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        """Record that ``nbytes`` were written into the last ``get_buffer()``."""
        if self._large is not None:
            self._large_have += nbytes
        else:
            self._end += nbytes

    def next_frame(self) -> bytes | LeasedFrame | None:
        """The next complete frame: ``bytes`` (small), ``LeasedFrame`` (large), or None (need more data).

        Raises:
            FrameTooLargeError: a negative size or one above ``max_frame_bytes``.
        """
        if self._large is not None:
            if self._large_have < self._large_size:
                return None
            frame = LeasedFrame(self._large, self._large_size, self.pool)
            self._large = None
            return frame
        available = self._end - self._start
        if available < 4:
            return None
        chunk = self._chunk
        (size,) = _SIZE.unpack_from(chunk, self._start)
        if size < 0 or size > self.max_frame_bytes:
            raise FrameTooLargeError(size, self.max_frame_bytes)
        if size > self.large_frame_bytes:
            buffer = self.pool.take(size)
            body_start = self._start + 4
            have = min(available - 4, size)
            buffer[:have] = chunk[body_start : body_start + have]
            self._start = body_start + have
            if have == size:
                return LeasedFrame(buffer, size, self.pool)
            self._large, self._large_size, self._large_have = buffer, size, have
            return None
        if available < 4 + size:
            return None
        body_start = self._start + 4
        self._start = body_start + size
        return bytes(chunk[body_start : self._start])
