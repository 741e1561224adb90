"""Shared fixtures: a real ``copyless serve`` subprocess on a free port, restartable gracefully or with kill -9;
in-process LogManagers on a test's own directory.

Every broker the suite starts is a separate process (``python -m copyless serve``, a
``tests.support.broker_process.BrokerProcess``) with its own data dir and a log file that collects its stdout
and stderr; the bound address is read from the broker's startup line, so tests always use port 0 and never
collide. Code shared by the test folders lives in ``tests/support``; this file holds the fixtures:

    broker_loop      "uvloop" or "asyncio" (module scope). Tests marked ``both_loops`` run under both loops,
                     the rest under uvloop only; ``COPYLESS_TEST_LOOPS=uvloop,asyncio`` runs everything under
                     both.
    broker           one broker per test module and loop, shared by the tests that do not restart it.
    etcd_server      a real ``EtcdProcess`` shared by the session (each cluster works under its own root; skips,
                     saying why, where etcd is not installed). The suite's one etcd fixture.
    broker_factory   ``broker_factory(loop=..., sendfile=True, extra_args=(), data_dir=None, config=None)``
                     -> a fresh BrokerProcess owned by one test (stopped at teardown); for restarts and
                     counters. ``config`` is merged over TEST_BROKER_CONFIG and passed as ``--config`` TOML
                     (unless ``extra_args`` brings its own ``--config``, which then wins whole).
    manager_factory  ``manager_factory(config=SMALL, directory=None, **kwargs)`` -> a started LogManager
                     (in-process storage, no background thread unless ``background_interval_ms`` is given) on
                     ``directory`` or tmp_path/"data"; the storage and transaction tests' way to open one, and
                     to reopen the same directory after ``shutdown()`` or ``abandon()`` (a kill -9). Whatever
                     is still started at teardown is shut down cleanly.
    small_config     ``tests.support.log_configs.SMALL``, the small segments manager_factory defaults to.

Blocking storage calls on an event loop's thread raise, in this process and in every broker the suite starts
(``copyless.broker.storage.blocking``; brokers get ``--check-loop-blocking``).

``COPYLESS_TEST_BOOTSTRAP=HOST:PORT`` points the ``broker`` fixture at an already running Kafka-protocol
broker instead (used to prove the tests against the reference Apache Kafka); tests that need to restart the
broker or read its process state are then skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from copyless.broker.storage import LogManager, blocking
from tests.support.broker_process import (
    EXTERNAL_BOOTSTRAP_ENV,
    TEST_BROKER_CONFIG,
    BrokerProcess,
    check_loop_blocking,
    external_bootstrap,
)
from tests.support.etcd import EtcdProcess, require_etcd
from tests.support.log_configs import SMALL

blocking.enable()
check_loop_blocking()

LOOPS_ENV = "COPYLESS_TEST_LOOPS"


def _loops_for(metafunc) -> list[str]:
    override = os.environ.get(LOOPS_ENV)
    if override:
        return [loop.strip() for loop in override.split(",") if loop.strip()]
    if metafunc.definition.get_closest_marker("both_loops"):
        return ["uvloop", "asyncio"]
    return ["uvloop"]


def pytest_configure(config):
    config.addinivalue_line("markers", "both_loops: run under both --loop uvloop and --loop asyncio")


def pytest_generate_tests(metafunc):
    if "broker_loop" in metafunc.fixturenames:
        loops = ["external"] if external_bootstrap() else _loops_for(metafunc)
        metafunc.parametrize("broker_loop", loops, scope="module")


def _external_broker() -> BrokerProcess:
    host, _, port = external_bootstrap().rpartition(":")
    return BrokerProcess(data_dir=None, log_path=None, loop=None, external=True, host=host, port=int(port))


def _check_survived(broker: BrokerProcess) -> None:
    if not broker.external and broker.process is not None and broker.process.poll() is not None:
        code = broker.process.returncode
        pytest.fail(f"broker died during the tests (exit code {code}):\n{broker.log_tail()}", pytrace=False)


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory):
    require_etcd()
    server = EtcdProcess(tmp_path_factory.mktemp("etcd")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def broker(broker_loop, tmp_path_factory):
    """One broker per module and loop; teardown fails loudly if it died meanwhile or shut down badly."""
    if broker_loop == "external":
        yield _external_broker()
        return
    base = tmp_path_factory.mktemp(f"broker-{broker_loop}")
    proc = BrokerProcess(
        data_dir=base / "data", log_path=base / "broker.log", loop=broker_loop, config=dict(TEST_BROKER_CONFIG)
    )
    proc.start()
    try:
        yield proc
    finally:
        _check_survived(proc)
        code = proc.stop()
        assert code == 0, f"broker exited with {code} after SIGTERM:\n{proc.log_tail()}"


@pytest.fixture
def broker_factory(tmp_path):
    """Start private brokers (see the module docstring); each is stopped at teardown."""
    started: list[BrokerProcess] = []

    def start(loop: str = "uvloop", sendfile: bool = True, extra_args=(), data_dir: Path | None = None, config=None):
        if external_bootstrap():
            pytest.skip(f"needs a broker subprocess; {EXTERNAL_BOOTSTRAP_ENV} points at an external broker")
        name = f"broker{len(started)}"
        proc = BrokerProcess(
            data_dir=data_dir or tmp_path / name / "data",
            log_path=tmp_path / name / "broker.log",
            loop=loop,
            sendfile=sendfile,
            extra_args=tuple(extra_args),
            config={**TEST_BROKER_CONFIG, **(config or {})},
        )
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        if proc.process is not None and proc.process.poll() is None:
            try:
                proc.stop()
            except AssertionError:
                pass


@pytest.fixture
def small_config():
    return SMALL


@pytest.fixture
def manager_factory(tmp_path):
    """Start LogManagers (see the module docstring); whatever is still running at the end is shut down cleanly."""
    started: list[LogManager] = []

    def make(config=SMALL, directory: Path | None = None, **kwargs) -> LogManager:
        kwargs.setdefault("background_interval_ms", None)
        manager = LogManager(directory or tmp_path / "data", default_config=config, **kwargs)
        manager.startup()
        started.append(manager)
        return manager

    yield make
    for manager in started:
        if manager.started:
            manager.shutdown()
