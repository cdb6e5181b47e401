"""The replication worker: claims under-replicated ledgers and re-replicates them.

Runs in every bookie (by default) and in `bkaio autorecovery` processes, under the service's
supervisor. Each of its `worker_concurrency` loops claims one marked ledger at a time with a
lock bound to the worker's lease (so the locks of a dead worker vanish with its lease), moves
the ledger's fragments off the bookies still missing (`Replicator`), copies to its incomplete
bookies (live ones whose fragments lack entries: the ledger check) the entries they lack, and
drops the mark when that is done.

Before copying, the mark is checked against the cluster as it is now, read from the registry
itself (a watch-fed view can lag: a bookie re-registering after a lost lease would look gone):
a bookie that is registered again (and was neither decommissioned nor forced out by an
operator) is not missing any more, and a mark left with none is dropped without copying
anything.

A mark is completed only when every copy it asks for is there (BookKeeper's ReplicationWorker
re-checks the ledger before it marks it replicated): an incomplete bookie is filled and then
its entry list is checked (`Replicator.fill_ledger_in_place`); one that is not registered now
(and is not being moved off) cannot be filled, so the mark is given back, kept, counted
(`bkaio_autorecovery_marks_kept_total`) and retried after the per-ledger backoff below, until the
bookie is back (filled then) or, lost for good, is marked missing and moved off.

An open ledger whose last segment names a missing bookie is left to its writer for
`open_ledger_grace_seconds` after it was marked (the writer's own ensemble change moves it):
the worker gives the lock back and skips it until then; after that it fences and closes the
ledger and moves the rest (reference 7.3, step 3). A bookie merged into an older mark (one kept
for a failing copy, say) gets its own grace, counted from when this worker first claimed the
ledger with it missing: the mark's age alone fenced such a writer at once.

The lock is bound to the worker's lease in the store (a claim under a lease the store dropped
is refused), but the steps taken under it are writes of other keys: the ensemble swap, the
fencing of an open ledger and the mark's removal. Each waits until the store certainly holds
the lease (`Lease.wait_confirmed`: after an event-loop stall longer than the TTL the lease is in
doubt until the keep-alive's late refresh answers, and the store may have dropped it and
another worker claimed the ledger meanwhile); when the store does not confirm it, the step is
not taken, the lock given back (if still this worker's) and the ledger left for a claim under
a sound lease, without counting a failure or backing off.

A failed attempt (one `ReplicationError` per ledger) is counted and logged with the ledger,
the lock is released at once, and that ledger is skipped by this worker for a jittered,
growing backoff (`retry_backoff_seconds` up to `retry_backoff_max_seconds`) while the loop
goes on with other ledgers; any other worker may take it meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from bkaio.backoff import Backoff
from bkaio.errors import BKError
from bkaio.meta import Lease, Metadata, UnderreplicatedLedger
from bkaio.meta.ledger_metadata import now_ms

from .fragments import LockLeaseUnconfirmedError
from .metrics import AutorecoveryMetrics
from .replicator import Outcome, Replicator, check_lock_lease

log = structlog.get_logger(__name__)

# Watching this prefix sees both new marks (/underreplicated/...) and released locks
# (/underreplication/locks/...): either can make work available to an idle worker.
_QUEUE_WATCH_PREFIX = "/underreplicat"
_METADATA_RETRY = (0.5, 30.0)  # Backoff of failing metadata calls: initial, maximum seconds.


@dataclass(slots=True)
class _GraceClock:
    """When this worker first claimed a ledger with `missing` (its latest set) missing."""

    missing: frozenset[str]
    since: float  # Monotonic seconds.
    seen: float  # The latest claim: a clock not seen for long is forgotten.


@dataclass(slots=True)
class _Skip:
    """A ledger this worker leaves alone until `until` (monotonic seconds)."""

    until: float
    backoff: Backoff | None  # None: waiting for an open ledger's grace, not after a failure.


class ReplicationWorker:
    def __init__(
        self,
        metadata: Metadata,
        replicator: Replicator,
        metrics: AutorecoveryMetrics,
        *,
        owner: str,
        lease_ttl_seconds: float = 10.0,
        concurrency: int = 2,
        open_ledger_grace_seconds: float = 30.0,
        retry_backoff_seconds: float = 5.0,
        retry_backoff_max_seconds: float = 300.0,
        poll_interval_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert concurrency >= 1, concurrency
        self._metadata = metadata
        self._replicator = replicator
        self._metrics = metrics
        self.owner = owner
        self._lease_ttl = lease_ttl_seconds
        self._concurrency = concurrency
        self._grace = open_ledger_grace_seconds
        self._retry_initial = retry_backoff_seconds
        self._retry_max = max(retry_backoff_max_seconds, retry_backoff_seconds)
        self._poll = poll_interval_seconds
        self._clock = clock
        self._work = asyncio.Event()
        self._skips: dict[int, _Skip] = {}
        self._grace_clocks: dict[int, _GraceClock] = {}

    async def run(self) -> None:
        """Work until cancelled; a lost lease (its locks are gone) starts over with a new one.
        An unexpected error ends the run: the service's supervisor logs and restarts it."""
        loop = asyncio.get_running_loop()
        watcher = loop.create_task(self._watch_queue(), name="autorecovery-queue-watch")
        leases = Backoff(*_METADATA_RETRY)
        try:
            while True:
                try:
                    lease = await self._metadata.store.grant_lease(self._lease_ttl)
                except BKError as error:
                    delay = leases.next_delay()
                    log.warning("replication_worker_lease_failed", error=str(error))
                    await asyncio.sleep(delay)
                    continue
                leases.reset()
                lease.start_keep_alive()
                loops = [
                    loop.create_task(self._claim_loop(lease), name=f"replication-{i}")
                    for i in range(self._concurrency)
                ]
                lost = loop.create_task(lease.wait_lost())
                try:
                    await asyncio.wait([lost, watcher, *loops], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in (lost, *loops):
                        task.cancel()
                    await asyncio.gather(lost, *loops, return_exceptions=True)
                    with contextlib.suppress(BKError):
                        await lease.revoke()
                for task in (watcher, *loops):
                    if task.done() and not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                log.warning("replication_worker_lease_lost", owner=self.owner)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _watch_queue(self) -> None:
        retry = Backoff(*_METADATA_RETRY)
        while True:
            try:
                events = self._metadata.store.watch_prefix(_QUEUE_WATCH_PREFIX)
                async with contextlib.aclosing(events):
                    async for _ in events:
                        retry.reset()
                        self._work.set()
            except BKError as error:
                log.warning("replication_queue_watch_failed", error=str(error))
            await asyncio.sleep(retry.next_delay())
            self._work.set()  # Marks may have come while the watch was down.

    async def _wait_for_work(self) -> None:
        wait = self._poll
        now = self._clock()
        for skip in self._skips.values():
            if skip.until > now:
                wait = min(wait, skip.until - now)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self._work.wait()
        self._work.clear()

    def _skipped(self) -> set[int]:
        """Ledgers to leave alone now; forgets skips long past (their marks may be gone)."""
        now = self._clock()
        for ledger_id, skip in list(self._skips.items()):
            if skip.until + self._retry_max < now:
                del self._skips[ledger_id]
        for ledger_id, clock in list(self._grace_clocks.items()):
            if clock.seen + self._grace + 2 * self._retry_max < now:
                del self._grace_clocks[ledger_id]  # Claimed by others since, or done.
        return {ledger_id for ledger_id, skip in self._skips.items() if skip.until > now}

    async def _claim_loop(self, lease: Lease) -> None:
        underreplication = self._metadata.underreplication
        errors = Backoff(*_METADATA_RETRY)
        # `lost`, not `in_doubt`, is enough here: a claim writes the lock bound to the lease,
        # which the store refuses once the lease is gone (etcd: "lease not found"; SQLite: the
        # lease's row, expired ones reaped first, in the write's transaction). The steps under
        # the lock check the lease themselves (`_process`).
        while not lease.lost:
            try:
                if not await underreplication.is_enabled():
                    await self._wait_for_work()
                    continue
                claimed = await underreplication.claim_next(
                    lease, owner=self.owner, skip=self._skipped()
                )
            except BKError as error:
                delay = errors.next_delay()
                log.warning("replication_worker_error", error=str(error))
                await asyncio.sleep(delay)
                continue
            errors.reset()
            if claimed is None:
                await self._wait_for_work()
                continue
            await self._process(claimed, lease)

    async def _still_missing(
        self, claimed: UnderreplicatedLedger, registered: set[str]
    ) -> list[str]:
        """The mark's bookies that are missing now: not registered, decommissioned, or forced
        out by an operator."""
        decommissioned = await self._metadata.decommissioned.ids()
        return [
            bookie_id
            for bookie_id in claimed.missing_bookies
            if bookie_id not in registered
            or bookie_id in decommissioned
            or bookie_id in claimed.forced_bookies
        ]

    async def _process(self, claimed: UnderreplicatedLedger, lease: Lease) -> None:
        """Re-replicate one claimed ledger (locked under `lease`); always gives the lock back,
        never raises BKError."""
        underreplication = self._metadata.underreplication
        ledger_id = claimed.ledger_id
        completed = False
        try:
            registered = await self._metadata.bookies.ids()
            missing = await self._still_missing(claimed, registered)
            moving = set(missing)
            incomplete = [
                b for b in claimed.incomplete_bookies if b in registered and b not in moving
            ]
            unreachable = [
                b for b in claimed.incomplete_bookies if b not in registered and b not in moving
            ]
            if not missing and not incomplete and not unreachable:
                await check_lock_lease(lease, ledger_id, "dropping its mark")
                completed = await underreplication.complete(claimed)
                log.info(
                    "mark_dropped_bookies_back",
                    ledger_id=ledger_id,
                    missing_bookies=list(claimed.missing_bookies),
                )
                return
            if incomplete:  # Filled and then checked: raises while any entry is lacking.
                await self._replicator.fill_ledger_in_place(ledger_id, incomplete)
            outcome = Outcome.DONE
            if missing:
                grace_left = self._grace_left(ledger_id, missing, claimed.ctime_ms)
                result = await self._replicator.replicate_ledger(
                    ledger_id, missing, recover_open_tail=grace_left <= 0, lock_lease=lease
                )
                outcome = result.outcome
                if outcome is Outcome.DEFERRED:
                    # Only the open tail is left: its writer has the rest of the grace period.
                    remaining = max(0.0, grace_left) + 0.05
                    self._skips[ledger_id] = _Skip(self._clock() + remaining, None)
                    return
            if unreachable and outcome is not Outcome.DELETED:
                # Their copies are still missing: never complete the mark over them.
                self._metrics.marks_kept.inc()
                delay = self._back_off(ledger_id)
                log.warning(
                    "mark_kept_bookie_unregistered",
                    ledger_id=ledger_id,
                    incomplete_bookies=unreachable,
                    retry_seconds=round(delay, 2),
                )
                return
            await check_lock_lease(lease, ledger_id, "dropping its mark")
            completed = await underreplication.complete(claimed)
            self._skips.pop(ledger_id, None)
            self._grace_clocks.pop(ledger_id, None)
            if outcome is Outcome.DONE:
                self._metrics.ledgers_replicated.inc()
        except LockLeaseUnconfirmedError as error:
            # The lease's fault, not the ledger's: no failure counted, no backoff.
            log.warning("replication_lock_lease_unconfirmed", ledger_id=ledger_id, error=str(error))
        except BKError as error:
            self._metrics.replication_failures.inc()
            delay = self._back_off(ledger_id)
            log.warning(
                "ledger_replication_failed",
                ledger_id=ledger_id,
                missing_bookies=list(claimed.missing_bookies),
                error=str(error),
                error_type=type(error).__name__,
                retry_seconds=round(delay, 2),
            )
        finally:
            if not completed:
                with contextlib.suppress(BKError):
                    await underreplication.release(ledger_id, claimed.lock_version)

    def _grace_left(self, ledger_id: int, missing: list[str], mark_ctime_ms: int) -> float:
        """Seconds left of the open ledger's grace: counted from the mark's creation, and from
        when this worker first claimed the ledger with each of `missing` missing (a bookie
        newly merged into an old mark starts the clock again)."""
        now = self._clock()
        missing_now = frozenset(missing)
        clock = self._grace_clocks.get(ledger_id)
        if clock is None or not missing_now <= clock.missing:
            clock = _GraceClock(missing_now, now, now)
            self._grace_clocks[ledger_id] = clock
        clock.missing, clock.seen = missing_now, now
        by_mark = self._grace - (now_ms() - mark_ctime_ms) / 1000
        return max(by_mark, self._grace - (now - clock.since))

    def _back_off(self, ledger_id: int) -> float:
        skip = self._skips.get(ledger_id)
        if skip is None or skip.backoff is None:
            skip = _Skip(0.0, Backoff(self._retry_initial, self._retry_max))
            self._skips[ledger_id] = skip
        assert skip.backoff is not None
        delay = skip.backoff.next_delay()
        skip.until = self._clock() + delay
        return delay
