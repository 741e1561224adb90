"""Request/response codecs for the client: ``kio`` for the cold APIs, hand-written for Produce and Fetch.

Owns: the API versions the client speaks, request header v1 encoding, and the wire layout of ProduceRequest
v7 / ProduceResponse v7 / FetchRequest v11 / FetchResponse v11 (all non-flexible). Pure: bytes in, values
out.

Why Produce and Fetch are written by hand:
- Produce: kio wants each partition's records as one ``bytes`` - the batch would have to be joined (a copy
  of every value) before kio copies it again into its output. The hand-written encoder emits the request
  as a list of buffers in which each batch's buffers appear unchanged, for one gathered ``sendmsg``.
  Encoding costs one small ``bytes`` per request instead of two copies of the payload.
- Fetch: kio decodes the response into frozen dataclasses with each partition's records copied into a
  ``bytes`` (measured here: ~5 us + a copy of the payload per response). The hand-written decoder walks
  the response in the pooled receive buffer and returns (start, end) positions of each partition's
  records, which ``fetch_records.PartitionRecords`` then parses lazily.

Versions (non-flexible, accepted by Kafka 2.x-4.x and by copyless; see the protocol reference §1.4):
Produce 7 (zstd needs >= 7), Fetch 11, Metadata 8 (5 for brokers without it), ListOffsets 4, FindCoordinator 1,
JoinGroup 5, SyncGroup 3, Heartbeat 1, LeaveGroup 1, OffsetCommit 3, OffsetFetch 3, CreateTopics 3, DeleteTopics 3,
InitProducerId 1, ApiVersions 0.
"""

from __future__ import annotations

import io
import struct
from typing import Any, NamedTuple

from kio.serial import entity_reader, entity_writer

__all__ = [
    "API_VERSIONS",
    "ApiKey",
    "api_name",
    "encode_request_header",
    "encode_kio",
    "kio_decoder",
    "encode_produce_request",
    "decode_produce_response",
    "ProducePartitionResponse",
    "encode_fetch_request",
    "decode_fetch_response",
    "FetchPartition",
    "FetchPartitionResponse",
]


def api_name(api_key: int) -> str:
    """Kafka's name of an API (``ApiVersions`` for 18), or ``api N`` for a key kio does not know."""
    from kio.schema.index import api_key_map

    name = api_key_map.get(api_key)
    return "".join(part.title() for part in name.split("_")) if name else f"api {api_key}"


class ApiKey:
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    INIT_PRODUCER_ID = 22


# The one version of each API the client sends.
API_VERSIONS = {
    ApiKey.PRODUCE: 7,
    ApiKey.FETCH: 11,
    ApiKey.LIST_OFFSETS: 4,
    ApiKey.METADATA: 8,
    ApiKey.OFFSET_COMMIT: 3,
    ApiKey.OFFSET_FETCH: 3,
    ApiKey.FIND_COORDINATOR: 1,
    ApiKey.JOIN_GROUP: 5,
    ApiKey.HEARTBEAT: 1,
    ApiKey.LEAVE_GROUP: 1,
    ApiKey.SYNC_GROUP: 3,
    ApiKey.API_VERSIONS: 0,
    ApiKey.CREATE_TOPICS: 3,
    ApiKey.DELETE_TOPICS: 3,
    ApiKey.INIT_PRODUCER_ID: 1,
}

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


def _string(value: str | None) -> bytes:
    if value is None:
        return b"\xff\xff"
    data = value.encode("utf-8")
    return _I16.pack(len(data)) + data


def encode_request_header(api_key: int, api_version: int, correlation_id: int, client_id: str | None) -> bytes:
    """Request header v1 (every non-flexible request): api_key, api_version, correlation_id, client_id."""
    return struct.pack(">hhi", api_key, api_version, correlation_id) + _string(client_id)


_WRITERS: dict = {}
_READERS: dict = {}


def encode_kio(request) -> bytes:
    """The body of a kio request entity (without header)."""
    cls = type(request)
    writer = _WRITERS.get(cls)
    if writer is None:
        writer = _WRITERS[cls] = entity_writer(cls)
    out = io.BytesIO()
    writer(out, request)
    return out.getvalue()


def kio_decoder(response_cls, *, skip_tagged_header: bool = False):
    """A function ``(frame, offset) -> response entity`` for a kio response class.

    ``skip_tagged_header``: the response header is v1 (flexible APIs): an empty tagged-field section, one
    byte, follows the correlation id.
    """
    reader = _READERS.get(response_cls)
    if reader is None:
        reader = _READERS[response_cls] = entity_reader(response_cls)
    extra = 1 if skip_tagged_header else 0

    def decode(frame, offset: int = 0):
        return reader(frame, offset + extra)[0]

    return decode


# --- Produce v7 ------------------------------------------------------------------------------------------


def encode_produce_request(acks: int, timeout_ms: int, topics: dict, transactional_id: str | None = None) -> list:
    """ProduceRequest v7 body as a list of buffers.

    Args:
        topics: ``{topic: [(partition, batch_buffers, batch_size_bytes), ...]}``; ``batch_buffers`` appear
            in the output unchanged (each batch is one RecordBatch, as Kafka requires for magic 2).
        transactional_id: the transactional producer's id (Kafka rejects transactional batches without it).
    """
    # transactional_id (null unless the batches are transactional), acks, timeout, topic count
    head = bytearray(_string(transactional_id))
    head += struct.pack(">hii", acks, timeout_ms, len(topics))
    out: list = [head]
    for topic, partitions in topics.items():
        prefix = bytearray(_string(topic))
        prefix += _I32.pack(len(partitions))
        first = True
        for partition, buffers, size_bytes in partitions:
            if first:
                prefix += struct.pack(">ii", partition, size_bytes)
                out.append(prefix)
                first = False
            else:
                out.append(struct.pack(">ii", partition, size_bytes))
            out.extend(buffers)
    return out


class ProducePartitionResponse(NamedTuple):
    topic: str
    partition: int
    error_code: int
    base_offset: int
    log_append_time_ms: int
    log_start_offset: int


_PRODUCE_PARTITION = struct.Struct(">ihqqq")


def decode_produce_response(frame, offset: int = 0) -> list[ProducePartitionResponse]:
    """ProduceResponse v7 body (after the correlation id)."""
    out = []
    (topic_count,) = _I32.unpack_from(frame, offset)
    offset += 4
    for _ in range(topic_count):
        (name_length,) = _I16.unpack_from(frame, offset)
        offset += 2
        topic = bytes(frame[offset : offset + name_length]).decode("utf-8")
        offset += name_length
        (partition_count,) = _I32.unpack_from(frame, offset)
        offset += 4
        for _p in range(partition_count):
            partition, error_code, base_offset, append_time, log_start = _PRODUCE_PARTITION.unpack_from(frame, offset)
            offset += _PRODUCE_PARTITION.size
            out.append(ProducePartitionResponse(topic, partition, error_code, base_offset, append_time, log_start))
    return out


# --- Fetch v11 -------------------------------------------------------------------------------------------


class FetchPartition(NamedTuple):
    topic: str
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = -1  # KIP-320: the leader epoch the client knows (-1: no check)


def encode_fetch_request(
    partitions: list[FetchPartition],
    *,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    isolation_level: int = 0,
) -> bytes:
    """FetchRequest v11, sessionless (session_id 0, epoch -1, as aiokafka and librdkafka send it)."""
    by_topic: dict[str, list[FetchPartition]] = {}
    for item in partitions:
        by_topic.setdefault(item.topic, []).append(item)
    # replica id -1, the waits and sizes, isolation level, session id 0, session epoch -1, topic count
    out = bytearray(struct.pack(">iiiibiii", -1, max_wait_ms, min_bytes, max_bytes, isolation_level, 0, -1,
                                len(by_topic)))
    for topic, items in by_topic.items():
        out += _string(topic)
        out += _I32.pack(len(items))
        for item in items:
            # partition, current_leader_epoch, fetch_offset, log_start_offset (-1), max bytes
            out += struct.pack(
                ">iiqqi", item.partition, item.current_leader_epoch, item.fetch_offset, -1, item.partition_max_bytes
            )
    out += _I32.pack(0)  # forgotten_topics_data
    out += _string("")  # rack_id
    return bytes(out)


class FetchPartitionResponse(NamedTuple):
    topic: str
    partition: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    records_start: int  # position of the records bytes in the frame
    records_end: int
    # read_committed: the aborted transactions the records overlap, ((producer_id, first_offset), ...)
    aborted_transactions: tuple = ()


_FETCH_PARTITION = struct.Struct(">ihqqq")
_ABORTED = struct.Struct(">qq")


def decode_fetch_response(frame, offset: int = 0) -> tuple[int, list[FetchPartitionResponse]]:
    """FetchResponse v11 body (after the correlation id): ``(error_code, partitions)``.

    Records are not touched: each partition carries the (start, end) of its records in ``frame``.
    Raises ``ValueError`` when the frame is shorter than its fields say (a broken response).
    """
    try:
        _throttle, error_code, _session, topic_count = struct.unpack_from(">ihii", frame, offset)
        offset += 14
        out = []
        frame_length = len(frame)
        for _ in range(topic_count):
            (name_length,) = _I16.unpack_from(frame, offset)
            offset += 2
            topic = bytes(frame[offset : offset + name_length]).decode("utf-8")
            offset += name_length
            (partition_count,) = _I32.unpack_from(frame, offset)
            offset += 4
            for _p in range(partition_count):
                partition, partition_error, high_watermark, last_stable, log_start = _FETCH_PARTITION.unpack_from(
                    frame, offset
                )
                offset += _FETCH_PARTITION.size
                (aborted_count,) = _I32.unpack_from(frame, offset)
                offset += 4
                aborted: tuple[tuple[Any, ...], ...] = ()
                if aborted_count > 0:
                    if offset + 16 * aborted_count > frame_length:
                        raise ValueError("aborted transactions run past the end of the response")
                    aborted = tuple(_ABORTED.iter_unpack(bytes(frame[offset : offset + 16 * aborted_count])))
                    offset += 16 * aborted_count  # producer_id int64, first_offset int64
                offset += 4  # preferred_read_replica
                (records_length,) = _I32.unpack_from(frame, offset)
                offset += 4
                if records_length < 0:
                    records_length = 0
                if offset + records_length > frame_length:
                    raise ValueError("records run past the end of the response")
                out.append(
                    FetchPartitionResponse(
                        topic,
                        partition,
                        partition_error,
                        high_watermark,
                        last_stable,
                        log_start,
                        offset,
                        offset + records_length,
                        aborted,
                    )
                )
                offset += records_length
        return error_code, out
    except struct.error as exc:
        raise ValueError(f"truncated fetch response: {exc}") from exc
