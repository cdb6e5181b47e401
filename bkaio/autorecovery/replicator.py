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
The caller holds the ledger's under-replication lock while this runs, and passes its lease:
the store ties the lock to that lease but not the metadata CAS nor the fencing to the lock, so
each is done only while the store certainly holds the lease (`Lease.wait_confirmed`: after a
stalled event loop the lease is in doubt until the keep-alive's late refresh answers, and
another worker may have claimed the ledger once the store dropped it).

`fill_in_place` is the other repair: a live bookie whose fragments lack entries (found by the
ledger check, or a bookie leaving limbo) gets them copied back from the other bookies of each
entry's write set; the metadata does not change. `fill_ledger_in_place` (the workers' and the
drain's) then asks each bookie for its entry list (LIST_ENTRIES, `LedgerChecker`) and fails
while any entry is still lacking or a bookie cannot say: a mark is never completed on faith.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Collection
from dataclasses import dataclass

import structlog

from bkaio.errors import (
    BKError,
    MetadataVersionError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
)
from bkaio.ledger_client.recovery import LedgerRecovery
from bkaio.meta import LedgerMetadata
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.store import MAX_METADATA_ATTEMPTS, Lease

from .checker import LedgerChecker, missing_entries
from .cluster import ClusterView, MasterKeys
from .copier import CopyJob, CopyRefusedError, FragmentCopier
from .fragments import (
    Fragment,
    LockLeaseUnconfirmedError,
    ReplicationError,
    fragment_entries,
    fragments_on,
    replace_in_segment,
)
from .metrics import AutorecoveryMetrics

log = structlog.get_logger(__name__)

_REPLACEMENT_ATTEMPTS = 3  # Replacements tried per fragment before giving up for now.
_READERS = 32  # Entry-by-entry reads in flight per fragment (E > Qw).


async def check_lock_lease(lease: Lease, ledger_id: int, step: str) -> None:
    """Return when the store certainly holds `lease` (waiting while it is in doubt, bounded:
    `Lease.wait_confirmed`); LockLeaseUnconfirmedError, naming `step`, when it does not. For
    the steps the store does not tie to the lock: a swap of the ledger's ensemble, fencing it,
    dropping its mark (each a write of another key)."""
    if not await lease.wait_confirmed():
        raise LockLeaseUnconfirmedError(
            f"ledger {ledger_id}: not {step}: the lease of its under-replication lock is lost "
            "or unconfirmed, so another worker may hold the lock now (given back; claimed "
            "again under a sound lease)",
            ledger_id=ledger_id,
        )


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


class Replicator:
    def __init__(
        self,
        view: ClusterView,
        keys: MasterKeys,
        metrics: AutorecoveryMetrics,
        *,
        entries_in_flight: int = 256,
    ) -> None:
        self._view = view
        self._keys = keys
        self._metrics = metrics
        self._copier = FragmentCopier(view, metrics, entries_in_flight=entries_in_flight)
        self._checker = LedgerChecker(view, metrics)

    def registered(self) -> set[str]:
        """Ids of the bookies registered now (writable or read-only)."""
        return self._view.registered()

    async def replicate_ledger(
        self,
        ledger_id: int,
        bookie_ids: Collection[str],
        *,
        recover_open_tail: bool,
        lock_lease: Lease,
    ) -> LedgerReplication:
        """Move every fragment of `ledger_id` off `bookie_ids` (the open tail only after a
        fence-and-close, and only when `recover_open_tail`). Raises one ReplicationError (its
        `ledger_id` set; EntryUnreadableError when no copy of an entry is readable) when the
        ledger cannot be moved now: the caller retries later. `lock_lease`: the lease of the
        ledger's lock the caller holds; LockLeaseUnconfirmedError (nothing fenced or swapped
        after it) when the store may have dropped it."""
        try:
            return await self._replicate(ledger_id, bookie_ids, recover_open_tail, lock_lease)
        except ReplicationError as error:
            error.ledger_id = ledger_id
            raise
        except BKError as error:
            raise ReplicationError(
                f"ledger {ledger_id}: {type(error).__name__}: {error}", ledger_id=ledger_id
            ) from error

    async def _replicate(
        self,
        ledger_id: int,
        bookie_ids: Collection[str],
        recover_open_tail: bool,
        lock_lease: Lease,
    ) -> LedgerReplication:
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
                await check_lock_lease(lock_lease, ledger_id, "fencing its open tail")
                await self.recover_open_ledger(metadata)
                recovered = True
                continue
            closed = [f for f in held if not f.open_tail]
            if not closed:
                outcome = Outcome.DEFERRED
                break
            copied, copied_bytes = await self._move_fragment(
                metadata, closed[0], targets, lock_lease
            )
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

    async def fill_ledger_in_place(
        self, ledger_id: int, bookie_ids: Collection[str]
    ) -> tuple[int, int]:
        """`fill_in_place` on the ledger's current metadata (nothing when it was deleted), then
        a check that each bookie now holds every entry of its closed fragments; one
        ReplicationError when either fails (an entry still lacking, a bookie that cannot give
        its entry list)."""
        try:
            metadata = await self._view.metadata.ledgers.get(ledger_id)
        except NoSuchLedgerError:
            return 0, 0
        try:
            copied = await self.fill_in_place(metadata, bookie_ids)
            check = await self._checker.check(metadata, bookie_ids)
        except ReplicationError:
            raise
        except BKError as error:
            raise ReplicationError(
                f"ledger {ledger_id}: {type(error).__name__}: {error}", ledger_id=ledger_id
            ) from error
        if check.incomplete or check.unchecked:
            lacking = {bookie: len(ids) for bookie, ids in check.incomplete.items()}
            raise ReplicationError(
                f"ledger {ledger_id}: after copying, entries still lacking {lacking}, "
                f"entry lists not given {check.unchecked}",
                ledger_id=ledger_id,
            )
        return copied

    async def fill_in_place(
        self, metadata: LedgerMetadata, bookie_ids: Collection[str]
    ) -> tuple[int, int]:
        """Copy to each of `bookie_ids` the entries of its closed fragments of the ledger, from
        the other bookies of each entry's write set (never from itself); entries it holds are
        taken again as duplicates. (entries, payload bytes) copied; a ReplicationError when an
        entry has no readable copy or the bookie refuses."""
        entries = payload_bytes = 0
        key: bytes | None = None
        for fragment in fragments_on(metadata, bookie_ids):
            if fragment.open_tail:
                continue  # Its writer's: never written behind a live writer's back.
            # Whether it has an entry at all: `any` over the ids would skip a fragment holding
            # entry 0 only (a one-entry ledger), whose mark was then completed without the copy.
            entries_of = fragment_entries(fragment, metadata.ensemble_size, metadata.write_quorum)
            if next(entries_of, None) is None:
                continue
            if key is None:
                key = await self._keys.master_key(metadata)
                if key is None:
                    raise ReplicationError(
                        f"ledger {metadata.ledger_id}: no live bookie knows its master key, so "
                        f"no entry can be copied back to {fragment.bookie_id}",
                        ledger_id=metadata.ledger_id,
                    )
            job = CopyJob(
                metadata,
                fragment,
                fragment.bookie_id,
                key,
                avoid=frozenset({fragment.bookie_id}),
                origin_readable=False,  # It lacks entries (or is in limbo): read the others.
            )
            try:
                copied, copied_bytes = await self._copier.copy(job)
            except CopyRefusedError as error:
                raise ReplicationError(str(error), ledger_id=metadata.ledger_id) from error
            entries += copied
            payload_bytes += copied_bytes
        log.info(
            "ledger_filled_in_place",
            ledger_id=metadata.ledger_id,
            bookies=sorted(bookie_ids),
            entries=entries,
        )
        return entries, payload_bytes

    async def recover_open_ledger(self, metadata: LedgerMetadata) -> LedgerMetadata:
        """Fence and close an open ledger (its writer did not move off a lost bookie, or a
        bookie in limbo holds part of its open tail); the CLOSED metadata."""
        key = await self._keys.master_key(metadata)
        if key is None:
            # No live bookie of the ledger recorded its key. A made-up key cannot fence: a
            # bookie checking keys against the metadata refuses it (UNAUTHORIZED), and one
            # that takes the first key it sees would record it and then refuse the writer's
            # and every later recovery's adds. The bookies holding the key (and so the
            # entries) are down or wiped: retry once one is back.
            raise ReplicationError(
                f"ledger {metadata.ledger_id}: no live bookie of the ledger holds its master "
                "key, so its open tail cannot be fenced now (retried: the bookies that hold "
                "it are down or wiped)",
                ledger_id=metadata.ledger_id,
            )
        log.info("open_ledger_recovery", ledger_id=metadata.ledger_id)
        closed = await LedgerRecovery(self._view.context, metadata, key).run()
        self._metrics.ledgers_recovered.inc()
        return closed

    async def _move_fragment(
        self,
        metadata: LedgerMetadata,
        fragment: Fragment,
        targets: frozenset[str],
        lock_lease: Lease,
    ) -> tuple[int, int]:
        """Copy `fragment` to a replacement and swap it into the metadata, the lock's lease
        confirmed first; (entries, bytes)."""
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
            job = CopyJob(metadata, fragment, replacement, key or b"", targets)
            try:
                _, copied_bytes = await self._copier.copy(job)
                await self._check_copy(metadata.ledger_id, replacement, entry_ids)
            except CopyRefusedError as error:
                log.warning(
                    "replacement_bookie_failed",
                    ledger_id=metadata.ledger_id,
                    bookie_id=replacement,
                    error=str(error),
                )
                refused.add(replacement)
                continue
            # A copy not swapped in (the lease lost meanwhile) is collected by GC.
            await check_lock_lease(
                lock_lease,
                metadata.ledger_id,
                f"swapping {replacement} in for {fragment.bookie_id}",
            )
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

    async def _check_copy(self, ledger_id: int, replacement: str, entry_ids: list[int]) -> None:
        """CopyRefusedError unless `replacement` lists every one of `entry_ids` (LIST_ENTRIES)
        now: acknowledged adds alone put a bookie whose storage lost one into the ledger, and
        nothing looked again until the next ledger check."""
        if not entry_ids:
            return
        try:
            held = await self._view.pool.list_entries(replacement, ledger_id)
        except BKError as error:
            raise CopyRefusedError(
                f"{replacement} gave no entry list of ledger {ledger_id} after the copy: "
                f"{type(error).__name__}: {error}"
            ) from error
        lacking = missing_entries(entry_ids, held)
        if lacking:
            raise CopyRefusedError(
                f"{replacement} acknowledged the copy of ledger {ledger_id} but lacks "
                f"{len(lacking)} of its entries (first: {lacking[0]})"
            )

    async def _swap(self, ledger_id: int, fragment: Fragment, replacement: str) -> None:
        """CAS `replacement` into the fragment's slot (re-read and retry on a race), at most
        MAX_METADATA_ATTEMPTS times, as a writer's ensemble change does: a store that kept
        losing the answers was retried back to back for ever, the ledger's lock held."""
        ledgers = self._view.metadata.ledgers
        for _attempt in range(MAX_METADATA_ATTEMPTS):
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
        raise ReplicationError(
            f"ledger {ledger_id}: gave up putting {replacement} in place of "
            f"{fragment.bookie_id} in the segment at entry {fragment.first_entry_id} after "
            f"{MAX_METADATA_ATTEMPTS} compare-and-swap attempts (retried; a copy never swapped "
            "in is collected by GC)"
        )
