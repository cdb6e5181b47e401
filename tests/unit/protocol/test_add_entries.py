"""ADD_ENTRIES (op 11): the message pair, its decoding checks, the encoder's frame grouping
(`add_to_entries`, `add_entries_frame`) and the ledger handle's cutting of a batch into frames.
"""

from __future__ import annotations

import contextlib
import itertools
import struct
from typing import Any

import msgpack
import pytest

from bkaio.errors import ProtocolError
from bkaio.ledger_client.add_batching import _frames_of
from bkaio.protocol import (
    I64_MAX,
    U64_MAX,
    AddEntriesRequest,
    AddEntriesResponse,
    AddEntryRequest,
    AddEntryResponse,
    Flag,
    FrameDecoder,
    FrameEncoder,
    Op,
    ReadEntryRequest,
    Status,
    WireEntry,
    decode_request,
    decode_response,
)
from bkaio.protocol.encoder import ADD_ENTRIES_BATCH_BYTES

KEY = b"k" * 32
OTHER_KEY = b"o" * 32
LEDGER = 7
_PACKER = FrameEncoder()


def _through_msgpack(body: list[Any]) -> Any:
    return msgpack.unpackb(msgpack.packb(body))


def _entry(entry_id: int, payload: bytes = b"payload") -> WireEntry:
    return WireEntry(
        entry_id, entry_id - 1, (entry_id + 1) * len(payload), 1000 + entry_id, payload
    )


def _packed(entry: WireEntry) -> bytes:
    return _PACKER.pack_fields(
        [entry.entry_id, entry.lac, entry.length, entry.digest, entry.payload]
    )


def _entries_body(request_id: int, count: int, **change: Any) -> list[Any]:
    """A well-formed ADD_ENTRIES body of `count` entries, with head fields replaced by `change`."""
    head = {"ledger_id": LEDGER, "flags": 0, "master_key": KEY, **change}
    body: list[Any] = [int(Op.ADD_ENTRIES), request_id, head["ledger_id"], head["flags"]]
    body.append(head["master_key"])
    for entry_id in range(count):
        entry = _entry(entry_id)
        body += [entry.entry_id, entry.lac, entry.length, entry.digest, entry.payload]
    return body


def _decoded(batch: bytes, max_frame_bytes: int = 8 * 1024 * 1024) -> list[Any]:
    """The messages of a batch of frames, in order."""
    return [decode_request(body) for body in FrameDecoder(max_frame_bytes).feed(batch)]


# --- Messages -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_",
    [
        AddEntriesRequest(1, LEDGER, Flag.NONE, KEY, (_entry(0),)),
        AddEntriesRequest(2**40, 0, Flag.RECOVERY_ADD, b"", tuple(_entry(i) for i in range(5))),
        AddEntriesRequest(U64_MAX - 2, I64_MAX, Flag.NONE, KEY, tuple(_entry(i) for i in range(3))),
        AddEntriesRequest(9, LEDGER, Flag.NONE, KEY, (WireEntry(I64_MAX, I64_MAX, 0, 0, b""),)),
    ],
    ids=["one", "recovery-five", "last-ids", "extremes"],
)
def test_request_round_trips_through_msgpack(request_: AddEntriesRequest) -> None:
    """to_body -> msgpack -> decode_request gives the same request back."""
    body = request_.to_body()
    assert len(body) == 5 + 5 * len(request_.entries)  # Flat: no array per entry.
    decoded = decode_request(_through_msgpack(body))
    assert type(decoded) is AddEntriesRequest
    assert decoded == request_


@pytest.mark.parametrize(
    "response",
    [
        AddEntriesResponse(3, Status.OK, LEDGER, 0, 1),
        AddEntriesResponse(2**33, Status.FENCED, I64_MAX, 10, 1000),
        AddEntriesResponse(U64_MAX - 9, Status.OK, LEDGER, I64_MAX - 9, 10),  # Last ids in range.
    ],
)
def test_response_round_trips_through_msgpack(response: AddEntriesResponse) -> None:
    """to_body -> msgpack -> decode_response gives the same response back."""
    body = response.to_body()
    assert body == [Op.ADD_ENTRIES, response.request_id, response.status, response.ledger_id,
                    response.entry_id, response.count]  # fmt: skip
    assert decode_response(_through_msgpack(body)) == response


def test_the_bookies_fixed_width_ok_answer_decodes_as_a_response() -> None:
    """The 43-byte frame the bookie packs with uint64 ids decodes like the shortest encoding."""
    frame = struct.pack(">IBBBQBBQBQBQ", 39, 0x96, 11, 0xCF, 5, 0, 0xCF, LEDGER, 0xCF, 20, 0xCF, 4)
    assert len(frame) == 43
    (body,) = FrameDecoder().feed(frame)
    assert body == [11, 5, 0, LEDGER, 20, 4]
    assert decode_response(body) == AddEntriesResponse(5, Status.OK, LEDGER, 20, 4)


def test_split_gives_one_add_entry_per_entry_with_consecutive_request_ids() -> None:
    """split(): entry i becomes an ADD_ENTRY with request id request_id + i and the head fields."""
    entries = tuple(_entry(i, bytes([i]) * (i + 1)) for i in range(4))
    request = AddEntriesRequest(50, LEDGER, Flag.RECOVERY_ADD, KEY, entries)
    adds = request.split()
    assert adds == [
        AddEntryRequest(
            50 + i, LEDGER, e.entry_id, Flag.RECOVERY_ADD, KEY, e.lac, e.length, e.digest, e.payload
        )
        for i, e in enumerate(entries)
    ]
    # Each add, sent alone, decodes to itself: split() is exactly the ADD_ENTRY requests.
    assert [decode_request(_through_msgpack(add.to_body())) for add in adds] == adds


def test_error_response_covers_every_entry() -> None:
    """error_response(status): one answer for all entries, from the first request and entry id."""
    request = AddEntriesRequest(50, LEDGER, Flag.NONE, KEY, tuple(_entry(i + 3) for i in range(6)))
    response = request.error_response(Status.BAD_REQUEST)
    assert response == AddEntriesResponse(50, Status.BAD_REQUEST, LEDGER, 3, 6)


def _with(body: list[Any], index: int, value: Any) -> list[Any]:
    changed = list(body)
    changed[index] = value
    return changed


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (_entries_body(1, 0), r"ADD_ENTRIES has 5 fields, expected 5 \+ 5 per entry, at least one"),
        (_entries_body(1, 2)[:-1], r"ADD_ENTRIES has 14 fields, expected 5 \+ 5 per entry"),
        ([*_entries_body(1, 1), 3], r"ADD_ENTRIES has 11 fields"),
        ([11, 1], r"ADD_ENTRIES has 2 fields"),
        (_with(_entries_body(1, 2), 1, True), r"field 1 \(request_id\) must be int, got bool"),
        (_with(_entries_body(1, 2), 1, -1), r"field 1 \(request_id\) must be in \[0, "),
        (_with(_entries_body(1, 2), 2, "7"), r"field 2 \(ledger_id\) must be int, got str"),
        (_with(_entries_body(1, 2), 2, I64_MAX + 1), r"field 2 \(ledger_id\) must be in"),
        (_with(_entries_body(1, 2), 3, 8), r"field 3 \(flags\) must be a combination of Flag"),
        (_with(_entries_body(1, 2), 4, None), r"field 4 \(master_key\) must be bytes, got nil"),
        (
            _entries_body(U64_MAX - 1, 3),
            r"ADD_ENTRIES of 3 entries from request id \d+: the last request id would exceed",
        ),
        (_with(_entries_body(1, 2), 5, -1), r"ADD_ENTRIES entry item 0 field 0 \(entry_id\)"),
        (_with(_entries_body(1, 2), 11, -2), r"ADD_ENTRIES entry item 1 field 1 \(lac\) must be"),
        (_with(_entries_body(1, 2), 12, 1.5), r"entry item 1 field 2 \(length\) must be int"),
        (_with(_entries_body(1, 2), 13, 2**32), r"entry item 1 field 3 \(digest\) must be in"),
        (_with(_entries_body(1, 3), 19, "p"), r"entry item 2 field 4 \(payload\) must be bytes"),
    ],
    ids=[
        "no-entry",
        "partial-entry",
        "one-extra-field",
        "no-head",
        "request-id-bool",
        "request-id-negative",
        "ledger-id-str",
        "ledger-id-range",
        "flags-unknown",
        "master-key-nil",
        "request-id-overflow",
        "entry-id-negative",
        "lac-below-minus-one",
        "length-float",
        "digest-above-u32",
        "payload-str",
    ],
)
def test_malformed_requests_name_the_problem(body: list[Any], match: str) -> None:
    """Every malformed ADD_ENTRIES body is a ProtocolError naming the field and the problem."""
    with pytest.raises(ProtocolError, match=match):
        decode_request(body)


def test_the_last_request_id_may_be_exactly_u64_max() -> None:
    """The overflow check is exact: ids up to 2**64 - 1 are fine."""
    request = decode_request(_entries_body(U64_MAX - 2, 3))
    assert isinstance(request, AddEntriesRequest)
    assert [add.request_id for add in request.split()] == [U64_MAX - 2, U64_MAX - 1, U64_MAX]


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ([11, 1, 0, LEDGER, 0, 0], r"ADD_ENTRIES response field 5 \(count\) must be at least 1"),
        ([11, 1, 0, LEDGER, 0, -1], r"ADD_ENTRIES response field 5 \(count\) must be in"),
        ([11, 1, 0, LEDGER, 0, True], r"field 5 \(count\) must be int, got bool"),
        ([11, 1, 0, LEDGER, 0], r"ADD_ENTRIES response has 5 fields, expected 6"),
        ([11, 1, 0, LEDGER, 0, 1, 1], r"ADD_ENTRIES response has 7 fields, expected 6"),
        ([11, 1, 99, LEDGER, 0, 1], r"field 2 \(status\) is not a known Status"),
        ([11, U64_MAX, 0, LEDGER, 0, 2], r"the last ids would be out of range"),
        ([11, 1, 0, LEDGER, I64_MAX, 2], r"the last ids would be out of range"),
        ([11, 1, 0, LEDGER, -1, 2], r"field 4 \(entry_id\) must be in"),
    ],
    ids=[
        "count-zero",
        "count-negative",
        "count-bool",
        "no-count",
        "extra-field",
        "unknown-status",
        "request-id-overflow",
        "entry-id-overflow",
        "entry-id-negative",
    ],
)
def test_malformed_responses_name_the_problem(body: list[Any], match: str) -> None:
    """Every malformed ADD_ENTRIES answer is a ProtocolError naming the problem."""
    with pytest.raises(ProtocolError, match=match):
        decode_response(body)


# --- Encoder: add_to_entries --------------------------------------------------------------------


def _add(encoder: FrameEncoder, request_id: int, entry: WireEntry, **change: Any) -> None:
    head = {"ledger_id": LEDGER, "flags": 0, "master_key": KEY, **change}
    encoder.add_to_entries(
        request_id, head["ledger_id"], head["flags"], head["master_key"], _packed(entry)
    )


def test_consecutive_adds_of_one_ledger_join_one_frame() -> None:
    """Same ledger, flags and key, request ids following: one ADD_ENTRIES frame."""
    encoder = FrameEncoder()
    entries = [_entry(i) for i in range(5)]
    for index, entry in enumerate(entries):
        _add(encoder, 10 + index, entry)
    assert encoder.pending_frames == 1
    assert _decoded(encoder.take()) == [
        AddEntriesRequest(10, LEDGER, Flag.NONE, KEY, tuple(entries))
    ]
    assert encoder.pending_frames == 0 and encoder.take() == b""


@pytest.mark.parametrize(
    ("change", "request_id"),
    [
        ({"ledger_id": LEDGER + 1}, 11),
        ({}, 12),  # A gap in the request ids.
        ({}, 10),  # The same request id again.
        ({"master_key": OTHER_KEY}, 11),
        ({"flags": int(Flag.RECOVERY_ADD)}, 11),
    ],
    ids=["other-ledger", "id-gap", "id-repeated", "other-key", "other-flags"],
)
def test_an_add_that_does_not_continue_the_frame_opens_the_next(
    change: dict[str, Any], request_id: int
) -> None:
    """Another ledger, key or flags, or a request id not following: a new frame, order kept."""
    encoder = FrameEncoder()
    _add(encoder, 10, _entry(0))
    _add(encoder, request_id, _entry(1), **change)
    _add(encoder, request_id + 1, _entry(2), **change)  # Joins the second frame.
    assert encoder.pending_frames == 2
    head = {"ledger_id": LEDGER, "flags": 0, "master_key": KEY, **change}
    assert _decoded(encoder.take()) == [
        AddEntriesRequest(10, LEDGER, Flag.NONE, KEY, (_entry(0),)),
        AddEntriesRequest(
            request_id,
            head["ledger_id"],
            Flag(head["flags"]),
            head["master_key"],
            (_entry(1), _entry(2)),
        ),
    ]


def _entry_of_packed_size(entry_id: int, size: int) -> WireEntry:
    """An entry whose packed fields are exactly `size` bytes (payload 256..65535 bytes)."""
    overhead = len(_packed(_entry(entry_id, b"x" * 300))) - 300
    entry = _entry(entry_id, b"x" * (size - overhead))
    assert len(_packed(entry)) == size, (size, overhead)
    return entry


def test_a_frame_takes_entries_up_to_exactly_the_batch_bytes() -> None:
    """Entry bytes may reach ADD_ENTRIES_BATCH_BYTES; one byte more starts the next frame."""
    half = ADD_ENTRIES_BATCH_BYTES // 2
    encoder = FrameEncoder()
    first, second = _entry_of_packed_size(0, half), _entry_of_packed_size(1, half)
    third = _entry_of_packed_size(2, 1000)
    _add(encoder, 1, first)
    _add(encoder, 2, second)  # Exactly 64 KiB of entries: joins.
    _add(encoder, 3, third)  # One more entry: the next frame.
    assert _decoded(encoder.take()) == [
        AddEntriesRequest(1, LEDGER, Flag.NONE, KEY, (first, second)),
        AddEntriesRequest(3, LEDGER, Flag.NONE, KEY, (third,)),
    ]
    encoder = FrameEncoder()
    _add(encoder, 1, first)
    _add(encoder, 2, _entry_of_packed_size(1, half + 1))  # One byte over: a frame of its own.
    assert encoder.pending_frames == 2


def test_frames_stop_at_64_kib_and_a_larger_entry_travels_alone() -> None:
    """20 KiB entries: three per frame; a 100 KiB entry alone; the entry after it starts anew."""
    sizes = [20 * 1024] * 4 + [100 * 1024] + [1024] * 2
    entries = [_entry(i, b"e" * size) for i, size in enumerate(sizes)]
    encoder = FrameEncoder()
    for index, entry in enumerate(entries):
        _add(encoder, 100 + index, entry)
    decoded = _decoded(encoder.take())
    assert [(m.request_id, len(m.entries)) for m in decoded] == [
        (100, 3),
        (103, 1),
        (104, 1),  # The 100 KiB entry.
        (105, 2),
    ]
    assert [e for message in decoded for e in message.entries] == entries
    for message in decoded:
        packed = sum(len(_packed(e)) for e in message.entries)
        assert packed <= ADD_ENTRIES_BATCH_BYTES or len(message.entries) == 1


def test_another_frame_closes_the_open_one_so_order_is_kept() -> None:
    """A READ (or a prepacked ADD_ENTRY) between adds closes the open ADD_ENTRIES frame, even
    when the request ids would continue: the bookie sees the frames in the order added."""
    encoder = FrameEncoder()
    read = ReadEntryRequest(3, LEDGER, 0, Flag.NONE, None)
    add_fields = [LEDGER, 9, 0, KEY, 8, 90, 1, b"single"]
    _add(encoder, 1, _entry(0))
    _add(encoder, 2, _entry(1))
    encoder.add(read)
    _add(encoder, 3, _entry(2))  # Follows request id 2, but the READ came in between.
    encoder.add_prepacked(int(Op.ADD_ENTRY), 4, 8, encoder.pack_fields(add_fields))
    _add(encoder, 5, _entry(3))
    _add(encoder, 6, _entry(4))
    assert encoder.pending_frames == 5
    assert _decoded(encoder.take()) == [
        AddEntriesRequest(1, LEDGER, Flag.NONE, KEY, (_entry(0), _entry(1))),
        read,
        AddEntriesRequest(3, LEDGER, Flag.NONE, KEY, (_entry(2),)),
        AddEntryRequest(4, LEDGER, 9, Flag.NONE, KEY, 8, 90, 1, b"single"),
        AddEntriesRequest(5, LEDGER, Flag.NONE, KEY, (_entry(3), _entry(4))),
    ]


def test_take_parts_joins_to_the_same_bytes_as_take() -> None:
    """take_parts() closes the open frame too; its buffers concatenate to take()'s batch."""
    batches = []
    for use_parts in (False, True):
        encoder = FrameEncoder()
        encoder.add(ReadEntryRequest(1, LEDGER, 0, Flag.NONE, None))
        for index in range(3):
            _add(encoder, 2 + index, _entry(index))
        batches.append(b"".join(encoder.take_parts()) if use_parts else encoder.take())
        assert encoder.pending_frames == 0 and len(encoder) == 0
    assert batches[0] == batches[1]
    assert len(_decoded(batches[0])) == 2


@pytest.mark.parametrize("first_id", [0, 2**32 - 2, 2**40, U64_MAX - 1])
def test_request_ids_of_every_width_frame_correctly(first_id: int) -> None:
    """The frame head writes the request id as a uint64: any id decodes back the same."""
    encoder = FrameEncoder()
    _add(encoder, first_id, _entry(0))
    _add(encoder, first_id + 1, _entry(1))
    (message,) = _decoded(encoder.take())
    assert [add.request_id for add in message.split()] == [first_id, first_id + 1]


def test_an_entry_above_max_frame_bytes_is_refused_and_adds_nothing() -> None:
    """An oversized entry that would start a frame: ProtocolError, and the batch holds only the
    frames added before it."""
    encoder = FrameEncoder(max_frame_bytes=4096)
    with pytest.raises(ProtocolError, match="exceeds max_frame_bytes=4096"):
        _add(encoder, 1, _entry(0, b"x" * 8000))
    assert encoder.pending_frames == 0 and encoder.take() == b""
    _add(encoder, 1, _entry(0))
    _add(encoder, 2, _entry(1))
    with pytest.raises(ProtocolError, match="exceeds max_frame_bytes=4096"):
        _add(encoder, 7, _entry(2, b"x" * 8000))  # Not following id 2: it would open a frame.
    assert encoder.pending_frames == 1
    _add(encoder, 8, _entry(3))
    assert _decoded(encoder.take(), 4096) == [
        AddEntriesRequest(1, LEDGER, Flag.NONE, KEY, (_entry(0), _entry(1))),
        AddEntriesRequest(8, LEDGER, Flag.NONE, KEY, (_entry(3),)),
    ]


def test_an_entry_above_max_frame_bytes_is_refused_even_when_it_would_join() -> None:
    """The documented refusal holds for an oversized entry that continues the open frame."""
    encoder = FrameEncoder(max_frame_bytes=4096)
    _add(encoder, 1, _entry(0))
    with pytest.raises(ProtocolError, match="exceeds max_frame_bytes=4096"):
        _add(encoder, 2, _entry(1, b"x" * 8000))  # Follows id 1: the join branch.


def test_joined_adds_never_make_a_frame_above_max_frame_bytes() -> None:
    """With max_frame_bytes below 64 KiB, joining must not build a frame the peer refuses."""
    encoder = FrameEncoder(max_frame_bytes=1000)
    for index in range(5):
        with contextlib.suppress(ProtocolError):  # Refusing is fine; an oversized frame is not.
            _add(encoder, 10 + index, _entry(index, b"x" * 400))
    _decoded(encoder.take(), 1000)  # Raises ProtocolError for a frame above 1000 bytes.


# --- Encoder: add_entries_frame -----------------------------------------------------------------


def test_add_entries_frame_appends_one_whole_frame_after_the_open_one() -> None:
    """A whole frame decodes to its adds; an open add_to_entries frame is closed before it."""
    encoder = FrameEncoder()
    _add(encoder, 1, _entry(0))
    entries = [_entry(i) for i in range(1, 4)]
    packed = [_packed(e) for e in entries]
    encoder.add_entries_frame(2, LEDGER, 0, KEY, packed, sum(map(len, packed)))
    _add(encoder, 5, _entry(4))  # Follows the whole frame's ids: a frame of its own still.
    encoder.add_entries_frame(6, LEDGER + 1, int(Flag.RECOVERY_ADD), OTHER_KEY, packed[:1],
                              len(packed[0]))  # fmt: skip
    assert encoder.pending_frames == 4
    assert _decoded(encoder.take()) == [
        AddEntriesRequest(1, LEDGER, Flag.NONE, KEY, (_entry(0),)),
        AddEntriesRequest(2, LEDGER, Flag.NONE, KEY, tuple(entries)),
        AddEntriesRequest(5, LEDGER, Flag.NONE, KEY, (_entry(4),)),
        AddEntriesRequest(6, LEDGER + 1, Flag.RECOVERY_ADD, OTHER_KEY, (entries[0],)),
    ]


def test_add_entries_frame_above_max_frame_bytes_is_refused_and_adds_nothing() -> None:
    """ProtocolError naming the limit; the batch holds only what was added before."""
    encoder = FrameEncoder(max_frame_bytes=4096)
    encoder.add(ReadEntryRequest(1, LEDGER, 0, Flag.NONE, None))
    before = encoder.pending_frames
    packed = [_packed(_entry(i, b"y" * 1500)) for i in range(3)]
    with pytest.raises(ProtocolError, match=r"\(op 11\) exceeds max_frame_bytes=4096"):
        encoder.add_entries_frame(2, LEDGER, 0, KEY, packed, sum(map(len, packed)))
    assert encoder.pending_frames == before
    assert _decoded(encoder.take(), 4096) == [ReadEntryRequest(1, LEDGER, 0, Flag.NONE, None)]


# --- add_batching._frames_of --------------------------------------------------------------------


def _check_frames(packed: list[bytes], frames: list[tuple[int, int, list[bytes], int]]) -> None:
    """Frames cover `packed` in order, each with its right slice and byte total."""
    assert frames[0][0] == 0 and frames[-1][1] == len(packed)
    for (_, end, _, _), (start, _, _, _) in itertools.pairwise(frames):
        assert end == start
    for start, end, entries, total in frames:
        assert start < end
        assert entries == packed[start:end]
        assert total == sum(map(len, entries))
        assert total <= ADD_ENTRIES_BATCH_BYTES or end - start == 1


def test_frames_of_a_small_batch_is_one_frame() -> None:
    """Up to 64 KiB in total: one frame with every entry."""
    packed = [b"a" * 1000] * 65
    assert _frames_of(packed) == [(0, 65, packed, 65_000)]


def test_frames_of_cuts_at_the_batch_bytes() -> None:
    """Frames of at most 64 KiB; indexes and totals consistent; exactly 64 KiB still fits."""
    packed = [b"a" * 16 * 1024] * 9  # Four per frame, exactly 64 KiB each.
    frames = _frames_of(packed)
    assert [(start, end, total) for start, end, _, total in frames] == [
        (0, 4, 65_536),
        (4, 8, 65_536),
        (8, 9, 16_384),
    ]
    _check_frames(packed, frames)


def test_frames_of_puts_a_larger_entry_alone() -> None:
    """An entry above 64 KiB is a frame of its own, wherever it is in the batch."""
    sizes = [30_000, 30_000, 100_000, 10, 70_000, 20, 30]
    packed = [bytes([index]) * size for index, size in enumerate(sizes)]
    frames = _frames_of(packed)
    assert [(start, end, total) for start, end, _, total in frames] == [
        (0, 2, 60_000),
        (2, 3, 100_000),
        (3, 4, 10),
        (4, 5, 70_000),
        (5, 7, 50),
    ]
    _check_frames(packed, frames)


def test_frames_of_a_lone_large_entry() -> None:
    """One entry above 64 KiB: one frame."""
    packed = [b"z" * 200_000]
    assert _frames_of(packed) == [(0, 1, packed, 200_000)]


def test_response_classes_have_their_op() -> None:
    """Both message classes carry op 11; ADD_ENTRY keeps op 2."""
    assert AddEntriesRequest.op is Op.ADD_ENTRIES is AddEntriesResponse.op
    assert int(Op.ADD_ENTRIES) == 11
    assert AddEntryResponse.op is Op.ADD_ENTRY
