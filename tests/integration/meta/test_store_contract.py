"""One contract, every driver: each test here runs against real etcd, against SQLite, and
against the in-memory driver the deterministic simulation uses (bkaio.testing.sim.meta)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from bkaio.errors import MetadataError, MetadataVersionError
from bkaio.meta import open_store
from bkaio.meta.errors import LeaseExpiredError
from bkaio.meta.store import EventKind, MetadataStore, WatchEvent
from bkaio.testing.sim.meta import MemoryMetadataServer
from tests.integration.meta.helpers import eventually

Opener = Callable[[], Awaitable[MetadataStore]]


@pytest.fixture(params=["etcd", "sqlite", "memory"])
def open_connection(request: pytest.FixtureRequest) -> Opener:
    """Opens a new connection to one store (the same store each time) of each driver. Not a
    coroutine: it asks for the etcd and SQLite fixtures, which start their own loops."""
    if request.param == "memory":
        servers: list[MemoryMetadataServer] = []  # Made on the test's loop, at first use.

        async def connect() -> MetadataStore:
            if not servers:
                servers.append(MemoryMetadataServer())
            return servers[0].connect()

        return connect
    fixture = "etcd_server" if request.param == "etcd" else "sqlite_metadata_uri"
    found = request.getfixturevalue(fixture)
    uri: str = found if isinstance(found, str) else found.uri

    async def open_uri() -> MetadataStore:
        return await open_store(uri)

    return open_uri


@pytest.fixture
async def store(open_connection: Opener) -> AsyncIterator[MetadataStore]:
    opened = await open_connection()
    yield opened
    await opened.close()


async def wait_until_absent(store: MetadataStore, key: str, timeout_seconds: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_seconds
    while loop.time() < deadline:
        if await store.get(key) is None:
            return True
        await asyncio.sleep(0.05)
    return False


async def collect(events: AsyncIterator[WatchEvent], count: int) -> list[WatchEvent]:
    received: list[WatchEvent] = []
    async with asyncio.timeout(20):
        async for event in events:
            received.append(event)
            if len(received) == count:
                break
    return received


async def test_get_put_delete_are_versioned(store: MetadataStore) -> None:
    assert await store.get("/k") is None
    first = await store.put("/k", b"one")
    kv = await store.get("/k")
    assert kv is not None
    assert (kv.key, kv.value, kv.version, kv.create_revision, kv.lease) == (
        "/k",
        b"one",
        first,
        first,
        0,
    )
    second = await store.put("/k", b"two")
    assert second > first
    kv = await store.get("/k")
    assert kv is not None and (kv.value, kv.version, kv.create_revision) == (b"two", second, first)
    assert await store.current_revision() >= second
    assert await store.delete("/k") is True
    assert await store.get("/k") is None
    assert await store.delete("/k") is False
    assert await store.current_revision() > second


async def test_compare_and_swap_creates_if_absent_and_detects_stale_versions(
    store: MetadataStore,
) -> None:
    created = await store.compare_and_swap("/cas", b"a", expected_version=0)
    with pytest.raises(MetadataVersionError):
        await store.compare_and_swap("/cas", b"b", expected_version=0)
    updated = await store.compare_and_swap("/cas", b"b", expected_version=created)
    assert updated > created
    with pytest.raises(MetadataVersionError):
        await store.compare_and_swap("/cas", b"c", expected_version=created)
    with pytest.raises(MetadataVersionError):
        await store.delete("/cas", expected_version=created)
    kv = await store.get("/cas")
    assert kv is not None and kv.value == b"b"
    assert await store.delete("/cas", expected_version=updated) is True
    assert await store.delete("/cas", expected_version=updated) is False


async def test_exactly_one_of_racing_compare_and_swaps_wins(store: MetadataStore) -> None:
    version = await store.put("/race", b"start")
    results = await asyncio.gather(
        *(
            store.compare_and_swap("/race", f"writer {i}".encode(), expected_version=version)
            for i in range(10)
        ),
        return_exceptions=True,
    )
    winners = [result for result in results if isinstance(result, int)]
    assert len(winners) == 1
    assert all(isinstance(r, MetadataVersionError) for r in results if not isinstance(r, int))
    kv = await store.get("/race")
    assert kv is not None and kv.version == winners[0]


async def test_prefix_listing_is_ordered_and_paginated(store: MetadataStore) -> None:
    names = [f"/p/{i:03d}" for i in range(25)]
    for name in reversed(names):
        await store.put(name, name.encode())
    await store.put("/p0", b"outside")  # The byte after "/" : just past the prefix.
    await store.put("/o", b"outside")
    everything = await store.list_prefix("/p/")
    assert [kv.key for kv in everything] == names
    assert [kv.value for kv in everything] == [name.encode() for name in names]

    pages: list[list[str]] = []
    start_after: str | None = None
    while True:
        page = await store.list_prefix("/p/", start_after=start_after, limit=10)
        if not page:
            break
        pages.append([kv.key for kv in page])
        start_after = page[-1].key
    assert pages == [names[0:10], names[10:20], names[20:25]]

    keys_only = await store.list_prefix("/p/", limit=3, keys_only=True)
    assert [kv.key for kv in keys_only] == names[:3]
    assert [kv.key async for kv in store.iterate_prefix("/p/", page_size=7)] == names
    snapshot = await store.snapshot_prefix("/p/")
    assert [kv.key for kv in snapshot.kvs] == names
    assert snapshot.revision >= max(kv.version for kv in snapshot.kvs)


async def test_keys_must_be_absolute(store: MetadataStore) -> None:
    with pytest.raises(MetadataError, match="must start with '/'"):
        await store.get("relative")


async def test_lease_keep_alive_keeps_keys_and_expiry_deletes_them(store: MetadataStore) -> None:
    lease = await store.grant_lease(1)
    await store.put("/leased/a", b"a", lease=lease)
    await store.compare_and_swap("/leased/b", b"b", expected_version=0, lease=lease)
    await store.put("/leased/plain", b"stays")
    kv = await store.get("/leased/a")
    assert kv is not None and kv.lease == lease.id

    lease.start_keep_alive(0.2)
    await asyncio.sleep(3 * lease.ttl_seconds)  # Well past the TTL: only keep-alive saves them.
    assert [kv.key for kv in await store.list_prefix("/leased/")] == [
        "/leased/a",
        "/leased/b",
        "/leased/plain",
    ]

    await lease.stop_keep_alive()
    assert await wait_until_absent(store, "/leased/a", lease.ttl_seconds + 5)
    assert await wait_until_absent(store, "/leased/b", 1)
    assert await store.get("/leased/plain") is not None
    with pytest.raises(LeaseExpiredError):
        await lease.keep_alive()
    with pytest.raises(LeaseExpiredError):
        await store.put("/leased/late", b"x", lease=lease)


async def test_revoking_a_lease_deletes_its_keys_at_once(store: MetadataStore) -> None:
    lease = await store.grant_lease(30)
    await store.put("/revoked", b"x", lease=lease)
    await lease.revoke()
    assert await store.get("/revoked") is None
    assert lease.lost


async def test_watch_delivers_every_later_change_in_order(store: MetadataStore) -> None:
    await store.put("/w/before", b"not seen")
    start = await store.current_revision() + 1
    revisions = [
        await store.put("/w/a", b"1"),
        await store.put("/w/b", b"2"),
        await store.put("/elsewhere", b"not seen"),
        await store.put("/w/a", b"3"),
    ]
    await store.delete("/w/b")
    events = await collect(store.watch_prefix("/w/", start_revision=start), 4)
    assert [(e.kind, e.key, e.value) for e in events] == [
        (EventKind.PUT, "/w/a", b"1"),
        (EventKind.PUT, "/w/b", b"2"),
        (EventKind.PUT, "/w/a", b"3"),
        (EventKind.DELETE, "/w/b", b""),
    ]
    assert [e.revision for e in events[:3]] == [revisions[0], revisions[1], revisions[3]]
    assert events[2].version == revisions[3] and events[3].version == 0
    assert [e.revision for e in events] == sorted({e.revision for e in events})


async def test_live_watch_sees_changes_made_after_it_started(store: MetadataStore) -> None:
    start = await store.current_revision() + 1
    received: list[WatchEvent] = []

    async def watch() -> None:
        async for event in store.watch_prefix("/live/", start_revision=start):
            received.append(event)

    task = asyncio.create_task(watch())
    try:
        for i in range(20):
            await store.put(f"/live/{i % 3}", str(i).encode())
            if i % 5 == 0:
                await asyncio.sleep(0.06)  # Let some arrive while the watch is idle.
        assert await eventually(lambda: len(received) >= 20)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert [e.value for e in received] == [str(i).encode() for i in range(20)]


async def test_watch_resumes_from_a_revision_on_a_new_connection(
    store: MetadataStore, open_connection: Opener
) -> None:
    start = await store.current_revision() + 1
    for i in range(10):
        await store.put(f"/resume/{i}", str(i).encode())
    first = await collect(store.watch_prefix("/resume/", start_revision=start), 4)
    # A new connection (etcd) / a new store object on the same file (SQLite) picks up exactly
    # where the first watch stopped, while more changes keep coming.
    other = await open_connection()
    try:
        for i in range(10, 15):
            await store.put(f"/resume/{i}", str(i).encode())
        rest = await collect(
            other.watch_prefix("/resume/", start_revision=first[-1].revision + 1), 11
        )
    finally:
        await other.close()
    assert [e.value for e in first + rest] == [str(i).encode() for i in range(15)]


async def test_watch_reports_lease_expiry_as_delete(store: MetadataStore) -> None:
    start = await store.current_revision() + 1
    lease = await store.grant_lease(1)
    await store.put("/expiring/x", b"x", lease=lease)
    events = await collect(store.watch_prefix("/expiring/", start_revision=start), 2)
    assert [(e.kind, e.key) for e in events] == [
        (EventKind.PUT, "/expiring/x"),
        (EventKind.DELETE, "/expiring/x"),
    ]
