"""FrameBuffer: frames come out the same whether the stream arrives whole or in arbitrary pieces."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copyless.protocol.framing import FrameBuffer, FrameTooLargeError


def encode(frames):
    return b"".join(struct.pack(">i", len(f)) + f for f in frames)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=30), st.data())
def test_split_anywhere_yields_same_frames(frames, data):
    stream = encode(frames)
    cuts = sorted(data.draw(st.lists(st.integers(min_value=0, max_value=len(stream)), max_size=20)))
    buffer = FrameBuffer()
    out = []
    previous = 0
    for cut in cuts + [len(stream)]:
        buffer.feed(stream[previous:cut])
        previous = cut
        while (frame := buffer.next_frame()) is not None:
            out.append(frame)
    assert out == frames
    assert buffer.buffered_bytes == 0


def test_oversized_frame_refused_before_body_arrives():
    buffer = FrameBuffer(max_frame_bytes=1000)
    buffer.feed(struct.pack(">i", 1001))
    with pytest.raises(FrameTooLargeError) as info:
        buffer.next_frame()
    assert info.value.size == 1001 and info.value.limit == 1000


def test_negative_size_refused():
    buffer = FrameBuffer()
    buffer.feed(struct.pack(">i", -5) + b"xxxx")
    with pytest.raises(FrameTooLargeError):
        buffer.next_frame()


def test_compaction_keeps_later_frames_intact():
    # Enough pipelined frames to cross the 64 KiB compaction threshold several times.
    frames = [bytes([i % 256]) * (1000 + i) for i in range(300)]
    buffer = FrameBuffer()
    buffer.feed(encode(frames))
    out = []
    while (frame := buffer.next_frame()) is not None:
        out.append(frame)
    assert out == frames


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=300), st.integers(64 << 10, 300 << 10)), max_size=8), st.data())
def test_large_frames_taken_partially_and_filled_directly_match(frames, data):
    """A connection reading as the broker does: large frames move out once an eighth has arrived (with
    take_partial from what was fed, or take_partial_of from a chunk just received) and the rest is copied
    straight into them; small ones go through feed/next_frame."""
    frames = [bytes([n % 251]) * n if isinstance(n, int) else n for n in frames]
    stream = encode(frames)
    chunk = data.draw(st.integers(1, 256 << 10), label="recv size")
    buffer = FrameBuffer()
    out, position, taken, direct = [], 0, 0, 0
    while position < len(stream) or buffer.buffered_bytes:
        frame = buffer.next_frame()
        if frame is None:
            partial = buffer.take_partial()
            if partial is None:
                assert position < len(stream), "data left that never makes a frame"
                received = stream[position:position + chunk]
                position += len(received)
                partial = buffer.take_partial_of(received)
                if partial is None:
                    buffer.feed(received)
                    continue
                direct += 1
            frame, filled = partial
            assert len(frame) >= 64 << 10 and filled * 8 >= len(frame) and buffer.buffered_bytes == 0
            rest = len(frame) - filled
            frame[filled:] = stream[position:position + rest]
            position += rest
            taken += 1
        out.append(bytes(frame))
    assert out == frames
    # A large frame arriving in pieces of at most an eighth is always incomplete when its eighth is in.
    assert taken >= sum(1 for f in frames if len(f) >= max(64 << 10, 8 * chunk))
    # A large frame that starts a chunk of at least an eighth of it, and does not fit in it, comes straight
    # out of that chunk: the first frame of the stream is one.
    if frames and 64 << 10 <= len(frames[0]) <= 8 * (chunk - 4) and len(frames[0]) + 4 > chunk:
        assert direct >= 1


def test_take_partial_of_builds_a_large_frame_from_a_received_chunk_only_when_nothing_is_buffered():
    head = struct.pack(">i", 100_000) + b"y" * 20_000
    assert FrameBuffer().take_partial_of(head) == (bytearray(b"y" * 20_000) + bytearray(80_000), 20_000)
    assert FrameBuffer().take_partial_of(memoryview(head)) == (bytearray(b"y" * 20_000) + bytearray(80_000), 20_000)
    assert FrameBuffer().take_partial_of(struct.pack(">i", 100_000) + b"y" * 10_000) is None  # under an eighth
    assert FrameBuffer().take_partial_of(struct.pack(">i", 1000) + b"y" * 500) is None  # small
    assert FrameBuffer().take_partial_of(struct.pack(">i", 70_000) + b"y" * 70_000) is None  # complete
    assert FrameBuffer(max_frame_bytes=1 << 20).take_partial_of(struct.pack(">i", 2 << 20) + b"y" * (1 << 20)) is None
    assert FrameBuffer().take_partial_of(b"\x00\x01") is None  # no size yet
    buffer = FrameBuffer()
    buffer.feed(b"\x00")  # a byte of the next frame's size is buffered: the chunk continues it
    assert buffer.take_partial_of(head) is None


def test_take_partial_leaves_small_complete_and_invalid_frames_alone():
    buffer = FrameBuffer(max_frame_bytes=1 << 20)
    buffer.feed(struct.pack(">i", 100_000) + b"x" * 20_000)
    assert buffer.take_partial() == (bytearray(b"x" * 20_000) + bytearray(80_000), 20_000)
    buffer.feed(struct.pack(">i", 100_000) + b"x" * 10_000)  # less than an eighth
    assert buffer.take_partial() is None
    buffer = FrameBuffer(max_frame_bytes=1 << 20)
    buffer.feed(struct.pack(">i", 2 << 20) + b"x" * (1 << 20))  # over the limit: next_frame refuses it
    assert buffer.take_partial() is None
    buffer = FrameBuffer()
    buffer.feed(struct.pack(">i", 1000) + b"x" * 500)  # small
    assert buffer.take_partial() is None
