"""The writer's ensemble change: replacing the bookies that failed its adds.

A bookie that fails an add (error, timeout, lost connection) is noted (`_note_failed`) and a
supervised job changes the ensemble: nothing completes meanwhile. Changes after the first in a
quarantine period back off (jittered). Which bookie takes a failed slot, or that none does
(the slot is "down", or the handle fails with NotEnoughBookiesError), is ensemble_change.py's
decision (`plan_replacements`); here the new segment, starting at LAC + 1, is written into the
metadata by compare-and-swap (`_write_ensemble`) and the pending adds are re-sent to the
newcomers. Metadata no longer OPEN means another client recovered the ledger: the writer is
fenced.

Part of `LedgerHandle` (a mixin over `HandleState`, see handle_state.py).
"""

from __future__ import annotations

import asyncio
import dataclasses

from bkaio.errors import BKError, LedgerFencedError, MetadataVersionError
from bkaio.ledger_client.ensemble_change import not_enough_bookies, plan_replacements
from bkaio.ledger_client.handle_state import HandleState
from bkaio.ledger_client.quorum import with_new_segment
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.ledger_metadata import LedgerState
from bkaio.meta.store import MAX_METADATA_ATTEMPTS, metadata_attempts_exhausted
from bkaio.supervision import spawn_job


class BookieReplacement(HandleState):
    """The ensemble changes of `LedgerHandle`."""

    def _bookie_failed(self, index: int, bookie_id: str, error: BKError) -> None:
        self._note_failed(index, bookie_id, error)
        if bookie_id in self._blocked_on:  # It failed: nothing to wait for from it. Held
            # appends go on now, or when the ensemble change just started has ended.
            self._writable_again(bookie_id)

    def _note_failed(self, index: int, bookie_id: str, error: BKError) -> None:
        if index in self._failed or self._down_mask >> index & 1:
            return
        self._log.warning(
            "bookie_add_failed",
            bookie_id=bookie_id,
            ensemble_index=index,
            error=str(error),
            error_type=type(error).__name__,
        )
        self._failed[index] = bookie_id
        self._failures.failed(bookie_id, error, self._loop.time())
        if self._change_task is None:
            self._changing = True
            self._change_task = spawn_job(
                f"ledger-{self.ledger_id}-ensemble-change",
                self._change_ensemble,
                kind="ensemble_change",
                on_failure=self._job_failed,
            )

    async def _change_ensemble(self) -> None:
        try:
            while self._failed and self._error is None:
                await self._back_off_before_change()
                if self._error is None:
                    await self._change_ensemble_once(dict(self._failed))
        except BKError as error:
            self._fail(error)
        finally:
            self._changing = False
            self._change_task = None
            if self._error is None:
                self._drain()

    async def _back_off_before_change(self) -> None:
        """The first change in a quarantine period goes at once; later ones wait a jittered,
        growing delay, so a flapping cluster cannot make a writer rewrite its metadata fast."""
        now = self._loop.time()
        last = self._last_change_at
        if last is None or now - last >= self._failures.quarantine_seconds:
            self._change_backoff.reset()
        else:
            await asyncio.sleep(self._change_backoff.next_delay())
        self._last_change_at = self._loop.time()

    async def _change_ensemble_once(self, failed: dict[int, str]) -> None:
        # Appends not sent yet go to the ensemble they were appended under, like the rest:
        # the re-send below then covers them as it covers every pending add.
        self._send_unsent(now=True)
        plan = plan_replacements(
            placement=self._ctx.placement,
            bookies=self._ctx.bookies(),
            ensemble=self._ensemble,
            failed=failed.keys(),
            down_mask=self._down_mask,
            write_quorum=self._write_quorum,
            ack_quorum=self._ack_quorum,
            failures=self._failures,
            now=self._loop.time(),
        )
        for index in sorted(failed):
            if plan.down_mask >> index & 1:
                self._log.warning(
                    "bookie_not_replaced", bookie_id=failed[index], ensemble_index=index
                )
        if not plan.ack_quorum_reachable(self._write_quorum, self._ack_quorum):
            # Fail before writing anything: no metadata version for a change that cannot help.
            raise not_enough_bookies(self.ledger_id, plan, self._ack_quorum, self._failures)
        replaced = plan.replaced
        self._down_mask = plan.down_mask
        if replaced:
            old = self._ensemble
            await self._write_ensemble(list(plan.ensemble))
            self._log.info(
                "ensemble_changed",
                first_entry_id=self._lac + 1,
                replaced={old[i]: plan.ensemble[i] for i in replaced},
            )
        for index, bookie_id in failed.items():
            if self._failed.get(index) == bookie_id:
                del self._failed[index]
        replaced_mask = sum(1 << i for i in replaced)
        for add in list(self._pending):
            if self._error is not None:
                return
            resend = self._write_set_masks[add.entry_id % self._ensemble_size] & replaced_mask
            if resend:
                # The new segment names the newcomer for this slot: readers look there, so
                # an ack from the bookie it replaced no longer counts.
                add.acked &= ~resend
                add.completed = add.acked.bit_count() >= self._ack_quorum
            self._send(add, resend)

    async def _write_ensemble(self, new_ensemble: list[str]) -> None:
        """CAS a segment starting at LAC + 1 with `new_ensemble` into the metadata."""
        ledgers = self._ctx.ledgers
        md = self._md
        first_entry_id = self._lac + 1
        for _attempt in range(MAX_METADATA_ATTEMPTS):
            if md.state is not LedgerState.OPEN:
                raise LedgerFencedError(
                    f"ledger {self.ledger_id} is {md.state.name} in metadata: another client "
                    f"recovered or closed it during an ensemble change"
                )
            target = dataclasses.replace(
                md, ensembles=with_new_segment(md.ensembles, first_entry_id, new_ensemble)
            )
            try:
                updated = await ledgers.update(target)
            except MetadataVersionError:
                md = await ledgers.get(self.ledger_id)
                continue
            except MetadataOutcomeUnknownError:
                md = await ledgers.get(self.ledger_id)
                if md.state is LedgerState.OPEN and tuple(md.ensembles) == tuple(target.ensembles):
                    updated = md
                else:
                    continue
            self._md = updated
            self._set_ensemble(new_ensemble)
            return
        raise metadata_attempts_exhausted(
            f"ledger {self.ledger_id}",
            "recording its ensemble change",
            "the metadata still names the old ensemble",
        )
