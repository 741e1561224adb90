"""The type checker passes over the whole installed package, strictly over its pure cores.

mypy reads ``[tool.mypy]`` in pyproject: every module gets the default checks plus the bodies of unannotated
functions (``check_untyped_defs``), and the pure cores (the record and frame codecs, the config table, the
cluster's and storage's pure modules, listed in ``[[tool.mypy.overrides]]``) get ``strict``.

mypy finds modules by their path under a search root, and it cannot follow the import hook that an editable
install leaves in site-packages for pyproject's ``package-dir`` mapping (``broker/`` is ``copyless.broker``,
``client/`` is ``copyless.client``). So the check first lays the installed package out as a tree of symlinks,
one per source file, under ``.mypy_cache/package/copyless/`` (found through pyproject's mapping, as
tests/test_import_graph.py reads it); pyproject's ``mypy_path`` points there, and ``mypy -p copyless`` checks
the package as ``import copyless`` sees it. The interpreter running the check is the one whose site-packages
hold the dependencies, so their inline types (or their absence, listed in the config) are what the package is
checked against. Findings are reported with the repository's paths.

By hand, from the repository root: ``python -m tests.test_types`` (the same check; further mypy options after it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Inside mypy's own cache folder (ignored by git), so the tree and the cache are cleaned together.
TREE = ROOT / ".mypy_cache" / "package"


def package_folders() -> dict[str, Path]:
    """Package name -> its source folder, for every package the distribution installs."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dir: dict[str, str] = setuptools["package-dir"]
    folders: dict[str, Path] = {}
    for package in setuptools["packages"]:
        # The longest mapped prefix names the folder (copyless.broker.storage -> broker/storage).
        prefix = max((name for name in package_dir if package == name or package.startswith(name + ".")), key=len)
        folders[package] = ROOT / package_dir[prefix] / Path(*package[len(prefix):].split(".")[1:])
    return folders


def lay_out_package() -> dict[Path, Path]:
    """(Re)build the symlink tree of the installed package under TREE; returns link -> source file."""
    shutil.rmtree(TREE, ignore_errors=True)
    links: dict[Path, Path] = {}
    for package, folder in package_folders().items():
        target = TREE.joinpath(*package.split("."))
        target.mkdir(parents=True, exist_ok=True)
        for source in folder.glob("*.py"):
            (target / source.name).symlink_to(source)
            links[target / source.name] = source
    return links


def mypy(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """mypy under this interpreter, with pyproject's configuration found from ``cwd``."""
    command = [sys.executable, "-m", "mypy", "--no-error-summary", "--show-error-codes", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)


def check_package(*args: str) -> subprocess.CompletedProcess[str]:
    """``mypy -p copyless`` (and any further options) over a fresh layout of the package."""
    links = lay_out_package()
    result = mypy("-p", "copyless", *args)
    # Report the repository's paths, not the symlinks' (mypy prints them relative to the working directory).
    for link, source in sorted(links.items(), key=lambda item: -len(str(item[0]))):
        result.stdout = result.stdout.replace(str(link.relative_to(ROOT)), str(source.relative_to(ROOT)))
    return result


def test_the_package_type_checks():
    result = check_package()
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_check_fails_on_an_ill_typed_module(tmp_path):
    # The same configuration on a file with a type error, strict where the config says strict: the checks are
    # really applied, and a finding fails the run.
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text(
        "def length(text: str) -> int:\n"
        "    return len(text)\n"
        "\n"
        "\n"
        "def caller():\n"
        "    length(42)\n")
    # The repository's cache: the standard library's types are read from it, not parsed again (~10 s).
    result = mypy("--cache-dir", str(ROOT / ".mypy_cache"), "bad.py", cwd=tmp_path)
    assert result.returncode == 1 and "[arg-type]" in result.stdout, result.stdout + result.stderr


if __name__ == "__main__":
    outcome = check_package(*sys.argv[1:])
    sys.stdout.write(outcome.stdout + outcome.stderr)
    sys.exit(outcome.returncode)
