"""Conditional writes whose answer the store lost, resolved by reading the key back.

A fake store loses the answer of the next conditional write of a key: after applying it
("applied"), without applying it ("unapplied"), or holding it and applying it just before the
next conditional write of that key arrives ("late": an etcd member that was cut off forwarding
a buffered request when it comes back). Every caller must decide as if it had the answer:
its own write landed, or not (sent again: at most one copy lands), or another writer won.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bkaio.errors import MetadataVersionError
from bkaio.meta import Lease, LedgerIdGenerator, LedgerManager, LedgerMetadata
from bkaio.meta.autorecovery import (
    AUDITOR_KEY,
    AuditorElection,
    UnderReplicationManager,
    _lock_key,
    _ur_key,
)
from bkaio.meta.bookies import BookieInfo, BookieRegistry, registration_key
from bkaio.meta.cluster import LAYOUT_KEY, initialise_cluster, read_instance_id
from bkaio.meta.conditional import compare_and_swap_resolved, delete_resolved
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.sqlite_driver import SqliteMetadataStore
from bkaio.meta.store import MAX_METADATA_ATTEMPTS, KeyValue

TEMPLATE = LedgerMetadata(
    ensemble_size=2, write_quorum=2, ack_quorum=1, ensembles=((0, ("a:1", "b:1")),)
)
MODES = pytest.mark.parametrize("mode", ["applied", "unapplied", "late"])


class LosingStore(SqliteMetadataStore):
    """Loses the answer of the next conditional write (CAS or versioned delete) of `key`."""

    key: str | None = None
    mode = "applied"
    held: list[tuple[str, bytes | None, int, Lease | None]]  # A late copy: key, value...
    lost = 0

    async def _deliver_held(self, key: str) -> None:
        for held in [h for h in self.held if h[0] == key]:
            self.held.remove(held)
            _, value, version, lease = held
            try:
                if value is None:
                    await super().delete(key, expected_version=version)
                else:
                    await super().compare_and_swap(
                        key, value, expected_version=version, lease=lease
                    )
            except MetadataVersionError:
                pass  # Conditioned on a version gone: the late copy cannot land.

    def _losing(self, key: str) -> bool:
        if self.key != key:
            return False
        self.key = None
        self.lost += 1
        return True

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_version: int, lease: Lease | None = None
    ) -> int:
        await self._deliver_held(key)
        if not self._losing(key):
            return await super().compare_and_swap(
                key, value, expected_version=expected_version, lease=lease
            )
        if self.mode == "applied":
            await super().compare_and_swap(
                key, value, expected_version=expected_version, lease=lease
            )
        elif self.mode == "late":
            self.held.append((key, value, expected_version, lease))
        raise MetadataOutcomeUnknownError(f"lost the answer for {key}")

    async def delete(self, key: str, *, expected_version: int | None = None) -> bool:
        await self._deliver_held(key)
        if expected_version is None or not self._losing(key):
            return await super().delete(key, expected_version=expected_version)
        if self.mode == "applied":
            await super().delete(key, expected_version=expected_version)
        elif self.mode == "late":
            self.held.append((key, None, expected_version, None))
        raise MetadataOutcomeUnknownError(f"lost the answer for {key}")

    def lose_next(self, key: str, mode: str) -> None:
        self.key, self.mode = key, mode


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[LosingStore]:
    opened = await LosingStore.open(f"sqlite://{tmp_path}/meta.db")
    opened.held = []
    yield opened
    await opened.close()


# ---------------------------------------------------------------------- the two functions


@MODES
async def test_a_cas_whose_answer_was_lost_lands_once(store: LosingStore, mode: str) -> None:
    old = await store.compare_and_swap("/k", b"old", expected_version=0)
    store.lose_next("/k", mode)
    version = await compare_and_swap_resolved(store, "/k", b"new", expected_version=old)
    kv = await store.get("/k")
    assert kv is not None and (kv.value, kv.version) == (b"new", version)
    assert store.lost == 1 and not store.held


@MODES
async def test_a_versioned_delete_whose_answer_was_lost_deletes(
    store: LosingStore, mode: str
) -> None:
    version = await store.compare_and_swap("/k", b"old", expected_version=0)
    store.lose_next("/k", mode)
    assert await delete_resolved(store, "/k", expected_version=version)
    assert await store.get("/k") is None and not store.held


async def test_another_writer_after_a_lost_answer_wins(store: LosingStore) -> None:
    old = await store.compare_and_swap("/k", b"old", expected_version=0)
    store.lose_next("/k", "unapplied")
    real_get = store.get

    async def interloper_first(key: str) -> KeyValue | None:  # Another client writes first.
        await store.put("/k", b"theirs")
        store.get = real_get  # type: ignore[method-assign]
        return await real_get(key)

    store.get = interloper_first  # type: ignore[method-assign]
    with pytest.raises(MetadataVersionError, match="/k: version is"):
        await compare_and_swap_resolved(store, "/k", b"new", expected_version=old)
    kv = await store.get("/k")
    assert kv is not None and kv.value == b"theirs"


async def test_a_key_deleted_and_created_again_counts_as_deleted(store: LosingStore) -> None:
    version = await store.compare_and_swap("/k", b"old", expected_version=0)
    store.lose_next("/k", "applied")
    real_get = store.get

    async def recreated_first(key: str) -> KeyValue | None:
        await store.compare_and_swap("/k", b"anew", expected_version=0)
        store.get = real_get  # type: ignore[method-assign]
        return await real_get(key)

    store.get = recreated_first  # type: ignore[method-assign]
    assert await delete_resolved(store, "/k", expected_version=version)
    kv = await store.get("/k")
    assert kv is not None and kv.value == b"anew"  # The new record is not deleted.


async def test_every_answer_lost_is_an_unknown_outcome(store: LosingStore) -> None:
    calls = 0
    real_cas = SqliteMetadataStore.compare_and_swap

    async def always_lost(key: str, value: bytes, **kwargs: object) -> int:
        nonlocal calls
        calls += 1
        raise MetadataOutcomeUnknownError("lost")

    store.compare_and_swap = always_lost  # type: ignore[method-assign]
    with pytest.raises(MetadataOutcomeUnknownError, match="/k: gave up after 8 compare-and-swap"):
        await compare_and_swap_resolved(store, "/k", b"new", expected_version=0)
    assert calls == MAX_METADATA_ATTEMPTS
    assert real_cas is SqliteMetadataStore.compare_and_swap


# ---------------------------------------------------------------------- the callers


async def test_a_ledger_update_whose_first_copy_lands_late_is_ours(store: LosingStore) -> None:
    # The copy sent again was refused because the first landed meanwhile: that was reported
    # as another writer's update (MetadataVersionError; a writer closing its ledger then took
    # its own close for another client's and failed with LedgerFencedError).
    ledgers = LedgerManager(store, LedgerIdGenerator(store))
    created = await ledgers.create(TEMPLATE)
    store.lose_next(f"/ledgers/{created.ledger_id:020d}", "late")
    closed = await ledgers.update(created.closed(last_entry_id=3, length=40))
    assert await ledgers.get(created.ledger_id) == closed


async def test_a_lock_whose_first_copy_lands_late_is_ours(store: LosingStore) -> None:
    # Was None (someone holds it): the caller's own lock, under its live lease, kept every
    # worker off the ledger, the caller too, for as long as the lease lived.
    marks = UnderReplicationManager(store)
    lease = await store.grant_lease(30)
    store.lose_next(_lock_key(7), "late")
    version = await marks.lock(7, lease, owner="w1")
    assert version is not None
    assert await marks.release(7, version)
    assert await store.get(_lock_key(7)) is None


@pytest.mark.parametrize("drop", [False, True], ids=["narrowed", "dropped"])
async def test_narrowing_a_mark_whose_answer_was_lost(store: LosingStore, drop: bool) -> None:
    # MetadataOutcomeUnknownError reached the replication worker, the mark as it may be.
    marks = UnderReplicationManager(store)
    record = (await marks.mark(7, ["a:1", "b:1"])).record
    store.lose_next(_ur_key(7), "applied")
    assert await marks.narrow(record, [] if drop else ["a:1"], [])
    after = await marks.get(7)
    assert (after is None) if drop else (after is not None and after.missing_bookies == ("a:1",))


@MODES
async def test_completing_a_ledger_whose_answer_was_lost_releases_its_lock(
    store: LosingStore, mode: str
) -> None:
    # MetadataOutcomeUnknownError left `complete` before it released the lock: the ledger
    # stayed locked under the worker's live lease.
    marks = UnderReplicationManager(store)
    await marks.mark(7, ["a:1"])
    lease = await store.grant_lease(30)
    claimed = await marks.claim(7, lease, owner="w1")
    assert claimed is not None
    store.lose_next(_ur_key(7), mode)
    assert await marks.complete(claimed)
    assert await marks.get(7) is None
    assert await store.get(_lock_key(7)) is None


async def test_an_election_whose_answer_was_lost_is_won(store: LosingStore) -> None:
    # MetadataOutcomeUnknownError left run_for_auditor (revoking its lease) though it won.
    election = AuditorElection(store)
    lease = await store.grant_lease(30)
    store.lose_next(AUDITOR_KEY, "applied")
    assert await election.try_become_auditor("b:1", lease)
    assert await election.who_is_auditor() == "b:1"


async def test_an_election_whose_answer_was_lost_under_another_lease_is_lost(
    store: LosingStore,
) -> None:
    # Our bookie id in the key is not enough: an old incarnation's lease may hold it.
    election = AuditorElection(store)
    old, lease = await store.grant_lease(30), await store.grant_lease(30)
    await store.compare_and_swap(AUDITOR_KEY, b"b:1", expected_version=0, lease=old)
    store.lose_next(AUDITOR_KEY, "unapplied")
    assert not await election.try_become_auditor("b:1", lease)


async def test_a_registration_whose_answer_was_lost_is_registered(store: LosingStore) -> None:
    # MetadataOutcomeUnknownError failed the bookie's start (and revoked the lease).
    info = BookieInfo.for_address("127.0.0.1", 3181, version="v")
    store.lose_next(registration_key(info.bookie_id, read_only=False), "applied")
    registration = await BookieRegistry(store).register(info, ttl_seconds=30)
    kv = await store.get(registration_key(info.bookie_id, read_only=False))
    assert kv is not None and kv.lease == registration.lease.id
    await registration.deregister()


async def test_initialising_a_cluster_whose_answer_was_lost(store: LosingStore) -> None:
    # Was ClusterExistsError ("another process initialised cluster ... at the same time").
    store.lose_next(LAYOUT_KEY, "applied")
    instance_id = await initialise_cluster(store)
    assert await read_instance_id(store) == instance_id
