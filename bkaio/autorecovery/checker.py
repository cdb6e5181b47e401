"""The ledger check: do the live bookies of a closed ledger hold every entry of their fragments?

The auditor's bookie check only compares metadata with the registry, so it cannot see entries
missing on a bookie that is alive: a writer that went on at Qa while a bookie was down and could
not be replaced, or a recovery that re-wrote the tail to Qa bookies only, leaves a fragment
short on a registered bookie. BookKeeper's periodic check (`auditorPeriodicCheckInterval`,
LedgerChecker) finds those. Here: one LIST_ENTRIES per (ledger, registered bookie) compared with
the entries the bookie's fragments must hold. A bookie with the ledger in limbo answers
DATA_UNKNOWN and is skipped (it is copying the ledger back itself); one that does not answer is
skipped too (the next check, or the bookie check if it is gone, takes it).
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Iterable

import structlog

from bkaio.errors import BKError
from bkaio.meta import LedgerMetadata

from .cluster import ClusterView
from .fragments import Fragment, fragment_entries, fragments_on

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


class LedgerChecker:
    def __init__(self, view: ClusterView, *, concurrency: int = 8) -> None:
        assert concurrency >= 1, concurrency
        self._view = view
        self._limit = asyncio.Semaphore(concurrency)

    async def incomplete_bookies(self, metadata: LedgerMetadata) -> dict[str, list[int]]:
        """Registered bookies of a closed ledger that lack entries of their fragments, with
        the entries they lack (an open ledger's last segment is its writer's: not checked)."""
        registered = self._view.registered()
        by_bookie: dict[str, list[Fragment]] = {}
        for fragment in fragments_on(metadata, registered):
            if not fragment.open_tail:
                by_bookie.setdefault(fragment.bookie_id, []).append(fragment)
        results = await asyncio.gather(
            *(self._check(metadata, bookie_id, frags) for bookie_id, frags in by_bookie.items())
        )
        return {bookie_id: missing for bookie_id, missing in results if missing}

    async def _check(
        self, metadata: LedgerMetadata, bookie_id: str, fragments: list[Fragment]
    ) -> tuple[str, list[int]]:
        expected: list[int] = []
        for fragment in fragments:
            expected.extend(
                fragment_entries(fragment, metadata.ensemble_size, metadata.write_quorum)
            )
        if not expected:
            return bookie_id, []
        async with self._limit:
            try:
                held = await self._view.pool.list_entries(bookie_id, metadata.ledger_id)
            except BKError as error:  # In limbo, down, busy: no verdict on it now.
                log.debug(
                    "ledger_check_skipped",
                    ledger_id=metadata.ledger_id,
                    bookie_id=bookie_id,
                    error=str(error),
                )
                return bookie_id, []
        return bookie_id, missing_entries(expected, held)
