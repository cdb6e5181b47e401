from __future__ import annotations

import pytest

from bkaio.autorecovery.cluster import key_matches
from bkaio.autorecovery.fragments import (
    ReplicationError,
    fragment_entries,
    fragments_on,
    holds_entry,
    replace_in_segment,
)
from bkaio.ledger_client.bookkeeper import password_hash
from bkaio.ledger_client.quorum import write_set
from bkaio.meta import LedgerMetadata, LedgerState
from bkaio.protocol.digest import master_key


def _ledger(
    ensembles: tuple[tuple[int, tuple[str, ...]], ...],
    *,
    closed_at: int | None = None,
    ensemble_size: int = 3,
    write_quorum: int = 3,
) -> LedgerMetadata:
    md = LedgerMetadata(
        ledger_id=7,
        ensemble_size=ensemble_size,
        write_quorum=write_quorum,
        ack_quorum=2,
        ensembles=ensembles,
    )
    return md if closed_at is None else md.closed(closed_at, (closed_at + 1) * 10)


@pytest.mark.parametrize(("ensemble_size", "write_quorum"), [(3, 3), (5, 3), (4, 2), (5, 1)])
def test_holds_entry_agrees_with_the_write_set(ensemble_size: int, write_quorum: int) -> None:
    for entry_id in range(40):
        members = set(write_set(entry_id, ensemble_size, write_quorum))
        for index in range(ensemble_size):
            assert holds_entry(index, entry_id, ensemble_size, write_quorum) == (index in members)


def test_closed_ledger_fragments_cover_each_segment_up_to_the_last_entry() -> None:
    md = _ledger(((0, ("a", "b", "c")), (100, ("a", "d", "c"))), closed_at=149)
    fragments = fragments_on(md, {"a", "b"})
    spans = [(f.bookie_id, f.first_entry_id, f.last_entry_id, f.open_tail) for f in fragments]
    assert spans == [("a", 0, 99, False), ("b", 0, 99, False), ("a", 100, 149, False)]
    assert list(fragment_entries(fragments[2], 3, 3)) == list(range(100, 150))


def test_open_ledger_last_segment_is_an_open_tail_without_entries() -> None:
    md = _ledger(((0, ("a", "b", "c")), (10, ("d", "b", "c"))))
    fragments = fragments_on(md, {"b"})
    assert [(f.first_entry_id, f.open_tail) for f in fragments] == [(0, False), (10, True)]
    assert list(fragment_entries(fragments[1], 3, 3)) == []
    assert list(fragment_entries(fragments[0], 3, 3)) == list(range(10))


def test_striped_fragment_lists_only_the_bookies_entries() -> None:
    md = _ledger(((0, ("a", "b", "c", "d", "e")),), closed_at=9, ensemble_size=5, write_quorum=2)
    (fragment,) = fragments_on(md, {"c"})
    # Entry e goes to indexes e and e+1 (mod 5): index 2 holds entries 1, 2, 6, 7.
    assert list(fragment_entries(fragment, 5, 2)) == [1, 2, 6, 7]


def test_empty_closed_ledger_has_an_empty_fragment() -> None:
    md = _ledger(((0, ("a", "b", "c")),), closed_at=-1)
    (fragment,) = fragments_on(md, {"a"})
    assert not fragment.open_tail and list(fragment_entries(fragment, 3, 3)) == []


def test_replace_in_segment_swaps_one_slot_of_one_segment() -> None:
    md = _ledger(((0, ("a", "b", "c")), (100, ("a", "d", "c"))), closed_at=149)
    updated = replace_in_segment(md, 100, 0, "a", "e")
    assert updated is not None
    assert updated.ensembles == ((0, ("a", "b", "c")), (100, ("e", "d", "c")))
    assert updated.state is LedgerState.CLOSED and updated.last_entry_id == 149
    assert replace_in_segment(updated, 100, 0, "a", "f") is None  # Moved already.
    with pytest.raises(ReplicationError, match="already in the segment"):
        replace_in_segment(md, 0, 0, "a", "b")


def test_key_matches_uses_the_clients_password_hash() -> None:
    md = _ledger(((0, ("a", "b", "c")),)).replace(password_hash=password_hash(b"secret", 7))
    assert key_matches(md, master_key(b"secret", md.ledger_id))
    assert not key_matches(md, master_key(b"other", md.ledger_id))
