"""Reading a broker's ``/metrics`` as Prometheus does: the address from the broker's log line, one scrape
parsed by Prometheus's own text-format parser (``prometheus_client.parser``)."""

from __future__ import annotations

import re
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.support.polling import wait_until

_METRICS_LINE = re.compile(r"serving Prometheus metrics on http://([\d.]+):(\d+)/metrics")


def metrics_address(proc) -> tuple[str, int]:
    """Where ``proc`` (a BrokerProcess started with ``--metrics-listen``) serves its metrics."""
    found = wait_until(lambda: _METRICS_LINE.search(proc.log_text()), what="the metrics endpoint's log line",
                       timeout_s=30)
    return found.group(1), int(found.group(2))


def scrape(address) -> dict:
    """{(sample name, sorted labels): value} of one scrape. Fails on anything but a 200 in the text format."""
    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))
