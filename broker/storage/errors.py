"""Storage errors: one type for every OS-level failure, one for offsets outside the log.

``StorageError`` maps to KAFKA_STORAGE_ERROR (56); it carries the path, the errno and the numbers that
explain it (bytes needed, bytes free). ``OffsetOutOfRangeError`` maps to OFFSET_OUT_OF_RANGE (1) and is
deliberately *not* a StorageError: a consumer asking for a deleted offset is not a broken disk.
"""

from __future__ import annotations

import errno as _errno
import os

__all__ = ["StorageError", "OffsetOutOfRangeError", "UnexpectedAppendOffsetError", "AppendNotReady", "free_bytes",
           "storage_error_from"]


class StorageError(Exception):
    """An I/O failure in the log (ENOSPC, EDQUOT, EIO, ...). Appends fail; reads keep working.

    Attributes:
        path: the file or directory involved.
        errno: the OS errno, or None for a storage invariant violation.
        numbers: a dict of the figures behind the error (e.g. ``bytes_needed``, ``bytes_free``).
    """

    def __init__(self, message: str, *, path=None, errno: int | None = None, **numbers) -> None:
        details = ", ".join(f"{key}={value}" for key, value in numbers.items())
        where = f" [{path}]" if path is not None else ""
        super().__init__(f"{message}{where}" + (f" ({details})" if details else ""))
        self.path = None if path is None else os.fspath(path)
        self.errno = errno
        self.numbers = numbers

    @property
    def is_disk_full(self) -> bool:
        return self.errno in (_errno.ENOSPC, _errno.EDQUOT, _errno.EFBIG)


class OffsetOutOfRangeError(Exception):
    """``offset`` lies outside [log_start_offset, log_end_offset]."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int, where: str = "") -> None:
        super().__init__(
            f"offset {offset} out of range [{log_start_offset}, {log_end_offset}]" + (f" of {where}" if where else "")
        )
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class AppendNotReady(Exception):
    """An append needs what a worker thread is still preparing (the next segment at a roll, the next step of
    blocks, a chunk of pre-fault zeros being written where the append would go). The log stays as it was
    past ``appended``: retry the rest once ``ready`` resolves. Not an error a client sees: the partition
    awaits ``ready`` (a concurrent Future) and appends again, so the event loop never waits in a blocking call.

    Attributes:
        ready: a concurrent Future resolved when retrying may succeed.
        appended: ``(base_offset, last_offset, consumed_bytes)`` of leading whole batches already appended
            (an append of more batches than one segment holds, split across rolls), or None.
        follower_headers: for a follower's append, the ``(base offset, header)`` of those batches, whose
            producer state the partition applies before it waits (set by ``PartitionLog``), or None.
    """

    def __init__(self, what: str, ready, appended: tuple[int, int, int] | None = None, on_waited=None) -> None:
        super().__init__(f"append waits for {what}")
        self.ready = ready
        self.appended = appended
        self.follower_headers: list | None = None
        self._on_waited = on_waited

    def waited(self, seconds: float) -> None:
        """The caller reports how long it awaited ``ready`` (for the counters of whoever raised this)."""
        if self._on_waited is not None:
            self._on_waited(seconds)


class UnexpectedAppendOffsetError(Exception):
    """A follower append whose first batch does not start at the log end (Kafka's
    ``UnexpectedAppendOffsetException``): the follower's log moved (a truncation) while the fetch was in
    flight, or the leader answered for another offset. Nothing was appended; the fetcher truncates again."""

    def __init__(self, first_offset: int, log_end_offset: int, where: str = "") -> None:
        super().__init__(f"follower append starts at offset {first_offset}, the log ends at {log_end_offset}"
                         + (f" in {where}" if where else ""))
        self.first_offset = first_offset
        self.log_end_offset = log_end_offset


def free_bytes(path) -> int | None:
    """Bytes available to this user on the filesystem holding ``path`` (None if statvfs fails)."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def storage_error_from(exc: OSError, action: str, path, **numbers) -> StorageError:
    """Wrap an OSError from ``action`` on ``path``; disk-full errors also report the free bytes."""
    if exc.errno in (_errno.ENOSPC, _errno.EDQUOT, _errno.EFBIG):
        numbers.setdefault("bytes_free", free_bytes(os.path.dirname(os.fspath(path)) or "."))
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    error = StorageError(f"{action} failed: {reason}", path=path, errno=exc.errno, **numbers)
    error.__cause__ = exc
    return error
