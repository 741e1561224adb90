"""FrameBuffer: frames come out the same whether the stream arrives whole or in arbitrary pieces."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.protocol.framing import FrameBuffer, FrameTooLargeError


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
