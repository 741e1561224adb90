"""Committed offsets and group metadata as records of the internal topic ``__consumer_offsets``.

This module owns the byte format of ``__consumer_offsets`` and the in-memory view rebuilt from it: the latest
committed offset per (group, topic, partition) and the latest persisted metadata per group. It is pure
(bytes in, values out): the asyncio shell (``broker.groups.service``) appends the batches it builds and feeds
it the bytes it reads back on startup.

Record format, Kafka's own (``GroupMetadataManager`` / ``OffsetCommitKey.json`` ...), big-endian, strings
int16-length-prefixed (-1 = null), bytes int32-length-prefixed::

    key   = int16 version
            version 1 (offset commit):   group string, topic string, partition int32
            version 2 (group metadata):  group string
    value = null                          tombstone: the key is deleted
          | int16 3, offset int64, leader_epoch int32, metadata string, commit_timestamp int64
          | int16 3, protocol_type string, generation int32, protocol string?, leader string?,
            current_state_timestamp int64,
            members int32 count x (member_id string, group_instance_id string?, client_id string,
                                   client_host string, rebalance_timeout int32, session_timeout int32,
                                   subscription bytes, assignment bytes)

Records travel in ordinary uncompressed RecordBatch v2 batches (producer id -1), so the topic can be read
with any Kafka tool that knows the format. A later record for the same key wins; a tombstone removes it.

Partitions: ``partition_for(group, n)`` is Kafka's ``abs(groupId.hashCode) % offsets.topic.num.partitions``
(Java's String.hashCode), so a copyless data directory maps groups to partitions the way Kafka does.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from copyless.broker.groups.coordinator import GroupSnapshot, GroupState, MemberSnapshot
from copyless.protocol.records import (
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    RECORD_BATCH_OVERHEAD,
    TRANSACTIONAL_BIT,
    Buffer,
    InvalidBatchError,
    crc32c,
    decode_records,
    encode_varint,
    iter_batches,
)

__all__ = [
    "OFFSETS_TOPIC",
    "CommittedOffset",
    "OffsetStore",
    "partition_for",
    "offset_commit_key",
    "offset_commit_value",
    "group_metadata_key",
    "group_metadata_value",
    "decode_key",
    "decode_offset_value",
    "decode_group_value",
    "build_batch",
    "CorruptOffsetsRecordError",
]

OFFSETS_TOPIC = "__consumer_offsets"
OFFSET_KEY_VERSION = 1
GROUP_KEY_VERSION = 2
OFFSET_VALUE_VERSION = 3
GROUP_VALUE_VERSION = 3
# Kafka's offset.metadata.max.bytes: longer commit metadata gets OFFSET_METADATA_TOO_LARGE.
MAX_METADATA_BYTES = 4096
# Commits of many partitions are split into batches of about this size, well under the default
# max.message.bytes (1 MiB), so a 10,000-partition commit (~1 MB of records) still appends.
BATCH_TARGET_BYTES = 256 * 1024

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_OFFSET_VALUE_FIXED = struct.Struct(">hqi")  # version, offset, leader epoch


class CorruptOffsetsRecordError(ValueError):
    """A record of __consumer_offsets does not follow the format above."""


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int  # -1 when the client sent none
    metadata: str
    commit_timestamp_ms: int


def partition_for(group_id: str, partitions: int) -> int:
    """Kafka's partition of ``__consumer_offsets`` for a group: Java ``String.hashCode`` masked positive."""
    h = 0
    data = group_id.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return (h & 0x7FFFFFFF) % partitions


# --- primitive encoders / decoders ---------------------------------------------------------------------


def _string(value: str | None) -> bytes:
    if value is None:
        return _I16.pack(-1)
    raw = value.encode("utf-8")
    return _I16.pack(len(raw)) + raw


def _bytes(value: bytes | None) -> bytes:
    if value is None:
        return _I32.pack(-1)
    return _I32.pack(len(value)) + value


class _Reader:
    __slots__ = ("data", "position")

    def __init__(self, data: bytes):
        self.data = data
        self.position = 0

    def _take(self, size: int) -> bytes:
        end = self.position + size
        if size < 0 or end > len(self.data):
            raise CorruptOffsetsRecordError(f"record ends early: need {size} bytes at {self.position}")
        chunk = self.data[self.position:end]
        self.position = end
        return chunk

    def i16(self) -> int:
        value: int = _I16.unpack(self._take(2))[0]
        return value

    def i32(self) -> int:
        value: int = _I32.unpack(self._take(4))[0]
        return value

    def i64(self) -> int:
        value: int = _I64.unpack(self._take(8))[0]
        return value

    def string(self) -> str | None:
        length = self.i16()
        if length < 0:
            return None
        try:
            return self._take(length).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptOffsetsRecordError(f"bad utf-8 string: {exc}") from exc

    def bytes_(self) -> bytes | None:
        length = self.i32()
        return None if length < 0 else self._take(length)


# --- keys and values -------------------------------------------------------------------------------------


def offset_commit_key(group_id: str, topic: str, partition: int) -> bytes:
    return _I16.pack(OFFSET_KEY_VERSION) + _string(group_id) + _string(topic) + _I32.pack(partition)


def offset_commit_value(committed: CommittedOffset) -> bytes:
    return (_OFFSET_VALUE_FIXED.pack(OFFSET_VALUE_VERSION, committed.offset, committed.leader_epoch)
            + _string(committed.metadata) + _I64.pack(committed.commit_timestamp_ms))


def group_metadata_key(group_id: str) -> bytes:
    return _I16.pack(GROUP_KEY_VERSION) + _string(group_id)


def group_metadata_value(snapshot: GroupSnapshot) -> bytes:
    parts = [
        _I16.pack(GROUP_VALUE_VERSION),
        _string(snapshot.protocol_type or ""),
        _I32.pack(snapshot.generation_id),
        _string(snapshot.protocol_name),
        _string(snapshot.leader_id),
        _I64.pack(snapshot.state_timestamp_ms),
        _I32.pack(len(snapshot.members)),
    ]
    for m in snapshot.members:
        parts += [
            _string(m.member_id), _string(m.group_instance_id), _string(m.client_id), _string(m.client_host),
            _I32.pack(m.rebalance_timeout_ms), _I32.pack(m.session_timeout_ms),
            _bytes(m.metadata), _bytes(m.assignment),
        ]
    return b"".join(parts)


def decode_key(key: bytes) -> tuple[str, str, int] | tuple[str]:
    """``(group, topic, partition)`` for an offset key, ``(group,)`` for a group metadata key.

    Raises:
        CorruptOffsetsRecordError: an unknown key version or a malformed key.
    """
    reader = _Reader(key)
    version = reader.i16()
    if version in (0, 1):
        group, topic, partition = reader.string(), reader.string(), reader.i32()
        if group is None or topic is None:
            raise CorruptOffsetsRecordError("null group or topic in an offset key")
        return group, topic, partition
    if version == 2:
        group = reader.string()
        if group is None:
            raise CorruptOffsetsRecordError("null group in a group metadata key")
        return (group,)
    raise CorruptOffsetsRecordError(f"unknown key version {version}")


def decode_offset_value(value: bytes) -> CommittedOffset:
    """Offset commit value versions 0-3 (Kafka's readers accept every version they ever wrote)."""
    reader = _Reader(value)
    version = reader.i16()
    if version not in (0, 1, 2, 3):
        raise CorruptOffsetsRecordError(f"unknown offset value version {version}")
    offset = reader.i64()
    leader_epoch = reader.i32() if version >= 3 else -1
    metadata = reader.string() or ""
    commit_timestamp_ms = reader.i64() if version >= 1 else 0
    return CommittedOffset(offset, leader_epoch, metadata, commit_timestamp_ms)


def decode_group_value(group_id: str, value: bytes) -> GroupSnapshot:
    """Group metadata value version 3 (versions 0-2 lack fields copyless never wrote)."""
    reader = _Reader(value)
    version = reader.i16()
    if version != GROUP_VALUE_VERSION:
        raise CorruptOffsetsRecordError(f"unsupported group metadata value version {version}")
    protocol_type = reader.string() or None
    generation_id = reader.i32()
    protocol_name = reader.string()
    leader_id = reader.string()
    state_timestamp_ms = reader.i64()
    count = reader.i32()
    if count < 0 or count > len(value):
        raise CorruptOffsetsRecordError(f"bad member count {count}")
    members = []
    for _ in range(count):
        member_id, instance_id, client_id, client_host = (reader.string(), reader.string(), reader.string(),
                                                           reader.string())
        rebalance_timeout_ms, session_timeout_ms = reader.i32(), reader.i32()
        metadata, assignment = reader.bytes_() or b"", reader.bytes_() or b""
        members.append(MemberSnapshot(member_id or "", instance_id, client_id or "", client_host or "",
                                      session_timeout_ms, rebalance_timeout_ms, metadata, assignment))
    state = GroupState.STABLE if members else GroupState.EMPTY
    return GroupSnapshot(group_id, state, generation_id, protocol_type, protocol_name, leader_id,
                         state_timestamp_ms, tuple(members))


# --- record batches --------------------------------------------------------------------------------------


_NULL_LENGTH = encode_varint(-1)


def _record(offset_delta: int, key: bytes, value: bytes | None) -> bytes:
    body = b"".join((
        b"\x00",  # attributes
        b"\x00",  # timestamp delta 0 (every record of a batch shares the batch's timestamp)
        encode_varint(offset_delta),
        encode_varint(len(key)), key,
        _NULL_LENGTH if value is None else encode_varint(len(value)) + value,
        b"\x00",  # no headers
    ))
    return encode_varint(len(body)) + body


_HEADER_AFTER_CRC = struct.Struct(">hiqqqhii")  # attributes .. recordsCount


def build_batch(records: list[tuple[bytes, bytes | None]], timestamp_ms: int, *, producer_id: int = NO_PRODUCER_ID,
                producer_epoch: int = -1) -> bytes:
    """One uncompressed RecordBatch v2 (base offset 0: storage assigns offsets) of ``(key, value)`` records;
    with a ``producer_id``, a transactional batch of that producer (a TxnOffsetCommit: no sequence)."""
    assert records, "a batch holds at least one record"
    body = b"".join(_record(i, key, value) for i, (key, value) in enumerate(records))
    attributes = 0 if producer_id == NO_PRODUCER_ID else TRANSACTIONAL_BIT
    after_crc = _HEADER_AFTER_CRC.pack(attributes, len(records) - 1, timestamp_ms, timestamp_ms, producer_id,
                                       producer_epoch, NO_SEQUENCE, len(records)) + body
    batch_length = RECORD_BATCH_OVERHEAD - 12 + len(body)
    return struct.pack(">qiibI", 0, batch_length, 0, 2, crc32c(after_crc)) + after_crc


def build_batches(records: Iterable[tuple[bytes, bytes | None]], timestamp_ms: int) -> bytes:
    """``records`` as consecutive batches of at most ~BATCH_TARGET_BYTES each (one append call)."""
    out: list[bytes] = []
    current: list[tuple[bytes, bytes | None]] = []
    size = 0
    for key, value in records:
        current.append((key, value))
        size += len(key) + (len(value) if value else 0) + 16
        if size >= BATCH_TARGET_BYTES:
            out.append(build_batch(current, timestamp_ms))
            current, size = [], 0
    if current:
        out.append(build_batch(current, timestamp_ms))
    return b"".join(out)


# --- the rebuilt view --------------------------------------------------------------------------------------


class OffsetStore:
    """The latest committed offsets and group metadata, as the log says. Pure; loop thread only once loaded.

    ``replay`` folds log bytes in (startup); ``commit_records`` / ``tombstone_records`` make the records to
    append and ``apply`` folds them in once the append succeeded, so the view never shows an offset the log
    does not hold.
    """

    def __init__(self) -> None:
        self.offsets: dict[str, dict[tuple[str, int], CommittedOffset]] = {}
        self.groups: dict[str, GroupSnapshot] = {}
        self.records_replayed = 0
        self.corrupt_records = 0
        # Offsets committed inside a transaction (TxnOffsetCommit), by producer id: shown on its COMMIT
        # marker, dropped on ABORT.
        self.pending: dict[int, list[tuple[bytes, bytes | None]]] = {}
        # How many pending records name each offset key: OffsetFetch with require_stable (KIP-447) answers
        # UNSTABLE_OFFSET_COMMIT for a partition while one is held.
        self._pending_keys: dict[bytes, int] = {}

    # reading ------------------------------------------------------------------------------------------

    def committed(self, group_id: str) -> dict[tuple[str, int], CommittedOffset]:
        return self.offsets.get(group_id, {})

    def group_ids(self) -> set[str]:
        return set(self.offsets) | set(self.groups)

    # writing -------------------------------------------------------------------------------------------

    @staticmethod
    def commit_records(group_id: str,
                       commits: dict[tuple[str, int], CommittedOffset]) -> list[tuple[bytes, bytes | None]]:
        return [(offset_commit_key(group_id, topic, partition), offset_commit_value(committed))
                for (topic, partition), committed in commits.items()]

    @staticmethod
    def group_record(snapshot: GroupSnapshot) -> tuple[bytes, bytes | None]:
        if snapshot.state is GroupState.DEAD:
            return group_metadata_key(snapshot.group_id), None
        return group_metadata_key(snapshot.group_id), group_metadata_value(snapshot)

    def apply(self, records: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Fold appended (or replayed) records into the view; later records win."""
        for key, value in records:
            try:
                decoded = decode_key(key)
                if len(decoded) == 3:
                    group_id, topic, partition = decoded
                    if value is None:
                        group_offsets = self.offsets.get(group_id)
                        if group_offsets is not None:
                            group_offsets.pop((topic, partition), None)
                            if not group_offsets:
                                del self.offsets[group_id]
                    else:
                        self.offsets.setdefault(group_id, {})[(topic, partition)] = decode_offset_value(value)
                else:
                    (group_id,) = decoded
                    if value is None:
                        self.groups.pop(group_id, None)
                    else:
                        self.groups[group_id] = decode_group_value(group_id, value)
            except CorruptOffsetsRecordError:
                # A record this version cannot read (a newer format, or damage the batch CRC did not
                # catch) is skipped and counted rather than stopping the coordinator from loading.
                self.corrupt_records += 1

    def add_pending(self, producer_id: int, records: list[tuple[bytes, bytes | None]]) -> None:
        self.pending.setdefault(producer_id, []).extend(records)
        for key, _value in records:
            self._pending_keys[key] = self._pending_keys.get(key, 0) + 1

    def has_pending(self, group_id: str, topic: str, partition: int) -> bool:
        """Does an open transaction hold an offset of this group for this partition?"""
        return offset_commit_key(group_id, topic, partition) in self._pending_keys

    def complete_txn(self, producer_id: int, commit: bool) -> int:
        """A transaction marker for ``producer_id``: its pending offsets are applied (COMMIT) or dropped."""
        records = self.pending.pop(producer_id, [])
        for key, _value in records:
            left = self._pending_keys.get(key, 0) - 1
            if left > 0:
                self._pending_keys[key] = left
            else:
                self._pending_keys.pop(key, None)
        if commit:
            self.apply(records)
        return len(records)

    def pending_groups(self) -> set[str]:
        groups = set()
        for records in self.pending.values():
            for key, _value in records:
                try:
                    groups.add(decode_key(key)[0])
                except CorruptOffsetsRecordError:
                    pass
        return groups

    def replay(self, data: Buffer, position: int = 0, end: int | None = None) -> int:
        """Fold every complete batch in ``data[position:end]`` in; returns the offset after the last one.

        Transactional batches (TxnOffsetCommit) are held by producer id until their marker: COMMIT applies
        them, ABORT drops them. Returns -1 when no complete batch was found.
        """
        from copyless.broker.txn_partition import COMMIT, control_type_of

        next_offset = -1
        for batch_position, header in iter_batches(data, position, end):
            next_offset = header.next_offset
            if header.is_control:
                if header.producer_id != NO_PRODUCER_ID:
                    self.complete_txn(header.producer_id, control_type_of(data, batch_position) == COMMIT)
                continue
            try:
                records = decode_records(data, batch_position)
            except InvalidBatchError:
                self.corrupt_records += 1
                continue
            self.records_replayed += len(records)
            pairs = [(record.key or b"", record.value) for record in records]
            if header.is_transactional and header.producer_id != NO_PRODUCER_ID:
                self.add_pending(header.producer_id, pairs)
            else:
                self.apply(pairs)
        return next_offset

    # expiry ----------------------------------------------------------------------------------------------

    def expired(self, group_id: str, snapshot: GroupSnapshot, now_ms: int,
                retention_ms: int) -> list[tuple[str, int]]:
        """The offsets of ``group_id`` that ``offsets.retention.minutes`` has expired (KIP-211).

        A group that used group management keeps its offsets while it has members and loses them all once
        it has been Empty for the retention period; a group that only ever committed (no protocol type)
        loses each offset ``retention_ms`` after its commit.
        """
        committed = self.offsets.get(group_id, {})
        if snapshot.state not in (GroupState.EMPTY, GroupState.DEAD):
            return []
        if snapshot.protocol_type:
            if now_ms - snapshot.state_timestamp_ms >= retention_ms:
                return list(committed)
            return []
        return [tp for tp, c in committed.items() if now_ms - c.commit_timestamp_ms >= retention_ms]


def iter_offset_records(store: OffsetStore) -> Iterator[tuple[str, str, int, CommittedOffset]]:
    """Every (group, topic, partition, committed) in the view, sorted (for tools and tests)."""
    for group_id in sorted(store.offsets):
        for (topic, partition), committed in sorted(store.offsets[group_id].items()):
            yield group_id, topic, partition, committed
