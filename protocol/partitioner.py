"""Kafka's default key partitioner: murmur2 over the key bytes, as the Java client computes it.

The same key lands on the same partition as with the Java producer (and librdkafka's
``murmur2_random``), so copyless producers can share keyed topics with other clients. Pure; no I/O.

Algorithm (``org.apache.kafka.common.utils.Utils.murmur2``): seed 0x9747b28c, m = 0x5bd1e995, r = 24;
per little-endian 4-byte chunk ``k *= m; k ^= k >>> r; k *= m; h *= m; h ^= k``; the 1-3 trailing bytes are
xored in and ``h *= m``; then ``h ^= h >>> 13; h *= m; h ^= h >>> 15``, all in 32-bit arithmetic.
Partition = ``toPositive(hash) % partition_count`` where ``toPositive(x) = x & 0x7fffffff``.
"""

from __future__ import annotations

import struct

__all__ = ["murmur2", "partition_for_key"]

_MASK = 0xFFFFFFFF
_M = 0x5BD1E995
_SEED = 0x9747B28C


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of ``data`` as a signed 32-bit int (the value Java's ``Utils.murmur2`` returns)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length & ~3
    # One unpack for all whole words: ~4x faster than int.from_bytes per word for 100-byte keys.
    for k in struct.unpack_from(f"<{whole // 4}I", data):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    if tail:
        if tail == 3:
            h ^= data[whole + 2] << 16
        if tail >= 2:
            h ^= data[whole + 1] << 8
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partition_count: int) -> int:
    """The partition Kafka's default partitioner picks for a non-null ``key``."""
    if partition_count <= 0:
        raise ValueError(f"partition_count must be positive, got {partition_count}")
    return (murmur2(key) & 0x7FFFFFFF) % partition_count
