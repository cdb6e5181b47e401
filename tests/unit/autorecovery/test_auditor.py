"""The auditor's marking rules, on the embedded (SQLite) metadata driver: no network."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bkaio.autorecovery import Auditor, AutorecoveryMetrics
from bkaio.meta import (
    BookieInfo,
    BookieRegistration,
    LedgerMetadata,
    Metadata,
    initialise_cluster_at,
    open_metadata,
)


@pytest.fixture
async def meta(tmp_path: Path) -> AsyncIterator[Metadata]:
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    await initialise_cluster_at(uri)
    metadata = await open_metadata(uri)
    try:
        yield metadata
    finally:
        await metadata.close()


async def _register(meta: Metadata, port: int) -> BookieRegistration:
    return await meta.bookies.register(BookieInfo.for_address("127.0.0.1", port), 30.0)


async def _ledger(meta: Metadata, ensemble: tuple[str, ...]) -> int:
    md = await meta.ledgers.create(
        LedgerMetadata(ensemble_size=3, write_quorum=3, ack_quorum=2, ensembles=((0, ensemble),))
    )
    return md.ledger_id


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_ledgers_of_a_lost_bookie_are_marked_after_the_delay(meta: Metadata) -> None:
    registrations = [await _register(meta, port) for port in (3181, 3182, 3183)]
    first = await _ledger(meta, ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183"))
    clock = FakeClock()
    auditor = Auditor(
        meta,
        AutorecoveryMetrics(),
        lost_bookie_delay_seconds=10.0,
        audit_interval_seconds=60.0,
        clock=clock,
    )
    assert (await auditor.audit_once()).lost_bookies == ()
    await registrations[2].deregister()
    report = await auditor.audit_once()
    assert report.lost_bookies == ("127.0.0.1:3183",) and report.ledgers_marked == 0
    assert report.waiting_bookies == ("127.0.0.1:3183",)
    clock.now += 10.0
    assert (await auditor.audit_once()).ledgers_marked == 1
    marks = [record async for record in meta.underreplication.list()]
    assert [(m.ledger_id, m.missing_bookies) for m in marks] == [(first, ("127.0.0.1:3183",))]
    for registration in registrations[:2]:
        await registration.deregister()


async def test_bookie_back_within_the_delay_is_not_marked(meta: Metadata) -> None:
    registration = await _register(meta, 3191)
    await _ledger(meta, ("127.0.0.1:3191", "127.0.0.1:3192", "127.0.0.1:3193"))
    clock = FakeClock()
    auditor = Auditor(
        meta,
        AutorecoveryMetrics(),
        lost_bookie_delay_seconds=5.0,
        audit_interval_seconds=60.0,
        clock=clock,
    )
    await auditor.audit_once()  # 3192 and 3193 never registered: lost since now.
    await registration.deregister()
    registration = await _register(meta, 3191)
    clock.now += 3.0
    report = await auditor.audit_once()
    assert "127.0.0.1:3191" not in report.lost_bookies and report.ledgers_marked == 0
    clock.now += 3.0
    report = await auditor.audit_once()  # 3192 and 3193: past the delay now.
    assert report.ledgers_marked == 2
    marks = [record async for record in meta.underreplication.list()]
    assert marks[0].missing_bookies == ("127.0.0.1:3192", "127.0.0.1:3193")
    await registration.deregister()
