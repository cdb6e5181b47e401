"""Re-replication of one ledger away from a set of bookies (BookKeeper's ReplicationWorker
inner loop and BookKeeperAdmin.recoverBookieData, reference/bookkeeper.md 7.3-7.4).

For each fragment held by one of the bookies to move off:
1. pick a replacement with the placement policy (writable, outside the segment's ensemble);
2. copy the fragment's entries: read each from a surviving bookie of its write set, check its
   digest, and write the same bytes to the replacement with RECOVERY_ADD (acknowledged only
   once durable there); a failing replacement is swapped for another;
3. CAS the ledger metadata: the replacement takes the bookie's slot in that segment.
The open tail (last segment of a ledger not CLOSED) is never rewritten under a live writer:
the caller decides when to fence and close the ledger first (`recover_open_tail`), after a
grace period in which the writer can move off the bookie by itself (an ensemble change).
The caller holds the ledger's under-replication lock while this runs.
"""

from __future__ import annotations

import asyncio
import enum
import os
import time
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass

import structlog

from bkaio.errors import (
    BKError,
    MetadataVersionError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
)
from bkaio.ledger_client.range_reads import read_copies
from bkaio.ledger_client.recovery import LedgerRecovery
from bkaio.ledger_client.types import StoredCopy
from bkaio.meta import LedgerMetadata
from bkaio.meta.errors import MetadataOutcomeUnknownError

from .cluster import ClusterView, MasterKeys
from .fragments import (
    Fragment,
    ReplicationError,
    fragment_entries,
    fragments_on,
    replace_in_segment,
)
from .metrics import AutorecoveryMetrics

log = structlog.get_logger(__name__)

_REPLACEMENT_ATTEMPTS = 3  # Replacements tried per fragment before giving up for now.


class Outcome(enum.Enum):
    DONE = "done"  # No fragment of the ledger is on the bookies any more.
    DEFERRED = "deferred"  # Only the open tail is left, waiting for its writer or a recovery.
    DELETED = "deleted"  # The ledger was deleted meanwhile.


@dataclass(frozen=True, slots=True)
class LedgerReplication:
    """What one `replicate_ledger` call did."""

    ledger_id: int
    outcome: Outcome
    fragments: int
    entries: int
    bytes: int
    recovered: bool  # The open ledger was fenced and closed first.
    seconds: float


class _ReplacementFailed(BKError):
    """The replacement bookie refused or lost an add: try another one."""


class Replicator:
    def __init__(
        self,
        view: ClusterView,
        keys: MasterKeys,
        metrics: AutorecoveryMetrics,
        *,
        entries_in_flight: int = 256,
    ) -> None:
        assert entries_in_flight > 0, entries_in_flight
        self._view = view
        self._keys = keys
        self._metrics = metrics
        self._entries_in_flight = entries_in_flight

    async def replicate_ledger(
        self, ledger_id: int, bookie_ids: Collection[str], *, recover_open_tail: bool
    ) -> LedgerReplication:
        """Move every fragment of `ledger_id` off `bookie_ids` (the open tail only after a
        fence-and-close, and only when `recover_open_tail`). Raises BKError when a fragment
        cannot be moved now (the caller retries later)."""
        started = time.monotonic()
        targets = frozenset(bookie_ids)
        fragments = entries = moved_bytes = 0
        recovered = False
        ledgers = self._view.metadata.ledgers
        while True:
            try:
                metadata = await ledgers.get(ledger_id)
            except NoSuchLedgerError:
                outcome = Outcome.DELETED
                break
            held = fragments_on(metadata, targets)
            if not held:
                outcome = Outcome.DONE
                break
            if any(f.open_tail for f in held) and recover_open_tail and not recovered:
                await self._recover(metadata)
                recovered = True
                continue
            closed = [f for f in held if not f.open_tail]
            if not closed:
                outcome = Outcome.DEFERRED
                break
            copied, copied_bytes = await self._move_fragment(metadata, closed[0], targets)
            fragments += 1
            entries += copied
            moved_bytes += copied_bytes
        seconds = time.monotonic() - started
        if outcome is not Outcome.DEFERRED:
            self._metrics.ledger_seconds.observe(seconds)
        result = LedgerReplication(
            ledger_id, outcome, fragments, entries, moved_bytes, recovered, seconds
        )
        log.info(
            "ledger_replicated",
            ledger_id=ledger_id,
            outcome=outcome.value,
            fragments=fragments,
            entries=entries,
            bytes=moved_bytes,
            recovered=recovered,
            seconds=round(seconds, 3),
        )
        return result

    async def _recover(self, metadata: LedgerMetadata) -> None:
        """Fence and close an open ledger whose writer did not move off the lost bookie."""
        key = await self._keys.master_key(metadata)
        if key is None:
            # No live bookie ever recorded a key, so none holds an entry: fencing with a
            # throwaway key still stops the writer (its adds become UNAUTHORIZED there).
            key = os.urandom(32)
        log.info("open_ledger_recovery", ledger_id=metadata.ledger_id)
        await LedgerRecovery(self._view.context, metadata, key).run()
        self._metrics.ledgers_recovered.inc()

    async def _move_fragment(
        self, metadata: LedgerMetadata, fragment: Fragment, targets: frozenset[str]
    ) -> tuple[int, int]:
        """Copy `fragment` to a replacement and swap it into the metadata; (entries, bytes)."""
        entry_ids = list(fragment_entries(fragment, metadata.ensemble_size, metadata.write_quorum))
        key = await self._keys.master_key(metadata) if entry_ids else None
        if entry_ids and key is None:
            raise ReplicationError(
                f"ledger {metadata.ledger_id}: entries {entry_ids[0]}..{entry_ids[-1]} of "
                f"{fragment.bookie_id} must be copied but no live bookie knows the ledger's key"
            )
        refused: set[str] = set()
        for _ in range(_REPLACEMENT_ATTEMPTS):
            try:
                replacement = self._view.placement.replace_bookie(
                    self._view.bookies,
                    fragment.ensemble,
                    fragment.bookie_index,
                    metadata.write_quorum,
                    exclude={*targets, *refused},
                )
            except NotEnoughBookiesError as error:
                raise ReplicationError(
                    f"ledger {metadata.ledger_id}: no replacement for {fragment.bookie_id} in "
                    f"the segment at entry {fragment.first_entry_id}: {error}"
                ) from None
            try:
                copied_bytes = await self._copy_entries(
                    metadata, fragment, entry_ids, replacement, key or b"", targets
                )
            except _ReplacementFailed as error:
                log.warning(
                    "replacement_bookie_failed",
                    ledger_id=metadata.ledger_id,
                    bookie_id=replacement,
                    error=str(error),
                )
                refused.add(replacement)
                continue
            await self._swap(metadata.ledger_id, fragment, replacement)
            self._metrics.fragments_replicated.inc()
            log.info(
                "fragment_replicated",
                ledger_id=metadata.ledger_id,
                first_entry_id=fragment.first_entry_id,
                last_entry_id=fragment.last_entry_id,
                from_bookie=fragment.bookie_id,
                to_bookie=replacement,
                entries=len(entry_ids),
            )
            return len(entry_ids), copied_bytes
        raise ReplicationError(
            f"ledger {metadata.ledger_id}: replacements {sorted(refused)} for "
            f"{fragment.bookie_id} all failed"
        )

    async def _copy_entries(
        self,
        metadata: LedgerMetadata,
        fragment: Fragment,
        entry_ids: list[int],
        replacement: str,
        key: bytes,
        targets: frozenset[str],
    ) -> int:
        """Copy `entry_ids` with a window of entries in flight; the payload bytes copied.

        The copies come from the client's range reads (`read_copies`: read ahead, digests
        checked, each entry from a surviving bookie of its write set, `targets` last)."""
        source = read_copies(
            self._view.context, metadata.ledger_id, metadata.write_quorum, metadata.ack_quorum,
            fragment.ensemble, fragment.first_entry_id, fragment.last_entry_id,
            fragment.bookie_index, {*targets, fragment.bookie_id},
        )  # fmt: skip
        read: deque[StoredCopy] = deque()
        reading = asyncio.Lock()
        copied = [0]

        async def next_copy() -> StoredCopy | None:
            async with reading:  # One reader of `source` at a time.
                if not read:
                    read.extend(await anext(source, []))
                return read.popleft() if read else None

        async def copy_some() -> None:
            while (copy := await next_copy()) is not None:  # Each entry to one copier.
                await self._write_copy(metadata.ledger_id, replacement, key, copy)
                copied[0] += len(copy.payload)
                self._metrics.entries_replicated.inc()
                self._metrics.bytes_replicated.inc(len(copy.payload))

        copiers = min(self._entries_in_flight, max(1, len(entry_ids)))
        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(copiers):
                    group.create_task(copy_some())
        finally:
            await source.aclose()
        return copied[0]

    async def _write_copy(
        self, ledger_id: int, replacement: str, key: bytes, copy: StoredCopy
    ) -> None:
        done: asyncio.Future[BKError | None] = asyncio.get_running_loop().create_future()

        def answered(error: BKError | None) -> None:
            if not done.done():
                done.set_result(error)

        self._view.pool.add_entry(
            replacement,
            ledger_id,
            copy.entry_id,
            recovery=True,
            master_key=key,
            lac=copy.lac,
            length=copy.length,
            digest=copy.digest,
            payload=copy.payload,
            callback=answered,
        )
        error = await done
        if error is not None:
            raise _ReplacementFailed(
                f"{replacement} refused entry {copy.entry_id} of ledger {ledger_id}: {error}"
            )

    async def _swap(self, ledger_id: int, fragment: Fragment, replacement: str) -> None:
        """CAS `replacement` into the fragment's slot (re-read and retry on a race)."""
        ledgers = self._view.metadata.ledgers
        while True:
            try:
                current = await ledgers.get(ledger_id)
            except NoSuchLedgerError:
                return
            updated = replace_in_segment(
                current,
                fragment.first_entry_id,
                fragment.bookie_index,
                fragment.bookie_id,
                replacement,
            )
            if updated is None:
                return  # Moved by someone else meanwhile; our copy is collected by GC.
            try:
                await ledgers.update(updated)
            except (MetadataVersionError, MetadataOutcomeUnknownError):
                continue  # The writer changed its ensemble (or we do not know): re-read.
            return
