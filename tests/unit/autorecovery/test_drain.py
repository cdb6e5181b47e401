"""`recover_bookie` (the drain), the real code over SQLite metadata: its ledgers are closed and
empty, so moving them needs no bookie to copy from (only the registry, placement and the
metadata), and what is tested is the drain's own bookkeeping."""

from __future__ import annotations

import pytest

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


@pytest.mark.parametrize("step", ["swap", "mark removal"])
async def test_a_drain_takes_no_step_on_a_lease_the_store_did_not_confirm(
    meta: Metadata, step: str
) -> None:
    """The drain's lease is in doubt when its first ledger is ready to be swapped, or (the
    swap made) its mark to be dropped: its loop stalled past the TTL, and the late refresh
    finds the lease gone: the store has dropped the lock, which another worker may hold now.
    The drain went on regardless (it looked only at `lost`, before each round); now that step
    is not taken and the ledger is given back: moved in a later round under a new lease, or,
    already off the bookie, left marked for the workers."""
    registrations = [await _register(meta, bookie_id) for bookie_id in (A, C, D)]
    for _ in range(3):  # Closed, empty, on A and the dead B.
        md = await meta.ledgers.create(
            LedgerMetadata(ensemble_size=2, write_quorum=2, ack_quorum=2, ensembles=((0, (A, B)),))
        )
        await meta.ledgers.update(md.closed(-1, 0))
    claim, release = meta.underreplication.claim, meta.underreplication.release
    refused: list[int] = []  # The ledger whose step found the lease gone.
    checks_before = 1 if step == "mark removal" else 0  # The swap's check comes first.
    at_release: list[tuple[bool, bool]] = []  # That ledger: (still on B, still marked).

    async def claim_with_a_lease_the_store_drops(
        ledger_id: int, lease: Lease, *, owner: str = ""
    ) -> UnderreplicatedLedger | None:
        claimed = await claim(ledger_id, lease, owner=owner)
        if claimed is not None and not refused:
            checks: list[int] = []

            async def the_late_refresh_finds_it_gone() -> bool:
                if len(checks) < checks_before:
                    checks.append(ledger_id)
                    return True
                refused.append(ledger_id)
                await lease.revoke()  # Lost: the store dropped it (and the lock).
                return False

            lease.wait_confirmed = the_late_refresh_finds_it_gone  # type: ignore[method-assign]
        return claimed

    async def recorded_release(ledger_id: int, lock_version: int | None = None) -> bool:
        if refused == [ledger_id] and not at_release:
            on_b = ledger_id in {md.ledger_id for md in await ledgers_naming(meta, B)}
            marked = await meta.underreplication.get(ledger_id) is not None
            at_release.append((on_b, marked))
        return await release(ledger_id, lock_version)

    meta.underreplication.claim = claim_with_a_lease_the_store_drops  # type: ignore[method-assign]
    meta.underreplication.release = recorded_release  # type: ignore[method-assign]
    try:
        report = await recover_bookie(meta, B, timeout_seconds=10.0, concurrency=1)
    finally:
        for registration in registrations:
            await registration.deregister()

    assert len(refused) == 1
    # Not swapped (the swap refused) or swapped (the mark removal refused); still marked.
    assert at_release == [(step == "swap", True)]
    assert report.failed == {} and await ledgers_naming(meta, B) == []
    if step == "swap":
        assert report.ledgers_replicated == 3  # Moved in a later round, under a new lease.
    else:  # Off B already: its mark is left to the workers (who find nothing to move).
        assert report.ledgers_replicated == 2
        assert await meta.underreplication.get(refused[0]) is not None
