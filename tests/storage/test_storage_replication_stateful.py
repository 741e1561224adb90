"""A replica's log against a model, driven by hypothesis: appends as leader and as follower, truncations
(within a segment, across segments, full), DeleteRecords, high watermark moves, clean restarts and kills.

The model is the list of batches (base offset, leader epoch, values) the log holds, its log start and its
high watermark. After every step the log holds exactly the model's batches from its start (offsets, epochs,
values), its epoch cache agrees with them, and its high watermark lies within [log start, log end].
"""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from copyless.broker.storage import LogConfig, LogManager
from copyless.protocol.records import iter_batches, set_base_offset, set_leader_epoch
from tests.support.batches import build_batch, records_of
from tests.support.blocking_appends import append_as_follower_blocking, append_blocking

values = st.lists(st.binary(min_size=0, max_size=200), min_size=1, max_size=4)


class ReplicaLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="copyless-replica-")
        self.manager: LogManager | None = None
        self.batches: list[tuple[int, int, list[bytes]]] = []
        self.log_start_offset = 0
        self.epoch = 0

    @initialize(segment_bytes=st.sampled_from([1024, 4096]), index_interval_bytes=st.sampled_from([0, 300]))
    def start(self, segment_bytes, index_interval_bytes) -> None:
        self.config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=index_interval_bytes,
                                segment_index_bytes=240, retention_ms=None, file_delete_delay_ms=0)
        self._open()
        self.log = self.manager.create_log("replica", 0, self.config)

    def _open(self) -> None:
        self.manager = LogManager(self.root, default_config=self.config, background_interval_ms=None)
        self.manager.startup()
        self.log = self.manager.get_log("replica", 0)

    def teardown(self) -> None:
        if self.manager is not None and self.manager.started:
            self.manager.shutdown()
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def log_end_offset(self) -> int:
        if not self.batches:
            return self.log_start_offset
        base, _, batch_values = self.batches[-1]
        return base + len(batch_values)

    # --- rules ------------------------------------------------------------------------------------------

    @rule(batch_values=values, new_epoch=st.booleans())
    def append_as_leader(self, batch_values, new_epoch) -> None:
        self.epoch += int(new_epoch)
        result = append_blocking(self.log, build_batch(batch_values, [1] * len(batch_values)), leader_epoch=self.epoch)
        assert result.base_offset == self.log_end_offset
        self.batches.append((result.base_offset, self.epoch, batch_values))

    @rule(runs=st.lists(st.tuples(values, st.booleans()), min_size=1, max_size=4))
    def append_as_follower(self, runs) -> None:
        data = b""
        offset = self.log_end_offset
        appended = []
        for batch_values, new_epoch in runs:
            self.epoch += int(new_epoch)
            raw = bytearray(build_batch(batch_values, [2] * len(batch_values)))
            set_base_offset(raw, 0, offset)
            set_leader_epoch(raw, 0, self.epoch)
            data += raw
            appended.append((offset, self.epoch, batch_values))
            offset += len(batch_values)
        result = append_as_follower_blocking(self.log, data)
        assert [base for base, _ in result.headers] == [base for base, _, _ in appended]
        self.batches.extend(appended)

    @precondition(lambda self: self.log_end_offset > self.log_start_offset)
    @rule(data=st.data())
    def set_high_watermark(self, data) -> None:
        self.log.set_high_watermark(data.draw(st.integers(self.log.high_watermark, self.log_end_offset)))

    @precondition(lambda self: self.log_end_offset > self.log_start_offset)
    @rule(data=st.data())
    def truncate_to(self, data) -> None:
        offset = data.draw(st.integers(self.log_start_offset, self.log_end_offset))
        self.log.truncate_to(offset)
        # The whole batch holding the target goes.
        self.batches = [b for b in self.batches if b[0] + len(b[2]) <= offset]
        assert self.log.log_end_offset == self.log_end_offset

    @rule(gap=st.integers(0, 50))
    def truncate_fully(self, gap) -> None:
        offset = self.log_end_offset + gap
        self.log.truncate_fully_and_start_at(offset)
        self.batches, self.log_start_offset = [], offset

    @precondition(lambda self: self.log.high_watermark > self.log_start_offset)
    @rule(data=st.data())
    def delete_records(self, data) -> None:
        offset = data.draw(st.integers(self.log_start_offset, self.log.high_watermark))
        assert self.log.delete_records_before(offset) == offset
        self.log_start_offset = offset
        self.batches = [b for b in self.batches if b[0] + len(b[2]) > offset]

    @rule()
    def flush(self) -> None:
        self.log.flush().result(timeout=60)

    @rule(crash=st.booleans())
    def restart(self, crash) -> None:
        high_watermark = self.log.high_watermark
        self.manager.wait_for_background()
        if crash:
            self.manager.abandon()  # a kill -9: the page cache keeps every append
        else:
            self.manager.shutdown()
        self._open()
        assert self.log.high_watermark <= high_watermark

    # --- invariants ---------------------------------------------------------------------------------------

    @invariant()
    def log_equals_model(self) -> None:
        if self.manager is None:
            return
        log_ = self.log
        assert (log_.log_start_offset, log_.log_end_offset) == (self.log_start_offset, self.log_end_offset)
        assert log_.log_start_offset <= log_.high_watermark <= log_.log_end_offset
        got = []
        offset = log_.log_start_offset
        while offset < log_.log_end_offset:
            with log_.read(offset, 1 << 20).slice as region:
                raw = region.read_bytes()
            for position, header in iter_batches(raw):
                got.append((header.base_offset, header.partition_leader_epoch,
                            [r.value for r in records_of(raw[position:position + header.size])]))
            offset = got[-1][0] + len(got[-1][2])
        assert got == self.batches
        cache = log_.leader_epochs
        for base, epoch, _ in self.batches:
            # A batch straddling the log start (DeleteRecords) is covered from the log start on.
            assert cache.epoch_for(max(base, log_.log_start_offset)) == epoch, (base, epoch, cache.entries())
        assert all(start >= log_.log_start_offset for _, start in cache.entries())


ReplicaLogMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("COPYLESS_STATEFUL_EXAMPLES", "40")),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
test_replica_log_matches_model = ReplicaLogMachine.TestCase
