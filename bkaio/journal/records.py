"""Journal record kinds and their byte format. Pure: no files, no asyncio.

Record layout (all integers big-endian):

    crc32c: u32   CRC32C over every byte after it: length, kind and body
    length: u32   body bytes (not counting this 9-byte header)
    kind:   u8    RecordKind
    body:   `length` bytes, per kind:
        ENTRY       ledger_id u64, entry_id i64, lac i64, length u64, digest u32, payload
        MASTER_KEY  ledger_id u64, master_key
        FENCE       ledger_id u64
        LAC         ledger_id u64, lac i64
        CHECKPOINT  file_id u64, offset u64

The checksum covers the length field too, so a record whose length was torn or zeroed (a
crash mid-write, or preallocated zeros) never decodes. Kind 0 is never used, so a zero-filled
region is never a valid header either. This module imports neither `protocol` nor `meta`.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Final

from crc32c import crc32c

from bkaio.journal.errors import CorruptRecordError, RecordError, TruncatedRecordError
from bkaio.wal.records import (
    CheckpointRecord,
    EntryRecord,
    FenceRecord,
    JournalEntry,
    JournalMark,
    JournalRecord,
    LacRecord,
    MasterKeyRecord,
)

# The records themselves are defined in `bkaio.wal.records`, where ledger storage finds them
# without importing the journal; this module holds their byte format.
__all__ = [
    "MAX_RECORD_BODY_BYTES",
    "RECORD_HEADER",
    "RECORD_HEADER_BYTES",
    "CheckpointRecord",
    "EntryRecord",
    "FenceRecord",
    "JournalEntry",
    "JournalMark",
    "JournalRecord",
    "LacRecord",
    "MasterKeyRecord",
    "RecordKind",
    "check_record",
    "decode_record",
    "encode_entry",
    "encode_entry_head",
    "encode_record",
    "record_ledger_id",
]

RECORD_HEADER: Final = struct.Struct(">IIB")
RECORD_HEADER_BYTES: Final = RECORD_HEADER.size
# One entry is at most an 8 MiB frame; twice that leaves room for the envelope. A larger
# length is a torn or corrupt header, never a real record.
MAX_RECORD_BODY_BYTES: Final = 16 * 1024 * 1024

_ENTRY: Final = struct.Struct(">QqqQI")
_LEDGER: Final = struct.Struct(">Q")
_LAC: Final = struct.Struct(">Qq")
_CHECKPOINT: Final = struct.Struct(">QQ")
_CRC: Final = struct.Struct(">I")
_LENGTH_KIND: Final = struct.Struct(">IB")  # The header after its CRC.
_ENTRY_COVERED: Final = struct.Struct(">IBQqqQI")  # Length, kind and ENTRY's fixed fields.


class RecordKind(IntEnum):
    ENTRY = 1
    MASTER_KEY = 2
    FENCE = 3
    LAC = 4
    CHECKPOINT = 5


# Bytes of each kind's fixed fields; ENTRY and MASTER_KEY carry a variable tail after them.
_FIXED_BODY_BYTES: Final[dict[int, int]] = {
    RecordKind.ENTRY: _ENTRY.size,
    RecordKind.MASTER_KEY: _LEDGER.size,
    RecordKind.FENCE: _LEDGER.size,
    RecordKind.LAC: _LAC.size,
    RecordKind.CHECKPOINT: _CHECKPOINT.size,
}
_EXACT_KINDS: Final = frozenset({RecordKind.FENCE, RecordKind.LAC, RecordKind.CHECKPOINT})


def _seal(kind: RecordKind, body_head: bytes, tail: bytes = b"") -> bytes:
    """Header + body_head + tail, with the CRC filled in."""
    body_bytes = len(body_head) + len(tail)
    assert body_bytes <= MAX_RECORD_BODY_BYTES, body_bytes
    covered = _LENGTH_KIND.pack(body_bytes, kind) + body_head
    return b"".join((_CRC.pack(crc32c(tail, crc32c(covered))), covered, tail))


def encode_entry_head(
    ledger_id: int, entry_id: int, lac: int, length: int, digest: int, payload: bytes
) -> bytes:
    """Everything of an ENTRY record but its payload: the record is `head + payload`.

    The journal appends both parts to its group buffer, so the payload is copied only there.
    """
    body_bytes = _ENTRY.size + len(payload)
    if body_bytes > MAX_RECORD_BODY_BYTES:  # Checked first: the message is built only then.
        _check_body_size(body_bytes, f"ledger {ledger_id}: entry {entry_id}")
    try:
        covered = _ENTRY_COVERED.pack(
            body_bytes, RecordKind.ENTRY, ledger_id, entry_id, lac, length, digest
        )
    except struct.error as error:
        raise RecordError(
            f"ledger {ledger_id}: entry {entry_id} (lac {lac}, length {length}, digest {digest}) "
            f"has a field out of range for the journal: {error}"
        ) from None
    return _CRC.pack(crc32c(payload, crc32c(covered))) + covered


def encode_entry(
    ledger_id: int, entry_id: int, lac: int, length: int, digest: int, payload: bytes
) -> bytes:
    """The bytes of an ENTRY record, without building an `EntryRecord` first."""
    return encode_entry_head(ledger_id, entry_id, lac, length, digest, payload) + payload


def _check_body_size(body_bytes: int, what: str) -> None:
    if body_bytes > MAX_RECORD_BODY_BYTES:
        raise RecordError(
            f"{what}: a {body_bytes}-byte record body exceeds the journal's "
            f"{MAX_RECORD_BODY_BYTES}-byte limit"
        )


def encode_record(record: JournalRecord) -> bytes:
    """The bytes of one record, header and checksum included.

    Raises RecordError when a field does not fit its on-disk width or the record is too big.
    """
    if isinstance(record, EntryRecord):
        return encode_entry(
            record.ledger_id,
            record.entry_id,
            record.lac,
            record.length,
            record.digest,
            record.payload,
        )
    try:
        return _encode_metadata_record(record)
    except struct.error as error:
        raise RecordError(f"{record!r} has a field out of range for the journal: {error}") from None


def _encode_metadata_record(record: JournalRecord) -> bytes:
    match record:
        case MasterKeyRecord(ledger_id, master_key):
            _check_body_size(_LEDGER.size + len(master_key), f"ledger {ledger_id}: master key")
            return _seal(RecordKind.MASTER_KEY, _LEDGER.pack(ledger_id), master_key)
        case FenceRecord(ledger_id):
            return _seal(RecordKind.FENCE, _LEDGER.pack(ledger_id))
        case LacRecord(ledger_id, lac):
            return _seal(RecordKind.LAC, _LAC.pack(ledger_id, lac))
        case CheckpointRecord(JournalMark(file_id, offset)):
            return _seal(RecordKind.CHECKPOINT, _CHECKPOINT.pack(file_id, offset))
    raise AssertionError(f"not a journal record: {record!r}")


def record_ledger_id(record: JournalRecord) -> int | None:
    """The ledger a record belongs to; None for a checkpoint, which belongs to no ledger."""
    if isinstance(record, CheckpointRecord):
        return None
    return record.ledger_id


def _decode_body(kind: int, body: bytes, offset: int) -> JournalRecord:
    """Decode a checksummed body. Wrong sizes mean a writer bug or a format we do not know."""
    fixed = _FIXED_BODY_BYTES.get(kind)
    if fixed is None:
        raise CorruptRecordError(f"record at offset {offset}: unknown kind {kind}")
    exact = kind in _EXACT_KINDS
    if len(body) < fixed or (exact and len(body) != fixed):
        raise CorruptRecordError(
            f"record at offset {offset}: {RecordKind(kind).name} body of {len(body)} bytes "
            f"does not fit its {fixed}-byte layout"
        )
    if kind == RecordKind.ENTRY:
        ledger_id, entry_id, lac, length, digest = _ENTRY.unpack_from(body)
        return EntryRecord(ledger_id, entry_id, lac, length, digest, body[fixed:])
    if kind == RecordKind.MASTER_KEY:
        return MasterKeyRecord(_LEDGER.unpack_from(body)[0], body[fixed:])
    if kind == RecordKind.FENCE:
        return FenceRecord(_LEDGER.unpack_from(body)[0])
    if kind == RecordKind.LAC:
        return LacRecord(*_LAC.unpack_from(body))
    return CheckpointRecord(JournalMark(*_CHECKPOINT.unpack_from(body)))


def check_record(buffer: bytes | bytearray | memoryview, offset: int = 0) -> int:
    """Validate the record at `offset` (framing and checksum) and return the offset after it.

    Raises TruncatedRecordError when `buffer` ends inside the record and CorruptRecordError
    when its length is impossible or its checksum does not match.
    """
    available = len(buffer) - offset
    if available < RECORD_HEADER_BYTES:
        raise TruncatedRecordError(
            f"record at offset {offset}: {available} of {RECORD_HEADER_BYTES} header bytes"
        )
    header: tuple[int, int, int] = RECORD_HEADER.unpack_from(buffer, offset)
    expected_crc, body_bytes, _kind = header
    if body_bytes > MAX_RECORD_BODY_BYTES:
        raise CorruptRecordError(
            f"record at offset {offset}: length {body_bytes} exceeds {MAX_RECORD_BODY_BYTES}"
        )
    end = offset + RECORD_HEADER_BYTES + body_bytes
    if len(buffer) < end:
        raise TruncatedRecordError(
            f"record at offset {offset}: {available} of {end - offset} bytes present"
        )
    with memoryview(buffer) as view:
        actual_crc = crc32c(view[offset + 4 : end])
    if actual_crc != expected_crc:
        raise CorruptRecordError(
            f"record at offset {offset}: checksum {actual_crc:#010x} != stored {expected_crc:#010x}"
        )
    return end


def decode_record(
    buffer: bytes | bytearray | memoryview, offset: int = 0
) -> tuple[JournalRecord, int]:
    """Decode the record at `offset`; return it and the offset just after it.

    Raises TruncatedRecordError when `buffer` ends inside the record (more bytes may follow,
    or the write was torn) and CorruptRecordError when the bytes are there but wrong.
    """
    end = check_record(buffer, offset)
    kind = buffer[offset + 8]
    body = bytes(buffer[offset + RECORD_HEADER_BYTES : end])
    record = _decode_body(kind, body, offset)
    return record, end
