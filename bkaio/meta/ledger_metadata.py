"""Ledger metadata: the record, its invariants and its msgpack form. Pure: no I/O.

The record follows BookKeeper's LedgerMetadataFormat (reference/bookkeeper.md section 4.1):
quorums, state, last entry id and length once closed, digest type, password hash, the
ensembles by first entry id, creation time and custom metadata. `version` is the metadata
store's version of the key it was read from; it is not part of the serialized bytes.

Wire form: a msgpack map with a `format_version` (FORMAT_VERSION; an unknown version is an
InvalidMetadataError, never a silent misread). Maps rather than arrays so that a later format
can add fields that an older reader skips.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack

from bkaio.meta.errors import InvalidMetadataError

FORMAT_VERSION = 1
UNASSIGNED_LEDGER_ID = -1
MAX_LEDGER_ID = 2**63 - 1


class LedgerState(enum.IntEnum):
    OPEN = 1
    IN_RECOVERY = 2
    CLOSED = 3


class DigestType(enum.IntEnum):
    # BookKeeper's numbering, so the values mean the same thing in both systems.
    CRC32 = 1
    HMAC = 2
    CRC32C = 3
    DUMMY = 4


Ensemble = tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerMetadata:
    ledger_id: int = UNASSIGNED_LEDGER_ID  # Assigned by LedgerManager.create when -1.
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    ensembles: tuple[tuple[int, Ensemble], ...]  # (first_entry_id, bookie ids), ascending.
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1  # Set when CLOSED (-1: closed empty).
    length: int = 0  # Bytes; set when CLOSED.
    digest_type: DigestType = DigestType.CRC32C
    password_hash: bytes = b""
    ctime_ms: int = 0  # Filled with the creation time by LedgerManager.create when 0.
    custom_metadata: dict[str, bytes] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    version: int = 0  # Metadata store version (etcd mod_revision); 0 = not stored yet.

    def __post_init__(self) -> None:
        validate(self)

    # -- queries ----------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    @property
    def last_ensemble(self) -> Ensemble:
        return self.ensembles[-1][1]

    def ensemble_for(self, entry_id: int) -> Ensemble:
        """The ensemble of the segment that holds `entry_id`."""
        assert entry_id >= 0, entry_id
        starts = [first_entry_id for first_entry_id, _ in self.ensembles]
        return self.ensembles[bisect.bisect_right(starts, entry_id) - 1][1]

    # -- derived records --------------------------------------------------------------------

    def replace(self, **changes: Any) -> LedgerMetadata:
        """A copy with `changes`, validated again."""
        return dataclasses.replace(self, **changes)

    def with_version(self, version: int) -> LedgerMetadata:
        return dataclasses.replace(self, version=version)

    def with_state(self, state: LedgerState) -> LedgerMetadata:
        return dataclasses.replace(self, state=state)

    def with_ensemble(self, first_entry_id: int, bookie_ids: Ensemble) -> LedgerMetadata:
        """A new segment from `first_entry_id` on (an ensemble change). A segment starting
        where the last one starts replaces it (it never held an entry)."""
        last_start = self.ensembles[-1][0]
        if first_entry_id < last_start:
            raise InvalidMetadataError(
                f"ledger {self.ledger_id}: new segment at entry {first_entry_id} starts before"
                f" the last segment at {last_start}"
            )
        kept = self.ensembles[:-1] if first_entry_id == last_start else self.ensembles
        return dataclasses.replace(self, ensembles=(*kept, (first_entry_id, tuple(bookie_ids))))

    def closed(self, last_entry_id: int, length: int) -> LedgerMetadata:
        return dataclasses.replace(
            self, state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length
        )


def _fail(metadata: LedgerMetadata, why: str) -> InvalidMetadataError:
    return InvalidMetadataError(f"ledger {metadata.ledger_id} metadata: {why}")


def validate(md: LedgerMetadata) -> None:
    """InvalidMetadataError naming the first broken invariant."""
    if not UNASSIGNED_LEDGER_ID <= md.ledger_id <= MAX_LEDGER_ID:
        raise _fail(md, f"ledger_id must be in [0, 2**63) or -1 (unassigned), not {md.ledger_id}")
    if not 1 <= md.ack_quorum <= md.write_quorum <= md.ensemble_size:
        raise _fail(
            md,
            f"need 1 <= ack_quorum ({md.ack_quorum}) <= write_quorum ({md.write_quorum})"
            f" <= ensemble_size ({md.ensemble_size})",
        )
    if not isinstance(md.state, LedgerState):
        raise _fail(md, f"state {md.state!r} is not a LedgerState")
    if not isinstance(md.digest_type, DigestType):
        raise _fail(md, f"digest_type {md.digest_type!r} is not a DigestType")
    if md.format_version != FORMAT_VERSION:
        raise _fail(md, f"format_version {md.format_version} unknown (this build reads 1)")
    _validate_ensembles(md)
    if md.state is LedgerState.CLOSED:
        if md.last_entry_id < -1 or md.length < 0:
            raise _fail(md, f"closed with last_entry_id {md.last_entry_id}, length {md.length}")
        if md.last_entry_id == -1 and md.length != 0:
            raise _fail(md, f"closed empty (last_entry_id -1) but length is {md.length}")
    elif md.last_entry_id != -1 or md.length != 0:
        raise _fail(
            md,
            f"{md.state.name} ledger must have last_entry_id -1 and length 0 until closed"
            f" (has {md.last_entry_id}, {md.length})",
        )
    if md.ctime_ms < 0 or md.version < 0:
        raise _fail(md, f"ctime_ms ({md.ctime_ms}) and version ({md.version}) must be >= 0")
    if not isinstance(md.password_hash, bytes):
        raise _fail(md, "password_hash must be bytes")
    for key, value in md.custom_metadata.items():
        if not isinstance(key, str) or not isinstance(value, bytes):
            raise _fail(md, f"custom_metadata {key!r} must map str to bytes")


def _validate_ensembles(md: LedgerMetadata) -> None:
    if not md.ensembles:
        raise _fail(md, "has no ensemble")
    previous_start = -1
    for first_entry_id, bookie_ids in md.ensembles:
        if previous_start < 0 and first_entry_id != 0:
            raise _fail(md, f"first segment starts at entry {first_entry_id}, not 0")
        if first_entry_id <= previous_start:
            raise _fail(
                md, f"segment at entry {first_entry_id} does not follow the one at {previous_start}"
            )
        if len(bookie_ids) != md.ensemble_size or len(set(bookie_ids)) != len(bookie_ids):
            raise _fail(
                md,
                f"segment at entry {first_entry_id} needs {md.ensemble_size} distinct bookies,"
                f" has {list(bookie_ids)}",
            )
        if not all(isinstance(bookie_id, str) and bookie_id for bookie_id in bookie_ids):
            raise _fail(md, f"segment at entry {first_entry_id}: bookie ids must be non-empty str")
        previous_start = first_entry_id


# -- serde ------------------------------------------------------------------------------------


def serialize(md: LedgerMetadata) -> bytes:
    record = {
        "format_version": md.format_version,
        "ledger_id": md.ledger_id,
        "ensemble_size": md.ensemble_size,
        "write_quorum": md.write_quorum,
        "ack_quorum": md.ack_quorum,
        "state": int(md.state),
        "last_entry_id": md.last_entry_id,
        "length": md.length,
        "digest_type": int(md.digest_type),
        "password_hash": md.password_hash,
        "ensembles": [[first, list(bookies)] for first, bookies in md.ensembles],
        "ctime_ms": md.ctime_ms,
        "custom_metadata": md.custom_metadata,
    }
    packed: bytes = msgpack.packb(record, use_bin_type=True)
    return packed


def deserialize(data: bytes, *, ledger_id: int, version: int) -> LedgerMetadata:
    """The record stored under ledger `ledger_id` at store version `version`."""
    try:
        record = msgpack.unpackb(data, raw=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as error:
        raise InvalidMetadataError(
            f"ledger {ledger_id}: metadata does not decode: {error!r}"
        ) from None
    if not isinstance(record, dict):
        raise InvalidMetadataError(f"ledger {ledger_id}: metadata is not a map")
    format_version = record.get("format_version")
    if format_version != FORMAT_VERSION:
        raise InvalidMetadataError(
            f"ledger {ledger_id}: metadata format_version {format_version!r} unknown"
            f" (this build reads {FORMAT_VERSION})"
        )
    if record.get("ledger_id") != ledger_id:
        raise InvalidMetadataError(
            f"ledger {ledger_id}: stored record names ledger {record.get('ledger_id')!r}"
        )
    try:
        return LedgerMetadata(
            ledger_id=ledger_id,
            ensemble_size=record["ensemble_size"],
            write_quorum=record["write_quorum"],
            ack_quorum=record["ack_quorum"],
            state=LedgerState(record["state"]),
            last_entry_id=record["last_entry_id"],
            length=record["length"],
            digest_type=DigestType(record["digest_type"]),
            password_hash=record["password_hash"],
            ensembles=tuple((first, tuple(bookies)) for first, bookies in record["ensembles"]),
            ctime_ms=record["ctime_ms"],
            custom_metadata=dict(record["custom_metadata"]),
            format_version=format_version,
            version=version,
        )
    except (KeyError, TypeError, ValueError) as error:
        raise InvalidMetadataError(f"ledger {ledger_id}: malformed metadata: {error!r}") from None


def now_ms() -> int:
    return int(time.time() * 1000)
