"""File and directory names of the log, as Kafka's ``LogFileUtils``.

    <data_dir>/<topic>-<partition>/                       one directory per partition
        00000000000000000000.log                          RecordBatch v2 bytes, exactly as on the wire
        00000000000000000000.index                        sparse offset index (8-byte entries)
        00000000000000000000.timeindex                    sparse time index (12-byte entries)
        *.deleted                                         retired by retention, removed once unpinned
        prepared-<n>.log / .index / .timeindex            the next segment, preallocated and warmed ahead
                                                          of a roll; renamed to its base offset by the io
                                                          thread just after the roll (start-up adopts one
                                                          that already holds batches, removes the others)
        leader-epoch-checkpoint                           (epoch, start offset) entries: leader_epoch_cache.py
        cleaner-offset-checkpoint                         where the log cleaner's next pass starts (cleaner.py)
        <base>.log.cleaned / .index.cleaned / ...         a cleaned segment being written (cleaner.py)
        cleaner.swap                                      a committed swap of cleaned segments (cleaner.py)
    <data_dir>/<topic>-<partition>.<token>-delete/        a deleted partition, removed in the background
    <data_dir>/recovery-point-offset-checkpoint           per partition: recovery starts here (checkpoint.py)
    <data_dir>/high-watermark-checkpoint                  per partition: the last high watermark written
    <data_dir>/log-start-offset-checkpoint                per partition: the log start offset (DeleteRecords)
    <data_dir>/.copyless_cleanshutdown                    present only after a clean shutdown
"""

from __future__ import annotations

import re
from pathlib import Path

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
DELETED_SUFFIX = ".deleted"
DELETE_DIR_SUFFIX = "-delete"
PREPARED_PREFIX = "prepared"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
HIGH_WATERMARK_CHECKPOINT = "high-watermark-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
CLEAN_SHUTDOWN_MARKER = ".copyless_cleanshutdown"
LOCK_FILE = ".lock"
CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"  # per partition: the first offset the cleaner has not seen
CLEANED_SUFFIX = ".cleaned"  # a segment being written by the cleaner (removed at start-up unless committed)
SWAP_MANIFEST = "cleaner.swap"  # per partition: the groups of a cleaning whose swap is committed (cleaner.py)

_SEGMENT_FILE = re.compile(r"^(\d{20})\.(log|index|timeindex)$")
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")


def prefix_from_offset(offset: int) -> str:
    """Base offset zero-padded to 20 digits (Kafka ``filenamePrefixFromOffset``): names sort as offsets."""
    return f"{offset:020d}"


def log_path(directory: Path, base_offset: int) -> Path:
    return directory / (prefix_from_offset(base_offset) + LOG_SUFFIX)


def index_path(directory: Path, base_offset: int) -> Path:
    return directory / (prefix_from_offset(base_offset) + INDEX_SUFFIX)


def time_index_path(directory: Path, base_offset: int) -> Path:
    return directory / (prefix_from_offset(base_offset) + TIME_INDEX_SUFFIX)


def segment_paths(directory: Path, base_offset: int) -> tuple[Path, Path, Path]:
    return log_path(directory, base_offset), index_path(directory, base_offset), time_index_path(directory, base_offset)


def parse_segment_file(name: str) -> tuple[int, str] | None:
    """``(base_offset, kind)`` for a segment file name, kind in {"log", "index", "timeindex"}; else None."""
    match = _SEGMENT_FILE.match(name)
    if match is None:
        return None
    return int(match.group(1)), match.group(2)


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_partition_dir(name: str) -> tuple[str, int] | None:
    """``(topic, partition)`` for a live partition directory name, None for anything else."""
    if name.endswith(DELETE_DIR_SUFFIX) or name.startswith("."):
        return None
    match = _PARTITION_DIR.match(name)
    if match is None:
        return None
    return match.group(1), int(match.group(2))
