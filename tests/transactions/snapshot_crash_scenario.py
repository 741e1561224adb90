"""Write a transactional history (aborted and committed transactions, one left open) into ``t-0`` under
DATA_DIR with its index entries and snapshots, until the failpoint named in ``COPYLESS_FAILPOINT`` SIGKILLs
the process while it writes a snapshot. Used by test_producer_snapshots.py.

Usage: python -m tests.transactions.snapshot_crash_scenario DATA_DIR
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from copyless.broker.partition_state_files import StateFiles
from copyless.broker.storage import LogManager, _failpoints
from tests.support.log_configs import SMALL
from tests.support.producer_history import History


def main() -> None:
    _failpoints.arm(os.environ["COPYLESS_FAILPOINT"], int(os.environ.get("COPYLESS_FAILPOINT_SKIP", "0")))
    manager = LogManager(Path(sys.argv[1]), default_config=SMALL, background_interval_ms=None)
    manager.startup()
    state_files = StateFiles()
    history = History(manager.create_log("t", 0), state_files)
    for number in range(1000):
        producer = 1 + number % 3
        history.apply("transactional", producer)
        history.apply("transactional", 4)  # producer 4's transaction stays open
        if number % 2:
            history.apply("abort" if number % 4 == 1 else "commit", producer)
    state_files.close()
    raise SystemExit("the failpoint was never reached")


if __name__ == "__main__":
    main()
