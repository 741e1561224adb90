"""Transaction metadata as records of the internal topic ``__transaction_state``.

Owns the byte format and the view rebuilt from it. Kafka's own format (``TransactionLogKey`` /
``TransactionLogValue`` version 0), big-endian, strings int16-length-prefixed::

    key   = int16 0, transactional_id string
    value = int16 0, producer_id int64, producer_epoch int16, transaction_timeout_ms int32,
            state int8 (``metadata.TxnState``), topics int32 count x (topic string, partitions int32 count x
            int32), last_update_timestamp_ms int64, start_timestamp_ms int64
          | null: the id is removed

Records travel in uncompressed RecordBatch v2 batches (``groups.offsets.build_batch``). A later record for a
key wins. Partitions: ``partition_for`` is Kafka's ``abs(transactionalId.hashCode) % partitions``.

Pure.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from copyless.broker.groups.offsets import partition_for as _java_hash_partition
from copyless.broker.txn.metadata import TxnMetadata, TxnState
from copyless.protocol.records import Buffer, InvalidBatchError, decode_records, iter_batches

__all__ = ["TXN_TOPIC", "partition_for", "encode_key", "encode_value", "decode", "TxnLogView"]

TXN_TOPIC = "__transaction_state"
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_VALUE_HEAD = struct.Struct(">hqhib")  # version, producer id, epoch, timeout, state
_TIMES = struct.Struct(">qq")


def partition_for(transactional_id: str, partitions: int) -> int:
    return _java_hash_partition(transactional_id, partitions)


def _string(text: str) -> bytes:
    raw = text.encode()
    return _I16.pack(len(raw)) + raw


def encode_key(transactional_id: str) -> bytes:
    return _I16.pack(0) + _string(transactional_id)


def encode_value(metadata: TxnMetadata) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(metadata.partitions):
        by_topic.setdefault(topic, []).append(partition)
    parts = [_VALUE_HEAD.pack(0, metadata.producer_id, metadata.producer_epoch, metadata.timeout_ms,
                              int(metadata.state)), _I32.pack(len(by_topic))]
    for topic, partitions in by_topic.items():
        parts.append(_string(topic))
        parts.append(_I32.pack(len(partitions)))
        parts.extend(_I32.pack(p) for p in partitions)
    parts.append(_TIMES.pack(metadata.update_ms, metadata.start_ms))
    return b"".join(parts)


def decode(key: bytes, value: bytes | None) -> tuple[str, TxnMetadata | None]:
    """(transactional id, metadata or None for a tombstone). Raises ValueError on bytes it cannot read."""
    try:
        (version,) = _I16.unpack_from(key, 0)
        if version != 0:
            raise ValueError(f"transaction log key version {version}")
        (length,) = _I16.unpack_from(key, 2)
        transactional_id = bytes(key[4:4 + length]).decode()
        if value is None:
            return transactional_id, None
        version, producer_id, epoch, timeout_ms, state = _VALUE_HEAD.unpack_from(value, 0)
        position = _VALUE_HEAD.size
        (topics,) = _I32.unpack_from(value, position)
        position += 4
        partitions = set()
        for _ in range(topics):
            (length,) = _I16.unpack_from(value, position)
            topic = bytes(value[position + 2:position + 2 + length]).decode()
            position += 2 + length
            (count,) = _I32.unpack_from(value, position)
            position += 4
            for _ in range(count):
                partitions.add((topic, _I32.unpack_from(value, position)[0]))
                position += 4
        update_ms, start_ms = _TIMES.unpack_from(value, position)
        return transactional_id, TxnMetadata(transactional_id, producer_id, epoch, timeout_ms, TxnState(state),
                                             frozenset(partitions), start_ms, update_ms)
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"unreadable transaction log record: {exc}") from None


class TxnLogView:
    """The latest metadata per transactional id, as one partition of the log says."""

    def __init__(self) -> None:
        self.transactions: dict[str, TxnMetadata] = {}
        self.records_replayed = 0
        self.corrupt_records = 0

    def apply(self, records: Iterable[tuple[bytes, bytes | None]]) -> None:
        for key, value in records:
            try:
                transactional_id, metadata = decode(key, value)
            except ValueError:
                self.corrupt_records += 1
                continue
            if metadata is None:
                self.transactions.pop(transactional_id, None)
            else:
                self.transactions[transactional_id] = metadata

    def replay(self, data: Buffer) -> int:
        """Fold every complete batch of ``data`` in; the offset after the last one (-1: none)."""
        next_offset = -1
        for position, header in iter_batches(data, 0, None):
            next_offset = header.next_offset
            if header.is_control:
                continue
            try:
                records = decode_records(data, position)
            except InvalidBatchError:
                self.corrupt_records += 1
                continue
            self.records_replayed += len(records)
            self.apply((record.key or b"", record.value) for record in records)
        return next_offset
