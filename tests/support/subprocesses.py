"""Child Python processes that run this checkout: brokers, benchmarks, client members, scripts."""

from __future__ import annotations

import os
import signal
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def python_env(**extra: str) -> dict[str, str]:
    """This process's environment plus ``extra``, with the repository first on PYTHONPATH, so a child
    ``python -m benchmarks.<name>`` or a script under tests/ imports this checkout whatever its cwd."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    return env


def as_from_a_terminal() -> None:
    """``preexec_fn`` for a child a test will Ctrl-C: SIGINT at its default, as a shell's foreground job has
    it. A suite started in the background (``nohup``, ``&`` without job control) ignores SIGINT, and an ignored
    signal stays ignored across exec: the child's Python would keep ignoring it too."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
