"""Fixtures for the transaction tests on real logs (``manager_factory`` is the suite's, in tests/conftest.py).

    history    a ``tests.support.producer_history.History`` on a fresh partition log ``t-0`` (SMALL segments,
               on tmp_path) with its own StateFiles thread. A test closes ``history.state_files`` (which
               waits for the queued ``.txnindex`` entries and snapshots) before it reads those files; the
               thread is closed at teardown in any case, before the log's manager shuts down.
"""

from __future__ import annotations

import pytest

from copyless.broker.partition_state_files import StateFiles
from tests.support.producer_history import History


@pytest.fixture
def history(manager_factory):
    state_files = StateFiles()
    yield History(manager_factory().create_log("t", 0), state_files)
    state_files.close()
