"""What librdkafka's suite is expected to do against copyless: ``expected.toml`` beside this file.

Every test not listed there is expected to pass on both copyless targets. A listed test names what it does
instead, and why::

    [tests."0081_admin"]
    expect = "fail"                 # "fail" or "skip", on every copyless target ...
    cluster = "pass"                # ... unless a target says otherwise ("pass", "fail", "skip")
    kafka = "fail"                  # what Apache Kafka 3.9.1 does under the same harness (for the record)
    reason = "ACLs: ..."            # required

``compare`` sorts a run's outcomes into regressions (expected to pass, did not), unexpected passes (listed
as failing, passed: the list is stale) and other mismatches (a listed skip that failed, and so on).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tests.librdkafka.suite import FAILED, PASSED, SKIPPED, Outcome

EXPECTED_PATH = Path(__file__).resolve().parent / "expected.toml"
_STATES = {"pass": PASSED, "fail": FAILED, "skip": SKIPPED}


@dataclass(frozen=True)
class Expectation:
    name: str
    states: dict[str, str]  # target -> PASSED / FAILED / SKIPPED
    reason: str
    kafka: str | None


def load(path: Path = EXPECTED_PATH) -> dict[str, Expectation]:
    with open(path, "rb") as file:
        document = tomllib.load(file)
    expectations = {}
    for name, entry in document.get("tests", {}).items():
        if not entry.get("reason"):
            raise ValueError(f"{path}: {name} has no reason")
        default = entry.get("expect", "pass")
        states = {target: _STATES[entry.get(target, default)] for target in ("single", "cluster")}
        expectations[name] = Expectation(name, states, entry["reason"], entry.get("kafka"))
    return expectations


def expected_state(expectations: dict[str, Expectation], name: str, target: str) -> str:
    entry = expectations.get(name)
    return entry.states[target] if entry else PASSED


@dataclass
class Comparison:
    regressions: list[Outcome] = field(default_factory=list)
    unexpected_passes: list[Outcome] = field(default_factory=list)
    mismatches: list[tuple[Outcome, str]] = field(default_factory=list)
    as_expected: list[Outcome] = field(default_factory=list)

    def describe(self, expectations: dict[str, Expectation]) -> str:
        lines = []
        for outcome in self.regressions:
            lines.append(f"REGRESSION {outcome.name} ({outcome.scenario}): {outcome.state}: {outcome.reason}")
        for outcome in self.unexpected_passes:
            lines.append(f"UNEXPECTED PASS {outcome.name}: listed as failing ({expectations[outcome.name].reason}); "
                         "update expected.toml")
        for outcome, expected in self.mismatches:
            lines.append(f"MISMATCH {outcome.name}: {outcome.state}, expected {expected}: {outcome.reason}")
        return "\n".join(lines)


def compare(outcomes: Iterable[Outcome], target: str, expectations: dict[str, Expectation]) -> Comparison:
    comparison = Comparison()
    for outcome in outcomes:
        expected = expected_state(expectations, outcome.name, target)
        if outcome.state == expected:
            comparison.as_expected.append(outcome)
        elif expected == PASSED:
            comparison.regressions.append(outcome)
        elif outcome.state == PASSED:
            comparison.unexpected_passes.append(outcome)
        else:
            comparison.mismatches.append((outcome, expected))
    return comparison
