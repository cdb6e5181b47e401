"""A bookie's registration checks `lost`, not `in_doubt`, before a mode move, because the move's
write is bound to the lease in the store: after an event-loop stall past the TTL, while the
lease is in doubt and not yet known lost, a move on a lease the store dropped is refused (the
record is never written under it), and the record comes back, in the new mode, once the
keep-alive has found the lease lost and the registration takes a new one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bkaio.meta import sqlite_database
from bkaio.meta.bookies import BookieInfo, BookieRegistry, RegistrationState, registration_key
from bkaio.meta.errors import LeaseExpiredError
from bkaio.meta.sqlite_driver import SqliteMetadataStore
from bkaio.meta.store import EventKind
from tests.unit.meta.test_lease_late_refresh import LIVENESS, TTL, FakeStoreClock, _stall_loop

INFO = BookieInfo.for_address("127.0.0.1", 3181)
READ_ONLY = registration_key(INFO.bookie_id, read_only=True)


@pytest.fixture
async def store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[SqliteMetadataStore, FakeStoreClock]]:
    opened = await SqliteMetadataStore.open(f"sqlite://{tmp_path}/meta.db")
    clock = FakeStoreClock()
    monkeypatch.setattr(sqlite_database, "time", clock)
    yield opened, clock
    await opened.close()


async def test_a_mode_move_on_a_lease_the_store_dropped_is_refused_by_the_store(
    store: tuple[SqliteMetadataStore, FakeStoreClock],
) -> None:
    metadata, clock = store
    registration = await BookieRegistry(metadata).register(INFO, ttl_seconds=TTL)
    dropped = registration.lease
    start = await metadata.current_revision() + 1
    _stall_loop(3 * TTL)
    clock.now += 3 * TTL  # The store's clock passed the lease's expiry too.
    assert registration.registered and dropped.in_doubt  # Not known lost yet.
    assert registration.state.value == "unconfirmed"  # As an operator is shown it.
    with pytest.raises(LeaseExpiredError):
        await registration.set_read_only(True)
    async with asyncio.timeout(LIVENESS):  # Back under a new lease, read-only.
        async for event in metadata.watch_prefix(READ_ONLY, start_revision=start):
            if event.kind is EventKind.PUT:
                break
    kv = await metadata.get(READ_ONLY)
    assert kv is not None and dropped.lost
    assert kv.lease == registration.lease.id != dropped.id
    assert registration.state is RegistrationState.REGISTERED
    await registration.deregister()
