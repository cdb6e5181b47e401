"""The replication worker's claim loop against a fake replicator, on SQLite metadata (its
bookie registry is real: registrations with leases): a ledger that cannot be copied gives its
lock back, is backed off and does not stop the others; marks whose bookies are back are dropped
without copying; the registry, not the replicator's watch-fed view, says which bookies exist;
a mark is never completed over an incomplete bookie that could not be filled; a mark is dropped
only while the store certainly holds the lease of its lock; a bug restarts the worker under its
supervisor."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection

import pytest
from prometheus_client import CollectorRegistry

import bkaio.meta.autorecovery
from bkaio.autorecovery import (
    AutorecoveryMetrics,
    LedgerReplication,
    Outcome,
    ReplicationError,
    ReplicationWorker,
)
from bkaio.errors import BKError
from bkaio.meta import (
    BookieInfo,
    BookieRegistration,
    Lease,
    Metadata,
    UnderreplicatedLedger,
    sqlite_database,
)
from bkaio.meta.autorecovery import LOCKS_PREFIX
from bkaio.meta.ledger_metadata import now_ms as real_now_ms
from bkaio.supervision import Restart, Supervisor
from tests.unit.meta.test_lease_late_refresh import FakeStoreClock


class FakeReplicator:
    """Stands in for `Replicator` (its whole interface the worker and the drain use:
    `registered`, `replicate_ledger`, `fill_ledger_in_place`); `registered` is a watch-fed
    view that may lag; fails the ledgers in `failing`, raises `bug` once if set."""

    def __init__(self, registered: set[str], failing: set[int]) -> None:
        self._registered = registered
        self.failing = failing
        self.calls: list[int] = []
        self.fills: list[tuple[int, list[str]]] = []
        self.bug: BaseException | None = None

    def registered(self) -> set[str]:
        return set(self._registered)

    async def fill_ledger_in_place(
        self, ledger_id: int, bookie_ids: Collection[str]
    ) -> tuple[int, int]:
        self.fills.append((ledger_id, sorted(bookie_ids)))
        if ledger_id in self.failing:
            raise ReplicationError(f"ledger {ledger_id}: still short", ledger_id=ledger_id)
        return 10, 100

    async def replicate_ledger(
        self,
        ledger_id: int,
        bookie_ids: Collection[str],
        *,
        recover_open_tail: bool,
        lock_lease: Lease,
    ) -> LedgerReplication:
        del bookie_ids, recover_open_tail, lock_lease
        self.calls.append(ledger_id)
        if self.bug is not None:
            bug, self.bug = self.bug, None
            raise bug
        if ledger_id in self.failing:
            raise ReplicationError(f"ledger {ledger_id}: entry 3 unreadable", ledger_id=ledger_id)
        return LedgerReplication(ledger_id, Outcome.DONE, 1, 10, 100, False, 0.01)


def _worker(
    meta: Metadata, replicator: FakeReplicator, metrics: AutorecoveryMetrics
) -> ReplicationWorker:
    return ReplicationWorker(
        meta,
        replicator,  # type: ignore[arg-type]  # The fake stands in for Replicator.
        metrics,
        owner="test-worker",
        lease_ttl_seconds=5.0,
        concurrency=1,
        retry_backoff_seconds=0.2,
        retry_backoff_max_seconds=0.8,
        poll_interval_seconds=0.1,
    )


async def _until(condition: Callable[[], Awaitable[bool]], seconds: float) -> None:
    for _ in range(int(seconds / 0.05)):
        if await condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {seconds} s")


async def test_a_failing_ledger_is_released_backed_off_and_others_go_on(meta: Metadata) -> None:
    """Defect 2: one failing copy ended the worker's loop for good."""
    await meta.underreplication.mark(1, [DEAD])
    await meta.underreplication.mark(2, [DEAD])
    replicator = FakeReplicator(registered=set(), failing={1})
    metrics = AutorecoveryMetrics()
    task = asyncio.create_task(_worker(meta, replicator, metrics).run())
    try:

        async def second_done() -> bool:
            return await meta.underreplication.get(2) is None

        await _until(second_done, 10.0)
        started = time.monotonic()

        async def retried() -> bool:
            return replicator.calls.count(1) >= 3

        await _until(retried, 10.0)
        assert not task.done()
        assert await meta.underreplication.get(1) is not None  # Still marked...
        held = 0
        for _ in range(10):  # ...and not held while the worker backs off.
            held += 1 in await meta.underreplication.locked()
            await asyncio.sleep(0.1)
        assert held <= 2, held
        tries = replicator.calls.count(1)
        # Retried with a growing backoff (0.2, 0.4, 0.8, 0.8 s ...), not in a tight loop.
        assert tries <= 3 + (time.monotonic() - started) / 0.2, replicator.calls
        replicator.failing.clear()

        async def first_done() -> bool:  # Counted once the mark is gone and the lock back.
            replicated = metrics.registry.get_sample_value(
                "bkaio_autorecovery_ledgers_replicated_total"
            )
            return replicated == 2 and await meta.underreplication.get(1) is None

        await _until(first_done, 10.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    registry = metrics.registry
    assert (
        registry.get_sample_value("bkaio_autorecovery_replication_failures_total") or 0
    ) >= tries
    assert registry.get_sample_value("bkaio_autorecovery_ledgers_replicated_total") == 2


BACK = "127.0.0.1:3181"
DEAD = "127.0.0.1:3999"


async def _register(meta: Metadata, bookie_id: str) -> BookieRegistration:
    host, port = bookie_id.rsplit(":", 1)
    return await meta.bookies.register(BookieInfo.for_address(host, int(port)), 30.0)


async def test_a_mark_whose_bookies_are_back_is_dropped_without_copying(meta: Metadata) -> None:
    """Back per the registry, although the replicator's view does not show it yet."""
    registration = await _register(meta, BACK)
    await meta.underreplication.mark(5, [BACK])
    await meta.underreplication.mark(6, [BACK, DEAD])
    await meta.underreplication.mark(7, [BACK], forced=True)
    replicator = FakeReplicator(registered=set(), failing=set())
    task = asyncio.create_task(_worker(meta, replicator, AutorecoveryMetrics()).run())
    try:

        async def all_done() -> bool:
            return [r async for r in meta.underreplication.list()] == []

        await _until(all_done, 10.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await registration.deregister()
    assert sorted(replicator.calls) == [6, 7]  # 5 only named a bookie that is back.


async def test_an_incomplete_bookie_the_view_lags_on_is_filled_not_written_off(
    meta: Metadata,
) -> None:
    """Suspect 2 of the soak failure: a bookie registered (the registry says so) but not in the
    worker's watch-fed view (re-registering after a lost lease, a lagging watch) was dropped
    from the mark, and the mark completed without its entries copied."""
    registration = await _register(meta, BACK)
    await meta.underreplication.mark(11, [BACK], incomplete=True)
    replicator = FakeReplicator(registered=set(), failing=set())  # The view lags.
    task = asyncio.create_task(_worker(meta, replicator, AutorecoveryMetrics()).run())
    try:

        async def done() -> bool:
            return await meta.underreplication.get(11) is None

        await _until(done, 10.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await registration.deregister()
    assert replicator.fills == [(11, [BACK])]


async def test_a_mark_is_kept_while_an_incomplete_bookie_is_not_registered(
    meta: Metadata,
) -> None:
    """An incomplete bookie that is not registered now cannot be filled: the mark is given
    back (counted, backed off), never completed, and filled once the bookie is back. A fill
    that leaves entries lacking (the fake's `failing`) does not complete it either."""
    await meta.underreplication.mark(12, [BACK], incomplete=True)
    replicator = FakeReplicator(registered={BACK}, failing={12})  # The view says registered.
    metrics = AutorecoveryMetrics()
    task = asyncio.create_task(_worker(meta, replicator, metrics).run())
    registration = None
    try:

        async def kept_twice() -> bool:
            kept = metrics.registry.get_sample_value("bkaio_autorecovery_marks_kept_total")
            return (kept or 0) >= 2

        await _until(kept_twice, 10.0)
        assert replicator.fills == []  # Never filled, nor written off.
        record = await meta.underreplication.get(12)
        assert record is not None and record.incomplete_bookies == (BACK,)
        registration = await _register(meta, BACK)

        async def fill_failed() -> bool:
            return len(replicator.fills) >= 2

        await _until(fill_failed, 10.0)
        assert await meta.underreplication.get(12) is not None  # Still short: kept.
        replicator.failing.clear()

        async def done() -> bool:
            return await meta.underreplication.get(12) is None

        await _until(done, 10.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if registration is not None:
            await registration.deregister()


async def test_a_bug_in_the_worker_is_reported_and_the_worker_restarted(meta: Metadata) -> None:
    await meta.underreplication.mark(9, [DEAD])
    replicator = FakeReplicator(registered=set(), failing=set())
    replicator.bug = RuntimeError("a bug")
    registry = CollectorRegistry()
    supervisor = Supervisor("autorecovery", registry=registry)
    worker = _worker(meta, replicator, AutorecoveryMetrics(registry))
    supervisor.spawn("replication_worker", worker.run, Restart(initial_delay_seconds=0.05))
    try:

        async def done() -> bool:
            return await meta.underreplication.get(9) is None

        await _until(done, 10.0)
    finally:
        await supervisor.stop()
    (status,) = supervisor.statuses()
    assert status.failures == 1 and "a bug" in (status.last_error or "")
    assert (
        registry.get_sample_value("bkaio_task_failures_total", {"task": "replication_worker"}) == 1
    )


class FakeReplicatorOutlivingItsLock(FakeReplicator):
    """A first copy that outlives its worker's lock: meanwhile the worker's lease lapses (its
    lock goes; the worker has not noticed) and another worker claims the ledger. The copy then
    fails (`failing`) or succeeds."""

    def __init__(self, meta: Metadata, failing: set[int]) -> None:
        super().__init__(registered=set(), failing=failing)
        self._meta = meta
        self.other_lease: Lease | None = None

    async def replicate_ledger(
        self,
        ledger_id: int,
        bookie_ids: Collection[str],
        *,
        recover_open_tail: bool,
        lock_lease: Lease,
    ) -> LedgerReplication:
        if self.other_lease is None:
            await self._meta.underreplication.release(ledger_id)  # Gone with the lapsed lease.
            self.other_lease = await self._meta.store.grant_lease(30.0)
            taken = await self._meta.underreplication.claim(
                ledger_id, self.other_lease, owner="other-worker"
            )
            assert taken is not None
        return await super().replicate_ledger(
            ledger_id, bookie_ids, recover_open_tail=recover_open_tail, lock_lease=lock_lease
        )


@pytest.mark.parametrize("copy_fails", [True, False])
async def test_a_worker_whose_lock_lapsed_leaves_the_lock_another_worker_took(
    meta: Metadata, copy_fails: bool
) -> None:
    """A worker gave back (or, completing, dropped) the ledger's lock whoever held it: after
    its lease lapsed unnoticed during a copy, it deleted the lock another worker had taken
    since, so a third could claim the ledger beside the second, and a bookie's garbage
    collection holding that lock lost it."""
    await meta.underreplication.mark(13, [DEAD])
    replicator = FakeReplicatorOutlivingItsLock(meta, failing={13} if copy_fails else set())
    metrics = AutorecoveryMetrics()
    releases: list[bool] = []  # Each release's outcome, once it has happened.
    release = meta.underreplication.release

    async def recorded_release(ledger_id: int, lock_version: int | None = None) -> bool:
        released = await release(ledger_id, lock_version)
        releases.append(released)
        return released

    meta.underreplication.release = recorded_release  # type: ignore[method-assign]
    task = asyncio.create_task(_worker(meta, replicator, metrics).run())
    try:

        async def attempt_over() -> bool:
            if copy_fails:
                failures = metrics.registry.get_sample_value(
                    "bkaio_autorecovery_replication_failures_total"
                )
                return (failures or 0) >= 1
            return await meta.underreplication.get(13) is None  # Completed: its copy is done.

        await _until(attempt_over, 10.0)

        async def worker_released() -> bool:  # The lapse's own release first, then the worker's.
            return len(releases) >= 2

        await _until(worker_released, 10.0)
        await asyncio.sleep(0.2)  # Room for a retry to claim the ledger again (it must not).
        lock = await meta.store.get(f"{LOCKS_PREFIX}{13:020d}")
        assert lock is not None and lock.value.startswith(b"other-worker ")
        assert replicator.calls == [13]  # Not claimed again beside the other worker.
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if replicator.other_lease is not None:
            await replicator.other_lease.revoke()


class FakeReplicatorWithAnOpenTail(FakeReplicator):
    """The ledger's open tail names a missing bookie: DEFERRED unless told to recover it."""

    def __init__(self) -> None:
        super().__init__(registered=set(), failing=set())
        self.recover_open_tail: list[bool] = []

    async def replicate_ledger(
        self,
        ledger_id: int,
        bookie_ids: Collection[str],
        *,
        recover_open_tail: bool,
        lock_lease: Lease,
    ) -> LedgerReplication:
        self.calls.append(ledger_id)
        self.recover_open_tail.append(recover_open_tail)
        outcome = Outcome.DONE if recover_open_tail else Outcome.DEFERRED
        return LedgerReplication(ledger_id, outcome, 0, 0, 0, recover_open_tail, 0.01)


async def test_a_bookie_merged_into_an_old_mark_gets_its_own_open_ledger_grace(
    meta: Metadata, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ledger 14 has been marked for an hour (DEAD's fragment of an earlier segment cannot be
    copied: an entry lost everywhere). Now the bookie of its open tail dies and the audit merges
    it into that mark, which keeps its age. The worker measured the open ledger's grace from the
    mark's age, so it fenced the live writer at its first claim, before the writer could move
    off the bookie by its own ensemble change. The new bookie gets the grace now."""
    monkeypatch.setattr(bkaio.meta.autorecovery, "now_ms", lambda: real_now_ms() - 3_600_000)
    await meta.underreplication.mark(14, [DEAD])  # An hour ago.
    monkeypatch.setattr(bkaio.meta.autorecovery, "now_ms", real_now_ms)
    tail = "127.0.0.1:3998"
    merged = await meta.underreplication.mark(14, [tail])
    assert merged.record.missing_bookies == (tail, DEAD)
    assert real_now_ms() - merged.record.ctime_ms >= 3_600_000  # The merge keeps its age.
    replicator = FakeReplicatorWithAnOpenTail()
    worker = ReplicationWorker(
        meta,
        replicator,  # type: ignore[arg-type]  # The fake stands in for Replicator.
        AutorecoveryMetrics(),
        owner="test-worker",
        concurrency=1,
        open_ledger_grace_seconds=30.0,
        poll_interval_seconds=0.1,
    )
    task = asyncio.create_task(worker.run())
    try:

        async def claimed() -> bool:
            return bool(replicator.calls)

        await _until(claimed, 10.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert replicator.recover_open_tail == [False]  # Left to its writer: skipped 30 s.
    assert await meta.underreplication.get(14) is not None


class FakeReplicatorStallingTheLoop(FakeReplicator):
    """Its copy blocks the event loop for 3 TTLs of the worker's lease (a GC pause, a starved
    CPU); with `store_drops_it` the store's clock passes the lease's expiry meanwhile."""

    def __init__(self, clock: FakeStoreClock, ttl: float, store_drops_it: bool) -> None:
        super().__init__(registered=set(), failing=set())
        self._clock = clock
        self._ttl = ttl
        self._store_drops_it = store_drops_it

    async def replicate_ledger(
        self,
        ledger_id: int,
        bookie_ids: Collection[str],
        *,
        recover_open_tail: bool,
        lock_lease: Lease,
    ) -> LedgerReplication:
        time.sleep(3 * self._ttl)  # noqa: ASYNC251  # The stall itself.
        if self._store_drops_it:
            self._clock.now += 3 * self._ttl
        return await super().replicate_ledger(
            ledger_id, bookie_ids, recover_open_tail=recover_open_tail, lock_lease=lock_lease
        )


@pytest.mark.parametrize("store_drops_it", [True, False])
async def test_a_mark_is_dropped_only_once_the_store_confirms_the_lease_after_a_stall(
    meta: Metadata, monkeypatch: pytest.MonkeyPatch, store_drops_it: bool
) -> None:
    """The loop stalled past the lease's TTL during the copy. The worker checked only `lost`,
    false until the keep-alive's late refresh answered, and dropped the mark at once: on a
    lease the store had dropped (its lock too: another worker may have claimed the ledger
    meanwhile). It waits for that answer now: drops the mark once the store confirms the lease,
    leaves it when the store says the lease is gone."""
    clock = FakeStoreClock()
    monkeypatch.setattr(sqlite_database, "time", clock)
    ttl = 0.2
    await meta.underreplication.mark(21, [DEAD])
    lease = await meta.store.grant_lease(ttl)
    lease.start_keep_alive()
    claimed = await meta.underreplication.claim(21, lease, owner="test-worker")
    assert claimed is not None
    replicator = FakeReplicatorStallingTheLoop(clock, ttl, store_drops_it)
    worker = _worker(meta, replicator, AutorecoveryMetrics())
    in_doubt_at_completion: list[bool] = []
    complete = meta.underreplication.complete

    async def recorded_complete(claimed: UnderreplicatedLedger) -> bool:
        in_doubt_at_completion.append(lease.in_doubt)
        return await complete(claimed)

    meta.underreplication.complete = recorded_complete  # type: ignore[method-assign]
    try:
        await worker._process(claimed, lease)
    finally:
        with contextlib.suppress(BKError):
            await lease.revoke()
    assert replicator.calls == [21]
    if store_drops_it:
        assert in_doubt_at_completion == []
        assert await meta.underreplication.get(21) is not None  # Left for a sound claim.
    else:
        assert in_doubt_at_completion == [False]  # After the late refresh confirmed it.
        assert await meta.underreplication.get(21) is None
