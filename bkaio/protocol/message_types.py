"""Messages of the wire protocol v1 (docs/protocol.md, "Operations"): one frozen dataclass per
request and per response; `to_body()` gives the msgpack array.

    request   [op, request_id, *fields]
    response  [op, request_id, status, *fields]

Decoding (the other way) is `bkaio.protocol.messages`. Pure Python: no msgpack, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from bkaio.protocol.codes import PROTOCOL_VERSION, Flag, Op
from bkaio.status import Status

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
    auth_token: str | None = field(repr=False)  # A secret: kept out of logs.

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
class ReadEntriesRequest:
    """Range and stride reads, and long polls that answer with the entries (READ_ENTRIES,
    docs/protocol.md "Range reads"): the entries first, first + stride, ... <= last."""

    op: ClassVar[Op] = Op.READ_ENTRIES
    request_id: int
    ledger_id: int
    first_entry_id: int
    last_entry_id: int  # Inclusive; >= first_entry_id.
    stride: int  # >= 1.
    max_count: int
    max_bytes: int
    flags: Flag  # NONE or LONG_POLL.
    previous_lac: int  # With LONG_POLL: answer once the LAC exceeds this.
    timeout_ms: int  # With LONG_POLL: answer with what there is after this long.

    def to_body(self) -> list[Any]:
        return [
            Op.READ_ENTRIES,
            self.request_id,
            self.ledger_id,
            self.first_entry_id,
            self.last_entry_id,
            self.stride,
            self.max_count,
            self.max_bytes,
            self.flags,
            self.previous_lac,
            self.timeout_ms,
        ]

    @property
    def long_poll(self) -> bool:
        return bool(self.flags & Flag.LONG_POLL)

    def error_response(self, status: Status) -> ReadEntriesResponse:
        assert status is not Status.OK, self
        return ReadEntriesResponse(
            self.request_id, status, self.ledger_id, -1, self.first_entry_id, (b"",)
        )


@dataclass(frozen=True, slots=True)
class ReadEntriesResponse:
    """The wanted entries the bookie holds below `next_entry_id`, as entry records
    (bkaio/protocol/records.py) in one bin field."""

    op: ClassVar[Op] = Op.READ_ENTRIES
    request_id: int
    status: Status
    ledger_id: int
    lac: int  # The bookie's LAC for the ledger; -1 when none.
    next_entry_id: int  # The first wanted entry not looked at.
    # The records field as buffers whose concatenation it is: a bookie sends record runs read
    # from disk as they are (`FrameEncoder.add_read_entries`); a decoded response has one.
    records: tuple[bytes | memoryview, ...] = field(repr=False)

    @property
    def records_bytes(self) -> bytes:
        records = self.records
        if len(records) == 1 and type(records[0]) is bytes:
            return records[0]
        return b"".join(records)

    @property
    def records_size(self) -> int:
        return sum(len(part) for part in self.records)

    def to_body(self) -> list[Any]:
        return [
            Op.READ_ENTRIES,
            self.request_id,
            self.status,
            self.ledger_id,
            self.lac,
            self.next_entry_id,
            self.records_bytes,
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
    | ReadEntriesRequest
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
    | ReadEntriesResponse
    | ReadLacResponse
    | WriteLacResponse
    | ForceResponse
    | GetBookieInfoResponse
    | ListEntriesResponse
    | PingResponse
    | ErrorResponse
)
Message: TypeAlias = Request | Response
