import pytest

from broker.storage import LogConfig, LogManager

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
