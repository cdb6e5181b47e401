"""A ledger lock whose take the store could not confirm is resolved, never left orphaned.

A replication worker holds one lease for a long time: a lock taken under it whose answer was
lost (an etcd leader change mid-request) and left there would keep every worker, that one too,
off the ledger for as long as the lease lives.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bkaio.meta.autorecovery import LOCKS_PREFIX, UnderReplicationManager
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.sqlite_driver import SqliteMetadataStore
from bkaio.meta.store import Lease

LOCK = f"{LOCKS_PREFIX}{7:020d}"


class FakeLostAnswerStore(SqliteMetadataStore):
    """Loses the answer of the next lock take: after applying it (`applied`) or before, with
    another worker's lock landing meanwhile (`interloper`) or not."""

    armed = False
    applied = True
    interloper: Lease | None = None

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_version: int, lease: Lease | None = None
    ) -> int:
        if not (self.armed and key == LOCK):
            return await super().compare_and_swap(
                key, value, expected_version=expected_version, lease=lease
            )
        self.armed = False
        if self.applied:
            await super().compare_and_swap(key, value, expected_version=0, lease=lease)
        elif self.interloper is not None:
            await super().compare_and_swap(
                key, b"other-worker x", expected_version=0, lease=self.interloper
            )
        raise MetadataOutcomeUnknownError(f"lost the answer for {key} (fake)")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[FakeLostAnswerStore]:
    opened = await FakeLostAnswerStore.open(f"sqlite://{tmp_path}/meta.db")
    yield opened
    await opened.close()


@pytest.mark.parametrize("applied", [True, False])
async def test_a_lock_whose_answer_was_lost_is_taken_once_and_released(
    store: FakeLostAnswerStore, applied: bool
) -> None:
    manager = UnderReplicationManager(store)
    lease = await store.grant_lease(30.0)
    store.armed, store.applied = True, applied
    version = await manager.lock(7, lease, owner="worker-1")
    assert version is not None
    held = await store.get(LOCK)
    assert held is not None and held.version == version and held.lease == lease.id
    assert await manager.release(7, version)
    assert await manager.locked() == set()  # Nothing left under the live lease.
    await lease.revoke()


async def test_another_workers_lock_taken_meanwhile_is_not_taken_for_ours(
    store: FakeLostAnswerStore,
) -> None:
    manager = UnderReplicationManager(store)
    ours, theirs = await store.grant_lease(30.0), await store.grant_lease(30.0)
    store.armed, store.applied, store.interloper = True, False, theirs
    assert await manager.lock(7, ours, owner="worker-1") is None
    held = await store.get(LOCK)
    assert held is not None and held.lease == theirs.id
    await ours.revoke()
    await theirs.revoke()


async def test_a_lock_taken_by_a_task_sharing_the_lease_is_not_taken_for_ours(
    store: FakeLostAnswerStore,
) -> None:
    manager = UnderReplicationManager(store)
    lease = await store.grant_lease(30.0)
    # Another claim loop of the same worker (same lease, same owner) holds it when the answer
    # of this take is lost.
    store.armed, store.applied, store.interloper = True, False, lease
    assert await manager.lock(7, lease, owner="other-worker") is None
    await lease.revoke()


class FakeLostDeleteAnswerStore(FakeLostAnswerStore):
    """Loses the answer of the next versioned delete of the lock, after applying it or not."""

    delete_armed = False
    delete_applied = True

    async def delete(self, key: str, *, expected_version: int | None = None) -> bool:
        if not (self.delete_armed and key == LOCK and expected_version is not None):
            return await super().delete(key, expected_version=expected_version)
        self.delete_armed = False
        if self.delete_applied:
            await super().delete(key, expected_version=expected_version)
        raise MetadataOutcomeUnknownError(f"lost the answer for deleting {key} (fake)")


@pytest.mark.parametrize("applied", [True, False])
async def test_a_release_whose_answer_was_lost_leaves_no_lock(
    tmp_path: Path, applied: bool
) -> None:
    store = await FakeLostDeleteAnswerStore.open(f"sqlite://{tmp_path}/meta.db")
    try:
        manager = UnderReplicationManager(store)
        lease = await store.grant_lease(30.0)
        version = await manager.lock(7, lease, owner="worker-1")
        assert version is not None
        store.delete_armed, store.delete_applied = True, applied
        assert await manager.release(7, version)
        assert await manager.locked() == set()  # Not left under the live lease.
        assert await manager.lock(7, lease, owner="worker-2") is not None  # Free to take.
        await lease.revoke()
    finally:
        await store.close()
