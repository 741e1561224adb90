"""LogConfig: the per-topic settings of a partition log, named after Kafka's topic configs."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LogConfig"]

# A segment's positions are stored as u32 in the offset index and Kafka caps segment.bytes at Int.MaxValue.
MAX_SEGMENT_BYTES = (1 << 31) - 1


@dataclass(frozen=True)
class LogConfig:
    """Per-topic log settings (Kafka's names in comments)."""

    segment_bytes: int = 1 << 30  # segment.bytes
    index_interval_bytes: int = 4096  # index.interval.bytes
    segment_index_bytes: int = 10 << 20  # segment.index.bytes (max index file size)
    segment_ms: int | None = 7 * 24 * 3600_000  # segment.ms
    flush_messages: int | None = None  # flush.messages (None = never, Kafka's default)
    flush_ms: int | None = None  # flush.ms
    flush_mode: str = "async"  # "async" | "sync" (sync = group commit: acks wait for fdatasync)
    retention_ms: int | None = 7 * 24 * 3600_000  # retention.ms (None = forever)
    retention_bytes: int | None = None  # retention.bytes (None = unlimited)
    file_delete_delay_ms: int = 60_000  # file.delete.delay.ms
    max_message_bytes: int = 1048588  # max.message.bytes (the broker enforces; storage asserts)
    message_timestamp_type: str = "CreateTime"  # or "LogAppendTime" (the broker applies it)
    compression_type: str = "producer"  # compression.type (the broker applies it: broker.record_conversion)
    # Compaction (cleaner.py): "delete" alone deletes old segments (retention), "compact" cleans them, both do
    # both; the rest are Kafka's topic configs of the same names.
    cleanup_policy: tuple[str, ...] = ("delete",)  # cleanup.policy
    min_cleanable_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio
    delete_retention_ms: int = 86_400_000  # delete.retention.ms
    min_compaction_lag_ms: int = 0  # min.compaction.lag.ms
    max_compaction_lag_ms: int = (1 << 63) - 1  # max.compaction.lag.ms (Kafka's Long.MAX_VALUE: never)
    # Disk blocks (posix_fallocate) follow the data: a segment file has its full logical size (one map) but
    # blocks only for a prefix that grows in steps ahead of the writer, so an idle partition holds its
    # data plus a few MiB, not a whole segment (27 small partitions held 28 GB with whole 1 GiB segments).
    # preallocate (Kafka's topic config): blocks for the whole segment at creation instead (RocketMQ's way).
    preallocate: bool = False  # preallocate
    # The most blocks a partition reserves past its data: the active segment's steps, the next segment's
    # (or the first step held for it), a rolled segment's until it is trimmed and every index's steps
    # together, each counted from when its step is queued (block_budget.py).
    preallocate_ahead_bytes: int = 64 << 20
    # The first step of a new segment; later steps are sized from the append rate (a second of it, at least
    # twice the previous step) up to preallocate_ahead_bytes, so a burst into a new partition gets large
    # steps at once while 100 idle partitions hold 100 first steps (see benchmarks/NOTES.md).
    preallocate_first_bytes: int = 4 << 20
    # Pre-faulting: the window of pages made resident ahead of the appends never shrinks below this (the
    # rest of the window is WARM_AHEAD_MS of the append rate: see prefault.py).
    prefault_window_bytes: int = 16 << 20
    # Pre-faults write zeros over each chunk before mapping it (prefault.py: 0.46 against 1.76 CPU s per GiB
    # here); False maps with MADV_POPULATE_WRITE alone (benchmarks/prefault.py compares them).
    prefault_zeros: bool = True
    # An append past the pre-faulted pages writes them with pwrite(2) instead of faulting them in through the
    # map (prefault.py: 0.25 against 1.77 CPU s per GiB); False faults them in.
    outrun_pwrite: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.segment_bytes <= MAX_SEGMENT_BYTES:
            raise ValueError(f"segment_bytes must be in (0, {MAX_SEGMENT_BYTES}], got {self.segment_bytes}")
        if self.index_interval_bytes < 0:
            raise ValueError("index_interval_bytes must be >= 0")
        if self.segment_index_bytes < 12:
            raise ValueError("segment_index_bytes must hold at least one entry (>= 12)")
        if self.flush_mode not in ("async", "sync"):
            raise ValueError(f"flush_mode must be 'async' or 'sync', got {self.flush_mode!r}")
        if self.message_timestamp_type not in ("CreateTime", "LogAppendTime"):
            raise ValueError(f"bad message_timestamp_type {self.message_timestamp_type!r}")
        if self.preallocate_ahead_bytes < 4096 or self.preallocate_first_bytes < 4096:
            raise ValueError("preallocate_ahead_bytes and preallocate_first_bytes must be >= 4096")
        if self.prefault_window_bytes < 0:
            raise ValueError("prefault_window_bytes must be >= 0")
        for name in ("segment_ms", "flush_messages", "flush_ms", "retention_ms", "retention_bytes"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or None")

    @property
    def compact(self) -> bool:
        """cleanup.policy includes compact: the cleaner cleans the log, producers must give every record a key."""
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """cleanup.policy includes delete: retention.ms and retention.bytes delete old segments."""
        return "delete" in self.cleanup_policy

    @property
    def first_step_bytes(self) -> int:
        """Blocks a new segment gets at creation."""
        return self.segment_bytes if self.preallocate else min(self.preallocate_first_bytes, self.segment_bytes)

    @property
    def index_ahead_bytes(self) -> int:
        """The most blocks one index file reserves past its entries (None-like: all with preallocate)."""
        if self.preallocate:
            return self.segment_index_bytes
        return max(4096, self.preallocate_ahead_bytes // 32)


# The defaults, one instance (frozen): a LogManager's default_config unless given one.
DEFAULT_LOG_CONFIG = LogConfig()
