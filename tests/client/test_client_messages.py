"""The hand-written Produce/Fetch codecs against kio's codecs generated from Kafka's message schemas."""

import datetime
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v11 import response as fetch_response
from kio.schema.fetch.v11.request import FetchRequest
from kio.schema.produce.v7 import response as produce_response
from kio.schema.produce.v7.request import ProduceRequest
from kio.serial import entity_reader, entity_writer

from copyless.protocol.batch_builder import BatchBuilder
from copyless.protocol.messages import (
    FetchPartition,
    decode_fetch_response,
    decode_produce_response,
    encode_fetch_request,
    encode_produce_request,
)


def _batch(count, value_size):
    builder = BatchBuilder(gather_min_bytes=64)
    for i in range(count):
        builder.append(i, None, bytes([65 + i % 26]) * value_size)
    return builder.build()


def test_produce_request_is_what_kio_reads():
    a, b, c = _batch(3, 10), _batch(2, 500), _batch(1, 5)
    topics = {"alpha": [(0, a.buffers, a.size_bytes), (3, b.buffers, b.size_bytes)],
              "beta": [(1, c.buffers, c.size_bytes)]}
    body = b"".join(bytes(x) for x in encode_produce_request(-1, 30000, topics))
    request, end = entity_reader(ProduceRequest)(body, 0)
    assert end == len(body)
    assert request.acks == -1 and request.transactional_id is None
    assert request.timeout.total_seconds() == 30
    got = {(t.name, p.index): bytes(p.records) for t in request.topic_data for p in t.partition_data}
    assert got == {("alpha", 0): a.to_bytes(), ("alpha", 3): b.to_bytes(), ("beta", 1): c.to_bytes()}
    # the batch's large values went through untouched, as separate buffers
    assert len(b.buffers) == 5


def test_produce_response_decoding():
    response = produce_response.ProduceResponse(
        responses=(
            produce_response.TopicProduceResponse(
                name="alpha",
                partition_responses=(
                    produce_response.PartitionProduceResponse(
                        index=2, error_code=ErrorCode(0), base_offset=41, log_append_time=None, log_start_offset=7
                    ),
                ),
            ),
        ),
        throttle_time=datetime.timedelta(0),
    )
    out = io.BytesIO()
    entity_writer(produce_response.ProduceResponse)(out, response)
    (result,) = decode_produce_response(out.getvalue(), 0)
    assert (result.topic, result.partition, result.error_code, result.base_offset, result.log_start_offset) == (
        "alpha", 2, 0, 41, 7
    )


def test_fetch_request_is_what_kio_reads():
    body = encode_fetch_request(
        [FetchPartition("t", 0, 100, 1 << 20), FetchPartition("t", 5, 7, 99), FetchPartition("u", 1, 0, 10)],
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=50 << 20,
    )
    request, end = entity_reader(FetchRequest)(body, 0)
    assert end == len(body)
    assert request.session_id == 0 and request.session_epoch == -1
    got = [(t.topic, p.partition, p.fetch_offset, p.partition_max_bytes) for t in request.topics for p in t.partitions]
    assert got == [("t", 0, 100, 1 << 20), ("t", 5, 7, 99), ("u", 1, 0, 10)]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5), st.integers(0, 40)), min_size=1, max_size=6,
                unique_by=lambda x: x[0]))
def test_fetch_response_decoding_locates_each_partitions_records(partitions):
    blobs = {}
    responses = []
    for partition, batches, cut in partitions:
        blob = b"".join(_batch(1 + i, 20).to_bytes() for i in range(batches))
        blob = blob[: max(0, len(blob) - cut)]  # a byte-sliced, possibly truncated region
        blobs[partition] = blob
        responses.append(
            fetch_response.PartitionData(
                partition_index=partition,
                error_code=ErrorCode(0),
                high_watermark=1000 + partition,
                last_stable_offset=1000,
                log_start_offset=0,
                aborted_transactions=(fetch_response.AbortedTransaction(producer_id=1, first_offset=2),),
                preferred_read_replica=-1,
                records=blob or None,
            )
        )
    response = fetch_response.FetchResponse(
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode(0),
        session_id=0,
        responses=(fetch_response.FetchableTopicResponse(topic="topic", partitions=tuple(responses)),),
    )
    out = io.BytesIO()
    entity_writer(fetch_response.FetchResponse)(out, response)
    frame = b"\x00\x00\x00\x09" + out.getvalue()  # behind a correlation id, as on the wire
    error_code, decoded = decode_fetch_response(memoryview(frame), 4)
    assert error_code == 0
    for item in decoded:
        assert frame[item.records_start : item.records_end] == blobs[item.partition]
        assert item.high_watermark == 1000 + item.partition
    # a frame cut short (by even one byte) is reported, not misread
    with pytest.raises(ValueError):
        decode_fetch_response(memoryview(frame)[: len(frame) - 1], 4)
