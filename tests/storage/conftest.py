import pytest

from copyless.broker.storage import LogConfig, LogManager

# Segments of 64 KiB allocated in 16 KiB steps (a 4 MiB first step and 64 MiB ahead in production), with a
# 16 KiB pre-fault window floor (16 MiB in production), so that the steps, their sparse tails and the moving
# windows are all exercised within small segments.
SMALL = LogConfig(segment_bytes=64 << 10, segment_index_bytes=4096, index_interval_bytes=512, retention_ms=None,
                  preallocate_first_bytes=16 << 10, preallocate_ahead_bytes=48 << 10, prefault_window_bytes=16 << 10)


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

