"""A /underreplicated/<ledger> record that does not decode (bytes that are not msgpack, fields of
the wrong type, a key that is not a ledger id) is skipped by the listing, the workers' scan and
`shell listunderreplicated`: logged at ERROR and counted once per key and version (on the metrics
page of the process, `bkaio autorecovery`'s included), left in place for an operator to delete,
while the other marks are listed and claimed as before; the under-replicated gauge counts only
the marks that decode."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import msgpack
from click.testing import CliRunner
from prometheus_client import REGISTRY, CollectorRegistry
from structlog.testing import capture_logs

from bkaio import autorecovery
from bkaio.autorecovery import Auditor, AutorecoveryMetrics, LedgerChecker, run_autorecovery
from bkaio.autorecovery.checker import LedgerCheck
from bkaio.bookie.gc import MetadataGcSource
from bkaio.cli.shell import shell
from bkaio.config import AutorecoveryConfig
from bkaio.meta import (
    BadUnderreplicationRecord,
    BookieInfo,
    LedgerMetadata,
    Metadata,
    open_metadata,
)
from bkaio.meta.autorecovery import UNDERREPLICATED_PREFIX
from tests.unit.autorecovery.fake_leases import FakeLockLease

COUNTER = "bkaio_underreplication_bad_records_total"
GAUGE = "bkaio_autorecovery_under_replicated_ledgers"

NOT_MSGPACK = UNDERREPLICATED_PREFIX + f"{1:020d}"
WRONG_TYPES = UNDERREPLICATED_PREFIX + f"{2:020d}"
NOT_A_LEDGER_ID = UNDERREPLICATED_PREFIX + "not-a-ledger"
SHORT_ID = UNDERREPLICATED_PREFIX + "3"  # Not the padded key `complete` would delete.


async def _put_bad_records(meta: Metadata) -> None:
    good_value = msgpack.packb({"missing_bookies": ["b:1"], "ctime_ms": 1})
    await meta.store.put(NOT_MSGPACK, b"\xc1\xc1 not msgpack")
    await meta.store.put(WRONG_TYPES, msgpack.packb({"missing_bookies": "b:1", "ctime_ms": "x"}))
    await meta.store.put(NOT_A_LEDGER_ID, good_value)
    await meta.store.put(SHORT_ID, good_value)


def _counted(registry: CollectorRegistry = REGISTRY) -> float | None:
    return registry.get_sample_value(COUNTER)


def _skipped(logs: Sequence[Mapping[str, Any]]) -> list[object]:
    return [e["key"] for e in logs if e["event"] == "underreplication_bad_record_skipped"]


async def test_the_listing_skips_bad_records_and_reports_each_once(meta: Metadata) -> None:
    await _put_bad_records(meta)
    await meta.underreplication.mark(5, ["b:1"])
    counted = _counted() or 0.0  # The fixture's store counts in the default registry.
    bad: list[BadUnderreplicationRecord] = []
    with capture_logs() as logs:
        records = await autorecovery.list_under_replicated(meta, bad=bad)
        for _ in range(3):  # Later scans: nothing logged or counted again.
            assert [r.ledger_id for r in await autorecovery.list_under_replicated(meta)] == [5]
    assert [r.ledger_id for r in records] == [5]
    assert sorted(item.key for item in bad) == sorted(
        [NOT_MSGPACK, WRONG_TYPES, NOT_A_LEDGER_ID, SHORT_ID]
    )
    assert all(item.key in item.error for item in bad)
    assert sorted(map(str, _skipped(logs))) == sorted(item.key for item in bad)
    assert all(e["log_level"] == "error" for e in logs if e["key"] in _skipped(logs))
    assert _counted() == counted + 4
    status = await autorecovery.autorecovery_status(meta)
    assert status.under_replicated_ledgers == 1
    # The same key written again (a new version) is reported again, once.
    await meta.store.put(NOT_MSGPACK, b"\xc1 still not msgpack")
    with capture_logs() as logs:
        for _ in range(2):
            assert [r.ledger_id async for r in meta.underreplication.list()] == [5]
    assert _skipped(logs) == [NOT_MSGPACK]
    assert _counted() == counted + 5


async def test_a_worker_claims_past_a_bad_record_and_leaves_it(meta: Metadata) -> None:
    await _put_bad_records(meta)
    await meta.underreplication.mark(5, ["b:1"])
    lease = await meta.store.grant_lease(30.0)
    claimed = await meta.underreplication.claim_next(lease, owner="worker")
    assert claimed is not None and claimed.ledger_id == 5
    assert await meta.underreplication.complete(claimed)
    assert await meta.underreplication.claim_next(lease, owner="worker") is None
    for key in (NOT_MSGPACK, WRONG_TYPES, NOT_A_LEDGER_ID, SHORT_ID):
        assert await meta.store.get(key) is not None  # Only an operator deletes it.
    await lease.revoke()


def test_listunderreplicated_names_a_bad_record_on_stderr(sqlite_metadata_uri: str) -> None:
    async def prepare() -> None:
        meta = await open_metadata(sqlite_metadata_uri)
        try:
            await _put_bad_records(meta)
            await meta.underreplication.mark(5, ["b:1"])
        finally:
            await meta.close()

    asyncio.run(prepare())
    result = CliRunner().invoke(
        shell, ["listunderreplicated", "--json", "--metadata", sqlite_metadata_uri]
    )
    assert result.exit_code == 0, result.output
    assert [row["ledger_id"] for row in json.loads(result.stdout)] == [5]
    assert NOT_MSGPACK in result.stderr and NOT_A_LEDGER_ID in result.stderr
    assert "bad record" in result.stderr


async def test_an_audit_marks_past_a_ledger_whose_record_is_bad(meta: Metadata) -> None:
    """The auditor must mark a lost bookie's other ledgers (and re-evaluate the marks) although
    one of them holds a bad record, which it cannot merge into: that one is left as it is."""
    registrations = [
        await meta.bookies.register(BookieInfo.for_address("127.0.0.1", port), 30.0)
        for port in (3181, 3182, 3183)
    ]
    ensemble = tuple(r.info.bookie_id for r in registrations)
    ledgers = [
        (
            await meta.ledgers.create(
                LedgerMetadata(
                    ensemble_size=3, write_quorum=3, ack_quorum=2, ensembles=((0, ensemble),)
                )
            )
        ).ledger_id
        for _ in range(2)
    ]
    bad_key = UNDERREPLICATED_PREFIX + f"{ledgers[0]:020d}"
    await meta.store.put(bad_key, b"\xc1")
    await registrations[2].deregister()
    auditor = Auditor(
        meta,
        AutorecoveryMetrics(),
        lease=FakeLockLease(),
        lost_bookie_delay_seconds=0.0,
        audit_interval_seconds=60.0,
    )
    with capture_logs() as logs:
        report = await auditor.audit_once(skip_delay=True)
    assert report.ledgers_marked == 1
    assert [r.ledger_id async for r in meta.underreplication.list()] == [ledgers[1]]
    kept = await meta.store.get(bad_key)
    assert kept is not None and kept.value == b"\xc1"
    assert _skipped(logs) == [bad_key]  # Once, though listed and then met by the mark.
    for registration in registrations[:2]:
        await registration.deregister()


class FakeLedgerCheckerFindingGaps(LedgerChecker):
    """Every closed ledger's bookie "b:1" lacks entry 0."""

    def __init__(self) -> None:
        pass

    async def check(self, metadata: LedgerMetadata, registered: Collection[str]) -> LedgerCheck:
        return LedgerCheck(metadata.ledger_id, incomplete={"b:1": [0]})


async def test_the_ledger_check_marks_past_a_ledger_whose_record_is_bad(meta: Metadata) -> None:
    ledgers = []
    for _ in range(2):
        md = await meta.ledgers.create(
            LedgerMetadata(
                ensemble_size=1, write_quorum=1, ack_quorum=1, ensembles=((0, ("b:1",)),)
            )
        )
        await meta.ledgers.update(md.closed(0, 1))
        ledgers.append(md.ledger_id)
    bad_key = UNDERREPLICATED_PREFIX + f"{ledgers[0]:020d}"
    await meta.store.put(bad_key, b"\xc1")
    auditor = Auditor(
        meta,
        AutorecoveryMetrics(),
        lease=FakeLockLease(),
        lost_bookie_delay_seconds=0.0,
        audit_interval_seconds=60.0,
        checker=FakeLedgerCheckerFindingGaps(),
        ledger_check_interval_seconds=86400.0,
    )
    with capture_logs() as logs:
        assert await auditor.check_ledgers() == 1
    assert _skipped(logs) == [bad_key]  # Reported by the mark that met it.
    marked = await meta.underreplication.get(ledgers[1])
    assert marked is not None and marked.incomplete_bookies == ("b:1",)
    kept = await meta.store.get(bad_key)
    assert kept is not None and kept.value == b"\xc1"


async def test_gc_counts_a_bad_record_as_a_mark(meta: Metadata) -> None:
    """A bookie's GC must not delete a ledger marked under-replicated, nor fail its whole run on
    a record it cannot read: a bad record is a mark it leaves alone."""
    await meta.store.put(UNDERREPLICATED_PREFIX + f"{7:020d}", b"\xc1")
    source = MetadataGcSource(meta, owner="gc:me")
    assert await source.marked(7)
    assert not await source.marked(8)


async def test_stores_count_bad_records_in_the_registry_they_are_opened_with(
    sqlite_metadata_uri: str,
) -> None:
    registry = CollectorRegistry()
    stores = [
        await open_metadata(sqlite_metadata_uri, metrics_registry=registry) for _ in range(2)
    ]  # Two stores of one process: one counter, no duplicate registration.
    try:
        assert _counted(registry) == 0  # Exported before the first bad record.
        await _put_bad_records(stores[0])
        for metadata in stores:
            assert [r async for r in metadata.underreplication.list()] == []
    finally:
        for metadata in stores:
            await metadata.close()
    assert _counted(registry) == 8  # Each store's manager reports what it meets once.


async def test_bkaio_autorecovery_counts_bad_records_on_its_metrics_page(
    sqlite_metadata_uri: str,
) -> None:
    """`bkaio autorecovery` serves `metrics_registry` alone (not the default registry)."""
    meta = await open_metadata(sqlite_metadata_uri)
    try:
        await _put_bad_records(meta)
    finally:
        await meta.close()
    registry = CollectorRegistry()
    stop = asyncio.Event()
    config = AutorecoveryConfig(poll_interval_seconds=60.0, audit_interval_seconds=3600.0)
    service = asyncio.ensure_future(
        run_autorecovery(sqlite_metadata_uri, config=config, stop=stop, metrics_registry=registry)
    )
    try:
        async with asyncio.timeout(30):  # The worker's scan (and the audit) list the marks.
            while _counted(registry) != 4:
                assert not service.done(), service
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        assert await service == 0


async def test_the_under_replicated_gauge_counts_only_marks_that_decode(meta: Metadata) -> None:
    await _put_bad_records(meta)
    await meta.underreplication.mark(5, ["b:1"])
    metrics = AutorecoveryMetrics(CollectorRegistry())
    auditor = Auditor(
        meta,
        metrics,
        lease=FakeLockLease(),
        lost_bookie_delay_seconds=0.0,
        audit_interval_seconds=60.0,
    )
    metrics.under_replicated_ledgers.set(-1)
    counting = asyncio.ensure_future(anext(auditor._mark_count()))  # Never yields.

    async def gauge_reads(value: float) -> None:
        async with asyncio.timeout(10):
            while metrics.registry.get_sample_value(GAUGE) != value:
                assert not counting.done(), counting
                await asyncio.sleep(0.02)

    try:
        await gauge_reads(1)  # From the snapshot: mark 5, none of the four bad records.
        # Then from the watch: a new bad record, mark 5 overwritten by one, marks 6 and 7.
        await meta.store.put(UNDERREPLICATED_PREFIX + f"{9:020d}", b"\xc1")
        await meta.store.put(UNDERREPLICATED_PREFIX + f"{5:020d}", b"\xc1")
        await meta.underreplication.mark(6, ["b:1"])
        await meta.underreplication.mark(7, ["b:1"])
        await gauge_reads(2)
    finally:
        counting.cancel()
        await asyncio.gather(counting, return_exceptions=True)
