"""LogManager: owns one data directory: every partition log, the checkpoints, the clean-shutdown marker and
the background threads (file layer; never imports asyncio).

Data directory layout (see filenames.py)::

    <data_dir>/.lock                               flock'ed while a process owns the directory
    <data_dir>/.copyless_cleanshutdown             written last by shutdown(), removed by startup()
    <data_dir>/recovery-point-offset-checkpoint    per log: every offset below is on disk (checkpoint.py)
    <data_dir>/high-watermark-checkpoint           per log: its high watermark, as last written
    <data_dir>/log-start-offset-checkpoint         per log: its log start offset (DeleteRecords, truncation)
    <data_dir>/<topic>-<partition>/                one PartitionLog each
    <data_dir>/<topic>-<partition>.<hex>-delete/   deleted logs, removed in the background

Start-up: with the marker, logs load from their files (O(segments)); without it, each log rescans from its
checkpointed recovery point (O(unflushed bytes)); the time taken is logged and kept in ``startup_stats``.

The three offset checkpoints are one file each for the whole directory, as Kafka keeps them, not one per
partition: a checkpoint write is two fsyncs and a rename (0.4 ms here), so per-partition files would cost a
1000-partition broker ~0.4 s of fsyncs every high-watermark interval (5 s) instead of ~1 ms. The high
watermarks and log start offsets are written every ``offsets_checkpoint_interval_ms`` when they changed, at
shutdown, and by ``checkpoint_offsets`` (a log's truncation and DeleteRecords call it before returning).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

from . import filenames
from .background import Background
from .checkpoint import fsync_directory, read_checkpoint, remove_marker, write_checkpoint, write_marker
from .cleaner import CleanerConfig, LogCleaner
from .clock import now_ms
from .config import DEFAULT_LOG_CONFIG, LogConfig
from .errors import StorageError, storage_error_from
from .partition_log import PartitionLog

__all__ = ["LogManager"]

log = logging.getLogger("copyless.storage")


class LogManager:
    """All partition logs of one data directory.

    Args:
        data_dir: the directory (created if missing).
        default_config: config for logs found at start-up and for ``create_log`` without one.
        topic_configs: optional ``{topic: LogConfig}`` for logs found at start-up.
        background_interval_ms: period of the housekeeping thread (flush.ms checks, reaping); None = no
            thread (the owner calls maybe_flush / run_retention / checkpoint_recovery_points itself).
        checkpoint_interval_ms: Kafka ``log.flush.offset.checkpoint.interval.ms`` (60 s).
        retention_check_interval_ms: Kafka ``log.retention.check.interval.ms`` (5 min).
        offsets_checkpoint_interval_ms: how often the high watermarks and log start offsets are written when
            they changed (Kafka ``replica.high.watermark.checkpoint.interval.ms``, 5 s).
    """

    def __init__(self, data_dir, *, default_config: LogConfig = DEFAULT_LOG_CONFIG, topic_configs=None,
                 background_interval_ms: int | None = 1000, checkpoint_interval_ms: int = 60_000,
                 retention_check_interval_ms: int = 300_000, offsets_checkpoint_interval_ms: int = 5_000,
                 cleaner_config: CleanerConfig | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.default_config = default_config
        self.topic_configs = dict(topic_configs or {})
        self.background_interval_ms = background_interval_ms
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.retention_check_interval_ms = retention_check_interval_ms
        self.offsets_checkpoint_interval_ms = offsets_checkpoint_interval_ms
        self._written_offsets: dict[str, dict] = {}  # checkpoint file name -> the entries it holds
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self._lock = threading.Lock()
        self._background: Background | None = None
        self._lock_fd = -1
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._checkpoint_lock = threading.Lock()
        self.startup_stats: dict = {}
        self.started = False
        # The log cleaner's threads (cleaner.py), started with the logs when enabled.
        self.cleaner_config = cleaner_config
        self.cleaner: LogCleaner | None = None

    # --- lifecycle -----------------------------------------------------------------------------------------

    def startup(self) -> None:
        """Load every ``<topic>-<partition>/`` directory, recovering after an unclean stop. Blocking.

        Raises:
            StorageError: the directory is locked by another process or cannot be read.
        """
        started = time.perf_counter()
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.data_dir / filenames.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self._lock_fd)
                self._lock_fd = -1
                raise StorageError("data directory is in use by another process", path=self.data_dir) from None
            clean = remove_marker(self.data_dir / filenames.CLEAN_SHUTDOWN_MARKER)
            recovery_points = {} if clean else read_checkpoint(self.data_dir / filenames.RECOVERY_POINT_CHECKPOINT)
            high_watermarks = read_checkpoint(self.data_dir / filenames.HIGH_WATERMARK_CHECKPOINT)
            log_start_offsets = read_checkpoint(self.data_dir / filenames.LOG_START_OFFSET_CHECKPOINT)
            entries = sorted(os.scandir(self.data_dir), key=lambda entry: entry.name)
            # No marker because no log was ever written here: a new data directory, not a crash. The broker
            # keeps its own files beside the logs (meta.properties, topics.json) and writes them first, so
            # "new" means no partition directory and no recovery checkpoint, not an empty directory.
            new = not clean and not any(
                entry.is_dir() or entry.name == filenames.RECOVERY_POINT_CHECKPOINT for entry in entries)
        except OSError as exc:
            raise storage_error_from(exc, "opening the data directory", self.data_dir) from None
        self._background = Background()
        totals = {"logs": 0, "segments": 0, "segments_recovered": 0, "bytes_rescanned": 0, "bytes_discarded": 0,
                  "segments_removed": 0}
        for entry in entries:
            if not entry.is_dir():
                continue
            if entry.name.endswith(filenames.DELETE_DIR_SUFFIX):
                self._background.submit_io(shutil.rmtree, entry.path, True)
                continue
            parsed = filenames.parse_partition_dir(entry.name)
            if parsed is None:
                continue
            topic, partition = parsed
            config = self.topic_configs.get(topic, self.default_config)
            try:
                partition_log, stats = PartitionLog.load(
                    topic, partition, Path(entry.path), config, self.background, clean=clean,
                    recovery_point=recovery_points.get((topic, partition), 0),
                    high_watermark=high_watermarks.get((topic, partition)),
                    log_start_offset=log_start_offsets.get((topic, partition)))
            except OSError as exc:
                raise storage_error_from(exc, "loading a log", entry.path) from None
            self._add(topic, partition, partition_log)
            totals["logs"] += 1
            for key in ("segments", "segments_recovered", "bytes_rescanned", "bytes_discarded", "segments_removed"):
                totals[key] += getattr(stats, key)
        seconds = time.perf_counter() - started
        self.startup_stats = {"clean": clean, "new": new, "seconds": seconds, **totals}
        if new:
            log.info("storage started in %.3f s: new data directory %s", seconds, self.data_dir)
        else:
            log.log(logging.INFO if clean else logging.WARNING,
                    "storage started in %.3f s (%s): %d logs, %d segments, %d recovered, %d bytes rescanned,"
                    " %d bytes trimmed past the last batches",
                    seconds, "clean shutdown" if clean else "unclean shutdown: recovered",
                    totals["logs"], totals["segments"], totals["segments_recovered"], totals["bytes_rescanned"],
                    totals["bytes_discarded"])
        if not clean and self._logs:
            try:
                self.checkpoint_offsets(disk_full_ok=True)
            except StorageError as exc:
                if not exc.is_disk_full:
                    raise
                # Recovery points only spare the next recovery a rescan: a full disk must not stop start-up.
                log.warning("%s; the previous recovery points stay in force", exc)
        self.started = True
        if self.cleaner_config is not None and self.cleaner_config.enable and self.cleaner_config.threads > 0:
            self.cleaner = LogCleaner(lambda: list(self._logs.values()), self.cleaner_config)
            self.cleaner.start()
        if self.background_interval_ms is not None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._housekeeping, name="copyless-storage", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        """Flush and close every log, checkpoint, then write the clean-shutdown marker. Blocking: call it from
        a worker thread in async code."""
        if not self.started:
            return
        self._stop_housekeeping()
        self._stop_cleaner()
        for partition_log in list(self._logs.values()):
            partition_log.stop_warming()
        for partition_log in list(self._logs.values()):
            partition_log.close()
        self.checkpoint_offsets(disk_full_ok=True)
        self.background.reap(now_ms=1 << 62)
        self.background.shutdown()
        write_marker(self.data_dir / filenames.CLEAN_SHUTDOWN_MARKER)
        self._release()
        log.info("storage shut down cleanly")

    def abandon(self) -> None:
        """Stop without flushing, trimming, checkpointing or writing the marker: the data directory is left
        as a kill -9 at this instant leaves it. For crash tests."""
        if not self.started:
            return
        self._stop_housekeeping()
        self._stop_cleaner()
        for partition_log in list(self._logs.values()):
            partition_log.stop_for_abandon()
        # Tasks already running finish (a crash a moment later); queued ones never run, as after a real kill.
        self.background.shutdown(cancel_queued=True)
        for partition_log in list(self._logs.values()):
            partition_log.abandon()
        self._release()

    def _release(self) -> None:
        self._logs.clear()
        self.started = False
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    # --- logs ------------------------------------------------------------------------------------------

    def _add(self, topic: str, partition: int, partition_log: PartitionLog) -> None:
        partition_log.checkpoint_offsets = self.checkpoint_offsets  # type: ignore[assignment]  # declared None there
        self._logs[(topic, partition)] = partition_log

    def get_log(self, topic: str, partition: int) -> PartitionLog | None:
        return self._logs.get((topic, partition))

    def logs(self) -> dict[tuple[str, int], PartitionLog]:
        return dict(self._logs)

    def create_log(self, topic: str, partition: int, config: LogConfig | None = None) -> PartitionLog:
        """Create (or return the existing) log; an existing log takes ``config`` for what follows (new
        segments, flush and retention policies). Blocking: allocates the first segment's first step."""
        self._require_started()
        config = config or self.topic_configs.get(topic, self.default_config)
        if not topic or "/" in topic or topic in (".", ".."):
            raise ValueError(f"illegal topic name {topic!r}")
        with self._lock:
            existing = self._logs.get((topic, partition))
            if existing is not None:
                existing.config = config
                return existing
            directory = self.data_dir / filenames.partition_dir_name(topic, partition)
            try:
                if directory.exists():
                    partition_log, _ = PartitionLog.load(topic, partition, directory, config, self.background,
                                                         clean=False, recovery_point=0)
                else:
                    partition_log = PartitionLog.create_new(topic, partition, directory, config, self.background)
            except OSError as exc:
                shutil.rmtree(directory, ignore_errors=True)
                raise storage_error_from(exc, "creating a log", directory, bytes_needed=config.segment_bytes) from None
            self._add(topic, partition, partition_log)
            return partition_log

    def delete_log(self, topic: str, partition: int) -> None:
        """Remove a log: its directory is renamed ``*-delete`` at once and removed in the background once
        in-flight FileSlices are released."""
        self._require_started()
        with self._lock:
            partition_log = self._logs.pop((topic, partition), None)
        if partition_log is None:
            return
        target = self.data_dir / f"{partition_log.directory.name}.{uuid.uuid4().hex}{filenames.DELETE_DIR_SUFFIX}"
        try:
            os.rename(partition_log.directory, target)
            fsync_directory(self.data_dir)
        except OSError as exc:
            raise storage_error_from(exc, "deleting a log", partition_log.directory) from None
        segments = partition_log.retire_all(target, now_ms())
        self.background.retire_directory(target, segments, now_ms())
        self.background.submit_io(self.background.reap)

    # --- periodic work --------------------------------------------------------------------------------------

    def maybe_flush(self, now: int | None = None) -> int:
        """Apply every log's flush.ms policy (non-blocking: flushes run on flush threads)."""
        now = now_ms() if now is None else now
        return sum(1 for partition_log in list(self._logs.values()) if partition_log.maybe_flush(now))

    def run_retention(self, now: int | None = None) -> int:
        """Apply retention.ms / retention.bytes to every log; reap unpinned retired segments."""
        now = now_ms() if now is None else now
        count = 0
        for partition_log in list(self._logs.values()):
            count += partition_log.run_retention(now)
        if self._background is not None:
            self._background.reap(now)
        return count

    def checkpoint_recovery_points(self) -> None:
        """Write every log's recovery point: tmp + fsync + rename + directory fsync. Blocking."""
        with self._checkpoint_lock:
            entries = {key: partition_log.recovery_point for key, partition_log in list(self._logs.items())}
            try:
                write_checkpoint(self.data_dir / filenames.RECOVERY_POINT_CHECKPOINT, entries)
            except OSError as exc:
                raise storage_error_from(exc, "writing the recovery-point checkpoint", self.data_dir) from None

    def checkpoint_offsets(self, *, disk_full_ok: bool = False) -> None:
        """Write the recovery points, high watermarks and log start offsets of every log. Blocking.

        ``disk_full_ok`` (start-up, shutdown): a full disk fails only the recovery points; the other two are
        logged and left as they were (a high watermark behind is re-learnt from the leader, a log start
        behind shows records a DeleteRecords had hidden: better than a broker that cannot stop)."""
        self.checkpoint_recovery_points()
        try:
            self.checkpoint_replication_offsets(force=True)
        except StorageError as exc:
            if not (disk_full_ok and exc.is_disk_full):
                raise
            log.warning("%s; the previous high watermarks and log start offsets stay in force", exc)

    def checkpoint_replication_offsets(self, *, force: bool = False) -> None:
        """Write the high watermarks and log start offsets, each file only if its entries changed since it was
        last written (unless ``force``). Blocking."""
        with self._checkpoint_lock:
            logs = list(self._logs.items())
            for name, entries in (
                    (filenames.HIGH_WATERMARK_CHECKPOINT, {key: log_.high_watermark for key, log_ in logs}),
                    (filenames.LOG_START_OFFSET_CHECKPOINT,
                     {key: log_.log_start_offset_to_checkpoint for key, log_ in logs})):
                if not force and self._written_offsets.get(name) == entries:
                    continue
                try:
                    write_checkpoint(self.data_dir / name, entries)
                except OSError as exc:
                    raise storage_error_from(exc, f"writing the {name}", self.data_dir) from None
                self._written_offsets[name] = entries

    def wait_for_background(self, timeout_s: float | None = 60) -> None:
        """Block until seals, renames and deletions queued so far are done, then reap. Tests, benchmarks."""
        self._require_started()
        # The io thread is FIFO: a reap queued now runs after every seal, rename and reap queued before it.
        self.background.submit_io(self.background.reap).result(timeout_s)

    def _housekeeping(self) -> None:
        assert self.background_interval_ms is not None  # the thread runs only with an interval (start)
        interval_s = self.background_interval_ms / 1000
        last_checkpoint = last_retention = last_offsets = now_ms()
        while not self._stop.wait(interval_s):
            now = now_ms()
            try:
                self.maybe_flush(now)
                if now - last_offsets >= self.offsets_checkpoint_interval_ms:
                    last_offsets = now
                    self.checkpoint_replication_offsets()
                if now - last_retention >= self.retention_check_interval_ms:
                    last_retention = now
                    self.run_retention(now)
                else:
                    self.background.reap(now)
                if now - last_checkpoint >= self.checkpoint_interval_ms:
                    last_checkpoint = now
                    self.checkpoint_recovery_points()
            except Exception:  # housekeeping must survive a bad disk; the error is in the log
                log.exception("storage housekeeping failed")

    def _stop_cleaner(self) -> None:
        if self.cleaner is not None:
            self.cleaner.stop()
            self.cleaner = None

    def _stop_housekeeping(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def background(self) -> Background:
        """The worker threads: start() creates them."""
        if self._background is None:
            raise StorageError("LogManager is not started", path=self.data_dir)
        return self._background

    def _require_started(self) -> None:
        if not self.started:
            raise StorageError("LogManager is not started", path=self.data_dir)
