"""Every version of every API that ApiVersions advertises is one the broker accepts.

A client picks the highest version both sides list and sends it; a broker that advertises a version it then
closes the connection on (librdkafka 0052 met "API key 0 version 1 is advertised but not accepted") or
answers with UNSUPPORTED_VERSION breaks that client. So this walks the broker's own ApiVersions answer and
sends each advertised (API key, version) a minimal request: kio's request class of that version filled
with the smallest values (empty arrays, null where nullable, zero numbers, empty strings), with acks=1 for Produce so
that there is an answer to wait for. Produce v0-v2 have no kio schema; they are sent by hand, each with one message of
the format that version carries (message format v0, and v1 from Produce v2), and must append.

The broker must answer every one, on the same connection, with a response that decodes at that version and
carries no UNSUPPORTED_VERSION (35) anywhere in it.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import types
import typing
import uuid

import pytest
from kio.index import load_request_schema
from kio.schema.api_versions.v0 import request as api_versions_v0
from kio.schema.errors import ErrorCode

from tests.support import batches
from tests.support.kio_requests import KafkaWire, create_topic
from tests.support.topics import unique_topic

pytestmark = pytest.mark.timeout(240)

PRODUCE = 0
UNSUPPORTED = int(ErrorCode.unsupported_version)


def minimal(annotation):
    """The smallest value of a kio field type: empty arrays, null where nullable, zero, empty strings."""
    origin = typing.get_origin(annotation)
    if origin is tuple:
        return ()
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        return None if type(None) in args else minimal(args[0])
    if dataclasses.is_dataclass(annotation):
        hints = typing.get_type_hints(annotation)
        return annotation(**{field.name: minimal(hints[field.name]) for field in dataclasses.fields(annotation)})
    for base, value in ((bool, False), (int, 0), (float, 0.0), (str, ""), (bytes, b""),
                        (datetime.timedelta, datetime.timedelta(0)), (uuid.UUID, uuid.UUID(int=0))):
        if isinstance(annotation, type) and issubclass(annotation, base):
            return annotation(value)
    raise TypeError(f"no minimal value for {annotation!r}")


def minimal_request(api_key: int, version: int):
    """The minimal request of kio's class for this version, or None when kio has none."""
    try:
        schema = load_request_schema(api_key, version)
    except Exception:  # kio raises several types for a schema it does not have
        return None
    request = minimal(schema)
    if api_key == PRODUCE:
        request = dataclasses.replace(request, acks=1)  # acks=0 is never answered
    return request


def error_codes(entity):
    """Every ``error_code`` value in a decoded response, however deep."""
    if dataclasses.is_dataclass(entity):
        for field in dataclasses.fields(entity):
            value = getattr(entity, field.name)
            if field.name == "error_code":
                yield int(value)
            else:
                yield from error_codes(value)
    elif isinstance(entity, tuple):
        for item in entity:
            yield from error_codes(item)


def legacy_produce(wire: KafkaWire, version: int, topic: str) -> tuple[int, int]:
    """A Produce v0-v2 request with one message (format v0, or v1 from Produce v2) for partition 0 of
    ``topic``; returns (error code, base offset) of the partition's answer."""
    message = batches.message_set([(1_700_000_000_000 if version >= 2 else None, b"k", b"v%d" % version)],
                                  magic=1 if version >= 2 else 0)
    name = topic.encode()
    body = struct.pack(">hii", 1, 10_000, 1) + struct.pack(">h", len(name)) + name
    body += struct.pack(">iii", 1, 0, len(message)) + message
    wire.sock.sendall(wire.raw_frame(PRODUCE, version, body))
    frame = wire.read_frame()
    assert struct.unpack_from(">i", frame)[0] == wire.correlation_id
    position = 4
    (topics,) = struct.unpack_from(">i", frame, position)
    (length,) = struct.unpack_from(">h", frame, position + 4)
    position += 6 + length
    assert topics == 1 and frame[position - length : position] == name
    (partitions, index, error, base_offset) = struct.unpack_from(">iihq", frame, position)
    position += 18
    assert partitions == 1 and index == 0
    if version >= 2:
        position += 8  # log_append_time
    if version >= 1:
        position += 4  # throttle_time_ms
    assert position == len(frame), f"Produce v{version} response has {len(frame) - position} extra bytes"
    return error, base_offset


def test_every_advertised_version_answers(broker):
    wire = KafkaWire(broker.port)
    try:
        advertised = wire.request(api_versions_v0.ApiVersionsRequest())
        assert advertised.error_code == 0
        topic = unique_topic("walk")
        assert create_topic(wire, topic).error_code == 0
        problems: list[str] = []
        legacy_offsets = []
        sent = 0
        for api in sorted(advertised.api_keys, key=lambda a: a.api_key):
            for version in range(api.min_version, api.max_version + 1):
                request = minimal_request(api.api_key, version)
                try:
                    if request is None:
                        if api.api_key != PRODUCE or version > 2:
                            problems.append(f"API {api.api_key} v{version}: advertised, no request schema here")
                            continue
                        error, offset = legacy_produce(wire, version, topic)
                        if error:
                            problems.append(f"Produce v{version}: error {error}")
                        legacy_offsets.append(offset)
                    else:
                        response = wire.request(request)
                        if UNSUPPORTED in set(error_codes(response)):
                            problems.append(f"API {api.api_key} v{version}: UNSUPPORTED_VERSION in {response}")
                    sent += 1
                except (ConnectionError, OSError, AssertionError, struct.error) as exc:
                    problems.append(f"API {api.api_key} v{version}: {type(exc).__name__}: {exc}")
                    wire.close()
                    wire = KafkaWire(broker.port)
        assert not problems, "\n".join(problems)
        # Produce v0-v2 each appended their message (auto-created topic, one after another).
        assert legacy_offsets == sorted(legacy_offsets) and len(set(legacy_offsets)) == 3, legacy_offsets
        assert sent >= 40, f"only {sent} (API, version) pairs walked"
    finally:
        wire.close()


def test_init_producer_id_epoch_bump_without_a_transactional_id_gets_a_new_producer(broker):
    """KIP-360 (InitProducerId v3+) from an idempotent producer: Kafka 3.9 answers a request naming its current
    producer id and epoch with a new producer id at epoch 0, as for a first request."""
    from kio.schema.init_producer_id.v0 import request as v0
    from kio.schema.init_producer_id.v4 import request as v4

    wire = KafkaWire(broker.port)
    try:
        first = wire.request(v0.InitProducerIdRequest(transactional_id=None, transaction_timeout=datetime.timedelta(0)))
        assert first.error_code == 0 and first.producer_id >= 0 and first.producer_epoch == 0
        bumped = wire.request(v4.InitProducerIdRequest(
            transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=first.producer_id, producer_epoch=first.producer_epoch))
        assert bumped.error_code == 0 and bumped.producer_epoch == 0
        assert bumped.producer_id > first.producer_id
        # With a transactional id the transaction coordinator answers: that id's own producer id.
        transactional = wire.request(v4.InitProducerIdRequest(
            transactional_id=f"tx-{bumped.producer_id}", transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=-1, producer_epoch=-1))
        assert transactional.error_code == ErrorCode.none and transactional.producer_epoch == 0
        assert transactional.producer_id not in (first.producer_id, bumped.producer_id)
    finally:
        wire.close()
