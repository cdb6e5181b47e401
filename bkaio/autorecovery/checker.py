"""The ledger check: do the live bookies of a closed ledger hold every entry of their fragments?

The auditor's bookie check only compares metadata with the registry, so it cannot see entries
missing on a bookie that is alive: a writer that went on at Qa while a bookie was down and could
not be replaced, or a recovery that re-wrote the tail to Qa bookies only, leaves a fragment
short on a registered bookie. BookKeeper's periodic check (`auditorPeriodicCheckInterval`,
LedgerChecker) finds those. Here: one LIST_ENTRIES per (ledger, registered bookie) compared with
the entries the bookie's fragments must hold.

Which bookies are registered is the caller's to say (the auditor reads the registry itself for
each check): a watch-fed view that lags would leave a live bookie unchecked without anyone
knowing. A bookie that cannot give its list (the ledger in limbo there: DATA_UNKNOWN; down,
busy, timed out) gives no verdict: the check reports it as *unchecked* and counts it
(`bkaio_autorecovery_ledger_check_skipped_total{reason}`), and the auditor checks that ledger
again later and says at WARNING, once per pass, which bookies left how many ledgers unchecked
(BookKeeper's checker counts the ledgers it could not check, too). Per ledger it is a debug
line: a bookie down for a minute would otherwise write one warning per ledger it holds.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

import structlog

from bkaio.errors import BKError, DataUnknownError
from bkaio.meta import LedgerMetadata

from .cluster import ClusterView
from .fragments import Fragment, fragment_entries, fragments_on
from .metrics import AutorecoveryMetrics

log = structlog.get_logger(__name__)


def missing_entries(expected: Iterable[int], held: list[tuple[int, int]]) -> list[int]:
    """The ids of `expected` outside the inclusive ascending ranges `held`."""
    firsts = [first for first, _ in held]
    missing = []
    for entry_id in expected:
        position = bisect.bisect_right(firsts, entry_id) - 1
        if position < 0 or held[position][1] < entry_id:
            missing.append(entry_id)
    return missing


@dataclass(frozen=True, slots=True)
class LedgerCheck:
    """What one check of one ledger found."""

    ledger_id: int
    # Registered bookies lacking entries of their fragments -> the entry ids they lack.
    incomplete: dict[str, list[int]] = field(default_factory=dict)
    # Registered bookies that gave no verdict -> why (in limbo, unavailable, ...).
    unchecked: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class UncheckedLedgers:
    """What one pass of the ledger check could not check: the ledgers, and per bookie how many
    of them it gave no verdict on and the last reason it gave."""

    ledgers: set[int] = field(default_factory=set)
    by_bookie: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)

    def add(self, ledger_id: int, unchecked: dict[str, str]) -> None:
        self.ledgers.add(ledger_id)
        for bookie_id, why in unchecked.items():
            self.by_bookie[bookie_id] = self.by_bookie.get(bookie_id, 0) + 1
            self.reasons[bookie_id] = why

    def report(self, event: str) -> None:
        """One WARNING for the pass, when it left anything unchecked."""
        if self.ledgers:
            log.warning(
                event,
                ledgers_unchecked=len(self.ledgers),
                ledgers_by_bookie=self.by_bookie,
                last_reason_by_bookie=self.reasons,
            )


class LedgerChecker:
    def __init__(
        self, view: ClusterView, metrics: AutorecoveryMetrics, *, concurrency: int = 8
    ) -> None:
        assert concurrency >= 1, concurrency
        self._view = view
        self._metrics = metrics
        self._limit = asyncio.Semaphore(concurrency)

    async def check(self, metadata: LedgerMetadata, registered: Collection[str]) -> LedgerCheck:
        """Ask each of `registered` (bookie ids: the registry's, read by the caller) that holds
        closed fragments of the ledger which entries it has (an open ledger's last segment is
        its writer's: not checked)."""
        by_bookie: dict[str, list[Fragment]] = {}
        for fragment in fragments_on(metadata, registered):
            if not fragment.open_tail:
                by_bookie.setdefault(fragment.bookie_id, []).append(fragment)
        results = await asyncio.gather(
            *(self._check(metadata, bookie_id, frags) for bookie_id, frags in by_bookie.items())
        )
        incomplete: dict[str, list[int]] = {}
        unchecked: dict[str, str] = {}
        for bookie_id, missing, why in results:
            if why is not None:
                unchecked[bookie_id] = why
            elif missing:
                incomplete[bookie_id] = missing
        return LedgerCheck(metadata.ledger_id, incomplete, unchecked)

    async def _check(
        self, metadata: LedgerMetadata, bookie_id: str, fragments: list[Fragment]
    ) -> tuple[str, list[int], str | None]:
        expected: list[int] = []
        for fragment in fragments:
            expected.extend(
                fragment_entries(fragment, metadata.ensemble_size, metadata.write_quorum)
            )
        if not expected:
            return bookie_id, [], None
        async with self._limit:
            try:
                held = await self._view.pool.list_entries(bookie_id, metadata.ledger_id)
            except BKError as error:  # In limbo, down, busy: no verdict on it now.
                reason = "in_limbo" if isinstance(error, DataUnknownError) else "no_answer"
                self._metrics.ledger_check_skipped.labels(reason=reason).inc()
                log.debug(
                    "ledger_check_skipped",
                    ledger_id=metadata.ledger_id,
                    bookie_id=bookie_id,
                    reason=reason,
                    error=str(error),
                    error_type=type(error).__name__,
                )
                return bookie_id, [], f"{reason}: {type(error).__name__}: {error}"
        return bookie_id, missing_entries(expected, held), None
