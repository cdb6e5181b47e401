"""An SQLite snapshot does not fail when a lease expires while it is being read."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bkaio.meta import sqlite_database
from bkaio.meta.sqlite_driver import SqliteMetadataStore


class FakeClock:
    """Wall-clock time that jumps `jump` seconds ahead after its first reading."""

    def __init__(self, jump: float) -> None:
        self._jump = jump
        self._readings = 0

    def time(self) -> float:
        self._readings += 1
        return time.time() + (self._jump if self._readings > 1 else 0.0)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteMetadataStore]:
    opened = await SqliteMetadataStore.open(f"sqlite://{tmp_path}/meta.db")
    yield opened
    await opened.close()


async def test_a_lease_expiring_between_the_reap_and_the_read_does_not_fail_a_snapshot(
    store: SqliteMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = await store.grant_lease(30.0)
    await store.put("/bookies/writable/a:1", b"a", lease=lease)
    await store.put("/bookies/writable/b:1", b"b")
    # The snapshot's first look finds no lease expired; by its read, the lease is past its TTL.
    monkeypatch.setattr(sqlite_database, "time", FakeClock(jump=60.0))
    snapshot = await store.snapshot_prefix("/bookies/")
    assert [kv.key for kv in snapshot.kvs] == ["/bookies/writable/a:1", "/bookies/writable/b:1"]
    assert [kv.key for kv in await store.list_prefix("/bookies/")] == ["/bookies/writable/b:1"]
