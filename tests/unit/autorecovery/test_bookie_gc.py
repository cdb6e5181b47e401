from __future__ import annotations

from collections.abc import Iterable

from bkaio.bookie.gc import GarbageCollector
from bkaio.entrylog.types import CompactionReport


class FakeGcStorage:
    def __init__(self, ledger_ids: Iterable[int]) -> None:
        self.ledgers = set(ledger_ids)
        self.compactions = 0

    def ledger_ids(self) -> list[int]:
        return sorted(self.ledgers)

    async def delete_ledgers(self, ledger_ids: Iterable[int]) -> list[int]:
        removed = sorted(set(ledger_ids) & self.ledgers)
        self.ledgers -= set(removed)
        return removed

    async def compact(self) -> CompactionReport:
        self.compactions += 1
        return CompactionReport(1, 1, 0, 0, 0, 100)


class FakeGcMetadata:
    def __init__(self, ledgers: dict[int, set[str]]) -> None:
        self.ledgers = ledgers
        self.under_replication_ids: set[int] = set()

    async def ledger_ids(self) -> set[int]:
        return set(self.ledgers)

    async def bookies_of(self, ledger_id: int) -> set[str] | None:
        return self.ledgers.get(ledger_id)

    async def under_replication(self, ledger_id: int) -> bool:
        return ledger_id in self.under_replication_ids


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
    storage = FakeGcStorage([3, 4])
    metadata = FakeGcMetadata({3: {"a", "b", "c"}, 4: {"a", "b", "c"}})
    metadata.under_replication_ids.add(4)
    clock = FakeClock()
    gc = _collector(storage, metadata, clock, overreplicated_grace_seconds=0.0)
    assert (await gc.run_once()).overreplicated == ()
    report = await gc.run_once()
    assert report.overreplicated == (3,) and storage.ledgers == {4}


async def test_nothing_to_collect_means_no_compaction() -> None:
    storage = FakeGcStorage([1])
    gc = _collector(storage, FakeGcMetadata({1: {"me:1"}}), FakeClock())
    for _ in range(3):
        report = await gc.run_once()
        assert report.compaction is None and report.deleted == report.overreplicated == ()
    assert storage.compactions == 0
