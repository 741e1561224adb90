"""PartitionLog against an in-memory model, driven by hypothesis.

The model is the list of records the log acknowledged, each with its offset and timestamp, plus the log start
offset. Rules append real RecordBatch v2 bytes (several batches per append, compressed or not, CreateTime or
LogAppendTime), read at random offsets and sizes, look up timestamps, roll, apply retention, flush, close and
reopen cleanly, and crash (drop everything without flushing, then truncate the active segment at a random
byte or overwrite its tail with garbage or zeros, never below what was flushed; garbage confined to the last
batch's base offset is not written: nothing on disk can tell it from the offset written there).

The second machine runs the same rules with the pre-fault chases writing zeros right behind the appends
(no margin, page-sized chunks) instead of a megabyte past them, so the warm thread's zeros race every append.

Invariants: offsets are contiguous from log_start_offset to log_end_offset; every read returns the model's
records under Kafka's fetch rules; timestamp lookups match Kafka's rule; after a crash the reopened log
equals a prefix of the model that contains everything flushed.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from copyless.broker.storage import LogConfig, LogManager, OffsetOutOfRangeError
from copyless.broker.storage import prefault as prefault_module
from copyless.protocol.records import iter_batches, read_header
from tests.support.batches import build_batch, records_of
from tests.support.blocking_appends import append_blocking, roll_blocking
from tests.support.log_reads import read_records

record_value = st.binary(min_size=0, max_size=300)
batch_spec = st.tuples(st.lists(record_value, min_size=1, max_size=5), st.integers(-50, 200),
                       st.sampled_from([0, 0, 0, 1, 3, 4]))


class PartitionLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="copyless-stateful-")
        self.manager: LogManager | None = None
        self.records: list[tuple[int, bytes, int]] = []  # (offset, value, timestamp) of acknowledged records
        self.log_start_offset = 0
        self.flushed_offset = 0
        self.clock_ms = 1_000_000
        self.held: list = []  # (FileSlice, bytes it held when read): in-flight sends pin their segments

    # --- setup / teardown ---------------------------------------------------------------------------------

    @initialize(segment_bytes=st.sampled_from([2048, 6000, 16384]),
                index_interval_bytes=st.sampled_from([0, 300, 4096]),
                segment_index_bytes=st.sampled_from([24, 120, 4096]))
    def start(self, segment_bytes, index_interval_bytes, segment_index_bytes) -> None:
        self.config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=index_interval_bytes,
                                segment_index_bytes=segment_index_bytes, retention_ms=None,
                                file_delete_delay_ms=0)
        self._open()
        self.log = self.manager.create_log("model", 0, self.config)

    def _open(self) -> None:
        self.manager = LogManager(self.root, default_config=self.config, background_interval_ms=None)
        self.manager.startup()
        self.log = self.manager.get_log("model", 0)

    def teardown(self) -> None:
        self._release_held()
        if self.manager is not None and self.manager.started:
            self.manager.shutdown()
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def log_end_offset(self) -> int:
        return self.records[-1][0] + 1 if self.records else self.log_start_offset

    # --- rules ------------------------------------------------------------------------------------------

    @rule(batches=st.lists(batch_spec, min_size=1, max_size=3), append_time=st.booleans())
    def append(self, batches, append_time) -> None:
        data = b""
        expected = []
        for values, clock_step, codec in batches:
            self.clock_ms += clock_step
            timestamps = [self.clock_ms + (i * 37 % 11) - 5 for i in range(len(values))]
            data += build_batch(values, timestamps, codec=codec)
            expected.append((values, timestamps))
        append_time_ms = self.clock_ms + 1 if append_time else None
        result = append_blocking(self.log, data, log_append_time_ms=append_time_ms)
        assert result.base_offset == self.log_end_offset
        offset = result.base_offset
        for values, timestamps in expected:
            for value, timestamp in zip(values, timestamps, strict=True):
                self.records.append((offset, value, append_time_ms if append_time else timestamp))
                offset += 1
        assert result.last_offset == offset - 1
        assert result.log_append_time_ms == (append_time_ms if append_time else -1)

    @rule(count=st.integers(1, 25), value_bytes=st.integers(0, 900), per_batch=st.integers(1, 4),
          codec=st.sampled_from([0, 0, 1, 4]), seed=st.integers(0, 1 << 16))
    def append_bulk(self, count, value_bytes, per_batch, codec, seed) -> None:
        """Many batches at once (cheap for hypothesis to generate): fills and rolls segments."""
        rng = random.Random(seed)
        for _ in range(count):
            values = [rng.randbytes(rng.randint(0, value_bytes)) for _ in range(per_batch)]
            self.clock_ms += rng.randint(-20, 100)
            timestamps = [self.clock_ms + rng.randint(-10, 10) for _ in values]
            batch = build_batch(values, timestamps, codec=codec)
            if len(batch) > self.config.segment_bytes:
                with pytest.raises(ValueError):  # a batch never straddles segments: too big is refused
                    append_blocking(self.log, batch)
                continue
            result = append_blocking(self.log, batch)
            assert result.base_offset == self.log_end_offset
            for offset, (value, timestamp) in enumerate(zip(values, timestamps, strict=True), start=result.base_offset):
                self.records.append((offset, value, timestamp))
            assert result.last_offset == self.records[-1][0]

    @precondition(lambda self: self.records)
    @rule(data=st.data(), max_bytes=st.integers(1, 20_000), min_one_message=st.booleans())
    def read(self, data, max_bytes, min_one_message) -> None:
        offset = data.draw(st.integers(self.log_start_offset, self.log_end_offset), label="offset")
        result = self.log.read(offset, max_bytes, min_one_message=min_one_message)
        assert result.high_watermark == self.log.high_watermark  # replication's; only the retention rule sets it here
        assert result.log_start_offset == self.log_start_offset
        if offset == self.log_end_offset:
            assert result.slice is None
            return
        if result.slice is None:
            assert not min_one_message
            first = self._first_batch_size(offset)
            assert first > max_bytes
            return
        with result.slice as region:
            raw = region.read_bytes()
            at_segment_end = region.ends_segment
        first_size = read_header(raw).size
        if first_size > max_bytes:
            assert min_one_message and len(raw) == first_size
        else:
            assert len(raw) <= max_bytes
        # Whole batches only, and every batch that fits: the next one would pass max_bytes or lies in the
        # next segment.
        headers = [header for _, header in iter_batches(raw)]
        assert sum(header.size for header in headers) == len(raw)
        following = next(self.log.batch_headers(headers[-1].last_offset + 1), None)
        assert following is None or at_segment_end or len(raw) + following.size > max_bytes
        got = [(r.offset, r.value, r.timestamp) for r in records_of(raw)]
        assert got, "the first batch is always whole"
        assert got[0][0] <= offset <= got[-1][0]
        start = offset - self.log_start_offset - (offset - got[0][0])
        assert got == self.records[start:start + len(got)]

    def _first_batch_size(self, offset: int) -> int:
        for header in self.log.batch_headers(offset):
            return header.size
        raise AssertionError(f"no batch holds offset {offset}")

    @precondition(lambda self: self.records and len(self.held) < 4)
    @rule(data=st.data())
    def hold_slice(self, data) -> None:
        """Keep a FileSlice as an in-flight sendfile would; retention must not pull the file from under it."""
        offset = data.draw(st.integers(self.log_start_offset, self.log_end_offset - 1), label="offset")
        region = self.log.read(offset, 4096).slice
        self.held.append((region, region.read_bytes()))

    @precondition(lambda self: self.held)
    @rule()
    def release_held(self) -> None:
        self._release_held()

    def _release_held(self) -> None:
        for region, expected in self.held:
            assert region.read_bytes() == expected, "a pinned region changed under its reader"
            region.release()
        self.held = []

    @rule(data=st.data())
    def read_out_of_range(self, data) -> None:
        offset = data.draw(st.one_of(st.integers(-5, self.log_start_offset - 1),
                                     st.integers(self.log_end_offset + 1, self.log_end_offset + 5)), label="offset")
        try:
            self.log.read(offset, 100)
        except OffsetOutOfRangeError as exc:
            assert exc.log_end_offset == self.log_end_offset
        else:
            raise AssertionError(f"read({offset}) outside [{self.log_start_offset}, {self.log_end_offset}]")

    @rule(data=st.data())
    def timestamp_lookup(self, data) -> None:
        if self.records:
            target = data.draw(st.sampled_from([t for _, _, t in self.records]) | st.integers(0, self.clock_ms + 10))
        else:
            target = data.draw(st.integers(0, self.clock_ms + 10))
        assert self.log.offset_for_timestamp(target) == self._expected_timestamp_lookup(target)

    def _expected_timestamp_lookup(self, target: int):
        """Kafka's ListOffsets rule: the first segment whose largest timestamp reaches the target, then the
        first record in it (by offset) whose timestamp does."""
        bases = self.log.segment_base_offsets() + [1 << 62]
        for low, high in zip(bases, bases[1:], strict=False):
            in_segment = [(o, t) for o, _, t in self.records if low <= o < high]
            if in_segment and max(t for _, t in in_segment) >= target:
                return next((o, t) for o, t in in_segment if t >= target)
        return None

    @rule()
    def roll(self) -> None:
        before = self.log.segment_base_offsets()
        segment = roll_blocking(self.log)
        if segment is None:
            assert self.log.segments[-1].size_bytes == 0
        else:
            assert self.log.segment_base_offsets() == before + [self.log_end_offset]

    @rule(retention_bytes=st.integers(0, 40_000), data=st.data())
    def retention(self, retention_bytes, data) -> None:
        # Let the io thread finish renames and seals first: what retention may take depends on them, and the
        # machine must be deterministic for hypothesis to replay it. (States with that work still pending at
        # a crash are the subprocess kill tests' job.)
        self.manager.wait_for_background()
        # Replication's high watermark, anywhere it could be (it only moves forward): retention deletes only
        # segments wholly below it.
        high_watermark = data.draw(st.integers(self.log.high_watermark, self.log_end_offset), label="high_watermark")
        self.log.set_high_watermark(high_watermark)
        self.log.config = LogConfig(**{**self.config.__dict__, "retention_bytes": retention_bytes})
        sizes_before = [segment.size_bytes for segment in self.log.segments]
        deleted = self.manager.run_retention()
        sizes_after = [segment.size_bytes for segment in self.log.segments]
        assert sizes_after == sizes_before[deleted:]
        assert self.log.log_start_offset <= high_watermark, "retention deleted records above the high watermark"
        if deleted:
            assert sum(sizes_before) - sum(sizes_before[:deleted]) >= retention_bytes or len(sizes_after) == 1
        if len(sizes_after) > 1 and self.log.segment_base_offsets()[1] <= high_watermark:
            assert sum(sizes_after) - sizes_after[0] < retention_bytes, "retention stopped too early"
        self.log.config = self.config
        self.log_start_offset = self.log.log_start_offset
        assert self.log_start_offset == self.log.segment_base_offsets()[0]
        self.records = [r for r in self.records if r[0] >= self.log_start_offset]
        self.flushed_offset = max(self.flushed_offset, self.log_start_offset)

    @rule()
    def flush(self) -> None:
        assert self.log.flush().result(timeout=60) == self.log_end_offset
        self.flushed_offset = self.log_end_offset

    @rule()
    def checkpoint(self) -> None:
        self.manager.checkpoint_recovery_points()

    @rule()
    def close_and_reopen(self) -> None:
        self._release_held()
        self.manager.shutdown()
        self._open()
        assert self.manager.startup_stats["clean"]
        self.flushed_offset = self.log_end_offset
        self._check_whole_log()

    @rule(mode=st.sampled_from(["none", "truncate", "garbage", "zeros"]), data=st.data())
    def crash(self, mode, data) -> None:
        self._release_held()
        self.manager.wait_for_background()  # deterministic flushed positions (see retention)
        active = self.log.segments[-1]
        flushed_offset = self.log.flushed_offset
        self.manager.abandon()
        path = active.log_path
        committed, flushed = active.committed_position, active.flushed_position
        assert flushed_offset >= self.flushed_offset
        if mode != "none" and committed > flushed:
            cut = data.draw(st.integers(flushed, committed), label="cut")
            if mode == "truncate":
                os.truncate(path, cut)
            else:
                length = data.draw(st.integers(1, 200), label="length")
                junk = bytes(length) if mode == "zeros" else random.Random(cut).randbytes(length)
                if mode == "garbage" and self._inside_last_base_offset(path, committed, cut, length):
                    # The one garbling no log can see: the CRC does not cover a batch's base offset, and no
                    # batch or segment after the last one bounds it (docs/recovery.md). Every other byte of
                    # it is checked (tests/storage/test_storage_recovery_offsets.py).
                    junk = b""
                with open(path, "r+b") as handle:
                    handle.seek(cut)
                    handle.write(junk)
        self._open()
        assert not self.manager.startup_stats["clean"]
        recovered_end = self.log.log_end_offset
        assert flushed_offset <= recovered_end <= self.log_end_offset, (flushed_offset, recovered_end)
        self.records = [r for r in self.records if r[0] < recovered_end]
        assert self.log_end_offset == recovered_end
        self.flushed_offset = recovered_end  # recovery fdatasyncs what it kept
        self._check_whole_log()

    @staticmethod
    def _inside_last_base_offset(path, committed: int, cut: int, length: int) -> bool:
        with open(path, "rb") as handle:
            data = handle.read(committed)
        starts = [position for position, _ in iter_batches(data)]
        return bool(starts) and starts[-1] <= cut and cut + length <= starts[-1] + 8

    # --- invariants ---------------------------------------------------------------------------------------

    def _check_whole_log(self) -> None:
        got = [(r.offset, r.value, r.timestamp) for r in read_records(self.log)]
        assert got == self.records
        headers = list(self.log.batch_headers(self.log.log_start_offset))
        assert [h.base_offset for h in headers[1:]] == [h.next_offset for h in headers[:-1]]

    @invariant()
    def offsets_agree(self) -> None:
        if self.manager is None:
            return
        assert self.log.log_start_offset == self.log_start_offset
        assert self.log.log_end_offset == self.log_end_offset
        assert self.log_start_offset <= self.log.high_watermark <= self.log_end_offset
        assert self.log_start_offset <= self.log.recovery_point <= self.log.flushed_offset <= self.log_end_offset
        bases = self.log.segment_base_offsets()
        assert bases == sorted(bases) and bases[0] == self.log_start_offset
        for segment in self.log.segments:
            assert segment.size_bytes <= max(self.config.segment_bytes, segment.size_bytes)
            assert segment.flushed_position <= segment.committed_position <= segment.written_position


PartitionLogMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("COPYLESS_STATEFUL_EXAMPLES", "60")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
test_partition_log_matches_model = PartitionLogMachine.TestCase


class ZerosRacingAppendsMachine(PartitionLogMachine):
    """The same model with zeros claimed at the first page past the appends' published end."""

    def __init__(self) -> None:
        super().__init__()
        self.saved = (prefault_module.ZERO_MARGIN_BYTES,
                      prefault_module.ZERO_MARGIN_APPENDS, prefault_module.ZERO_MARGIN_MS,
                      prefault_module.ZERO_CHUNK_BYTES)
        prefault_module.ZERO_MARGIN_BYTES = 0
        prefault_module.ZERO_MARGIN_APPENDS = 0
        prefault_module.ZERO_MARGIN_MS = 0
        prefault_module.ZERO_CHUNK_BYTES = os.sysconf("SC_PAGE_SIZE")

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            (prefault_module.ZERO_MARGIN_BYTES,
             prefault_module.ZERO_MARGIN_APPENDS, prefault_module.ZERO_MARGIN_MS,
             prefault_module.ZERO_CHUNK_BYTES) = self.saved


ZerosRacingAppendsMachine.TestCase.settings = PartitionLogMachine.TestCase.settings
test_partition_log_with_zeros_racing_the_appends = ZerosRacingAppendsMachine.TestCase
