"""What a Partition (partition.py) is built from, as typed Protocols: its log as a ``PartitionStore``, the
broker's idempotent-producer table as ``ProducerStates``, the fetch long-poll's wake-ups as
``AppendNotifications``. Satisfied structurally by storage's ``PartitionLog``, ``ProducerStateManager`` and
``AppendNotifier``, which are not imported here at run time; mypy (tests/test_types.py) checks every
construction site against these members and every call a Partition makes through them, so a Partition can
only reach what is listed here. The replica manager's and the handlers' seams are in interfaces.py.

Types only: nothing here runs.
"""

from __future__ import annotations

from collections.abc import Container, Hashable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from concurrent.futures import Future
    from pathlib import Path

    from copyless.broker.producer_state import SequenceCheck
    from copyless.broker.storage.config import LogConfig
    from copyless.broker.storage.leader_epoch_cache import LeaderEpochCache
    from copyless.broker.storage.results import AppendResult, FollowerAppend, ReadResult
    from copyless.broker.storage.segment import Segment
    from copyless.protocol.records import BatchHeader

__all__ = ["AppendNotifications", "PartitionStore", "ProducerStates"]


class PartitionStore(Protocol):
    """What a Partition and the replica manager need of one partition's log (storage's ``PartitionLog``)."""

    directory: Path
    config: LogConfig
    leader_epochs: LeaderEpochCache
    log_start_offset: int
    log_end_offset: int
    high_watermark: int

    @property
    def segments(self) -> tuple[Segment, ...]: ...

    def append(self, records, *, leader_epoch: int | None = 0,
               log_append_time_ms: int | None = None) -> AppendResult: ...

    def append_as_follower(self, records) -> FollowerAppend: ...

    def read(self, fetch_offset: int, max_bytes: int, *, min_one_message: bool = True,
             max_offset: int | None = None) -> ReadResult: ...

    def set_high_watermark(self, value: int) -> None: ...

    def max_timestamp(self) -> int: ...

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None: ...

    def flush(self, upto_offset: int | None = None) -> Future: ...

    def wait_flushed(self, offset: int) -> Future: ...

    def delete_records_before(self, offset: int) -> int: ...

    def truncate_to(self, offset: int) -> None: ...

    def truncate_fully_and_start_at(self, offset: int) -> None: ...


class ProducerStates(Protocol):
    """What a Partition needs of the idempotent-producer table (``ProducerStateManager``)."""

    def check(self, topic: str, partition: int, header: BatchHeader) -> SequenceCheck: ...

    def update(self, topic: str, partition: int, header: BatchHeader, first_offset: int,
               timestamp: int | None = None) -> None: ...

    def check_marker(self, topic: str, partition: int, producer_id: int, epoch: int) -> SequenceCheck: ...

    def update_marker(self, topic: str, partition: int, producer_id: int, epoch: int, timestamp: int) -> None: ...

    def remove_expired(self, topic: str, partition: int, now_ms: int, expiration_ms: int,
                       ongoing: Container[int] = ()) -> list[int]: ...

    def entries_of(self, topic: str, partition: int) -> list[tuple[int, int, int, tuple]]: ...


class AppendNotifications(Protocol):
    """What a Partition needs of the fetch long-poll (``AppendNotifier``): a wake-up for a key's waiters."""

    def notify(self, key: Hashable) -> None: ...
