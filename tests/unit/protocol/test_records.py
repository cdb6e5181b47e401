"""Entry records (READ_ENTRIES answers): what a reader accepts, and every kind of bad record
stopping or flagging the scan, never returned as an entry. Plus READ_ENTRIES body checks."""

from __future__ import annotations

import re
import struct
from typing import Any

import pytest

from bkaio.entrylog.entry_log import encode_record
from bkaio.entrylog.types import StoredEntry
from bkaio.errors import ProtocolError
from bkaio.protocol import decode_request
from bkaio.protocol.digest import entry_digest
from bkaio.protocol.records import pack_record, record_fields, scan_records

LEDGER = 9


def record(entry_id: int, payload: bytes | None = None, *, ledger: int = LEDGER) -> bytes:
    data = payload if payload is not None else b"p%d" % entry_id
    length = (entry_id + 1) * 10
    digest = entry_digest(ledger, entry_id, entry_id - 1, length, data)
    return b"".join(pack_record(ledger, entry_id, entry_id - 1, length, digest, data))


def test_the_wire_record_is_the_entry_log_record() -> None:
    entry = StoredEntry(LEDGER, 4, 3, 50, entry_digest(LEDGER, 4, 3, 50, b"x"), b"x")
    assert b"".join(
        pack_record(entry.ledger_id, 4, 3, 50, entry.digest, entry.payload)
    ) == encode_record(entry)


def test_a_stride_of_records_scans_back() -> None:
    blob = b"".join(record(i) for i in (3, 8, 13))
    scan = scan_records(blob, LEDGER, 3, 5, 20)
    assert scan.entry_ids == [3, 8, 13]
    assert scan.payloads == [b"p3", b"p8", b"p13"]
    assert scan.corrupt == [] and scan.problem is None
    assert record_fields(blob, scan.offsets[1])[:3] == (LEDGER, 8, 7)
    assert scan_records(b"", LEDGER, 0, 1, 5).entry_ids == []


def test_missing_entries_are_simply_absent() -> None:
    scan = scan_records(record(1) + record(4), LEDGER, 0, 1, 9)
    assert scan.entry_ids == [1, 4] and scan.problem is None


def test_a_corrupt_payload_is_flagged_not_returned() -> None:
    bad = bytearray(record(2))
    bad[-1] ^= 0xFF
    scan = scan_records(record(1) + bytes(bad) + record(3), LEDGER, 1, 1, 3)
    assert scan.entry_ids == [1, 3] and scan.corrupt == [2] and scan.problem is None


@pytest.mark.parametrize(
    ("blob", "first", "stride", "match"),
    [
        (record(1, ledger=LEDGER + 1), 0, 1, "ledger 10 entry 1, not one of ledger 9"),
        (record(4) + record(3), 3, 1, "entry 3, not one of ledger 9's entries 5..9"),
        (record(4) + record(4), 3, 1, "entry 4, not one of ledger 9's entries 5..9"),
        (record(1), 2, 1, "entry 1, not one of ledger 9's entries 2..9"),  # Before first.
        (record(10), 0, 1, "entry 10, not one of"),  # After last.
        (record(0) + record(1), 0, 2, r"entry 1, not one of .* 2..9 \(stride 2\)"),
        (record(0) + record(1)[:-1], 0, 1, "claims"),
        (record(0) + record(1)[:20], 0, 1, "cut short"),
        (struct.pack(">II", 3, 0) + bytes(40), 0, 1, "claims 3 body bytes"),
    ],
)
def test_a_bad_record_stops_the_scan_keeping_what_came_before(
    blob: bytes, first: int, stride: int, match: str
) -> None:
    scan = scan_records(blob, LEDGER, first, stride, 9)
    assert scan.problem is not None and re.search(match, scan.problem), scan.problem
    good = [i for i in (0, 3, 4) if blob.startswith(record(i))]
    assert scan.entry_ids == good[:1]


def _read_entries_body(**changes: Any) -> list[Any]:
    fields: dict[str, Any] = {
        "op": 12,
        "request_id": 1,
        "ledger_id": 7,
        "first": 0,
        "last": 10,
        "stride": 1,
        "max_count": 5,
        "max_bytes": 100,
        "flags": 0,
        "previous_lac": -1,
        "timeout_ms": 0,
    }
    fields.update(changes)
    return list(fields.values())


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (_read_entries_body(last=-1), r"field 4 \(last_entry_id\) must be in"),
        (_read_entries_body(first=5, last=4), "last_entry_id.*must be >= first_entry_id 5"),
        (_read_entries_body(stride=0), r"field 5 \(stride\) must be in \[1,"),
        (_read_entries_body(flags=1), r"field 8 \(flags\) may only be LONG_POLL"),
        (_read_entries_body(flags=2), r"field 8 \(flags\) may only be LONG_POLL"),
        (_read_entries_body(previous_lac=-2), r"field 9 \(previous_lac\)"),
        (_read_entries_body(timeout_ms=2**32), r"field 10 \(timeout_ms\)"),
        (_read_entries_body()[:-1], "READ_ENTRIES has 10 fields, expected 11"),
    ],
)
def test_malformed_read_entries_requests_name_the_problem(body: list[Any], match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_request(body)
