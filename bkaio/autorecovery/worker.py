"""The replication worker: claims under-replicated ledgers and re-replicates them.

Runs in every bookie (by default) and in `bkaio autorecovery` processes. Each of its
`worker_concurrency` loops claims one marked ledger at a time with a lock bound to the worker's
lease (so the locks of a dead worker vanish with its lease), moves the ledger's fragments off
the missing bookies (`Replicator`), and drops the mark when nothing is left on them. An open
ledger whose last segment names a missing bookie is left to its writer for
`open_ledger_grace_seconds` after it was marked (the writer's own ensemble change moves it);
after that the worker fences and closes it and moves the rest (reference 7.3, step 3).
A failed attempt releases the lock after `retry_backoff_seconds` so any worker may retry.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from bkaio.backoff import Backoff
from bkaio.errors import BKError
from bkaio.meta import Lease, Metadata, UnderreplicatedLedger
from bkaio.meta.ledger_metadata import now_ms

from .metrics import AutorecoveryMetrics
from .replicator import Outcome, Replicator

log = structlog.get_logger(__name__)

# Watching this prefix sees both new marks (/underreplicated/...) and released locks
# (/underreplication/locks/...): either can make work available to an idle worker.
_QUEUE_WATCH_PREFIX = "/underreplicat"


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
        poll_interval_seconds: float = 5.0,
    ) -> None:
        assert concurrency >= 1, concurrency
        self._metadata = metadata
        self._replicator = replicator
        self._metrics = metrics
        self.owner = owner
        self._lease_ttl = lease_ttl_seconds
        self._concurrency = concurrency
        self._grace_ms = int(open_ledger_grace_seconds * 1000)
        self._backoff = retry_backoff_seconds
        self._poll = poll_interval_seconds
        self._work = asyncio.Event()

    async def run(self) -> None:
        """Work until cancelled; a lost lease (its locks are gone) starts over with a new one."""
        loop = asyncio.get_running_loop()
        watcher = loop.create_task(self._watch_queue(), name="autorecovery-queue-watch")
        backoff = Backoff(min(0.2, self._backoff), self._backoff)
        try:
            while True:
                try:
                    lease = await self._metadata.store.grant_lease(self._lease_ttl)
                except BKError as error:
                    delay = backoff.next_delay()
                    log.warning(
                        "replication_worker_lease_failed",
                        error=str(error),
                        retry_in=round(delay, 2),
                    )
                    await asyncio.sleep(delay)
                    continue
                backoff.reset()
                lease.start_keep_alive()
                loops = [
                    loop.create_task(self._claim_loop(lease), name=f"replication-{i}")
                    for i in range(self._concurrency)
                ]
                lost = loop.create_task(lease.wait_lost())
                try:
                    await asyncio.wait([lost, *loops], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in (lost, *loops):
                        task.cancel()
                    await asyncio.gather(lost, *loops, return_exceptions=True)
                    with contextlib.suppress(BKError):
                        await lease.revoke()
                for task in loops:
                    if task.done() and not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                log.warning("replication_worker_lease_lost", owner=self.owner)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _watch_queue(self) -> None:
        backoff = Backoff(min(0.2, self._poll), self._poll)
        while True:
            try:
                events = self._metadata.store.watch_prefix(_QUEUE_WATCH_PREFIX)
                async with contextlib.aclosing(events):
                    async for _ in events:
                        self._work.set()
                        backoff.reset()
            except BKError as error:
                log.warning("replication_queue_watch_failed", error=str(error))
            await asyncio.sleep(backoff.next_delay())

    async def _wait_for_work(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._poll):
                await self._work.wait()
        self._work.clear()

    async def _claim_loop(self, lease: Lease) -> None:
        underreplication = self._metadata.underreplication
        backoff = Backoff(min(0.2, self._backoff), self._backoff)  # `retry_backoff_seconds` caps.
        while not lease.lost:
            try:
                if not await underreplication.is_enabled():
                    await self._wait_for_work()
                    continue
                claimed = await underreplication.claim_next(lease, owner=self.owner)
                if claimed is None:
                    await self._wait_for_work()
                    continue
                await self._process(claimed)
                backoff.reset()
            except BKError as error:
                delay = backoff.next_delay()
                log.warning("replication_worker_error", error=str(error), retry_in=round(delay, 2))
                await asyncio.sleep(delay)

    async def _process(self, claimed: UnderreplicatedLedger) -> None:
        """Re-replicate one claimed ledger; always gives the lock back."""
        underreplication = self._metadata.underreplication
        ledger_id = claimed.ledger_id
        completed = False
        try:
            while True:
                waited_ms = now_ms() - claimed.ctime_ms
                try:
                    result = await self._replicator.replicate_ledger(
                        ledger_id,
                        claimed.missing_bookies,
                        recover_open_tail=waited_ms >= self._grace_ms,
                    )
                except BKError as error:
                    self._metrics.replication_failures.inc()
                    log.warning(
                        "ledger_replication_failed",
                        ledger_id=ledger_id,
                        missing_bookies=list(claimed.missing_bookies),
                        error=str(error),
                        error_type=type(error).__name__,
                    )
                    await asyncio.sleep(self._backoff)  # Keep the lock meanwhile: back off.
                    return
                if result.outcome is not Outcome.DEFERRED:
                    break
                # Only the open tail is left: give its writer the rest of the grace period.
                remaining_s = max(0.0, (self._grace_ms - waited_ms) / 1000) + 0.05
                await asyncio.sleep(min(remaining_s, self._poll))
            completed = await underreplication.complete(claimed)
            if result.outcome is Outcome.DONE:
                self._metrics.ledgers_replicated.inc()
        finally:
            if not completed:
                with contextlib.suppress(BKError):
                    await underreplication.release(ledger_id)
