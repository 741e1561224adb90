"""Kafka requests encoded with kio over a blocking socket: ``KafkaWire``, and CreateTopics / Produce / Fetch /
ListOffsets.

kio's generated entities in, kio's decoded entities out (request header v1, response header v0), for tests
that want a request's every field by name rather than bytes laid out by hand (``tests.support.wire``).
The record batches carried come from ``tests.support.batches``.
"""

from __future__ import annotations

import datetime
import io
import socket
import struct

from kio.index import load_response_schema
from kio.schema.create_topics.v4 import request as create_v4
from kio.schema.fetch.v11 import request as fetch_v11
from kio.schema.list_offsets.v5 import request as list_offsets_v5
from kio.schema.produce.v8 import request as produce_v8
from kio.serial import entity_reader, entity_writer

MS = datetime.timedelta(milliseconds=1)
API_VERSIONS_KEY = 18  # answered with response header v0 at every version (KIP-511)


def create_topic(client, name: str, partitions: int = 1, configs=()):
    response = client.request(
        create_v4.CreateTopicsRequest(
            topics=(
                create_v4.CreatableTopic(
                    name=name, num_partitions=partitions, replication_factor=1, assignments=(),
                    configs=tuple(create_v4.CreatableTopicConfig(name=k, value=v) for k, v in configs),
                ),
            ),
            timeout=1000 * MS,
            validate_only=False,
        )
    )
    return response.topics[0]


def produce(client, topic: str, records_by_partition: dict, acks: int = 1, module=produce_v8, timeout_ms: int = 5000):
    request = module.ProduceRequest(
        transactional_id=None, acks=acks, timeout=timeout_ms * MS,
        topic_data=(
            module.TopicProduceData(
                name=topic,
                partition_data=tuple(
                    module.PartitionProduceData(index=partition, records=records)
                    for partition, records in records_by_partition.items()
                ),
            ),
        ),
    )
    if acks == 0:
        client.send(request)
        return None
    return client.request(request)


def fetch(client, topic: str, offsets: dict, *, max_wait_ms=0, min_bytes=1, max_bytes=50 << 20,
          partition_max_bytes=1 << 20, module=fetch_v11):
    fields = dict(
        max_wait=max_wait_ms * MS, min_bytes=min_bytes, max_bytes=max_bytes, isolation_level=0,
        topics=(
            module.FetchTopic(
                topic=topic,
                partitions=tuple(
                    module.FetchPartition(partition=p, fetch_offset=o, partition_max_bytes=partition_max_bytes)
                    for p, o in offsets.items()
                ),
            ),
        ),
    )
    if module is fetch_v11:
        fields.update(session_id=0, session_epoch=-1, forgotten_topics_data=(), rack_id="")
    return client.request(module.FetchRequest(**fields))


def list_offsets(client, topic: str, timestamp: int, partition: int = 0):
    """ListOffsets v5 for one partition (-1 latest, -2 earliest, else the first offset at or after
    ``timestamp``): the response's partition entry (error_code, offset, timestamp)."""
    response = client.request(list_offsets_v5.ListOffsetsRequest(
        replica_id=-1, isolation_level=0, topics=(list_offsets_v5.ListOffsetsTopic(name=topic, partitions=(
            list_offsets_v5.ListOffsetsPartition(partition_index=partition, timestamp=timestamp),)),)))
    return response.topics[0].partitions[0]


class KafkaWire:
    """A blocking Kafka-protocol client: kio entities in, kio entities out (response header v0)."""

    def __init__(self, port: int, client_id: str = "wire-test", host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=30)
        self.client_id = client_id.encode()
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def frame(self, entity, correlation_id: int | None = None) -> bytes:
        buffer = io.BytesIO()
        entity_writer(type(entity))(buffer, entity)
        return self.raw_frame(entity.__api_key__, entity.__version__, buffer.getvalue(), correlation_id,
                              flexible=bool(type(entity).__flexible__))

    def raw_frame(self, api_key: int, version: int, body: bytes, correlation_id: int | None = None, *,
                  flexible: bool = False) -> bytes:
        """A request frame; ``flexible`` versions (KIP-482) get request header v2 (an empty tagged-fields
        section after the client id), the others header v1."""
        if correlation_id is None:
            self.correlation_id += 1
            correlation_id = self.correlation_id
        header = struct.pack(">hhih", api_key, version, correlation_id, len(self.client_id)) + self.client_id
        if flexible:
            header += b"\x00"
        return struct.pack(">i", len(header) + len(body)) + header + body

    def send(self, entity) -> int:
        self.sock.sendall(self.frame(entity))
        return self.correlation_id

    def read_frame(self) -> bytes:
        size = struct.unpack(">i", self.recv_exactly(4))[0]
        return self.recv_exactly(size)

    def recv_exactly(self, count: int) -> bytes:
        chunks = []
        while count:
            chunk = self.sock.recv(count)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            chunks.append(chunk)
            count -= len(chunk)
        return b"".join(chunks)

    def receive(self, api_key: int, version: int):
        frame = self.read_frame()
        (correlation_id,) = struct.unpack_from(">i", frame)
        schema = load_response_schema(api_key, version)
        start = 4
        if schema.__flexible__ and api_key != API_VERSIONS_KEY:
            # Response header v1: the correlation id, then tagged fields (none are sent: one zero byte).
            assert frame[4] == 0, f"response header tagged fields {frame[4]}"
            start = 5
        body, consumed = entity_reader(schema)(frame, start)
        assert consumed == len(frame) - start, "response has trailing bytes"
        return correlation_id, body

    def request(self, entity):
        correlation_id = self.send(entity)
        got, body = self.receive(entity.__api_key__, entity.__version__)
        assert got == correlation_id
        return body

    def is_closed(self, timeout_s: float = 10.0) -> bool:
        """True when the broker closed this connection (EOF) within the timeout."""
        self.sock.settimeout(timeout_s)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
