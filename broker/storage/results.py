"""The values a partition log hands out: what an append assigned, what a follower append took, what a read
found. Pure value types."""

from __future__ import annotations

from typing import NamedTuple

from copyless.protocol.records import BatchHeader

from .file_slice import FileSlice

__all__ = ["AppendResult", "FollowerAppend", "ReadResult"]


class AppendResult(NamedTuple):
    base_offset: int
    last_offset: int
    log_append_time_ms: int  # -1 for CreateTime
    log_start_offset: int


class FollowerAppend(NamedTuple):
    first_offset: int
    last_offset: int  # first_offset - 1 when nothing was appended
    headers: list[tuple[int, BatchHeader]]  # (base offset, header) of each appended batch


class ReadResult(NamedTuple):
    slice: FileSlice | None
    high_watermark: int
    log_start_offset: int
