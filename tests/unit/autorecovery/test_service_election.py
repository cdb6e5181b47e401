"""`AutorecoveryService`'s election over SQLite metadata: an auditor that loses its election in
the middle of an audit stops that audit (it marks nothing more) and stands again; the one
elected next audits from the start."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from bkaio.autorecovery import AutorecoveryMetrics
from bkaio.autorecovery.service import AutorecoveryService
from bkaio.config import AutorecoveryConfig
from bkaio.meta import LedgerMetadata, Metadata
from bkaio.meta.autorecovery import AuditorLeadership, MarkResult

LOST = ("127.0.0.1:3998", "127.0.0.1:3999")  # Never registered.


async def test_an_auditor_losing_its_election_mid_audit_stops_and_stands_again(
    meta: Metadata,
) -> None:
    ledger_ids = []
    for _ in range(2):  # Closed, empty, on two bookies that are not registered.
        md = await meta.ledgers.create(
            LedgerMetadata(ensemble_size=2, write_quorum=2, ack_quorum=2, ensembles=((0, LOST),))
        )
        await meta.ledgers.update(md.closed(-1, 0))
        ledger_ids.append(md.ledger_id)
    leaderships: list[AuditorLeadership] = []
    run_for_auditor = meta.auditor.run_for_auditor

    async def recorded_election(bookie_id: str, ttl_seconds: float = 10.0) -> AuditorLeadership:
        leadership = await run_for_auditor(bookie_id, ttl_seconds)
        leaderships.append(leadership)
        return leadership

    meta.auditor.run_for_auditor = recorded_election  # type: ignore[method-assign]
    mark = meta.underreplication.mark
    in_first_mark = asyncio.Event()
    first_mark_cancelled = asyncio.Event()
    marked_by: list[tuple[int, int]] = []  # (ledger, election) of each mark written.
    all_marked = asyncio.Event()

    async def first_mark_blocks(ledger_id: int, bookies: object, **kwargs: bool) -> MarkResult:
        if not in_first_mark.is_set():
            in_first_mark.set()
            try:
                await asyncio.Event().wait()  # Until the lost election cancels the audit.
            except asyncio.CancelledError:
                first_mark_cancelled.set()
                raise
        marked_by.append((ledger_id, len(leaderships)))
        result = await mark(ledger_id, bookies, **kwargs)  # type: ignore[arg-type]
        if {ledger for ledger, _ in marked_by} == set(ledger_ids):
            all_marked.set()
        return result

    meta.underreplication.mark = first_mark_blocks  # type: ignore[method-assign]
    config = AutorecoveryConfig(
        lost_bookie_delay_seconds=0.0,
        ledger_check_interval_seconds=0.0,
        auditor_lease_ttl_seconds=5.0,
        poll_interval_seconds=60.0,  # The worker: nothing here for it to do.
    )
    service = AutorecoveryService(
        meta, owner="test-auditor", config=config, metrics=AutorecoveryMetrics(CollectorRegistry())
    )
    await service.start()
    try:
        async with asyncio.timeout(30):
            await in_first_mark.wait()
            assert len(leaderships) == 1
            first = service.auditor
            # Its lease lapses (the keep-alive finds it gone): the key goes with it.
            await leaderships[0].lease.revoke()
            await first_mark_cancelled.wait()
            await all_marked.wait()
        assert len(leaderships) == 2 and service.auditor is not first
        assert all(election == 2 for _, election in marked_by)  # None by the lost auditor.
        assert await meta.auditor.who_is_auditor() == "test-auditor"
    finally:
        await service.close()
    for ledger_id in ledger_ids:
        record = await meta.underreplication.get(ledger_id)
        assert record is not None and record.missing_bookies == LOST
