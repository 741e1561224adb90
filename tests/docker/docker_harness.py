"""The harness behind tests/docker: the images, compose projects on the real Docker engine, and clients from the host.

Owns every Docker object the docker tests create. Each test's compose project gets a unique name
(``copyless-test-<pid>-<hex>``); compose labels everything it makes with that name, and
``ComposeProject.remove`` deletes the project's containers, networks and volumes by name, found by that label
(so also after a half-finished ``up`` or a test that failed midway). ``remove_leftovers`` sweeps the projects
of earlier runs that died before their teardown (kill -9, a CI timeout): every project under the prefix whose
pytest process is gone. Nothing outside those projects is touched; the images are kept (they are the cache
``cluster/build-images.sh`` reuses).

Everything goes through the ``docker`` and compose command lines (the same ones a person runs), each call with a
timeout, never a Docker SDK. Blocking throughout: the tests are plain functions; the Kafka clients they drive
run in ``asyncio.run`` per call.

Compose project layout (both compose files): containers carry ``com.docker.compose.project`` and
``com.docker.compose.service`` labels; networks are ``<project>_<name>``, labelled
``com.docker.compose.network=<name>`` (the cluster's "cluster" and "clients", the single broker's "default");
volumes are ``<project>_<name>``. Container names differ between compose 1.29 (``p_s_1``) and v2
(``p-s-1``), so containers are always found by label.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.polling import gather_async, wait_until

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
CLUSTER_DIR = REPO_ROOT / "cluster"
CLUSTER_FILE = REPO_ROOT / "docker-compose.yml"
SINGLE_FILE = REPO_ROOT / "docker-compose.single.yml"
PROJECT_PREFIX = "copyless-test-"
# Services of docker-compose.yml's opt-in "metrics" profile: started only by a project with the Prometheus image.
OPTIONAL_SERVICES = ("prometheus",)

PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"
NETWORK_LABEL = "com.docker.compose.network"

# Timeouts of single engine calls. `docker info` answers in milliseconds when an engine runs; a build from
# nothing is ~80 s on a 2-core machine (debootstrap ~40 s, the copyless image ~40 s), so its bound is wide.
DOCKER_CALL_TIMEOUT_S = 120.0
DOCKER_INFO_TIMEOUT_S = 20.0
BUILD_TIMEOUT_S = 900.0
# Healthchecks run every 2 s; etcd is healthy ~3 s after start, a broker ~2-4 s after it (measured here).
HEALTHY_TIMEOUT_S = 120.0
# Compose sends SIGTERM and waits this long before SIGKILL on `stop`/`down` (the files' stop_grace_period is
# 30 s for brokers: a clean shutdown here takes well under a second).
STOP_TIMEOUT_S = 30

# Lines for the session's terminal summary: the image build and each project's time to healthy.
TIMINGS: list[str] = []


class DockerError(RuntimeError):
    """A docker or compose command failed; carries the command and its output."""


def run(cmd: list[str], *, timeout_s: float = DOCKER_CALL_TIMEOUT_S, check: bool = True, env=None,
        input_text: str | None = None) -> subprocess.CompletedProcess:
    """Run one command, capturing text output. Raises DockerError (with the output) when ``check`` and it fails."""
    try:
        result = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, env=env, input=input_text,
            stdin=None if input_text is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        output = f"{exc.stdout or ''}\n{exc.stderr or ''}"
        raise DockerError(f"{' '.join(cmd)} did not finish within {timeout_s:.0f} s:\n{output}") from None
    if check and result.returncode != 0:
        raise DockerError(f"{' '.join(cmd)} exited with {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


# ---- the engine and the compose command -------------------------------------------------------------------


def engine_unavailable_reason() -> str | None:
    """None when a Docker engine answers `docker info`, else why the docker tests cannot run."""
    if shutil.which("docker") is None:
        return "no Docker engine: the docker command is not installed"
    try:
        result = run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout_s=DOCKER_INFO_TIMEOUT_S, check=False)
    except DockerError as exc:
        return f"no Docker engine: {exc}"
    if result.returncode != 0 or not result.stdout.strip():
        detail = (result.stderr or result.stdout).strip().splitlines()
        return f"no Docker engine answers `docker info`: {detail[-1] if detail else 'no output'}"
    return None


def compose_command() -> list[str] | None:
    """`docker compose` (v2) when the CLI has it, else `docker-compose` (1.29), as cluster/compose.sh picks."""
    if run(["docker", "compose", "version"], check=False, timeout_s=DOCKER_INFO_TIMEOUT_S).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


@dataclass(frozen=True)
class Images:
    base: str
    copyless: str
    build_seconds: float
    prometheus: str | None = None


def build_images(*, prometheus: bool = False) -> Images:
    """cluster/build-images.sh: builds what is missing or stale, reuses the rest (a no-op when nothing changed);
    with ``prometheus`` also the opt-in Prometheus image."""
    started = time.monotonic()
    result = run([str(CLUSTER_DIR / "build-images.sh"), *(["--prometheus"] if prometheus else [])],
                 timeout_s=BUILD_TIMEOUT_S, check=False)
    if result.returncode != 0:
        raise DockerError(f"cluster/build-images.sh failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
    if prometheus:
        base, copyless, prometheus_image = result.stdout.split()[-3:]
    else:
        (base, copyless), prometheus_image = result.stdout.split()[-2:], None
    return Images(base=base, copyless=copyless, build_seconds=time.monotonic() - started,
                  prometheus=prometheus_image)


# ---- leftovers ------------------------------------------------------------------------------------------------


def _labelled(kind: str, label: str) -> list[tuple[str, str]]:
    """(name, value of ``label``) of every container/network/volume carrying ``label``."""
    listing = {"container": ["docker", "ps", "-a"], "network": ["docker", "network", "ls"],
               "volume": ["docker", "volume", "ls"]}[kind]
    fmt = "{{.Names}}" if kind == "container" else "{{.Name}}"
    out = run([*listing, "--filter", f"label={label}", "--format", fmt + '\t{{.Label "' + label + '"}}']).stdout
    return [tuple(line.split("\t", 1)) for line in out.splitlines() if "\t" in line]


def remove_project_objects(project: str) -> list[str]:
    """Remove every container, then network, then volume labelled with ``project``, by name. Returns the names."""
    removed = []
    for kind, remove in (("container", ["docker", "rm", "-f", "-v"]), ("network", ["docker", "network", "rm"]),
                         ("volume", ["docker", "volume", "rm", "-f"])):
        names = [name for name, value in _labelled(kind, PROJECT_LABEL) if value == project]
        if names:
            run([*remove, *names])
            removed += [f"{kind} {name}" for name in names]
    return removed


def project_owner_alive(project: str) -> bool:
    """Whether the pytest process that made ``copyless-test-<pid>-<hex>`` still runs (then it is not a leftover)."""
    pid_text = project[len(PROJECT_PREFIX):].split("-", 1)[0]
    if not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers() -> list[str]:
    """Remove what earlier, interrupted runs left: every project under PROJECT_PREFIX whose owner is gone."""
    projects = set()
    for kind in ("container", "network", "volume"):
        projects.update(value for _, value in _labelled(kind, PROJECT_LABEL) if value.startswith(PROJECT_PREFIX))
    removed = []
    for project in sorted(projects):
        if not project_owner_alive(project):
            removed += remove_project_objects(project)
    return removed


# Host ports for published listeners come from below Linux's ephemeral range (32768-60999 by default): a port
# picked there by binding port 0 was taken, while its broker was killed, by another process's outgoing
# connection or port-0 listener, and `docker start` then failed with "address already in use" (seen here).
PUBLISHED_PORTS = range(20000, 32000)


def free_port(exclude=()) -> int:
    """A port in PUBLISHED_PORTS, not in ``exclude``, free on the host's loopback now (random, so parallel runs
    differ)."""
    for _ in range(200):
        port = random.choice(PUBLISHED_PORTS)
        if port in exclude:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise DockerError(f"no free port in {PUBLISHED_PORTS.start}-{PUBLISHED_PORTS.stop - 1} after 200 tries")


# ---- a compose project ----------------------------------------------------------------------------------------


@dataclass
class ServiceState:
    status: str  # created, running, restarting, exited, dead, or "missing"
    health: str  # starting, healthy, unhealthy, or "" (no healthcheck)
    restarts: int
    exit_code: int


@dataclass
class ComposeProject:
    """One compose project on the engine under a unique name, driven like a person would drive it.

    ``kind`` is "cluster" (docker-compose.yml: etcd1-3, broker1-3) or "single" (docker-compose.single.yml:
    copyless). Host ports are chosen free at creation and passed through the files' environment variables, so
    projects never collide with each other or with a cluster someone runs by hand.
    """

    kind: str
    compose: list[str]
    images: Images
    name: str = field(default_factory=lambda: f"{PROJECT_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
    ports: dict[str, int] = field(default_factory=dict)
    _aliases: dict[tuple[str, str], list[str]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.ports:
            services = ("copyless",) if self.kind == "single" else ("broker1", "broker2", "broker3")
            if self.kind == "cluster" and self.images.prometheus is not None:
                services += ("prometheus",)
            for service in services:
                self.ports[service] = free_port(exclude=set(self.ports.values()))

    @property
    def file(self) -> Path:
        return SINGLE_FILE if self.kind == "single" else CLUSTER_FILE

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ, COPYLESS_IMAGE=self.images.copyless, COPYLESS_BASE_IMAGE=self.images.base)
        env.pop("COMPOSE_PROJECT_NAME", None)
        env.pop("COMPOSE_PROFILES", None)
        if self.images.prometheus is not None:
            # The opt-in "metrics" profile (Prometheus), for a project made with the Prometheus image.
            env.update(COMPOSE_PROFILES="metrics", COPYLESS_PROMETHEUS_IMAGE=self.images.prometheus)
        if self.kind == "single":
            env["COPYLESS_PORT"] = str(self.ports["copyless"])
        else:
            for service, port in self.ports.items():
                env[f"COPYLESS_{service.upper()}_PORT"] = str(port)
        return env

    # -- compose ------------------------------------------------------------------------------------------------
    def run_compose(self, *args: str, timeout_s: float = DOCKER_CALL_TIMEOUT_S, check: bool = True):
        cmd = [*self.compose, "--project-name", self.name, "--file", str(self.file),
               "--project-directory", str(REPO_ROOT), *args]
        return run(cmd, timeout_s=timeout_s, check=check, env=self.env)

    def up(self, *services: str, wait: bool = True, timeout_s: float = HEALTHY_TIMEOUT_S) -> None:
        """`compose up --detach [services]` (creating what is missing, starting what is stopped); then, with
        ``wait``, until those services (all, when none named) are running and healthy."""
        self.run_compose("up", "--detach", *services, timeout_s=timeout_s)
        if wait:
            self.wait_healthy(*(services or self.services()), timeout_s=timeout_s)

    def timed_up(self, *services: str, label: str) -> float:
        """``up(*services)`` to healthy, recorded in TIMINGS; returns the seconds it took."""
        started = time.monotonic()
        self.up(*services)
        seconds = time.monotonic() - started
        TIMINGS.append(f"{label} ({self.name}): up to healthy in {seconds:.1f} s")
        return seconds

    def stop(self, *services: str, timeout_s: int = STOP_TIMEOUT_S) -> None:
        """`compose stop`: SIGTERM, then SIGKILL after ``timeout_s``; containers and volumes stay."""
        self.run_compose("stop", "--timeout", str(timeout_s), *services, timeout_s=timeout_s + 60)

    def down(self, *, volumes: bool = False) -> None:
        """`compose down`: SIGTERM, then removes containers and the network (and, with ``volumes``, the data)."""
        args = ["down", "--remove-orphans", "--timeout", str(STOP_TIMEOUT_S)] + (["--volumes"] if volumes else [])
        self.run_compose(*args, timeout_s=STOP_TIMEOUT_S + 90)

    def remove(self) -> list[str]:
        """Remove everything of this project by name, whatever state it is in: containers (SIGKILL: nothing
        here needs their clean shutdown), then networks, then volumes. Returns what was removed."""
        return remove_project_objects(self.name)

    def services(self) -> list[str]:
        """The services an `up` without names starts: a profile's services only when the profile is on
        (`docker-compose config --services` 1.29 lists them either way)."""
        services = self.run_compose("config", "--services").stdout.split()
        return [s for s in services if s not in OPTIONAL_SERVICES or self.images.prometheus is not None]

    # -- containers by service name ----------------------------------------------------------------------------
    def container(self, service: str) -> str | None:
        """The container id of ``service`` (running or not), None when it has none."""
        out = run(["docker", "ps", "-a", "-q", "--no-trunc", "--filter", f"label={PROJECT_LABEL}={self.name}",
                   "--filter", f"label={SERVICE_LABEL}={service}", "--filter", "label=com.docker.compose.oneoff=False"]
                  ).stdout.split()
        if len(out) > 1:
            raise DockerError(f"{len(out)} containers for service {service} in {self.name}")
        return out[0] if out else None

    def require_container(self, service: str) -> str:
        container = self.container(service)
        if container is None:
            raise DockerError(f"service {service} of {self.name} has no container")
        return container

    def state(self, service: str) -> ServiceState:
        container = self.container(service)
        if container is None:
            return ServiceState("missing", "", 0, 0)
        fmt = "\t".join(("{{.State.Status}}", "{{if .State.Health}}{{.State.Health.Status}}{{end}}",
                         "{{.RestartCount}}", "{{.State.ExitCode}}"))
        out = run(["docker", "inspect", "--format", fmt, container]).stdout
        status, health, restarts, exit_code = out.rstrip("\n").split("\t")
        return ServiceState(status, health, int(restarts), int(exit_code))

    def wait_healthy(self, *services: str, timeout_s: float = HEALTHY_TIMEOUT_S) -> None:
        """Until every named service runs and its healthcheck passes. Raises DockerError, with the services'
        states and log tails, when one exits, turns unhealthy or is still starting at the deadline."""
        pending: dict[str, ServiceState] = {}

        def report(shown: dict[str, ServiceState]) -> str:
            lines = "\n".join(f"--- {s}: {st}\n{self.logs(s, tail=30)}" for s, st in shown.items())
            return f"{', '.join(shown)} of {self.name} not healthy:\n{lines}"

        def all_healthy() -> bool:
            states = {service: self.state(service) for service in services}
            broken = {s: st for s, st in states.items()
                      if st.status in ("exited", "dead", "missing") or st.health == "unhealthy"}
            if broken:
                raise DockerError(report(broken))
            pending.clear()
            pending.update({s: st for s, st in states.items()
                            if not (st.status == "running" and st.health in ("healthy", ""))})
            return not pending

        try:
            wait_until(all_healthy, what=f"{', '.join(services)} of {self.name} to be healthy", timeout_s=timeout_s,
                       interval_s=0.5)
        except AssertionError as exc:
            raise DockerError(f"{exc}\n{report(pending)}") from None

    def wait_state(self, service: str, statuses: tuple[str, ...], timeout_s: float = 30.0) -> ServiceState:
        last: list[ServiceState] = []

        def reached() -> ServiceState | None:
            last.append(self.state(service))
            return last[-1] if last[-1].status in statuses else None

        try:
            return wait_until(reached, what=f"{service} of {self.name} to be {' or '.join(statuses)}",
                              timeout_s=timeout_s, interval_s=0.2)
        except AssertionError as exc:
            raise DockerError(f"{exc}; it is {last[-1]}") from None

    def kill(self, service: str, signal: str = "KILL") -> None:
        """`docker kill -s SIGNAL`: with KILL no shutdown runs; `restart: unless-stopped` does not revive it."""
        run(["docker", "kill", "--signal", signal, self.require_container(service)])

    def start(self, service: str, *, wait: bool = True) -> None:
        """Start a stopped or killed service's container again (same container, same volume)."""
        run(["docker", "start", self.require_container(service)])
        if wait:
            self.wait_healthy(service)

    def network(self, name: str | None = None) -> str:
        """The engine's name of the project network ``name`` (default: "cluster" for the cluster, "default" for
        the single broker)."""
        name = name or ("default" if self.kind == "single" else "cluster")
        out = run(["docker", "network", "ls", "--filter", f"label={PROJECT_LABEL}={self.name}",
                   "--filter", f"label={NETWORK_LABEL}={name}", "--format", "{{.Name}}"]).stdout.split()
        if len(out) != 1:
            raise DockerError(f"expected one network {name!r} in {self.name}, found {out}")
        return out[0]

    def disconnect(self, service: str, network: str | None = None) -> None:
        """`docker network disconnect`: cut ``service`` off ``network`` (default "cluster": etcd and the other
        brokers, who reach a broker by its brokerN-internal alias, which only that network has). A broker keeps
        its "clients" network, so the host still reaches its published port. Its DNS aliases on ``network`` are
        kept for ``connect``."""
        network_name, container = self.network(network), self.require_container(service)
        networks = json.loads(run(["docker", "inspect", "--format", "{{json .NetworkSettings.Networks}}",
                                   container]).stdout)
        aliases = (networks.get(network_name) or {}).get("Aliases") or []
        self._aliases[(service, network_name)] = [a for a in aliases if not container.startswith(a)]
        run(["docker", "network", "disconnect", network_name, container])

    def connect(self, service: str, network: str | None = None) -> None:
        """Undo ``disconnect``: back on the network under the DNS aliases it had there (its service name, and a
        broker's brokerN-internal on "cluster")."""
        network_name, container = self.network(network), self.require_container(service)
        aliases = self._aliases.pop((service, network_name), [service])
        run(["docker", "network", "connect", *(arg for a in aliases for arg in ("--alias", a)), network_name,
             container])

    def pause(self, service: str) -> None:
        """`docker pause`: freezes every process of the service (no signal, no socket closed): a hung node."""
        run(["docker", "pause", self.require_container(service)])

    def unpause(self, service: str) -> None:
        run(["docker", "unpause", self.require_container(service)])

    def logs(self, service: str, *, tail: int | None = None, since: str | None = None) -> str:
        """The service container's output (stdout and stderr interleaved), '' when it has no container."""
        container = self.container(service)
        if container is None:
            return ""
        args = ["docker", "logs"] + (["--tail", str(tail)] if tail else []) + (["--since", since] if since else [])
        result = run([*args, container], check=False)
        return result.stdout + result.stderr

    def exec(self, service: str, *cmd: str, check: bool = True, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
        return run(["docker", "exec", self.require_container(service), *cmd], check=check, timeout_s=timeout_s)

    def etcdctl(self, service: str, *args: str, endpoints: str | None = None, check: bool = True,
                command_timeout_s: int = 5) -> subprocess.CompletedProcess:
        """etcdctl (v3 API) inside ``service``'s container, against ``endpoints`` (default: its own member)."""
        endpoints = endpoints or "http://127.0.0.1:2379"
        return self.exec(service, "etcdctl", f"--endpoints={endpoints}", f"--command-timeout={command_timeout_s}s",
                         *args, check=check, timeout_s=command_timeout_s + 30)

    def volumes(self) -> list[str]:
        return sorted(name for name, value in _labelled("volume", PROJECT_LABEL) if value == self.name)

    # -- clients from the host ----------------------------------------------------------------------------------
    def bootstrap(self, *services: str) -> str:
        """Host addresses of the brokers' published ports (all brokers when none named)."""
        services = services or [s for s in self.ports if s not in OPTIONAL_SERVICES]
        return ",".join(f"127.0.0.1:{self.ports[s]}" for s in services)

    def cli(self, *args: str, input_text: str | None = None, check: bool = True,
            timeout_s: float = 120.0) -> subprocess.CompletedProcess:
        """The copyless command line, run on the host (this test run's Python) against the published ports."""
        return run([sys.executable, "-m", "copyless", *args], input_text=input_text, check=check, timeout_s=timeout_s)


# ---- the Python client ---------------------------------------------------------------------------------------


def produce(bootstrap: str, topic: str, values: list[bytes], *, key_prefix: bytes = b"k",
            partition: int | None = None, timeout_s: float = 60.0) -> list[tuple[int, int]]:
    """Send ``values`` with the idempotent acks=all producer, one record each; returns (partition, offset) per
    value once every one is acknowledged."""
    from copyless import Producer

    async def main():
        async with Producer(bootstrap, linger_ms=1) as producer:
            handles = [await producer.send(topic, value, key=key_prefix + str(i).encode(), partition=partition)
                       for i, value in enumerate(values)]
            metadata = [await handle for handle in handles]
        return [(m.partition, m.offset) for m in metadata]

    return asyncio.run(asyncio.wait_for(main(), timeout_s))


class BackgroundProducer:
    """An idempotent acks=all producer writing one record every ``interval_s`` to ``partition`` on a thread of its
    own (its own event loop), while a test breaks the cluster. ``acknowledged`` collects (offset, value, the
    monotonic time of the acknowledgement); ``failed`` the values whose send failed for good. ``stop()`` stops
    sending, waits up to ``drain_s`` for what is in flight, and re-raises what the thread raised."""

    def __init__(self, bootstrap: str, topic: str, *, partition: int = 0, interval_s: float = 0.01,
                 drain_s: float = 90.0) -> None:
        self.bootstrap, self.topic, self.partition = bootstrap, topic, partition
        self.interval_s, self.drain_s = interval_s, drain_s
        self.acknowledged: list[tuple[int, bytes, float]] = []
        self.failed: list[bytes] = []
        self.sent = 0
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=f"producer-{topic}", daemon=True)

    def start(self) -> BackgroundProducer:
        self._thread.start()
        return self

    def _main(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:  # handed to stop()
            self._error = exc

    async def _produce(self) -> None:
        from copyless import Producer

        producer = Producer(self.bootstrap, linger_ms=1, delivery_timeout_ms=int(self.drain_s * 1000))
        await producer.start()
        try:
            while not self._stop.is_set():
                value = f"{self.topic}-{self.sent:07d}".encode()
                delivery = await producer.send(self.topic, value, partition=self.partition)
                delivery.add_done_callback(lambda d, v=value: self._done(v, d))
                self.sent += 1
                await asyncio.sleep(self.interval_s)
        finally:
            await producer.close(timeout_s=self.drain_s)

    def _done(self, value: bytes, delivery) -> None:
        if delivery.exception() is not None:
            self.failed.append(value)
        else:
            self.acknowledged.append((delivery.result().offset, value, time.monotonic()))

    def acknowledged_after(self, moment: float) -> list[tuple[int, bytes, float]]:
        return [entry for entry in list(self.acknowledged) if entry[2] > moment]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.drain_s + 30)
        if self._thread.is_alive():
            raise DockerError(f"the producer of {self.topic} did not stop within {self.drain_s + 30:.0f} s")
        if self._error is not None:
            raise self._error


def consume(bootstrap: str, topic: str, partitions: list[int], count: int, *,
            timeout_s: float = 60.0) -> list[tuple[int, int, bytes, bytes]]:
    """Read ``partitions`` from their beginning until ``count`` records arrived (or the timeout); returns
    (partition, offset, key, value) in arrival order."""
    from copyless import Consumer

    async def main():
        async with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as consumer:
            consumer.assign([(topic, p) for p in partitions])

            async def fetch():
                return [(r.partition, r.offset, bytes(r.key or b""), bytes(r.value or b""))
                        for batch in (await consumer.getmany(timeout_ms=500)).values() for r in batch]

            return await gather_async(fetch, count=count, timeout_s=timeout_s)

    return asyncio.run(main())


def create_topic(bootstrap: str, topic: str, *, partitions: int, replication_factor: int,
                 configs: dict[str, str] | None = None, timeout_s: float = 60.0) -> None:
    """CreateTopics through the project's admin client (sent to the controller the metadata names)."""
    from copyless import Admin

    async def main():
        async with Admin(bootstrap) as admin:
            await admin.create_topics(topic, num_partitions=partitions, replication_factor=replication_factor,
                                      configs=configs)

    asyncio.run(asyncio.wait_for(main(), timeout_s))


def describe_partitions(bootstrap: str, topic: str, *, timeout_s: float = 30.0) -> dict:
    """partition -> PartitionDescription (leader, replicas, isr, error_code) as the broker at ``bootstrap``
    reports them."""
    from copyless import Admin

    async def main():
        async with Admin(bootstrap) as admin:
            (description,) = await admin.describe_topics(topic)
        return {p.partition: p for p in description.partitions}

    return asyncio.run(asyncio.wait_for(main(), timeout_s))


def end_offset(bootstrap: str, topic: str, partition: int = 0, *, timeout_s: float = 30.0) -> int:
    """The partition's high watermark (ListOffsets latest) through the project's admin client."""
    from copyless import Admin
    from copyless.client.admin import LATEST

    async def main():
        async with Admin(bootstrap) as admin:
            (offset,) = (await admin.list_offsets({(topic, partition): LATEST})).values()
        return offset

    return asyncio.run(asyncio.wait_for(main(), timeout_s))


def broker_service(node_id: int) -> str:
    """The compose service of broker ``node_id`` (docker-compose.yml: node ids 1, 2, 3)."""
    return f"broker{node_id}"


def metadata_brokers(bootstrap: str) -> dict[int, str]:
    """node id -> advertised host:port, as the broker at ``bootstrap`` describes the cluster (kcat -L -J)."""
    out = run(["kcat", "-b", bootstrap, "-L", "-J", "-m", "10"], timeout_s=30).stdout
    return {b["id"]: b["name"] for b in json.loads(out)["brokers"]}


def cluster_mode_unavailable_reason() -> str | None:
    """Why the brokers cannot run the compose cluster yet: None once `copyless serve --help` offers
    --metadata (etcd-backed metadata). The image is built from this same tree, so the host's copy answers."""
    result = run([sys.executable, "-m", "copyless", "serve", "--help"], timeout_s=60, check=False)
    if "--metadata" in result.stdout:
        return None
    return "waits for the brokers' etcd mode: `copyless serve --help` does not offer --metadata yet"
