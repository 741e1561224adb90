"""librdkafka's own test runner, built once per source version from Debian's ``librdkafka`` source package.

``ensure_built()`` returns the source tree's ``tests/`` directory, where ``test-runner`` is. The tree lives in
a cache outside the checkout, ``$XDG_CACHE_HOME/copyless/librdkafka-<Debian version>/`` (``~/.cache`` when
unset), so a fresh clone or a new virtualenv reuses it and only a new source version rebuilds. Steps, each
skipped when its result is there:

1. ``apt-get source --download-only librdkafka=<version>`` (needs a ``deb-src`` entry: ``tests/run.sh`` adds
   one as root) and ``dpkg-source -x``, which applies Debian's patches;
2. ``./configure``, ``make libs`` (librdkafka and librdkafka++ themselves: the runner links the tree's own
   build, not the installed ``librdkafka1``) and ``make -C tests test-runner``;
3. the ``built`` stamp, written last: a build killed half-way leaves no stamp and starts over.

The build takes about 3 minutes of 2 cores (1m51 s of CPU). Two processes building at once serialize on a
lock file. Run as ``python -m tests.librdkafka.build`` to build ahead (tests/run.sh does).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE_PACKAGE = "librdkafka"
# What the build needs besides a C/C++ toolchain: Debian's Build-Depends for librdkafka 2.0.2 without
# debhelper and python3 (packaging only). tests/run.sh installs them.
BUILD_PACKAGES = ("g++", "make", "dpkg-dev", "liblz4-dev", "libsasl2-dev", "libssl-dev", "libzstd-dev",
                  "rapidjson-dev", "zlib1g-dev")
# A stuck download or compiler is an error, not a hang; the build itself takes ~3 minutes here.
BUILD_TIMEOUT_S = 1800


class BuildUnavailable(RuntimeError):
    """The source package or the tools to build it are not there (no deb-src entry, not Debian)."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "copyless"


def source_version() -> str:
    """The Debian version of the ``librdkafka`` source package apt would fetch (e.g. ``2.0.2-1``)."""
    if shutil.which("apt-cache") is None:
        raise BuildUnavailable("apt-cache not found: librdkafka's source comes from Debian's packages")
    result = subprocess.run(["apt-cache", "showsrc", SOURCE_PACKAGE], capture_output=True, text=True)
    versions = [line.split(":", 1)[1].strip() for line in result.stdout.splitlines() if line.startswith("Version:")]
    if not versions:
        raise BuildUnavailable(
            "apt-cache showsrc librdkafka found nothing: add a deb-src entry and run apt-get update "
            "(tests/run.sh does, as root)")
    return _newest(versions)


def _newest(versions: list[str]) -> str:
    newest = versions[0]
    for version in versions[1:]:
        if subprocess.run(["dpkg", "--compare-versions", version, "gt", newest]).returncode == 0:
            newest = version
    return newest


def tests_dir(version: str) -> Path:
    return cache_root() / f"librdkafka-{version}" / "src" / "tests"


def is_built(version: str) -> bool:
    return (cache_root() / f"librdkafka-{version}" / "built").exists()


def ensure_built(*, log=sys.stderr) -> Path:
    """Build librdkafka's test runner unless this source version's build is cached; returns its tests dir.

    Raises:
        BuildUnavailable: no source package or toolchain on this machine.
        subprocess.CalledProcessError: a step failed (its output is in ``build.log`` beside the tree).
    """
    version = source_version()
    root = cache_root() / f"librdkafka-{version}"
    if is_built(version):
        return tests_dir(version)
    for tool in ("dpkg-source", "make", "g++"):
        if shutil.which(tool) is None:
            raise BuildUnavailable(f"{tool} not found (Debian: apt-get install {' '.join(BUILD_PACKAGES)})")
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_built(version):
            return tests_dir(version)
        print(f"building librdkafka {version}'s test runner in {root} (about 3 minutes, once)", file=log)
        with open(root / "build.log", "ab") as build_log:
            _build(root, version, build_log)
        (root / "built").write_text(version + "\n")
    return tests_dir(version)


def _run(argv: list[str], cwd: Path, build_log) -> None:
    build_log.write(f"\n$ {' '.join(argv)}  (in {cwd})\n".encode())
    build_log.flush()
    subprocess.run(argv, cwd=cwd, stdout=build_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                   check=True, timeout=BUILD_TIMEOUT_S)


def _build(root: Path, version: str, build_log) -> None:
    download = root / "download"
    source = root / "src"
    if not any(download.glob("*.dsc")):
        download.mkdir(exist_ok=True)
        _run(["apt-get", "source", "--download-only", f"{SOURCE_PACKAGE}={version}"], download, build_log)
    if not (source / "configure").exists():
        shutil.rmtree(source, ignore_errors=True)
        (dsc,) = download.glob("*.dsc")
        _run(["dpkg-source", "--no-check", "-x", str(dsc), str(source)], root, build_log)
    jobs = f"-j{os.cpu_count() or 1}"
    _run(["./configure", "--disable-debug-symbols"], source, build_log)
    _run(["make", jobs, "libs"], source, build_log)
    _run(["make", jobs, "-C", "tests", "test-runner"], source, build_log)


if __name__ == "__main__":
    try:
        print(ensure_built())
    except BuildUnavailable as exc:
        print(f"librdkafka's test runner not built: {exc}", file=sys.stderr)
        sys.exit(2)
