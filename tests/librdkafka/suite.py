"""Running librdkafka's integration tests one at a time and reading their outcome.

A run is ``TESTS=0nnn ./test-runner -p1 -E -L [-s SCENARIO]`` in the source tree's ``tests/`` directory:
one test number alone (``-p1``), never the sockem tests (``-E``: they need librdkafka's socket emulator
between client and broker) nor the local ones (``-L``: they need no broker), in full mode (no ``-Q``). The
broker comes from ``test.conf`` (``metadata.broker.list``), and ``TEST_KAFKA_VERSION=3.9.1`` tells the tests
what to expect of it: with 3.x they create topics through the Admin API or ``kafka-topics.sh
--bootstrap-server $BROKERS`` from ``$KAFKA_PATH/bin``.

The runner prints a summary table at exit, one row per test of that number::

    |<colour> 0045_subscribe_update        |     PASSED |  15.233s <colour>|
    |<colour> 0045_subscribe_update_mock   |    SKIPPED |   0.000s <colour>|<colour> Filtered due to ...

``parse_summary`` reads those rows into ``Outcome``s, leaving out the tests ``-L`` and ``-E`` filter (they
need no broker, or a socket emulator). A row SKIPPED because it belongs to another scenario
(librdkafka marks four tests ``noautocreate``: they need a broker that does not create topics on first use)
is dropped, and ``scenarios()`` says which numbers to run again under which scenario, against which broker.
A test that the runner did not finish within ``RUN_TIMEOUT_S`` is FAILED ("timed out").
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

PASSED, FAILED, SKIPPED = "PASSED", "FAILED", "SKIPPED"
DEFAULT_SCENARIO = "default"
# The broker version the tests are told; it picks the Admin API and kafka-topics.sh --bootstrap-server.
KAFKA_VERSION = "3.9.1"
# The longest test here (0089's max.poll.interval.ms cases) runs about 2 minutes on Kafka; a test still
# running after this is counted failed and its runner killed.
RUN_TIMEOUT_S = 420.0

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|\x1b\(B")
_ROW = re.compile(r"^\|\s*(?P<name>\d{4}_\S+)\s*\|\s*(?P<state>[A-Z_]+)\s*\|\s*(?P<seconds>[0-9.]+)s\s*\|(?P<rest>.*)$")
_FAILURE = re.compile(r'### Test "(?P<name>\d{4}_\w+)[^"]*" failed at')
_SCENARIO = re.compile(r'\.scenario\s*=\s*"(?P<scenarios>[^"]+)"')


@dataclass(frozen=True)
class Outcome:
    """One test's result: ``state`` PASSED, FAILED or SKIPPED, and why (the runner's failure or skip text)."""

    name: str
    state: str
    seconds: float
    reason: str = ""
    scenario: str = DEFAULT_SCENARIO

    @property
    def number(self) -> str:
        return self.name[:4]

    def to_json(self) -> dict:
        return asdict(self)


def test_numbers(tests_dir: Path) -> list[str]:
    """The test numbers below 1000 (the 8000s are manual), from the source files' names."""
    numbers = {path.name[:4] for path in tests_dir.glob("0[0-9][0-9][0-9]-*.c*")}
    return sorted(numbers)


def test_names(tests_dir: Path) -> list[str]:
    """Every test name in the runner's table (test.c), in its order."""
    source = (tests_dir / "test.c").read_text(errors="replace")
    table = source[source.index("struct test tests[]"):]
    return re.findall(r"_TEST\((\d{4}_\w+)", table[:table.index("\n};")])


def scenarios_of(tests_dir: Path, number: str) -> list[str]:
    """The scenarios test ``number`` has tests in, the default first when it has any there ("ak23" is a
    Kafka 2.3 scenario, never run)."""
    named = scenarios(tests_dir)
    found: list[str] = []
    for name in test_names(tests_dir):
        if name.startswith(number + "_"):
            for scenario in named.get(name, (DEFAULT_SCENARIO,)):
                if scenario != "ak23" and scenario not in found:
                    found.append(scenario)
    return sorted(found, key=lambda s: (s != DEFAULT_SCENARIO, s))


def scenarios(tests_dir: Path) -> dict[str, tuple[str, ...]]:
    """test name -> the scenarios it runs in, for the tests that name theirs in test.c (others: default)."""
    source = (tests_dir / "test.c").read_text(errors="replace")
    table = source[source.index("struct test tests[]"):]
    table = table[:table.index("\n};")]
    found = {}
    for chunk in re.split(r"(?=_TEST\()", table):
        name = re.match(r"_TEST\((\d{4}_\w+)", chunk)
        scenario = _SCENARIO.search(chunk)
        if name and scenario:
            found[name.group(1)] = tuple(s.strip() for s in scenario.group("scenarios").split(","))
    return found


def parse_summary(output: str, number: str, scenario: str = DEFAULT_SCENARIO,
                  test_scenarios: dict[str, tuple[str, ...]] | None = None) -> list[Outcome]:
    """The rows of test ``number`` in the runner's summary table, without those of another scenario.

    A test the runner never started (``DNS``: it stopped at an earlier test's timeout) is FAILED when it
    belongs to this run, and left out when it is another number's or another scenario's.
    """
    outcomes = []
    failures = failure_messages(output)
    for line in _ANSI.sub("", output).splitlines():
        row = _ROW.match(line.strip())
        if not row or not row.group("name").startswith(number + "_"):
            continue
        name = row.group("name")
        reason = row.group("rest").strip().strip("|").strip()
        state = row.group("state")
        if state == SKIPPED and (not reason or reason.startswith("requires test scenario")):
            continue  # another scenario's test: run where it belongs
        if state == SKIPPED and reason.startswith("Filtered due to negative test flags"):
            continue  # a local (-L) or sockem (-E) test: not a test of the broker
        if state not in (PASSED, FAILED, SKIPPED):
            if scenario not in (test_scenarios or {}).get(name, (DEFAULT_SCENARIO,)):
                continue
            state, reason = FAILED, ("still running when the runner stopped" if state == "RUNNING"
                                     else "not started: the runner stopped at an earlier failure")
        if state == FAILED and not reason:
            reason = failures.get(name, "")
        outcomes.append(Outcome(name, state, float(row.group("seconds")), reason, scenario))
    return outcomes


def failure_messages(output: str) -> dict[str, str]:
    """test name -> the message of its last failure (the line after ``### Test "NAME (...)" failed at``)."""
    found = {}
    lines = _ANSI.sub("", output).splitlines()
    for index, line in enumerate(lines):
        match = _FAILURE.search(line)
        if match and index + 1 < len(lines):
            found[match.group("name")] = lines[index + 1].strip()[:300]
    return found


def runner_env(tests_dir: Path, conf_path: Path, kafka_path: Path, brokers: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RDKAFKA_TEST_CONF=str(conf_path),
        TEST_KAFKA_VERSION=KAFKA_VERSION,
        KAFKA_PATH=str(kafka_path),
        BROKERS=brokers,
        # The tree's own librdkafka, not the installed librdkafka1 (run-test.sh sets the same).
        LD_LIBRARY_PATH=os.pathsep.join([str(tests_dir.parent / "src"), str(tests_dir.parent / "src-cpp")]),
        RDKAFKA_GITVER="debian",
    )
    env.pop("CI", None)  # the runner caps parallelism and shortens timeouts on CI; -p1 already
    env.pop("TESTS_SKIP", None)
    return env


def write_test_conf(path: Path, brokers: str) -> Path:
    path.write_text(f"metadata.broker.list={brokers}\n")
    return path


def run_test(tests_dir: Path, number: str, *, brokers: str, workdir: Path, kafka_path: Path,
             scenario: str = DEFAULT_SCENARIO, extra_env: dict[str, str] | None = None,
             timeout_s: float = RUN_TIMEOUT_S) -> tuple[list[Outcome], str]:
    """Run one test number alone against ``brokers``; returns its outcomes and the runner's whole output.

    Blocks up to ``timeout_s``; the output is also written to ``workdir/<number>-<scenario>.out``.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    conf = write_test_conf(workdir / "test.conf", brokers)
    argv = ["./test-runner", "-p1", "-E", "-L"]
    if scenario != DEFAULT_SCENARIO:
        argv += ["-s", scenario]
    env = runner_env(tests_dir, conf, kafka_path, brokers)
    env.update(extra_env or {})
    env["TESTS"] = number
    out_path = workdir / f"{number}-{scenario}.out"
    started = time.monotonic()
    with open(out_path, "wb") as out:
        process = subprocess.Popen(argv, cwd=tests_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            process.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            timed_out = True
    output = out_path.read_text(errors="replace")
    outcomes = parse_summary(output, number, scenario, scenarios(tests_dir))
    if timed_out:
        seconds = time.monotonic() - started
        outcomes = [Outcome(f"{number}_(runner)", FAILED, seconds, f"timed out after {timeout_s:.0f} s", scenario)]
    elif not outcomes and process.returncode != 0:
        # The runner aborted (a failure in librdkafka's own threads, or client threads left behind after
        # one) before its summary: the tests that reported a failure failed.
        seconds = time.monotonic() - started
        outcomes = [Outcome(name, FAILED, seconds, f"{message} (runner exited {process.returncode})", scenario)
                    for name, message in failure_messages(output).items() if name.startswith(number + "_")]
        if not outcomes:
            outcomes = [Outcome(f"{number}_(runner)", FAILED, seconds,
                                f"runner exited {process.returncode} without a summary", scenario)]
    return outcomes, output
