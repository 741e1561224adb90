"""Broker counters: requests, connections, produced and fetched bytes, and the zero-copy proof.

``fetch_sendfile_bytes`` counts record bytes the kernel moved from a segment file to a consumer's socket
with ``os.sendfile``; ``fetch_copied_bytes`` counts record bytes that passed through Python memory (only
the ``--no-sendfile`` comparison path). ``replica_sendfile_bytes`` / ``replica_copied_bytes`` count the
same for followers' fetches: what replication costs the leader. With sendfile on, the copied counter stays at 0: that is
the check that fetched records never enter the interpreter. ``response_bytes`` counts every other byte the broker wrote
(headers, kio-encoded responses).

Three latency histograms say whether the broker itself kept a consumer waiting:

- ``fetch_prepare``: per fetch response that carries records, the time to look its partitions up, pin
  their slices and encode the response (a long poll's parked time excluded);
- ``fetch_send``: per fetch response that carries records, the time from its first byte written to its
  last, EAGAIN waits included (the socket full because the client has not read yet counts too: that is
  what the client sees);
- ``loop_lag``: how late a 100 ms timer on the event loop fires; anything that holds the loop thread (a
  slow handler, a blocking call, the thread not being scheduled) shows up here.

Three storage counters, kept by the log's pre-fault chases (``broker.storage.prefault.PREFAULT_STATS``, all
partitions): ``prefault_zeroed_bytes``, bytes of the page cache filled by writing zeros ahead of the appends;
``prefault_append_waits``, appends that waited for a chunk of those zeros to be written (awaited: the event loop
served others meanwhile; ``prefault_append_wait_s`` in all, ``prefault_append_wait_max_ms`` the longest); and
``prefault_outrun_bytes``, bytes appended with pwrite because they ran past the pre-faulted pages.

Per API (the Prometheus endpoint, ``broker.metrics``, exposes these): ``requests`` by API key,
``request_errors`` by (API key, error code) for every non-zero error code a response carries, and
``request_latency``, a histogram per API of the time from a request's decoding to its response's last byte
(a long poll's parked time included: what the client waited). Per topic, ``topic_bytes_in`` (produced
batches appended) and ``topic_bytes_out`` (record bytes sent to consumers; followers' fetches are the
replica counters above). Each costs one dict increment per request or partition, and the latency two clock
reads and a log2 per request.

A histogram's snapshot carries its raw buckets, so whoever reads two snapshots can subtract them and get
the quantiles of the window in between (the throughput benchmark does, for each consume).

Plain integers on the loop thread: no locks (a torn read by the stats line costs nothing).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from dataclasses import dataclass, field

from copyless.broker.storage.prefault import PREFAULT_STATS

__all__ = ["BrokerStats", "LatencyHistogram", "histogram_quantile", "bucket_upper_s", "response_error_codes"]

# Buckets of a quarter power of two of microseconds: bucket i holds [2^(i/4), 2^((i+1)/4)) us, so a quantile
# read back as its bucket's upper bound is at most 19% high. 1 us to 2^30 us (18 min) takes 121 buckets.
_SUB_BUCKETS = 4
_BUCKETS = 30 * _SUB_BUCKETS + 1


def _bucket(seconds: float) -> int:
    micros = seconds * 1e6
    if micros <= 1.0:
        return 0
    return min(int(math.log2(micros) * _SUB_BUCKETS), _BUCKETS - 1)


def _bucket_upper_ms(index: int) -> float:
    return 2 ** ((index + 1) / _SUB_BUCKETS) / 1000


def bucket_upper_s(index: int) -> float:
    """The upper bound of ``LatencyHistogram`` bucket ``index``, in seconds (bucket 0 holds up to 1 us)."""
    return 1e-6 if index == 0 else 2 ** ((index + 1) / _SUB_BUCKETS) / 1e6


def histogram_quantile(buckets: dict, q: float) -> float | None:
    """The ``q`` quantile (0..1), in ms, of a bucket dict as ``LatencyHistogram.snapshot`` gives it (keys may
    be strings, as after JSON); None when empty. The value is the upper bound of the quantile's bucket."""
    counts = sorted((int(k), v) for k, v in buckets.items() if v > 0)
    total = sum(v for _k, v in counts)
    if total == 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for index, count in counts:
        seen += count
        if seen >= rank:
            return round(_bucket_upper_ms(index), 3)
    return round(_bucket_upper_ms(counts[-1][0]), 3)


class LatencyHistogram:
    """Counts of durations in logarithmic buckets; ``record`` costs one log2 (about 0.1 us)."""

    __slots__ = ("counts", "count", "max_s", "sum_s")

    def __init__(self) -> None:
        self.counts = [0] * _BUCKETS
        self.count = 0
        self.max_s = 0.0
        self.sum_s = 0.0

    def record(self, seconds: float) -> None:
        self.counts[_bucket(seconds)] += 1
        self.count += 1
        self.sum_s += seconds
        if seconds > self.max_s:
            self.max_s = seconds

    def snapshot(self) -> dict:
        buckets = {str(i): c for i, c in enumerate(self.counts) if c}
        return {
            "count": self.count,
            "p50_ms": histogram_quantile(buckets, 0.50),
            "p99_ms": histogram_quantile(buckets, 0.99),
            "max_ms": round(self.max_s * 1000, 3),
            "buckets": buckets,
        }


@dataclass
class BrokerStats:
    started_monotonic: float = field(default_factory=time.monotonic)
    connections_accepted: int = 0
    connections_open: int = 0
    connections_closed_on_error: int = 0
    requests: Counter = field(default_factory=Counter)  # api_key -> count
    produce_batches: int = 0
    produce_records: int = 0
    produce_bytes: int = 0
    produce_duplicates: int = 0
    produce_errors: int = 0
    # Batches rebuilt before the append (message format v0/v1 converted, or recompressed for the topic's
    # compression.type): what lost the append-as-is path.
    produce_rewritten_batches: int = 0
    fetch_responses: int = 0
    fetch_sendfile_bytes: int = 0
    fetch_copied_bytes: int = 0
    # Followers' fetches, apart from consumers': the leader's cost of replication.
    replica_sendfile_bytes: int = 0
    replica_copied_bytes: int = 0
    fetch_sendfile_calls: int = 0
    fetch_cold_warmups: int = 0  # slices read into the page cache by a worker before their sendfile
    write_eagain_waits: int = 0
    response_bytes: int = 0
    request_errors: Counter = field(default_factory=Counter)  # (api_key, error code) -> count
    request_latency: dict = field(default_factory=dict)  # api_key -> LatencyHistogram
    topic_bytes_in: Counter = field(default_factory=Counter)  # topic -> bytes appended by producers
    topic_bytes_out: Counter = field(default_factory=Counter)  # topic -> record bytes sent to consumers
    fetch_prepare: LatencyHistogram = field(default_factory=LatencyHistogram)
    fetch_send: LatencyHistogram = field(default_factory=LatencyHistogram)
    loop_lag: LatencyHistogram = field(default_factory=LatencyHistogram)

    def record_request(self, api_key: int, seconds: float) -> None:
        """One request answered after ``seconds`` (loop thread)."""
        histogram = self.request_latency.get(api_key)
        if histogram is None:
            histogram = self.request_latency[api_key] = LatencyHistogram()
        histogram.record(seconds)

    @property
    def sendfile_share(self) -> float:
        """Fraction of fetched record bytes that went out through sendfile (1.0 when nothing was fetched)."""
        total = self.fetch_sendfile_bytes + self.fetch_copied_bytes
        return 1.0 if total == 0 else self.fetch_sendfile_bytes / total

    def snapshot(self) -> dict:
        return {
            "uptime_s": round(time.monotonic() - self.started_monotonic, 3),
            "connections_accepted": self.connections_accepted,
            "connections_open": self.connections_open,
            "connections_closed_on_error": self.connections_closed_on_error,
            "requests": {str(key): count for key, count in sorted(self.requests.items())},
            "produce_batches": self.produce_batches,
            "produce_records": self.produce_records,
            "produce_bytes": self.produce_bytes,
            "produce_duplicates": self.produce_duplicates,
            "produce_errors": self.produce_errors,
            "produce_rewritten_batches": self.produce_rewritten_batches,
            "fetch_responses": self.fetch_responses,
            "fetch_sendfile_bytes": self.fetch_sendfile_bytes,
            "fetch_copied_bytes": self.fetch_copied_bytes,
            "replica_sendfile_bytes": self.replica_sendfile_bytes,
            "replica_copied_bytes": self.replica_copied_bytes,
            "fetch_sendfile_calls": self.fetch_sendfile_calls,
            "fetch_cold_warmups": self.fetch_cold_warmups,
            "write_eagain_waits": self.write_eagain_waits,
            "sendfile_share": round(self.sendfile_share, 6),
            "response_bytes": self.response_bytes,
            "request_errors": {f"{key}:{int(code)}": count
                               for (key, code), count in sorted(self.request_errors.items())},
            "topic_bytes_in": dict(sorted(self.topic_bytes_in.items())),
            "topic_bytes_out": dict(sorted(self.topic_bytes_out.items())),
            "fetch_prepare": self.fetch_prepare.snapshot(),
            "fetch_send": self.fetch_send.snapshot(),
            "loop_lag": self.loop_lag.snapshot(),
            "prefault_zeroed_bytes": PREFAULT_STATS["zeroed_bytes"],
            "prefault_append_waits": PREFAULT_STATS["append_waits"],
            "prefault_append_wait_s": round(PREFAULT_STATS["append_wait_s"], 6),
            "prefault_append_wait_max_ms": round(PREFAULT_STATS["append_wait_max_s"] * 1000, 3),
            "prefault_outrun_bytes": PREFAULT_STATS["outrun_bytes"],
        }

    def log_line(self) -> str:
        """One line for the periodic stats log."""
        return (
            f"stats connections={self.connections_open} requests={sum(self.requests.values())} "
            f"produced_records={self.produce_records} produced_bytes={self.produce_bytes} "
            f"fetch_sendfile_bytes={self.fetch_sendfile_bytes} fetch_copied_bytes={self.fetch_copied_bytes} "
            f"sendfile_share={self.sendfile_share:.1%} response_bytes={self.response_bytes} "
            f"fetch_send_p99_ms={_text(self.fetch_send.snapshot()['p99_ms'])} "
            f"loop_lag_max_ms={self.loop_lag.max_s * 1000:.1f} "
            f"prefault_zeroed_bytes={PREFAULT_STATS['zeroed_bytes']} "
            f"prefault_append_waits={PREFAULT_STATS['append_waits']} "
            f"prefault_append_wait_max_ms={PREFAULT_STATS['append_wait_max_s'] * 1000:.1f} "
            f"prefault_outrun_bytes={PREFAULT_STATS['outrun_bytes']}"
        )


_ERROR_FIELDS: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _error_fields(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(error-code fields, nested fields) of a kio entity class, worked out once per class."""
    found = _ERROR_FIELDS.get(cls)
    if found is None:
        names = tuple(field.name for field in dataclasses.fields(cls))
        codes = tuple(name for name in names if name == "error_code")
        nested = tuple(name for name in names if name != "error_code" and "tuple[" in str(
            next(f.type for f in dataclasses.fields(cls) if f.name == name)))
        found = _ERROR_FIELDS[cls] = (codes, nested)
    return found


def response_error_codes(entity) -> list[int]:
    """Every non-zero ``error_code`` in a kio response entity and the entities nested in it (top-level,
    per topic, per partition). O(entities); the Produce and Fetch responses, encoded by hand, never come
    here (their handlers count their errors)."""
    found = []
    stack = [entity]
    while stack:
        item = stack.pop()
        if not dataclasses.is_dataclass(item):
            continue
        codes, nested = _error_fields(type(item))
        for name in codes:
            code = getattr(item, name)
            if code:
                found.append(int(code))
        for name in nested:
            value = getattr(item, name)
            if value:
                stack.extend(value)
    return found


def _text(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
