"""Consumer-group partition assignors and Kafka's ConsumerProtocol encoding (pure).

Owns: the "range" and "roundrobin" assignment strategies, as the Java client's ``RangeAssignor`` and
``RoundRobinAssignor`` compute them, and the bytes members exchange through JoinGroup/SyncGroup (opaque to
the broker), so a copyless consumer can share a group with Java, librdkafka, kafka-python or aiokafka
members using the same protocol name.

ConsumerProtocolSubscription v0 (JoinGroup ``metadata``)::

    version int16 = 0 | topics array(int32) of string(int16 length) | user_data bytes(int32 length, -1 null)

ConsumerProtocolAssignment v0 (SyncGroup ``assignment``)::

    version int16 = 0 | assigned_partitions array of (topic string, partitions array of int32)
    | user_data bytes

Readers accept newer versions by reading the v0 prefix and ignoring the rest (Kafka's rule: fields are only
ever appended).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

__all__ = [
    "TopicPartition",
    "Subscription",
    "encode_subscription",
    "decode_subscription",
    "encode_assignment",
    "decode_assignment",
    "range_assign",
    "round_robin_assign",
    "ASSIGNORS",
]


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class Subscription(NamedTuple):
    topics: tuple[str, ...]
    user_data: bytes | None = None


def _string(value: str) -> bytes:
    data = value.encode("utf-8")
    return struct.pack(">h", len(data)) + data


def _bytes(value: bytes | None) -> bytes:
    if value is None:
        return b"\xff\xff\xff\xff"
    return struct.pack(">i", len(value)) + value


class _Reader:
    __slots__ = ("data", "offset")

    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)
        self.offset = 0

    def _take(self, fmt: str):
        value = struct.unpack_from(fmt, self.data, self.offset)[0]
        self.offset += struct.calcsize(fmt)
        return value

    def int16(self) -> int:
        return self._take(">h")

    def int32(self) -> int:
        return self._take(">i")

    def string(self) -> str:
        length = self.int16()
        if length < 0:
            raise ValueError("null string in consumer protocol data")
        value = self.data[self.offset : self.offset + length]
        if len(value) != length:
            raise ValueError("truncated consumer protocol data")
        self.offset += length
        return value.decode("utf-8")

    def bytes_(self) -> bytes | None:
        length = self.int32()
        if length < 0:
            return None
        value = self.data[self.offset : self.offset + length]
        self.offset += length
        return value


def encode_subscription(topics, user_data: bytes | None = None) -> bytes:
    topics = sorted(set(topics))
    out = bytearray(struct.pack(">hi", 0, len(topics)))
    for topic in topics:
        out += _string(topic)
    out += _bytes(user_data)
    return bytes(out)


def decode_subscription(data: bytes) -> Subscription:
    """Raises ValueError (or struct.error) on malformed data."""
    reader = _Reader(data)
    reader.int16()  # version: every version starts with the v0 fields
    topics = tuple(reader.string() for _ in range(reader.int32()))
    user_data = reader.bytes_() if reader.offset < len(reader.data) else None
    return Subscription(topics, user_data)


def encode_assignment(partitions, user_data: bytes | None = None) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    out = bytearray(struct.pack(">hi", 0, len(by_topic)))
    for topic in sorted(by_topic):
        out += _string(topic)
        indexes = sorted(by_topic[topic])
        out += struct.pack(f">i{len(indexes)}i", len(indexes), *indexes)
    out += _bytes(user_data)
    return bytes(out)


def decode_assignment(data: bytes) -> list[TopicPartition]:
    if not data:
        return []  # an empty assignment (Kafka sends 0 bytes to a member with nothing)
    reader = _Reader(data)
    reader.int16()
    out = []
    for _ in range(reader.int32()):
        topic = reader.string()
        for _p in range(reader.int32()):
            out.append(TopicPartition(topic, reader.int32()))
    return out


def range_assign(subscriptions: dict[str, Subscription], partition_counts: dict[str, int]) -> dict[str, list]:
    """Kafka ``RangeAssignor``: per topic, members sorted by id take contiguous ranges; the first
    ``partitions % members`` members get one extra."""
    assignment: dict[str, list] = {member: [] for member in subscriptions}
    topics = sorted({t for s in subscriptions.values() for t in s.topics})
    for topic in topics:
        count = partition_counts.get(topic)
        if not count:
            continue
        members = sorted(m for m, s in subscriptions.items() if topic in s.topics)
        per_member, extra = divmod(count, len(members))
        start = 0
        for rank, member in enumerate(members):
            length = per_member + (1 if rank < extra else 0)
            assignment[member].extend(TopicPartition(topic, p) for p in range(start, start + length))
            start += length
    return assignment


def round_robin_assign(subscriptions: dict[str, Subscription], partition_counts: dict[str, int]) -> dict[str, list]:
    """Kafka ``RoundRobinAssignor``: all partitions sorted by (topic, partition) dealt to members sorted by
    id, skipping members not subscribed to the partition's topic."""
    assignment: dict[str, list] = {member: [] for member in subscriptions}
    members = sorted(subscriptions)
    if not members:
        return assignment
    topics = sorted({t for s in subscriptions.values() for t in s.topics})
    cursor = 0
    for topic in topics:
        for partition in range(partition_counts.get(topic) or 0):
            for _ in range(len(members)):
                member = members[cursor % len(members)]
                cursor += 1
                if topic in subscriptions[member].topics:
                    assignment[member].append(TopicPartition(topic, partition))
                    break
    return assignment


ASSIGNORS = {"range": range_assign, "roundrobin": round_robin_assign}
