from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bkaio.journal import (
    CheckpointRecord,
    CorruptRecordError,
    EntryRecord,
    FenceRecord,
    JournalMark,
    JournalRecord,
    LacRecord,
    MasterKeyRecord,
    RecordError,
    TruncatedRecordError,
    decode_record,
    encode_entry,
    encode_record,
    record_ledger_id,
)

EVERY_KIND: list[JournalRecord] = [
    EntryRecord(ledger_id=7, entry_id=0, lac=-1, length=5, digest=0xDEADBEEF, payload=b"hello"),
    EntryRecord(ledger_id=(1 << 64) - 1, entry_id=1 << 40, lac=3, length=0, digest=0, payload=b""),
    MasterKeyRecord(ledger_id=7, master_key=b"\x01" * 20),
    MasterKeyRecord(ledger_id=8, master_key=b""),
    FenceRecord(ledger_id=7),
    LacRecord(ledger_id=7, lac=-1),
    LacRecord(ledger_id=7, lac=12345),
    CheckpointRecord(mark=JournalMark(file_id=3, offset=4096)),
]


@pytest.mark.parametrize("record", EVERY_KIND, ids=repr)
def test_every_kind_round_trips(record: JournalRecord) -> None:
    encoded = encode_record(record)
    assert decode_record(encoded) == (record, len(encoded))


@pytest.mark.parametrize("record", EVERY_KIND, ids=repr)
def test_decode_with_trailing_bytes_and_at_an_offset(record: JournalRecord) -> None:
    encoded = encode_record(record)
    buffer = b"\xff" * 3 + encoded + b"trailing"
    assert decode_record(buffer, 3) == (record, 3 + len(encoded))
    assert decode_record(memoryview(buffer), 3) == (record, 3 + len(encoded))


@pytest.mark.parametrize("record", EVERY_KIND, ids=repr)
def test_every_proper_prefix_is_truncated(record: JournalRecord) -> None:
    encoded = encode_record(record)
    for cut in range(len(encoded)):
        with pytest.raises(TruncatedRecordError):
            decode_record(encoded[:cut])


@pytest.mark.parametrize("record", EVERY_KIND, ids=repr)
def test_every_flipped_byte_is_detected(record: JournalRecord) -> None:
    encoded = encode_record(record)
    for index in range(len(encoded)):
        damaged = bytearray(encoded)
        damaged[index] ^= 0x40
        with pytest.raises(RecordError):
            decode_record(bytes(damaged))


def test_zeros_are_never_a_record() -> None:
    with pytest.raises(CorruptRecordError):
        decode_record(bytes(64))


def test_encode_entry_matches_encode_record() -> None:
    record = EVERY_KIND[0]
    assert isinstance(record, EntryRecord)
    fast = encode_entry(
        record.ledger_id, record.entry_id, record.lac, record.length, record.digest, record.payload
    )
    assert fast == encode_record(record)


@pytest.mark.parametrize(
    "record",
    [
        EntryRecord(ledger_id=-1, entry_id=0, lac=-1, length=0, digest=0, payload=b""),
        EntryRecord(ledger_id=1, entry_id=0, lac=-1, length=0, digest=1 << 32, payload=b""),
        FenceRecord(ledger_id=1 << 64),
        CheckpointRecord(mark=JournalMark(file_id=-1, offset=0)),
    ],
    ids=repr,
)
def test_out_of_range_fields_are_refused_with_a_clear_error(record: JournalRecord) -> None:
    with pytest.raises(RecordError, match="out of range"):
        encode_record(record)


def test_oversized_record_is_refused() -> None:
    record = MasterKeyRecord(ledger_id=1, master_key=bytes(17 * 1024 * 1024))
    with pytest.raises(RecordError, match="exceeds"):
        encode_record(record)


def test_record_ledger_id() -> None:
    assert [record_ledger_id(record) for record in EVERY_KIND] == [
        7,
        (1 << 64) - 1,
        7,
        8,
        7,
        7,
        7,
        None,
    ]


def test_marks_order_like_positions() -> None:
    assert JournalMark(1, 900) < JournalMark(2, 32) < JournalMark(2, 33)


@given(
    ledger_id=st.integers(0, (1 << 64) - 1),
    entry_id=st.integers(-(1 << 63), (1 << 63) - 1),
    lac=st.integers(-(1 << 63), (1 << 63) - 1),
    length=st.integers(0, (1 << 64) - 1),
    digest=st.integers(0, (1 << 32) - 1),
    payload=st.binary(max_size=300),
)
def test_entry_round_trips_for_any_values(
    ledger_id: int, entry_id: int, lac: int, length: int, digest: int, payload: bytes
) -> None:
    record = EntryRecord(ledger_id, entry_id, lac, length, digest, payload)
    encoded = encode_record(record)
    assert decode_record(encoded) == (record, len(encoded))
