"""The linter's error rules hold over the whole tree: pyflakes (unused or undefined names, imports that
shadow each other, unused variables), pycodestyle's non-style errors (E4 imports, E7 statements, E9 syntax)
and its whitespace warnings (W), and bugbear's likely bugs (B: mutable defaults, a comparison or expression
whose value is dropped, as in a test that asserts nothing, an ``except`` that raises without ``from``).

pyproject's ``[tool.ruff.lint] select`` is the wider target (isort, bugbear, pyupgrade, simplify and the line
length); the tree does not pass all of it yet, so the suite enforces this subset, and a rule joins
``ENFORCED`` once the tree is clean of it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENFORCED = ("F", "E4", "E7", "E9", "W", "B")
# bugbear rules the tree does not pass yet (findings today: B905 41, B023 15, B007 6; B008 and B009 one each,
# in storage and the handler table). Delete an entry once the tree is clean of it.
NOT_YET = ("B905", "B023", "B007", "B008", "B009")


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
               "--select", ",".join(ENFORCED), "--ignore", ",".join(NOT_YET), *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_tree_passes_the_enforced_rules():
    result = ruff(".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_check_fails_on_an_unused_import(tmp_path):
    # The same invocation on a file with a finding: the rules are really applied, and findings fail it.
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("import os\n")
    result = ruff("bad.py", cwd=tmp_path)
    assert result.returncode == 1 and "F401" in result.stdout, result.stdout + result.stderr
