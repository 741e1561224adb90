"""The partition side of transactions (KIP-98): open transactions, the last stable offset, the aborted
transactions a read_committed fetch must be told about, and the control-batch format of a marker.

Owns, per (topic, partition):

- ``ongoing``: producer id -> the offset of that producer's first transactional batch not yet closed by a
  marker. The first unstable offset is the smallest of them;
- ``completing``: transactions whose marker is appended but not yet below the high watermark (a follower
  may still lack it: until it is replicated the transaction still bounds the LSO, as Kafka's
  ``ProducerStateManager.unreplicatedTxns``);
- the aborted transactions, ``AbortedTxn(producer_id, first_offset, last_offset, last_stable_offset)`` in
  marker order, Kafka's ``.txnindex`` entry (``last_offset`` is the ABORT marker's offset). As in Kafka, the
  heap holds only the active segment's (``unsealed``); a sealed segment's are read from its ``.txnindex``,
  mapped read-only (``sealed``: ``broker.storage.txn_index.SealedIndex``), when a read_committed fetch asks
  (``aborted_between``, Kafka's ``collectAbortedTransactions``). At a roll the partition hands the rolled
  segment's entries to the thread that appends them (``broker.partition_state_files.StateFiles.seal``); once
  they are in the file, it maps the file and, if the file holds exactly them, passes the map back through
  ``adopt`` (the one thing another thread hands this object: a deque, taken on the loop thread at the next
  read), and only then are they dropped from the heap. A file that does not match (an append that failed)
  leaves them on the heap. Memory is thus O(active segment's aborted transactions + sealed files);
- ``coordinator_epochs``: producer id -> the coordinator epoch of its last marker here. A marker written
  as leader with an older coordinator epoch comes from a deposed coordinator and is refused with
  TRANSACTION_COORDINATOR_FENCED (Kafka's ``ProducerAppendInfo.checkCoordinatorEpoch``); replicated markers
  are taken as they come. Rebuilt by the same log scan (each marker's value holds its coordinator epoch).

The last stable offset (LSO) is ``min(first unstable offset, high watermark)``: read_committed consumers read
below it, ListOffsets(latest, read_committed) answers it.

Marker format (Kafka's ``EndTransactionMarker``, ``ControlRecordType``): one uncompressed RecordBatch v2 with
attributes transactional|control (0x30), the producer's id and epoch, base sequence -1 and one record, key
``int16 version 0, int16 type (0 ABORT, 1 COMMIT)``, value ``int16 version 0, int32 coordinator epoch``.

Where the state comes from (the crash story): the latest producer-state snapshot of the partition, the
aborted transactions in its segments' ``.txnindex`` files below it, and the log after it
(``broker.partition_state_files``; formats in ``broker.producer_snapshot`` and ``broker.storage.txn_index``).
A marker torn by a crash is cut by segment recovery and its transaction is open again, to be closed by the
coordinator's retry. ``TXN_MARKER_FILE`` (an empty file created, fsync'd with its directory, before the
partition's first transactional batch) now only matters when no snapshot can be used (a data dir written
before snapshots, or every snapshot past a cut): the log is then scanned from its first segment for a
partition that has it, from its second-to-last segment for any other.

Pure but for the maps it reads (the loop thread owns it).
"""

from __future__ import annotations

import bisect
import struct
from collections import deque
from typing import NamedTuple

from copyless.broker.storage.txn_index import IndexEntry, SealedIndex, search_done
from copyless.protocol.records import (
    CONTROL_BIT,
    NO_SEQUENCE,
    RECORD_BATCH_OVERHEAD,
    TRANSACTIONAL_BIT,
    BatchHeader,
    crc32c,
    encode_varint,
    read_varint,
)

__all__ = ["AbortedTxn", "Marker", "PartitionTxns", "TxnPartitions", "build_marker", "control_type_of", "read_marker",
           "ABORT", "COMMIT", "TXN_MARKER_FILE"]

ABORT, COMMIT = 0, 1
# Created in a partition's directory before its first transactional batch: loading scans that log for
# transactions (module docstring).
TXN_MARKER_FILE = "transactional"
# Bytes after a control batch's header that hold its first record's key and value (length, attributes,
# timestamp and offset deltas, key length: five varints, the 4-byte key, the value length and the 6-byte
# value; 18 bytes for the markers Kafka and this broker write, whose varints are one byte each).
CONTROL_KEY_READ = 32

_HEADER_AFTER_CRC = struct.Struct(">hiqqqhii")  # attributes .. recordsCount


class Marker(NamedTuple):
    """What a control batch says: ABORT or COMMIT (or another control type), and the coordinator epoch of
    a transaction marker (-1 when the value is not readable)."""
    control_type: int
    coordinator_epoch: int


# An aborted transaction is its .txnindex entry: the heap's and the mapped files' are one type.
AbortedTxn = IndexEntry


def build_marker(producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                 timestamp_ms: int) -> bytes:
    """One control batch (base offset 0: storage assigns it). Pure."""
    key = struct.pack(">hh", 0, COMMIT if commit else ABORT)
    value = struct.pack(">hi", 0, coordinator_epoch)
    body = b"".join((b"\x00", b"\x00", encode_varint(0), encode_varint(len(key)), key,
                     encode_varint(len(value)), value, b"\x00"))
    record = encode_varint(len(body)) + body
    after_crc = _HEADER_AFTER_CRC.pack(TRANSACTIONAL_BIT | CONTROL_BIT, 0, timestamp_ms, timestamp_ms, producer_id,
                                       producer_epoch, NO_SEQUENCE, 1) + record
    return struct.pack(">qiibI", 0, RECORD_BATCH_OVERHEAD - 12 + len(record), 0, 2, crc32c(after_crc)) + after_crc


def read_marker(data, position: int = 0) -> Marker | None:
    """The control batch at ``position`` of ``data`` (its header and at least ``CONTROL_KEY_READ`` bytes after
    it, or to its end), or None when its key is unreadable. Pure."""
    try:
        at = position + RECORD_BATCH_OVERHEAD
        _length, at = read_varint(data, at)
        at += 1  # attributes
        _timestamp_delta, at = read_varint(data, at)
        _offset_delta, at = read_varint(data, at)
        key_length, at = read_varint(data, at)
        if key_length < 4 or at + 4 > len(data):
            return None
        version, kind = struct.unpack_from(">hh", data, at)
        if version < 0:
            return None
    except (IndexError, ValueError, struct.error):
        return None
    coordinator_epoch = -1
    try:
        value_length, at = read_varint(data, at + key_length)
        if value_length >= 6 and at + 6 <= len(data):
            coordinator_epoch = struct.unpack_from(">hi", data, at)[1]
    except (IndexError, ValueError, struct.error):
        pass
    return Marker(kind, coordinator_epoch)


def control_type_of(data, position: int = 0) -> int | None:
    """The control type (ABORT, COMMIT, or another) of the control batch at ``position``, or None. Pure."""
    marker = read_marker(data, position)
    return None if marker is None else marker.control_type


class PartitionTxns:
    """One partition's transactions (module docstring). Loop thread only, but for ``adopt``."""

    __slots__ = ("ongoing", "completing", "unsealed", "_unsealed_last", "sealed", "_sealed_last", "_adopted",
                 "sealing_from", "persisted", "coordinator_epochs")

    def __init__(self) -> None:
        # The partition's directory has TXN_MARKER_FILE (set by rebuild at load, or once created).
        self.persisted = False
        self.ongoing: dict[int, int] = {}
        self.completing: list[tuple[int, int]] = []  # (marker offset, first offset)
        # Aborted transactions not in a mapped sealed file (the active segment's), in marker order, and their
        # markers (bisect).
        self.unsealed: list[AbortedTxn] = []
        self._unsealed_last: list[int] = []
        # Mapped sealed files, in marker order, and the last marker of each (bisect).
        self.sealed: list[SealedIndex] = []
        self._sealed_last: list[int] = []
        self._adopted: deque[SealedIndex] = deque()  # mapped by the state files' thread, not taken yet
        # Entries whose marker is below this were handed to the state files' thread for sealing.
        self.sealing_from = 0
        self.coordinator_epochs: dict[int, int] = {}

    def on_batch(self, header: BatchHeader, base_offset: int) -> None:
        """A data batch was appended at ``base_offset``."""
        if header.is_transactional and not header.is_control and header.producer_id >= 0:
            self.ongoing.setdefault(header.producer_id, base_offset)

    def coordinator_fenced(self, producer_id: int, coordinator_epoch: int) -> int | None:
        """The coordinator epoch a marker of ``producer_id`` at ``coordinator_epoch`` is older than (a deposed
        coordinator's marker: refused), or None when it may be written."""
        last = self.coordinator_epochs.get(producer_id, -1)
        return last if coordinator_epoch < last else None

    def on_marker(self, producer_id: int, marker_offset: int, control_type: int | None, high_watermark: int,
                  coordinator_epoch: int = -1) -> AbortedTxn | None:
        """A control batch was appended at ``marker_offset``: it closes the producer's open transaction (a
        control type other than ABORT or COMMIT, or None for an unreadable one, closes nothing). Returns the
        aborted transaction it records (its ``.txnindex`` entry), if it aborted one."""
        if control_type not in (ABORT, COMMIT):
            return None
        if coordinator_epoch >= 0:
            self.coordinator_epochs[producer_id] = coordinator_epoch
        first = self.ongoing.pop(producer_id, None)
        if first is None:
            return None  # a marker for a transaction with no batch here (a retried marker, or an empty one)
        entry = None
        if control_type == ABORT:
            entry = AbortedTxn(producer_id, first, marker_offset, self.lso(high_watermark))
            self.add_aborted(entry)
        if marker_offset >= high_watermark:
            self.completing.append((marker_offset, first))
        return entry

    def add_aborted(self, entry: AbortedTxn) -> None:
        """Record an aborted transaction (marker order: loading adds the ``.txnindex`` entries first)."""
        self.unsealed.append(entry)
        self._unsealed_last.append(entry.last_offset)

    def unsealed_below(self, offset: int) -> list[AbortedTxn]:
        """The heap's entries whose marker is below ``offset`` (a rolled segment's, to be sealed)."""
        return self.unsealed[:bisect.bisect_left(self._unsealed_last, offset)]

    def adopt(self, index: SealedIndex) -> None:
        """Hand over a mapped sealed file; taken on the loop thread at the next read. Any thread."""
        self._adopted.append(index)

    def install_sealed(self, index: SealedIndex) -> bool:
        """Read the entries of ``index`` from it from now on, and drop them from the heap, if the heap still
        holds them all (else the map is not used: the heap's copy is what the partition recorded). The map was
        checked against the heap's entries of its segment when it was opened; since then that range of the
        heap can only have lost entries (``drop_before``), never gained or changed one, so the count says it."""
        start = bisect.bisect_left(self._unsealed_last, index.first_marker)
        end = bisect.bisect_right(self._unsealed_last, index.last_marker)
        if end - start != index.count:
            return False
        del self.unsealed[start:end]
        del self._unsealed_last[start:end]
        at = bisect.bisect_left(self._sealed_last, index.last_marker)
        self.sealed.insert(at, index)
        self._sealed_last.insert(at, index.last_marker)
        return True

    def _take_adopted(self) -> None:
        while self._adopted:
            self.install_sealed(self._adopted.popleft())

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        if self.completing:
            self.completing = [(marker, first) for marker, first in self.completing if marker >= high_watermark]
        candidates = [first for _marker, first in self.completing]
        if self.ongoing:
            candidates.append(min(self.ongoing.values()))
        return min(candidates) if candidates else None

    def lso(self, high_watermark: int) -> int:
        first = self.first_unstable_offset(high_watermark)
        return high_watermark if first is None else min(first, high_watermark)

    def aborted_between(self, fetch_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """Aborted transactions a fetch of [fetch_offset, upper_offset) overlaps (Kafka's
        ``collectAbortedTransactions``): their marker is at or after the fetch offset and their first batch
        before the upper bound, in marker order. The sealed files from the one holding the first such marker
        on, then the heap's entries, each walked until ``search_done``."""
        self._take_adopted()
        found: list = []
        done_at = None  # the marker after which no entry overlaps the fetch
        for index in self.sealed[bisect.bisect_left(self._sealed_last, fetch_offset):]:
            done_at = index.collect(fetch_offset, upper_offset, found)
            if done_at is not None:
                break
        from_files = len(found)
        for entry in self.unsealed[bisect.bisect_left(self._unsealed_last, fetch_offset):]:
            if done_at is not None and entry.last_offset > done_at:
                break
            if entry.first_offset < upper_offset:
                found.append(entry)
            if search_done(entry, upper_offset):
                break
        if 0 < from_files < len(found):
            found.sort(key=lambda entry: entry.last_offset)  # a file left on the heap between mapped ones
        return found

    def drop_before(self, log_start_offset: int) -> None:
        """Forget aborted transactions wholly below the log start (retention removed their records): the
        heap's, and the maps of files whose every marker is below it."""
        self._take_adopted()
        cut = bisect.bisect_left(self._unsealed_last, log_start_offset)
        if cut:
            del self.unsealed[:cut]
            del self._unsealed_last[:cut]
        cut = bisect.bisect_left(self._sealed_last, log_start_offset)
        if cut:
            # Dropped, not closed: a map of a small read-only file has nothing to write back.
            del self.sealed[:cut]
            del self._sealed_last[:cut]

    @property
    def aborted(self) -> list[AbortedTxn]:
        """Every aborted transaction held, in marker order, read whole from the maps: for loading and
        inspection, never a fetch (which reads only the range it overlaps)."""
        self._take_adopted()
        entries = [entry for index in self.sealed for entry in index.entries()] + self.unsealed
        if self.sealed and self.unsealed:
            entries.sort(key=lambda entry: entry.last_offset)
        return entries

    @property
    def has_aborted(self) -> bool:
        return bool(self.unsealed or self.sealed or self._adopted)

    @property
    def has_transactions(self) -> bool:
        return bool(self.ongoing or self.completing or self.has_aborted)


class TxnPartitions:
    """Every hosted partition's ``PartitionTxns``, keyed by (topic, partition). Loop thread only."""

    def __init__(self) -> None:
        self._partitions: dict[tuple[str, int], PartitionTxns] = {}

    def get(self, topic: str, partition: int) -> PartitionTxns:
        txns = self._partitions.get((topic, partition))
        if txns is None:
            txns = self._partitions[(topic, partition)] = PartitionTxns()
        return txns

    def peek(self, topic: str, partition: int) -> PartitionTxns | None:
        return self._partitions.get((topic, partition))

    def install(self, topic: str, partition: int, txns: PartitionTxns) -> PartitionTxns:
        """Replace a partition's state by one loaded off the loop (``broker.partition_state_files``)."""
        self._partitions[(topic, partition)] = txns
        return txns

    def remove_partition(self, topic: str, partition: int) -> None:
        self._partitions.pop((topic, partition), None)

    def open_transactions(self) -> int:
        return sum(len(t.ongoing) for t in self._partitions.values())
