"""`Replicator.fill_ledger_in_place`, the real code (copier, ledger check) over SQLite metadata
and in-memory bookies: a mark is completed only when the bookie it filled is seen to hold every
entry afterwards. A fill that went through while the bookie still lacks an entry (its storage
acknowledged an add it did not keep), or whose bookie cannot give its entry list (the ledger in
limbo there), fails the ledger instead of being taken on faith."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from bkaio.autorecovery import AutorecoveryMetrics, ReplicationError
from bkaio.autorecovery.cluster import ClusterView, MasterKeys
from bkaio.autorecovery.replicator import Replicator
from bkaio.entrylog.reading import entry_ranges
from bkaio.errors import DataUnknownError
from bkaio.ledger_client.types import AddCallback, StoredCopy
from bkaio.meta import LedgerMetadata, Metadata
from bkaio.protocol.digest import entry_digest
from tests.unit.ledger_client.fakes import FakeBookie, FakeBookieOps

KEY = b"fill-in-place-test-key"
BOOKIES = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")
ENTRIES = 10
SHORT_AFTER = 5  # The short bookie holds entries 0..4 only.


class FakeBookiePool(FakeBookieOps):
    """`FakeBookieOps` with what autorecovery asks of the wire `BookiePool` on top of the
    `BookieOps` seam: `list_entries` (LIST_ENTRIES; DataUnknownError for a ledger in limbo,
    as a real bookie answers). `dropped` (bookie, ledger, entry) stands for a bookie's storage
    that acknowledges an add and does not keep it."""

    def __init__(self, bookies: list[FakeBookie]) -> None:
        super().__init__(bookies)
        self.dropped: set[tuple[str, int, int]] = set()

    def add_entry(
        self,
        bookie_id: str,
        ledger_id: int,
        entry_id: int,
        *,
        recovery: bool,
        master_key: bytes,
        lac: int,
        length: int,
        digest: int,
        payload: bytes,
        callback: AddCallback,
    ) -> None:
        if (bookie_id, ledger_id, entry_id) in self.dropped:
            asyncio.get_running_loop().call_soon(callback, None)  # "OK", and nothing kept.
            return
        super().add_entry(
            bookie_id, ledger_id, entry_id, recovery=recovery, master_key=master_key, lac=lac,
            length=length, digest=digest, payload=payload, callback=callback,
        )  # fmt: skip

    async def list_entries(self, bookie_id: str, ledger_id: int) -> list[tuple[int, int]]:
        await self._gate(bookie_id)
        bookie = self.bookies[bookie_id]
        if ledger_id in bookie.limbo:
            raise DataUnknownError(f"{bookie_id}: ledger {ledger_id} is in limbo")
        ledger = bookie.ledgers.get(ledger_id)
        return entry_ranges(sorted(ledger.entries) if ledger is not None else [])


class FakeMasterKeysEveryBookieGives(MasterKeys):
    """MasterKeys whose every bookie answered with the ledger's key (no admin HTTP here)."""

    async def master_key(self, metadata: LedgerMetadata) -> bytes | None:
        return KEY


@dataclass
class Setup:
    replicator: Replicator
    pool: FakeBookiePool
    short: FakeBookie
    ledger_id: int


@pytest.fixture
async def setup(meta: Metadata) -> AsyncIterator[Setup]:
    """A closed E3/Qw3/Qa2 ledger of ENTRIES entries; its third bookie holds the first
    SHORT_AFTER only (the writer went on at Qa without it)."""
    md = await meta.ledgers.create(
        LedgerMetadata(ensemble_size=3, write_quorum=3, ack_quorum=2, ensembles=((0, BOOKIES),))
    )
    bookies = [FakeBookie(bookie_id) for bookie_id in BOOKIES]
    length = 0
    for entry_id in range(ENTRIES):
        payload = b"entry-%d" % entry_id
        length += len(payload)
        lac = entry_id - 1
        digest = entry_digest(md.ledger_id, entry_id, lac, length, payload)
        for bookie in bookies[: 2 if entry_id >= SHORT_AFTER else 3]:
            copy = StoredCopy(entry_id, lac, length, digest, payload)
            bookie.add(md.ledger_id, copy, KEY, recovery=False)
    await meta.ledgers.update(md.closed(ENTRIES - 1, length))
    pool = FakeBookiePool(bookies)
    replicator, view = await _replicator(meta, pool)
    try:
        yield Setup(replicator, pool, bookies[2], md.ledger_id)
    finally:
        await view.close()


async def _replicator(meta: Metadata, pool: FakeBookiePool) -> tuple[Replicator, ClusterView]:
    """The real Replicator, its view's pool replaced by `pool`; the caller closes the view."""
    view = ClusterView(meta)
    real_pool, view.pool = view.pool, pool  # type: ignore[assignment]  # The fake stands in.
    await real_pool.close()
    keys = FakeMasterKeysEveryBookieGives(view, "token")
    return Replicator(view, keys, AutorecoveryMetrics(CollectorRegistry())), view


def _held(bookie: FakeBookie, ledger_id: int) -> list[int]:
    return sorted(bookie.ledgers[ledger_id].entries)


async def test_a_fill_that_leaves_nothing_lacking_returns_what_it_copied(setup: Setup) -> None:
    entries, _ = await setup.replicator.fill_ledger_in_place(setup.ledger_id, [BOOKIES[2]])
    assert entries == ENTRIES  # Those it held are taken again as duplicates.
    assert _held(setup.short, setup.ledger_id) == list(range(ENTRIES))


async def test_a_fill_the_bookie_acknowledged_but_did_not_keep_fails_the_ledger(
    setup: Setup,
) -> None:
    """Every add of the fill was acknowledged, but entry 7 is not on the bookie: the entry list
    asked for after the fill shows it, and the ledger fails (its mark is not completed)."""
    setup.pool.dropped.add((BOOKIES[2], setup.ledger_id, 7))
    lacking = re.escape(f"entries still lacking {{'{BOOKIES[2]}': 1}}")
    with pytest.raises(ReplicationError, match=lacking) as raised:
        await setup.replicator.fill_ledger_in_place(setup.ledger_id, [BOOKIES[2]])
    assert raised.value.ledger_id == setup.ledger_id
    assert _held(setup.short, setup.ledger_id) == [0, 1, 2, 3, 4, 5, 6, 8, 9]  # The fill ran.


async def test_a_fill_whose_bookie_cannot_list_its_entries_fails_the_ledger(
    setup: Setup,
) -> None:
    """The bookie takes the copies (RECOVERY_ADD) but answers DATA_UNKNOWN for its entry list
    (the ledger in limbo there): no verdict, so the ledger fails too."""
    setup.short.limbo.add(setup.ledger_id)
    unknown = re.escape(f"entry lists not given {{'{BOOKIES[2]}': 'in_limbo: DataUnknownError")
    with pytest.raises(ReplicationError, match=unknown):
        await setup.replicator.fill_ledger_in_place(setup.ledger_id, [BOOKIES[2]])
    assert _held(setup.short, setup.ledger_id) == list(range(ENTRIES))


async def test_a_one_entry_ledger_is_filled(meta: Metadata) -> None:
    """A closed ledger whose only entry (id 0) one bookie lacks: the fill copies it. The
    30-minute soak found such ledgers never filled (a check for "has entries" took entry id 0
    for none) and, since the check after the fill, their marks never completed."""
    md = await meta.ledgers.create(
        LedgerMetadata(ensemble_size=3, write_quorum=3, ack_quorum=2, ensembles=((0, BOOKIES),))
    )
    bookies = [FakeBookie(bookie_id) for bookie_id in BOOKIES]
    payload = b"the only entry"
    digest = entry_digest(md.ledger_id, 0, -1, len(payload), payload)
    for bookie in bookies[:2]:
        bookie.add(md.ledger_id, StoredCopy(0, -1, len(payload), digest, payload), KEY, False)
    await meta.ledgers.update(md.closed(0, len(payload)))
    replicator, view = await _replicator(meta, FakeBookiePool(bookies))
    try:
        entries, _ = await replicator.fill_ledger_in_place(md.ledger_id, [BOOKIES[2]])
        assert entries == 1
        assert _held(bookies[2], md.ledger_id) == [0]
    finally:
        await view.close()
