"""Kafka's produce-path batch checks (trap T10), decided before anything touches the log."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from copyless.broker.handlers.produce import ProduceError, validate_produce_records
from tests.support.batches import build_batch

MAX = 1048588


def check(records, version=8, max_message_bytes=MAX):
    return validate_produce_records(records, api_version=version, max_message_bytes=max_message_bytes)


def error_of(records, **kwargs) -> ErrorCode:
    with pytest.raises(ProduceError) as info:
        check(records, **kwargs)
    return info.value.code


def test_valid_batches_pass_for_every_codec():
    for codec in (0, 1, 2, 3, 4):
        header = check(build_batch([b"v1", b"v2", None], codec=codec))
        assert header.records_count == 3 and header.codec == codec


def test_bad_crc_is_corrupt_message():
    assert error_of(build_batch([b"x"], corrupt_crc=True)) == ErrorCode.corrupt_message


def test_truncated_batch_is_corrupt_message():
    batch = build_batch([b"x" * 50])
    assert error_of(batch[:-1]) == ErrorCode.corrupt_message
    assert error_of(batch[:30]) == ErrorCode.corrupt_message


def test_magic_other_than_two_is_invalid_record():
    assert error_of(build_batch([b"x"], magic=1)) == ErrorCode.invalid_record


def test_count_mismatch_is_invalid_record():
    assert error_of(build_batch([b"x", b"y"], last_offset_delta=0)) == ErrorCode.invalid_record
    assert error_of(build_batch([b"x"], records_count=0, last_offset_delta=-1)) == ErrorCode.invalid_record


def test_client_base_offset_must_be_zero():
    assert error_of(build_batch([b"x"], base_offset=5)) == ErrorCode.invalid_record


def test_two_batches_in_one_partition_rejected():
    records = build_batch([b"a"]) + build_batch([b"b"])
    assert error_of(records) == ErrorCode.invalid_record


def test_empty_or_null_records_rejected():
    assert error_of(b"") == ErrorCode.invalid_record
    assert error_of(None) == ErrorCode.invalid_record


def test_size_limit_is_inclusive_of_batch_overhead():
    batch = build_batch([b"x" * 1000])
    assert check(batch, max_message_bytes=len(batch)).records_count == 1
    assert error_of(batch, max_message_bytes=len(batch) - 1) == ErrorCode.message_too_large


def test_zstd_needs_produce_v7():
    batch = build_batch([b"zzz"], codec=4)
    assert check(batch, version=7).codec == 4
    assert error_of(batch, version=6) == ErrorCode.unsupported_compression_type


def test_control_batches_rejected_transactional_ones_validated():
    assert error_of(build_batch([b"x"], attributes_extra=0x20)) == ErrorCode.invalid_record
    transactional_control = build_batch([b"x"], attributes_extra=0x30, producer_id=1, producer_epoch=0)
    assert error_of(transactional_control) == ErrorCode.invalid_record
    # A transactional batch passes the header checks; its transaction is checked by the handler.
    header = check(build_batch([b"x"], attributes_extra=0x10, producer_id=1, producer_epoch=0, base_sequence=0))
    assert header.is_transactional and header.producer_id == 1


def test_idempotent_batch_needs_a_sequence():
    assert error_of(build_batch([b"x"], producer_id=4, producer_epoch=0, base_sequence=-1)) == ErrorCode.invalid_record
    assert check(build_batch([b"x"], producer_id=4, producer_epoch=0, base_sequence=0)).producer_id == 4


def test_unknown_codec_rejected():
    # Codec id 5 (attributes bits 0-2) with a correct CRC: no such compression.
    assert error_of(build_batch([b"x"], attributes_extra=0x05)) == ErrorCode.corrupt_message
