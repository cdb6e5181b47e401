"""Garbage collection of one bookie shard (BookKeeper's GarbageCollectorThread, reference 6).

Each run compares the ledgers the shard holds with the metadata:
- a ledger with no metadata is *deleted*: its index entries and state are dropped;
- a ledger whose metadata no longer names this bookie in any segment is *over-replicated*
  (re-replication or a decommission moved it away): dropped too, unless it is marked
  under-replicated or locked (a copy to this bookie may be in flight).
Metadata lags: a ledger's first entries can reach a bookie moments after its metadata appears
to a scan, or a replicator copies a fragment here just before it CASes the metadata. So a
ledger is collected only when it was a candidate in two scans at least `grace` seconds apart
(and still is). The local list is taken *before* the metadata list, so a ledger created
between the two is never a candidate. After deleting, `compact()` reclaims the entry-log
space; compaction also runs every `compaction_interval_seconds`.

An over-replicated ledger is deleted while this bookie holds its under-replication lock
(BookKeeper's GC does the same): the lock first, then the metadata and the mark read again,
then the delete, then the lock given back. A replicator claims a ledger (that lock) before it
copies anything, so none can start copying the ledger here between the last look at the
metadata and the delete; checked without the lock, a copy that started in that window (a
ledger marked and claimed just then, with this bookie as the replacement) was deleted under
it, and the metadata then named this bookie for entries it had lost. A ledger whose lock a
replicator holds is left for a later run. The locks live as long as the run's lease: once it is
in doubt (lost, or no refresh confirmed within its TTL by this process's clock, even if a late
refresh may still find it alive) a replicator may hold them, so the run checks it before
confirming each over-replicated ledger, before the delete, and once more inside the delete
after the storage's checkpoint (which waits for the flush lock and writes) with nothing awaited
between that check and the drop, and leaves every over-replicated ledger for a later run once
it is in doubt.

Only a *closed* ledger is ever over-replicated (BookKeeper's GC skips the others too): an open
ledger's writer may pick this bookie in an ensemble change at any moment, and its new entries
would land on a shard that deletes the ledger after its last look at the metadata; the lock
keeps replicators away, not writers.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import structlog

from bkaio.entrylog.types import CompactionReport
from bkaio.errors import BKError, NoSuchLedgerError
from bkaio.meta import Metadata
from bkaio.meta.errors import InvalidMetadataError

log = structlog.get_logger(__name__)

# The lease of the locks a run holds while it deletes: kept alive meanwhile; a bookie that dies
# mid-run keeps replicators off those ledgers this long at most.
LOCK_LEASE_TTL_SECONDS = 30.0


class GcStorage(Protocol):
    def ledger_ids(self) -> list[int]: ...

    async def delete_ledgers(
        self,
        ledger_ids: Iterable[int],
        *,
        confirm: Callable[[list[int]], Collection[int]] | None = None,
    ) -> list[int]:
        """Drop the ledgers (those `confirm` returns, asked after the checkpoint that comes
        first, just before the drop); the ids dropped."""
        ...

    async def compact(self) -> CompactionReport: ...


class Placement(NamedTuple):
    """Where a ledger's metadata puts it, as far as collection cares."""

    bookies: frozenset[str]  # Named by any of its segments.
    closed: bool  # Sealed: no writer can add this bookie to it any more.


class LeaseState(Protocol):
    @property
    def in_doubt(self) -> bool:
        """True while the lease may be gone from the store (and the locks bound to it)."""
        ...


@dataclass(frozen=True, slots=True)
class HeldLocks:
    """The under-replication locks a run took, and the lease they are bound to."""

    ids: frozenset[int]
    lease: LeaseState


class GcMetadata(Protocol):
    async def ledger_ids(self) -> set[int]:
        """Every ledger id in metadata."""
        ...

    async def placement(self, ledger_id: int) -> Placement | None:
        """The ledger's bookies and whether it is closed; None if it has no metadata."""
        ...

    async def marked(self, ledger_id: int) -> bool:
        """Marked under-replicated (a replicator may be copying it, perhaps here)."""
        ...

    def hold(self, ledger_ids: Collection[int]) -> AbstractAsyncContextManager[HeldLocks]:
        """Take the under-replication lock of each of `ledger_ids` that nobody holds; the
        context's value names the ids taken and their lease, the locks given back on exit.
        While one is held (its lease not lost) no replicator can claim that ledger."""
        ...


@dataclass(frozen=True, slots=True)
class GcReport:
    local_ledgers: int
    deleted: tuple[int, ...]  # Absent from metadata.
    overreplicated: tuple[int, ...]  # In metadata, but no segment names this bookie.
    candidates: int  # Waiting for a second scan or the grace period.
    compaction: CompactionReport | None


class GarbageCollector:
    def __init__(
        self,
        storage: GcStorage,
        metadata: GcMetadata,
        *,
        bookie_id: str,
        grace_seconds: float,
        collect_overreplicated: bool = True,
        overreplicated_grace_seconds: float = 3600.0,
        compact_after_delete: bool = True,
        compaction_interval_seconds: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._storage = storage
        self._metadata = metadata
        self._bookie_id = bookie_id
        self._grace = grace_seconds
        self._collect_over = collect_overreplicated
        self._over_grace = overreplicated_grace_seconds
        self._compact_after_delete = compact_after_delete
        self._compaction_interval = compaction_interval_seconds
        self._clock = clock
        self._missing_since: dict[int, float] = {}
        self._unnamed_since: dict[int, float] = {}
        self._last_compaction = clock()

    @staticmethod
    def _due(candidates: set[int], since: dict[int, float], now: float, grace: float) -> list[int]:
        """Track candidates; those seen in an earlier scan at least `grace` ago are due."""
        for ledger_id in list(since):
            if ledger_id not in candidates:
                del since[ledger_id]  # Back in metadata (or gone): start over if it returns.
        due = [i for i in sorted(candidates) if i in since and now - since[i] >= grace]
        for ledger_id in candidates:
            since.setdefault(ledger_id, now)
        return due

    async def run_once(self) -> GcReport:
        local = set(self._storage.ledger_ids())  # Before the metadata list: see the docstring.
        in_metadata = await self._metadata.ledger_ids()
        now = self._clock()
        deleted_due = self._due(local - in_metadata, self._missing_since, now, self._grace)
        over_due: list[int] = []
        if self._collect_over:
            unnamed: set[int] = set()
            for ledger_id in sorted(local & in_metadata):
                if self._overreplicated(await self._metadata.placement(ledger_id)):
                    unnamed.add(ledger_id)
            over_due = self._due(unnamed, self._unnamed_since, now, self._over_grace)
        if over_due:
            async with self._metadata.hold(over_due) as held:  # Deleted while held.
                removed = await self._delete(deleted_due, held, over_due)
        else:
            removed = await self._delete(deleted_due, None, [])
        compaction = None
        if (removed and self._compact_after_delete) or (
            now - self._last_compaction >= self._compaction_interval
        ):
            compaction = await self._storage.compact()
            self._last_compaction = now
        report = GcReport(
            local_ledgers=len(local),
            deleted=tuple(i for i in removed if i in set(deleted_due)),
            overreplicated=tuple(i for i in removed if i not in set(deleted_due)),
            candidates=len(self._missing_since) + len(self._unnamed_since),
            compaction=compaction,
        )
        if removed:
            log.info(
                "gc_collected",
                bookie_id=self._bookie_id,
                deleted=list(report.deleted),
                overreplicated=list(report.overreplicated),
                bytes_freed=compaction.bytes_freed if compaction else 0,
            )
        return report

    async def _delete(
        self, deleted_due: list[int], held: HeldLocks | None, over_due: list[int]
    ) -> list[int]:
        """Delete what `_confirm` confirms: the over-replicated ledgers only while `held`'s
        lease is not in doubt (checked before each is confirmed, before the delete, and once
        more inside it, after its checkpoint and just before the drop); once it is, they are
        left for a later run."""
        over_held = [] if held is None else [i for i in over_due if i in held.ids]
        doomed = await self._confirm(deleted_due, over_held, held)

        def unless_in_doubt(ledger_ids: list[int]) -> list[int]:
            if held is None or not held.lease.in_doubt:
                return ledger_ids
            left = [i for i in ledger_ids if i in over_held]
            if left:
                log.warning(
                    "gc_lock_lease_lost",
                    bookie_id=self._bookie_id,
                    left_for_next_run=left,
                    reason="the locks may be a replicator's now",
                )
            return [i for i in ledger_ids if i not in over_held]

        doomed = unless_in_doubt(doomed)  # Not even a checkpoint for ledgers left anyway.
        if not doomed:
            return []
        # Checked again inside: the storage's checkpoint before the drop waits for the flush
        # lock and writes, long enough for the lease to lapse and a replicator to start
        # copying here.
        removed = await self._storage.delete_ledgers(doomed, confirm=unless_in_doubt)
        for ledger_id in removed:
            self._missing_since.pop(ledger_id, None)
            self._unnamed_since.pop(ledger_id, None)
        return removed

    async def _confirm(
        self, deleted_due: list[int], over_held: list[int], held: HeldLocks | None
    ) -> list[int]:
        """Re-check just before deleting: the metadata may have changed during the scan. The
        over-replicated ones are re-read with their locks held (`hold`), and not at all once
        the locks' lease is in doubt."""
        doomed: list[int] = []
        for ledger_id in deleted_due:
            if await self._metadata.placement(ledger_id) is None:
                doomed.append(ledger_id)
        for ledger_id in over_held:
            if held is None or held.lease.in_doubt:
                break  # `_delete` drops those confirmed already.
            if not self._overreplicated(await self._metadata.placement(ledger_id)):
                continue
            if await self._metadata.marked(ledger_id):
                continue  # A replicator whose lease lapsed may still be copying here.
            doomed.append(ledger_id)
        return doomed

    def _overreplicated(self, placement: Placement | None) -> bool:
        """Closed, and no segment names this bookie."""
        return (
            placement is not None and placement.closed and self._bookie_id not in placement.bookies
        )


class MetadataGcSource:
    """`GcMetadata` over `bkaio.meta.Metadata`; `owner` names the locks it takes."""

    def __init__(self, metadata: Metadata, *, owner: str = "gc") -> None:
        self._metadata = metadata
        self._owner = owner

    async def ledger_ids(self) -> set[int]:
        return {ledger_id async for ledger_id in self._metadata.ledgers.list_ids()}

    async def placement(self, ledger_id: int) -> Placement | None:
        try:
            record = await self._metadata.ledgers.get(ledger_id)
        except NoSuchLedgerError:
            return None
        bookies = frozenset(bookie_id for _, ensemble in record.ensembles for bookie_id in ensemble)
        return Placement(bookies, record.is_closed)

    async def marked(self, ledger_id: int) -> bool:
        try:
            return await self._metadata.underreplication.get(ledger_id) is not None
        except InvalidMetadataError:
            return True  # A mark is there, unreadable: the ledger is left alone.

    @contextlib.asynccontextmanager
    async def hold(self, ledger_ids: Collection[int]) -> AsyncIterator[HeldLocks]:
        underreplication = self._metadata.underreplication
        lease = await self._metadata.store.grant_lease(LOCK_LEASE_TTL_SECONDS)
        lease.start_keep_alive()
        try:
            held: set[int] = set()
            for ledger_id in ledger_ids:
                if await underreplication.lock(ledger_id, lease, owner=self._owner) is not None:
                    held.add(ledger_id)
            yield HeldLocks(frozenset(held), lease)
        finally:
            try:
                await lease.revoke()  # Its locks go with it.
            except BKError as error:  # They lapse with the lease's TTL then.
                log.warning("gc_lock_release_failed", owner=self._owner, error=str(error))
