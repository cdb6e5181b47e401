"""LedgerMetadata: invariants, helpers and the msgpack form."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bkaio.meta.errors import InvalidMetadataError
from bkaio.meta.ledger_metadata import (
    DigestType,
    LedgerMetadata,
    LedgerState,
    deserialize,
    serialize,
)

E3 = ("a:1", "b:1", "c:1")


def metadata(**changes: Any) -> LedgerMetadata:
    fields: dict[str, Any] = {
        "ledger_id": 42,
        "ensemble_size": 3,
        "write_quorum": 2,
        "ack_quorum": 2,
        "ensembles": ((0, E3),),
        "password_hash": b"h" * 20,
        "ctime_ms": 1_700_000_000_000,
    }
    fields.update(changes)
    return LedgerMetadata(**fields)


def test_defaults_describe_an_open_crc32c_ledger() -> None:
    md = metadata()
    assert md.state is LedgerState.OPEN and md.digest_type is DigestType.CRC32C
    assert (md.last_entry_id, md.length, md.version) == (-1, 0, 0)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"ack_quorum": 0}, "1 <= ack_quorum"),
        ({"ack_quorum": 3}, "ack_quorum \\(3\\) <= write_quorum \\(2\\)"),
        ({"write_quorum": 4}, "write_quorum \\(4\\) <= ensemble_size \\(3\\)"),
        ({"ensembles": ()}, "has no ensemble"),
        ({"ensembles": ((1, E3),)}, "first segment starts at entry 1"),
        ({"ensembles": ((0, E3), (5, E3), (5, E3))}, "does not follow"),
        ({"ensembles": ((0, ("a:1", "a:1", "b:1")),)}, "3 distinct bookies"),
        ({"ensembles": ((0, ("a:1", "b:1")),)}, "3 distinct bookies"),
        ({"ensembles": ((0, ("a:1", "b:1", "")),)}, "non-empty"),
        ({"last_entry_id": 5}, "OPEN ledger must have last_entry_id -1"),
        ({"state": LedgerState.CLOSED, "last_entry_id": -1, "length": 3}, "closed empty"),
        ({"state": LedgerState.CLOSED, "last_entry_id": -2}, "closed with"),
        ({"ledger_id": -5}, "ledger_id must be"),
        ({"format_version": 2}, "format_version 2 unknown"),
        ({"custom_metadata": {"k": "not bytes"}}, "custom_metadata"),
    ],
)
def test_broken_invariants_are_named(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidMetadataError, match=message):
        metadata(**changes)


def test_ensemble_for_picks_the_segment_holding_the_entry() -> None:
    later = ("a:1", "d:1", "c:1")
    md = metadata().with_ensemble(10, later)
    assert md.ensemble_for(0) == E3 and md.ensemble_for(9) == E3
    assert md.ensemble_for(10) == later and md.ensemble_for(10**9) == later
    assert md.last_ensemble == later


def test_an_ensemble_change_at_the_same_entry_replaces_the_last_segment() -> None:
    md = (
        metadata().with_ensemble(10, ("a:1", "d:1", "c:1")).with_ensemble(10, ("a:1", "e:1", "c:1"))
    )
    assert md.ensembles == ((0, E3), (10, ("a:1", "e:1", "c:1")))
    with pytest.raises(InvalidMetadataError, match="starts before"):
        md.with_ensemble(5, E3)


def test_closing_sets_state_last_entry_and_length() -> None:
    md = metadata().closed(last_entry_id=99, length=12345)
    assert (md.state, md.last_entry_id, md.length, md.is_closed) == (
        LedgerState.CLOSED,
        99,
        12345,
        True,
    )


def test_serde_round_trips_everything_but_the_version() -> None:
    md = (
        metadata(
            custom_metadata={"app": b"\x00\xff"},
            digest_type=DigestType.DUMMY,
            version=77,
        )
        .with_ensemble(3, ("x:1", "b:1", "c:1"))
        .closed(10, 500)
    )
    decoded = deserialize(serialize(md), ledger_id=42, version=99)
    assert decoded == md.with_version(99)


@given(
    ensemble_size=st.integers(1, 8),
    data=st.data(),
    closed=st.booleans(),
    custom=st.dictionaries(st.text(max_size=8), st.binary(max_size=16), max_size=4),
)
def test_serde_round_trips_arbitrary_valid_records(
    ensemble_size: int, data: st.DataObject, closed: bool, custom: dict[str, bytes]
) -> None:
    write_quorum = data.draw(st.integers(1, ensemble_size))
    ack_quorum = data.draw(st.integers(1, write_quorum))
    starts = sorted(data.draw(st.sets(st.integers(1, 10**6), max_size=4)))
    ensembles = tuple(
        (start, tuple(f"bookie-{start}-{i}:3181" for i in range(ensemble_size)))
        for start in [0, *starts]
    )
    md = LedgerMetadata(
        ledger_id=data.draw(st.integers(0, 2**63 - 1)),
        ensemble_size=ensemble_size,
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        ensembles=ensembles,
        custom_metadata=custom,
    )
    if closed:
        md = md.closed(last_entry_id=data.draw(st.integers(0, 2**40)), length=7)
    assert deserialize(serialize(md), ledger_id=md.ledger_id, version=5) == md.with_version(5)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xc1", "does not decode"),
        (msgpack.packb([1, 2]), "not a map"),
        (msgpack.packb({"format_version": 9, "ledger_id": 42}), "format_version 9 unknown"),
        (msgpack.packb({"format_version": 1, "ledger_id": 41}), "names ledger 41"),
        (msgpack.packb({"format_version": 1, "ledger_id": 42}), "malformed"),
    ],
)
def test_bad_bytes_are_invalid_metadata(data: bytes, message: str) -> None:
    with pytest.raises(InvalidMetadataError, match=message):
        deserialize(data, ledger_id=42, version=1)


def test_trailing_bytes_are_rejected() -> None:
    with pytest.raises(InvalidMetadataError):
        deserialize(serialize(metadata()) + b"\x00", ledger_id=42, version=1)
