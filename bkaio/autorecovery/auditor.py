"""The auditor: finds ledgers with fragments on lost bookies and marks them under-replicated.

One auditor runs in the cluster at a time (leader election on the leased key /auditor, in
`AuditorService`). While elected it scans every ledger's metadata when the set of registered
bookies changes and every `audit_interval_seconds`: a bookie named by some segment but not
registered (writable or read-only) is *lost*; once it has stayed lost for
`lost_bookie_delay_seconds`, every ledger naming it is marked under-replicated with that bookie
as missing (BookKeeper's Auditor bookie check and periodic check, reference 7.2). Marks are
idempotent, so repeated scans never pile up work. Nothing happens while autorecovery is
disabled (the metadata switch).
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
from bkaio.meta import Metadata
from bkaio.meta.ledger_metadata import deserialize
from bkaio.meta.ledgers import LEDGERS_PREFIX, ledger_id_of

from .metrics import AutorecoveryMetrics

log = structlog.get_logger(__name__)

_DISABLED_RECHECK_SECONDS = 1.0
_ERROR_BACKOFF_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class AuditReport:
    ledgers_scanned: int
    lost_bookies: tuple[str, ...]
    ledgers_marked: int
    waiting_bookies: tuple[str, ...]  # Lost, but still inside lost_bookie_delay_seconds.


async def ledgers_by_bookie(metadata: Metadata) -> tuple[dict[str, set[int]], int]:
    """bookie id -> ids of the ledgers whose segments name it; and how many ledgers exist."""
    index: dict[str, set[int]] = {}
    count = 0
    async for kv in metadata.store.iterate_prefix(LEDGERS_PREFIX):
        ledger_id = ledger_id_of(kv.key)
        try:
            record = deserialize(kv.value, ledger_id=ledger_id, version=kv.version)
        except BKError as error:
            log.warning("audit_bad_ledger_metadata", ledger_id=ledger_id, error=str(error))
            continue
        count += 1
        for _, ensemble in record.ensembles:
            for bookie_id in ensemble:
                index.setdefault(bookie_id, set()).add(ledger_id)
    return index, count


class Auditor:
    """The audit loop of the elected auditor (run while leadership lasts, then cancelled)."""

    def __init__(
        self,
        metadata: Metadata,
        metrics: AutorecoveryMetrics,
        *,
        lost_bookie_delay_seconds: float,
        audit_interval_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metadata = metadata
        self._metrics = metrics
        self._delay = lost_bookie_delay_seconds
        self._interval = audit_interval_seconds
        self._clock = clock
        self._lost_since: dict[str, float] = {}
        self._wake = asyncio.Event()

    def trigger(self) -> None:
        """Audit now (the bookie set changed, or an operator asked)."""
        self._wake.set()

    async def audit_once(self) -> AuditReport:
        """One scan: mark the ledgers of bookies lost for at least the delay."""
        started = time.monotonic()
        registered = {info.bookie_id for info in await self._metadata.bookies.list()}
        index, scanned = await ledgers_by_bookie(self._metadata)
        now = self._clock()
        lost = {bookie_id for bookie_id in index if bookie_id not in registered}
        for bookie_id in list(self._lost_since):
            if bookie_id not in lost:
                del self._lost_since[bookie_id]  # Back, or nothing names it any more.
        marked = 0
        waiting: list[str] = []
        for bookie_id in sorted(lost):
            since = self._lost_since.setdefault(bookie_id, now)
            if now - since < self._delay:
                waiting.append(bookie_id)
                continue
            for ledger_id in sorted(index[bookie_id]):
                await self._metadata.underreplication.mark(ledger_id, [bookie_id])
                marked += 1
        if marked:
            self._metrics.ledgers_marked.inc(marked)
            log.info("audit_marked", lost_bookies=sorted(lost), ledgers_marked=marked)
        self._metrics.lost_bookies.set(len(lost))
        self._metrics.under_replicated_ledgers.set(
            len({ledger_id for bookie_id in lost for ledger_id in index[bookie_id]})
        )
        self._metrics.audit_seconds.observe(time.monotonic() - started)
        return AuditReport(scanned, tuple(sorted(lost)), marked, tuple(waiting))

    def _next_wait(self) -> float:
        """Seconds until the next scan is due: the interval, or sooner when a delay ends."""
        wait = self._interval
        now = self._clock()
        for since in self._lost_since.values():
            wait = min(wait, max(0.0, since + self._delay - now) + 0.01)
        return wait

    async def run(self) -> None:
        """Audit on every bookie change and periodically, until cancelled."""
        watcher = asyncio.get_running_loop().create_task(self._watch_bookies())
        try:
            while True:
                self._wake.clear()
                try:
                    if await self._metadata.underreplication.is_enabled():
                        await self.audit_once()
                        wait = self._next_wait()
                    else:
                        wait = _DISABLED_RECHECK_SECONDS
                except BKError as error:
                    log.warning("audit_failed", error=str(error))
                    wait = _ERROR_BACKOFF_SECONDS
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._wake.wait()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _watch_bookies(self) -> None:
        backoff = Backoff(0.2, 5.0)
        while True:
            try:
                async for _ in self._metadata.bookies.watch():
                    self.trigger()
                    backoff.reset()
            except BKError as error:
                log.warning("auditor_bookie_watch_failed", error=str(error))
            await asyncio.sleep(backoff.next_delay())
