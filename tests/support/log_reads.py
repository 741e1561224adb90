"""A PartitionLog read back whole through its own reads (``PartitionLog.read`` from the log start to the log
end, as a consumer fetches), for the storage tests and their scenario processes to compare with what they
appended. The records are decoded by ``tests.support.batches.records_of``, independently of copyless. No
state, no files of its own: it only reads."""

from __future__ import annotations

from tests.support.batches import Record, records_of

__all__ = ["read_records"]


def read_records(partition_log) -> list[Record]:
    """Every record of the whole batches the log serves from its start to its end, in offset order. A read
    returns whole batches, so a log start inside a batch (DeleteRecords) yields that batch's earlier records
    too."""
    out: list[Record] = []
    offset = partition_log.log_start_offset
    while offset < partition_log.log_end_offset:
        with partition_log.read(offset, 1 << 20).slice as region:
            records = records_of(region.read_bytes())
        out.extend(records)
        offset = records[-1].offset + 1
    return out
