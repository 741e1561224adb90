"""The installed distribution has one import name, ``copyless``, mapped from the repository's folders."""

from __future__ import annotations

import tomllib
from pathlib import Path

import copyless

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"copyless.broker": "broker", "copyless.client": "client", "copyless.protocol": "protocol"}


def test_every_package_folder_is_installed_under_copyless():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    on_disk = {"copyless"}
    for name, folder in FOLDERS.items():
        assert setuptools["package-dir"][name] == folder
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            on_disk.add(".".join([name, *relative.parts]))
    assert listed == on_disk, (f"pyproject lists {sorted(listed - on_disk)} that do not exist "
                               f"and misses {sorted(on_disk - listed)}")


def test_the_public_client_api_is_importable_from_copyless():
    from copyless import Admin, Consumer, Producer

    assert Producer.__module__ == "copyless.client.producer"
    assert Consumer.__module__ == "copyless.client.consumer"
    assert Admin.__module__ == "copyless.client.admin"
    assert copyless.__version__.count(".") >= 2


def test_no_module_imports_the_folders_by_their_repository_names():
    offenders = []
    for folder in ("broker", "client", "protocol", "benchmarks", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                stripped = line.strip()
                words = stripped.split(" ")[:2]
                if words in (["from", "broker"], ["import", "broker"], ["from", "client"], ["import", "client"]) or (
                        stripped.startswith(("from broker.", "import broker.", "from client.", "import client."))):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {stripped}")
    assert not offenders, "\n".join(offenders)


def test_the_image_build_hashes_and_copies_every_package_folder():
    # cluster/build-images.sh builds the wheel from a listed set of folders: a package-dir folder missing there
    # fails the image build, and one missing from the key would let a stale image pass for a current one.
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    line = next(line for line in (ROOT / "cluster" / "build-images.sh").read_text().splitlines()
                if line.startswith("SOURCES=("))
    sources = set(line[len("SOURCES=("):line.index(")")].split())
    assert set(setuptools["package-dir"].values()) <= sources, sources
