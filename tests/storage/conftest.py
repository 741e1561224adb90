import os
# Segments here are 64 KiB - 8 MiB: allocate them in 16 KiB steps (64 MiB in production) so that every test,
# and every subprocess it starts, runs the stepped allocation with its sparse tails. Set before
# broker.storage is imported by the test modules.
os.environ.setdefault("COPYLESS_ALLOCATION_STEP_BYTES", str(16 << 10))
# Likewise a 16 KiB pre-fault window floor (16 MiB in production), so windows move and spill within them.
os.environ.setdefault("COPYLESS_WARM_AHEAD_BYTES", str(16 << 10))

import pytest  # noqa: E402

from copyless.broker.storage import LogConfig, LogManager  # noqa: E402
from copyless.broker.storage import segment as _segment  # noqa: E402

# Also when another conftest imported broker.storage before the variable was set.
_segment.ALLOCATION_STEP_BYTES = int(os.environ["COPYLESS_ALLOCATION_STEP_BYTES"])
_segment.WARM_AHEAD_BYTES = int(os.environ["COPYLESS_WARM_AHEAD_BYTES"])

SMALL = LogConfig(segment_bytes=64 << 10, segment_index_bytes=4096, index_interval_bytes=512, retention_ms=None)


@pytest.fixture
def small_config():
    return SMALL


@pytest.fixture
def manager_factory(tmp_path):
    """Start LogManagers on tmp_path; whatever is still running at the end is shut down cleanly."""
    started = []

    def make(config=SMALL, directory=None, **kwargs):
        kwargs.setdefault("background_interval_ms", None)
        manager = LogManager(directory or tmp_path / "data", default_config=config, **kwargs)
        manager.startup()
        started.append(manager)
        return manager

    yield make
    for manager in started:
        if manager.started:
            manager.shutdown()

