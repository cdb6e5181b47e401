"""Hypothesis fuzzing: whatever arrives, only ProtocolError (or a well-typed message) comes out."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bkaio.errors import ProtocolError
from bkaio.protocol import (
    FRAME_HEADER,
    FrameDecoder,
    Request,
    Response,
    decode_request,
    decode_response,
    request_id_of,
)
from bkaio.protocol import messages as messages_module
from bkaio.protocol.selfcheck import sample_requests, sample_responses

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Everything msgpack can carry (ints limited to what it can pack), nested a few levels deep.
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.sampled_from([-2, -1, 0, 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1])
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=40)
)
VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=6)
        | st.dictionaries(st.text(max_size=5) | st.binary(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)
# Off the wire a caller could hand the decoders any Python int at all.
ANY_VALUES = st.recursive(SCALARS | st.integers(), lambda children: st.lists(children, max_size=6))
SAMPLE_BODIES = [m.to_body() for m in sample_requests()] + [m.to_body() for m in sample_responses()]


def _decode_both(body: Any) -> None:
    for decode in (decode_request, decode_response):
        try:
            message: Request | Response = decode(body)
        except ProtocolError:
            continue
        # Accepted: it must survive its own round trip unchanged.
        assert decode(msgpack.unpackb(msgpack.packb(message.to_body()))) == message
    request_id = request_id_of(body)
    assert type(request_id) is int and 0 <= request_id < 2**64


@FUZZ
@given(VALUES | ANY_VALUES)
def test_arbitrary_values_decode_or_raise_protocol_error(body: Any) -> None:
    _decode_both(body)


@FUZZ
@given(st.integers(min_value=0, max_value=11), st.lists(VALUES | ANY_VALUES, max_size=11))
def test_arbitrary_fields_under_a_real_op(op: int, fields: list[Any]) -> None:
    _decode_both([op, *fields])


@FUZZ
@given(st.sampled_from(SAMPLE_BODIES), st.data())
def test_one_field_of_a_valid_body_replaced(body: list[Any], data: st.DataObject) -> None:
    mutated = list(body)
    index = data.draw(st.integers(min_value=0, max_value=len(mutated)), label="index")
    value = data.draw(VALUES | SCALARS | st.integers(), label="value")
    if index == len(mutated):
        mutated.append(value)
    else:
        mutated[index] = value
    _decode_both(mutated)


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes_into_the_frame_decoder(data: bytes) -> None:
    decoder = FrameDecoder(max_frame_bytes=256)
    try:
        bodies = decoder.feed(data)
    except ProtocolError:
        return
    for body in bodies:
        assert type(body) is list
        _decode_both(body)


@FUZZ
@given(st.lists(st.binary(max_size=80), max_size=6), st.binary(max_size=10))
def test_arbitrary_framed_bodies_into_the_frame_decoder(bodies: list[bytes], tail: bytes) -> None:
    wire = b"".join(FRAME_HEADER.pack(len(body)) + body for body in bodies) + tail
    try:
        for body in FrameDecoder(max_frame_bytes=64).feed(wire):
            _decode_both(body)
    except ProtocolError:
        pass


@FUZZ
@given(st.lists(VALUES, max_size=5), st.integers(min_value=1, max_value=9))
def test_packed_values_split_into_chunks(values: list[Any], chunk_bytes: int) -> None:
    wire = b"".join(
        FRAME_HEADER.pack(len(packed)) + packed for packed in map(msgpack.packb, values)
    )
    decoder = FrameDecoder()
    decoded: list[Any] = []
    try:
        for start in range(0, len(wire), chunk_bytes):
            decoded.extend(decoder.feed(wire[start : start + chunk_bytes]))
    except ProtocolError:
        # Only a body that is not an array is refused: everything else here is valid msgpack.
        assert any(type(value) is not list for value in values)
        return
    assert decoded == values
    for body in decoded:
        _decode_both(body)


_EDGE_INTS = [-(2**63), -2, -1, 0, 1, 7, 8, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64]
_ODD_VALUES = [None, True, False, 1.0, "", "x", b"", b"k", [], [1]]
ADD_FIELD_VALUES = st.sampled_from(_EDGE_INTS + _ODD_VALUES)


@FUZZ
@given(st.lists(ADD_FIELD_VALUES, min_size=8, max_size=11))
def test_add_entry_fast_paths_agree_with_the_tables(fields: list[Any]) -> None:
    """The ADD_ENTRY fast paths accept exactly what the table decoders accept."""
    for fast, table, op in (
        (messages_module._REQUEST_DECODERS, messages_module._REQUEST_TABLE, 2),
        (messages_module._RESPONSE_DECODERS, messages_module._RESPONSE_TABLE, 2),
    ):
        body = [op, *fields]
        outcomes = []
        for decoder in (fast[op], table[op]):
            try:
                outcomes.append(decoder(body))
            except ProtocolError as error:
                outcomes.append(str(error))
        assert outcomes[0] == outcomes[1]
