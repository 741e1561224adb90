"""A compacted PartitionLog against an in-memory model, driven by hypothesis: the storage state machine's
compaction steps.

The model is every record the log acknowledged, ``offset -> (key, value)`` (a None value is a tombstone), the
set of offsets the log still holds, and for each tombstone the clock of the first cleaning that could have
kept it. Rules append keyed batches (tombstones among them, compressed or not, over a small key space so
keys repeat), roll, move the high watermark, advance the clock, run a cleaning (``clean_log``, the cleaner's
synchronous entry point, with a map of a few keys so that passes end mid-log), crash in the middle of a
cleaning (the cleaner's ``clean.*`` failpoints raise instead of SIGKILL, the manager is abandoned as a kill
leaves it, and the log reopened), and close and reopen cleanly.

Invariants, through real reads of the segment files:
- offsets never change: every record read is the model's record at that offset, offsets strictly increase;
- per key, the latest record the log acknowledged is still there, unless it is a tombstone past its horizon
  (then nothing of the key is left); a tombstone never goes before ``delete.retention.ms`` after a cleaning
  that saw it;
- nothing at or above the high watermark a cleaning ran with, and nothing in the active segment, is removed;
- a read from any offset returns the first batch whose last offset reaches it (the next surviving batch);
- a crash before the swap's manifest leaves exactly the old log; after it, a log that satisfies all of the
  above and holds a subset of the old records (the kill -9 tests, test_compaction_crash.py, check the exact
  cleaned result at each point in a real killed process).
"""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from copyless.broker.storage import LogConfig, LogManager
from copyless.broker.storage import cleaner as cleaner_module
from copyless.broker.storage._failpoints import COMPACTION_POINTS
from copyless.broker.storage.cleaner import clean_log
from copyless.protocol.records import decode_records, iter_batches
from tests.support.batches import build_batch
from tests.support.blocking_appends import append_blocking, roll_blocking

DELETE_RETENTION_MS = 1_000
KEYS = [b"k%02d" % number for number in range(12)]


class _Crash(BaseException):
    """Raised at a failpoint in place of the SIGKILL: the files stay as the step left them."""


class CompactedLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="copyless-compact-stateful-")
        self.manager: LogManager | None = None
        self.model: dict[int, tuple[bytes, bytes | None]] = {}
        self.present: set[int] = set()
        self.first_seen: dict[int, int] = {}  # tombstone offset -> clock of the first cleaning that saw it
        self.log_end = 0
        self.clock_ms = 10_000_000
        self.cleanings = 0

    @initialize(segment_bytes=st.sampled_from([1024, 2048, 4096]), codec=st.sampled_from([0, 1, 4]))
    def start(self, segment_bytes, codec) -> None:
        self.codec = codec
        self.config = LogConfig(segment_bytes=segment_bytes, segment_index_bytes=4096, index_interval_bytes=256,
                                retention_ms=None, segment_ms=None, file_delete_delay_ms=0,
                                cleanup_policy=("compact",), min_cleanable_dirty_ratio=0.0,
                                delete_retention_ms=DELETE_RETENTION_MS)
        self._open()
        self.log = self.manager.create_log("model", 0, self.config)

    def _open(self) -> None:
        self.manager = LogManager(self.root, default_config=self.config, background_interval_ms=None)
        self.manager.startup()
        self.log = self.manager.get_log("model", 0)

    def teardown(self) -> None:
        if self.manager is not None and self.manager.started:
            self.manager.shutdown()
        shutil.rmtree(self.root, ignore_errors=True)

    # --- rules ------------------------------------------------------------------------------------------

    @rule(batches=st.lists(st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, 120), st.integers(0, 9)),
                                    min_size=1, max_size=6), min_size=1, max_size=4))
    def produce(self, batches) -> None:
        """Keyed batches; a third digit of 0 makes the record a tombstone."""
        for records in batches:
            keys = [key for key, _, _ in records]
            values = [None if kind == 0 else b"%s@%d:" % (key, self.log_end + i) + b"v" * size
                      for i, (key, size, kind) in enumerate(records)]
            result = append_blocking(self.log, build_batch(values, keys=keys, codec=self.codec,
                                                          base_timestamp_ms=self.clock_ms))
            assert result.base_offset == self.log_end
            for offset, key, value in zip(range(result.base_offset, result.last_offset + 1), keys, values, strict=True):
                self.model[offset] = (key, value)
                self.present.add(offset)
            self.log_end = result.last_offset + 1

    @rule()
    def roll(self) -> None:
        roll_blocking(self.log)

    @rule(data=st.data())
    def move_high_watermark(self, data) -> None:
        self.log.set_high_watermark(data.draw(st.integers(self.log.high_watermark, self.log_end), label="hw"))

    @rule(ms=st.sampled_from([1, 400, DELETE_RETENTION_MS, 3 * DELETE_RETENTION_MS]))
    def tick(self, ms) -> None:
        self.clock_ms += ms

    @rule(map_keys=st.sampled_from([2, 5, 1000]))
    def clean(self, map_keys) -> None:
        self._clean(map_keys)

    @rule(point=st.sampled_from(COMPACTION_POINTS), skip=st.integers(0, 2), map_keys=st.sampled_from([3, 1000]))
    def crash_while_cleaning(self, point, skip, map_keys) -> None:
        self.manager.wait_for_background()
        before = set(self.present)
        hits = {"count": 0, "committed": False}
        original = cleaner_module.failpoint

        def failpoint(name: str) -> None:
            if name == "clean.after_swap_manifest":
                hits["committed"] = True
            if name == point:
                hits["count"] += 1
                if hits["count"] > skip:
                    raise _Crash(name)

        cleaner_module.failpoint = failpoint
        crashed = False
        try:
            self._clean(map_keys)
        except _Crash:
            crashed = True
        finally:
            cleaner_module.failpoint = original
        if not crashed:
            return  # nothing to clean, or the point was not reached that often: a whole cleaning ran
        self.manager.abandon()
        self._open()
        stored = self._scan()
        got = {record.offset for _, records in stored for record in records}
        if not hits["committed"]:
            assert got == before, "a crash before the swap's manifest must leave the old log"
        else:
            assert got <= before, "the swap brought back records"
        # Recovery keeps everything up to the log end here (no torn write: the files hold every append).
        assert self.log.log_end_offset == self.log_end
        self.present = got
        self.log.set_high_watermark(self.log_end)

    def _clean(self, map_keys: int) -> None:
        self.manager.wait_for_background()  # rolled segments are named (cleanable) on a worker thread
        high_watermark = self.log.high_watermark
        active_base = self.log.segment_base_offsets()[-1]
        before = set(self.present)
        now = self.clock_ms
        self.cleanings += 1
        try:
            result = clean_log(self.log, force=True, now=now, max_map_entries=map_keys)
        finally:
            # A cleaning sees each tombstone below the high watermark (whether it got to it or crashed).
            for offset in before:
                if self.model[offset][1] is None and offset < high_watermark:
                    self.first_seen.setdefault(offset, now)
        if result is None:
            return
        assert result.aborted is None, result
        got = {record.offset for _, records in self._scan() for record in records}
        assert got <= before, "a cleaning brought back records"
        removed = before - got
        assert all(offset < high_watermark for offset in removed), "cleaned at or above the high watermark"
        assert all(offset < active_base for offset in removed), "cleaned the active segment"
        latest = self._latest()
        for offset in removed:
            key, value = self.model[offset]
            if value is None and latest[key] == offset:  # a superseded tombstone goes like any old record
                assert offset in self.first_seen and now >= self.first_seen[offset] + DELETE_RETENTION_MS, \
                    f"tombstone at {offset} removed before its horizon"
        self.present = got

    @rule()
    def close_and_reopen(self) -> None:
        self.manager.shutdown()
        self._open()
        self.log.set_high_watermark(self.log_end)  # a single node: everything appended is committed

    @precondition(lambda self: self.log_end > 0)
    @rule(data=st.data(), max_bytes=st.sampled_from([1, 300, 1 << 20]))
    def read_anywhere(self, data, max_bytes) -> None:
        """A fetch at any offset, removed or not, gets the first batch whose last offset reaches it."""
        offset = data.draw(st.integers(self.log.log_start_offset, self.log_end - 1), label="offset")
        expected = next(header for header, _ in self._scan() if header.last_offset >= offset)
        result = self.log.read(offset, max_bytes, min_one_message=True)
        assert result.slice is not None
        with result.slice as region:
            raw = region.read_bytes()
        _, first = next(iter_batches(raw))
        assert (first.base_offset, first.last_offset) == (expected.base_offset, expected.last_offset)
        following = [record.offset for record in decode_records(raw, 0) if record.offset >= offset]
        surviving = sorted(o for o in self.present if o >= offset and o <= first.last_offset)
        assert following == surviving

    # --- invariants ---------------------------------------------------------------------------------------

    def _scan(self):
        """Every batch from the log start, through real reads: [(header, records)]."""
        out = []
        offset = self.log.log_start_offset
        while offset < self.log.log_end_offset:
            result = self.log.read(offset, 1 << 20)
            with result.slice as region:
                raw = region.read_bytes()
            for position, header in iter_batches(raw):
                out.append((header, list(decode_records(raw, position))))
                offset = header.next_offset
        return out

    def _latest(self) -> dict[bytes, int]:
        latest: dict[bytes, int] = {}
        for offset in sorted(self.model):
            latest[self.model[offset][0]] = offset
        return latest

    @invariant()
    def log_matches_model(self) -> None:
        if self.manager is None:
            return
        assert self.log.log_end_offset == self.log_end
        batches = self._scan()
        offsets = []
        for _, records in batches:
            for record in records:
                assert self.model[record.offset] == (record.key, record.value), f"offset {record.offset} changed"
                offsets.append(record.offset)
        assert offsets == sorted(set(offsets)), "offsets must strictly increase"
        assert set(offsets) == self.present
        bounds = [(header.base_offset, header.last_offset) for header, _ in batches]
        assert all(a[1] < b[0] for a, b in zip(bounds, bounds[1:], strict=False)), "batches overlap"
        latest = self._latest()
        by_key: dict[bytes, list[int]] = {}
        for offset in offsets:
            by_key.setdefault(self.model[offset][0], []).append(offset)
        for key, offset in latest.items():
            if offset in self.present:
                continue
            assert self.model[offset][1] is None, f"the latest value of {key!r} (offset {offset}) is gone"
            assert key not in by_key, f"{key!r} outlived its tombstone at {offset}"


CompactedLogMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("COPYLESS_STATEFUL_EXAMPLES", "40")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
test_compacted_log_matches_model = CompactedLogMachine.TestCase
