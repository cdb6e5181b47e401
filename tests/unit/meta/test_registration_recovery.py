"""A bookie's registration comes back after failures, and a failed mode move is made again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bkaio.errors import MetadataError
from bkaio.meta.bookies import BookieInfo, BookieRegistry, registration_key
from bkaio.meta.sqlite_driver import SqliteMetadataStore
from bkaio.meta.store import EventKind, Lease

INFO = BookieInfo.for_address("127.0.0.1", 3181)
WRITABLE = registration_key(INFO.bookie_id, read_only=False)
READ_ONLY = registration_key(INFO.bookie_id, read_only=True)


class FakeFlakyPutStore(SqliteMetadataStore):
    """Fails the next `failing_puts` writes of a key (unconditional or by version) as an
    unreachable store would, before applying them."""

    failing_puts = 0

    def _fail_put(self, key: str) -> None:
        if self.failing_puts > 0:
            self.failing_puts -= 1
            raise MetadataError(f"put {key}: store unreachable (fake)")

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        self._fail_put(key)
        return await super().put(key, value, lease=lease)

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_version: int, lease: Lease | None = None
    ) -> int:
        self._fail_put(key)
        return await super().compare_and_swap(
            key, value, expected_version=expected_version, lease=lease
        )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[FakeFlakyPutStore]:
    opened = await FakeFlakyPutStore.open(f"sqlite://{tmp_path}/meta.db")
    yield opened
    await opened.close()


async def _until_put(store: FakeFlakyPutStore, key: str, start_revision: int) -> None:
    async for event in store.watch_prefix(key, start_revision=start_revision):
        if event.kind is EventKind.PUT:
            return


async def test_registration_comes_back_when_the_first_publish_after_a_lost_lease_fails(
    store: FakeFlakyPutStore,
) -> None:
    registration = await BookieRegistry(store).register(INFO, ttl_seconds=5.0)
    store.failing_puts = 1  # The first re-registration attempt gets its lease, not its record.
    start = await store.current_revision() + 1
    await registration.lease.revoke()  # Lost, as after an outage longer than the TTL.
    assert await store.get(WRITABLE) is None
    # Liveness bound only: the retry comes within a backoff of 0.2 s.
    await asyncio.wait_for(_until_put(store, WRITABLE, start), 10.0)
    kv = await store.get(WRITABLE)
    assert kv is not None and kv.lease == registration.lease.id
    assert not registration.lease.lost
    await registration.deregister()
    assert await store.get(WRITABLE) is None


async def test_a_failed_move_to_read_only_is_made_when_asked_again(
    store: FakeFlakyPutStore,
) -> None:
    registration = await BookieRegistry(store).register(INFO, ttl_seconds=5.0)
    store.failing_puts = 1
    with pytest.raises(MetadataError):
        await registration.set_read_only(True)
    assert await store.get(READ_ONLY) is None  # Still listed as writable only.
    await registration.set_read_only(True)  # The bookie's mode keeper retries.
    assert await store.get(READ_ONLY) is not None
    assert await store.get(WRITABLE) is None
    await registration.set_read_only(False)
    assert await store.get(WRITABLE) is not None
    assert await store.get(READ_ONLY) is None
    await registration.deregister()


async def test_a_move_back_after_a_failed_move_leaves_one_key(store: FakeFlakyPutStore) -> None:
    registration = await BookieRegistry(store).register(INFO, ttl_seconds=5.0)
    await registration.set_read_only(True)
    store.failing_puts = 1
    with pytest.raises(MetadataError):
        await registration.set_read_only(False)
    await registration.set_read_only(False)
    assert await store.get(WRITABLE) is not None
    assert await store.get(READ_ONLY) is None
    await registration.deregister()


async def test_registered_says_false_while_the_record_is_gone_then_true_again(
    store: FakeFlakyPutStore,
) -> None:
    """What the bookie's is_ready and admin state report: not 'registered' merely because the
    bookie registered once."""
    registration = await BookieRegistry(store).register(INFO, ttl_seconds=5.0)
    assert registration.registered
    store.failing_puts = 3  # Metadata unreachable for the first attempts to register again.
    start = await store.current_revision() + 1
    await registration.lease.revoke()
    assert await store.get(WRITABLE) is None
    assert not registration.registered
    await asyncio.wait_for(_until_put(store, WRITABLE, start), 10.0)
    assert registration.registered
    await registration.deregister()
    assert not registration.registered
