"""The auditor's marking rules and schedule, on the embedded (SQLite) metadata driver."""

from __future__ import annotations

import asyncio

import pytest

from bkaio.autorecovery import Auditor, AutorecoveryMetrics
from bkaio.autorecovery.auditor import LeadershipUnconfirmedError
from bkaio.meta import (
    BookieInfo,
    BookieRegistration,
    LedgerMetadata,
    Metadata,
)
from tests.unit.autorecovery.fake_leases import FakeLockLease
from tests.unit.autorecovery.test_bad_underreplication_records import FakeLedgerCheckerFindingGaps


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


def _auditor(
    meta: Metadata,
    clock: FakeClock,
    delay: float = 10.0,
    metrics: AutorecoveryMetrics | None = None,
) -> Auditor:
    return Auditor(
        meta,
        metrics or AutorecoveryMetrics(),
        lease=FakeLockLease(),
        lost_bookie_delay_seconds=delay,
        audit_interval_seconds=60.0,
        clock=clock,
    )


def _value(metrics: AutorecoveryMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


async def _marks(meta: Metadata) -> list[tuple[int, tuple[str, ...]]]:
    return [(m.ledger_id, m.missing_bookies) async for m in meta.underreplication.list()]


async def _incomplete(meta: Metadata, ledger_id: int) -> tuple[str, ...] | None:
    record = await meta.underreplication.get(ledger_id)
    return None if record is None else record.incomplete_bookies


B1, B2, B3, B4 = (f"127.0.0.1:{port}" for port in (3181, 3182, 3183, 3184))


async def test_ledgers_of_a_lost_bookie_are_marked_after_the_delay(meta: Metadata) -> None:
    registrations = [await _register(meta, port) for port in (3181, 3182, 3183)]
    first = await _ledger(meta, (B1, B2, B3))
    clock = FakeClock()
    auditor = _auditor(meta, clock)
    assert (await auditor.audit_once()).lost_bookies == ()
    await registrations[2].deregister()
    report = await auditor.audit_once()
    assert report.lost_bookies == (B3,) and report.ledgers_marked == 0
    assert report.waiting_bookies == (B3,)
    clock.now += 10.0
    assert (await auditor.audit_once()).ledgers_marked == 1
    assert await _marks(meta) == [(first, (B3,))]
    for registration in registrations[:2]:
        await registration.deregister()


async def test_bookie_back_within_the_delay_is_not_marked(meta: Metadata) -> None:
    registration = await _register(meta, 3191)
    await _ledger(meta, ("127.0.0.1:3191", "127.0.0.1:3192", "127.0.0.1:3193"))
    clock = FakeClock()
    auditor = _auditor(meta, clock, delay=5.0)
    await auditor.audit_once()  # 3192 and 3193 never registered: lost since now.
    await registration.deregister()
    registration = await _register(meta, 3191)
    clock.now += 3.0
    report = await auditor.audit_once()
    assert "127.0.0.1:3191" not in report.lost_bookies and report.ledgers_marked == 0
    clock.now += 3.0
    report = await auditor.audit_once()  # 3192 and 3193: past the delay now.
    assert report.ledgers_marked == 1
    marks = [record async for record in meta.underreplication.list()]
    assert marks[0].missing_bookies == ("127.0.0.1:3192", "127.0.0.1:3193")
    await registration.deregister()


async def test_marked_ledgers_are_counted_once_and_no_wakeup_is_due_after_marking(
    meta: Metadata,
) -> None:
    """Defect 1: after the delay the next audit was due every 0.01 s and every scan counted
    every ledger again (630 marks for 15 ledgers)."""
    registrations = [await _register(meta, port) for port in (3181, 3182)]
    for _ in range(5):
        await _ledger(meta, (B1, B2, B3))
    clock = FakeClock()
    metrics = AutorecoveryMetrics()
    auditor = _auditor(meta, clock, delay=10.0, metrics=metrics)
    await auditor.audit_once()
    assert auditor.next_wait() == pytest.approx(10.0)  # B3's delay ends then.
    clock.now += 10.0
    assert (await auditor.audit_once()).ledgers_marked == 5
    assert auditor.next_wait() == pytest.approx(60.0)  # Only the periodic audit is left.
    for _ in range(3):
        clock.now += 1.0
        report = await auditor.audit_once()
        assert report.ledgers_marked == 0 and report.under_replicated == 5
    assert _value(metrics, "bkaio_autorecovery_ledgers_marked_total") == 5
    assert _value(metrics, "bkaio_autorecovery_under_replicated_ledgers") == 5
    for registration in registrations:
        await registration.deregister()


async def test_the_audit_loop_does_not_spin_after_the_delay(meta: Metadata) -> None:
    """The running loop, on the real clock: a lost bookie past a short delay is marked by one
    audit, and nothing else happens until something changes."""
    registrations = [await _register(meta, port) for port in (3181, 3182)]
    for _ in range(3):
        await _ledger(meta, (B1, B2, B3))
    metrics = AutorecoveryMetrics()
    auditor = Auditor(
        meta,
        metrics,
        lease=FakeLockLease(),
        lost_bookie_delay_seconds=0.3,
        audit_interval_seconds=3600.0,
    )
    task = asyncio.create_task(auditor.run())
    try:
        for _ in range(100):
            if len(await _marks(meta)) == 3:
                break
            await asyncio.sleep(0.05)
        assert len(await _marks(meta)) == 3
        audits_then = sum(
            _value(metrics, "bkaio_autorecovery_audits_total", reason=reason)
            for reason in ("elected", "scheduled")
        )
        await asyncio.sleep(1.5)
        audits_now = sum(
            _value(metrics, "bkaio_autorecovery_audits_total", reason=reason)
            for reason in ("elected", "scheduled")
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert audits_then <= 3  # Elected, then one when the delay ran out (at most one more).
    assert audits_now == audits_then  # The old loop audited about 100 times a second here.
    assert _value(metrics, "bkaio_autorecovery_ledgers_marked_total") == 3
    for registration in registrations:
        await registration.deregister()


async def test_marks_are_dropped_or_narrowed_when_bookies_come_back(meta: Metadata) -> None:
    """Defect 3: a mark kept the bookies missing when it was written; now each audit keeps
    only the bookies still lost."""
    registrations = [await _register(meta, port) for port in (3181, 3182)]
    both = await _ledger(meta, (B1, B3, B4))
    one = await _ledger(meta, (B1, B2, B3))
    clock = FakeClock()
    auditor = _auditor(meta, clock, delay=0.0)
    await auditor.audit_once()
    assert await _marks(meta) == [(both, (B3, B4)), (one, (B3,))]
    back = await _register(meta, 3183)
    report = await auditor.audit_once()
    assert report.marks_narrowed == 1 and report.marks_dropped == 1
    assert await _marks(meta) == [(both, (B4,))]
    for registration in [*registrations, back]:
        await registration.deregister()


async def test_marks_of_deleted_or_moved_ledgers_are_dropped(meta: Metadata) -> None:
    registrations = [await _register(meta, port) for port in (3181, 3182, 3184)]
    gone = await _ledger(meta, (B1, B2, B3))
    moved = await _ledger(meta, (B1, B2, B3))
    auditor = _auditor(meta, FakeClock(), delay=0.0)
    await auditor.audit_once()
    assert len(await _marks(meta)) == 2
    await meta.ledgers.delete(gone)
    md = await meta.ledgers.get(moved)
    await meta.ledgers.update(md.replace(ensembles=((0, (B1, B2, B4)),)))
    report = await auditor.audit_once()
    assert report.marks_dropped == 2 and await _marks(meta) == []
    for registration in registrations:
        await registration.deregister()


async def test_a_locked_mark_is_left_to_its_worker(meta: Metadata) -> None:
    registrations = [await _register(meta, port) for port in (3181, 3182)]
    ledger = await _ledger(meta, (B1, B2, B3))
    auditor = _auditor(meta, FakeClock(), delay=0.0)
    await auditor.audit_once()
    lease = await meta.store.grant_lease(30.0)
    claimed = await meta.underreplication.claim(ledger, lease, owner="worker")
    assert claimed is not None
    back = await _register(meta, 3183)
    await auditor.audit_once()
    assert await _marks(meta) == [(ledger, (B3,))]  # The worker re-checks before copying.
    await meta.underreplication.release(ledger)
    await auditor.audit_once()
    assert await _marks(meta) == []
    await lease.revoke()
    for registration in [*registrations, back]:
        await registration.deregister()


async def test_forced_and_decommissioned_bookies_stay_missing_while_alive(meta: Metadata) -> None:
    registrations = [await _register(meta, port) for port in (3181, 3182, 3183, 3184)]
    forced = await _ledger(meta, (B1, B2, B3))
    drained = await _ledger(meta, (B1, B2, B4))
    await meta.underreplication.mark(forced, [B3], forced=True)
    await meta.decommissioned.add(B4)
    auditor = _auditor(meta, FakeClock(), delay=3600.0)
    report = await auditor.audit_once()
    assert report.lost_bookies == (B4,) and report.ledgers_marked == 1  # No delay for B4.
    assert await _marks(meta) == [(forced, (B3,)), (drained, (B4,))]
    for registration in registrations:
        await registration.deregister()


async def test_an_audit_request_skips_the_delay_and_the_metadata_delay_wins(
    meta: Metadata,
) -> None:
    registrations = [await _register(meta, port) for port in (3181, 3182)]
    await _ledger(meta, (B1, B2, B3))
    clock = FakeClock()
    auditor = _auditor(meta, clock, delay=3600.0)
    assert (await auditor.audit_once()).waiting_bookies == (B3,)
    await meta.underreplication.set_lost_bookie_delay(5.0)
    clock.now += 2.0
    report = await auditor.audit_once()
    assert report.lost_bookie_delay_seconds == 5.0 and report.ledgers_marked == 0
    assert auditor.next_wait() == pytest.approx(3.0)
    report = await auditor.audit_once(skip_delay=True)
    assert report.ledgers_marked == 1
    for registration in registrations:
        await registration.deregister()


async def test_the_running_auditor_follows_requests_and_delay_changes(meta: Metadata) -> None:
    registrations = [await _register(meta, port) for port in (3181, 3182)]
    await _ledger(meta, (B1, B2, B3))
    metrics = AutorecoveryMetrics()
    auditor = Auditor(
        meta,
        metrics,
        lease=FakeLockLease(),
        lost_bookie_delay_seconds=3600.0,
        audit_interval_seconds=3600.0,
    )
    task = asyncio.create_task(auditor.run())
    try:
        await asyncio.sleep(0.5)
        assert await _marks(meta) == []
        await meta.underreplication.request_audit()
        for _ in range(100):
            if await _marks(meta):
                break
            await asyncio.sleep(0.05)
        assert await _marks(meta) != []
        assert _value(metrics, "bkaio_autorecovery_audits_total", reason="requested") == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    for registration in registrations:
        await registration.deregister()


async def test_a_stopped_auditor_leaves_no_task_behind(meta: Metadata) -> None:
    # The control watch waits on a queue in a task of its own; stopping the auditor there left
    # that task pending, and its destruction later reached the loop's exception handler.
    before = asyncio.all_tasks()
    auditor = Auditor(
        meta,
        AutorecoveryMetrics(),
        lease=FakeLockLease(),
        lost_bookie_delay_seconds=3600.0,
        audit_interval_seconds=3600.0,
    )
    task = asyncio.create_task(auditor.run())
    for _ in range(1000):  # Until the control watch waits for its first event.
        await asyncio.sleep(0.01)
        if any("Queue.get" in repr(t.get_coro()) for t in asyncio.all_tasks()):
            break
    else:
        raise AssertionError("the control watch never waited on its queue")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(0)  # A cancelled task ends at its next step.
    left = [t for t in asyncio.all_tasks() - before if not t.done()]
    assert [t for t in left if "Queue.get" in repr(t.get_coro())] == []


async def test_incomplete_bookies_stay_marked_while_named_registered_or_not(
    meta: Metadata,
) -> None:
    """A live bookie the ledger check found short stays marked (a worker fills it in) while the
    ledger names it, even while it is not registered: a bookie re-registering after a lost
    lease still lacks its entries when it is back (it was dropped then, and its entries were
    forgotten until the next ledger check, a day later by default). Gone for good, it is also
    marked missing after the delay; a ledger that no longer names it drops it."""
    registrations = [await _register(meta, port) for port in (3181, 3182, 3183)]
    first = await _ledger(meta, (B1, B2, B3))
    second = await _ledger(meta, (B1, B2, B3))
    await meta.underreplication.mark(first, [B3], incomplete=True)
    await meta.underreplication.mark(second, [B2], incomplete=True)
    clock = FakeClock()
    auditor = _auditor(meta, clock, delay=60.0)
    await auditor.audit_once()
    marks = {m.ledger_id: m async for m in meta.underreplication.list()}
    assert marks[first].incomplete_bookies == (B3,) and marks[first].missing_bookies == ()
    await registrations[2].deregister()  # B3 not registered now (within the delay).
    md = await meta.ledgers.get(second)
    await meta.ledgers.update(md.replace(ensembles=((0, (B1, B4, B3)),)))  # B2 moved off.
    report = await auditor.audit_once()
    assert report.marks_dropped == 1
    assert await _marks(meta) == [(first, ())]
    assert await _incomplete(meta, first) == (B3,)
    registrations[2] = await _register(meta, 3183)  # Back: still short, still marked.
    await auditor.audit_once()
    assert await _incomplete(meta, first) == (B3,)
    await registrations[2].deregister()  # Gone for good: also missing after the delay.
    await auditor.audit_once()
    clock.now += 61.0
    await auditor.audit_once()
    record = await meta.underreplication.get(first)
    assert record is not None and B3 in record.missing_bookies
    assert record.incomplete_bookies == (B3,)
    for registration in registrations[:2]:
        await registration.deregister()


@pytest.mark.parametrize("store_keeps_it", [True, False])
@pytest.mark.parametrize("write", ["mark", "mark update"])
async def test_an_audit_writes_only_while_the_store_confirms_the_auditors_lease(
    meta: Metadata, write: str, store_keeps_it: bool
) -> None:
    """The auditor's loop stalls past its lease's TTL mid-audit (just after reading the
    registry): the store may have dropped the lease and elected another candidate, yet the
    audit marked a lost bookie's ledger, or dropped the mark of a bookie that came back, as
    `lost` was still false. It waits for the late refresh now: writes when the store confirms
    the lease; writes nothing and fails the pass (retried) when it does not."""
    registrations = [await _register(meta, port) for port in (3181, 3182, 3184)]
    if write == "mark":
        ledger = await _ledger(meta, (B1, B2, B3))  # B3 is lost.
    else:
        ledger = await _ledger(meta, (B1, B2, B4))
        await meta.underreplication.mark(ledger, [B2])  # B2 is registered: a stale mark.
    lease = FakeLockLease()
    lease.verdict = store_keeps_it
    auditor = Auditor(
        meta,
        AutorecoveryMetrics(),
        lease=lease,
        lost_bookie_delay_seconds=0.0,
        audit_interval_seconds=60.0,
        clock=FakeClock(),
    )
    ids = meta.bookies.ids

    async def ids_then_the_loop_stalls() -> set[str]:
        registered = await ids()
        lease.doubt = True
        return registered

    meta.bookies.ids = ids_then_the_loop_stalls  # type: ignore[method-assign]
    before = await _marks(meta)
    if store_keeps_it:
        report = await auditor.audit_once()
        assert (report.ledgers_marked, report.marks_dropped) == (
            (1, 0) if write == "mark" else (0, 1)
        )
        assert await _marks(meta) == ([(ledger, (B3,))] if write == "mark" else [])
    else:
        with pytest.raises(LeadershipUnconfirmedError, match="lease is lost or unconfirmed"):
            await auditor.audit_once()
        assert await _marks(meta) == before
    assert lease.waits == 1
    for registration in registrations:
        await registration.deregister()


async def test_the_ledger_check_marks_nothing_on_a_lease_the_store_dropped(
    meta: Metadata,
) -> None:
    """The ledger check finds a bookie lacking entries while the auditor's lease is in doubt,
    and the late refresh finds it gone: no incomplete mark is written (another auditor may run
    the checks now)."""
    md = await meta.ledgers.create(
        LedgerMetadata(ensemble_size=1, write_quorum=1, ack_quorum=1, ensembles=((0, ("b:1",)),))
    )
    await meta.ledgers.update(md.closed(0, 1))
    lease = FakeLockLease()
    lease.doubt, lease.verdict = True, False
    auditor = Auditor(
        meta,
        AutorecoveryMetrics(),
        lease=lease,
        lost_bookie_delay_seconds=0.0,
        audit_interval_seconds=60.0,
        checker=FakeLedgerCheckerFindingGaps(),
        ledger_check_interval_seconds=86400.0,
    )
    with pytest.raises(LeadershipUnconfirmedError):
        await auditor.check_ledgers()
    assert await _marks(meta) == [] and lease.waits == 1
