"""Idempotent-producer state: producer ids, epochs and the last five batch sequences per partition.

Kafka's rules (``ProducerStateManager``, ``ProducerAppendInfo.checkSequence``, ``UnifiedLog.
analyzeAndValidateProducerState``), per (producer id, topic, partition):

- a batch whose (epoch, first sequence, last sequence) matches one of the last five appended batches is a
  retry of an acknowledged batch: it is not appended again and gets the original base offset back;
- an epoch lower than the one on record -> INVALID_PRODUCER_EPOCH (47), the producer was fenced;
- a higher epoch must start at sequence 0;
- the same epoch must continue at last sequence + 1 (wrapping at 2**31 - 1 -> 0), else
  OUT_OF_ORDER_SEQUENCE_NUMBER (45);
- a producer with no state at all (new, or its batches were removed by retention) may start anywhere.

Five is ``max.in.flight.requests.per.connection``'s ceiling for idempotent producers: a retried batch is
always one of the last five its producer sent to that partition.

Expiration (Kafka's ``producer.id.expiration.ms``, ``ProducerStateManager.removeExpiredProducers``): each
entry keeps its last timestamp, the max timestamp of its last batch (the LogAppendTime stamp for such a
topic) or the timestamp of its last marker; ``remove_expired`` drops the entries of a partition whose last
timestamp is at least the expiration old and that have no open transaction there. Like Kafka, the timestamp
is the record's, not the broker's clock: a producer whose clock runs far behind expires early, and then
simply starts over with no state, as a producer whose batches retention removed does.

The state is loaded at start-up from the partition's latest producer-state snapshot (``broker.
producer_snapshot``) and the batch headers after it (producer id, epoch, base sequence, offsets: 61 bytes a
batch); ``broker.partition_state_files`` does the loading.

Producer ids: ``ProducerIdAllocator`` reserves blocks of ids in ``<data_dir>/producer-id-block`` (one
integer: the first id not yet reserved), written with tmp + fsync + rename before any id of the block is
handed out, so a restart never hands out an id twice.

Pure except for ``ProducerIdAllocator.reserve_block`` (blocking file write).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from kio.schema.errors import ErrorCode

from copyless.broker._files import write_atomically
from copyless.protocol.records import NO_PRODUCER_ID, BatchHeader

__all__ = ["ProducerStateManager", "SequenceCheck", "ProducerIdAllocator", "BATCHES_PER_PRODUCER",
           "producer_state_scan_start"]

BATCHES_PER_PRODUCER = 5
_MAX_SEQUENCE = (1 << 31) - 1


class BatchMetadata(NamedTuple):
    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    last_timestamp: int = -1  # of its last batch or marker here, ms (what expiration goes by)
    batches: deque = field(default_factory=lambda: deque(maxlen=BATCHES_PER_PRODUCER))

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else -1


class SequenceCheck(NamedTuple):
    """The verdict on one batch: ``error`` (ErrorCode.none to append), or a duplicate's original offsets."""

    error: ErrorCode
    duplicate_of: BatchMetadata | None = None
    message: str | None = None


_OK = SequenceCheck(ErrorCode.none)


def _in_sequence(last_sequence: int, next_sequence: int) -> bool:
    return next_sequence == last_sequence + 1 or (next_sequence == 0 and last_sequence == _MAX_SEQUENCE)


class ProducerStateManager:
    """All partitions' producer state. Loop thread only."""

    def __init__(self) -> None:
        # (topic, partition) -> producer id -> entry
        self._partitions: dict[tuple[str, int], dict[int, ProducerEntry]] = {}

    def check(self, topic: str, partition: int, header: BatchHeader) -> SequenceCheck:
        """Decide what to do with a validated batch before it is appended. Does not change state."""
        if header.producer_id == NO_PRODUCER_ID:
            return _OK
        entry = self._partitions.get((topic, partition), {}).get(header.producer_id)
        if entry is None:
            return _OK
        epoch = header.producer_epoch
        first, last = header.base_sequence, header.last_sequence
        if epoch == entry.epoch:
            for cached in entry.batches:
                if cached.first_sequence == first and cached.last_sequence == last:
                    return SequenceCheck(ErrorCode.none, cached)
        if epoch < entry.epoch:
            return SequenceCheck(
                ErrorCode.invalid_producer_epoch,
                message=f"Producer {header.producer_id}'s epoch {epoch} is older than the current epoch {entry.epoch}",
            )
        if epoch > entry.epoch:
            if first != 0:
                return SequenceCheck(
                    ErrorCode.out_of_order_sequence_number,
                    message=f"Invalid sequence number for new epoch {epoch}: {first} (expected 0)",
                )
            return _OK
        if not _in_sequence(entry.last_sequence, first):
            return SequenceCheck(
                ErrorCode.out_of_order_sequence_number,
                message=(
                    f"Out of order sequence number for producer {header.producer_id} at {topic}-{partition}: "
                    f"{first} (incoming seq. number), {entry.last_sequence} (current end sequence number)"
                ),
            )
        return _OK

    def update(self, topic: str, partition: int, header: BatchHeader, first_offset: int,
               timestamp: int | None = None) -> None:
        """Record an appended batch (``first_offset`` = its assigned base offset; ``timestamp`` = its max
        timestamp as appended, when the append rewrote the header's: LogAppendTime)."""
        if header.producer_id == NO_PRODUCER_ID:
            return
        producers = self._partitions.setdefault((topic, partition), {})
        entry = producers.get(header.producer_id)
        if entry is None or header.producer_epoch != entry.epoch:
            entry = ProducerEntry(header.producer_epoch)
            producers[header.producer_id] = entry
        entry.last_timestamp = header.max_timestamp if timestamp is None else timestamp
        entry.batches.append(
            BatchMetadata(
                header.base_sequence, header.last_sequence, first_offset, first_offset + header.last_offset_delta
            )
        )

    def rebuild(self, topic: str, partition: int, headers: Iterable[BatchHeader]) -> int:
        """Replace a partition's state by replaying its batch headers in log order; returns producers seen."""
        self._partitions.pop((topic, partition), None)
        for header in headers:
            if header.producer_id == NO_PRODUCER_ID:
                continue
            if header.is_control:
                self.update_marker(topic, partition, header.producer_id, header.producer_epoch, header.max_timestamp)
            else:
                self.update(topic, partition, header, header.base_offset)
        return len(self._partitions.get((topic, partition), {}))

    def check_marker(self, topic: str, partition: int, producer_id: int, epoch: int) -> SequenceCheck:
        """A transaction marker (or a transactional offset commit) at ``epoch``: refused with
        INVALID_PRODUCER_EPOCH when the partition has seen a newer epoch of the producer (Kafka's
        ``ProducerAppendInfo.checkProducerEpoch``)."""
        entry = self._partitions.get((topic, partition), {}).get(producer_id)
        if entry is not None and epoch < entry.epoch:
            return SequenceCheck(ErrorCode.invalid_producer_epoch,
                                 message=f"Producer {producer_id}'s epoch {epoch} is older than the current epoch "
                                         f"{entry.epoch}")
        return _OK

    def update_marker(self, topic: str, partition: int, producer_id: int, epoch: int, timestamp: int) -> None:
        """Record a marker's epoch and timestamp: a newer epoch fences the producer's older epochs on this
        partition (a zombie's batches then get INVALID_PRODUCER_EPOCH) and its next batch starts at
        sequence 0."""
        producers = self._partitions.setdefault((topic, partition), {})
        entry = producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            entry = producers[producer_id] = ProducerEntry(epoch)
        entry.last_timestamp = timestamp

    def remove_expired(self, topic: str, partition: int, now_ms: int, expiration_ms: int,
                       ongoing: Container[int] = ()) -> list[int]:
        """Drop the producers of a partition idle for ``expiration_ms`` (last timestamp at or before
        ``now_ms - expiration_ms``) that have no transaction open there (``ongoing``: producer ids); return
        the ids removed. O(producers of the partition); loop thread."""
        producers = self._partitions.get((topic, partition))
        if not producers:
            return []
        expired = [pid for pid, entry in producers.items()
                   if now_ms - entry.last_timestamp >= expiration_ms and pid not in ongoing]
        for pid in expired:
            del producers[pid]
        return expired

    def remove_partition(self, topic: str, partition: int) -> None:
        self._partitions.pop((topic, partition), None)

    def entries_of(self, topic: str, partition: int) -> list[tuple[int, int, int, tuple]]:
        """``(producer id, epoch, last timestamp, batches)`` of each producer of a partition, by id: what a
        snapshot keeps (``broker.producer_snapshot``). O(producers); loop thread."""
        producers = self._partitions.get((topic, partition), {})
        return [(pid, entry.epoch, entry.last_timestamp, tuple(entry.batches))
                for pid, entry in sorted(producers.items())]

    def restore(self, topic: str, partition: int, entries: Iterable[tuple[int, int, int, Iterable]]) -> None:
        """Replace a partition's state by ``entries`` (as ``entries_of`` gives them)."""
        producers: dict[int, ProducerEntry] = {}
        for producer_id, epoch, last_timestamp, batches in entries:
            entry = producers[producer_id] = ProducerEntry(epoch, last_timestamp)
            entry.batches.extend(BatchMetadata(*batch) for batch in batches)
        self._partitions[(topic, partition)] = producers

    def max_producer_id(self) -> int:
        return max((pid for producers in self._partitions.values() for pid in producers), default=-1)

    def producer_count(self, topic: str | None = None, partition: int = 0) -> int:
        """Producers on record: of one partition, or (no ``topic``) of all."""
        if topic is not None:
            return len(self._partitions.get((topic, partition), {}))
        return sum(len(producers) for producers in self._partitions.values())


class ProducerIdAllocator:
    """Hands out producer ids, reserving them on disk in blocks so none is reused after a restart.

    ``next_id()`` is loop-thread and non-blocking while the current block lasts; when it runs out the caller
    must ``reserve_block()`` (blocking: worker thread) first, as ``needs_block`` says.
    """

    FILE = "producer-id-block"

    def __init__(self, data_dir: Path, block_size: int = 1000) -> None:
        self.path = Path(data_dir) / self.FILE
        self.block_size = block_size
        self._next = 0
        self._block_end = 0

    def load(self, floor: int = 0) -> None:
        """Read the reservation (blocking, at startup); ids below ``floor`` (seen in logs) are never reused."""
        try:
            reserved = int(self.path.read_text().strip() or 0)
        except FileNotFoundError:
            reserved = 0
        except ValueError as exc:
            raise ValueError(f"producer id file {self.path} is corrupt") from exc
        self._next = self._block_end = max(reserved, floor)

    @property
    def needs_block(self) -> bool:
        return self._next >= self._block_end

    def reserve_block(self) -> None:
        """Persist the next block's end, then make it usable. Blocking (fsync)."""
        end = self._block_end + self.block_size
        write_atomically(self.path, f"{end}\n".encode())
        self._block_end = end

    def next_id(self) -> int:
        if self.needs_block:
            raise RuntimeError("reserve_block() first")
        producer_id = self._next
        self._next += 1
        return producer_id


def producer_state_scan_start(partition_log) -> int:
    """Where loading replays from when a partition has no usable snapshot and never held a transactional
    batch (a data dir written before snapshots): the second-to-last segment.

    Deduplication only needs the batches a retry can still refer to: the last five per producer, sent
    moments before the restart, so the last two segments' headers bound that one load to O(two segments)
    (a header scan runs at roughly a million batches per second). A producer idle since before those
    segments restarts with no state and may continue at any sequence, as Kafka allows once producer state
    expires. The load writes a snapshot at the log end, which the next one starts from.
    """
    bases = partition_log.segment_base_offsets()
    start = bases[-2] if len(bases) >= 2 else partition_log.log_start_offset
    return max(start, partition_log.log_start_offset)
