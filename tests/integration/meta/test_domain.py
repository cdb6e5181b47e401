"""Ledgers, bookies, cookies, autorecovery and namespaces on both drivers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from bkaio.errors import ConfigError, MetadataVersionError, NoSuchLedgerError
from bkaio.meta import (
    BookieInfo,
    LedgerExistsError,
    LedgerMetadata,
    LedgerState,
    Metadata,
    open_metadata,
)
from tests.integration.meta.helpers import eventually
from tests.integration.meta.workers import sample_metadata


@pytest.fixture
async def meta(metadata_uri: str) -> AsyncIterator[Metadata]:
    opened = await open_metadata(metadata_uri, id_block_size=10)
    yield opened
    await opened.close()


async def test_layout_and_instance_id_are_created_once(metadata_uri: str) -> None:
    async with (
        await open_metadata(metadata_uri) as first,
        await open_metadata(metadata_uri) as second,
    ):
        assert first.instance_id == second.instance_id
        layout = await first.store.get("/layout")
        assert layout is not None and layout.value == b"1"


async def test_unknown_uri_scheme_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown scheme 'zk'"):
        await open_metadata("zk://localhost:2181/ledgers")


async def test_ledger_create_get_update_delete(meta: Metadata) -> None:
    created = await meta.ledgers.create(sample_metadata())
    assert created.ledger_id >= 1 and created.version > 0 and created.ctime_ms > 0
    assert await meta.ledgers.get(created.ledger_id) == created

    closed = await meta.ledgers.update(created.closed(last_entry_id=9, length=100))
    assert closed.version > created.version
    assert (await meta.ledgers.get(created.ledger_id)).state is LedgerState.CLOSED
    with pytest.raises(MetadataVersionError):
        await meta.ledgers.update(created.with_state(LedgerState.IN_RECOVERY))

    with pytest.raises(LedgerExistsError):
        await meta.ledgers.create(sample_metadata().replace(ledger_id=created.ledger_id))
    explicit = await meta.ledgers.create(sample_metadata().replace(ledger_id=10**12))
    assert explicit.ledger_id == 10**12

    await meta.ledgers.delete(created.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        await meta.ledgers.get(created.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        await meta.ledgers.delete(created.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        await meta.ledgers.update(closed)


async def test_ledger_ids_list_in_numeric_order_across_pages(meta: Metadata) -> None:
    ids = [(await meta.ledgers.create(sample_metadata())).ledger_id for _ in range(25)]
    ids.append((await meta.ledgers.create(sample_metadata().replace(ledger_id=123456))).ledger_id)
    assert [i async for i in meta.ledgers.list_ids(page_size=4)] == sorted(ids)
    assert [i async for i in meta.ledgers.list_ids(start_after=ids[20])] == sorted(ids)[21:]


async def test_concurrent_updates_of_one_ledger_have_one_winner_per_round(meta: Metadata) -> None:
    current = await meta.ledgers.create(sample_metadata())
    for round_number in range(5):
        attempts = [
            meta.ledgers.update(
                current.replace(custom_metadata={"writer": f"{round_number}-{task}".encode()})
            )
            for task in range(10)
        ]
        results = await asyncio.gather(*attempts, return_exceptions=True)
        winners = [result for result in results if isinstance(result, LedgerMetadata)]
        losers = [result for result in results if not isinstance(result, LedgerMetadata)]
        assert len(winners) == 1
        assert all(isinstance(loser, MetadataVersionError) for loser in losers)
        current = await meta.ledgers.get(current.ledger_id)
        assert current == winners[0]


async def test_ledger_watch_follows_versions_until_deletion(meta: Metadata) -> None:
    created = await meta.ledgers.create(sample_metadata())
    seen: list[LedgerMetadata | None] = []

    async def watch() -> None:
        async for metadata in meta.ledgers.watch(created.ledger_id):
            seen.append(metadata)

    task = asyncio.create_task(watch())
    try:
        assert await eventually(lambda: bool(seen))
        async with asyncio.timeout(10):
            closed = await meta.ledgers.update(created.closed(last_entry_id=-1, length=0))
            await meta.ledgers.delete(created.ledger_id)
            await task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert seen == [created, closed, None]


def bookie(port: int, **fields: object) -> BookieInfo:
    return BookieInfo.for_address("127.0.0.1", port, **fields)


async def test_bookie_registration_list_flip_and_deregister(meta: Metadata) -> None:
    updates: list[list[tuple[str, bool]]] = []

    async def watch() -> None:
        async for bookies in meta.bookies.watch():
            updates.append([(info.bookie_id, info.read_only) for info in bookies])

    watcher = asyncio.create_task(watch())
    try:
        first = await meta.bookies.register(bookie(3181, shard_count=2, rack="/r1"), ttl_seconds=5)
        second = await meta.bookies.register(bookie(3191), ttl_seconds=5)
        listed = await meta.bookies.list()
        assert [info.bookie_id for info in listed] == ["127.0.0.1:3181", "127.0.0.1:3191"]
        assert listed[0] == first.info and listed[0].shard_count == 2

        await first.set_read_only(True)
        assert [info.read_only for info in await meta.bookies.list()] == [True, False]
        assert [info.bookie_id for info in await meta.bookies.writable()] == ["127.0.0.1:3191"]
        await first.set_read_only(False)
        await second.deregister()
        assert [info.bookie_id for info in await meta.bookies.list()] == ["127.0.0.1:3181"]

        expected_last = [("127.0.0.1:3181", False)]
        assert await eventually(lambda: bool(updates) and updates[-1] == expected_last)
        await first.deregister()
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    assert updates[0] == []
    assert ([("127.0.0.1:3181", True), ("127.0.0.1:3191", False)]) in updates


async def test_registration_waits_out_a_previous_incarnation(meta: Metadata) -> None:
    lease = await meta.store.grant_lease(1)
    await meta.store.put("/bookies/writable/127.0.0.1:3201", b"\x80", lease=lease)  # Old one.
    registration = await meta.bookies.register(bookie(3201), ttl_seconds=1)
    assert registration.lease.id != lease.id
    assert [info.bookie_id for info in await meta.bookies.list()] == ["127.0.0.1:3201"]
    await registration.deregister()


async def test_cookies_are_compare_and_swapped(meta: Metadata) -> None:
    assert await meta.cookies.get("127.0.0.1:3181") is None
    version = await meta.cookies.put("127.0.0.1:3181", b"cookie-1", expected_version=0)
    with pytest.raises(MetadataVersionError):
        await meta.cookies.put("127.0.0.1:3181", b"other", expected_version=0)
    await meta.cookies.put("127.0.0.1:3181", b"cookie-2", expected_version=version)
    cookie = await meta.cookies.get("127.0.0.1:3181")
    assert cookie is not None and cookie.data == b"cookie-2"


async def test_underreplication_mark_claim_complete(meta: Metadata) -> None:
    await meta.underreplication.mark(7, ["b1:1"])
    marked = await meta.underreplication.mark(7, ["b2:1"])
    assert marked.record.missing_bookies == ("b1:1", "b2:1") and marked.changed
    await meta.underreplication.mark(8, ["b1:1"])
    assert [r.ledger_id async for r in meta.underreplication.list()] == [7, 8]

    worker_a = await meta.store.grant_lease(30)
    worker_b = await meta.store.grant_lease(30)
    claimed = await meta.underreplication.claim_next(worker_a, owner="a")
    assert claimed is not None and claimed.ledger_id == 7
    assert await meta.underreplication.claim(7, worker_b) is None
    other = await meta.underreplication.claim_next(worker_b, owner="b")
    assert other is not None and other.ledger_id == 8

    await worker_b.revoke()  # Worker b dies: its lock goes with its lease.
    again = await meta.underreplication.claim(8, worker_a)
    assert again is not None
    assert await meta.underreplication.complete(claimed) is True
    await meta.underreplication.mark(8, ["b3:1"])  # Marked again while being worked on.
    assert await meta.underreplication.complete(again) is False
    assert [r.ledger_id async for r in meta.underreplication.list()] == [8]

    assert await meta.underreplication.is_enabled()
    await meta.underreplication.set_enabled(False)
    assert not await meta.underreplication.is_enabled()
    await worker_a.revoke()


async def test_auditor_election_hands_over_on_resign(meta: Metadata) -> None:
    assert await meta.auditor.who_is_auditor() is None
    first = await meta.auditor.run_for_auditor("b1:1", ttl_seconds=5)
    assert await meta.auditor.who_is_auditor() == "b1:1"
    second = asyncio.create_task(meta.auditor.run_for_auditor("b2:1", ttl_seconds=5))
    await asyncio.sleep(0.2)
    assert not second.done()
    await first.resign()
    async with asyncio.timeout(10):
        leadership = await second
    assert await meta.auditor.who_is_auditor() == "b2:1"
    await leadership.resign()


async def test_namespace_and_stream_records(meta: Metadata) -> None:
    version = await meta.namespaces.put_namespace("tenant", {"quota": 10}, expected_version=0)
    record = await meta.namespaces.get_namespace("tenant")
    assert record is not None and record.value == {"quota": 10} and record.version == version
    await meta.namespaces.put_stream("tenant", "s1", {"ledgers": [1, 2]}, expected_version=0)
    await meta.namespaces.put_stream("tenant", "s2", {"ledgers": []}, expected_version=0)
    assert await meta.namespaces.list_namespaces() == ["tenant"]
    assert await meta.namespaces.list_streams("tenant") == ["s1", "s2"]
    with pytest.raises(MetadataVersionError):
        await meta.namespaces.put_namespace("tenant", {}, expected_version=0)
    assert await meta.namespaces.delete_stream("tenant", "s1")
    assert await meta.namespaces.list_streams("tenant") == ["s2"]
