"""FrameDecoder and frame_parts: bodies come out whole however the bytes arrive."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import pytest

from bkaio.errors import ProtocolError
from bkaio.protocol import FRAME_HEADER, FrameDecoder, Op, encode_frame, frame_parts, unpack_body


def _wire(bodies: list[list[Any]]) -> bytes:
    return b"".join(header + packed for header, packed in map(frame_parts, bodies))


BODIES: list[list[Any]] = [
    [Op.READ_ENTRY, 1, 7, 0, 0, None],
    [Op.ADD_ENTRY, 2, 7, 0, 0, b"k" * 32, -1, 3, 123, b"abc"],
    [Op.PING, 3],
    [Op.HELLO, 4, 1, "client-\u00e9", None],
]


def test_frame_parts_is_length_prefix_then_msgpack() -> None:
    header, packed = frame_parts([Op.PING, 9])
    assert FRAME_HEADER.unpack(header) == (len(packed),)
    assert msgpack.unpackb(packed) == [10, 9]
    assert encode_frame([Op.PING, 9]) == header + packed


def test_whole_stream_in_one_feed() -> None:
    assert FrameDecoder().feed(_wire(BODIES)) == BODIES


@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 5, 7, 64, 4096])
def test_decoder_yields_the_same_bodies_however_bytes_arrive(chunk_bytes: int) -> None:
    bodies = [[Op.READ_ENTRY, request_id, 7, request_id, 0, None] for request_id in range(50)]
    wire = _wire(bodies)
    decoder = FrameDecoder(max_frame_bytes=1024)
    chunks = (wire[i : i + chunk_bytes] for i in range(0, len(wire), chunk_bytes))
    assert [body for chunk in chunks for body in decoder.feed(chunk)] == bodies
    assert decoder.buffered_bytes == 0


def test_split_at_every_byte_boundary() -> None:
    wire = _wire(BODIES)
    for cut in range(len(wire) + 1):
        decoder = FrameDecoder()
        assert decoder.feed(wire[:cut]) + decoder.feed(wire[cut:]) == BODIES, cut


def test_split_at_every_pair_of_boundaries_of_one_frame() -> None:
    wire = encode_frame(BODIES[1])
    for first in range(len(wire) + 1):
        for second in range(first, len(wire) + 1):
            decoder = FrameDecoder()
            got = decoder.feed(wire[:first]) + decoder.feed(wire[first:second])
            got += decoder.feed(wire[second:])
            assert got == [BODIES[1]], (first, second)


def test_memoryview_and_bytearray_input() -> None:
    wire = _wire(BODIES)
    decoder = FrameDecoder()
    assert decoder.feed(memoryview(wire)[:10]) + decoder.feed(bytearray(wire[10:])) == BODIES


def test_truncated_frame_yields_nothing_and_waits() -> None:
    wire = encode_frame(BODIES[1])
    decoder = FrameDecoder()
    assert decoder.feed(wire[:-1]) == []
    assert decoder.buffered_bytes == len(wire) - 1
    assert decoder.feed(wire[-1:]) == [BODIES[1]]


def test_header_alone_waits() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(encode_frame(BODIES[0])[:3]) == []
    assert decoder.buffered_bytes == 3


def test_trailing_bytes_are_kept_for_the_next_feed() -> None:
    first, second = encode_frame(BODIES[0]), encode_frame(BODIES[2])
    decoder = FrameDecoder()
    assert decoder.feed(first + second[:5]) == [BODIES[0]]
    assert decoder.buffered_bytes == 5
    assert decoder.feed(second[5:]) == [BODIES[2]]
    assert decoder.buffered_bytes == 0


def test_oversized_length_prefix_raises_before_the_body_is_buffered() -> None:
    decoder = FrameDecoder(max_frame_bytes=100)
    with pytest.raises(ProtocolError, match=r"101 bytes, above max_frame_bytes=100"):
        decoder.feed(FRAME_HEADER.pack(101))  # Not one body byte sent yet.


def test_huge_length_prefix_after_a_good_frame() -> None:
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError, match="max_frame_bytes"):
        decoder.feed(encode_frame(BODIES[0]) + b"\xff\xff\xff\xff")


def test_a_frame_of_exactly_max_frame_bytes_is_accepted() -> None:
    header, packed = frame_parts([Op.ADD_ENTRY, 1, b"x" * 100])
    decoder = FrameDecoder(max_frame_bytes=len(packed))
    assert decoder.feed(header + packed) == [[Op.ADD_ENTRY, 1, b"x" * 100]]


def test_decoder_stays_broken_after_an_error() -> None:
    decoder = FrameDecoder(max_frame_bytes=10)
    with pytest.raises(ProtocolError):
        decoder.feed(FRAME_HEADER.pack(11))
    with pytest.raises(ProtocolError):
        decoder.feed(encode_frame([Op.PING, 1]))


def _frame_of(packed: bytes) -> bytes:
    return FRAME_HEADER.pack(len(packed)) + packed


@pytest.mark.parametrize(
    ("packed", "match"),
    [
        (b"", "zero-length frame"),
        (msgpack.packb(7), "must be a msgpack array, got int"),
        (msgpack.packb({"op": 1}), "must be a msgpack array, got dict"),
        (msgpack.packb(None), "must be a msgpack array, got nil"),
        (msgpack.packb([1, 2]) + b"\xc0", "1 bytes after its msgpack value"),
        (b"\x92\x01", "not valid msgpack"),  # Array of 2 with one element.
        (b"\xc1", "not valid msgpack"),  # Reserved type byte.
        (b"\x91\xa1\xff", "not valid msgpack"),  # Invalid UTF-8 in a str.
        (b"\x91" * 5000 + b"\xc0", "not valid msgpack"),  # Nesting bomb.
        (b"\x91\xd4\x05\x00", "not valid msgpack"),  # fixext 1.
        (b"\x91\xc7\x00\x05", "ext type 5"),  # ext 8 of length 0 reaches ext_hook.
        (b"\x91" + msgpack.packb(msgpack.Timestamp(1, 0)), "not valid msgpack"),
        (b"\x91\x81\x01\x02", "not valid msgpack"),  # Map with an int key.
    ],
)
def test_malformed_bodies_raise_protocol_error(packed: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        FrameDecoder().feed(_frame_of(packed))


def test_declared_lengths_above_the_frame_are_refused() -> None:
    # A bin header claiming 2 GiB inside a small frame: refused, nothing allocated.
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        FrameDecoder(max_frame_bytes=64).feed(_frame_of(b"\x91\xc6\x7f\xff\xff\xff"))


def test_unpack_body_decodes_one_standalone_body() -> None:
    assert unpack_body(msgpack.packb([1, 2, b"x"])) == [1, 2, b"x"]
    with pytest.raises(ProtocolError, match="exceeds max_frame_bytes=2"):
        unpack_body(msgpack.packb([1, 2, 3]), max_frame_bytes=2)


def test_max_frame_bytes_must_be_positive() -> None:
    from bkaio.errors import ConfigError

    with pytest.raises(ConfigError):
        FrameDecoder(max_frame_bytes=0)


def _fixed_answer(op: int, request_id: int, status: int, ledger_id: int, entry_id: int) -> bytes:
    body = struct.pack(
        ">BBBQBBQBQ", 0x95, op, 0xCF, request_id, status, 0xCF, ledger_id, 0xCF, entry_id
    )
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize(
    "fields",
    [
        (1, 0, 0, 0, 0),
        (1, 2**64 - 1, 0, 2**63 - 1, 2**63 - 1),
        (1, 7, 13, 42, 9),
        (127, 1, 127, 1, 1),
    ],
)
def test_fixed_width_answers_decode_like_msgpack(fields: tuple[int, ...]) -> None:
    frame = _fixed_answer(*fields)
    assert FrameDecoder().feed(frame) == [list(fields)]
    assert msgpack.unpackb(frame[4:]) == list(fields)  # The same as the general decoder's.


def test_fixed_width_answers_mixed_with_other_frames_and_split_anywhere() -> None:
    stream = b"".join(
        [
            _fixed_answer(1, 5, 0, 9, 1),
            encode_frame([1, 6, 0, 9, 2]),
            _fixed_answer(1, 7, 0, 9, 3),
            encode_frame(["x" * 27]),  # Another 30-byte body: a fixarray of one str.
        ]
    )
    expected = [[1, 5, 0, 9, 1], [1, 6, 0, 9, 2], [1, 7, 0, 9, 3], ["x" * 27]]
    for split in range(len(stream) + 1):
        decoder = FrameDecoder()
        assert decoder.feed(stream[:split]) + decoder.feed(stream[split:]) == expected


def test_thirty_byte_bodies_of_another_shape_take_the_general_decoder() -> None:
    frame = bytearray(_fixed_answer(1, 5, 0, 9, 1))
    frame[4 + 2] = 0xCE  # A uint32 tag where the fixed shape has uint64: no longer that shape.
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(bytes(frame))  # Bytes left after the array: refused as before.
    negative = bytearray(_fixed_answer(1, 5, 0, 9, 1))
    negative[4 + 1] = 0xFF  # Negative fixint -1 as the op: still decoded, by msgpack.
    assert FrameDecoder().feed(bytes(negative)) == [[-1, 5, 0, 9, 1]]
