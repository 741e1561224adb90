"""The cleaner's record parser (``compaction.parse_records``, with its inline one-byte varints) against an
independent encoder (tests/support/batches.py): every field of every record, at one-, two- and many-byte
varints, from bytes, a bytearray or a memoryview; and a cut or damaged blob raises InvalidBatchError, nothing else."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from copyless.broker.storage.compaction import first_keyless_offset_delta, parse_records
from copyless.protocol.records import InvalidBatchError, read_header
from tests.support.batches import GZIP, NONE, build_batch, encode_record

RECORD = st.tuples(
    st.integers(0, 1 << 20),  # offset delta: one byte below 64, more above
    st.integers(-(1 << 40), 1 << 40),  # timestamp delta (negative after a delete horizon rebases it)
    st.one_of(st.none(), st.binary(max_size=200)),
    st.one_of(st.none(), st.binary(max_size=300)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(RECORD, min_size=1, max_size=20), st.sampled_from([bytes, bytearray, memoryview]))
def test_every_field_of_every_record(records, kind):
    parts = [encode_record(offset_delta, timestamp_delta, key, value)
             for offset_delta, timestamp_delta, key, value in records]
    blob = b"".join(parts)
    parsed = parse_records(kind(blob), len(records))
    start = 0
    for record, part, (offset_delta, timestamp_delta, key, value) in zip(parsed, parts, records, strict=True):
        assert (record.offset_delta, record.timestamp_delta, record.key, record.is_tombstone) == \
            (offset_delta, timestamp_delta, key, value is None)
        assert (record.start, record.end) == (start, start + len(part))
        assert isinstance(record.key, (bytes, type(None)))  # the offset map hashes it
        start += len(part)


@settings(max_examples=300, deadline=None)
@given(st.lists(RECORD, min_size=1, max_size=5), st.data())
def test_a_cut_or_damaged_blob_raises_invalid_batch(records, data):
    blob = bytearray(b"".join(encode_record(*record) for record in records))
    if data.draw(st.booleans()):
        blob = blob[:data.draw(st.integers(0, len(blob) - 1))]
        expect_error = True
    else:
        position = data.draw(st.integers(0, len(blob) - 1))
        blob[position] = data.draw(st.integers(0, 255))
        expect_error = False
    try:
        parse_records(bytes(blob), len(records))
    except InvalidBatchError:
        return
    assert not expect_error, "a cut blob parsed"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=40)), st.binary(max_size=300)), min_size=1,
                max_size=30),
       st.sampled_from([NONE, GZIP]))
def test_the_produce_paths_keyless_scan_agrees_with_the_full_parse(records, codec):
    """The produce path's scan reads only lengths; its answer is the first keyless record's offset delta, the
    one a full parse gives."""
    keys, values = [k for k, _ in records], [v for _, v in records]
    batch = build_batch(values, keys=keys, codec=codec)
    header = read_header(batch)
    expected = next((i for i, key in enumerate(keys) if key is None), None)
    assert first_keyless_offset_delta(batch, header) == expected
