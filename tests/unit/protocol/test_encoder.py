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


@pytest.mark.parametrize(
    "request_id", [0, 1, 127, 128, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**64 - 1]
)
def test_prepacked_frames_decode_to_the_same_bodies_as_whole_ones(request_id: int) -> None:
    fields = [7, 2**40, 2, b"k" * 20, -1, 10_000, 0xDEADBEEF, b"p" * 1500]
    whole = FrameEncoder()
    whole.add([2, request_id, *fields])
    prepacked = FrameEncoder()
    size = prepacked.add_prepacked(2, request_id, len(fields), prepacked.pack_fields(fields))
    assert len(prepacked) == size and prepacked.pending_frames == 1
    frame = prepacked.take()
    assert size == len(frame)
    # The request id may be written wider than the shortest form: same body once decoded.
    assert (
        FrameDecoder().feed(frame)
        == FrameDecoder().feed(whole.take())
        == [[2, request_id, *fields]]
    )


def test_prepacked_and_whole_frames_keep_their_order_in_parts_and_take() -> None:
    fields = [7, 3, 0, b"k", -1, 10, 0, b"p" * 100]
    encoder = FrameEncoder()
    encoder.add([Op.PING, 1])
    encoder.add_prepacked(2, 2, len(fields), encoder.pack_fields(fields))
    encoder.add([Op.PING, 3])
    encoder.add_prepacked(2, 4, len(fields), encoder.pack_fields(fields))
    assert encoder.pending_frames == 4
    expected = [[Op.PING, 1], [2, 2, *fields], [Op.PING, 3], [2, 4, *fields]]
    size = len(encoder)
    parts = encoder.take_parts()
    assert sum(map(len, parts)) == size
    assert FrameDecoder().feed(b"".join(parts)) == expected
    assert len(encoder) == 0 and encoder.pending_frames == 0 and encoder.take_parts() == []
    encoder.add_prepacked(2, 2, len(fields), encoder.pack_fields(fields))
    encoder.add([Op.PING, 3])
    assert FrameDecoder().feed(encoder.take()) == expected[1:3]


def test_prepacked_frame_above_the_limit_is_refused_before_buffering() -> None:
    encoder = FrameEncoder(max_frame_bytes=100)
    packed = encoder.pack_fields([b"x" * 200])
    with pytest.raises(ProtocolError, match="exceeds max_frame_bytes=100"):
        encoder.add_prepacked(2, 1, 1, packed)
    assert len(encoder) == 0 and encoder.pending_frames == 0
