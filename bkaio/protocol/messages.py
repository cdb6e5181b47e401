"""Decoding of the wire protocol v1 (docs/protocol.md, "Operations"): bodies back into messages.

    request   [op, request_id, *fields]
    response  [op, request_id, status, *fields]

The messages are one frozen dataclass per request and per response (`message_types`, with
`to_body()` for the msgpack array), the codes in `codes`; this module re-exports both, where the
codec's users find them. `decode_request` / `decode_response` turn a decoded array back into a
message through explicit tables keyed by `Op`. Decoding checks the field count and every field's
type and range (`fields`: ints are ints and never bools, ids fit their width, flags fit `Flag`),
so a malformed body raises `ProtocolError` naming the operation, the field and the problem, and
nothing else escapes.

Pure Python: imports only bkaio.errors, the Status enum and the codec's own modules; no
msgpack, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any, NoReturn

from bkaio import errors  # Module reference: see the import note in frames.py.
from bkaio.protocol.codes import (
    _STATUSES,
    FLAG_MASK,
    I64_MAX,
    PROTOCOL_VERSION,
    READ_ENTRIES_FEATURE,
    U32_MAX,
    U64_MAX,
    Flag,
    Op,
)
from bkaio.protocol.fields import (
    _RANGE_ENTRY_CHECKS,
    _RANGE_ENTRY_NAMES,
    Check,
    _check_bool,
    _check_bytes,
    _check_bytes_or_nil,
    _check_count,
    _check_digest,
    _check_entries,
    _check_entry_id,
    _check_entry_id_or_last,
    _check_entry_or_nil,
    _check_flags,
    _check_items,
    _check_lac,
    _check_ledger_id,
    _check_ranges,
    _check_request_id,
    _check_status,
    _check_str,
    _check_str_list,
    _check_str_or_nil,
    _check_u32,
    _FieldError,
    _int_between,
    _int_text,
    _type_name,
)
from bkaio.protocol.message_types import (
    AddEntriesRequest,
    AddEntriesResponse,
    AddEntryRequest,
    AddEntryResponse,
    ErrorResponse,
    ForceRequest,
    ForceResponse,
    GetBookieInfoRequest,
    GetBookieInfoResponse,
    HelloRequest,
    HelloResponse,
    ListEntriesRequest,
    ListEntriesResponse,
    Message,
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
)
from bkaio.status import Status

# The messages and codes are defined in `message_types` and `codes`; this module is where the
# codec's users have always found them, with the decoding.
__all__ = [
    "ADD_ENTRIES_ENTRY_FIELDS",
    "ADD_ENTRIES_HEAD_FIELDS",
    "FLAG_MASK",
    "I64_MAX",
    "PROTOCOL_VERSION",
    "READ_ENTRIES_FEATURE",
    "U32_MAX",
    "U64_MAX",
    "AddEntriesRequest",
    "AddEntriesResponse",
    "AddEntryRequest",
    "AddEntryResponse",
    "ErrorResponse",
    "Flag",
    "ForceRequest",
    "ForceResponse",
    "GetBookieInfoRequest",
    "GetBookieInfoResponse",
    "HelloRequest",
    "HelloResponse",
    "ListEntriesRequest",
    "ListEntriesResponse",
    "Message",
    "Op",
    "PingRequest",
    "PingResponse",
    "ReadEntriesRequest",
    "ReadEntriesResponse",
    "ReadEntryRequest",
    "ReadEntryResponse",
    "ReadLacRequest",
    "ReadLacResponse",
    "ReadRangeRequest",
    "ReadRangeResponse",
    "Request",
    "Response",
    "Status",
    "WireEntry",
    "WriteLacRequest",
    "WriteLacResponse",
    "decode_request",
    "decode_response",
    "request_id_of",
]

# --- Decoding tables ----------------------------------------------------------------------------

Decoder = Callable[[list[Any]], Any]
Field = tuple[str, Check]


def _table_decoder(label: str, checks: Sequence[Field], build: Callable[..., Any]) -> Decoder:
    """A decoder for body [op, *fields]: count, then each check in order, then `build(*values)`."""
    expected = 1 + len(checks)
    shape = ", ".join(["op", *(name for name, _ in checks)])

    def decode(body: list[Any]) -> Any:
        if len(body) != expected:
            raise errors.ProtocolError(
                f"{label} has {len(body)} fields, expected {expected}: [{shape}]"
            )
        values = []
        for index, (name, check) in enumerate(checks, start=1):
            try:
                values.append(check(body[index]))
            except _FieldError as error:
                raise errors.ProtocolError(f"{label} field {index} ({name}) {error}") from None
        return build(*values)

    return decode


def _raise(message: str) -> NoReturn:
    raise errors.ProtocolError(message)


_REQUEST_ID: Field = ("request_id", _check_request_id)
_STATUS: Field = ("status", _check_status)
_LEDGER_ID: Field = ("ledger_id", _check_ledger_id)


def _read_entry_response(
    request_id: int,
    status: Status,
    ledger_id: int,
    entry_id: int,
    lac: int,
    entry: tuple[int, int, int, bytes] | None,
) -> ReadEntryResponse:
    wire_entry = None if entry is None else WireEntry(entry_id, *entry)
    return ReadEntryResponse(request_id, status, ledger_id, entry_id, lac, wire_entry)


_ADD_ENTRY_REQUEST_FIELDS: tuple[Field, ...] = (
    _REQUEST_ID,
    _LEDGER_ID,
    ("entry_id", _check_entry_id),
    ("flags", _check_flags),
    ("master_key", _check_bytes),
    ("lac", _check_lac),
    ("length", _check_count),
    ("digest", _check_digest),
    ("payload", _check_bytes),
)
_ADD_ENTRY_RESPONSE_FIELDS: tuple[Field, ...] = (
    _REQUEST_ID,
    _STATUS,
    _LEDGER_ID,
    ("entry_id", _check_entry_id),
)

_ADD_ENTRIES_HEAD = ("op", "request_id", "ledger_id", "flags", "master_key")
_ADD_ENTRIES_HEAD_CHECKS: tuple[Field, ...] = (
    _REQUEST_ID,
    _LEDGER_ID,
    ("flags", _check_flags),
    ("master_key", _check_bytes),
)
# Each entry of an ADD_ENTRIES body is these five values, flat (no array per entry).
ADD_ENTRIES_ENTRY_FIELDS = len(_RANGE_ENTRY_NAMES)
ADD_ENTRIES_HEAD_FIELDS = len(_ADD_ENTRIES_HEAD)


def _decode_add_entries(body: list[Any]) -> AddEntriesRequest:
    """[op, request_id, ledger_id, flags, master_key, then per entry: entry_id, lac, length,
    digest, payload]; at least one entry, request ids of every entry within u64."""
    count, extra = divmod(len(body) - ADD_ENTRIES_HEAD_FIELDS, ADD_ENTRIES_ENTRY_FIELDS)
    if count < 1 or extra:
        raise errors.ProtocolError(
            f"ADD_ENTRIES has {len(body)} fields, expected {ADD_ENTRIES_HEAD_FIELDS} + "
            f"{ADD_ENTRIES_ENTRY_FIELDS} per entry, at least one entry: "
            f"[{', '.join(_ADD_ENTRIES_HEAD)}, then per entry {', '.join(_RANGE_ENTRY_NAMES)}]"
        )
    head = []
    for index, (name, check) in enumerate(_ADD_ENTRIES_HEAD_CHECKS, start=1):
        try:
            head.append(check(body[index]))
        except _FieldError as error:
            raise errors.ProtocolError(f"ADD_ENTRIES field {index} ({name}) {error}") from None
    request_id, ledger_id, flags, key = head
    if request_id + count - 1 > U64_MAX:
        raise errors.ProtocolError(
            f"ADD_ENTRIES of {count} entries from request id {request_id}: the last request "
            f"id would exceed {U64_MAX}"
        )
    entries = []
    for index in range(count):
        start = ADD_ENTRIES_HEAD_FIELDS + index * ADD_ENTRIES_ENTRY_FIELDS
        item = body[start : start + ADD_ENTRIES_ENTRY_FIELDS]
        try:
            values = _check_items(item, index, _RANGE_ENTRY_NAMES, _RANGE_ENTRY_CHECKS)
        except _FieldError as error:
            raise errors.ProtocolError(f"ADD_ENTRIES entry {error}") from None
        entries.append(WireEntry(*values))
    return AddEntriesRequest(request_id, ledger_id, flags, key, tuple(entries))


def _add_entries_response(
    request_id: int, status: Status, ledger_id: int, entry_id: int, count: int
) -> AddEntriesResponse:
    if count < 1:
        _raise(f"ADD_ENTRIES response field 5 (count) must be at least 1, got {count}")
    if request_id + count - 1 > U64_MAX or entry_id + count - 1 > I64_MAX:
        _raise(
            f"ADD_ENTRIES response of {count} answers from request id {request_id}, entry id "
            f"{entry_id}: the last ids would be out of range"
        )
    return AddEntriesResponse(request_id, status, ledger_id, entry_id, count)


_check_stride = _int_between(1, U32_MAX)


def _check_long_poll_flag(value: Any) -> Flag:
    flags = _check_flags(value)
    if flags & ~Flag.LONG_POLL:
        raise _FieldError(f"may only be LONG_POLL ({int(Flag.LONG_POLL)}) or 0, got {int(flags)}")
    return flags


def _read_entries_request(
    request_id: int,
    ledger_id: int,
    first_entry_id: int,
    last_entry_id: int,
    stride: int,
    max_count: int,
    max_bytes: int,
    flags: Flag,
    previous_lac: int,
    timeout_ms: int,
) -> ReadEntriesRequest:
    if last_entry_id < first_entry_id:
        _raise(
            f"READ_ENTRIES field 4 (last_entry_id) must be >= first_entry_id {first_entry_id}, "
            f"got {last_entry_id}"
        )
    return ReadEntriesRequest(
        request_id, ledger_id, first_entry_id, last_entry_id, stride, max_count, max_bytes,
        flags, previous_lac, timeout_ms,
    )  # fmt: skip


def _read_entries_response(
    request_id: int, status: Status, ledger_id: int, lac: int, next_entry_id: int, records: bytes
) -> ReadEntriesResponse:
    return ReadEntriesResponse(request_id, status, ledger_id, lac, next_entry_id, (records,))


_REQUEST_TABLE: dict[int, Decoder] = {
    Op.HELLO: _table_decoder(
        "HELLO",
        (
            _REQUEST_ID,
            ("protocol_version", _check_u32),
            ("client_id", _check_str),
            ("auth_token", _check_str_or_nil),
        ),
        HelloRequest,
    ),
    Op.ADD_ENTRY: _table_decoder("ADD_ENTRY", _ADD_ENTRY_REQUEST_FIELDS, AddEntryRequest),
    Op.ADD_ENTRIES: _decode_add_entries,
    Op.READ_ENTRY: _table_decoder(
        "READ_ENTRY",
        (
            _REQUEST_ID,
            _LEDGER_ID,
            ("entry_id", _check_entry_id_or_last),
            ("flags", _check_flags),
            ("master_key", _check_bytes_or_nil),
        ),
        ReadEntryRequest,
    ),
    Op.READ_RANGE: _table_decoder(
        "READ_RANGE",
        (
            _REQUEST_ID,
            _LEDGER_ID,
            ("first_entry_id", _check_entry_id),
            ("max_count", _check_count),
            ("max_bytes", _check_count),
            ("flags", _check_flags),
            ("master_key", _check_bytes_or_nil),
        ),
        ReadRangeRequest,
    ),
    Op.READ_ENTRIES: _table_decoder(
        "READ_ENTRIES",
        (
            _REQUEST_ID,
            _LEDGER_ID,
            ("first_entry_id", _check_entry_id),
            ("last_entry_id", _check_entry_id),
            ("stride", _check_stride),
            ("max_count", _check_count),
            ("max_bytes", _check_count),
            ("flags", _check_long_poll_flag),
            ("previous_lac", _check_lac),
            ("timeout_ms", _check_u32),
        ),
        _read_entries_request,
    ),
    Op.READ_LAC: _table_decoder(
        "READ_LAC",
        (
            _REQUEST_ID,
            _LEDGER_ID,
            ("flags", _check_flags),
            ("master_key", _check_bytes_or_nil),
            ("previous_lac", _check_lac),
            ("timeout_ms", _check_u32),
        ),
        ReadLacRequest,
    ),
    Op.WRITE_LAC: _table_decoder(
        "WRITE_LAC",
        (_REQUEST_ID, _LEDGER_ID, ("master_key", _check_bytes), ("lac", _check_lac)),
        WriteLacRequest,
    ),
    Op.FORCE: _table_decoder("FORCE", (_REQUEST_ID, _LEDGER_ID), ForceRequest),
    Op.GET_BOOKIE_INFO: _table_decoder("GET_BOOKIE_INFO", (_REQUEST_ID,), GetBookieInfoRequest),
    Op.LIST_ENTRIES: _table_decoder("LIST_ENTRIES", (_REQUEST_ID, _LEDGER_ID), ListEntriesRequest),
    Op.PING: _table_decoder("PING", (_REQUEST_ID,), PingRequest),
}

_RESPONSE_TABLE: dict[int, Decoder] = {
    Op.ERROR: _table_decoder(
        "ERROR response", (_REQUEST_ID, _STATUS, ("message", _check_str)), ErrorResponse
    ),
    Op.HELLO: _table_decoder(
        "HELLO response",
        (
            _REQUEST_ID,
            _STATUS,
            ("protocol_version", _check_u32),
            ("bookie_id", _check_str),
            ("shard_index", _check_u32),
            ("shard_count", _check_u32),
            ("features", _check_str_list),
        ),
        HelloResponse,
    ),
    Op.ADD_ENTRY: _table_decoder(
        "ADD_ENTRY response", _ADD_ENTRY_RESPONSE_FIELDS, AddEntryResponse
    ),
    Op.ADD_ENTRIES: _table_decoder(
        "ADD_ENTRIES response",
        (*_ADD_ENTRY_RESPONSE_FIELDS, ("count", _check_count)),
        _add_entries_response,
    ),
    Op.READ_ENTRY: _table_decoder(
        "READ_ENTRY response",
        (
            _REQUEST_ID,
            _STATUS,
            _LEDGER_ID,
            ("entry_id", _check_entry_id_or_last),
            ("lac", _check_lac),
            ("entry", _check_entry_or_nil),
        ),
        _read_entry_response,
    ),
    Op.READ_RANGE: _table_decoder(
        "READ_RANGE response",
        (_REQUEST_ID, _STATUS, _LEDGER_ID, ("lac", _check_lac), ("entries", _check_entries)),
        ReadRangeResponse,
    ),
    Op.READ_ENTRIES: _table_decoder(
        "READ_ENTRIES response",
        (
            _REQUEST_ID,
            _STATUS,
            _LEDGER_ID,
            ("lac", _check_lac),
            ("next_entry_id", _check_entry_id),
            ("records", _check_bytes),
        ),
        _read_entries_response,
    ),
    Op.READ_LAC: _table_decoder(
        "READ_LAC response",
        (
            _REQUEST_ID,
            _STATUS,
            _LEDGER_ID,
            ("lac", _check_lac),
            ("last_entry_id", _check_entry_id_or_last),
        ),
        ReadLacResponse,
    ),
    Op.WRITE_LAC: _table_decoder(
        "WRITE_LAC response", (_REQUEST_ID, _STATUS, _LEDGER_ID), WriteLacResponse
    ),
    Op.FORCE: _table_decoder("FORCE response", (_REQUEST_ID, _STATUS, _LEDGER_ID), ForceResponse),
    Op.GET_BOOKIE_INFO: _table_decoder(
        "GET_BOOKIE_INFO response",
        (
            _REQUEST_ID,
            _STATUS,
            ("total_bytes", _check_count),
            ("free_bytes", _check_count),
            ("shard_index", _check_u32),
            ("shard_count", _check_u32),
            ("read_only", _check_bool),
        ),
        GetBookieInfoResponse,
    ),
    Op.LIST_ENTRIES: _table_decoder(
        "LIST_ENTRIES response",
        (_REQUEST_ID, _STATUS, _LEDGER_ID, ("ranges", _check_ranges)),
        ListEntriesResponse,
    ),
    Op.PING: _table_decoder("PING response", (_REQUEST_ID, _STATUS), PingResponse),
}
assert set(_REQUEST_TABLE) == set(Op) - {Op.ERROR}, "every op but ERROR has a request decoder"
assert set(_RESPONSE_TABLE) == set(Op), "every op has a response decoder"


# --- Fast path ----------------------------------------------------------------------------------
# ADD_ENTRY answers are most of what a client decodes. This checks the same rules as the table
# with inline type tests and no per-field calls; anything it does not accept goes to the table
# decoder, which either accepts it too (it never should) or names the exact problem. (A bookie
# reads adds with `bkaio.protocol.adds.decode_adds`.)


def _slot_setters(cls: type, names: Sequence[str]) -> tuple[Callable[[Any, Any], None], ...]:
    """The slot descriptors' setters of `cls`, for building a checked message without __init__.

    A frozen dataclass's __init__ sets each field through object.__setattr__, which costs as
    much as decoding the whole body; the fast paths set the slots directly instead.
    """
    assert tuple(field.name for field in fields(cls)) == tuple(names), (cls, names)
    return tuple(cls.__dict__[name].__set__ for name in names)


def _make_fast_add_entry_response() -> Decoder:
    new = object.__new__
    cls = AddEntryResponse
    set_request_id, set_status, set_ledger_id, set_entry_id = _slot_setters(
        cls, [name for name, _ in _ADD_ENTRY_RESPONSE_FIELDS]
    )
    statuses = _STATUSES
    status_count = len(_STATUSES)
    slow = _RESPONSE_TABLE[Op.ADD_ENTRY]

    def decode(body: list[Any]) -> Any:
        if len(body) == 5:
            _, request_id, status, ledger_id, entry_id = body
            int_ = int
            if (
                type(request_id) is int_
                and type(status) is int_
                and type(ledger_id) is int_
                and type(entry_id) is int_
                and 0 <= request_id <= U64_MAX
                and 0 <= status < status_count
                and 0 <= ledger_id <= I64_MAX
                and 0 <= entry_id <= I64_MAX
            ):
                response = new(cls)
                set_request_id(response, request_id)
                set_status(response, statuses[status])
                set_ledger_id(response, ledger_id)
                set_entry_id(response, entry_id)
                return response
        return slow(body)

    return decode


_fast_add_entry_response = _make_fast_add_entry_response()

_REQUEST_DECODERS: dict[int, Decoder] = _REQUEST_TABLE
_RESPONSE_DECODERS: dict[int, Decoder] = {
    **_RESPONSE_TABLE,
    Op.ADD_ENTRY: _fast_add_entry_response,
}


# --- Public entry points ------------------------------------------------------------------------


def _reject_envelope(body: Any, table: dict[int, Decoder], kind: str) -> NoReturn:
    """Raise the error for a body whose op cannot be found or has no decoder."""
    if type(body) is not list:
        _raise(f"{kind} body must be an array, got {_type_name(body)}")
    if not body:
        _raise(f"{kind} body is an empty array: it needs at least [op, request_id]")
    op = body[0]
    if type(op) is not int:
        _raise(f"{kind} field 0 (op) must be int, got {_type_name(op)}")
    assert op not in table, op
    if op == Op.ERROR and kind == "request":
        _raise("op 0 (ERROR) is sent only by a bookie, never in a request")
    _raise(f"{kind} field 0 (op) is not a known operation, got {_int_text(op)}")


def decode_request(body: Any) -> Request:
    """The request in a decoded frame body; ProtocolError names what is malformed."""
    if type(body) is list and body and type(body[0]) is int:
        # A plain int finds its IntEnum key: they hash and compare equal.
        decoder = _REQUEST_DECODERS.get(body[0])
        if decoder is not None:
            request: Request = decoder(body)
            return request
    _reject_envelope(body, _REQUEST_DECODERS, "request")


def decode_response(body: Any) -> Response:
    """The response in a decoded frame body; ProtocolError names what is malformed."""
    if type(body) is list and body and type(body[0]) is int:
        decoder = _RESPONSE_DECODERS.get(body[0])
        if decoder is not None:
            response: Response = decoder(body)
            return response
    _reject_envelope(body, _RESPONSE_DECODERS, "response")


def request_id_of(body: Any) -> int:
    """The request id of a body that failed to decode, when it can be found; 0 when not."""
    if type(body) is list and len(body) >= 2:
        request_id = body[1]
        if type(request_id) is int and 0 <= request_id <= U64_MAX:
            return request_id
    return 0
