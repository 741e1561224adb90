"""FileSlice: a pinned, immutable byte region of a segment file, the zero-copy handle reads return.

A fetch response carries FileSlices and the server sends them with ``os.sendfile(sock, slice.fd,
slice.position, slice.length)``: record bytes go from the page cache to the socket without entering Python
memory. The slice pins its segment: retention cannot close the fd or delete the file until every slice is
released (Kafka checks for a truncated file in ``FileRecords.writeTo``; we make that impossible instead).
"""

from __future__ import annotations

import os

__all__ = ["FileSlice"]


class FileSlice:
    """``(fd, position, length)`` of committed log bytes; release() when the send completed or failed."""

    __slots__ = ("fd", "position", "length", "_segment", "_on_unpinned", "__weakref__")

    def __init__(self, segment, position: int, length: int, on_unpinned=None) -> None:
        # The caller has already pinned ``segment`` once for this slice.
        self.fd = segment.fd
        self.position = position
        self.length = length
        self._segment = segment
        self._on_unpinned = on_unpinned

    def release(self) -> None:
        """Unpin the segment. Idempotent; loop-thread safe (never blocks: deletion goes to a worker)."""
        segment, self._segment = self._segment, None
        if segment is not None and segment.unpin() and self._on_unpinned is not None:
            self._on_unpinned(segment)

    def __enter__(self) -> FileSlice:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def __del__(self) -> None:
        # A forgotten slice must not pin a retired segment forever.
        if self._segment is not None:
            self.release()

    @property
    def released(self) -> bool:
        return self._segment is None

    @property
    def ends_segment(self) -> bool:
        """Whether the region runs to its segment's committed end (a read never spans two segments)."""
        return self._segment is not None and self.position + self.length == self._segment.committed_position

    def upper_bound_offset(self) -> int | None:
        """An offset above every record in the region (``Segment.fetch_upper_bound``); None once released."""
        segment = self._segment
        return None if segment is None else segment.fetch_upper_bound(self.position + self.length)

    def read_bytes(self) -> bytes:
        """COPY the region into Python memory (pread). Only for the --no-sendfile comparison path and tests."""
        if self._segment is None:
            raise ValueError("FileSlice already released")
        chunks = []
        position, remaining = self.position, self.length
        while remaining:
            chunk = os.pread(self.fd, remaining, position)
            if not chunk:
                raise OSError(f"unexpected end of file at {position} (fd {self.fd})")
            chunks.append(chunk)
            position += len(chunk)
            remaining -= len(chunk)
        return b"".join(chunks) if len(chunks) != 1 else chunks[0]

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"FileSlice(fd={self.fd}, position={self.position}, length={self.length})"
