"""Low-level file operations of the log: preallocation, mapping, pre-faulting. Blocking; worker threads.

Figures measured on this project's 2-core machine, writing 1 GiB through mmap in 1 MiB slices: 0.32-0.39 GB/s
into a fresh sparse (ftruncate) file, 2.1 GB/s after posix_fallocate, 6.7 GB/s after
madvise(MADV_POPULATE_WRITE); os.write manages 3.3 GB/s. First-touch page faults, not the copy, decide the
speed of an mmap'd log, so the next segment is allocated *and* pre-faulted before it is needed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import mmap
import os
from pathlib import Path

from . import blocking

log = logging.getLogger("copyless.storage")

# Linux >= 5.14; Python 3.11's mmap module does not export the constant.
MADV_POPULATE_WRITE = 23
# Pre-fault in 8 MiB steps: each step is one madvise(2) with the GIL released, and a shutdown can stop
# between steps.
POPULATE_STEP_BYTES = 8 << 20
# Zeros are written in chunks of at most 1 MiB, aligned to 1 MiB. Measured here (benchmarks.mmap_warmup,
# "first touch", CPU seconds per GiB put into a fresh file's page cache on memory the guest had used
# before): 0.33 for write() in 1 MiB chunks, 0.49-0.55 in 256 KiB chunks, 1.9 in 2 MiB chunks, 1.68 in
# 4 MiB chunks. The page cache takes a write of up to 1 MiB in folios the guest has at hand; larger ones
# ask for 2 MiB blocks, which the guest has given back to the hypervisor (free-page reporting).
ZERO_CHUNK_BYTES = 1 << 20
_ZEROS = memoryview(bytes(ZERO_CHUNK_BYTES))  # sliced without a copy
MADV_WILLNEED = 3

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_madvise = _libc.madvise
_madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_madvise.restype = ctypes.c_int
_populate_write_supported = True


def preallocate(fd: int, length: int, start: int = 0) -> None:
    """Reserve real blocks for [start, length) (posix_fallocate). A write through a map into a page without
    blocks on a full disk kills the process with SIGBUS; a preallocated page already owns its blocks, so
    the log only ever writes below what was preallocated (see Segment.allocated_bytes)."""
    if length > start:
        blocking.check("posix_fallocate")
        os.posix_fallocate(fd, start, length - start)


def set_readahead(fd: int, enabled: bool) -> None:
    """Turn the kernel's readahead for reads through ``fd`` off (an active segment) or back on (sealed).

    An active segment's file is preallocated to its full size, so a read past the committed end reads
    blocks the log has not written yet. Pair it with MADV_RANDOM on the segment's map (``no_readaround``).
    A sealed segment ends at its last batch, and cold reads of it want readahead.
    """
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_NORMAL if enabled else os.POSIX_FADV_RANDOM)


def no_readaround(region: mmap.mmap) -> None:
    """MADV_RANDOM on an active segment's map: a page fault in it reads no pages around the faulting one.

    Without it, each fault (the pre-fault thread's included) read around it by the readahead window, 8 MiB
    here (read_ahead_kb), and marked a page of that window for more readahead. The next ``os.sendfile``
    that reached the marked page read the following 8 MiB ahead, past the committed end. Allocating and
    zeroing that page cache took 5-7 ms on the event loop, once per 8 MiB appended. At 30k records/s of
    1 KB, that was a 6 ms stall every 0.28 s. With MADV_RANDOM, a loop-lag probe over 20 s at that rate saw
    6 callbacks over 4 ms instead of 58.
    """
    region.madvise(mmap.MADV_RANDOM)


def map_address(region: mmap.mmap) -> int:
    """The address of a map's first byte. The ctypes view is dropped at once so the map stays closable."""
    view = ctypes.c_char.from_buffer(region)
    try:
        return ctypes.addressof(view)
    finally:
        del view


def populate(region: mmap.mmap, start: int, length: int, should_stop=lambda: False) -> str:
    """Pre-fault [start, start+length) of a shared writable map. Returns the method used.

    madvise(MADV_POPULATE_WRITE) through ctypes, which drops the GIL for the call (``mmap.madvise`` keeps it,
    which would stall the event-loop thread for the whole populate: ~100-300 ms per GiB here). On kernels
    without it (EINVAL), fall back to MADV_WILLNEED, which reads the range into the page cache (zeros, from
    preallocated blocks), so the first append pays a minor fault instead of an allocation. Neither changes a
    byte of the file, so both may run over a range the appends are writing (``write_zeros`` may not).

    The caller guarantees the map stays open until this returns.
    """
    global _populate_write_supported
    blocking.check("pre-faulting pages")
    page = mmap.PAGESIZE
    end = min(start + length, len(region))
    start -= start % page  # madvise needs a page-aligned start (EINVAL otherwise)
    address = map_address(region)
    position = start
    method = "madvise"
    while position < end:
        if should_stop():
            return method + "-stopped"
        step = min(POPULATE_STEP_BYTES, end - position)
        if _populate_write_supported:
            if _madvise(address + position, step, MADV_POPULATE_WRITE) == 0:
                position += step
                continue
            err = ctypes.get_errno()
            if err != errno.EINVAL:
                raise OSError(err, os.strerror(err))
            _populate_write_supported = False
            log.info("MADV_POPULATE_WRITE unsupported (kernel < 5.14): warming segments with MADV_WILLNEED")
        method = "willneed"
        if _madvise(address + position, step, MADV_WILLNEED) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        position += step
    return method


def write_zeros(fd: int, start: int, end: int) -> None:
    """Write zeros over [start, end) of ``fd`` with pwrite(2) in aligned chunks of at most ZERO_CHUNK_BYTES
    (GIL released for each). The caller owns the range: no append may be writing into it (Prefault's
    claims)."""
    blocking.check("writing zeros ahead of the appends")
    position = start
    while position < end:
        stop = min(end, (position // ZERO_CHUNK_BYTES + 1) * ZERO_CHUNK_BYTES)
        position += os.pwrite(fd, _ZEROS[: stop - position], position)


def write_at(fd: int, data: memoryview, position: int) -> None:
    """pwrite(2) all of ``data`` at ``position`` (a regular file takes it in one call; short writes loop)."""
    written = os.pwrite(fd, data, position)
    while written < len(data):
        written += os.pwrite(fd, data[written:], position + written)


def sync_data(fd: int) -> None:
    """fdatasync(2) ``fd`` (worker threads only: an fdatasync of a busy log takes tens to hundreds of ms)."""
    blocking.check("fdatasync")
    os.fdatasync(fd)


def remove_file(path: Path) -> None:
    """unlink(2) ``path`` if it exists (worker threads only: an unlink of a large file frees its extents
    in the calling thread)."""
    blocking.check("unlink")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
