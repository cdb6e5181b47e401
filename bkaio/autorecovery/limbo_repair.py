"""A bookie in limbo copies its fragments back from the other replicas (bkaio/bookie/limbo.py).

For each ledger in limbo, in ledger id order, until none is left:
1. read its metadata; a deleted ledger has nothing to copy;
2. a ledger that is not closed and whose last segment names this bookie is recovered first
   through the normal fenced recovery (`LedgerRecovery`): its end is decided by the other
   bookies (this one answers DATA_UNKNOWN for what it lacks), so it fails, retryably, while too
   few of them answer, and never seals short;
3. every closed fragment of this bookie (each segment naming it, the entries of its write sets)
   is copied to this bookie with RECOVERY_ADD from the other bookies of each entry's write set
   (`Replicator.fill_in_place`, range reads where E == Qw); entries it already holds are
   accepted again as duplicates;
4. `clear(ledger_id)` takes the ledger out of limbo on its shard (persisted there).
A ledger that cannot be repaired now (recovery undecided, an entry unreadable, the master key
unknown) is retried after a jittered backoff that grows per ledger, while the others go on; a
change of the registered bookies (one coming back) retries them all at once.
Runs in the bookie parent under its supervisor, whether or not autorecovery is enabled there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import structlog

from bkaio.backoff import Backoff
from bkaio.errors import BKError, NoSuchLedgerError

from .cluster import ClusterView, MasterKeys
from .metrics import AutorecoveryMetrics
from .replicator import Replicator

log = structlog.get_logger(__name__)


class LimboProgress(Protocol):
    """What the host (the bookie parent) is told, for its metrics and `bookie info`."""

    def copied(self, entries: int, payload_bytes: int) -> None: ...

    def repaired(self, ledger_id: int) -> None: ...

    def failed(self, ledger_id: int, error: BKError) -> None: ...


@dataclass(frozen=True, slots=True)
class LedgerRepair:
    ledger_id: int
    entries: int
    bytes: int
    recovered: bool  # The open ledger was fenced and closed first.
    deleted: bool  # Nothing to copy: the ledger was deleted.


class LimboRepair:
    def __init__(
        self,
        bookie_id: str,
        view: ClusterView,
        keys: MasterKeys,
        clear: Callable[[int], Awaitable[None]],
        progress: LimboProgress,
        *,
        entries_in_flight: int = 256,
        retry_initial_seconds: float = 1.0,
        retry_max_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bookie_id = bookie_id
        self._view = view
        self._keys = keys
        self._clear = clear
        self._progress = progress
        metrics = AutorecoveryMetrics()  # Its own registry: limbo counts in `progress`.
        self._replicator = Replicator(view, keys, metrics, entries_in_flight=entries_in_flight)
        self._retry = (retry_initial_seconds, retry_max_seconds)
        self._clock = clock

    async def run(self, ledger_ids: Iterable[int]) -> None:
        """Repair every ledger; returns when none is left in limbo."""
        pending = sorted(set(ledger_ids))
        backoffs: dict[int, Backoff] = {}
        not_before: dict[int, float] = {}
        log.warning("limbo_repair_started", bookie_id=self.bookie_id, ledgers=len(pending))
        changed = self._view.changed
        while pending:
            now = self._clock()
            due = [ledger_id for ledger_id in pending if not_before.get(ledger_id, 0.0) <= now]
            if not due:
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(not_before[i] for i in pending) - now):
                        await changed.wait()
                if changed.is_set():  # A bookie came (back): what failed may work now.
                    not_before.clear()
                    backoffs.clear()
                continue
            for ledger_id in due:
                try:
                    result = await self.repair(ledger_id)
                    await self._clear(ledger_id)
                except BKError as error:
                    backoff = backoffs.setdefault(ledger_id, Backoff(*self._retry))
                    delay = backoff.next_delay()
                    not_before[ledger_id] = self._clock() + delay
                    self._progress.failed(ledger_id, error)
                    log.warning(
                        "limbo_ledger_repair_failed",
                        ledger_id=ledger_id,
                        error=str(error),
                        error_type=type(error).__name__,
                        retry_seconds=round(delay, 2),
                    )
                    continue
                pending.remove(ledger_id)
                backoffs.pop(ledger_id, None)
                not_before.pop(ledger_id, None)
                self._progress.repaired(ledger_id)
                log.info(
                    "limbo_ledger_repaired",
                    ledger_id=ledger_id,
                    entries=result.entries,
                    recovered=result.recovered,
                    deleted=result.deleted,
                    remaining=len(pending),
                )
        log.warning("limbo_repair_finished", bookie_id=self.bookie_id)

    async def repair(self, ledger_id: int) -> LedgerRepair:
        """Copy this bookie's fragments of one ledger back to it (recovering it first when
        its open tail names this bookie). ReplicationError (or another BKError) when it
        cannot be done now."""
        ledgers = self._view.metadata.ledgers
        try:
            metadata = await ledgers.get(ledger_id)
        except NoSuchLedgerError:
            return LedgerRepair(ledger_id, 0, 0, recovered=False, deleted=True)
        recovered = False
        if not metadata.is_closed and self.bookie_id in metadata.ensembles[-1][1]:
            metadata = await self._replicator.recover_open_ledger(metadata)
            recovered = True
        entries, payload_bytes = await self._replicator.fill_in_place(metadata, {self.bookie_id})
        self._progress.copied(entries, payload_bytes)
        return LedgerRepair(ledger_id, entries, payload_bytes, recovered, deleted=False)
