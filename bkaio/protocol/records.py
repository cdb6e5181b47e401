"""Entry records as a reader takes them from a READ_ENTRIES answer (docs/protocol.md, "Range
reads"); the format is `bkaio.entry_records`' (re-exported here):

    record  u32 body length | u32 crc32c(body) | body
    body    i64 ledger_id | i64 entry_id | i64 lac | i64 length | u32 digest | payload

The same bytes as a record of a bookie's entry log, so a bookie sends a run of records read
from disk with one `pread` as they are, without a copy or a Python call per entry. A reader
does not trust the record checksum: it checks every entry's digest (`digest =
crc32c(ledger_id, entry_id, lac, length || payload)`, written by the writer), which covers the
same bytes but the digest itself. `scan_records` is the reader's one pass over an
answer; the loop is written out because it runs once per entry read.

Sans-IO and pure: imports crc32c and the record format only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import crc32c

from bkaio.entry_records import (
    RECORD_BODY_HEAD_BYTES,
    RECORD_HEAD,
    RECORD_HEAD_BYTES,
    RECORD_PREFIX_BYTES,
    pack_record,
    record_fields,
)

__all__ = ["RecordScan", "pack_record", "record_fields", "scan_records"]

_DIGESTED_HEAD_END = RECORD_PREFIX_BYTES + 32  # The digest covers the 32 bytes of ids first.
_crc32c = crc32c.crc32c


@dataclass(slots=True)
class RecordScan:
    """What `scan_records` found, in entry order.

    `entry_ids[i]`'s payload is `payloads[i]` and its record starts at `offsets[i]` of the
    scanned buffer (`record_fields` reads the rest of it). `corrupt` are entries whose digest
    does not match (never returned as payloads). `problem` says why the scan stopped early
    (a malformed or unexpected record); None when it reached the end.
    """

    entry_ids: list[int] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    corrupt: list[int] = field(default_factory=list)
    problem: str | None = None


def scan_records(
    records: bytes, ledger_id: int, first_entry_id: int, stride: int, last_entry_id: int
) -> RecordScan:
    """The digest-valid entries in `records`, an answer to a read of the entries
    first, first + stride, ... <= last of `ledger_id`.

    Records must be of that ledger, among those entries, in ascending order; the first one
    that is not (or is cut short) stops the scan and is named in `problem`.
    """
    assert stride >= 1, stride
    scan = RecordScan()
    entry_ids = scan.entry_ids
    payloads = scan.payloads
    offsets = scan.offsets
    view = memoryview(records)
    unpack = RECORD_HEAD.unpack_from
    crc = _crc32c
    total = len(records)
    offset = 0
    expected = first_entry_id  # The lowest entry id the next record may have.
    while offset < total:
        if offset + RECORD_HEAD_BYTES > total:
            scan.problem = f"record at byte {offset} is cut short ({total - offset} bytes left)"
            break
        body_bytes, _checksum, record_ledger, entry_id, _lac, _length, digest = unpack(
            records, offset
        )
        end = offset + RECORD_PREFIX_BYTES + body_bytes
        if body_bytes < RECORD_BODY_HEAD_BYTES or end > total:
            scan.problem = f"record at byte {offset} claims {body_bytes} body bytes"
            break
        if (
            record_ledger != ledger_id
            or not expected <= entry_id <= last_entry_id
            or (entry_id - first_entry_id) % stride
        ):
            scan.problem = (
                f"record at byte {offset} is ledger {record_ledger} entry {entry_id}, not one of "
                f"ledger {ledger_id}'s entries {expected}..{last_entry_id} (stride {stride})"
            )
            break
        payload = records[offset + RECORD_HEAD_BYTES : end]
        if crc(payload, crc(view[offset + RECORD_PREFIX_BYTES : offset + _DIGESTED_HEAD_END])) == (
            digest
        ):
            entry_ids.append(entry_id)
            payloads.append(payload)
            offsets.append(offset)
        else:
            scan.corrupt.append(entry_id)
        expected = entry_id + stride
        offset = end
    return scan
