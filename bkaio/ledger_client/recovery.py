"""Ledger recovery: fence, find the end, re-replicate, seal (BookKeeper's LedgerRecoveryOp).

With the two fixes the TLA+ model found (reference/faults.md A2):
1. CAS the metadata OPEN -> IN_RECOVERY (already IN_RECOVERY: go on; CLOSED: nothing to do).
2. Fencing READ_LAC to every bookie of the last segment until every write set has
   Qw - Qa + 1 answers: no ack quorum of the old writer is left unfenced.
3. Start at max(highest LAC seen, first entry of the last segment - 1): never reach into
   earlier segments, which are immutable.
4. Read forward with FENCING reads; an entry is present with one digest-valid copy, absent
   once Qw - Qa + 1 bookies of its write set say no; anything else stops recovery with an
   error and leaves the ledger unsealed.
5. Re-write each found entry (the same bytes) to its write set with RECOVERY_ADD until every
   live bookie of its write set holds it; a failing bookie is replaced by an ensemble change,
   in local segments that start after start (recovery_rewrite.py, BookKeeper's recovery add
   path), so the sealed ledger never names a dead bookie that a spare could replace.
6. CAS to CLOSED with the agreed last entry and length (and the local segments, if any). If
   someone else closed first, adopt their close; a CAS lost otherwise (autorecovery moved a
   fragment of an earlier segment) is retried on the record as it is then. A CAS whose
   outcome is unknown is re-read. Steps 1 and 6 each try at most MAX_METADATA_ATTEMPTS
   compare-and-swaps (MetadataError after that).
Imports no transport code.

`RecoveryReadPolicy` is the seam the fault suite's mutation check uses: production reads
through `FENCED_RECOVERY_READS` (the client's own bookie operations, fencing as written here);
bkaio.testing.mutations has one that drops the FENCE flag (BookKeeper issue 2614), which the
suite's tests pass to the `BookKeeper` constructor to prove that their checker catches it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import Sequence
from typing import Final, Protocol

import structlog

from bkaio.errors import BKError, MetadataError, MetadataVersionError
from bkaio.ledger_client.context import ClientContext
from bkaio.ledger_client.errors import LedgerRecoveryError
from bkaio.ledger_client.quorum import Segment, bookies_for_entry, with_new_segment, write_set
from bkaio.ledger_client.reads import EntryReader
from bkaio.ledger_client.recovery_rewrite import RecoveryRewrite
from bkaio.ledger_client.types import BookieOps, StoredCopy
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.ledger_metadata import LedgerMetadata, LedgerState
from bkaio.meta.store import MAX_METADATA_ATTEMPTS, metadata_attempts_exhausted

log = structlog.get_logger(__name__)

# Fencing reads kept in flight ahead of the entry being decided. Reads past the end are
# harmless (they only fence), and a window hides the round trip per entry.
_RECOVERY_READ_WINDOW = 16


class RecoveryReadPolicy(Protocol):
    def reader_ops(self, ops: BookieOps) -> BookieOps:
        """The bookie operations a recovery reads (and fences) through, given the client's."""


class FencedRecoveryReads:
    """Production: recovery reads go to the bookies as this module sends them, with FENCE."""

    def reader_ops(self, ops: BookieOps) -> BookieOps:
        return ops


FENCED_RECOVERY_READS: Final = FencedRecoveryReads()


class LedgerRecovery:
    """One recovery attempt of one ledger by this client."""

    def __init__(
        self,
        context: ClientContext,
        metadata: LedgerMetadata,
        master_key: bytes,
        recovery_reads: RecoveryReadPolicy = FENCED_RECOVERY_READS,
    ) -> None:
        self._ctx = context
        self._md = metadata
        self._master_key = master_key
        self.ledger_id = metadata.ledger_id
        context = dataclasses.replace(context, ops=recovery_reads.reader_ops(context.ops))
        self._reader = EntryReader(
            context, metadata.ledger_id, metadata.write_quorum, metadata.ack_quorum
        )
        self._log = log.bind(ledger_id=self.ledger_id)

    async def run(self) -> LedgerMetadata:
        """Recover and seal the ledger; returns the CLOSED metadata (ours or the winner's)."""
        md = await self._mark_in_recovery()
        if md.is_closed:
            return md
        first_of_last, ensemble = md.ensembles[-1]
        lac = await self._reader.read_lac(ensemble, fence=True, master_key=self._master_key)
        start = max(lac, first_of_last - 1)
        self._log.info("ledger_recovery_started", last_add_confirmed=lac, start_entry_id=start)
        length = 0
        if start >= 0:
            bookies = bookies_for_entry(md.ensembles, start, md.write_quorum)
            try:
                length = (await self._reader.read_entry(bookies, start)).length
            except BKError as error:
                # The LAC entry's length is part of the seal: without a copy of it this attempt
                # cannot finish; the ledger stays IN_RECOVERY and a later attempt retries.
                raise LedgerRecoveryError(
                    f"ledger {self.ledger_id}: entry {start} (the last add confirmed) "
                    f"could not be read: {error}"
                ) from error
        found = await self._read_forward(ensemble, start + 1, md.write_quorum)
        last_entry_id = start + len(found)
        if found:
            length = found[-1].length
        rewrite = RecoveryRewrite(
            self._ctx, self.ledger_id, self._master_key, md.write_quorum, md.ack_quorum
        )
        segments = await rewrite.run(found, ensemble)
        closed = await self._seal(md, segments, last_entry_id, length)
        self._log.info(
            "ledger_recovered",
            last_entry_id=closed.last_entry_id,
            length=closed.length,
            recovered_entries=len(found),
            adopted=closed.last_entry_id != last_entry_id,
        )
        return closed

    # ----------------------------------------------------------------- metadata

    async def _mark_in_recovery(self) -> LedgerMetadata:
        ledgers = self._ctx.ledgers
        md = self._md
        for _attempt in range(MAX_METADATA_ATTEMPTS):
            if md.state is not LedgerState.OPEN:
                return md
            try:
                return await ledgers.update(md.with_state(LedgerState.IN_RECOVERY))
            except (MetadataVersionError, MetadataOutcomeUnknownError):
                md = await ledgers.get(self.ledger_id)
        if md.state is not LedgerState.OPEN:
            return md
        raise self._too_many_attempts("marking it IN_RECOVERY")

    async def _seal(
        self, md: LedgerMetadata, segments: Sequence[Segment], last_entry_id: int, length: int
    ) -> LedgerMetadata:
        """CAS `md` to CLOSED at (`last_entry_id`, `length`) with the re-write's `segments`.

        A lost CAS is retried on the record as it is then: autorecovery may have moved a
        fragment of an earlier segment meanwhile (it leaves only the open tail alone), which a
        seal of the ensembles read before would undo. The re-write's segments start at or
        after the last segment's first entry, so they apply on top of any such record.
        """
        ledgers = self._ctx.ledgers

        def sealed(current: LedgerMetadata) -> LedgerMetadata:
            ensembles = current.ensembles
            for first_entry_id, bookies in segments:
                ensembles = with_new_segment(ensembles, first_entry_id, bookies)
            return current.replace(ensembles=ensembles).closed(last_entry_id, length)

        target = sealed(md)
        for _attempt in range(MAX_METADATA_ATTEMPTS):
            try:
                return await ledgers.update(target)
            except (MetadataVersionError, MetadataOutcomeUnknownError):
                current = await ledgers.get(self.ledger_id)
            if current.is_closed:
                return current  # Ours (an unknown outcome that landed) or another recovery's.
            if current.state is not LedgerState.IN_RECOVERY:
                raise LedgerRecoveryError(
                    f"ledger {self.ledger_id} went back to {current.state.name} during recovery"
                )
            target = sealed(current)
        raise self._too_many_attempts("sealing it")

    def _too_many_attempts(self, step: str) -> MetadataError:
        return metadata_attempts_exhausted(
            f"ledger {self.ledger_id}: recovery",
            step,
            "the ledger stays as it is; opening it retries",
        )

    # ----------------------------------------------------------------- reading forward

    async def _read_forward(
        self, ensemble: tuple[str, ...], first_entry_id: int, write_quorum: int
    ) -> list[StoredCopy]:
        """Fencing reads from `first_entry_id` on, until the first absent entry."""
        size = len(ensemble)

        def read(entry_id: int) -> asyncio.Task[StoredCopy | None]:
            bookies = [ensemble[i] for i in write_set(entry_id, size, write_quorum)]
            return asyncio.ensure_future(
                self._reader.recovery_read(bookies, entry_id, self._master_key)
            )

        found: list[StoredCopy] = []
        tasks: deque[asyncio.Task[StoredCopy | None]] = deque()
        next_id = first_entry_id
        try:
            while True:
                while len(tasks) < _RECOVERY_READ_WINDOW:
                    tasks.append(read(next_id))
                    next_id += 1
                copy = await tasks.popleft()
                if copy is None:
                    return found
                found.append(copy)
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
