"""Closing a writer's ledger: seal the metadata CLOSED at the LAC once every add resolved.

`close` waits for the pending adds and a running ensemble change, stops the explicit LAC
pushes, then compare-and-swaps the metadata to CLOSED at (LAC, length) (`_seal`). A ledger that
another client recovered or closed meanwhile is not adopted: the writer gets LedgerFencedError,
unless the CLOSED record it finds is its own close, whose answer the store lost.

Part of `LedgerHandle` (a mixin over `HandleState`, see handle_state.py).
"""

from __future__ import annotations

import asyncio
import contextlib

from bkaio.errors import BKError, LedgerFencedError, MetadataVersionError
from bkaio.ledger_client.errors import copy_error
from bkaio.ledger_client.handle_state import FATAL_ADD_ERRORS, HandleState
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.ledger_metadata import LedgerState
from bkaio.meta.store import MAX_METADATA_ATTEMPTS, metadata_attempts_exhausted


class Sealing(HandleState):
    """The close of `LedgerHandle`."""

    async def close(self) -> None:
        """Wait for pending adds, then seal the ledger: metadata CLOSED at the LAC.

        Idempotent, also when called again before the first call returned: the later call
        waits for the first one's seal (which would otherwise look like another client's
        close). Raises LedgerFencedError when another client recovered (or closed) the
        ledger meanwhile; the ledger's end is then whatever that client sealed.
        """
        if self._closed:
            return
        async with self._close_lock:
            if not self._closed:
                await self._close()

    async def _close(self) -> None:
        self._closing = True
        if self._batch_timer is not None:  # A waiting burst goes now: nothing else will come.
            self._send_unsent(now=True)
        await self._idle.wait()
        if self._change_task is not None:
            with contextlib.suppress(BKError):
                await asyncio.shield(self._change_task)
        self._stop_explicit_lac()
        if isinstance(self._error, FATAL_ADD_ERRORS):
            self._closed = True
            raise copy_error(self._error)
        try:
            await self._seal()
        finally:
            self._closed = True
        self._log.info("ledger_closed", last_entry_id=self._lac, length=self._acked_length)

    async def _seal(self) -> None:
        """CAS the metadata to CLOSED at (LAC, length); adopt nothing but our own close."""
        ledgers = self._ctx.ledgers
        md = self._md
        outcome_unknown = False
        attempts = 0
        while True:
            if md.state is LedgerState.CLOSED:
                if outcome_unknown and (md.last_entry_id, md.length) == (
                    self._lac,
                    self._acked_length,
                ):
                    self._md = md
                    return  # Our own close landed before the store's answer was lost.
                raise LedgerFencedError(
                    f"ledger {self.ledger_id} was closed by another client at entry "
                    f"{md.last_entry_id} (this writer's LAC {self._lac})"
                )
            if md.state is not LedgerState.OPEN:
                raise LedgerFencedError(
                    f"ledger {self.ledger_id} is {md.state.name}: another client is recovering it"
                )
            if attempts == MAX_METADATA_ATTEMPTS:
                raise metadata_attempts_exhausted(
                    f"ledger {self.ledger_id}",
                    "recording its close",
                    "the ledger stays OPEN until a recovery seals it",
                )
            attempts += 1
            target = md.closed(self._lac, self._acked_length)
            try:
                self._md = await ledgers.update(target)
                return
            except MetadataVersionError:
                md = await ledgers.get(self.ledger_id)
            except MetadataOutcomeUnknownError:
                outcome_unknown = True
                md = await ledgers.get(self.ledger_id)
