"""`python -m bkaio.protocol.selfcheck`: exercise the whole codec once and print a short summary.

Encodes one sample of every request and response (error statuses and nil fields included),
feeds the frames through a FrameDecoder whole and byte by byte, decodes them back, checks that
each comes back equal, and checks entry digests and master keys. Exit status 0 on success.
The samples are also what the unit tests round-trip.
"""

from __future__ import annotations

import sys
from typing import Any

from bkaio import errors
from bkaio.protocol.digest import check_entry_digest, entry_digest, master_key, verify_entry_digest
from bkaio.protocol.encoder import FrameEncoder
from bkaio.protocol.frames import FrameDecoder
from bkaio.protocol.messages import (
    PROTOCOL_VERSION,
    AddEntriesRequest,
    AddEntriesResponse,
    AddEntryRequest,
    AddEntryResponse,
    ErrorResponse,
    Flag,
    ForceRequest,
    ForceResponse,
    GetBookieInfoRequest,
    GetBookieInfoResponse,
    HelloRequest,
    HelloResponse,
    ListEntriesRequest,
    ListEntriesResponse,
    PingRequest,
    PingResponse,
    ReadEntriesRequest,
    ReadEntriesResponse,
    ReadEntryRequest,
    ReadEntryResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRangeRequest,
    ReadRangeResponse,
    Request,
    Response,
    WireEntry,
    WriteLacRequest,
    WriteLacResponse,
    decode_request,
    decode_response,
)
from bkaio.protocol.records import pack_record
from bkaio.protocol.status import Status

_LEDGER_ID = 42
_KEY = master_key(b"selfcheck", _LEDGER_ID)


def _entry(entry_id: int, payload: bytes) -> WireEntry:
    lac = entry_id - 1
    length = (entry_id + 1) * len(payload)
    digest = entry_digest(_LEDGER_ID, entry_id, lac, length, payload)
    return WireEntry(entry_id, lac, length, digest, payload)


def sample_requests() -> list[Request]:
    """One or more requests of every operation, with flags and nil fields."""
    entry = _entry(0, b"hello bookie")
    return [
        HelloRequest(1, PROTOCOL_VERSION, "selfcheck-client", None),
        HelloRequest(2, PROTOCOL_VERSION, "client-\u00e9", "token"),
        AddEntryRequest(
            3, _LEDGER_ID, 0, Flag.NONE, _KEY, -1, entry.length, entry.digest, entry.payload
        ),
        AddEntryRequest(4, _LEDGER_ID, 0, Flag.RECOVERY_ADD, _KEY, -1, 0, 0, b""),
        ReadEntryRequest(5, _LEDGER_ID, 0, Flag.NONE, None),
        ReadEntryRequest(6, _LEDGER_ID, -1, Flag.FENCE, _KEY),
        ReadRangeRequest(7, _LEDGER_ID, 0, 100, 1 << 20, Flag.NONE, None),
        ReadLacRequest(8, _LEDGER_ID, Flag.LONG_POLL, None, 5, 1000),
        ReadLacRequest(9, _LEDGER_ID, Flag.FENCE, _KEY, -1, 0),
        WriteLacRequest(10, _LEDGER_ID, _KEY, 7),
        ForceRequest(11, _LEDGER_ID),
        GetBookieInfoRequest(12),
        ListEntriesRequest(13, _LEDGER_ID),
        PingRequest(2**64 - 1),
        AddEntriesRequest(
            20, _LEDGER_ID, Flag.NONE, _KEY, tuple(_entry(i, b"batched %d" % i) for i in range(3))
        ),
        AddEntriesRequest(30, _LEDGER_ID, Flag.RECOVERY_ADD, _KEY, (_entry(5, b""),)),
        ReadEntriesRequest(40, _LEDGER_ID, 0, 999, 1, 512, 1 << 20, Flag.NONE, -1, 0),
        ReadEntriesRequest(41, _LEDGER_ID, 3, 2**63 - 1, 5, 64, 1 << 16, Flag.LONG_POLL, 2, 900),
    ]


def sample_responses() -> list[Response]:
    """One or more responses of every operation, OK and error statuses, nil and empty fields."""
    entries = tuple(_entry(entry_id, b"e%d" % entry_id) for entry_id in range(3))
    return [
        HelloResponse(1, Status.OK, PROTOCOL_VERSION, "bookie-1:3181", 0, 2, ("read_range",)),
        HelloResponse(2, Status.UNSUPPORTED_VERSION, PROTOCOL_VERSION, "", 0, 0, ()),
        AddEntryResponse(3, Status.OK, _LEDGER_ID, 0),
        AddEntryResponse(4, Status.FENCED, _LEDGER_ID, 0),
        ReadEntryResponse(5, Status.OK, _LEDGER_ID, 1, 1, entries[1]),
        ReadEntryResponse(6, Status.NO_SUCH_ENTRY, _LEDGER_ID, -1, -1, None),
        ReadRangeResponse(7, Status.OK, _LEDGER_ID, 2, entries),
        ReadRangeResponse(8, Status.NO_SUCH_LEDGER, _LEDGER_ID, -1, ()),
        ReadLacResponse(9, Status.OK, _LEDGER_ID, 5, 6),
        ReadLacResponse(10, Status.UNAUTHORIZED, _LEDGER_ID, -1, -1),
        WriteLacResponse(11, Status.OK, _LEDGER_ID),
        ForceResponse(12, Status.IO_ERROR, _LEDGER_ID),
        GetBookieInfoResponse(13, Status.OK, 10 << 30, 4 << 30, 1, 2, False),
        GetBookieInfoResponse(14, Status.READ_ONLY, 0, 0, 0, 0, True),
        ListEntriesResponse(15, Status.OK, _LEDGER_ID, ((0, 4), (7, 7), (9, 12))),
        ListEntriesResponse(16, Status.WRONG_SHARD, _LEDGER_ID, ()),
        PingResponse(17, Status.OK),
        PingResponse(18, Status.TOO_MANY_REQUESTS),
        ErrorResponse(0, Status.BAD_REQUEST, "frame body must be a msgpack array, got int"),
        AddEntriesResponse(20, Status.OK, _LEDGER_ID, 0, 3),
        AddEntriesResponse(30, Status.READ_ONLY, _LEDGER_ID, 5, 1),
        ReadEntriesResponse(40, Status.OK, _LEDGER_ID, 2, 3, (_records(entries),)),
        ReadEntriesResponse(41, Status.OK, _LEDGER_ID, -1, 9, (b"",)),
        ReadEntriesResponse(42, Status.NO_SUCH_LEDGER, _LEDGER_ID, -1, 0, (b"",)),
    ]


def _records(entries: tuple[WireEntry, ...]) -> bytes:
    parts: list[bytes] = []
    for e in entries:
        parts += pack_record(_LEDGER_ID, e.entry_id, e.lac, e.length, e.digest, e.payload)
    return b"".join(parts)


def _check_stream(messages: list[Any], decode: Any, chunk_bytes: int | None) -> None:
    encoder = FrameEncoder()
    for message in messages:
        encoder.add(message)
    wire = encoder.take()
    decoder = FrameDecoder()
    if chunk_bytes is None:
        bodies = decoder.feed(wire)
    else:
        bodies = []
        for start in range(0, len(wire), chunk_bytes):
            bodies.extend(decoder.feed(wire[start : start + chunk_bytes]))
    decoded = [decode(body) for body in bodies]
    if decoded != messages:
        raise AssertionError(f"round trip changed the messages (chunks of {chunk_bytes})")
    if decoder.buffered_bytes:
        raise AssertionError(f"{decoder.buffered_bytes} bytes left in the decoder")


def _check_digests() -> int:
    payload = b"some entry payload"
    digest = entry_digest(_LEDGER_ID, 3, 2, 100, payload)
    check_entry_digest(_LEDGER_ID, 3, 2, 100, payload, digest)
    flipped = bytes([payload[0] ^ 1]) + payload[1:]
    if verify_entry_digest(_LEDGER_ID, 3, 2, 100, flipped, digest):
        raise AssertionError("a flipped payload bit went unnoticed")
    try:
        check_entry_digest(_LEDGER_ID, 4, 2, 100, payload, digest)
    except errors.BadDigestError:
        pass
    else:
        raise AssertionError("a wrong entry id went unnoticed")
    if len(_KEY) != 32 or master_key(b"other", _LEDGER_ID) == _KEY:
        raise AssertionError("master keys are not 32 distinct bytes")
    return digest


def main() -> int:
    requests = sample_requests()
    responses = sample_responses()
    for messages, decode in ((requests, decode_request), (responses, decode_response)):
        _check_stream(messages, decode, None)
        _check_stream(messages, decode, 1)
        _check_stream(messages, decode, 7)
    digest = _check_digests()
    request_ops = sorted({request.op.name for request in requests})
    response_ops = sorted({response.op.name for response in responses})
    print(f"bkaio wire protocol v{PROTOCOL_VERSION} self-check: OK")
    print(f"  {len(requests)} requests ({len(request_ops)} ops): {', '.join(request_ops)}")
    print(f"  {len(responses)} responses ({len(response_ops)} ops): {', '.join(response_ops)}")
    print("  round trip through FrameEncoder/FrameDecoder: whole, byte by byte, 7-byte chunks")
    print(f"  entry digest (CRC32C) {digest:#010x}; flipped bit and wrong entry id detected")
    print(f"  master key: {len(_KEY)} bytes, distinct per password")
    return 0


if __name__ == "__main__":
    sys.exit(main())
