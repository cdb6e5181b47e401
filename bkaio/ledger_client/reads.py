"""Quorum reads: one entry with fail-over, fencing recovery reads, LAC reads.

(Ranges of entries: range_reads.py, which falls back on `read_entry` for single entries; long
polls: tailing.py.)

The decisions (docs/client.md):
- An entry read tries its write set in order, failing over on errors and timeouts, and
  optionally asks the next bookie after `speculative_read_timeout`. Every copy's digest is
  checked; a corrupt copy is skipped, never returned. The entry is absent (NoSuchEntryError)
  only when Qw - Qa + 1 bookies of its write set said NO_SUCH_ENTRY / NO_SUCH_LEDGER; bookies
  that did not answer never count as "no" (BookieUnavailableError instead).
- A recovery read goes to the whole write set at once with FENCE: present as soon as one
  digest-valid copy arrives, absent at Qw - Qa + 1 negatives, otherwise an error.
- A LAC read asks every bookie of a segment and completes on quorum coverage: every write
  set has Qw - Qa + 1 answers (with FENCE this is what stops the old writer).
Imports no transport code (bookies are reached through `ClientContext.ops`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import structlog

from bkaio.errors import (
    BKError,
    BookieUnavailableError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from bkaio.ledger_client.context import ClientContext
from bkaio.ledger_client.errors import LedgerRecoveryError
from bkaio.ledger_client.quorum import has_quorum_coverage, negatives_for_absence
from bkaio.ledger_client.types import LacAnswer, StoredCopy
from bkaio.protocol.digest import verify_entry_digest

log = structlog.get_logger(__name__)

_NEGATIVE = (NoSuchEntryError, NoSuchLedgerError)


async def cancel_all(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel the unfinished and collect every outcome, so no exception goes unretrieved."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


class EntryReader:
    """Reads of one ledger's entries and LAC, shared by read handles and recovery."""

    def __init__(
        self, context: ClientContext, ledger_id: int, write_quorum: int, ack_quorum: int
    ) -> None:
        self._ctx = context
        self.ledger_id = ledger_id
        self._write_quorum = write_quorum
        self._ack_quorum = ack_quorum
        self._negatives_needed = negatives_for_absence(write_quorum, ack_quorum)

    def _valid(self, copy: StoredCopy, entry_id: int) -> bool:
        return copy.entry_id == entry_id and verify_entry_digest(
            self.ledger_id, entry_id, copy.lac, copy.length, copy.payload, copy.digest
        )

    def _corrupt(self, bookie_id: str, entry_id: int) -> str:
        log.warning(
            "entry_copy_corrupt", ledger_id=self.ledger_id, entry_id=entry_id, bookie_id=bookie_id
        )
        return f"{bookie_id}: corrupt copy (digest mismatch)"

    # ----------------------------------------------------------------- entry reads

    async def read_entry(self, bookies: Sequence[str], entry_id: int) -> StoredCopy:
        """The entry from the first bookie of its write set (`bookies`, in order) that has a
        digest-valid copy. NoSuchEntryError / BookieUnavailableError as described above."""
        speculative = self._ctx.config.speculative_read_timeout
        if speculative is None:
            return await self._read_in_order(bookies, entry_id)
        return await self._read_speculative(bookies, entry_id, speculative)

    async def _read_in_order(self, bookies: Sequence[str], entry_id: int) -> StoredCopy:
        ops = self._ctx.ops
        negatives = 0
        failures: list[str] = []
        for bookie_id in bookies:
            try:
                copy = await ops.read_entry(bookie_id, self.ledger_id, entry_id)
            except _NEGATIVE:
                negatives += 1
                failures.append(f"{bookie_id}: no such entry")
                continue
            except BKError as error:
                failures.append(f"{bookie_id}: {type(error).__name__}: {error}")
                continue
            if self._valid(copy, entry_id):
                return copy
            failures.append(self._corrupt(bookie_id, entry_id))
        raise self._read_failure(entry_id, negatives, failures)

    async def _read_speculative(
        self, bookies: Sequence[str], entry_id: int, delay: float
    ) -> StoredCopy:
        ops = self._ctx.ops
        tasks: dict[asyncio.Task[StoredCopy], str] = {}
        negatives = 0
        failures: list[str] = []
        next_index = 0

        def launch() -> None:
            nonlocal next_index
            bookie_id = bookies[next_index]
            next_index += 1
            task = asyncio.ensure_future(ops.read_entry(bookie_id, self.ledger_id, entry_id))
            tasks[task] = bookie_id

        launch()
        try:
            while tasks:
                more = next_index < len(bookies)
                done, _ = await asyncio.wait(
                    tasks, timeout=delay if more else None, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    launch()  # The slow bookie keeps its chance; another one races it.
                    continue
                for task in done:
                    bookie_id = tasks.pop(task)
                    error = task.exception()
                    if error is None:
                        copy = task.result()
                        if self._valid(copy, entry_id):
                            return copy
                        failures.append(self._corrupt(bookie_id, entry_id))
                    elif isinstance(error, _NEGATIVE):
                        negatives += 1
                        failures.append(f"{bookie_id}: no such entry")
                    elif isinstance(error, BKError):
                        failures.append(f"{bookie_id}: {type(error).__name__}: {error}")
                    else:
                        raise error
                if not tasks and next_index < len(bookies):
                    launch()
        finally:
            await cancel_all(list(tasks))
        raise self._read_failure(entry_id, negatives, failures)

    def _read_failure(self, entry_id: int, negatives: int, failures: list[str]) -> BKError:
        detail = "; ".join(failures)
        if negatives >= self._negatives_needed:
            return NoSuchEntryError(
                f"ledger {self.ledger_id}: entry {entry_id} is absent: {negatives} bookies of "
                f"its write set said no ({detail})"
            )
        return BookieUnavailableError(
            f"ledger {self.ledger_id}: entry {entry_id}: too few bookies answered to decide "
            f"({negatives} said no, {self._negatives_needed} needed; {detail})"
        )

    async def recovery_read(
        self, bookies: Sequence[str], entry_id: int, master_key: bytes
    ) -> StoredCopy | None:
        """Fencing read of `entry_id` from its whole write set: the copy, or None if absent.

        LedgerRecoveryError when neither one valid copy nor Qw - Qa + 1 negatives came back.
        """
        ops = self._ctx.ops
        tasks = {
            asyncio.ensure_future(
                ops.read_entry(
                    bookie_id, self.ledger_id, entry_id, fence=True, master_key=master_key
                )
            ): bookie_id
            for bookie_id in bookies
        }
        negatives = 0
        failures: list[str] = []
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    bookie_id = tasks[task]
                    error = task.exception()
                    if error is None:
                        copy = task.result()
                        if self._valid(copy, entry_id):
                            return copy
                        failures.append(self._corrupt(bookie_id, entry_id))
                    elif isinstance(error, _NEGATIVE):
                        negatives += 1
                        if negatives >= self._negatives_needed:
                            return None
                    elif isinstance(error, UnauthorizedError):
                        raise error
                    elif isinstance(error, BKError):
                        failures.append(f"{bookie_id}: {type(error).__name__}: {error}")
                    else:
                        raise error
        finally:
            await cancel_all(list(tasks))
        raise LedgerRecoveryError(
            f"ledger {self.ledger_id}: recovery cannot decide entry {entry_id}: no valid copy "
            f"and {negatives} of {self._negatives_needed} needed negatives "
            f"({'; '.join(failures)})"
        )

    # ----------------------------------------------------------------- LAC reads

    async def read_lac(
        self, ensemble: Sequence[str], *, fence: bool = False, master_key: bytes | None = None
    ) -> int:
        """Max LAC over the segment's bookies, once every write set has Qw - Qa + 1 answers.

        With `fence`, every answering bookie has durably fenced the ledger. NO_SUCH_LEDGER
        counts as an answer (LAC -1). UnauthorizedError at once on a wrong master key;
        BookieUnavailableError (LedgerRecoveryError when fencing) without coverage.
        """
        ops = self._ctx.ops
        tasks: dict[asyncio.Task[LacAnswer], int] = {
            asyncio.ensure_future(
                ops.read_lac(bookie_id, self.ledger_id, fence=fence, master_key=master_key)
            ): index
            for index, bookie_id in enumerate(ensemble)
        }
        answered: set[int] = set()
        best = -1
        failures: list[str] = []
        size = len(ensemble)
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    index = tasks[task]
                    error = task.exception()
                    if error is None:
                        best = max(best, task.result().lac)
                        answered.add(index)
                    elif isinstance(error, NoSuchLedgerError):
                        answered.add(index)
                    elif isinstance(error, UnauthorizedError):
                        raise error
                    elif isinstance(error, BKError):
                        failures.append(f"{ensemble[index]}: {type(error).__name__}: {error}")
                    else:
                        raise error
                if has_quorum_coverage(answered, size, self._write_quorum, self._ack_quorum):
                    return best
        finally:
            await cancel_all(list(tasks))
        message = (
            f"ledger {self.ledger_id}: only {len(answered)} of {size} bookies answered "
            f"READ_LAC{' with fencing' if fence else ''}, not every write set has "
            f"{self._negatives_needed} answers ({'; '.join(failures)})"
        )
        raise LedgerRecoveryError(message) if fence else BookieUnavailableError(message)
