"""`cluster/up.sh --secure`, as a user runs it: a CA, the brokers' certificate and SCRAM credentials made by
cluster/make-secure.sh, every listener SASL_SSL with SCRAM-SHA-512 (inter-broker included) and the ACL
authorizer; then `cluster/demo.sh --secure` kills a leader and checks every acknowledged record through it.

Invariants: the cluster becomes healthy (its healthcheck speaks TLS); a client without credentials is refused
(kcat over PLAINTEXT gets no metadata); the demo's verdict is PASS with nothing lost; and no password from
the project's credentials appears in any broker's log.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.docker import docker_harness as harness


@pytest.mark.slow  # a second compose cluster, with TLS and SASL; tests/security covers both in CI
def test_secure_cluster_runs_the_demo(compose_project):
    project = compose_project("cluster")
    env = dict(project.env, COMPOSE_PROJECT_NAME=project.name, PYTHON=sys.executable)
    secure_dir = harness.CLUSTER_DIR / ".secure" / project.name
    try:
        up = harness.run([str(harness.CLUSTER_DIR / "up.sh"), "--secure", "--timeout", "240"], timeout_s=600,
                         check=False, env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "SASL_SSL with SCRAM-SHA-512 everywhere" in up.stdout
        properties = secure_dir / "admin.properties"
        assert properties.exists() and properties.stat().st_mode & 0o077 == 0
        bootstrap = project.bootstrap()
        if shutil.which("kcat"):
            refused = subprocess.run(["kcat", "-b", bootstrap.split(",")[0], "-L", "-m", "5"], capture_output=True,
                                     text=True, timeout=60)
            assert refused.returncode != 0 and "Broker transport failure" in refused.stderr
            listed = subprocess.run(["kcat", "-b", bootstrap.split(",")[0], "-F", str(properties), "-L"],
                                    capture_output=True, text=True, timeout=60)
            assert listed.returncode == 0 and "3 brokers" in listed.stdout, listed.stderr
        demo = harness.run([str(harness.CLUSTER_DIR / "demo.sh"), "--secure", "--project", project.name,
                            "--bootstrap", bootstrap, "--json", "--timeout", "600"], timeout_s=700, check=False,
                           env=env)
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert "\nverdict: PASS: " in demo.stdout
        summary = json.loads(demo.stdout.strip().splitlines()[-1])
        assert summary["ok"] is True and summary["lost"] == 0 and summary["acknowledged"] > 0
        passwords = [line.split("=", 1)[1] for line in (secure_dir / "passwords").read_text().splitlines()]
        for service in ("broker1", "broker2", "broker3"):
            logs = project.logs(service)
            assert "listeners INTERNAL=SASL_SSL EXTERNAL=SASL_SSL" in logs
            for password in passwords:
                assert password not in logs, f"a password is in {service}'s log"
    finally:
        shutil.rmtree(secure_dir, ignore_errors=True)
        os.environ.pop("COPYLESS_SECURE_DIR", None)
