"""copyless storage: a segmented commit log written through mmap, with Kafka's sparse indexes, recovery,
flush policies and retention (the file layer: synchronous, threads for blocking work, no asyncio).

Layers, inner to outer:
  index_search (pure index math) -> index (index files) -> segment (one .log + indexes, header scans,
  recovery) -> partition_log (offsets, roll, read, flush, retention) -> log_manager (data dir, checkpoints,
  clean-shutdown marker, housekeeping thread). ``background`` holds the worker threads.
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
