"""The sans-IO wire layer: request headers, decoding decisions, the ApiVersions fallback, and the hand-written
Fetch response encoder checked against kio's generated decoder for every served version."""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from copyless.broker.handlers import load_handlers
from copyless.broker.wire.codecs import encode_response, response_module
from copyless.broker.wire.fetch_response import FetchPartitionResult, encode_fetch_response, segments_length
from copyless.broker.wire.headers import RemoteProtocolError, parse_request_header, skip_tagged_fields
from copyless.broker.wire.requests import (
    ApiVersionsFallback,
    DecodedRequest,
    decode_request,
    encode_api_versions_fallback,
)

SERVED = load_handlers().served()


def request_frame(api_key: int, version: int, correlation_id: int, body: bytes, client_id: str | None = "test",
                  tagged: bytes = b"") -> bytes:
    if client_id is None:
        header = struct.pack(">hhih", api_key, version, correlation_id, -1)
    else:
        raw = client_id.encode()
        header = struct.pack(">hhih", api_key, version, correlation_id, len(raw)) + raw
    return header + tagged + body


def encode_entity(entity) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def test_header_fields_and_null_client_id():
    header = parse_request_header(request_frame(3, 8, 77, b"", client_id=None))
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (3, 8, 77, None)
    header = parse_request_header(request_frame(0, 7, -5, b"xyz", client_id="producer-1"))
    assert header.client_id == "producer-1"
    assert header.end_offset == 10 + len("producer-1")


@pytest.mark.parametrize("frame", [b"", b"\x00\x03\x00", struct.pack(">hhih", 3, 1, 9, 40) + b"short"])
def test_truncated_headers_are_remote_errors(frame):
    with pytest.raises(RemoteProtocolError):
        parse_request_header(frame)


def test_tagged_fields_skipped():
    # two tags: (tag 0, 3 bytes), (tag 5, 0 bytes)
    tagged = bytes([2, 0, 3]) + b"abc" + bytes([5, 0])
    assert skip_tagged_fields(tagged + b"BODY", 0) == len(tagged)
    with pytest.raises(RemoteProtocolError):
        skip_tagged_fields(bytes([1, 0, 9]) + b"ab", 0)


def test_unknown_api_key_and_unserved_version_close():
    with pytest.raises(RemoteProtocolError, match="unknown API key 999"):
        decode_request(request_frame(999, 0, 1, b""), SERVED)
    with pytest.raises(RemoteProtocolError, match="outside the served range"):
        decode_request(request_frame(1, 3, 1, b""), SERVED)  # Fetch v3 is below the served 4-11


@pytest.mark.parametrize("version", [0, 1, 2])
def test_produce_v0_to_v2_decode_without_a_transactional_id(version):
    assert SERVED[0][0] == 0  # librdkafka < 2.11.1 stops compressing unless Produce min is 0 (T1)
    records = b"\x00" * 8 + struct.pack(">i", 14) + b"\x00" * 14  # any bytes: the handler reads them
    body = struct.pack(">hii", -1, 1500, 1) + struct.pack(">h", 3) + b"top"
    body += struct.pack(">iii", 1, 7, len(records)) + records
    decoded = decode_request(request_frame(0, version, 5, body), SERVED)
    request = decoded.body
    assert request.transactional_id is None and request.acks == -1 and request.timeout.total_seconds() == 1.5
    (topic,) = request.topic_data
    (partition,) = topic.partition_data
    assert topic.name == "top" and partition.index == 7 and bytes(partition.records) == records
    with pytest.raises(RemoteProtocolError, match="truncated"):
        decode_request(request_frame(0, version, 5, body[:-1]), SERVED)


@pytest.mark.parametrize("version", [3, 4])
def test_api_versions_above_range_falls_back_to_v0(version):
    # Flexible ApiVersions: header v2 (tagged fields) and compact strings we never parse.
    frame = request_frame(18, version, 4242, b"\x08copyless\x041.0\x00", tagged=b"\x00")
    decoded = decode_request(frame, SERVED)
    assert isinstance(decoded, ApiVersionsFallback)
    response = encode_api_versions_fallback(4242, *SERVED[18])
    size, correlation_id = struct.unpack_from(">ii", response)
    assert size == len(response) - 4 and correlation_id == 4242
    from kio.schema.api_versions.v0.response import ApiVersionsResponse

    body, consumed = entity_reader(ApiVersionsResponse)(response, 8)
    assert consumed == len(response) - 8
    assert body.error_code == ErrorCode.unsupported_version
    assert [(k.api_key, k.min_version, k.max_version) for k in body.api_keys] == [(18, 0, 2)]


def test_decode_metadata_v1_null_topics():
    from kio.schema.metadata.v1.request import MetadataRequest

    frame = request_frame(3, 1, 5, encode_entity(MetadataRequest(topics=None)))
    decoded = decode_request(frame, SERVED)
    assert isinstance(decoded, DecodedRequest)
    assert decoded.body.topics is None and decoded.header.correlation_id == 5


def test_truncated_body_is_remote_error():
    from kio.schema.metadata.v1.request import MetadataRequest, MetadataRequestTopic

    body = encode_entity(MetadataRequest(topics=(MetadataRequestTopic(name="orders"),)))
    with pytest.raises(RemoteProtocolError, match="malformed"):
        decode_request(request_frame(3, 1, 5, body[:-3]), SERVED)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_remote_error(data):
    # The h11 fuzz invariant: garbage is either a request or a RemoteProtocolError, never anything else.
    try:
        decode_request(data, SERVED)
    except RemoteProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(api_key=st.sampled_from(sorted(SERVED)), data=st.binary(max_size=120),
       correlation_id=st.integers(-2**31, 2**31 - 1))
def test_random_bodies_for_served_keys(api_key, data, correlation_id):
    low, high = SERVED[api_key]
    for version in {low, high}:
        try:
            decode_request(request_frame(api_key, version, correlation_id, data), SERVED)
        except RemoteProtocolError as exc:
            assert exc.correlation_id == correlation_id


def test_encode_response_frames_kio_entity():
    module = response_module(22, 1)
    from copyless.broker.wire.codecs import NO_THROTTLE

    entity = module.InitProducerIdResponse(throttle_time=NO_THROTTLE, error_code=ErrorCode.none, producer_id=7,
                                           producer_epoch=0)
    frame = encode_response(99, 22, 1, entity)
    size, correlation_id = struct.unpack_from(">ii", frame)
    assert size == len(frame) - 4 and correlation_id == 99
    decoded, _ = entity_reader(load_response_schema(22, 1))(frame, 8)
    assert decoded.producer_id == 7


partition_strategy = st.builds(
    FetchPartitionResult,
    partition=st.integers(0, 1000),
    error_code=st.sampled_from([0, 1, 3, 56]),
    high_watermark=st.integers(-1, 2**40),
    last_stable_offset=st.integers(-1, 2**40),
    log_start_offset=st.integers(-1, 2**40),
    records=st.one_of(st.none(), st.binary(max_size=64)),
    aborted=st.one_of(st.none(), st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 2**62)), max_size=3)),
)


@settings(max_examples=150, deadline=None)
@given(
    version=st.integers(4, 11),
    correlation_id=st.integers(-2**31, 2**31 - 1),
    topics=st.lists(
        st.tuples(st.text(min_size=1, max_size=20), st.lists(partition_strategy, max_size=4)), max_size=4
    ),
)
def test_fetch_encoder_matches_kio_decoder(version, correlation_id, topics):
    segments = encode_fetch_response(version, correlation_id, topics)
    frame = b"".join(segments)
    assert segments_length(segments) == len(frame)
    size, decoded_correlation_id = struct.unpack_from(">ii", frame)
    assert size == len(frame) - 4 and decoded_correlation_id == correlation_id
    decoded, consumed = entity_reader(load_response_schema(1, version))(frame, 8)
    assert consumed == len(frame) - 8
    assert decoded.session_id == 0 if version >= 7 else True
    assert [t.topic for t in decoded.responses] == [name for name, _ in topics]
    for response_topic, (_name, partitions) in zip(decoded.responses, topics, strict=True):
        assert len(response_topic.partitions) == len(partitions)
        for got, want in zip(response_topic.partitions, partitions, strict=True):
            assert got.partition_index == want.partition
            assert got.error_code == want.error_code
            assert got.high_watermark == want.high_watermark
            assert got.last_stable_offset == want.last_stable_offset
            if version >= 5:
                assert got.log_start_offset == want.log_start_offset
            assert [(a.producer_id, a.first_offset) for a in got.aborted_transactions] == list(want.aborted or ())
            assert bytes(got.records or b"") == (want.records or b"")
            if version >= 11:
                assert got.preferred_read_replica == -1


class _Slice:
    """Only ``length`` is read by the encoder; the bytes never pass through it."""

    def __init__(self, length: int) -> None:
        self.length = length


def test_fetch_encoder_keeps_slices_as_separate_segments():
    first, second = _Slice(1000), _Slice(5)
    topics = [("a", [FetchPartitionResult(0, records=first), FetchPartitionResult(1)]),
              ("b", [FetchPartitionResult(2, records=second)])]
    segments = encode_fetch_response(11, 1, topics)
    assert [type(s) for s in segments] == [bytes, _Slice, bytes, _Slice, bytes]
    assert segments[1] is first and segments[3] is second
    (size,) = struct.unpack_from(">i", segments[0])
    assert size == segments_length(segments) - 4


def test_every_served_version_has_codecs():
    for api_key, (low, high) in SERVED.items():
        for version in range(low, high + 1):
            if api_key == 0 and version < 3:
                continue  # Produce v0-2: no kio schema, decoded and encoded by hand (produce_request/response)
            load_request_schema(api_key, version)
            load_response_schema(api_key, version)


@settings(max_examples=150, deadline=None)
@given(
    version=st.integers(0, 2),
    correlation_id=st.integers(-2**31, 2**31 - 1),
    partitions=st.lists(st.tuples(st.integers(0, 2**31 - 1), st.sampled_from([0, 2, 87]), st.integers(-1, 2**50),
                                  st.integers(-1, 2**42)), max_size=4),
)
def test_produce_v0_to_v2_responses_by_hand(version, correlation_id, partitions):
    """Produce v0-2 responses have no kio schema: read them back field by field (v1 adds throttle_time_ms at
    the end, v2 each partition's log_append_time)."""
    from copyless.broker.wire.produce_response import encode_produce_response

    frame = encode_produce_response(version, correlation_id, [("t", [(*p, -1, None) for p in partitions])])
    size, got_correlation_id, topics, name_length = struct.unpack_from(">iiih", frame)
    assert size == len(frame) - 4 and got_correlation_id == correlation_id and topics == 1 and name_length == 1
    position = 15
    (count,) = struct.unpack_from(">i", frame, position)
    position += 4
    assert count == len(partitions)
    for partition, code, base_offset, append_ms in partitions:
        assert struct.unpack_from(">ihq", frame, position) == (partition, code, base_offset)
        position += 14
        if version >= 2:
            assert struct.unpack_from(">q", frame, position) == (append_ms,)
            position += 8
    if version >= 1:
        assert struct.unpack_from(">i", frame, position) == (0,)
        position += 4
    assert position == len(frame)


@settings(max_examples=150, deadline=None)
@given(
    version=st.integers(3, 8),
    correlation_id=st.integers(-2**31, 2**31 - 1),
    topics=st.lists(
        st.tuples(
            st.text(min_size=1, max_size=30),
            st.lists(
                st.tuples(st.integers(0, 2**31 - 1), st.sampled_from([0, 2, 3, 10, 45, 56, 87]),
                          st.integers(-1, 2**50), st.integers(-1, 2**42), st.integers(-1, 2**50),
                          st.one_of(st.none(), st.text(max_size=40))),
                max_size=4,
            ),
        ),
        max_size=3,
    ),
)
def test_produce_encoder_matches_kio_decoder(version, correlation_id, topics):
    from copyless.broker.wire.produce_response import encode_produce_response

    frame = encode_produce_response(version, correlation_id, topics)
    size, decoded_correlation_id = struct.unpack_from(">ii", frame)
    assert size == len(frame) - 4 and decoded_correlation_id == correlation_id
    decoded, consumed = entity_reader(load_response_schema(0, version))(frame, 8)
    assert consumed == len(frame) - 8
    assert decoded.throttle_time.total_seconds() == 0
    assert [t.name for t in decoded.responses] == [name for name, _ in topics]
    for topic, (_name, partitions) in zip(decoded.responses, topics, strict=True):
        for got, want in zip(topic.partition_responses, partitions, strict=True):
            partition, code, base_offset, append_ms, log_start, message = want
            assert (got.index, got.error_code, got.base_offset) == (partition, code, base_offset)
            got_append = -1 if got.log_append_time is None else round(got.log_append_time.timestamp() * 1000)
            assert got_append == append_ms
            if version >= 5:
                assert got.log_start_offset == log_start
            if version >= 8:
                assert got.error_message == message and got.record_errors == ()


produce_topics = st.lists(
    st.tuples(
        st.text(min_size=1, max_size=20),
        st.lists(st.tuples(st.integers(-2**31, 2**31 - 1), st.one_of(st.none(), st.binary(max_size=80))), max_size=4),
    ),
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(version=st.integers(3, 8), transactional_id=st.one_of(st.none(), st.text(max_size=10)),
       acks=st.integers(-2**15, 2**15 - 1), timeout_ms=st.integers(0, 2**31 - 1), topics=produce_topics)
def test_produce_request_decoder_matches_kio_encoder(version, transactional_id, acks, timeout_ms, topics):
    import datetime

    module = __import__(f"kio.schema.produce.v{version}.request", fromlist=["ProduceRequest"])
    entity = module.ProduceRequest(
        transactional_id=transactional_id, acks=acks, timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=tuple(
            module.TopicProduceData(name=name, partition_data=tuple(
                module.PartitionProduceData(index=index, records=records) for index, records in partitions))
            for name, partitions in topics
        ),
    )
    frame = request_frame(0, version, 9, encode_entity(entity))
    decoded = decode_request(frame, SERVED).body
    assert decoded.transactional_id == transactional_id and decoded.acks == acks
    assert decoded.timeout == datetime.timedelta(milliseconds=timeout_ms)
    assert [t.name for t in decoded.topic_data] == [name for name, _ in topics]
    for got_topic, (_name, partitions) in zip(decoded.topic_data, topics, strict=True):
        got = [(p.index, None if p.records is None else bytes(p.records)) for p in got_topic.partition_data]
        assert got == partitions
        for partition in got_topic.partition_data:
            assert partition.records is None or isinstance(partition.records, memoryview)  # a view, not a copy


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_truncated_produce_requests_are_remote_errors(data):
    import datetime

    from kio.schema.produce.v8 import request as module

    entity = module.ProduceRequest(transactional_id=None, acks=1, timeout=datetime.timedelta(seconds=1), topic_data=(
        module.TopicProduceData(name="t", partition_data=(module.PartitionProduceData(index=0, records=b"x" * 70),)),))
    frame = request_frame(0, 8, 9, encode_entity(entity))
    cut = data.draw(st.integers(10, len(frame) - 1))
    with pytest.raises(RemoteProtocolError):
        decode_request(frame[:cut], SERVED)


def test_kafka_python_infers_3_0_and_its_epoch_bump_is_served():
    # Trap T3: kafka-python >= 2.5 inference switches idempotent-producer recovery to the KIP-360 epoch bump,
    # which needs InitProducerId v3+. ListOffsets v7 (KIP-734's max-timestamp query) makes it infer 3.0, so
    # InitProducerId must be served up to v3 at least; an API added to the table that makes it infer more
    # must be checked against kafka-python's features behind that version.
    inference = pytest.importorskip("kafka.protocol.broker_version_data")
    assert inference.infer_broker_version_from_api_versions(dict(SERVED)) == (3, 0)
    assert SERVED[22] == (0, 4)  # InitProducerId with KIP-360's producer id and epoch
