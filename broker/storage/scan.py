"""Header scans: walking the batch headers of a segment's file with small preads (file layer, any thread).

A scan reads only the 61-byte RecordBatch headers it needs (``protocol/records.py``) through
``os.pread`` on the segment's fd, never the map, so it is coherent with the appends (one page cache) and
costs a syscall per window. It stops at the first torn or nonsensical header; CRCs are the loader's job.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from copyless.protocol.records import LOG_OVERHEAD, RECORD_BATCH_OVERHEAD, BatchHeader, read_header

__all__ = ["scan_headers", "SCAN_STATS", "SCAN_FIRST_WINDOW_BYTES", "SCAN_MAX_WINDOW_BYTES"]

# Header scans (offset -> position for a fetch, timestamp lookups, load_clean) pread windows of the log into
# Python memory. A fetch's scan starts at the sparse index entry at or below the target, at most
# index_interval_bytes (4096) plus one batch before it, so a first window of 8 KiB covers the whole scan in one
# pread whenever batches are <= 4 KiB (~80 headers of 100-byte batches). Measured here: a pread costs ~2 us
# for 61 B, 4 KiB or 8 KiB alike (the syscall dominates) but 6.7 us for 64 KiB, so a fixed 64 KiB window
# would triple the cost of the common fetch and copy 8x the record bytes for nothing (the fetch itself
# sends them with sendfile). Scans that run past the first window (start-up, batch_headers, a segment
# without index entries) double the window up to 64 KiB: ~10 GB/s of scan instead of ~4 GB/s. After a batch
# at least as large as the window, the next read is just its 61-byte header: with 1 MiB batches a scan
# reads 61 B per batch, not a window of record bytes.
SCAN_FIRST_WINDOW_BYTES = 8 << 10
SCAN_MAX_WINDOW_BYTES = 64 << 10
# Every header-scan pread, counted (bytes copied into Python by scans; proves the windows stay small).
SCAN_STATS = {"preads": 0, "bytes": 0}
_MIN_BATCH_BYTES = RECORD_BATCH_OVERHEAD


def scan_headers(fd: int, start: int, end: int) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for each complete batch in [start, end) of ``fd`` (no CRC checks).

    Stops at the first torn or nonsensical header (zeros, a length past ``end``). Touches disk (pread).
    """
    buffer = b""
    buffer_start = start
    position = start
    window = SCAN_FIRST_WINDOW_BYTES
    previous_size = 0
    while end - position >= _MIN_BATCH_BYTES:
        relative = position - buffer_start
        if relative < 0 or relative + RECORD_BATCH_OVERHEAD > len(buffer):
            if previous_size >= SCAN_FIRST_WINDOW_BYTES:
                length = RECORD_BATCH_OVERHEAD  # big batches: read the next header only
            else:
                length = window
                window = min(window * 2, SCAN_MAX_WINDOW_BYTES)
            buffer = os.pread(fd, min(length, end - position), position)
            SCAN_STATS["preads"] += 1
            SCAN_STATS["bytes"] += len(buffer)
            buffer_start = position
            relative = 0
            if len(buffer) < RECORD_BATCH_OVERHEAD:
                return
        header = read_header(buffer, relative)
        if header.batch_length < RECORD_BATCH_OVERHEAD - LOG_OVERHEAD or header.size > end - position:
            return
        yield position, header
        position += header.size
        previous_size = header.size
