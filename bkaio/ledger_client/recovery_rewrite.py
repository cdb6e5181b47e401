"""Recovery's re-write of the entries it found, with ensemble changes as on the add path.

BookKeeper's recovery adds the entries it read back through the handle's normal add path
(RECOVERY_ADD, which a fenced bookie still takes): a bookie that fails is replaced by an
ensemble change starting at the recovering handle's LAC + 1, pending entries go to the
replacement, and the close writes the new segments with the CLOSED state
(ReadOnlyLedgerHandle.handleBookieFailure and closeRecovered). So the sealed ledger names only
bookies that took the entries, not a dead one. Here, the same rounds, kept out of the writer's
hot path:

1. Send every entry not yet held by every live bookie of its write set to those bookies, and
   wait for every answer (each has the add timeout): a slow bookie is a failed one.
2. No failure: done. Every entry is on every live bookie of its write set (at least Qa).
3. A failure: the entries up to the first one some live write-set bookie lacks stay in the
   current segment (each bookie of it holds them); a new segment starts at that entry with the
   failed bookies replaced (ensemble_change.py picks, never a bookie that failed during this
   recovery), and its entries lose the acks of the replaced slots. Round again, after a
   jittered backoff.

A failed slot nobody can take stays down while every write set still reaches Qa (the entries
are then on Qa bookies, as a writer with no spare bookie leaves them; autorecovery restores
the copies later). Otherwise NotEnoughBookiesError, and the ledger stays unsealed. Each round
rules out at least one more bookie, so there are at most as many rounds as bookies.
Imports no transport code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial

import structlog

from bkaio.backoff import Backoff
from bkaio.errors import BKError, UnauthorizedError
from bkaio.ledger_client.context import ClientContext
from bkaio.ledger_client.ensemble_change import (
    BookieFailures,
    not_enough_bookies,
    plan_replacements,
)
from bkaio.ledger_client.quorum import Segment, write_set
from bkaio.ledger_client.types import StoredCopy

log = structlog.get_logger(__name__)


class RecoveryRewrite:
    """Puts the entries one recovery found back on the bookies; returns the new segments."""

    def __init__(
        self,
        context: ClientContext,
        ledger_id: int,
        master_key: bytes,
        write_quorum: int,
        ack_quorum: int,
    ) -> None:
        self._ctx = context
        self.ledger_id = ledger_id
        self._master_key = master_key
        self._write_quorum = write_quorum
        self._ack_quorum = ack_quorum
        config = context.config
        self._failures = BookieFailures(config.bookie_quarantine_seconds)
        self._backoff = Backoff(
            config.ensemble_change_backoff_min, config.ensemble_change_backoff_max, rng=context.rng
        )
        self._log = log.bind(ledger_id=ledger_id)

    async def run(self, found: Sequence[StoredCopy], ensemble: Sequence[str]) -> list[Segment]:
        """Re-write `found` (consecutive entries of the last segment, whose bookies are
        `ensemble`); the segments to add to the metadata at the close, oldest first."""
        segments: list[Segment] = []
        if not found:
            return segments
        current = tuple(ensemble)
        size = len(current)
        masks = [
            sum(1 << i for i in write_set(copy.entry_id, size, self._write_quorum))
            for copy in found
        ]
        acked = [0] * len(found)  # Bit i: the bookie in slot i of `current` holds the entry.
        down_mask = 0
        first_open = 0  # Entries before it are held by every live slot of their write set.
        loop = asyncio.get_running_loop()
        while True:
            failed = await self._send_round(found, current, masks, acked, down_mask, first_open)
            live = ~down_mask
            while first_open < len(found) and acked[first_open] & live == masks[first_open] & live:
                first_open += 1
            if not failed:
                assert first_open == len(found), (first_open, len(found))
                return segments
            plan = plan_replacements(
                placement=self._ctx.placement,
                bookies=self._ctx.bookies(),
                ensemble=current,
                failed=failed.keys(),
                down_mask=down_mask,
                write_quorum=self._write_quorum,
                ack_quorum=self._ack_quorum,
                failures=self._failures,
                now=loop.time(),
            )
            if not plan.ack_quorum_reachable(self._write_quorum, self._ack_quorum):
                raise not_enough_bookies(self.ledger_id, plan, self._ack_quorum, self._failures)
            down_mask = plan.down_mask
            if plan.replaced:
                first_entry_id = found[first_open].entry_id
                self._log.info(
                    "recovery_ensemble_changed",
                    first_entry_id=first_entry_id,
                    replaced={current[i]: plan.ensemble[i] for i in plan.replaced},
                )
                current = plan.ensemble
                if segments and segments[-1][0] == first_entry_id:
                    segments[-1] = (first_entry_id, current)
                else:
                    segments.append((first_entry_id, current))
                cleared = ~sum(1 << i for i in plan.replaced)
                for position in range(first_open, len(found)):
                    acked[position] &= cleared
            await asyncio.sleep(self._backoff.next_delay())

    async def _send_round(
        self,
        found: Sequence[StoredCopy],
        ensemble: Sequence[str],
        masks: list[int],
        acked: list[int],
        down_mask: int,
        first_open: int,
    ) -> dict[int, str]:
        """RECOVERY_ADD each entry from `first_open` on to the live slots of its write set
        that lack it; wait for every answer. The slots that failed (slot -> bookie)."""
        loop = asyncio.get_running_loop()
        outstanding = 0
        done: asyncio.Future[None] = loop.create_future()
        failed: dict[int, str] = {}
        refusals: list[BKError] = []

        def answered(position: int, index: int, error: BKError | None) -> None:
            nonlocal outstanding
            outstanding -= 1
            if error is None:
                acked[position] |= 1 << index
            else:
                if index not in failed:
                    failed[index] = ensemble[index]
                    self._failures.failed(ensemble[index], error, loop.time())
                if isinstance(error, UnauthorizedError):
                    refusals.append(error)
            if outstanding == 0 and not done.done():
                done.set_result(None)

        for position in range(first_open, len(found)):
            missing = masks[position] & ~acked[position] & ~down_mask
            if not missing:
                continue
            copy = found[position]
            for index in range(len(ensemble)):
                if not missing >> index & 1:
                    continue
                outstanding += 1
                self._ctx.ops.add_entry(
                    ensemble[index],
                    self.ledger_id,
                    copy.entry_id,
                    recovery=True,
                    master_key=self._master_key,
                    lac=copy.lac,
                    length=copy.length,
                    digest=copy.digest,
                    payload=copy.payload,
                    callback=partial(answered, position, index),
                )
        if outstanding:
            await done
        if failed:
            self._log.warning(
                "recovery_add_failed",
                failed={bookie: str(self._failures.causes[bookie]) for bookie in failed.values()},
            )
        if refusals:
            raise refusals[0]  # Another bookie would say the same: the key is wrong.
        return failed
