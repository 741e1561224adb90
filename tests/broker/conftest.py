"""Fixtures for the broker tests: in-process brokers (``tests.support.live_broker.LiveBroker``) under uvloop
and asyncio."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.live_broker import LiveBroker


@pytest.fixture(params=["uvloop", "asyncio"])
def loop_name(request):
    return request.param


@pytest.fixture
def live_broker(tmp_path, loop_name):
    broker = LiveBroker(tmp_path / "data", loop_name)
    yield broker
    broker.stop()


@pytest.fixture
def inproc_factory(tmp_path):
    started: list[LiveBroker] = []

    def start(loop_name: str = "uvloop", data_dir: Path | None = None, **overrides) -> LiveBroker:
        broker = LiveBroker(data_dir or tmp_path / "data", loop_name, **overrides)
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.stop()
