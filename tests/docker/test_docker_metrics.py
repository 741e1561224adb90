"""The compose file's opt-in "metrics" profile on the real engine: Prometheus scraping the three brokers.

Invariants: with the Prometheus image (cluster/build-images.sh --prometheus) and the profile on, the seven
containers turn healthy, Prometheus reports the three brokers' /metrics targets up (labelled broker1..3 by the
relabelling in cluster/prometheus.yml), and a query for the brokers' request counters returns one series per
broker. The profile off (every other docker test), no Prometheus container exists.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

import pytest

from tests.docker import docker_harness as harness
from tests.support.polling import wait_until

# Prometheus scraping the compose cluster (tests/cluster/test_cluster_metrics.py checks the metrics themselves): slow.
pytestmark = [pytest.mark.timeout(900), pytest.mark.usefixtures("cluster_mode"), pytest.mark.slow]

BROKERS = {"broker1", "broker2", "broker3"}


def _api(project: harness.ComposeProject, path: str, **query) -> dict:
    """Prometheus's HTTP API through its published port."""
    url = f"http://127.0.0.1:{project.ports['prometheus']}{path}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    with urllib.request.urlopen(url, timeout=10) as response:
        document = json.load(response)
    assert document["status"] == "success", document
    return document["data"]


def test_prometheus_scrapes_every_broker(compose_project):
    project = compose_project("cluster", metrics=True)
    project.timed_up(label="cluster with Prometheus (3 etcd + 3 brokers + prometheus)")
    assert project.state("prometheus").health == "healthy"

    targets: list = []

    def every_broker_up() -> bool:
        targets[:] = _api(project, "/api/v1/targets")["activeTargets"]
        return {t["labels"].get("broker"): t["health"] for t in targets} == dict.fromkeys(BROKERS, "up")

    wait_until(every_broker_up, what="Prometheus scraping every broker", timeout_s=60, interval_s=1,
               detail=lambda: f"its targets: {targets}")

    series = _api(project, "/api/v1/query", query="copyless_requests_total")["result"]
    assert {s["metric"]["broker"] for s in series} == BROKERS
    assert all(s["metric"]["job"] == "copyless" for s in series)
