"""WriteCache: `put_many` keeps the same entries and byte count as one `put` per entry."""

from __future__ import annotations

from bkaio.entrylog.write_cache import WriteCache
from tests.unit.entrylog.conftest import make_entry


def test_put_many_matches_put_one_by_one_replacements_included() -> None:
    entries = [make_entry(1, 0), make_entry(1, 1), make_entry(2, 0)]
    entries.append(make_entry(1, 1, payload=b"longer" * 40))  # Replaces (1, 1).
    one_by_one = WriteCache()
    for entry in entries:
        one_by_one.put(entry)
    batched = WriteCache()
    batched.put_many(entries[:2])
    batched.put_many(entries[2:])
    assert batched.bytes == one_by_one.bytes
    assert len(batched) == len(one_by_one) == 3
    assert sorted(batched, key=lambda e: (e.ledger_id, e.entry_id)) == sorted(
        one_by_one, key=lambda e: (e.ledger_id, e.entry_id)
    )
    assert batched.get(1, 1) == entries[-1]
