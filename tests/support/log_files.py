"""A partition's log read straight from a broker's segment files, for comparing replicas byte for byte.

A follower keeps the leader's batches exactly as they travelled (offsets, leader epochs, timestamps, CRCs),
so two replicas in step hold the same bytes up to the shorter log end. This reads
``<data_dir>/<topic>-<partition>/<20-digit base offset>.log`` files in offset order and returns the whole
batches in them: the active segment is preallocated to its full size, so its tail past the last batch reads
as zeros (a batch length of 0 ends the scan), and a torn batch (shorter than its length says, or failing its
CRC-32C) ends it too, as the broker's own recovery would. Only the batch framing is parsed here (base
offset, length, CRC); ``tests.support.batches.records_of`` decodes the records.

Reading a running broker's files is safe: its appends go through a shared mapping of the same page cache,
and a test compares only once the writers are quiet.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

import crc32c

__all__ = ["LogBatch", "read_partition_log"]

_SEGMENT = re.compile(r"^(\d{20})\.log$")
_HEAD = struct.Struct(">qiib")  # base offset, batch length, partition leader epoch, magic
_CRC_AT = 17  # base offset (8) + batch length (4) + leader epoch (4) + magic (1)
_ATTRIBUTES_AT = 21
_LAST_OFFSET_DELTA_AT = 23
_HEADER_BYTES = 61


@dataclass(frozen=True)
class LogBatch:
    base_offset: int
    last_offset: int
    leader_epoch: int
    data: bytes  # the whole batch, header included


def read_partition_log(data_dir: Path, topic: str, partition: int) -> list[LogBatch]:
    """Every whole batch of ``topic``-``partition`` in ``data_dir``, in offset order (empty when the broker
    has no such log). Blocking: reads the files."""
    directory = Path(data_dir) / f"{topic}-{partition}"
    if not directory.is_dir():
        return []
    segments = sorted((int(m.group(1)), path) for path in directory.iterdir() if (m := _SEGMENT.match(path.name)))
    batches: list[LogBatch] = []
    for _base, path in segments:
        data = path.read_bytes()
        position = 0
        while position + _HEADER_BYTES <= len(data):
            base_offset, batch_length, leader_epoch, _magic = _HEAD.unpack_from(data, position)
            size = batch_length + 12
            if batch_length == 0 or size < _HEADER_BYTES or position + size > len(data):
                break
            (crc,) = struct.unpack_from(">I", data, position + _CRC_AT)
            if crc != crc32c.crc32c(data[position + _ATTRIBUTES_AT:position + size]):
                break
            (last_delta,) = struct.unpack_from(">i", data, position + _LAST_OFFSET_DELTA_AT)
            batches.append(LogBatch(base_offset, base_offset + last_delta, leader_epoch,
                                    bytes(data[position:position + size])))
            position += size
    return batches
