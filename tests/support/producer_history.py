"""A partition's producer history written into a real log as the partition layer writes it: idempotent and
transactional batches, COMMIT/ABORT markers and epoch bumps, with the live producer state and transactions
kept beside it (``broker.partition.Partition``'s updates) and the ``.txnindex`` entries and snapshots queued on
a ``StateFiles`` thread. The snapshot tests and their crash scenario compare what a load finds with it."""

from __future__ import annotations

from dataclasses import dataclass, field

from copyless.broker.partition_state_files import StateFiles, capture_snapshot
from copyless.broker.producer_state import ProducerStateManager
from copyless.broker.txn_partition import ABORT, COMMIT, TXN_MARKER_FILE, PartitionTxns, build_marker
from copyless.protocol.records import read_header
from tests.support.batches import keyed_batch
from tests.support.blocking_appends import append_blocking

VALUE = b"v" * 4000  # about sixteen batches a 64 KiB segment: a history of a hundred operations rolls


@dataclass
class History:
    """The live side of one partition (what the broker holds in memory)."""

    log: object
    state_files: StateFiles | None = None
    producers: ProducerStateManager = field(default_factory=ProducerStateManager)
    txns: PartitionTxns = field(default_factory=PartitionTxns)
    epochs: dict = field(default_factory=dict)
    sequences: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        (self.log.directory / TXN_MARKER_FILE).touch()
        self.txns.persisted = True
        self._active = self.log.segments[-1].base_offset

    def apply(self, operation: str, producer: int) -> None:
        """``operation``: "idempotent" or "transactional" (a batch), "commit" or "abort" (a marker), "bump"
        (the producer's next batch comes at a new epoch, from sequence 0)."""
        epoch = self.epochs.setdefault(producer, 0)
        if operation == "bump":
            self.epochs[producer] = epoch + 1
            self.sequences[producer] = 0
            return
        if operation in ("commit", "abort"):
            marker = build_marker(producer, epoch, operation == "commit", 0, 1_700_000_000_000)
            result = append_blocking(self.log, marker)
            self.producers.update_marker("t", 0, producer, epoch, read_header(marker).max_timestamp)
            aborted = self.txns.on_marker(producer, result.base_offset, COMMIT if operation == "commit" else ABORT,
                                          self.log.high_watermark)
            if aborted is not None and self.state_files is not None:
                self.state_files.append_aborted(self.log, aborted)
        else:
            sequence = self.sequences.get(producer, 0)
            batch = keyed_batch([VALUE, VALUE[:10]], producer_id=producer, producer_epoch=epoch,
                                base_sequence=sequence, attributes_extra=0x10 if operation == "transactional" else 0)
            self.sequences[producer] = sequence + 2
            result = append_blocking(self.log, batch)
            header = read_header(batch)
            self.producers.update("t", 0, header, result.base_offset)
            if header.is_transactional:
                self.txns.on_batch(header, result.base_offset)
        active = self.log.segments[-1].base_offset
        if active != self._active:  # a roll: the partition layer snapshots and seals
            self._active = active
            self.snapshot()
            if self.state_files is not None:
                self.state_files.seal(self.log, self.txns)

    def snapshot(self):
        if self.state_files is not None:
            return self.state_files.snapshot(self.log, capture_snapshot(self.log, self.producers, "t", 0, self.txns))
        return None


def state_of(producers: list, txns: PartitionTxns, high_watermark: int) -> tuple:
    """What must agree between two loads: producers (epoch, batches), open transactions, the LSO and the
    aborted transactions (without the LSO recorded with each, which depends on when it was computed)."""
    return (sorted(producers), sorted(txns.ongoing.items()), txns.lso(high_watermark),
            [(a.producer_id, a.first_offset, a.last_offset) for a in txns.aborted])


def live_state(history: History) -> tuple:
    return state_of(history.producers.entries_of("t", 0), history.txns, history.log.high_watermark)
