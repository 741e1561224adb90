"""A few Kafka requests and responses encoded by hand, and a blocking connection to send them on.

Deliberately independent of the broker's and the client's own codecs (and of kio): the bytes here follow
the Kafka protocol spec directly (big-endian, int16-length strings, int32-length arrays and bytes; request
header v1 = api_key int16, api_version int16, correlation_id int32, client_id nullable string), so a bug
shared by the broker's codec and ours cannot cancel out. Versions used: ApiVersions v0 (and v3 for its
flexible header), Metadata v1, Produce v3, Fetch v4, ListOffsets v1, CreateTopics v0/v2, InitProducerId v0,
SaslHandshake v0/v1, SaslAuthenticate v0/v1.
The record batches these requests carry come from ``tests.support.batches``.

Besides the codec: ``RawConnection`` (one socket, requests answered in order), and the steps raw-protocol
tests share: ``ensure_topic`` (auto-create through Metadata), ``wait_fetchable``, ``produce_one``,
``high_watermark``, ``fetch_all``, ``init_producer_id``, ``health_check``.
"""

from __future__ import annotations

import itertools
import socket
import struct
import time
from dataclasses import dataclass

from tests.support.batches import uvarint
from tests.support.polling import wait_until

API_PRODUCE, API_FETCH, API_LIST_OFFSETS, API_METADATA = 0, 1, 2, 3
API_VERSIONS, API_CREATE_TOPICS, API_DELETE_TOPICS, API_INIT_PRODUCER_ID = 18, 19, 20, 22
API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE = 17, 36
MAX_REQUEST_BYTES = 100 * 1024 * 1024  # socket.request.max.bytes


# -- primitives ----------------------------------------------------------------------------------------------
def string(value: str | None) -> bytes:
    if value is None:
        return struct.pack(">h", -1)
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def nbytes(value: bytes | None) -> bytes:
    if value is None:
        return struct.pack(">i", -1)
    return struct.pack(">i", len(value)) + value


def array(items: list[bytes] | None) -> bytes:
    if items is None:
        return struct.pack(">i", -1)
    return struct.pack(">i", len(items)) + b"".join(items)


def request(api_key: int, api_version: int, correlation_id: int, body: bytes, client_id: str | None = "fuzz") -> bytes:
    """A size-prefixed request frame with header v1."""
    payload = struct.pack(">hhi", api_key, api_version, correlation_id) + string(client_id) + body
    return struct.pack(">i", len(payload)) + payload


# -- requests ------------------------------------------------------------------------------------------------
def api_versions_v0(correlation_id: int) -> bytes:
    return request(API_VERSIONS, 0, correlation_id, b"")


def api_versions_v3(correlation_id: int, version: int = 3) -> bytes:
    """What librdkafka sends first (kafka-python the same at v4): header v2 (v1 + empty tagged fields),
    compact client software name and version, empty tagged fields."""
    body = b"\x00"  # header tagged fields
    body += uvarint(len(b"librdkafka") + 1) + b"librdkafka" + uvarint(len(b"2.16.1") + 1) + b"2.16.1" + b"\x00"
    return request(API_VERSIONS, version, correlation_id, body, client_id="rdkafka")


def metadata_v1(correlation_id: int, topics: list[str] | None = None) -> bytes:
    return request(API_METADATA, 1, correlation_id, array(None if topics is None else [string(t) for t in topics]))


def produce_v3(correlation_id: int, topic: str, partition: int, records: bytes, acks: int = -1,
               timeout_ms: int = 10000) -> bytes:
    partition_data = struct.pack(">i", partition) + nbytes(records)
    body = string(None) + struct.pack(">hi", acks, timeout_ms) + array([string(topic) + array([partition_data])])
    return request(API_PRODUCE, 3, correlation_id, body)


def produce_v3_partitions(correlation_id: int, topic: str, records_by_partition: dict[int, bytes],
                          acks: int = -1) -> bytes:
    """One Produce v3 request carrying a batch for each of several partitions of one topic."""
    partitions = [struct.pack(">i", p) + nbytes(records) for p, records in records_by_partition.items()]
    body = string(None) + struct.pack(">hi", acks, 10000) + array([string(topic) + array(partitions)])
    return request(API_PRODUCE, 3, correlation_id, body)


def fetch_v4(correlation_id: int, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20,
             max_wait_ms: int = 0) -> bytes:
    part = struct.pack(">iqi", partition, offset, max_bytes)
    body = struct.pack(">iiiib", -1, max_wait_ms, 1, max_bytes, 0) + array([string(topic) + array([part])])
    return request(API_FETCH, 4, correlation_id, body)


def fetch_v4_partitions(correlation_id: int, topic: str, partitions: list[int], max_bytes: int,
                        partition_max_bytes: int) -> bytes:
    """Fetch v4 of several partitions of one topic, each from offset 0, with both byte limits."""
    parts = [struct.pack(">iqi", p, 0, partition_max_bytes) for p in partitions]
    body = struct.pack(">iiiib", -1, 0, 1, max_bytes, 0) + array([string(topic) + array(parts)])
    return request(API_FETCH, 4, correlation_id, body)


def list_offsets_v1(correlation_id: int, topic: str, partition: int, timestamp_ms: int) -> bytes:
    body = struct.pack(">i", -1) + array([string(topic) + array([struct.pack(">iq", partition, timestamp_ms)])])
    return request(API_LIST_OFFSETS, 1, correlation_id, body)


def create_topics_v0(correlation_id: int, topic: str, partitions: int = 1) -> bytes:
    entry = string(topic) + struct.pack(">ih", partitions, 1) + array([]) + array([])
    return request(API_CREATE_TOPICS, 0, correlation_id, array([entry]) + struct.pack(">i", 10000))


def create_topics_v2(correlation_id: int, topic: str, partitions: int = 1) -> bytes:
    """CreateTopics v2 (the lowest version Kafka 4 accepts): v0's fields plus validate_only."""
    entry = string(topic) + struct.pack(">ih", partitions, 1) + array([]) + array([])
    return request(API_CREATE_TOPICS, 2, correlation_id, array([entry]) + struct.pack(">ib", 10000, 0))


def init_producer_id_v0(correlation_id: int) -> bytes:
    return request(API_INIT_PRODUCER_ID, 0, correlation_id, string(None) + struct.pack(">i", 60000))


def sasl_handshake(correlation_id: int, mechanism: str, version: int = 1) -> bytes:
    return request(API_SASL_HANDSHAKE, version, correlation_id, string(mechanism))


def sasl_authenticate(correlation_id: int, token: bytes, version: int = 1) -> bytes:
    return request(API_SASL_AUTHENTICATE, version, correlation_id, nbytes(token))


def raw_token(token: bytes) -> bytes:
    """A bare SASL token frame (after a v0 SaslHandshake): the size, then the token, no header."""
    return struct.pack(">i", len(token)) + token


# -- responses -----------------------------------------------------------------------------------------------
class Reader:
    def __init__(self, data: bytes, cursor: int = 0):
        self.data, self.cursor = data, cursor

    def take(self, fmt: str):
        values = struct.unpack_from(fmt, self.data, self.cursor)
        self.cursor += struct.calcsize(fmt)
        return values if len(values) > 1 else values[0]

    def string(self) -> str | None:
        length = self.take(">h")
        if length < 0:
            return None
        value = self.data[self.cursor : self.cursor + length].decode()
        self.cursor += length
        return value

    def nbytes(self) -> bytes | None:
        length = self.take(">i")
        if length < 0:
            return None
        value = self.data[self.cursor : self.cursor + length]
        self.cursor += length
        return value

    def array(self, item) -> list | None:
        count = self.take(">i")
        if count < 0:
            return None
        return [item(self) for _ in range(count)]


def parse_sasl_handshake(body: bytes) -> tuple[int, list[str]]:
    r = Reader(body)
    error = r.take(">h")
    return error, r.array(lambda r: r.string()) or []


def parse_sasl_authenticate(body: bytes, version: int = 1) -> tuple[int, str | None, bytes, int]:
    """(error, error message, auth bytes, session lifetime ms; 0 below v1)."""
    r = Reader(body)
    error = r.take(">h")
    message = r.string()
    token = r.nbytes() or b""
    lifetime = r.take(">q") if version >= 1 else 0
    return error, message, token, lifetime


def parse_api_versions_v0(body: bytes) -> tuple[int, dict[int, tuple[int, int]]]:
    r = Reader(body)
    error = r.take(">h")
    entries = r.array(lambda r: r.take(">hhh"))
    return error, {key: (lo, hi) for key, lo, hi in entries or []}


@dataclass
class TopicMetadata:
    error_code: int
    name: str
    partitions: dict[int, tuple[int, int]]  # partition -> (error_code, leader)


def parse_metadata_v1(body: bytes) -> tuple[list[tuple[int, str, int]], int, dict[str, TopicMetadata]]:
    r = Reader(body)
    brokers = r.array(lambda r: (r.take(">i"), r.string(), r.take(">i"), r.string())[:3])
    controller_id = r.take(">i")

    def partition(r):
        error, index, leader = r.take(">hii")
        r.array(lambda r: r.take(">i"))
        r.array(lambda r: r.take(">i"))
        return index, (error, leader)

    def topic(r):
        error = r.take(">h")
        name = r.string()
        r.take(">b")
        return TopicMetadata(error, name, dict(r.array(partition)))

    topics = {t.name: t for t in r.array(topic)}
    return brokers, controller_id, topics


def parse_produce_v3(body: bytes) -> tuple[int, int]:
    """(error_code, base_offset) of the single partition in the response."""
    r = Reader(body)
    r.take(">i")
    r.string()
    r.take(">i")
    r.take(">i")
    error, base_offset, _ = r.take(">hqq")
    return error, base_offset


def parse_produce_v3_partitions(body: bytes) -> dict[int, tuple[int, int]]:
    """partition -> (error_code, base_offset) for a single-topic response."""
    r = Reader(body)
    r.take(">i")
    r.string()

    def partition(r):
        index, error, base_offset, _ = r.take(">ihqq")
        return index, (error, base_offset)

    return dict(r.array(partition))


@dataclass
class FetchedPartition:
    error_code: int
    high_watermark: int
    records: bytes


def parse_fetch_v4(body: bytes) -> FetchedPartition:
    r = Reader(body)
    r.take(">i")  # throttle
    r.take(">i")  # topics
    r.string()
    r.take(">i")  # partitions
    _, error, high_watermark, _ = r.take(">ihqq")
    r.array(lambda r: r.take(">qq"))
    return FetchedPartition(error, high_watermark, r.nbytes() or b"")


def parse_init_producer_id_v0(body: bytes) -> tuple[int, int, int]:
    """(error_code, producer_id, producer_epoch)."""
    _, error, producer_id, epoch = struct.unpack_from(">ihqh", body)
    return error, producer_id, epoch


def parse_fetch_v4_partitions(body: bytes) -> dict[int, FetchedPartition]:
    r = Reader(body)
    r.take(">i")  # throttle
    r.take(">i")  # topics
    r.string()
    out = {}
    for _ in range(r.take(">i")):
        partition, error, high_watermark, _ = r.take(">ihqq")
        r.array(lambda r: r.take(">qq"))
        out[partition] = FetchedPartition(error, high_watermark, r.nbytes() or b"")
    return out


def parse_list_offsets_v1(body: bytes) -> tuple[int, int, int]:
    r = Reader(body)
    r.take(">i")
    r.string()
    r.take(">i")
    _, error, timestamp, offset = r.take(">ihqq")
    return error, timestamp, offset


# -- a blocking raw connection -------------------------------------------------------------------------------
class ConnectionClosed(Exception):
    pass


class RawConnection:
    """``ssl_context``: TLS first (server name 127.0.0.1's certificate must carry that IP)."""

    def __init__(self, host: str, port: int, timeout_s: float = 10.0, ssl_context=None):
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is not None:
            self.sock = ssl_context.wrap_socket(self.sock, server_hostname=host)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_exact(self, size: int, deadline: float) -> bytes:
        chunks, got = [], 0
        while got < size:
            self.sock.settimeout(max(0.001, deadline - time.monotonic()))
            chunk = self.sock.recv(min(size - got, 1 << 20))
            if not chunk:
                raise ConnectionClosed(f"closed after {got} of {size} bytes")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def recv_frame(self, timeout_s: float = 10.0) -> tuple[int, bytes]:
        """(correlation_id, body after the response header v0)."""
        deadline = time.monotonic() + timeout_s
        (size,) = struct.unpack(">i", self.recv_exact(4, deadline))
        if size < 4 or size > MAX_REQUEST_BYTES:
            raise AssertionError(f"broker sent a response frame of size {size}")
        payload = self.recv_exact(size, deadline)
        return struct.unpack_from(">i", payload)[0], payload[4:]

    def roundtrip(self, frame: bytes, timeout_s: float = 10.0) -> bytes:
        (correlation_id,) = struct.unpack_from(">i", frame, 8)
        self.send(frame)
        got_id, body = self.recv_frame(timeout_s)
        if got_id != correlation_id:
            raise AssertionError(f"response correlation id {got_id}, expected {correlation_id}")
        return body

    def wait_closed(self, timeout_s: float) -> bool:
        """True once the peer closes (EOF or reset); False if still open at the deadline. Drains responses."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                if not self.sock.recv(1 << 16):
                    return True
            except TimeoutError:
                return False
            except (ConnectionResetError, BrokenPipeError):
                return True
        return False


def health_check(host: str, port: int, timeout_s: float = 10.0) -> None:
    """ApiVersions v0 + Metadata v1 on a fresh connection: both answered, well-formed, error-free."""
    with RawConnection(host, port, timeout_s) as conn:
        error, versions = parse_api_versions_v0(conn.roundtrip(api_versions_v0(101), timeout_s))
        assert error == 0, f"ApiVersions error {error}"
        assert API_METADATA in versions and API_PRODUCE in versions and API_FETCH in versions
        brokers, controller_id, _ = parse_metadata_v1(conn.roundtrip(metadata_v1(102, []), timeout_s))
        assert brokers, "Metadata lists no broker"
        assert controller_id >= 0


# -- steps the raw-protocol tests share ----------------------------------------------------------------------
def ensure_topic(conn: RawConnection, topic: str) -> None:
    """Create by auto-creation through Metadata (asking again until partition 0 has a leader)."""
    correlation_ids = itertools.count(9000)
    seen: dict[str, TopicMetadata] = {}

    def available() -> bool:
        _, _, topics = parse_metadata_v1(conn.roundtrip(metadata_v1(next(correlation_ids), [topic])))
        seen.update(topics)
        entry = topics.get(topic)
        return entry is not None and entry.error_code == 0 and entry.partitions.get(0, (1, -1))[0] == 0

    wait_until(available, what=f"topic {topic} to become available", timeout_s=10.0, interval_s=0.1,
               detail=lambda: f"last metadata: {seen}")


def wait_fetchable(conn: RawConnection, topic: str, partition: int = 0) -> None:
    """A zero-wait fetch until the partition answers without error (Kafka propagates leadership to its
    fetch path a moment after the topic appears in Metadata)."""
    correlation_ids = itertools.count(8000)

    def fetchable() -> bool:
        return parse_fetch_v4(conn.roundtrip(fetch_v4(next(correlation_ids), topic, partition, 0))).error_code == 0

    wait_until(fetchable, what=f"topic {topic} partition {partition} to become fetchable", timeout_s=10.0,
               interval_s=0.1)


def produce_one(conn: RawConnection, correlation_id: int, topic: str, batch: bytes, acks: int = 1) -> tuple[int, int]:
    """Produce ``batch`` to partition 0: (error_code, base_offset)."""
    return parse_produce_v3(conn.roundtrip(produce_v3(correlation_id, topic, 0, batch, acks=acks)))


def high_watermark(conn: RawConnection, topic: str) -> int:
    return parse_fetch_v4(conn.roundtrip(fetch_v4(77, topic, 0, 0))).high_watermark


def fetch_all(broker, topic: str, partition: int = 0) -> FetchedPartition:
    """The partition from offset 0 (up to 4 MiB), on a fresh connection to ``broker`` (host, port)."""
    with RawConnection(broker.host, broker.port) as conn:
        return parse_fetch_v4(conn.roundtrip(fetch_v4(1, topic, partition, 0, max_bytes=4 << 20)))


def init_producer_id(conn: RawConnection) -> tuple[int, int]:
    """A producer id and epoch, asking again while the broker reports a retriable coordinator state."""
    correlation_ids = itertools.count(7000)

    def granted() -> tuple[int, int] | None:
        body = conn.roundtrip(init_producer_id_v0(next(correlation_ids)))
        error, producer_id, epoch = parse_init_producer_id_v0(body)
        if error not in (0, 14, 15):  # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE
            raise AssertionError(f"InitProducerId error {error}")
        return (producer_id, epoch) if error == 0 else None

    return wait_until(granted, what="InitProducerId to grant a producer id", timeout_s=20.0, interval_s=0.2)
