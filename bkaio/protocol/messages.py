"""Messages of the wire protocol v1 (docs/protocol.md, "Operations"): typed bodies both ways.

    request   [op, request_id, *fields]
    response  [op, request_id, status, *fields]

One frozen dataclass per request and per response; `to_body()` gives the msgpack array and
`decode_request` / `decode_response` turn a decoded array back into a message through explicit
tables keyed by `Op`. Decoding checks the field count and every field's type and range (ints
are ints and never bools, ids fit their width, flags fit `Flag`), so a malformed body raises
`ProtocolError` naming the operation, the field and the problem, and nothing else escapes.

Pure Python: imports only bkaio.errors and the Status enum; no msgpack, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from enum import IntEnum, IntFlag
from typing import Any, ClassVar, NoReturn, TypeAlias

from bkaio import errors  # Module reference: see the import note in frames.py.
from bkaio.protocol.status import Status

PROTOCOL_VERSION = 1

U32_MAX = 2**32 - 1
I64_MAX = 2**63 - 1
U64_MAX = 2**64 - 1


class Op(IntEnum):
    """Operation codes. Values are wire format: never renumber."""

    ERROR = 0
    HELLO = 1
    ADD_ENTRY = 2
    READ_ENTRY = 3
    READ_RANGE = 4
    READ_LAC = 5
    WRITE_LAC = 6
    FORCE = 7
    GET_BOOKIE_INFO = 8
    LIST_ENTRIES = 9
    PING = 10
    ADD_ENTRIES = 11  # Several adds of one ledger in one frame; bookie feature "add_entries".


class Flag(IntFlag):
    """Request flags. Values are wire format: never renumber."""

    NONE = 0
    FENCE = 1  # READ_ENTRY / READ_RANGE / READ_LAC: fence the ledger; needs master_key.
    RECOVERY_ADD = 2  # ADD_ENTRY: allowed on a fenced ledger (recovery re-writes).
    LONG_POLL = 4  # READ_LAC: reply once the LAC exceeds previous_lac, or at timeout_ms.


FLAG_MASK = int(Flag.FENCE | Flag.RECOVERY_ADD | Flag.LONG_POLL)
assert FLAG_MASK & (FLAG_MASK + 1) == 0, "flags are contiguous low bits: a tuple indexes them"
_FLAGS: tuple[Flag, ...] = tuple(Flag(value) for value in range(FLAG_MASK + 1))
_STATUSES: tuple[Status, ...] = tuple(Status)
assert all(status.value == index for index, status in enumerate(_STATUSES)), "dense statuses"


# --- Messages -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WireEntry:
    """One stored entry as it travels in a read response; `digest` covers all the other fields."""

    entry_id: int
    lac: int  # The writer's LAC when it sent this entry (piggybacked).
    length: int  # Ledger length after this entry: cumulative payload bytes of entries 0..entry_id.
    digest: int
    payload: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class HelloRequest:
    op: ClassVar[Op] = Op.HELLO
    request_id: int
    protocol_version: int
    client_id: str
    auth_token: str | None

    def to_body(self) -> list[Any]:
        return [Op.HELLO, self.request_id, self.protocol_version, self.client_id, self.auth_token]

    def error_response(self, status: Status) -> HelloResponse:
        """The reply with a non-OK `status`: our protocol version, every other field empty."""
        assert status is not Status.OK, self
        return HelloResponse(self.request_id, status, PROTOCOL_VERSION, "", 0, 0, ())


@dataclass(frozen=True, slots=True)
class HelloResponse:
    op: ClassVar[Op] = Op.HELLO
    request_id: int
    status: Status
    protocol_version: int
    bookie_id: str
    shard_index: int
    shard_count: int
    features: tuple[str, ...]

    def to_body(self) -> list[Any]:
        return [
            Op.HELLO,
            self.request_id,
            self.status,
            self.protocol_version,
            self.bookie_id,
            self.shard_index,
            self.shard_count,
            list(self.features),
        ]


@dataclass(frozen=True, slots=True)
class AddEntryRequest:
    op: ClassVar[Op] = Op.ADD_ENTRY
    request_id: int
    ledger_id: int
    entry_id: int
    flags: Flag
    master_key: bytes = field(repr=False)  # A secret: kept out of logs.
    lac: int
    length: int
    digest: int
    payload: bytes = field(repr=False)

    def to_body(self) -> list[Any]:
        return [
            Op.ADD_ENTRY,
            self.request_id,
            self.ledger_id,
            self.entry_id,
            self.flags,
            self.master_key,
            self.lac,
            self.length,
            self.digest,
            self.payload,
        ]

    def error_response(self, status: Status) -> AddEntryResponse:
        assert status is not Status.OK, self
        return AddEntryResponse(self.request_id, status, self.ledger_id, self.entry_id)


@dataclass(frozen=True, slots=True)
class AddEntryResponse:
    op: ClassVar[Op] = Op.ADD_ENTRY
    request_id: int
    status: Status
    ledger_id: int
    entry_id: int

    def to_body(self) -> list[Any]:
        return [Op.ADD_ENTRY, self.request_id, self.status, self.ledger_id, self.entry_id]


@dataclass(frozen=True, slots=True)
class AddEntriesRequest:
    """Adds of one ledger in one frame: entry i has request id `request_id + i` and is handled
    exactly as if it had come as its own ADD_ENTRY (same checks, same durability, same answer
    unless the bookie coalesces OK answers into an `AddEntriesResponse`)."""

    op: ClassVar[Op] = Op.ADD_ENTRIES
    request_id: int
    ledger_id: int
    flags: Flag
    master_key: bytes = field(repr=False)  # A secret: kept out of logs.
    entries: tuple[WireEntry, ...] = field(repr=False)

    def to_body(self) -> list[Any]:
        body: list[Any] = [
            Op.ADD_ENTRIES, self.request_id, self.ledger_id, self.flags, self.master_key,
        ]  # fmt: skip
        for entry in self.entries:
            body += (entry.entry_id, entry.lac, entry.length, entry.digest, entry.payload)
        return body

    def split(self) -> list[AddEntryRequest]:
        """The ADD_ENTRY requests this frame stands for, in order."""
        return [
            AddEntryRequest(
                self.request_id + index,
                self.ledger_id,
                entry.entry_id,
                self.flags,
                self.master_key,
                entry.lac,
                entry.length,
                entry.digest,
                entry.payload,
            )
            for index, entry in enumerate(self.entries)
        ]

    def error_response(self, status: Status) -> AddEntriesResponse:
        assert status is not Status.OK, self
        return AddEntriesResponse(
            self.request_id, status, self.ledger_id, self.entries[0].entry_id, len(self.entries)
        )


@dataclass(frozen=True, slots=True)
class AddEntriesResponse:
    """One answer for `count` adds: request ids `request_id ..` and entry ids `entry_id ..` of
    `ledger_id`, each `count` long and consecutive, all with `status`."""

    op: ClassVar[Op] = Op.ADD_ENTRIES
    request_id: int
    status: Status
    ledger_id: int
    entry_id: int
    count: int

    def to_body(self) -> list[Any]:
        return [
            Op.ADD_ENTRIES, self.request_id, self.status, self.ledger_id, self.entry_id,
            self.count,
        ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class ReadEntryRequest:
    op: ClassVar[Op] = Op.READ_ENTRY
    request_id: int
    ledger_id: int
    entry_id: int  # -1: the last entry this bookie stores.
    flags: Flag
    master_key: bytes | None = field(repr=False)  # Needed with Flag.FENCE; a secret.

    def to_body(self) -> list[Any]:
        return [
            Op.READ_ENTRY,
            self.request_id,
            self.ledger_id,
            self.entry_id,
            self.flags,
            self.master_key,
        ]

    def error_response(self, status: Status) -> ReadEntryResponse:
        assert status is not Status.OK, self
        return ReadEntryResponse(self.request_id, status, self.ledger_id, self.entry_id, -1, None)


@dataclass(frozen=True, slots=True)
class ReadEntryResponse:
    op: ClassVar[Op] = Op.READ_ENTRY
    request_id: int
    status: Status
    ledger_id: int
    entry_id: int
    lac: int  # The bookie's known LAC for the ledger.
    entry: WireEntry | None  # On the wire: [lac, length, digest, payload] or nil.

    def to_body(self) -> list[Any]:
        entry = self.entry
        wire_entry: list[Any] | None = None
        if entry is not None:
            assert entry.entry_id == self.entry_id, (entry.entry_id, self.entry_id)
            wire_entry = [entry.lac, entry.length, entry.digest, entry.payload]
        return [
            Op.READ_ENTRY,
            self.request_id,
            self.status,
            self.ledger_id,
            self.entry_id,
            self.lac,
            wire_entry,
        ]


@dataclass(frozen=True, slots=True)
class ReadRangeRequest:
    op: ClassVar[Op] = Op.READ_RANGE
    request_id: int
    ledger_id: int
    first_entry_id: int
    max_count: int
    max_bytes: int
    flags: Flag
    master_key: bytes | None = field(repr=False)

    def to_body(self) -> list[Any]:
        return [
            Op.READ_RANGE,
            self.request_id,
            self.ledger_id,
            self.first_entry_id,
            self.max_count,
            self.max_bytes,
            self.flags,
            self.master_key,
        ]

    def error_response(self, status: Status) -> ReadRangeResponse:
        assert status is not Status.OK, self
        return ReadRangeResponse(self.request_id, status, self.ledger_id, -1, ())


@dataclass(frozen=True, slots=True)
class ReadRangeResponse:
    op: ClassVar[Op] = Op.READ_RANGE
    request_id: int
    status: Status
    ledger_id: int
    lac: int
    entries: tuple[WireEntry, ...]  # Consecutive from the request's first_entry_id.

    def to_body(self) -> list[Any]:
        return [
            Op.READ_RANGE,
            self.request_id,
            self.status,
            self.ledger_id,
            self.lac,
            [[e.entry_id, e.lac, e.length, e.digest, e.payload] for e in self.entries],
        ]


@dataclass(frozen=True, slots=True)
class ReadLacRequest:
    op: ClassVar[Op] = Op.READ_LAC
    request_id: int
    ledger_id: int
    flags: Flag
    master_key: bytes | None = field(repr=False)
    previous_lac: int  # With Flag.LONG_POLL: reply once the LAC exceeds this.
    timeout_ms: int  # With Flag.LONG_POLL: reply with the current LAC after this long.

    def to_body(self) -> list[Any]:
        return [
            Op.READ_LAC,
            self.request_id,
            self.ledger_id,
            self.flags,
            self.master_key,
            self.previous_lac,
            self.timeout_ms,
        ]

    def error_response(self, status: Status) -> ReadLacResponse:
        assert status is not Status.OK, self
        return ReadLacResponse(self.request_id, status, self.ledger_id, -1, -1)


@dataclass(frozen=True, slots=True)
class ReadLacResponse:
    op: ClassVar[Op] = Op.READ_LAC
    request_id: int
    status: Status
    ledger_id: int
    lac: int
    last_entry_id: int  # -1 when the bookie stores no entry of the ledger.

    def to_body(self) -> list[Any]:
        return [
            Op.READ_LAC,
            self.request_id,
            self.status,
            self.ledger_id,
            self.lac,
            self.last_entry_id,
        ]


@dataclass(frozen=True, slots=True)
class WriteLacRequest:
    op: ClassVar[Op] = Op.WRITE_LAC
    request_id: int
    ledger_id: int
    master_key: bytes = field(repr=False)  # A secret: kept out of logs.
    lac: int

    def to_body(self) -> list[Any]:
        return [Op.WRITE_LAC, self.request_id, self.ledger_id, self.master_key, self.lac]

    def error_response(self, status: Status) -> WriteLacResponse:
        assert status is not Status.OK, self
        return WriteLacResponse(self.request_id, status, self.ledger_id)


@dataclass(frozen=True, slots=True)
class WriteLacResponse:
    op: ClassVar[Op] = Op.WRITE_LAC
    request_id: int
    status: Status
    ledger_id: int

    def to_body(self) -> list[Any]:
        return [Op.WRITE_LAC, self.request_id, self.status, self.ledger_id]


@dataclass(frozen=True, slots=True)
class ForceRequest:
    op: ClassVar[Op] = Op.FORCE
    request_id: int
    ledger_id: int

    def to_body(self) -> list[Any]:
        return [Op.FORCE, self.request_id, self.ledger_id]

    def error_response(self, status: Status) -> ForceResponse:
        assert status is not Status.OK, self
        return ForceResponse(self.request_id, status, self.ledger_id)


@dataclass(frozen=True, slots=True)
class ForceResponse:
    op: ClassVar[Op] = Op.FORCE
    request_id: int
    status: Status
    ledger_id: int

    def to_body(self) -> list[Any]:
        return [Op.FORCE, self.request_id, self.status, self.ledger_id]


@dataclass(frozen=True, slots=True)
class GetBookieInfoRequest:
    op: ClassVar[Op] = Op.GET_BOOKIE_INFO
    request_id: int

    def to_body(self) -> list[Any]:
        return [Op.GET_BOOKIE_INFO, self.request_id]

    def error_response(self, status: Status) -> GetBookieInfoResponse:
        assert status is not Status.OK, self
        return GetBookieInfoResponse(self.request_id, status, 0, 0, 0, 0, False)


@dataclass(frozen=True, slots=True)
class GetBookieInfoResponse:
    op: ClassVar[Op] = Op.GET_BOOKIE_INFO
    request_id: int
    status: Status
    total_bytes: int
    free_bytes: int
    shard_index: int
    shard_count: int
    read_only: bool

    def to_body(self) -> list[Any]:
        return [
            Op.GET_BOOKIE_INFO,
            self.request_id,
            self.status,
            self.total_bytes,
            self.free_bytes,
            self.shard_index,
            self.shard_count,
            self.read_only,
        ]


@dataclass(frozen=True, slots=True)
class ListEntriesRequest:
    op: ClassVar[Op] = Op.LIST_ENTRIES
    request_id: int
    ledger_id: int

    def to_body(self) -> list[Any]:
        return [Op.LIST_ENTRIES, self.request_id, self.ledger_id]

    def error_response(self, status: Status) -> ListEntriesResponse:
        assert status is not Status.OK, self
        return ListEntriesResponse(self.request_id, status, self.ledger_id, ())


@dataclass(frozen=True, slots=True)
class ListEntriesResponse:
    op: ClassVar[Op] = Op.LIST_ENTRIES
    request_id: int
    status: Status
    ledger_id: int
    ranges: tuple[tuple[int, int], ...]  # Inclusive [first, last] entry ids, ascending.

    def to_body(self) -> list[Any]:
        return [
            Op.LIST_ENTRIES,
            self.request_id,
            self.status,
            self.ledger_id,
            [[first, last] for first, last in self.ranges],
        ]


@dataclass(frozen=True, slots=True)
class PingRequest:
    op: ClassVar[Op] = Op.PING
    request_id: int

    def to_body(self) -> list[Any]:
        return [Op.PING, self.request_id]

    def error_response(self, status: Status) -> PingResponse:
        assert status is not Status.OK, self
        return PingResponse(self.request_id, status)


@dataclass(frozen=True, slots=True)
class PingResponse:
    op: ClassVar[Op] = Op.PING
    request_id: int
    status: Status

    def to_body(self) -> list[Any]:
        return [Op.PING, self.request_id, self.status]


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """Sent by a bookie for a frame it could not decode; request_id is the decoded one, or 0."""

    op: ClassVar[Op] = Op.ERROR
    request_id: int
    status: Status
    message: str

    def to_body(self) -> list[Any]:
        return [Op.ERROR, self.request_id, self.status, self.message]


Request: TypeAlias = (
    HelloRequest
    | AddEntryRequest
    | AddEntriesRequest
    | ReadEntryRequest
    | ReadRangeRequest
    | ReadLacRequest
    | WriteLacRequest
    | ForceRequest
    | GetBookieInfoRequest
    | ListEntriesRequest
    | PingRequest
)
Response: TypeAlias = (
    HelloResponse
    | AddEntryResponse
    | AddEntriesResponse
    | ReadEntryResponse
    | ReadRangeResponse
    | ReadLacResponse
    | WriteLacResponse
    | ForceResponse
    | GetBookieInfoResponse
    | ListEntriesResponse
    | PingResponse
    | ErrorResponse
)
Message: TypeAlias = Request | Response


# --- Field checks -------------------------------------------------------------------------------
# A check returns the field's value (converted where the message holds a richer type) or raises
# _FieldError with the problem; the table decoder adds the operation and the field's name.


class _FieldError(Exception):
    """Internal: one field failed its check. Never leaves this module."""


Check = Callable[[Any], Any]


def _type_name(value: object) -> str:
    return "nil" if value is None else type(value).__name__


def _int_text(value: int) -> str:
    """An int for an error message; a huge one (only possible off the wire) by its size."""
    return str(value) if value.bit_length() <= 128 else f"a {value.bit_length()}-bit int"


def _int_between(low: int, high: int) -> Check:
    def check(value: Any) -> int:
        if type(value) is not int:  # Exactly int: a bool is an int to isinstance, not to us.
            raise _FieldError(f"must be int, got {_type_name(value)}")
        if not low <= value <= high:
            raise _FieldError(f"must be in [{low}, {high}], got {_int_text(value)}")
        return value

    return check


_check_request_id = _int_between(0, U64_MAX)
_check_ledger_id = _int_between(0, I64_MAX)
_check_entry_id = _int_between(0, I64_MAX)
_check_entry_id_or_last = _int_between(-1, I64_MAX)  # -1 = the last entry stored / none.
_check_lac = _int_between(-1, I64_MAX)  # -1 = nothing confirmed yet.
_check_count = _int_between(0, I64_MAX)  # Lengths, limits and byte counts.
_check_digest = _int_between(0, U32_MAX)
_check_u32 = _int_between(0, U32_MAX)


def _check_flags(value: Any) -> Flag:
    if type(value) is not int:
        raise _FieldError(f"must be int, got {_type_name(value)}")
    if not 0 <= value <= FLAG_MASK:
        raise _FieldError(
            f"must be a combination of Flag bits (mask {FLAG_MASK}), got {_int_text(value)}"
        )
    return _FLAGS[value]


def _check_status(value: Any) -> Status:
    if type(value) is not int:
        raise _FieldError(f"must be int, got {_type_name(value)}")
    if not 0 <= value < len(_STATUSES):
        raise _FieldError(f"is not a known Status, got {_int_text(value)}")
    return _STATUSES[value]


def _check_bytes(value: Any) -> bytes:
    if type(value) is not bytes:
        raise _FieldError(f"must be bytes, got {_type_name(value)}")
    return value


def _check_bytes_or_nil(value: Any) -> bytes | None:
    if value is not None and type(value) is not bytes:
        raise _FieldError(f"must be bytes or nil, got {_type_name(value)}")
    return value


def _check_str(value: Any) -> str:
    if type(value) is not str:
        raise _FieldError(f"must be str, got {_type_name(value)}")
    return value


def _check_str_or_nil(value: Any) -> str | None:
    if value is not None and type(value) is not str:
        raise _FieldError(f"must be str or nil, got {_type_name(value)}")
    return value


def _check_bool(value: Any) -> bool:
    if type(value) is not bool:
        raise _FieldError(f"must be bool, got {_type_name(value)}")
    return value


def _check_list(value: Any) -> list[Any]:
    if type(value) is not list:
        raise _FieldError(f"must be an array, got {_type_name(value)}")
    return value


def _check_str_list(value: Any) -> tuple[str, ...]:
    for index, item in enumerate(_check_list(value)):
        if type(item) is not str:
            raise _FieldError(f"item {index} must be str, got {_type_name(item)}")
    return tuple(value)


def _check_items(
    value: Any, index: int, names: Sequence[str], checks: Sequence[Check]
) -> list[Any]:
    """Check one array item of a fixed shape (a nested entry or range)."""
    if type(value) is not list:
        raise _FieldError(f"item {index} must be an array, got {_type_name(value)}")
    if len(value) != len(names):
        raise _FieldError(
            f"item {index} has {len(value)} fields, expected {len(names)} ({', '.join(names)})"
        )
    checked = []
    for position, (name, check, item) in enumerate(zip(names, checks, value, strict=True)):
        try:
            checked.append(check(item))
        except _FieldError as error:
            raise _FieldError(f"item {index} field {position} ({name}) {error}") from None
    return checked


_RANGE_NAMES = ("first", "last")
_RANGE_CHECKS = (_check_entry_id, _check_entry_id)


def _check_ranges(value: Any) -> tuple[tuple[int, int], ...]:
    ranges: list[tuple[int, int]] = []
    previous_last = -1
    for index, item in enumerate(_check_list(value)):
        first, last = _check_items(item, index, _RANGE_NAMES, _RANGE_CHECKS)
        if first > last:
            raise _FieldError(f"item {index} has first {first} above last {last}")
        if first <= previous_last:
            raise _FieldError(f"item {index} starts at {first}, not after {previous_last}")
        ranges.append((first, last))
        previous_last = last
    return tuple(ranges)


_ENTRY_NAMES = ("lac", "length", "digest", "payload")
_ENTRY_CHECKS = (_check_lac, _check_count, _check_digest, _check_bytes)


def _check_entry_or_nil(value: Any) -> tuple[int, int, int, bytes] | None:
    if value is None:
        return None
    if type(value) is not list:
        raise _FieldError(f"must be an array or nil, got {_type_name(value)}")
    lac, length, digest, payload = _check_items(value, 0, _ENTRY_NAMES, _ENTRY_CHECKS)
    return lac, length, digest, payload


_RANGE_ENTRY_NAMES = ("entry_id", *_ENTRY_NAMES)
_RANGE_ENTRY_CHECKS = (_check_entry_id, *_ENTRY_CHECKS)


def _check_entries(value: Any) -> tuple[WireEntry, ...]:
    entries: list[WireEntry] = []
    for index, item in enumerate(_check_list(value)):
        entry_id, lac, length, digest, payload = _check_items(
            item, index, _RANGE_ENTRY_NAMES, _RANGE_ENTRY_CHECKS
        )
        if entries and entry_id != entries[-1].entry_id + 1:
            raise _FieldError(
                f"item {index} has entry_id {entry_id}, expected {entries[-1].entry_id + 1}"
            )
        entries.append(WireEntry(entry_id, lac, length, digest, payload))
    return tuple(entries)


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


# --- Fast paths ---------------------------------------------------------------------------------
# ADD_ENTRY is most of the traffic. These check the same rules as the table with inline type
# tests and no per-field calls; anything they do not accept goes to the table decoder, which
# either accepts it too (it never should) or names the exact problem.


def _slot_setters(cls: type, names: Sequence[str]) -> tuple[Callable[[Any, Any], None], ...]:
    """The slot descriptors' setters of `cls`, for building a checked message without __init__.

    A frozen dataclass's __init__ sets each field through object.__setattr__, which costs as
    much as decoding the whole body; the fast paths set the slots directly instead.
    """
    assert tuple(field.name for field in fields(cls)) == tuple(names), (cls, names)
    return tuple(cls.__dict__[name].__set__ for name in names)


def _make_fast_add_entry_request() -> Decoder:
    new = object.__new__
    cls = AddEntryRequest
    (
        set_request_id,
        set_ledger_id,
        set_entry_id,
        set_flags,
        set_master_key,
        set_lac,
        set_length,
        set_digest,
        set_payload,
    ) = _slot_setters(cls, [name for name, _ in _ADD_ENTRY_REQUEST_FIELDS])
    flag_values = _FLAGS
    slow = _REQUEST_TABLE[Op.ADD_ENTRY]

    def decode(body: list[Any]) -> Any:
        if len(body) == 10:
            _, request_id, ledger_id, entry_id, flags, master_key, lac, length, digest, payload = (
                body
            )
            int_ = int
            if (
                type(request_id) is int_
                and type(ledger_id) is int_
                and type(entry_id) is int_
                and type(flags) is int_
                and type(lac) is int_
                and type(length) is int_
                and type(digest) is int_
                and type(master_key) is bytes
                and type(payload) is bytes
                and 0 <= request_id <= U64_MAX
                and 0 <= ledger_id <= I64_MAX
                and 0 <= entry_id <= I64_MAX
                and 0 <= flags <= FLAG_MASK
                and -1 <= lac <= I64_MAX
                and 0 <= length <= I64_MAX
                and 0 <= digest <= U32_MAX
            ):
                request = new(cls)
                set_request_id(request, request_id)
                set_ledger_id(request, ledger_id)
                set_entry_id(request, entry_id)
                set_flags(request, flag_values[flags])
                set_master_key(request, master_key)
                set_lac(request, lac)
                set_length(request, length)
                set_digest(request, digest)
                set_payload(request, payload)
                return request
        return slow(body)

    return decode


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


_fast_add_entry_request = _make_fast_add_entry_request()
_fast_add_entry_response = _make_fast_add_entry_response()

_REQUEST_DECODERS: dict[int, Decoder] = {**_REQUEST_TABLE, Op.ADD_ENTRY: _fast_add_entry_request}
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
