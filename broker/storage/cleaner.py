"""The log cleaner: compaction of ``cleanup.policy=compact`` logs on its own threads (file layer; never the
event loop, never asyncio). The rules for one batch are compaction.py's; this module picks logs, reads and
writes segments and swaps them in, crash-safely.

A log's cleanable part is its segments before the first one that is active, not yet sealed, not wholly
below the high watermark, or younger than ``min.compaction.lag.ms`` (its newest record). Its *dirty*
section starts at the offset the last cleaning reached (``cleaner-offset-checkpoint`` in the partition's
directory, one integer: a lost file only means work done again). A log is cleaned when its dirty bytes
make at least ``min.cleanable.dirty.ratio`` of its cleanable bytes, or when its first dirty segment is
older than ``max.compaction.lag.ms``; of those the dirtiest goes first (Kafka's ``LogCleanerManager``).

One cleaning (``clean_log``):

1. the offset map of the dirty section (key -> last offset), bounded by ``log.cleaner.dedupe.buffer.size``
   (24 bytes a key, as Kafka counts): a dirty section with more keys is cleaned in several passes, each
   ending where its map filled;
2. the segments from the log start to the map's end, in groups whose sizes add up to at most
   ``segment.bytes`` (small cleaned segments merge), each rewritten to ``<base>.log.cleaned`` (and its two
   indexes, rebuilt from the new file by the recovery scan, which checks every batch it wrote), fdatasynced;
3. the swap, below.

Crash story (failpoints ``clean.*``, tests/storage/test_compaction_crash.py). The swap's commit point is a
manifest, ``cleaner.swap`` (checkpoint format, one ``base end`` line per group: the new segment replaces
every segment with a base offset in [base, end)), written with tmp + fsync + rename + directory fsync once
every ``.cleaned`` file is durable. Then each group's old files are renamed ``.deleted`` and its
``.cleaned`` files to the segment names (the log file last), the directory is fsynced and the manifest
removed. Start-up (``recover_swap``, before the segments are listed): with a manifest, each group whose
``.log.cleaned`` is still there is finished (old files of [base, end) removed, the cleaned ones renamed);
without one, ``.cleaned`` files are an unfinished cleaning and are removed. So a kill -9 at any step leaves
the old segments or the new ones, never a mix and never a gap. Kafka's own dance (``.cleaned`` renamed
``.swap``, completed at start-up over [base, the swap segment's next offset)) cannot tell an old segment
of the group from the next one once the group's last records were cleaned away; the manifest names the
end.

In memory the swap replaces the group's segments in the log's segment tuple under the log's lock (and its
io lock, which truncation holds); a cleaning that finds the tuple changed meanwhile (retention, a
truncation) drops its work. Old segments go to the reaper like retention's: a fetch holding one keeps
reading it through its fd until it lets go (zero copy is unchanged: cleaned segments are served by
sendfile like any other).

Followers clean their own logs the same way (each replica's cleaner decides alone, as in Kafka): the
leader replicates batches as written, cleaned or not, and a follower accepts offset gaps in what it fetches
(partition_log.append_as_follower).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from copyless.protocol.records import (
    RECORD_BATCH_OVERHEAD,
    InvalidBatchError,
    batch_size_at,
    read_header,
)

from . import blocking, filenames
from ._failpoints import failpoint
from ._fileops import remove_file, sync_data
from .checkpoint import fsync_directory, read_entries, write_entries
from .clock import now_ms
from .compaction import OffsetMap, filter_batch
from .index import OffsetIndex, TimeIndex
from .segment import Segment

__all__ = ["CleanerConfig", "CleanResult", "LogCleaner", "clean_log", "recover_swap", "read_cleaner_checkpoint",
           "dirty_ratio", "cleanable_section"]

log = logging.getLogger("copyless.storage.cleaner")

# Segments are read in chunks of whole batches of about this size (one pread each; a bigger batch whole).
READ_CHUNK_BYTES = 8 << 20
# Cleaned batches are gathered and written in runs of about this size.
WRITE_CHUNK_BYTES = 1 << 20
# Kafka sizes its offset map at 24 bytes per entry (a 16-byte MD5 and an 8-byte offset) and fills it to
# a load factor of 0.9: log.cleaner.dedupe.buffer.size of 128 MiB holds about 5M keys a pass.
MAP_ENTRY_BYTES = 24
MAP_LOAD_FACTOR = 0.9


@dataclass(frozen=True)
class CleanerConfig:
    """The broker's cleaner settings (Kafka's ``log.cleaner.*``)."""

    enable: bool = True
    threads: int = 1
    backoff_ms: int = 15_000
    dedupe_buffer_bytes: int = 128 << 20
    io_max_bytes_per_second: float | None = None  # None: unthrottled

    @property
    def max_map_entries(self) -> int:
        per_thread = self.dedupe_buffer_bytes // max(1, self.threads)
        return max(1, int(per_thread / MAP_ENTRY_BYTES * MAP_LOAD_FACTOR))


@dataclass
class CleanResult:
    """What one cleaning did."""

    start_offset: int
    end_offset: int  # the new first dirty offset
    bytes_read: int = 0
    bytes_written: int = 0
    segments_before: int = 0
    segments_after: int = 0
    records_dropped: int = 0
    tombstones_dropped: int = 0
    keys: int = 0
    seconds: float = 0.0
    aborted: str | None = None


# --- the checkpoint and the swap manifest ---------------------------------------------------------------------------


def read_cleaner_checkpoint(directory: Path) -> int | None:
    """The first dirty offset the last cleaning left (None: never cleaned, or an unreadable file)."""
    try:
        entries = read_entries(Path(directory) / filenames.CLEANER_CHECKPOINT)
        return int(entries[0]) if entries else None
    except (OSError, ValueError, IndexError):
        return None


def _write_cleaner_checkpoint(directory: Path, offset: int) -> None:
    write_entries(directory / filenames.CLEANER_CHECKPOINT, [(offset,)])


def _cleaned_paths(directory: Path, base_offset: int) -> tuple[Path, Path, Path]:
    log, index, time_index = filenames.segment_paths(directory, base_offset)
    suffix = filenames.CLEANED_SUFFIX
    return log.with_name(log.name + suffix), index.with_name(index.name + suffix), time_index.with_name(
        time_index.name + suffix)


def recover_swap(directory: Path) -> int:
    """Start-up, before the segments are listed: finish a swap whose manifest was written, remove the files of
    a cleaning that never reached it (module docstring). Returns the number of groups finished. Blocking."""
    manifest = directory / filenames.SWAP_MANIFEST
    finished = 0
    groups: list[tuple[int, int]] = []
    if manifest.exists():
        try:
            groups = [(int(base), int(end)) for base, end in (line.split() for line in read_entries(manifest) or [])]
        except (OSError, ValueError) as exc:
            # The manifest is written whole (tmp + rename) or not at all: an unreadable one is damage; the
            # cleaned files are then dropped and the old segments kept.
            log.error("%s: unreadable %s (%s): keeping the segments it would have replaced", directory,
                      manifest.name, exc)
            groups = []
    for base, end in groups:
        cleaned_log, cleaned_index, cleaned_time_index = _cleaned_paths(directory, base)
        if not cleaned_log.exists():
            continue  # this group's swap finished: its old files are .deleted leftovers
        for name in os.listdir(directory):
            parsed = filenames.parse_segment_file(name)
            if parsed is not None and base <= parsed[0] < end:
                os.unlink(directory / name)
        target_log, target_index, target_time_index = filenames.segment_paths(directory, base)
        for source, target in ((cleaned_index, target_index), (cleaned_time_index, target_time_index)):
            if source.exists():
                os.rename(source, target)
        os.rename(cleaned_log, target_log)
        finished += 1
    if groups:
        fsync_directory(directory)
        log.warning("%s: finished an interrupted cleaning's swap (%d of %d group(s) were left to do)", directory,
                    finished, len(groups))
    manifest.unlink(missing_ok=True)
    for name in os.listdir(directory):
        if name.endswith(filenames.CLEANED_SUFFIX):
            os.unlink(directory / name)
    return finished


# --- what is cleanable ------------------------------------------------------------------------------------------------


@dataclass
class Section:
    """A log's cleanable segments and where its dirty part starts."""

    segments: tuple[Segment, ...]  # the cleanable segments, from the log's first
    first_dirty: int
    end_offset: int  # the first offset not cleanable (the base of the first segment left out)
    clean_bytes: int
    dirty_bytes: int

    @property
    def ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def cleanable_section(partition_log, now: int) -> Section | None:
    """The cleanable segments of ``partition_log`` (module docstring), None when there is none. Any thread."""
    config = partition_log.config
    log_segments = partition_log.log_segments
    with log_segments.lock:
        segments = log_segments.all
        sealing = list(log_segments.sealing)
        high_watermark = min(partition_log.high_watermark, partition_log.log_end_offset)
        log_start = partition_log.log_start_offset
    lag_ms = config.min_compaction_lag_ms
    chosen: list[Segment] = []
    for number, segment in enumerate(segments[:-1]):
        following = segments[number + 1]
        if segment in sealing or not following.named or following.base_offset > high_watermark:
            break
        if segment.map is not None or segment.closed:
            break
        newest = segment.max_timestamp if segment.max_timestamp >= 0 else segment.created_ms
        if lag_ms and now - newest < lag_ms:
            break
        chosen.append(segment)
    if not chosen:
        return None
    end_offset = segments[len(chosen)].base_offset
    checkpoint = read_cleaner_checkpoint(partition_log.directory)
    if checkpoint is not None and checkpoint > partition_log.log_end_offset:
        checkpoint = None  # a truncation cut the log below it: clean from the start again
    first_dirty = max(log_start, chosen[0].base_offset, checkpoint if checkpoint is not None else 0)
    if first_dirty >= end_offset:
        return Section(tuple(chosen), end_offset, end_offset, sum(s.committed_position for s in chosen), 0)
    clean_bytes = dirty_bytes = 0
    for number, segment in enumerate(chosen):
        following_base = segments[number + 1].base_offset
        if following_base <= first_dirty:
            clean_bytes += segment.committed_position
        else:
            dirty_bytes += segment.committed_position
    return Section(tuple(chosen), first_dirty, end_offset, clean_bytes, dirty_bytes)


def dirty_ratio(partition_log, now: int | None = None) -> float:
    """The share of the log's cleanable bytes not cleaned yet (0.0 with nothing cleanable). Any thread."""
    section = cleanable_section(partition_log, now_ms() if now is None else now)
    return 0.0 if section is None else section.ratio


def _should_clean(partition_log, section: Section, now: int) -> bool:
    if section.dirty_bytes == 0:
        return False
    config = partition_log.config
    if section.ratio >= config.min_cleanable_dirty_ratio:
        return True
    max_lag = config.max_compaction_lag_ms
    if max_lag is None:
        return False
    for segment in section.segments:
        if segment.next_offset > section.first_dirty:
            newest = segment.max_timestamp if segment.max_timestamp >= 0 else segment.created_ms
            return now - newest >= max_lag
    return False


# --- reading batches ------------------------------------------------------------------------------------------------


class _Throttle:
    """``log.cleaner.io.max.bytes.per.second``: sleeps the cleaner thread (never a loop) to hold the rate."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.started = time.monotonic()
        self.bytes = 0

    def __call__(self, count: int) -> None:
        if not self.rate:
            return
        self.bytes += count
        ahead = self.bytes / self.rate - (time.monotonic() - self.started)
        if ahead > 0:
            time.sleep(min(ahead, 1.0))


def _iter_segment_batches(segment: Segment, throttle: _Throttle):
    """``(bytes of one batch, its header)`` for every whole batch of a sealed segment, read in chunks."""
    end = segment.committed_position
    position = 0
    while position < end:
        chunk = os.pread(segment.fd, min(READ_CHUNK_BYTES, end - position), position)
        throttle(len(chunk))
        view = memoryview(chunk)
        cursor = 0
        while len(chunk) - cursor >= RECORD_BATCH_OVERHEAD:
            size = batch_size_at(chunk, cursor)
            if size is None or size < RECORD_BATCH_OVERHEAD:
                return
            if cursor + size > len(chunk):
                if cursor == 0:  # one batch larger than a chunk: read it whole
                    chunk = os.pread(segment.fd, size, position)
                    view = memoryview(chunk)
                    if len(chunk) < size:
                        return
                else:
                    break
            header = read_header(chunk, cursor)
            yield view[cursor:cursor + size], header
            cursor += size
        if cursor == 0:
            return
        position += cursor


# --- one cleaning -----------------------------------------------------------------------------------------------------


def _build_map(section: Section, max_entries: int, throttle: _Throttle) -> tuple[OffsetMap, int]:
    """The offset map of the dirty section (from its first dirty offset until the map fills), and the bytes
    read."""
    offsets = OffsetMap(max_entries)
    offsets.end_offset = section.first_dirty
    read = 0
    for segment in section.segments:
        if segment.next_offset <= section.first_dirty:
            continue
        for batch, header in _iter_segment_batches(segment, throttle):
            read += header.size
            if header.next_offset <= section.first_dirty:
                continue
            try:
                if not offsets.add_batch(batch, header):
                    if len(offsets):
                        return offsets, read
                    offsets.max_entries = 1 << 62  # one batch holds more keys than the map: take it anyway
                    offsets.add_batch(batch, header)
            except InvalidBatchError as exc:
                log.warning("%s: batch at offset %d does not parse (%s): it is kept as it is",
                            segment.log_path, header.base_offset, exc)
                offsets.end_offset = header.next_offset
    return offsets, read


def _producer_last_batches(partition_log) -> dict[int, int]:
    """Producer id -> base offset of its last batch in the whole log (header scan, no record bytes)."""
    last: dict[int, int] = {}
    for header in partition_log.batch_headers(partition_log.log_start_offset):
        if header.producer_id >= 0:
            last[header.producer_id] = header.base_offset
    return last


class _GroupWriter:
    """One cleaned segment being written: ``<base>.log.cleaned``, then its indexes rebuilt and synced."""

    def __init__(self, directory: Path, base_offset: int, config) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.config = config
        self.paths = _cleaned_paths(directory, base_offset)
        self.fd = os.open(self.paths[0], os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.group: list[Segment] = []
        self.written = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def add(self, segment: Segment, offsets: OffsetMap, producer_last: dict[int, int], now: int,
            throttle: _Throttle, result: CleanResult) -> None:
        """Append the cleaned batches of ``segment``."""
        self.group.append(segment)
        for batch, header in _iter_segment_batches(segment, throttle):
            result.bytes_read += header.size
            try:
                outcome = filter_batch(batch, header, offsets, now_ms=now,
                                       delete_retention_ms=self.config.delete_retention_ms,
                                       producer_last_batch=producer_last.get(header.producer_id) == header.base_offset)
            except InvalidBatchError:
                self._put(bytes(batch))
                continue
            result.records_dropped += outcome.records_dropped
            result.tombstones_dropped += outcome.tombstones_dropped
            if outcome.data is not None:
                self._put(bytes(outcome.data))
        self._drain()

    def _put(self, data: bytes) -> None:
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes >= WRITE_CHUNK_BYTES:
            self._drain()

    def _drain(self) -> None:
        if self._pending:
            _write_all(self.fd, b"".join(self._pending))
            self.written += self._pending_bytes
            self._pending, self._pending_bytes = [], 0

    def finish(self) -> Segment:
        """fdatasync the log, rebuild both indexes from it (the recovery scan, which also checks every batch
        written) and sync them; the returned segment carries the ``.cleaned`` names."""
        self._drain()
        sync_data(self.fd)
        fd, self.fd = self.fd, -1
        try:
            offset_index = OffsetIndex.open_existing(self.paths[1])
            time_index = TimeIndex.open_existing(self.paths[2])
        except BaseException:
            os.close(fd)
            raise
        config = self.config
        cleaned = Segment(self.directory, self.base_offset, fd, offset_index, time_index,
                          size_bytes=os.fstat(fd).st_size, index_interval_bytes=config.index_interval_bytes)
        cleaned.log_path = self.paths[0]
        outcome = cleaned.recover(config.segment_index_bytes)
        if outcome.stop_reason is not None:
            cleaned.close(unlink=True)
            raise InvalidBatchError("cleaned segment", f"{self.paths[0]} does not read back: {outcome.stop_reason}")
        cleaned.seal_recovered()
        cleaned.created_ms = min(segment.created_ms for segment in self.group)
        return cleaned

    def discard(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        for path in self.paths:
            remove_file(path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def clean_log(partition_log, *, max_map_entries: int = 5_000_000, now: int | None = None,
              io_max_bytes_per_second: float | None = None, force: bool = False) -> CleanResult | None:
    """Clean one log once if it is due (or with ``force``, if it has anything dirty). Blocking: a cleaner
    thread or a test. Returns None when there was nothing to clean.

    Raises:
        OSError: reading or writing a segment failed (the log is unchanged: the swap had not begun, or
            start-up completes it).
    """
    blocking.check("cleaning a log")
    started = time.perf_counter()
    now = now_ms() if now is None else now
    section = cleanable_section(partition_log, now)
    if section is None or section.dirty_bytes == 0:
        return None
    if not force and not _should_clean(partition_log, section, now):
        return None
    truncations = partition_log.log_segments.truncations
    throttle = _Throttle(io_max_bytes_per_second)
    offsets, map_read = _build_map(section, max_map_entries, throttle)
    map_end = offsets.end_offset
    result = CleanResult(section.first_dirty, map_end, bytes_read=map_read, keys=len(offsets))
    segments = list(section.segments)
    bases_after = [segment.base_offset for segment in segments[1:]] + [section.end_offset]
    count = next((number + 1 for number, after in enumerate(bases_after) if after >= map_end), len(segments))
    segments, bases_after = segments[:count], bases_after[:count]
    producer_last = _producer_last_batches(partition_log)
    directory = partition_log.directory
    config = partition_log.config
    cleaned: list[tuple[list[Segment], Segment, int]] = []
    writer: _GroupWriter | None = None
    try:
        for number, segment in enumerate(segments):
            # Groups are cut by what has been written so far plus the next segment's size before cleaning
            # (an upper bound of what it adds), so segments that clean down to little merge into one, up to
            # segment.bytes, and the index's relative offsets stay below 2**31.
            if writer is not None and (writer.written + segment.committed_position > config.segment_bytes
                                       or bases_after[number] - 1 - writer.base_offset > 0x7FFFFFFF):
                group = writer.group
                cleaned.append((group, writer.finish(), bases_after[number - 1]))
                writer = None
            if writer is None:
                writer = _GroupWriter(directory, segment.base_offset, config)
            writer.add(segment, offsets, producer_last, now, throttle, result)
        if writer is not None:
            cleaned.append((writer.group, writer.finish(), bases_after[len(segments) - 1]))
            writer = None
    except BaseException:
        if writer is not None:
            writer.discard()
        for _, new, _ in cleaned:
            new.close(unlink=True)
        raise
    failpoint("clean.after_cleaned_written")
    result.segments_before, result.segments_after = len(segments), len(cleaned)
    result.bytes_written = sum(new.committed_position for _, new, _ in cleaned)
    aborted = _swap(partition_log, cleaned, truncations, now)
    if aborted is not None:
        result.aborted = aborted
        for _, new, _ in cleaned:
            new.close(unlink=True)
        log.info("%s-%d: cleaning dropped: %s", partition_log.topic, partition_log.partition, aborted)
        return result
    _write_cleaner_checkpoint(directory, map_end)
    failpoint("clean.after_checkpoint")
    result.seconds = time.perf_counter() - started
    partition_log.stats["cleanings"] = partition_log.stats.get("cleanings", 0) + 1
    # The dirty bytes the map read are Kafka's "Indexed" figure: benchmarks.compaction_vs_kafka parses this line.
    log.info("%s-%d: cleaned offsets [%d, %d) in %.3f s: %d segment(s) -> %d, %d -> %d bytes (%d dirty bytes mapped),"
             " %d keys, %d records and %d tombstones removed", partition_log.topic, partition_log.partition,
             section.segments[0].base_offset, map_end, result.seconds, result.segments_before, result.segments_after,
             result.bytes_read - map_read, result.bytes_written, map_read, result.keys, result.records_dropped,
             result.tombstones_dropped)
    return result


def _swap(partition_log, cleaned: list[tuple[list[Segment], Segment, int]], truncations: int, now: int) -> str | None:
    """Put the cleaned segments in place of the old ones, on disk (module docstring) and in the log's tuple.
    Returns why it gave up (the log changed under the cleaning), None once swapped."""
    directory = partition_log.directory
    log_segments = partition_log.log_segments
    with log_segments.io_lock:
        with log_segments.lock:
            if log_segments.truncations != truncations or partition_log.closed:
                return "the log was truncated or closed meanwhile"
            current = log_segments.all
            for group, _, _ in cleaned:
                if not all(segment in current for segment in group):
                    return "retention removed segments meanwhile"
        write_entries(directory / filenames.SWAP_MANIFEST, [(new.base_offset, end) for _, new, end in cleaned])
        failpoint("clean.after_swap_manifest")
        for group, new, _ in cleaned:
            for segment in group:
                segment.rename_deleted(keep_txn_index=True)
                failpoint("clean.after_old_renamed")
            targets = filenames.segment_paths(directory, new.base_offset)
            new.offset_index.rename(targets[1])
            new.time_index.rename(targets[2])
            os.rename(new.log_path, targets[0])
            new.log_path = targets[0]
            failpoint("clean.after_cleaned_renamed")
        fsync_directory(directory)
        with log_segments.lock:
            log_segments.replace_groups_locked([(group, new) for group, new, _ in cleaned])
        failpoint("clean.before_manifest_removed")
        (directory / filenames.SWAP_MANIFEST).unlink()
        fsync_directory(directory)
    delay = partition_log.config.file_delete_delay_ms
    for group, _, _ in cleaned:
        log_segments.retire(group, now + delay)
    return None


# --- the threads ------------------------------------------------------------------------------------------------------


@dataclass
class CleanerMetrics:
    """Counters for the metrics and stats lines (any thread reads; cleaner threads write)."""

    cleanings: int = 0
    failures: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_dropped: int = 0
    last_seconds: float = 0.0
    last_keys: int = 0
    busy_seconds: float = 0.0
    per_log: dict = field(default_factory=dict)


class LogCleaner:
    """``log.cleaner.threads`` threads cleaning the dirtiest due log, then sleeping ``log.cleaner.backoff.ms``
    when none is due. ``logs``: a callable returning the data dir's logs. A log whose cleaning fails is
    logged and retried after the backoff, never marked uncleanable for good (KAFKA-19895)."""

    def __init__(self, logs, config: CleanerConfig) -> None:
        self._logs = logs
        self.config = config
        self.metrics = CleanerMetrics()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._busy: set = set()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for number in range(self.config.threads):
            thread = threading.Thread(target=self._run, name=f"copyless-cleaner-{number}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop after the cleanings under way (blocking)."""
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join()
        self._threads.clear()

    def wake(self) -> None:
        """Look for work now rather than after the backoff (tests, a config change)."""
        self._wake.set()

    def _pick(self, now: int):
        best = None
        best_ratio = -1.0
        ratios = {}
        for partition_log in list(self._logs()):
            if "compact" not in partition_log.config.cleanup_policy:
                continue
            key = (partition_log.topic, partition_log.partition)
            if partition_log in self._busy:
                ratios[key] = self.metrics.per_log.get(key, 0.0)
                continue
            section = cleanable_section(partition_log, now)
            ratios[key] = 0.0 if section is None else section.ratio
            if section is None or not _should_clean(partition_log, section, now):
                continue
            if section.ratio > best_ratio:
                best, best_ratio = partition_log, section.ratio
        # Replaced whole (never mutated), so a scrape on the loop thread reads one consistent dict and logs
        # deleted meanwhile drop out.
        self.metrics.per_log = ratios
        return best

    def run_once(self) -> CleanResult | None:
        """Clean the dirtiest due log, if any (a cleaner thread or a test)."""
        now = now_ms()
        with self._lock:
            partition_log = self._pick(now)
            if partition_log is None:
                return None
            self._busy.add(partition_log)
        started = time.perf_counter()
        try:
            result = clean_log(partition_log, max_map_entries=self.config.max_map_entries, now=now,
                               io_max_bytes_per_second=self.config.io_max_bytes_per_second)
        except Exception:
            self.metrics.failures += 1
            log.exception("cleaning %s-%d failed; it is tried again after the backoff", partition_log.topic,
                          partition_log.partition)
            return None
        finally:
            self.metrics.busy_seconds += time.perf_counter() - started
            with self._lock:
                self._busy.discard(partition_log)
        if result is not None and result.aborted is None:
            metrics = self.metrics
            metrics.cleanings += 1
            metrics.bytes_read += result.bytes_read
            metrics.bytes_written += result.bytes_written
            metrics.records_dropped += result.records_dropped
            metrics.last_seconds = result.seconds
            metrics.last_keys = result.keys
        return result

    def _run(self) -> None:
        while not self._stop.is_set():
            result = None
            try:
                result = self.run_once()
            except Exception:  # the thread must outlive any one bad log
                log.exception("log cleaner pass failed")
            if result is None:
                self._wake.wait(self.config.backoff_ms / 1000)
                self._wake.clear()
