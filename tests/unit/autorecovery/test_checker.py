"""The ledger check's arithmetic: which expected entries fall outside what a bookie lists."""

from __future__ import annotations

from bkaio.autorecovery.checker import missing_entries


def test_missing_entries_against_inclusive_ranges() -> None:
    held = [(0, 4), (7, 7), (10, 12)]
    assert missing_entries(range(0, 14), held) == [5, 6, 8, 9, 13]
    assert missing_entries([1, 4, 7, 11], held) == []
    assert missing_entries(range(3), []) == [0, 1, 2]
    assert missing_entries([], held) == []
