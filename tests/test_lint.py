"""The linter's rules hold over the whole tree: pyproject's ``[tool.ruff.lint]`` selection as it stands
(pycodestyle errors and warnings with the 120-character line, pyflakes, isort, bugbear, pyupgrade, simplify,
less the ignores it lists with their reasons). A finding is fixed, or silenced on its line with a ``noqa``
and a comment saying why; a rule that is wrong for the whole tree goes to pyproject's ``ignore`` with its
reason, never to a list here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    # No --select: the rules are pyproject's, read from the pyproject.toml in ``cwd``.
    command = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_tree_passes_pyprojects_rules():
    result = ruff(".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_check_fails_on_an_unused_import(tmp_path):
    # The same invocation on a file with a finding: the rules are really applied, and findings fail it.
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("import os\n")
    result = ruff("bad.py", cwd=tmp_path)
    assert result.returncode == 1 and "F401" in result.stdout, result.stdout + result.stderr
