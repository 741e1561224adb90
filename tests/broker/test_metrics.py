"""``--metrics-listen``: the Prometheus endpoint of a real broker process, read with Prometheus's own
text-format parser (``prometheus_client.parser``), after real clients produced, consumed and asked for a
topic that does not exist; and its HTTP answers to requests that are not a scrape.
"""

from __future__ import annotations

import re
import socket
import urllib.error
import urllib.request

import pytest

from tests.support.clients import ConfluentDriver, make_records, now_ms
from tests.support.cluster import read_metadata
from tests.support.metrics import metrics_address, scrape, value
from tests.support.polling import wait_until
from tests.support.topics import unique_topic


def test_metrics_after_real_clients(broker_factory):
    proc = broker_factory(extra_args=("--metrics-listen", "127.0.0.1:0"))
    address = metrics_address(proc)
    topic = unique_topic("m")
    driver = ConfluentDriver()
    driver.create_topic(proc.bootstrap, topic, 1)
    records = make_records(20, base_ts_ms=now_ms(), tag="m")
    driver.produce(proc.bootstrap, topic, records, acks="all", codec="none")
    assert len(driver.consume(proc.bootstrap, topic, 0, 0, 20)) == 20
    # An illegal name: INVALID_TOPIC_EXCEPTION in the Metadata answer.
    assert read_metadata(proc.bootstrap, ["no/such"]).topic_errors == {"no/such": 17}

    samples = wait_until(lambda: (s := scrape(address))
                         and value(s, "copyless_topic_bytes_out_total", topic=topic) and s,
                         what="the consumer's bytes counted", timeout_s=10)
    assert value(samples, "copyless_requests_total", api="Produce") >= 1
    assert value(samples, "copyless_requests_total", api="Fetch") >= 1
    bytes_in = value(samples, "copyless_topic_bytes_in_total", topic=topic)
    # One consumer read the partition once, from its first offset: every byte appended went out once.
    assert bytes_in > 0 and value(samples, "copyless_topic_bytes_out_total", topic=topic) == bytes_in
    assert value(samples, "copyless_fetch_bytes_total", reader="consumer", path="sendfile") >= bytes_in
    assert value(samples, "copyless_fetch_bytes_total", reader="consumer", path="copied") == 0
    assert value(samples, "copyless_produced_records_total") == 20
    labels = {"topic": topic, "partition": "0"}
    assert value(samples, "copyless_partition_log_end_offset", **labels) == 20
    assert value(samples, "copyless_partition_high_watermark", **labels) == 20
    assert value(samples, "copyless_partition_log_start_offset", **labels) == 0
    assert value(samples, "copyless_partition_leader", **labels) == 1
    assert value(samples, "copyless_request_errors_total", api="Metadata", error="INVALID_TOPIC_EXCEPTION") == 1
    assert value(samples, "copyless_under_replicated_partitions") == 0
    assert value(samples, "copyless_controller_active") == 1

    # A histogram per API, as Prometheus reads histograms: cumulative buckets up to +Inf == count.
    buckets = sorted((float(dict(key)["le"]), count) for (name, key), count in samples.items()
                     if name == "copyless_request_duration_seconds_bucket" and dict(key)["api"] == "Produce")
    counts = [count for _le, count in buckets]
    assert counts == sorted(counts) and buckets[-1][0] == float("inf")
    assert buckets[-1][1] == value(samples, "copyless_request_duration_seconds_count", api="Produce") >= 1
    assert value(samples, "copyless_request_duration_seconds_sum", api="Produce") > 0


def test_the_metrics_endpoint_answers_only_scrapes(broker_factory):
    proc = broker_factory(extra_args=("--metrics-listen", "127.0.0.1:0"))
    host, port = metrics_address(proc)
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"http://{host}:{port}/other", timeout=10)
    assert missing.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as posted:
        urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/metrics", data=b"x"), timeout=10)
    assert posted.value.code == 405
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"garbage\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 400")
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Long: " + b"a" * 20000 + b"\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 400")
    # Two scrapes on one keep-alive connection, as Prometheus does.
    with socket.create_connection((host, port), timeout=10) as sock:
        for _ in range(2):
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(4096)
            length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
            body = head.split(b"\r\n\r\n", 1)[1]
            while len(body) < length:
                body += sock.recv(65536)
            assert b"copyless_requests_total" in body
    assert value(scrape((host, port)), "copyless_connections_open") == 0
