"""FrameEncoder batches frames into one buffer that the decoder splits back."""

from __future__ import annotations

import pytest

from bkaio.errors import ConfigError, ProtocolError
from bkaio.protocol import (
    AddEntryResponse,
    FrameDecoder,
    FrameEncoder,
    Op,
    PingRequest,
    Status,
    decode_response,
    encode_frame,
)


def test_batch_is_the_concatenation_of_single_frames() -> None:
    encoder = FrameEncoder()
    messages = [AddEntryResponse(i, Status.OK, 3, i) for i in range(10)]
    sizes = [encoder.add(message) for message in messages]
    assert encoder.pending_frames == 10
    assert len(encoder) == sum(sizes)
    batch = encoder.take()
    assert batch == b"".join(encode_frame(message.to_body()) for message in messages)
    assert [decode_response(body) for body in FrameDecoder().feed(batch)] == messages


def test_take_resets_and_the_encoder_is_reusable() -> None:
    encoder = FrameEncoder()
    encoder.add(PingRequest(1))
    first = encoder.take()
    assert len(encoder) == 0 and encoder.pending_frames == 0 and encoder.take() == b""
    encoder.add([Op.PING, 1])  # A raw body works too.
    assert encoder.drain() == first


def test_a_frame_above_max_frame_bytes_is_refused_at_encode() -> None:
    encoder = FrameEncoder(max_frame_bytes=16)
    with pytest.raises(ProtocolError, match="exceeds max_frame_bytes=16"):
        encoder.add([Op.ADD_ENTRY, 1, b"x" * 32])
    assert encoder.take() == b""


def test_max_frame_bytes_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        FrameEncoder(max_frame_bytes=-1)
