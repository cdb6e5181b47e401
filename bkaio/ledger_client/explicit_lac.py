"""The writer's explicit LAC: telling the bookies a LAC that no add carried to them.

Every add piggybacks the LAC of its append, so tailing readers learn of an entry with the next
add. A writer that goes quiet would leave them one entry behind: `explicit_lac_interval` after
its LAC moved, a LAC above every one piggybacked goes with WRITE_LAC to the live bookies of the
current ensemble. With `explicit_lac_on_ack` it goes as soon as the loop iteration whose acks
moved it is over, unless an add sent or queued since carries it; a burst waiting for company
leaves at once carrying it instead (`_carry_lac`). A failed WRITE_LAC only delays readers.

Part of `LedgerHandle` (a mixin over `HandleState`, see handle_state.py).
"""

from __future__ import annotations

import asyncio
from functools import partial

from bkaio.errors import BKError
from bkaio.ledger_client.handle_state import HandleState, PendingAdd
from bkaio.protocol.digest import entry_digest
from bkaio.supervision import loop_supervisor, spawn_job


class ExplicitLac(HandleState):
    """The explicit LAC pushes of `LedgerHandle`."""

    def _schedule_explicit_lac(self) -> None:
        interval = self._ctx.config.explicit_lac_interval
        if interval > 0 and self._lac_timer is None and not self._lac_stopped:
            self._lac_timer = self._loop.call_later(interval, self._explicit_lac_due)

    def _lac_pushed(self) -> None:
        """`explicit_lac_on_ack`: once the loop iteration whose acks moved the LAC is done,
        WRITE_LAC unless an add sent or queued since carries the LAC (tailing readers then
        learn of the entry without waiting for the next add)."""
        self._lac_push_due = False
        lac = self._lac
        if self._batch_timer is not None and self._error is None:
            # A burst waits for company: it leaves now carrying the new LAC, which costs
            # no request beside it (a WRITE_LAC is three more requests and answers).
            self._carry_lac(self._unsent, lac)
            self._send_unsent(now=True)
        latest = (
            self._waiting[-1] if self._waiting else self._pending[-1] if self._pending else None
        )
        carried = max(self._max_piggybacked_lac, -1 if latest is None else latest.lac)
        if lac <= carried or self._error is not None or self._lac_stopped:
            return
        self._spawn_write_lac(lac)

    def _carry_lac(self, adds: list[PendingAdd], lac: int) -> None:
        """Piggyback `lac` on adds no bookie has seen yet (their digest covers it)."""
        ledger_id = self.ledger_id
        for add in adds:
            if add.lac < lac:
                add.lac = lac
                add.digest = entry_digest(ledger_id, add.entry_id, lac, add.length, add.payload)

    def _explicit_lac_due(self) -> None:
        self._lac_timer = None
        lac = self._lac
        if lac <= self._max_piggybacked_lac or self._error is not None or self._lac_stopped:
            return
        self._spawn_write_lac(lac)

    def _spawn_write_lac(self, lac: int) -> None:
        """Count `lac` as told to the bookies and WRITE_LAC it, as a supervised job."""
        self._max_piggybacked_lac = lac
        task = spawn_job(
            f"ledger-{self.ledger_id}-lac",
            partial(self._write_lac, lac),
            kind="explicit_lac",
            on_failure=self._job_failed,
        )
        self._lac_tasks.add(task)
        task.add_done_callback(self._lac_tasks.discard)

    async def _write_lac(self, lac: int) -> None:
        """WRITE_LAC to the live bookies of the current ensemble; a bookie's failure only delays
        readers, anything else is a bug, reported."""
        bookies = [b for i, b in enumerate(self._ensemble) if not self._down_mask >> i & 1]
        results = await asyncio.gather(
            *(self._ctx.ops.write_lac(b, self.ledger_id, self._master_key, lac) for b in bookies),
            return_exceptions=True,
        )
        for bookie_id, result in zip(bookies, results, strict=True):
            if isinstance(result, BKError | asyncio.CancelledError):  # Expected: a bookie down.
                self._log.debug("explicit_lac_failed", bookie_id=bookie_id, error=str(result))
            elif isinstance(result, BaseException):  # A bug: logged at ERROR and counted.
                loop_supervisor().report("explicit_lac", result)

    def _stop_explicit_lac(self) -> None:
        self._lac_stopped = True
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None
        for task in self._lac_tasks:
            task.cancel()

    async def stop_explicit_lac(self) -> None:
        """No more WRITE_LACs from this handle, and none still running when this returns (its
        client is closing; closing the handle stops them too, without waiting for them)."""
        self._stop_explicit_lac()
        if self._lac_tasks:
            await asyncio.wait(list(self._lac_tasks))
