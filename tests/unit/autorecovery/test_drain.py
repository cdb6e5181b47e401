"""`recover_bookie` (the drain), the real code over SQLite metadata: its ledgers are closed and
empty, so moving them needs no bookie to copy from (only the registry, placement and the
metadata), and what is tested is the drain's own bookkeeping."""

from __future__ import annotations

from bkaio.autorecovery import recover_bookie
from bkaio.autorecovery.auditor import ledgers_naming
from bkaio.meta import BookieInfo, BookieRegistration, Lease, Metadata, UnderreplicatedLedger
from bkaio.meta.ledger_metadata import LedgerMetadata

A, B, C, D = (f"127.0.0.1:{port}" for port in range(3181, 3185))


async def _register(meta: Metadata, bookie_id: str) -> BookieRegistration:
    host, port = bookie_id.split(":")
    return await meta.bookies.register(BookieInfo.for_address(host, int(port)), 30.0)


async def test_a_drain_whose_lease_was_lost_takes_a_new_one(meta: Metadata) -> None:
    """The drain claims each ledger with a lock bound to one lease, granted at its start. That
    lease was lost (its keep-alive found it expired: the store unreachable for a TTL) just as
    the drain began: every later claim was refused, the drain never took a new lease, and
    after its whole timeout it gave up every ledger ("no attempt succeeded"). It takes a new
    one now and moves them."""
    registrations = [await _register(meta, bookie_id) for bookie_id in (A, C, D)]
    for _ in range(3):  # Closed, empty, on A and the dead B.
        md = await meta.ledgers.create(
            LedgerMetadata(ensemble_size=2, write_quorum=2, ack_quorum=2, ensembles=((0, (A, B)),))
        )
        await meta.ledgers.update(md.closed(-1, 0))
    claim = meta.underreplication.claim
    lost: list[Lease] = []

    async def claim_losing_the_lease(
        ledger_id: int, lease: Lease, *, owner: str = ""
    ) -> UnderreplicatedLedger | None:
        if not lost:  # The first claim finds the lease gone (and the keep-alive says so).
            lost.append(lease)
            await lease.revoke()
        return await claim(ledger_id, lease, owner=owner)

    meta.underreplication.claim = claim_losing_the_lease  # type: ignore[method-assign]
    try:
        report = await recover_bookie(meta, B, timeout_seconds=3.0, concurrency=1)
    finally:
        for registration in registrations:
            await registration.deregister()

    assert lost
    assert report.failed == {}
    assert report.ledgers_replicated == 3
    assert await ledgers_naming(meta, B) == []
