"""copyless storage: a segmented commit log written through mmap, with Kafka's sparse indexes, recovery,
flush policies and retention (the file layer: synchronous, threads for blocking work, no asyncio).

Layers, inner to outer:
  index_search (pure index math) -> index (index files) -> scan (header scans), prefault (the pre-fault
  window), prepared_segment (the next segment), segment_recovery (start-up's part of a segment) -> segment
  (one .log + indexes: append, read, seal) -> log_segments (the segment list), log_reads, retention,
  truncation (functions over it), flusher, preparation (objects over it), loader (a directory read into
  the state a log is built from) -> partition_log (offsets, append, roll) -> log_manager (data dir,
  checkpoints, clean-shutdown marker, housekeeping thread). ``background`` holds the worker threads,
  ``blocking`` checks none of their work runs on the event loop's thread, ``config`` holds the tunables.
"""

from .config import LogConfig
from .errors import OffsetOutOfRangeError, StorageError, UnexpectedAppendOffsetError
from .file_slice import FileSlice
from .log_manager import LogManager
from .partition_log import AppendResult, FollowerAppend, PartitionLog, ReadResult

__all__ = [
    "LogConfig",
    "LogManager",
    "PartitionLog",
    "FileSlice",
    "AppendResult",
    "FollowerAppend",
    "ReadResult",
    "StorageError",
    "OffsetOutOfRangeError",
    "UnexpectedAppendOffsetError",
]
