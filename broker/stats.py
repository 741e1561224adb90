"""Broker counters: requests, connections, produced and fetched bytes, and the zero-copy proof.

``fetch_sendfile_bytes`` counts record bytes the kernel moved from a segment file to a socket with
``os.sendfile``; ``fetch_copied_bytes`` counts record bytes that passed through Python memory (only the
``--no-sendfile`` comparison path). With sendfile on, the copied counter stays at 0: that is the check that
fetched records never enter the interpreter. ``response_bytes`` counts every other byte the broker wrote
(headers, kio-encoded responses).

Plain integers on the loop thread: no locks (a torn read by the stats line costs nothing).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["BrokerStats"]


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
    fetch_responses: int = 0
    fetch_sendfile_bytes: int = 0
    fetch_copied_bytes: int = 0
    fetch_sendfile_calls: int = 0
    fetch_cold_warmups: int = 0  # slices read into the page cache by a worker before their sendfile
    write_eagain_waits: int = 0
    response_bytes: int = 0

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
            "fetch_responses": self.fetch_responses,
            "fetch_sendfile_bytes": self.fetch_sendfile_bytes,
            "fetch_copied_bytes": self.fetch_copied_bytes,
            "fetch_sendfile_calls": self.fetch_sendfile_calls,
            "fetch_cold_warmups": self.fetch_cold_warmups,
            "write_eagain_waits": self.write_eagain_waits,
            "sendfile_share": round(self.sendfile_share, 6),
            "response_bytes": self.response_bytes,
        }

    def log_line(self) -> str:
        """One line for the periodic stats log."""
        return (
            f"stats connections={self.connections_open} requests={sum(self.requests.values())} "
            f"produced_records={self.produce_records} produced_bytes={self.produce_bytes} "
            f"fetch_sendfile_bytes={self.fetch_sendfile_bytes} fetch_copied_bytes={self.fetch_copied_bytes} "
            f"sendfile_share={self.sendfile_share:.1%} response_bytes={self.response_bytes}"
        )
