"""cluster/build-images.sh's cache and the harness's cleanup rule, on the real Docker engine.

Invariants: a second build with nothing changed builds nothing (both images keep their ids, both reported up to
date); the copyless image's key follows the package's sources and not where the checkout lives, and a source
edit changes it while the base's key stays; the images carry what the compose files run (the copyless console
script, copyless-health, etcd and etcdctl, Python 3.11). Leftovers of a test run whose process is gone are
removed by name, while a live run's projects are left alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.docker import docker_harness as harness

pytestmark = pytest.mark.timeout(900)


def _image_id(reference: str) -> str:
    return harness.run(["docker", "image", "inspect", "--format", "{{.Id}}", reference]).stdout.strip()


def _print_tags(root) -> list[str]:
    return harness.run([str(root / "cluster" / "build-images.sh"), "--print-tags"]).stdout.split()


def test_a_second_build_builds_nothing(copyless_images):
    before = {ref: _image_id(ref) for ref in (copyless_images.base, copyless_images.copyless)}
    result = harness.run([str(harness.CLUSTER_DIR / "build-images.sh")], timeout_s=120)
    assert result.stdout.split()[-2:] == [copyless_images.base, copyless_images.copyless]
    assert "is up to date" in result.stderr.splitlines()[0] and "is up to date" in result.stderr.splitlines()[1]
    assert "making" not in result.stderr and "building" not in result.stderr, result.stderr
    assert {ref: _image_id(ref) for ref in before} == before
    # The stable names point at the content-keyed tags.
    base_tag, image_tag = _print_tags(harness.REPO_ROOT)
    assert _image_id(base_tag) == before[copyless_images.base]
    assert _image_id(image_tag) == before[copyless_images.copyless]


def test_the_image_key_follows_the_sources(copyless_images, tmp_path):
    checkout = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("cluster", "copyless", "broker", "client", "protocol"):
        shutil.copytree(harness.REPO_ROOT / name, checkout / name, ignore=ignore)
    for name in ("Dockerfile", "pyproject.toml", "README.md"):
        shutil.copy2(harness.REPO_ROOT / name, checkout / name)

    base_tag, image_tag = _print_tags(harness.REPO_ROOT)
    assert _print_tags(checkout) == [base_tag, image_tag]

    with open(checkout / "broker" / "config.py", "a") as f:
        f.write("\n# an edit\n")
    edited_base_tag, edited_image_tag = _print_tags(checkout)
    assert edited_base_tag == base_tag
    assert edited_image_tag != image_tag


def test_the_images_carry_what_the_compose_files_run(copyless_images):
    def in_image(image: str, script: str) -> str:
        return harness.run(["docker", "run", "--rm", "--entrypoint", "sh", image, "-c", script], timeout_s=120).stdout

    versions = in_image(copyless_images.base, "python3 --version; etcd --version; etcdctl version")
    assert "Python 3.11." in versions and "etcd Version: 3." in versions and "etcdctl version: 3." in versions
    tools = in_image(copyless_images.copyless,
                     "copyless serve --help >/dev/null && command -v copyless && command -v copyless-health")
    assert tools.split() == ["/opt/venv/bin/copyless", "/usr/local/bin/copyless-health"]
    # Nothing listens in a bare container: the probe must say unhealthy, not crash or pass.
    probe = harness.run(["docker", "run", "--rm", "--entrypoint", "copyless-health", copyless_images.copyless],
                        check=False, timeout_s=120)
    assert probe.returncode == 1 and "unhealthy" in probe.stderr


def test_leftovers_of_a_dead_run_are_removed_and_a_live_runs_kept(docker_engine):
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(finished.stdout)
    if harness.project_owner_alive(f"{harness.PROJECT_PREFIX}{dead_pid}-x"):
        pytest.skip(f"pid {dead_pid} was reused at once")
    dead = f"{harness.PROJECT_PREFIX}{dead_pid}-{os.urandom(4).hex()}"
    live = f"{harness.PROJECT_PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
    try:
        for project in (dead, live):
            label = f"{harness.PROJECT_LABEL}={project}"
            harness.run(["docker", "volume", "create", "--label", label, f"{project}_data"])
            harness.run(["docker", "network", "create", "--label", label, f"{project}_default"])

        removed = harness.remove_leftovers()

        assert sorted(r for r in removed if dead in r) == [f"network {dead}_default", f"volume {dead}_data"]
        assert not any(live in r for r in removed)
        assert harness.run(["docker", "volume", "inspect", f"{dead}_data"], check=False).returncode != 0
        assert harness.run(["docker", "volume", "inspect", f"{live}_data"], check=False).returncode == 0
    finally:
        harness.remove_project_objects(dead)
        harness.remove_project_objects(live)
