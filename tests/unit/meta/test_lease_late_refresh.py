"""A lease whose local deadline passed unconfirmed is judged by the store, not by the clock.

When this process's event loop stalls (a GC pause, a starved CPU, SIGSTOP) past a lease's TTL,
or a refresh is still unanswered at the deadline, the keep-alive makes one more refresh bounded
by the attempt timeout: the lease is kept when the store confirms it, lost when the store says
it is gone or does not answer that attempt either. Until then it is `in_doubt`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from bkaio.errors import MetadataError
from bkaio.meta import sqlite_database
from bkaio.meta.errors import LeaseExpiredError
from bkaio.meta.sqlite_driver import SqliteMetadataStore
from bkaio.meta.store import Lease

TTL = 0.1
INTERVAL = 0.02
LIVENESS = 10.0  # Bounds waits only: a broken keep-alive fails the test instead of hanging it.


def _late_refreshes() -> float:
    return REGISTRY.get_sample_value("bkaio_lease_late_refreshes_total") or 0.0


def _stall_loop(seconds: float) -> None:
    """Block the event loop, as a GC pause or a CPU-starved process does."""
    time.sleep(seconds)


class FakeStoreLease(Lease):
    """A lease on a store that answers each refresh as `answer` says: "confirm" (TTL > 0),
    "expired", "refuse" (unreachable at once) or "hang" (silent). `hang_first` makes the next
    refresh hang whatever `answer` is (the store slow to answer one)."""

    def __init__(self) -> None:
        super().__init__(lease_id=9, ttl_seconds=TTL)
        self.answer = "confirm"
        self.hang_first = False
        self.confirmed = asyncio.Event()
        self.calls = 0

    async def keep_alive(self) -> None:
        self.calls += 1
        if self.hang_first:
            self.hang_first = False
            await asyncio.Event().wait()
        if self.answer == "hang":
            await asyncio.Event().wait()
        if self.answer == "expired":
            raise LeaseExpiredError("lease 9 expired or was revoked (fake)")
        if self.answer == "refuse":
            raise MetadataError("keep lease 9 alive: connection refused (fake)")
        self.confirmed.set()

    async def _revoke(self) -> None:
        pass


async def _running(lease: FakeStoreLease) -> None:
    lease.start_keep_alive(interval_seconds=INTERVAL)
    await asyncio.wait_for(lease.confirmed.wait(), LIVENESS)


async def _settled(lease: Lease) -> None:
    """Wait until the lease is lost or a refresh confirmed it after its deadline."""
    async with asyncio.timeout(LIVENESS):
        # `in_doubt` follows the loop's clock: no event says it turned false.
        while lease.in_doubt and not lease.lost:  # noqa: ASYNC110
            await asyncio.sleep(INTERVAL)


def _events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


async def test_a_stall_past_the_ttl_keeps_the_lease_the_store_confirms() -> None:
    lease = FakeStoreLease()
    await _running(lease)
    before = _late_refreshes()
    with capture_logs() as logs:
        _stall_loop(3 * TTL)
        assert lease.in_doubt and not lease.lost
        await _settled(lease)
    assert not lease.lost and not lease.in_doubt
    (late,) = _events(logs, "lease_refresh_late")
    assert late["lease_id"] == 9 and late["late_seconds"] >= 0
    assert _late_refreshes() == before + 1
    assert _events(logs, "lease_lost") == []
    # Refreshes go on as before.
    lease.confirmed.clear()
    await asyncio.wait_for(lease.confirmed.wait(), LIVENESS)
    assert not lease.lost
    await lease.stop_keep_alive()


async def test_a_refresh_unanswered_at_the_deadline_gets_one_more_attempt() -> None:
    """No stall: the store is slow to answer one refresh, which is cut off at the deadline;
    the next attempt finds the lease alive."""
    lease = FakeStoreLease()
    await _running(lease)
    lease.hang_first = True
    lease.confirmed.clear()
    calls = lease.calls
    with capture_logs() as logs:
        await asyncio.wait_for(lease.confirmed.wait(), LIVENESS)
    assert lease.calls == calls + 2  # The one cut off at the deadline, then the late one.
    assert not lease.lost and not lease.in_doubt
    assert len(_events(logs, "lease_refresh_late")) == 1
    await lease.stop_keep_alive()


async def test_a_stall_past_the_ttl_loses_the_lease_the_store_dropped() -> None:
    lease = FakeStoreLease()
    await _running(lease)
    lease.answer = "expired"
    with capture_logs() as logs:
        _stall_loop(3 * TTL)
        await asyncio.wait_for(lease.wait_lost(), LIVENESS)
    assert lease.lost and lease.in_doubt
    assert len(_events(logs, "lease_lost")) == 1
    assert _events(logs, "lease_refresh_late") == []


@pytest.mark.parametrize("answer", ["refuse", "hang"])
async def test_a_stall_past_the_ttl_loses_the_lease_when_the_store_does_not_answer(
    answer: str,
) -> None:
    """The late attempt is bounded by the attempt timeout: a silent store loses the lease."""
    lease = FakeStoreLease()
    await _running(lease)
    lease.answer = answer
    calls = lease.calls
    with capture_logs() as logs:
        _stall_loop(3 * TTL)
        await asyncio.wait_for(lease.wait_lost(), LIVENESS)
    assert lease.calls == calls + 1  # The one late attempt, no more.
    (lost,) = _events(logs, "lease_lost")
    assert lost["reason"] == "no refresh confirmed within the TTL"


class FakeStoreClock:
    """The SQLite store's wall clock, moved only by the test: where the store judges expiry."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@pytest.fixture
async def sqlite_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[SqliteMetadataStore, FakeStoreClock]]:
    store = await SqliteMetadataStore.open(f"sqlite://{tmp_path}/meta.db")
    clock = FakeStoreClock()
    monkeypatch.setattr(sqlite_database, "time", clock)
    yield store, clock
    await store.close()


async def test_sqlite_a_stall_keeps_the_lease_whose_row_has_not_expired(
    sqlite_store: tuple[SqliteMetadataStore, FakeStoreClock],
) -> None:
    """This process's loop stalls past the TTL while the store's clock has not passed the
    lease's expiry: the row decides, the lease and its key stay."""
    store, _ = sqlite_store
    lease = await store.grant_lease(TTL)
    await store.put("/auditor", b"me", lease=lease)
    lease.start_keep_alive(interval_seconds=INTERVAL)
    with capture_logs() as logs:
        _stall_loop(3 * TTL)
        await _settled(lease)
    assert not lease.lost
    assert len(_events(logs, "lease_refresh_late")) == 1
    kv = await store.get("/auditor")
    assert kv is not None and kv.lease == lease.id
    await lease.revoke()


async def test_sqlite_a_stall_past_the_rows_expiry_loses_the_lease(
    sqlite_store: tuple[SqliteMetadataStore, FakeStoreClock],
) -> None:
    store, clock = sqlite_store
    lease = await store.grant_lease(TTL)
    await store.put("/auditor", b"me", lease=lease)
    lease.start_keep_alive(interval_seconds=INTERVAL)
    with capture_logs() as logs:
        _stall_loop(3 * TTL)
        clock.now += 3 * TTL  # The store's clock passed the expiry as well.
        await asyncio.wait_for(lease.wait_lost(), LIVENESS)
    assert _events(logs, "lease_refresh_late") == []
    assert await store.get("/auditor") is None  # Reaped by the late refresh.


async def test_sqlite_a_grant_answered_late_counts_its_ttl_from_the_request(
    sqlite_store: tuple[SqliteMetadataStore, FakeStoreClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store grants the lease, then its answer comes later than a TTL (a slow reply, a
    stalled loop): the store counts the TTL from the grant, so the lease is in doubt the moment
    the holder gets it, not a TTL after, and the store indeed says it is gone."""
    store, clock = sqlite_store
    grant = store._database.grant_sync

    def grant_answered_late(ttl_seconds: float) -> int:
        lease_id = grant(ttl_seconds)
        clock.now += 3 * TTL  # The store's time goes on before the answer arrives...
        time.sleep(3 * TTL)  # ...and this process's (on the store's worker thread).
        return lease_id

    monkeypatch.setattr(store._database, "grant_sync", grant_answered_late)
    lease = await store.grant_lease(TTL)
    assert lease.in_doubt and not lease.lost
    with pytest.raises(LeaseExpiredError):
        await lease.keep_alive()
