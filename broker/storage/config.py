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
        for name in ("segment_ms", "flush_messages", "flush_ms", "retention_ms", "retention_bytes"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or None")
