"""Fixtures of the docker tests: real compose projects on the real Docker engine (docker_harness.py has the rules).

    docker_engine     session. Skips every docker test, saying so, where no Docker engine answers `docker info`;
                      otherwise removes what interrupted earlier runs left (docker_harness.remove_leftovers).
    compose_cmd       session. `docker compose` or `docker-compose`; fails, naming the package, when neither
                      is installed (tests/run.sh installs Debian's docker-compose).
    copyless_images   session. cluster/build-images.sh once per run: from nothing the first time on a machine,
                      a content-key check (nothing built) after that.
    prometheus_images session, on first use. build-images.sh --prometheus: the images above and the opt-in
                      Prometheus image (Debian's package on the base; about a minute the first time).
    compose_project   function. ``compose_project(kind="cluster"|"single", metrics=False)`` -> a ComposeProject
                      under a fresh name, not started (``metrics``: with the "metrics" profile, Prometheus);
                      at teardown everything it created is removed by name, and when the test failed the
                      services' last log lines are printed first. While a project exists, SIGTERM
                      (a CI timeout) raises KeyboardInterrupt so this teardown still runs.
    cluster_mode      session (so it skips before the images are built). Skips until the brokers have their
                      etcd mode (`copyless serve --metadata`).

The session's image build time and each project's time to healthy are printed in the terminal summary.
"""

from __future__ import annotations

import signal

import pytest

from tests.docker import docker_harness as harness


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.docker_call_failed = report.failed


def pytest_terminal_summary(terminalreporter):
    if harness.TIMINGS:
        terminalreporter.write_sep("-", "docker timings")
        for line in harness.TIMINGS:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def docker_engine() -> None:
    reason = harness.engine_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    removed = harness.remove_leftovers()
    if removed:
        print(f"removed leftovers of earlier docker test runs: {', '.join(removed)}")


@pytest.fixture(scope="session")
def compose_cmd(docker_engine) -> list[str]:
    command = harness.compose_command()
    if command is None:
        pytest.fail("a Docker engine runs but neither `docker compose` nor `docker-compose` is installed "
                    "(Debian: apt-get install docker-compose)", pytrace=False)
    return command


@pytest.fixture(scope="session")
def copyless_images(docker_engine) -> harness.Images:
    try:
        images = harness.build_images()
    except harness.DockerError as exc:
        pytest.fail(str(exc), pytrace=False)
    harness.TIMINGS.append(f"cluster/build-images.sh: {images.build_seconds:.1f} s ({images.base}, {images.copyless})")
    return images


class _TerminatedError(KeyboardInterrupt):
    pass


def _raise_on_sigterm(signum, frame):
    raise _TerminatedError(f"signal {signum}")


@pytest.fixture(scope="session")
def prometheus_images(copyless_images) -> harness.Images:
    try:
        images = harness.build_images(prometheus=True)
    except harness.DockerError as exc:
        pytest.fail(str(exc), pytrace=False)
    harness.TIMINGS.append(f"cluster/build-images.sh --prometheus: {images.build_seconds:.1f} s ({images.prometheus})")
    return images


@pytest.fixture
def compose_project(request, compose_cmd, copyless_images):
    projects: list[harness.ComposeProject] = []

    def make(kind: str = "cluster", *, metrics: bool = False) -> harness.ComposeProject:
        images = request.getfixturevalue("prometheus_images") if metrics else copyless_images
        project = harness.ComposeProject(kind=kind, compose=compose_cmd, images=images)
        projects.append(project)
        return project

    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        yield make
    finally:
        try:
            for project in projects:
                if getattr(request.node, "docker_call_failed", False):
                    for service in project.services():
                        state, logs = project.state(service), project.logs(service, tail=40)
                        print(f"--- {project.name} {service}: {state}\n{logs}")
                project.remove()
        finally:
            signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="session")
def cluster_mode(docker_engine) -> None:
    reason = harness.cluster_mode_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)

