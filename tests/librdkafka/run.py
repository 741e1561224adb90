"""Run librdkafka's integration suite against one target and print the table: ``python -m tests.librdkafka.run``.

    python -m tests.librdkafka.run --target single              # every test number, one copyless node
    python -m tests.librdkafka.run --target cluster --tests 0102,0118
    python -m tests.librdkafka.run --target kafka --out out/rdk  # Apache Kafka 3.9.1, the reference

Each test number runs alone (``tests.librdkafka.suite``) against a target started once per scenario
(``tests.librdkafka.targets``); a target that died during a test is restarted for the next one and the test
is marked failed. Writes ``results-<target>.json`` to ``--out`` and prints one line per test, the counts,
and, for copyless's targets, how the run compares with ``expected.toml``. Exit status 1 on a regression.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.librdkafka import build, expectations
from tests.librdkafka.suite import DEFAULT_SCENARIO, FAILED, PASSED, SKIPPED, Outcome, run_test, scenarios, test_numbers
from tests.librdkafka.targets import STARTERS, TARGETS


def plan(tests_dir: Path, numbers: list[str]) -> list[tuple[str, list[str]]]:
    """(scenario, test numbers) in run order: the default scenario first, then the others' own tests."""
    other: dict[str, set[str]] = {}
    for name, names in scenarios(tests_dir).items():
        for scenario in names:
            if scenario != DEFAULT_SCENARIO and name[:4] in numbers:
                other.setdefault(scenario, set()).add(name[:4])
    # ak23 is a Kafka 2.3 scenario: nothing to run against 3.9-era brokers.
    other.pop("ak23", None)
    return [(DEFAULT_SCENARIO, numbers)] + [(s, sorted(n)) for s, n in sorted(other.items())]


def run_suite(target_name: str, numbers: list[str] | None, workdir: Path, *, log=sys.stdout) -> list[Outcome]:
    tests_dir = build.ensure_built()
    numbers = numbers or test_numbers(tests_dir)
    outcomes: list[Outcome] = []
    for scenario, scenario_numbers in plan(tests_dir, numbers):
        scenario_dir = workdir / target_name / scenario
        stack = contextlib.ExitStack()
        target = None
        try:
            for number in scenario_numbers:
                if target is None:
                    target = stack.enter_context(STARTERS[target_name](scenario_dir / f"broker-{number}", scenario))
                started = time.monotonic()
                results, _output = run_test(tests_dir, number, brokers=target.bootstrap, workdir=scenario_dir,
                                            kafka_path=target.kafka_path, scenario=scenario,
                                            extra_env=target.extra_env)
                if not target.alive():
                    results = [Outcome(o.name, FAILED, o.seconds, f"the broker died during the test; {o.reason}",
                                       scenario) for o in results] or [
                        Outcome(f"{number}_(runner)", FAILED, 0.0, "the broker died during the test", scenario)]
                    (scenario_dir / f"{number}-broker-died.log").write_text(target.log_tail())
                    stack.close()
                    stack, target = contextlib.ExitStack(), None
                for outcome in results:
                    print(f"{target_name:8} {scenario:13} {outcome.name:48} {outcome.state:8} {outcome.seconds:7.1f}s "
                          f"{outcome.reason[:100]}", file=log, flush=True)
                if not results:
                    print(f"{target_name:8} {scenario:13} {number} (no broker test) "
                          f"{time.monotonic() - started:.1f}s", file=log, flush=True)
                outcomes.extend(results)
        finally:
            stack.close()
    return outcomes


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    return {state.lower(): sum(o.state == state for o in outcomes) for state in (PASSED, FAILED, SKIPPED)}


def _stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the brokers and Kafka this run started are stopped on the way out."""
    def handler(_signum, _frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.librdkafka.run", description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=TARGETS, required=True)
    parser.add_argument("--tests", help="comma-separated test numbers (default: all)")
    parser.add_argument("--out", type=Path, help="directory for results and the runners' output (default: a temp dir)")
    args = parser.parse_args(argv)
    _stop_on_sigterm()
    workdir = args.out or Path(tempfile.mkdtemp(prefix="rdkafka-suite-"))
    workdir.mkdir(parents=True, exist_ok=True)
    numbers = [n.strip() for n in args.tests.split(",")] if args.tests else None
    started = time.monotonic()
    outcomes = run_suite(args.target, numbers, workdir)
    elapsed = time.monotonic() - started
    summary = counts(outcomes)
    (workdir / f"results-{args.target}.json").write_text(json.dumps(
        {"target": args.target, "seconds": round(elapsed, 1), "counts": summary,
         "tests": [o.to_json() for o in outcomes]}, indent=1))
    print(f"{args.target}: {summary['passed']} passed, {summary['failed']} failed, {summary['skipped']} skipped "
          f"in {elapsed:.0f} s (output in {workdir})")
    if args.target == "kafka":
        return 0
    expected = expectations.load()
    comparison = expectations.compare(outcomes, args.target, expected)
    report = comparison.describe(expected)
    if report:
        print(report)
    return 1 if comparison.regressions else 0


if __name__ == "__main__":
    sys.exit(main())
