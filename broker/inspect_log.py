"""``copyless inspect``: look inside segments and indexes, and check a whole data dir offline (Kafka's
``kafka-dump-log`` and the checks ``kafka-log-dirs`` implies).

    copyless inspect DIR/orders-0/00000000000000000000.log [--indexes]
    copyless inspect --data-dir DIR

A segment is read with the storage layer's own code: ``segment.scan_headers`` walks the batch headers,
``records.validate_batch`` checks each batch (framing, magic, CRC-32C, count), ``index_search`` reads the
index entries. One line per batch (base and last offset, count, leader epoch, producer id / epoch / base and
last sequence, timestamps and their type, codec, transactional / control, position, size, CRC verified, the
tombstones it holds and the delete horizon a cleaning stored in it, KIP-534's, for compacted logs); with
``--indexes`` one line per offset-index and time-index entry, each checked against the batches: an offset
entry must name a batch's base offset and that batch's position, a time entry a batch's base offset, both in
increasing order. Past the last whole batch, a preallocated active segment holds zeros; anything else there
is reported (a torn write or corruption), as is every batch whose CRC does not match.

The data dir check adds, per partition: segments contiguous (each one's base offset the previous one's next
offset, the first batch of each at its file's base offset), ``partition.metadata`` readable; and for the dir:
``meta.properties``, ``topics.json`` (the partitions it lists against the directories), the recovery-point,
high-watermark and log-start-offset checkpoints (readable, each offset within its log) and each partition's
``leader-epoch-checkpoint`` (readable, increasing). Findings are ERROR (exit status 1) or
WARNING (a state the broker handles itself at start-up: a log not in ``topics.json``, a prepared segment
holding batches, a running broker writing the dir meanwhile).

Read-only: files are opened O_RDONLY and nothing is created, renamed or locked for longer than a probe of
``.lock``. Blocking; a command-line tool, never run by the broker.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path

from copyless.broker.storage import filenames, index_search
from copyless.broker.storage.checkpoint import read_checkpoint, read_entries
from copyless.broker.storage.cleaner import read_cleaner_checkpoint
from copyless.broker.storage.compaction import count_tombstones, delete_horizon_of
from copyless.broker.storage.segment import scan_headers
from copyless.broker.storage.segment_recovery import offsets_problem
from copyless.protocol.records import BatchHeader, InvalidBatchError, validate_batch

__all__ = ["Finding", "SegmentReport", "inspect_segment", "check_data_dir", "add_parsers", "main"]

CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
ERROR, WARNING = "ERROR", "WARNING"
# How far past the last whole batch the tail is checked for zeros. A torn write or a batch whose header was
# damaged starts right there (the header scan stopped at it), so a short probe finds both; the rest of the
# preallocated tail (up to the segment's 1 GiB) is left unread.
TAIL_PROBE_BYTES = 64 << 10
# An index is read in chunks up to its first unused (all-zero) entry, never to its preallocated end (10 MiB).
_INDEX_CHUNK_BYTES = 64 << 10
NO_TIMESTAMP = -1


@dataclass(frozen=True)
class Finding:
    severity: str  # ERROR | WARNING
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.severity} {self.where}: {self.message}"


@dataclass
class BatchInfo:
    position: int
    header: BatchHeader
    crc_ok: bool
    problem: str | None  # validate_batch's reason when the batch does not check out
    tombstones: int | None = None  # records with a null value (None: the records could not be read)


@dataclass
class SegmentReport:
    path: Path
    base_offset: int | None
    size_bytes: int
    batches: list[BatchInfo] = field(default_factory=list)
    end_position: int = 0  # end of the last whole batch
    tail_zero: bool = True  # the bytes past end_position are all zeros
    findings: list[Finding] = field(default_factory=list)
    offset_entries: list[tuple[int, int]] = field(default_factory=list)
    time_entries: list[tuple[int, int]] = field(default_factory=list)

    @property
    def next_offset(self) -> int | None:
        return self.batches[-1].header.next_offset if self.batches else self.base_offset

    def error(self, message: str, where: str | None = None) -> None:
        self.findings.append(Finding(ERROR, where or str(self.path), message))

    def warning(self, message: str, where: str | None = None) -> None:
        self.findings.append(Finding(WARNING, where or str(self.path), message))


# --- one segment ------------------------------------------------------------------------------------------------


def _zeros_from(fd: int, start: int, end: int) -> int | None:
    """The first position in [start, end) holding a non-zero byte, or None when all are zeros (one pread:
    callers bound the range by TAIL_PROBE_BYTES)."""
    chunk = os.pread(fd, end - start, start) if end > start else b""
    stripped = chunk.lstrip(b"\0")
    return start + len(chunk) - len(stripped) if stripped else None


def _read_entries(path: Path, entry, unpack: Callable) -> list[tuple[int, int]] | None:
    """The used entries of an index file (a preallocated active index ends in all-zero entries, never a real
    one: no entry is written for a segment's first batch). None when the file is missing."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    entries: list[tuple[int, int]] = []
    chunk_entries = _INDEX_CHUNK_BYTES // entry.size
    position = 0
    try:
        while True:
            data = os.pread(fd, chunk_entries * entry.size, position)
            count = len(data) // entry.size
            for slot in range(count):
                values = unpack(data, slot)
                if values == (0, 0):
                    return entries
                entries.append(values)
            if count < chunk_entries:
                return entries
            position += count * entry.size
    finally:
        os.close(fd)


def inspect_segment(log_path: Path, *, indexes: bool = False, next_segment_base: int | None = None) -> SegmentReport:
    """Read one segment (and with ``indexes`` its .index and .timeindex) and check it; ``next_segment_base``,
    the base offset of the segment after it, bounds its offsets. Blocking."""
    log_path = Path(log_path)
    parsed = filenames.parse_segment_file(log_path.name)
    base_offset = parsed[0] if parsed is not None and parsed[1] == "log" else None
    fd = os.open(log_path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        report = SegmentReport(log_path, base_offset, size)
        expected = base_offset
        for position, header in scan_headers(fd, 0, size):
            data = os.pread(fd, header.size, position)
            problem = None
            try:
                validate_batch(data, cleaned=True)
            except InvalidBatchError as exc:
                problem = str(exc)
            crc_ok = problem is None or not problem.startswith("bad crc")
            tombstones = None
            if problem is None:
                try:
                    tombstones = count_tombstones(data, header)
                except InvalidBatchError as exc:
                    problem = str(exc)
            report.batches.append(BatchInfo(position, header, crc_ok, problem, tombstones))
            if problem is not None:
                report.error(f"batch at position {position} (offsets {header.base_offset}..{header.last_offset}): "
                             f"{problem}")
            # Forward gaps are compaction's (offsets are kept, records dropped); a batch going back is not.
            if expected is not None and header.base_offset < expected:
                what = "the segment's base offset" if position == 0 else "the previous batch's next offset"
                report.error(f"batch at position {position} starts at offset {header.base_offset}, not at "
                             f"{expected} ({what})")
            elif base_offset is not None:
                # The CRC does not cover the base offset: where the batch sits is the only check of it, the
                # one start-up's recovery makes (segment_recovery.offsets_problem).
                misplaced = offsets_problem(header.base_offset, header.last_offset, header.base_offset,
                                            base_offset, next_segment_base)
                if misplaced is not None:
                    report.error(f"batch at position {position}: {misplaced}")
            expected = header.next_offset
            report.end_position = position + header.size
        garbage = _zeros_from(fd, report.end_position, min(size, report.end_position + TAIL_PROBE_BYTES))
        if garbage is not None:
            report.tail_zero = False
            report.error(f"bytes at position {garbage} after the last whole batch (which ends at "
                         f"{report.end_position}) are not a batch: a torn write or corruption")
    finally:
        os.close(fd)
    if indexes and base_offset is not None:
        _check_indexes(report, base_offset)
    return report


def _check_indexes(report: SegmentReport, base: int) -> None:
    directory = report.path.parent
    starts = {info.position: info.header for info in report.batches}
    base_offsets = {info.header.base_offset for info in report.batches}
    end = report.next_offset
    offset_path = filenames.index_path(directory, base)
    entries = _read_entries(offset_path, index_search.OFFSET_ENTRY,
                            lambda data, slot: index_search.offset_entry(data, slot))
    if entries is None:
        report.warning("no offset index (start-up rebuilds it)", str(offset_path))
        entries = []
    report.offset_entries = entries
    previous = -1
    for slot, (relative, position) in enumerate(entries):
        where = f"{offset_path} entry {slot}"
        header = starts.get(position)
        if header is None:
            report.error(f"position {position} (offset {base + relative}) is not a batch start", where)
        elif header.base_offset != base + relative:
            report.error(f"offset {base + relative} at position {position}, but the batch there starts at "
                         f"offset {header.base_offset}", where)
        if relative <= previous:
            report.error(f"relative offset {relative} does not increase (previous {previous})", where)
        previous = relative
    time_path = filenames.time_index_path(directory, base)
    times = _read_entries(time_path, index_search.TIME_ENTRY, lambda data, slot: index_search.time_entry(data, slot))
    if times is None:
        report.warning("no time index (start-up rebuilds it)", str(time_path))
        times = []
    report.time_entries = times
    previous_timestamp, previous_offset = NO_TIMESTAMP - 1, -1
    for slot, (timestamp, relative) in enumerate(times):
        where = f"{time_path} entry {slot}"
        offset = base + relative
        if end is not None and not base <= offset < max(end, base + 1):
            report.error(f"offset {offset} lies outside the segment [{base}, {end})", where)
        elif offset not in base_offsets:
            report.error(f"offset {offset} is not a batch's base offset", where)
        if timestamp <= previous_timestamp or relative < previous_offset:
            report.error(f"entry ({timestamp}, {relative}) does not follow ({previous_timestamp}, {previous_offset})",
                         where)
        previous_timestamp, previous_offset = timestamp, relative


# --- a data dir -------------------------------------------------------------------------------------------------


def _locked_by_broker(data_dir: Path) -> bool:
    """True when a broker holds the data dir's ``.lock`` now (a probe; released at once)."""
    path = data_dir / filenames.LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)


@dataclass
class PartitionReport:
    topic: str
    partition: int
    segments: list[SegmentReport] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def log_start_offset(self) -> int | None:
        return self.segments[0].base_offset if self.segments else None

    @property
    def log_end_offset(self) -> int | None:
        return self.segments[-1].next_offset if self.segments else None


def _check_producer_state_files(directory: Path, report: PartitionReport) -> None:
    """Producer snapshots read back (version, CRC); aborted-transaction indexes hold whole entries (a torn
    tail is rewritten when the partition loads: a warning)."""
    from copyless.broker import producer_snapshot
    from copyless.broker.storage import txn_index

    for offset in producer_snapshot.snapshot_offsets(directory):
        try:
            producer_snapshot.read(directory, offset)
        except (producer_snapshot.CorruptSnapshotError, OSError) as exc:
            report.findings.append(Finding(ERROR, str(producer_snapshot.snapshot_path(directory, offset)),
                                           f"unreadable ({exc}): start-up deletes it and uses an older one"))
    for base in txn_index.index_bases(directory):
        path = txn_index.txn_index_path(directory, base)
        if txn_index.read(path)[1]:
            report.findings.append(Finding(WARNING, str(path), "a torn last entry: rewritten at start-up"))


def check_partition(directory: Path, topic: str, partition: int) -> PartitionReport:
    report = PartitionReport(topic, partition)
    segments = []
    for entry in sorted(directory.iterdir()):
        parsed = filenames.parse_segment_file(entry.name)
        if parsed is not None and parsed[1] == "log":
            segments.append(entry)
        elif entry.name.startswith(filenames.PREPARED_PREFIX) and entry.name.endswith(filenames.LOG_SUFFIX):
            prepared = inspect_segment(entry)
            if prepared.batches:
                report.findings.append(Finding(WARNING, str(entry), f"a prepared segment holding "
                                               f"{len(prepared.batches)} batch(es) (offsets from "
                                               f"{prepared.batches[0].header.base_offset}): start-up adopts it"))
    epochs = directory / filenames.LEADER_EPOCH_CHECKPOINT
    if epochs.exists():
        try:
            lines = read_entries(epochs) or []
            pairs = [tuple(int(part) for part in line.split()) for line in lines]
            if any(len(pair) != 2 for pair in pairs) or any(
                    not (a[0] < b[0] and a[1] < b[1]) for a, b in pairwise(pairs)):
                raise ValueError(f"entries {pairs} are not (epoch, start offset) pairs in increasing order")
        except (ValueError, UnicodeDecodeError) as exc:
            report.findings.append(Finding(ERROR, str(epochs), f"unreadable: {exc}"))
    metadata = directory / "partition.metadata"
    if metadata.exists():
        text = metadata.read_text(errors="replace")
        if "topic_id:" not in text:
            report.findings.append(Finding(ERROR, str(metadata), "no topic_id line"))
    _check_producer_state_files(directory, report)
    cleaned_to = read_cleaner_checkpoint(directory) or -1
    previous: SegmentReport | None = None
    bases = [parsed[0] for parsed in map(filenames.parse_segment_file, (path.name for path in segments))
             if parsed is not None]
    for number, path in enumerate(segments):
        segment = inspect_segment(path, indexes=True,
                                  next_segment_base=bases[number + 1] if number + 1 < len(bases) else None)
        report.segments.append(segment)
        report.findings.extend(segment.findings)
        # A gap below the cleaner's checkpointed offset is compaction's (a cleaned segment's last records
        # removed); any other gap, or an overlap, is a broken chain.
        if previous is not None and previous.next_offset != segment.base_offset and not (
                previous.next_offset is not None and segment.base_offset is not None
                and previous.next_offset < segment.base_offset <= cleaned_to):
            report.findings.append(Finding(ERROR, str(path), f"starts at offset {segment.base_offset}, but the "
                                           f"previous segment ends before offset {previous.next_offset}"))
        previous = segment
    return report


def _read_properties(path: Path) -> dict[str, str]:
    return {key.strip(): value.strip() for key, _, value in
            (line.partition("=") for line in path.read_text().splitlines() if "=" in line and not line.startswith("#"))}


def check_data_dir(data_dir: Path) -> tuple[list[PartitionReport], list[Finding]]:
    """Every partition of ``data_dir`` and the dir's own files (module docstring). Blocking."""
    data_dir = Path(data_dir)
    findings: list[Finding] = []
    if not data_dir.is_dir():
        return [], [Finding(ERROR, str(data_dir), "not a directory")]
    if _locked_by_broker(data_dir):
        findings.append(Finding(WARNING, str(data_dir), "a broker is running on this data dir: active segments "
                                "may change while they are read"))
    meta = data_dir / "meta.properties"
    if meta.exists():
        properties = _read_properties(meta)
        if not properties.get("cluster.id"):
            findings.append(Finding(ERROR, str(meta), "no cluster.id"))
    registry: dict[str, int] | None = None
    topics_file = data_dir / "topics.json"
    if topics_file.exists():
        try:
            registry = {str(t["name"]): int(t["partitions"]) for t in json.loads(topics_file.read_bytes())["topics"]}
        except (ValueError, KeyError, TypeError) as exc:
            findings.append(Finding(ERROR, str(topics_file), f"not a topic registry: {exc}"))
    partitions = []
    for entry in sorted(data_dir.iterdir()):
        if not entry.is_dir():
            continue
        parsed = filenames.parse_partition_dir(entry.name)
        if parsed is None:
            continue
        report = check_partition(entry, *parsed)
        if registry is not None and not 0 <= parsed[1] < registry.get(parsed[0], 0):
            report.findings.append(Finding(WARNING, str(entry), "not in topics.json (an interrupted create or "
                                           "delete, or a cluster broker's dir): start-up deletes it"))
        partitions.append(report)
    # Each per-dir checkpoint names, per partition, an offset that must lie within its log.
    ends = {(p.topic, p.partition): p.log_end_offset for p in partitions}
    starts = {(p.topic, p.partition): p.log_start_offset for p in partitions}
    for name, what in ((filenames.RECOVERY_POINT_CHECKPOINT, "recovery point"),
                       (filenames.HIGH_WATERMARK_CHECKPOINT, "high watermark"),
                       (filenames.LOG_START_OFFSET_CHECKPOINT, "log start offset")):
        checkpoint = data_dir / name
        if not checkpoint.exists():
            continue
        try:
            read_entries(checkpoint)  # strict: raises what read_checkpoint would only log
            points = read_checkpoint(checkpoint)
        except (ValueError, UnicodeDecodeError) as exc:
            findings.append(Finding(ERROR, str(checkpoint), f"unreadable: {exc}"))
            continue
        for key, offset in sorted(points.items()):
            end = ends.get(key)
            if end is not None and offset > end:
                findings.append(Finding(ERROR, str(checkpoint), f"{key[0]}-{key[1]}: {what} {offset} is past the "
                                        f"log end offset {end}"))
            elif name == filenames.LOG_START_OFFSET_CHECKPOINT and (start := starts.get(key)) is not None \
                    and offset < start:
                findings.append(Finding(ERROR, str(checkpoint), f"{key[0]}-{key[1]}: log start offset {offset} is "
                                        f"below the first segment's base offset {starts[key]}"))
    return partitions, findings


# --- the command ------------------------------------------------------------------------------------------------


def _bool(value: bool) -> str:
    return "true" if value else "false"


def batch_lines(report: SegmentReport) -> Iterator[str]:
    for info in report.batches:
        h = info.header
        yield (f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.records_count} "
               f"baseSequence: {h.base_sequence} lastSequence: {h.last_sequence} producerId: {h.producer_id} "
               f"producerEpoch: {h.producer_epoch} partitionLeaderEpoch: {h.partition_leader_epoch} "
               f"isTransactional: {_bool(h.is_transactional)} isControl: {_bool(h.is_control)} "
               f"position: {info.position} {'LogAppendTime' if h.is_log_append_time else 'CreateTime'}: "
               f"{h.max_timestamp} baseTimestamp: {h.base_timestamp} size: {h.size} magic: {h.magic} "
               f"compresscodec: {CODECS.get(h.codec, h.codec)} crc: {h.crc} isvalid: {_bool(info.problem is None)} "
               f"tombstones: {'?' if info.tombstones is None else info.tombstones} "
               f"deleteHorizonMs: {_horizon(h)}")


def _horizon(header: BatchHeader) -> str:
    """KIP-534's delete horizon of a cleaned batch holding tombstones (ms, and as UTC), or none."""
    horizon = delete_horizon_of(header)
    if horizon is None:
        return "none"
    return f"{horizon} ({datetime.fromtimestamp(horizon / 1000, UTC):%Y-%m-%dT%H:%M:%S.%fZ})"


def _print_segment(report: SegmentReport, indexes: bool, out) -> None:
    print(f"Dumping {report.path}", file=out)
    print(f"Log starting offset: {report.base_offset if report.base_offset is not None else '?'}", file=out)
    for line in batch_lines(report):
        print(line, file=out)
    tail = report.size_bytes - report.end_position
    if tail:
        print(f"{tail} bytes after the last batch: {'zeros (preallocated)' if report.tail_zero else 'NOT zeros'}",
              file=out)
    if indexes and report.base_offset is not None:
        print(f"Offset index {filenames.index_path(report.path.parent, report.base_offset)}: "
              f"{len(report.offset_entries)} entries", file=out)
        for relative, position in report.offset_entries:
            print(f"offset: {report.base_offset + relative} position: {position}", file=out)
        print(f"Time index {filenames.time_index_path(report.path.parent, report.base_offset)}: "
              f"{len(report.time_entries)} entries", file=out)
        for timestamp, relative in report.time_entries:
            print(f"timestamp: {timestamp} offset: {report.base_offset + relative}", file=out)


def run(args) -> int:
    out = sys.stdout
    if args.data_dir is not None:
        partitions, findings = check_data_dir(Path(args.data_dir))
        every = list(findings)
        for report in partitions:
            every.extend(report.findings)
            errors = sum(1 for f in report.findings if f.severity == ERROR)
            span = (f"offsets {report.log_start_offset}..{report.log_end_offset}" if report.segments else "no segments")
            print(f"{report.topic}-{report.partition}: {len(report.segments)} segment(s), "
                  f"{sum(len(s.batches) for s in report.segments)} batch(es), {span}: "
                  f"{'ok' if not errors else f'{errors} error(s)'}", file=out)
        for finding in every:
            print(finding, file=out)
        errors = sum(1 for f in every if f.severity == ERROR)
        print(f"checked {args.data_dir}: {len(partitions)} partition(s), "
              f"{sum(len(r.segments) for r in partitions)} segment(s), {errors} error(s), "
              f"{len(every) - errors} warning(s)", file=out)
        return 1 if errors else 0
    if not args.segment:
        print("copyless inspect: give a SEGMENT.log or --data-dir DIR", file=sys.stderr)
        return 2
    status = 0
    for path in args.segment:
        try:
            segment_report = inspect_segment(Path(path), indexes=args.indexes)
        except OSError as exc:
            print(f"ERROR {path}: {exc.strerror or exc}", file=out)
            status = 1
            continue
        _print_segment(segment_report, args.indexes, out)
        for finding in segment_report.findings:
            print(finding, file=out)
            if finding.severity == ERROR:
                status = 1
    return status


def add_parsers(subparsers) -> None:
    parser = subparsers.add_parser(
        "inspect", help="print a segment's batches and indexes, or check a data dir offline",
        description="Print the batches of segment files (and with --indexes their .index and .timeindex "
                    "entries, checked against the log), or check a whole data dir offline: segments "
                    "contiguous, CRCs, index entries, checkpoints. Exit status 1 when anything is wrong.")
    parser.add_argument("segment", nargs="*", metavar="SEGMENT.log", help="segment files to print")
    parser.add_argument("--indexes", action="store_true",
                        help="also print and check each segment's .index and .timeindex entries")
    parser.add_argument("--data-dir", metavar="DIR", help="check every partition of this data dir instead")
    parser.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="copyless")
    add_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["inspect", *(argv if argv is not None else sys.argv[1:])])
    return run(args)
