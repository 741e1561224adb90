"""Hostile and unlucky input against a live broker: fuzzed frames, a full disk.

Invariant for every fuzzed frame: the broker either answers or closes that connection, and a well-behaved
client on another connection is served afterwards. The disk-full test mounts a small tmpfs (skipped where
mounting is not permitted): producers get KAFKA_STORAGE_ERROR while fetches of what was written go on.
"""

from __future__ import annotations

import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.produce.v8 import request as produce_v8

from copyless.broker.handlers import load_handlers
from tests.support.batches import build_batch, values_of
from tests.support.kio_requests import MS, create_topic, fetch, produce
from tests.support.live_broker import LiveBroker
from tests.support.tmpfs import mounted_tmpfs

SERVED = sorted(load_handlers().served().items())


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory):
    broker = LiveBroker(tmp_path_factory.mktemp("fuzz") / "data", "uvloop")
    client = broker.client()
    create_topic(client, "fuzz", 2)
    produce(client, "fuzz", {0: build_batch([b"seed"] * 3)})
    client.close()
    yield broker
    broker.stop()


def exchange(port: int, payload: bytes) -> None:
    """Send one payload, then read whatever comes back until the broker closes or goes quiet."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(2)
        while sock.recv(65536):
            pass
    except (TimeoutError, ConnectionError):
        pass
    finally:
        sock.close()


def assert_alive(broker: LiveBroker) -> None:
    client = broker.client()
    try:
        assert client.request(ApiVersionsRequest()).error_code == ErrorCode.none
    finally:
        client.close()


header_and_body = st.builds(
    lambda key_version, correlation_id, client_id, body: struct.pack(
        ">hhih", key_version[0], key_version[1], correlation_id, len(client_id)
    ) + client_id + body,
    st.one_of(
        st.sampled_from(SERVED).flatmap(lambda item: st.tuples(st.just(item[0]), st.integers(item[1][0], item[1][1]))),
        st.tuples(st.integers(-(2**15), 2**15 - 1), st.integers(-(2**15), 2**15 - 1)),
    ),
    st.integers(-(2**31), 2**31 - 1),
    st.binary(max_size=12),
    st.binary(max_size=300),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frame=header_and_body, framing=st.sampled_from(["exact", "short", "long", "raw"]))
def test_fuzzed_frames_never_hurt_the_broker(fuzz_broker, frame, framing):
    size = {"exact": len(frame), "short": max(0, len(frame) - 3), "long": len(frame) + 7}.get(framing)
    payload = frame if size is None else struct.pack(">i", size) + frame
    exchange(fuzz_broker.port, payload)
    assert_alive(fuzz_broker)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_produce_requests(fuzz_broker, data):
    client = fuzz_broker.client()
    request = produce_v8.ProduceRequest(
        transactional_id=None, acks=1, timeout=1000 * MS,
        topic_data=(produce_v8.TopicProduceData(name="fuzz", partition_data=(
            produce_v8.PartitionProduceData(index=0, records=build_batch([b"m" * 20] * 3)),)),),
    )
    frame = bytearray(client.frame(request))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(4, len(frame) - 1))
        frame[position] = data.draw(st.integers(0, 255))
    client.close()
    exchange(fuzz_broker.port, bytes(frame))
    assert_alive(fuzz_broker)
    # Whatever was accepted is still a readable log.
    check = fuzz_broker.client()
    partition = fetch(check, "fuzz", {0: 0}, partition_max_bytes=50 << 20).responses[0].partitions[0]
    assert partition.error_code == ErrorCode.none
    assert values_of(partition.records)[:3] == [b"seed"] * 3
    check.close()


@pytest.fixture
def small_disk(tmp_path):
    with mounted_tmpfs(tmp_path / "small", size_mib=40) as mount_point:
        yield mount_point


def test_disk_full_fails_produce_but_not_fetch(small_disk):
    live = LiveBroker(small_disk / "data", "uvloop", segment_bytes=1 << 20, segment_index_bytes=64 * 1024,
                      retention_check_interval_ms=3600_000)
    try:
        client = live.client()
        assert create_topic(client, "full").error_code == ErrorCode.none
        batch = build_batch([b"x" * 1000] * 200)
        codes = []
        for _ in range(300):
            item = produce(client, "full", {0: batch}).responses[0].partition_responses[0]
            codes.append(item.error_code)
            if item.error_code != ErrorCode.none:
                break
        assert codes[-1] == ErrorCode.kafka_storage_error
        accepted = codes.count(ErrorCode.none)
        assert accepted >= 1
        partition = fetch(client, "full", {0: 0}).responses[0].partitions[0]
        assert partition.error_code == ErrorCode.none
        assert partition.high_watermark == accepted * 200
        assert values_of(partition.records)[:200] == [b"x" * 1000] * 200
    finally:
        live.stop()
