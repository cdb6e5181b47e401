"""Watches of a record unchanged for long start after the read, not after the record's version.

A store compacts its history (etcd's auto-compaction, the SQLite driver's change-log trim): a
watch from a revision compacted away fails at once. A ledger whose metadata has not changed
since it was closed, or an auditor elected hours ago, has a version long compacted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

import pytest

from bkaio.meta import sqlite_database
from bkaio.meta.autorecovery import AuditorElection
from bkaio.meta.errors import WatchCompactedError
from bkaio.meta.ledger_metadata import LedgerMetadata
from bkaio.meta.ledgers import LedgerIdGenerator, LedgerManager
from bkaio.meta.sqlite_driver import SqliteMetadataStore
from bkaio.meta.store import WatchEvent

TEMPLATE = LedgerMetadata(
    ensemble_size=2, write_quorum=2, ack_quorum=1, ensembles=((0, ("a:1", "b:1")),)
)


class FakeWatchSpyStore(SqliteMetadataStore):
    """Says when a watch on the auditor's key is asked for (a candidate waits for the seat)."""

    def __init__(self, uri: str, *, create: bool = True) -> None:
        super().__init__(uri, create=create)
        self.auditor_watched = asyncio.Event()

    def watch_prefix(
        self, prefix: str, *, start_revision: int | None = None
    ) -> AsyncGenerator[WatchEvent, None]:
        if prefix == "/auditor":
            self.auditor_watched.set()
        return super().watch_prefix(prefix, start_revision=start_revision)


@pytest.fixture
async def store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[FakeWatchSpyStore]:
    # Trim the change log every 10 revisions, keeping only the last 5 whatever their age.
    monkeypatch.setattr(sqlite_database, "TRIM_EVERY_REVISIONS", 10)
    monkeypatch.setattr(sqlite_database, "CHANGES_KEEP_REVISIONS", 5)
    monkeypatch.setattr(sqlite_database, "CHANGES_KEEP_SECONDS", -60.0)
    opened = await FakeWatchSpyStore.open(f"sqlite://{tmp_path}/meta.db")
    yield opened
    await opened.close()


async def _compact_past(store: SqliteMetadataStore, version: int) -> None:
    for value in range(30):
        await store.put("/unrelated", str(value).encode())
    with pytest.raises(WatchCompactedError):  # The version is compacted away now.
        await anext(aiter(store.watch_prefix("/unrelated", start_revision=version + 1)))


async def test_a_ledger_watch_goes_on_after_its_version_was_compacted(
    store: SqliteMetadataStore,
) -> None:
    ledgers = LedgerManager(store, LedgerIdGenerator(store))
    created = await ledgers.create(TEMPLATE)
    await _compact_past(store, created.version)

    watch = ledgers.watch(created.ledger_id)
    assert await anext(watch) == created
    following = asyncio.ensure_future(anext(watch))
    closed = await ledgers.update(created.closed(last_entry_id=3, length=40))
    assert await asyncio.wait_for(following, 10) == closed
    following = asyncio.ensure_future(anext(watch))
    await ledgers.delete(created.ledger_id)
    assert await asyncio.wait_for(following, 10) is None


async def test_a_candidate_waits_for_an_auditor_elected_before_a_compaction(
    store: FakeWatchSpyStore,
) -> None:
    election = AuditorElection(store)
    first = await election.run_for_auditor("bookie-1:3181", ttl_seconds=30.0)
    held = await store.get("/auditor")
    assert held is not None
    await _compact_past(store, held.version)

    second = asyncio.ensure_future(election.run_for_auditor("bookie-2:3181", ttl_seconds=30.0))
    await asyncio.wait_for(store.auditor_watched.wait(), 10)  # Found the seat taken.
    await first.resign()
    leadership = await asyncio.wait_for(second, 10)
    assert await election.who_is_auditor() == "bookie-2:3181"
    await leadership.resign()
