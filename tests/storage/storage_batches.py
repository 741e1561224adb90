"""Real RecordBatch v2 bytes for storage tests, built with kafka-python's DefaultRecordBatchBuilder."""

from __future__ import annotations

from kafka.record.default_records import DefaultRecordBatchBuilder

from copyless.client.protocol.records import decode_records, iter_batches

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def build_batch(values, timestamps, *, codec: int = 0, key: bytes | None = None) -> bytes:
    """One v2 batch with one record per value (baseOffset 0, as a producer sends it)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    for offset_delta, (value, timestamp) in enumerate(zip(values, timestamps)):
        builder.append(offset_delta, timestamp=timestamp, key=key, value=value, headers=[])
    return bytes(builder.build())


def records_of(data: bytes) -> list:
    """Every record of every complete batch in ``data`` (a fetch response body may end in a partial batch)."""
    out = []
    for position, _ in iter_batches(data):
        out.extend(decode_records(data, position))
    return out


def build_keyed_batch(keys, values, timestamp_ms: int, *, codec: int = 0) -> bytes:
    """One v2 batch of ``(key, value)`` records (a None value is a tombstone), baseOffset 0."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    for offset_delta, (key, value) in enumerate(zip(keys, values)):
        builder.append(offset_delta, timestamp=timestamp_ms, key=key, value=value, headers=[])
    return bytes(builder.build())
