"""The bookie's garbage collection against fake storage and metadata (its rules: two scans a
grace period apart, marks and locks respected, deletes under the ledger's lock), and the real
metadata source's locks on the embedded (SQLite) driver. Over-replicated ledgers are deleted only
while the lease of the collector's locks is not in doubt."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable

from bkaio.bookie.gc import GarbageCollector, HeldLocks, LeaseState, MetadataGcSource, Placement
from bkaio.entrylog.types import CompactionReport
from bkaio.meta import Metadata
from bkaio.meta.store import Lease


class FakeGcStorage:
    """A shard's ledgers as a set; `during_delete`, when set, runs inside `delete_ledgers`
    before anything is deleted (the real one checkpoints first: other tasks run meanwhile),
    then `confirm` is asked which to drop, as the real one does after its checkpoint."""

    def __init__(self, ledger_ids: Iterable[int]) -> None:
        self.ledgers = set(ledger_ids)
        self.compactions = 0
        self.during_delete: Callable[[], Awaitable[None]] | None = None

    def ledger_ids(self) -> list[int]:
        return sorted(self.ledgers)

    async def delete_ledgers(
        self,
        ledger_ids: Iterable[int],
        *,
        confirm: Callable[[list[int]], Collection[int]] | None = None,
    ) -> list[int]:
        doomed = sorted(set(ledger_ids) & self.ledgers)
        if self.during_delete is not None:
            await self.during_delete()
        if confirm is not None:
            doomed = [i for i in doomed if i in set(confirm(doomed))]
        removed = sorted(set(doomed) & self.ledgers)
        self.ledgers -= set(removed)
        return removed

    async def compact(self) -> CompactionReport:
        self.compactions += 1
        return CompactionReport(1, 1, 0, 0, 0, 100)


class FakeLease:
    def __init__(self) -> None:
        self.in_doubt = False


class FakeUnrefreshedLease(Lease):
    """A real lease nobody refreshes: once its TTL has passed on the loop's clock it is in
    doubt, yet not lost (no keep-alive has asked the store)."""

    async def keep_alive(self) -> None:
        pass

    async def _revoke(self) -> None:
        pass


class FakeGcMetadata:
    """Ledgers' bookies, marks, and under-replication locks (ledger id -> holder); every ledger
    closed unless in `open_ids`. `hold` binds its locks to a new `lease`; `on_read`, when set,
    is called with ("placement" | "marked", ledger id) at each read while they are held."""

    def __init__(self, ledgers: dict[int, set[str]]) -> None:
        self.ledgers = ledgers
        self.open_ids: set[int] = set()
        self.marked_ids: set[int] = set()
        self.locks: dict[int, str] = {}
        self.lease: LeaseState = FakeLease()
        self.new_lease: Callable[[], LeaseState] = FakeLease
        self.holding = False
        self.on_read: Callable[[str, int], None] | None = None

    def _read(self, what: str, ledger_id: int) -> None:
        if self.holding and self.on_read is not None:
            self.on_read(what, ledger_id)

    async def ledger_ids(self) -> set[int]:
        return set(self.ledgers)

    async def placement(self, ledger_id: int) -> Placement | None:
        self._read("placement", ledger_id)
        bookies = self.ledgers.get(ledger_id)
        if bookies is None:
            return None
        return Placement(frozenset(bookies), ledger_id not in self.open_ids)

    async def marked(self, ledger_id: int) -> bool:
        self._read("marked", ledger_id)
        return ledger_id in self.marked_ids

    @contextlib.asynccontextmanager
    async def hold(self, ledger_ids: Collection[int]) -> AsyncIterator[HeldLocks]:
        held = {i for i in ledger_ids if i not in self.locks}
        self.locks.update(dict.fromkeys(held, "gc"))
        self.lease = self.new_lease()
        self.holding = True
        try:
            yield HeldLocks(frozenset(held), self.lease)
        finally:
            self.holding = False
            for ledger_id in held:
                if self.locks.get(ledger_id) == "gc":
                    del self.locks[ledger_id]


class FakeReplicatorCopyingHere:
    """A replication worker whose replacement for a ledger's lost bookie is this one ("me:1"):
    it claims the ledger (its lock) unless someone holds it, copies the fragment here, puts
    this bookie into the metadata and completes the mark."""

    def __init__(self, storage: FakeGcStorage, metadata: FakeGcMetadata) -> None:
        self._storage = storage
        self._metadata = metadata

    async def replicate(self, ledger_id: int, lost: str) -> bool:
        """False when the ledger's lock is held by someone else (tried again later)."""
        if ledger_id in self._metadata.locks:
            return False
        self._metadata.locks[ledger_id] = "worker"
        self._storage.ledgers.add(ledger_id)  # The copy's entries land here...
        bookies = self._metadata.ledgers[ledger_id]
        self._metadata.ledgers[ledger_id] = (bookies - {lost}) | {"me:1"}  # ...then the swap.
        self._metadata.marked_ids.discard(ledger_id)
        del self._metadata.locks[ledger_id]
        return True


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _collector(
    storage: FakeGcStorage, metadata: FakeGcMetadata, clock: FakeClock, **options: float
) -> GarbageCollector:
    return GarbageCollector(
        storage,
        metadata,
        bookie_id="me:1",
        grace_seconds=options.get("grace_seconds", 60.0),
        overreplicated_grace_seconds=options.get("overreplicated_grace_seconds", 60.0),
        compaction_interval_seconds=3600.0,
        clock=clock,
    )


async def test_deleted_ledger_needs_two_scans_grace_apart() -> None:
    storage = FakeGcStorage([1, 2])
    metadata = FakeGcMetadata({1: {"me:1"}})
    clock = FakeClock()
    gc = _collector(storage, metadata, clock)
    first = await gc.run_once()
    assert first.deleted == () and first.candidates == 1
    clock.now += 30
    assert (await gc.run_once()).deleted == ()  # Second scan, but inside the grace period.
    clock.now += 31
    report = await gc.run_once()
    assert report.deleted == (2,) and storage.ledgers == {1}
    assert report.compaction is not None and storage.compactions == 1


async def test_ledger_whose_metadata_appears_late_is_never_collected() -> None:
    storage = FakeGcStorage([5])
    metadata = FakeGcMetadata({})
    clock = FakeClock()
    gc = _collector(storage, metadata, clock)
    await gc.run_once()  # Metadata lags: a candidate.
    metadata.ledgers[5] = {"me:1"}
    clock.now += 120
    assert (await gc.run_once()).deleted == ()
    del metadata.ledgers[5]  # Deleted now: the clock starts over.
    clock.now += 1
    assert (await gc.run_once()).deleted == ()
    clock.now += 60
    assert (await gc.run_once()).deleted == (5,)


async def test_overreplicated_ledger_is_collected_unless_being_replicated() -> None:
    storage = FakeGcStorage([3, 4, 5])
    metadata = FakeGcMetadata({3: {"a", "b", "c"}, 4: {"a", "b", "c"}, 5: {"a", "b", "c"}})
    metadata.marked_ids.add(4)
    metadata.locks[5] = "worker"  # A replicator holds it (perhaps copying it here).
    clock = FakeClock()
    gc = _collector(storage, metadata, clock, overreplicated_grace_seconds=0.0)
    assert (await gc.run_once()).overreplicated == ()
    report = await gc.run_once()
    assert report.overreplicated == (3,) and storage.ledgers == {4, 5}
    assert metadata.locks == {5: "worker"}  # Left to its holder; the collector's given back.


async def test_an_open_ledger_is_never_overreplicated() -> None:
    """Its writer may put this bookie back into it in an ensemble change at any moment (and
    send entries here at once), which the lock does not keep away: only closed ledgers go."""
    storage = FakeGcStorage([3, 4])
    metadata = FakeGcMetadata({3: {"a", "b", "c"}, 4: {"a", "b", "c"}})
    metadata.open_ids.add(4)
    gc = _collector(storage, metadata, FakeClock(), overreplicated_grace_seconds=0.0)
    await gc.run_once()
    report = await gc.run_once()
    assert report.overreplicated == (3,) and storage.ledgers == {4}


async def test_a_ledger_copied_here_while_being_collected_is_not_deleted_under_the_copy() -> None:
    """This bookie holds a stale copy of ledger 3 (moved off it earlier). While the collector
    deletes it, bookie "a" is lost and a replicator picks this bookie to replace it: checked
    without the ledger's lock, the copy landed between the collector's last look at the
    metadata and its delete, was deleted, and the metadata then named this bookie for
    entries it no longer held."""
    storage = FakeGcStorage([3])
    metadata = FakeGcMetadata({3: {"a", "b", "c"}})
    replicator = FakeReplicatorCopyingHere(storage, metadata)
    gc = _collector(storage, metadata, FakeClock(), overreplicated_grace_seconds=0.0)
    await gc.run_once()  # First scan: a candidate.
    copied_during_delete: list[bool] = []

    async def bookie_a_lost_and_ledger_3_replicated_here() -> None:
        metadata.marked_ids.add(3)  # The auditor marks it...
        copied_during_delete.append(await replicator.replicate(3, lost="a"))  # ...a worker.

    storage.during_delete = bookie_a_lost_and_ledger_3_replicated_here
    await gc.run_once()
    storage.during_delete = None
    if "me:1" in metadata.ledgers[3]:
        assert 3 in storage.ledgers, "the metadata names this bookie, which lost the copy"
    assert copied_during_delete == [False]  # The collector held the lock: the worker waits...
    assert metadata.locks == {}
    assert await replicator.replicate(3, lost="a")  # ...and copies once it is given back.
    assert 3 in storage.ledgers and "me:1" in metadata.ledgers[3]


async def test_while_the_collector_holds_a_ledger_no_worker_can_claim_it(meta: Metadata) -> None:
    """`MetadataGcSource.hold` over real metadata: the under-replication locks workers claim."""
    await meta.underreplication.mark(7, ["b:1"])
    await meta.underreplication.mark(8, ["b:1"])
    worker = await meta.store.grant_lease(30.0)
    assert await meta.underreplication.claim(8, worker, owner="worker") is not None
    source = MetadataGcSource(meta, owner="gc:me")
    async with source.hold([7, 8, 9]) as held:
        assert held.ids == {7, 9} and not held.lease.in_doubt  # 8's lock is the worker's.
        assert await meta.underreplication.claim(7, worker, owner="worker") is None
        assert await meta.underreplication.locked() == {7, 8, 9}
        assert await source.marked(7) and not await source.marked(9)
    assert await meta.underreplication.locked() == {8}
    assert held.lease.in_doubt  # Revoked with its locks.
    assert await meta.underreplication.claim(7, worker, owner="worker") is not None
    await worker.revoke()


async def test_no_overreplicated_ledger_is_deleted_once_the_locks_lease_is_lost() -> None:
    """The lease of the collector's locks is lost while it confirms ledger 3: a replicator may
    hold the locks now (and copy 3 or 4 here), so neither is deleted, nor 4 even read; the
    ledger without metadata (2) needs no lock and goes. A later run takes the locks again."""
    storage = FakeGcStorage([2, 3, 4])
    metadata = FakeGcMetadata({3: {"a", "b", "c"}, 4: {"a", "b", "c"}})
    gc = _collector(
        storage, metadata, FakeClock(), grace_seconds=0.0, overreplicated_grace_seconds=0.0
    )
    await gc.run_once()  # First scan: candidates.
    reads: list[tuple[str, int]] = []

    def lose_the_lease_at_ledger_3(what: str, ledger_id: int) -> None:
        reads.append((what, ledger_id))
        if ledger_id == 3:
            metadata.lease.in_doubt = True  # type: ignore[misc]

    metadata.on_read = lose_the_lease_at_ledger_3
    report = await gc.run_once()
    assert report.deleted == (2,) and report.overreplicated == ()
    assert storage.ledgers == {3, 4}
    assert ("placement", 4) not in reads  # Not confirmed once the lease is lost.
    metadata.on_read = None
    report = await gc.run_once()
    assert report.overreplicated == (3, 4) and storage.ledgers == set()


async def test_a_lease_lost_after_the_last_confirmation_still_stops_the_delete() -> None:
    storage = FakeGcStorage([3, 4])
    metadata = FakeGcMetadata({3: {"a", "b", "c"}, 4: {"a", "b", "c"}})
    gc = _collector(storage, metadata, FakeClock(), overreplicated_grace_seconds=0.0)
    await gc.run_once()

    def lose_the_lease_at_the_last_read(what: str, ledger_id: int) -> None:
        if (what, ledger_id) == ("marked", 4):
            metadata.lease.in_doubt = True  # type: ignore[misc]

    metadata.on_read = lose_the_lease_at_the_last_read
    assert (await gc.run_once()).overreplicated == ()
    assert storage.ledgers == {3, 4}


async def test_a_lease_lost_during_the_storage_checkpoint_still_stops_the_delete() -> None:
    """The lease of the collector's locks lapses while the storage checkpoints before dropping
    the ledgers (it waits for the flush lock and writes: seconds, maybe), after the
    collector's last look: a replicator may hold the locks by the drop, so the over-replicated
    ledgers 3 and 4 stay; 2, without metadata, needs no lock and goes."""
    storage = FakeGcStorage([2, 3, 4])
    metadata = FakeGcMetadata({3: {"a", "b", "c"}, 4: {"a", "b", "c"}})
    gc = _collector(
        storage, metadata, FakeClock(), grace_seconds=0.0, overreplicated_grace_seconds=0.0
    )
    await gc.run_once()  # First scan: candidates.

    async def the_lease_lapses_during_the_checkpoint() -> None:
        metadata.lease.in_doubt = True  # type: ignore[misc]

    storage.during_delete = the_lease_lapses_during_the_checkpoint
    report = await gc.run_once()
    assert report.deleted == (2,) and report.overreplicated == ()
    assert storage.ledgers == {3, 4}
    storage.during_delete = None
    assert (await gc.run_once()).overreplicated == (3, 4)  # A later run, the lease sound.


async def test_a_stall_past_the_locks_lease_ttl_stops_the_delete_before_the_lease_is_lost() -> None:
    """The event loop stalls for longer than the locks' TTL while ledger 3 is confirmed: the
    store may have dropped the lease (and a replicator taken the locks) although no keep-alive
    has asked it yet (`lost` is still false), so neither 3 nor 4 is deleted."""
    storage = FakeGcStorage([3, 4])
    metadata = FakeGcMetadata({3: {"a", "b", "c"}, 4: {"a", "b", "c"}})
    leases: list[Lease] = []

    def new_lease() -> Lease:
        leases.append(FakeUnrefreshedLease(lease_id=5, ttl_seconds=0.01))
        return leases[-1]

    gc = _collector(storage, metadata, FakeClock(), overreplicated_grace_seconds=0.0)
    await gc.run_once()  # First scan: candidates.
    metadata.new_lease = new_lease
    seen: list[tuple[bool, bool]] = []

    def stall_at_ledger_3(what: str, ledger_id: int) -> None:
        if (what, ledger_id) == ("placement", 3):
            time.sleep(0.02)  # The loop stalls (a GC pause, a starved CPU) past the TTL.
            seen.append((leases[-1].lost, leases[-1].in_doubt))

    metadata.on_read = stall_at_ledger_3
    assert (await gc.run_once()).overreplicated == ()
    assert seen == [(False, True)] and storage.ledgers == {3, 4}


async def test_nothing_to_collect_means_no_compaction() -> None:
    storage = FakeGcStorage([1])
    gc = _collector(storage, FakeGcMetadata({1: {"me:1"}}), FakeClock())
    for _ in range(3):
        report = await gc.run_once()
        assert report.compaction is None and report.deleted == report.overreplicated == ()
    assert storage.compactions == 0
