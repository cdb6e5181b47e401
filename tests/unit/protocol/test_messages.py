"""Message bodies: every type round-trips; every malformed body is a ProtocolError that says why."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from bkaio.errors import ProtocolError
from bkaio.protocol import (
    I64_MAX,
    U64_MAX,
    AddEntryRequest,
    AddEntryResponse,
    Flag,
    FrameDecoder,
    FrameEncoder,
    HelloRequest,
    ListEntriesResponse,
    Op,
    ReadEntryResponse,
    ReadRangeResponse,
    Request,
    Response,
    Status,
    WireEntry,
    decode_request,
    decode_response,
    request_id_of,
)
from bkaio.protocol.selfcheck import sample_requests, sample_responses

REQUESTS = sample_requests()
RESPONSES = sample_responses()
KEY = b"k" * 32


def _through_msgpack(body: list[Any]) -> Any:
    return msgpack.unpackb(msgpack.packb(body))


def test_samples_cover_every_op() -> None:
    assert {request.op for request in REQUESTS} == set(Op) - {Op.ERROR}
    assert {response.op for response in RESPONSES} == set(Op)
    assert {response.status for response in RESPONSES} > {Status.OK, Status.FENCED}


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda m: type(m).__name__)
def test_request_round_trip(request_: Request) -> None:
    body = request_.to_body()
    assert body[0] == request_.op and body[1] == request_.request_id
    decoded = decode_request(_through_msgpack(body))
    assert decoded == request_
    assert type(decoded) is type(request_)


@pytest.mark.parametrize("response", RESPONSES, ids=lambda m: type(m).__name__)
def test_response_round_trip(response: Response) -> None:
    body = response.to_body()
    assert body[:3] == [response.op, response.request_id, response.status]
    decoded = decode_response(_through_msgpack(body))
    assert decoded == response
    assert type(decoded.status) is Status


def test_decoded_enums_are_enum_members() -> None:
    request = decode_request(_through_msgpack(REQUESTS[3].to_body()))
    assert isinstance(request, AddEntryRequest)
    assert request.flags is Flag.RECOVERY_ADD
    response = decode_response(_through_msgpack(RESPONSES[3].to_body()))
    assert response.status is Status.FENCED


def test_stream_of_every_message_through_encoder_and_decoder() -> None:
    encoder = FrameEncoder()
    for request in REQUESTS:
        encoder.add(request)
    decoder = FrameDecoder()
    assert [decode_request(body) for body in decoder.feed(encoder.take())] == REQUESTS


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda m: type(m).__name__)
def test_error_response_echoes_ids_and_round_trips(request_: Request) -> None:
    response = request_.error_response(Status.BAD_REQUEST)
    assert response.op == request_.op
    assert response.request_id == request_.request_id
    assert response.status is Status.BAD_REQUEST
    assert decode_response(_through_msgpack(response.to_body())) == response


def test_repr_hides_master_key_and_payload() -> None:
    request = AddEntryRequest(1, 2, 3, Flag.NONE, b"secret-key", -1, 7, 9, b"payload-bytes")
    assert "secret-key" not in repr(request) and "payload-bytes" not in repr(request)


def _add_body(**changes: Any) -> list[Any]:
    fields = {
        "op": 2,
        "request_id": 1,
        "ledger_id": 7,
        "entry_id": 0,
        "flags": 0,
        "master_key": KEY,
        "lac": -1,
        "length": 3,
        "digest": 5,
        "payload": b"abc",
    }
    fields.update(changes)
    return list(fields.values())


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (_add_body(master_key=5), r"^ADD_ENTRY field 5 \(master_key\) must be bytes, got int$"),
        (_add_body(payload="abc"), r"field 9 \(payload\) must be bytes, got str"),
        (_add_body(payload=None), r"field 9 \(payload\) must be bytes, got nil"),
        (_add_body(ledger_id=True), r"field 2 \(ledger_id\) must be int, got bool"),
        (_add_body(ledger_id=-1), r"field 2 \(ledger_id\) must be in \[0, "),
        (_add_body(ledger_id=I64_MAX + 1), r"field 2 \(ledger_id\) must be in"),
        (_add_body(entry_id=-1), r"field 3 \(entry_id\) must be in"),
        (_add_body(entry_id=1.0), r"field 3 \(entry_id\) must be int, got float"),
        (_add_body(request_id=-1), r"field 1 \(request_id\) must be in"),
        (_add_body(request_id=U64_MAX + 1), r"field 1 \(request_id\) must be in"),
        (_add_body(flags=8), r"field 4 \(flags\) must be a combination of Flag bits"),
        (_add_body(flags=-1), r"field 4 \(flags\)"),
        (_add_body(lac=-2), r"field 6 \(lac\) must be in \[-1, "),
        (_add_body(digest=2**32), r"field 8 \(digest\) must be in"),
        (_add_body(length=[1]), r"field 7 \(length\) must be int, got list"),
        (_add_body()[:-1], r"ADD_ENTRY has 9 fields, expected 10: \[op, request_id, "),
        ([*_add_body(), 1], r"ADD_ENTRY has 11 fields, expected 10"),
        ([3, 1, 7, -2, 0, None], r"READ_ENTRY field 3 \(entry_id\) must be in \[-1, "),
        ([3, 1, 7, 0, 0, "key"], r"READ_ENTRY field 5 \(master_key\) must be bytes or nil"),
        ([1, 1, 1, "c", 5], r"HELLO field 4 \(auth_token\) must be str or nil, got int"),
        ([1, 1, 1, b"c", None], r"HELLO field 3 \(client_id\) must be str, got bytes"),
        ([5, 1, 7, 4, None, -1, -5], r"READ_LAC field 6 \(timeout_ms\) must be in"),
        ([4, 1, 7, 0, -1, 10, 0, None], r"READ_RANGE field 4 \(max_count\) must be in"),
        ([10], r"PING has 1 fields, expected 2"),
        ([0, 1, 5, "x"], r"op 0 \(ERROR\) is sent only by a bookie"),
        ([99, 1], r"request field 0 \(op\) is not a known operation, got 99"),
        ([True, 1], r"request field 0 \(op\) must be int, got bool"),
        ([2.0, 1], r"request field 0 \(op\) must be int, got float"),
        ([[2], 1], r"request field 0 \(op\) must be int, got list"),
        ([], r"request body is an empty array"),
        ({"op": 2}, r"request body must be an array, got dict"),
        (None, r"request body must be an array, got nil"),
    ],
)
def test_malformed_requests_name_the_problem(body: Any, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_request(body)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ([2, 1, 99, 7, 0], r"ADD_ENTRY response field 2 \(status\) is not a known Status, got 99"),
        ([2, 1, -1, 7, 0], r"field 2 \(status\) is not a known Status, got -1"),
        ([2, 1, False, 7, 0], r"field 2 \(status\) must be int, got bool"),
        ([2, 1, 0, 7], r"ADD_ENTRY response has 4 fields, expected 5"),
        ([3, 1, 0, 7, 0, 0, [0, 1, 2]], r"field 6 \(entry\) item 0 has 3 fields, expected 4"),
        ([3, 1, 0, 7, 0, 0, [0, 1, 2, "p"]], r"field 6 \(entry\) item 0 field 3 \(payload\)"),
        ([3, 1, 0, 7, 0, 0, b"p"], r"field 6 \(entry\) must be an array or nil, got bytes"),
        ([4, 1, 0, 7, 0, [[0, -1, 1, 2, b"a"], [2, 0, 2, 3, b"b"]]], r"item 1 has entry_id 2"),
        ([4, 1, 0, 7, 0, [[0, -1, 1, 2]]], r"field 5 \(entries\) item 0 has 4 fields"),
        ([4, 1, 0, 7, 0, None], r"field 5 \(entries\) must be an array, got nil"),
        ([9, 1, 0, 7, [[3, 2]]], r"field 4 \(ranges\) item 0 has first 3 above last 2"),
        ([9, 1, 0, 7, [[0, 3], [3, 4]]], r"item 1 starts at 3, not after 3"),
        ([9, 1, 0, 7, [[0, "3"]]], r"item 0 field 1 \(last\) must be int, got str"),
        ([9, 1, 0, 7, [0, 3]], r"item 0 must be an array, got int"),
        ([1, 1, 0, 1, "b", 0, 1, ["f", 2]], r"field 7 \(features\) item 1 must be str, got int"),
        ([8, 1, 0, 1, 1, 0, 1, 0], r"field 7 \(read_only\) must be bool, got int"),
        ([0, 1, 5, b"m"], r"ERROR response field 3 \(message\) must be str, got bytes"),
        ([99, 1, 0], r"response field 0 \(op\) is not a known operation, got 99"),
    ],
)
def test_malformed_responses_name_the_problem(body: Any, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_response(body)


def test_read_entry_response_entry_carries_the_response_entry_id() -> None:
    response = decode_response([3, 1, 0, 7, 4, 3, [3, 50, 99, b"x"]])
    assert isinstance(response, ReadEntryResponse)
    assert response.entry == WireEntry(4, 3, 50, 99, b"x")


def test_nested_values_become_tuples() -> None:
    ranges = decode_response([9, 1, 0, 7, [[0, 3], [5, 5]]])
    assert isinstance(ranges, ListEntriesResponse)
    assert ranges.ranges == ((0, 3), (5, 5))
    read_range = decode_response([4, 1, 0, 7, 0, [[0, -1, 1, 2, b"a"]]])
    assert isinstance(read_range, ReadRangeResponse)
    assert read_range.entries == (WireEntry(0, -1, 1, 2, b"a"),)


def test_boundary_values_are_accepted() -> None:
    body = _add_body(request_id=U64_MAX, ledger_id=I64_MAX, entry_id=I64_MAX, flags=7)
    request = decode_request(body)
    assert isinstance(request, AddEntryRequest)
    assert request.request_id == U64_MAX
    assert request.flags == Flag.FENCE | Flag.RECOVERY_ADD | Flag.LONG_POLL
    assert decode_response([2, 0, 14, 0, 0]) == AddEntryResponse(0, Status.INTERNAL_ERROR, 0, 0)


def test_hello_accepts_any_version_number_for_the_bookie_to_judge() -> None:
    assert decode_request([1, 5, 99, "c", None]) == HelloRequest(5, 99, "c", None)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ([2, 17, "bad"], 17),
        ([99, U64_MAX], U64_MAX),
        ([2, -1], 0),
        ([2, U64_MAX + 1], 0),
        ([2, True], 0),
        ([2], 0),
        ("x", 0),
        (None, 0),
    ],
)
def test_request_id_of(body: Any, expected: int) -> None:
    assert request_id_of(body) == expected


def test_huge_ints_off_the_wire_are_named_by_size() -> None:
    with pytest.raises(ProtocolError, match=r"got a 16610-bit int"):
        decode_request(_add_body(ledger_id=10**5000))
    with pytest.raises(ProtocolError, match=r"not a known operation, got a \d+-bit int"):
        decode_request([10**5000, 1])
