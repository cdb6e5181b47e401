"""The metadata layer's compare-and-swap loops give up after MAX_METADATA_ATTEMPTS.

A store that loses the answer to every conditional write (MetadataOutcomeUnknownError, nothing
written) or refuses every one as stale (MetadataVersionError, as if another client always
wrote first) made them retry back to back for ever; now each raises MetadataError and leaves
the key as it was.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bkaio.errors import MetadataError, MetadataVersionError
from bkaio.meta import Lease, LedgerIdGenerator, LedgerManager, LedgerMetadata
from bkaio.meta.autorecovery import UnderReplicationManager, _ur_key
from bkaio.meta.cluster import INSTANCE_ID_KEY, initialise_cluster, read_instance_id
from bkaio.meta.decommission import DecommissionRegistry
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.sqlite_driver import SqliteMetadataStore
from bkaio.meta.store import MAX_METADATA_ATTEMPTS

TEMPLATE = LedgerMetadata(
    ensemble_size=2, write_quorum=2, ack_quorum=1, ensembles=((0, ("a:1", "b:1")),)
)


class LosingSqliteStore(SqliteMetadataStore):
    """While `losing` is set, every CAS of a key under `prefix` fails with `losing` and writes
    nothing."""

    losing: type[MetadataError] | type[MetadataVersionError] | None = None
    prefix = "/"
    attempts = 0

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_version: int, lease: Lease | None = None
    ) -> int:
        if self.losing is None or not key.startswith(self.prefix):
            return await super().compare_and_swap(
                key, value, expected_version=expected_version, lease=lease
            )
        self.attempts += 1
        # Without a bound the caller never stops: fail the test rather than hang it.
        assert self.attempts < 10 * MAX_METADATA_ATTEMPTS, f"CAS of {key} retried without bound"
        raise self.losing(f"lost the answer for {key}")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[LosingSqliteStore]:
    opened = await LosingSqliteStore.open(f"sqlite://{tmp_path}/meta.db")
    yield opened
    await opened.close()


LOSSES = pytest.mark.parametrize(
    "losing", [MetadataOutcomeUnknownError, MetadataVersionError], ids=["lost", "conflict"]
)


@LOSSES
@pytest.mark.parametrize("existing", [False, True], ids=["new", "merged"])
async def test_marking_a_ledger_gives_up(
    store: LosingSqliteStore, losing: type[MetadataError], existing: bool
) -> None:
    marks = UnderReplicationManager(store)
    if existing:
        await marks.mark(7, ["a:1"])
    before = await store.get(_ur_key(7))
    store.losing = losing
    # Every answer lost: the key's own give-up (its last copy may still land), not the mark's.
    lost = losing is MetadataOutcomeUnknownError
    match = f"key {_ur_key(7)}: gave up" if lost else "ledger 7: gave up marking it under-rep"
    with pytest.raises(MetadataError, match=match):
        await marks.mark(7, ["b:1"])
    assert store.attempts == MAX_METADATA_ATTEMPTS
    assert await store.get(_ur_key(7)) == before


@LOSSES
async def test_decommissioning_a_bookie_gives_up(
    store: LosingSqliteStore, losing: type[MetadataError]
) -> None:
    registry = DecommissionRegistry(store)
    store.losing = losing
    with pytest.raises(MetadataError, match="bookie b:1: gave up decommissioning it"):
        await registry.add("b:1")
    assert store.attempts == MAX_METADATA_ATTEMPTS
    assert await registry.get("b:1") is None


@LOSSES
async def test_initialising_a_cluster_gives_up(
    store: LosingSqliteStore, losing: type[MetadataError]
) -> None:
    store.losing = losing
    with pytest.raises(MetadataError, match=f"metadata key {INSTANCE_ID_KEY}: gave up"):
        await initialise_cluster(store)
    assert store.attempts == MAX_METADATA_ATTEMPTS
    assert await read_instance_id(store) is None


async def test_a_ledger_update_whose_every_answer_is_lost_gives_up(
    store: LosingSqliteStore,
) -> None:
    """Each lost answer is resolved by reading the key back: still at the old version, the
    write did not land and was sent again, for ever."""
    ledgers = LedgerManager(store, LedgerIdGenerator(store))
    created = await ledgers.create(TEMPLATE)
    store.losing = MetadataOutcomeUnknownError
    with pytest.raises(MetadataError, match="compare-and-swap attempts"):
        await ledgers.update(created.closed(last_entry_id=3, length=40))
    assert store.attempts == MAX_METADATA_ATTEMPTS
    assert await ledgers.get(created.ledger_id) == created


async def test_allocating_ledger_ids_gives_up_when_every_answer_is_lost(
    store: LosingSqliteStore,
) -> None:
    """Lost races for a block are not counted (other allocators made progress); lost answers
    are: a store losing every one was asked again, after a short backoff, for ever."""
    ids = LedgerIdGenerator(store)
    store.losing = MetadataOutcomeUnknownError
    with pytest.raises(MetadataError, match="gave up allocating a block of ids"):
        await ids.next_id()
    assert store.attempts == MAX_METADATA_ATTEMPTS
    assert await store.get("/idgen") is None


async def test_creating_a_ledger_whose_every_new_id_is_taken_gives_up(
    store: LosingSqliteStore,
) -> None:
    """Each taken id (created with an explicit id by someone else) made create take the next
    one and try again: a store refusing every creation was asked for ever."""
    ledgers = LedgerManager(store, LedgerIdGenerator(store))
    store.losing, store.prefix = MetadataVersionError, "/ledgers/"
    with pytest.raises(MetadataError, match="gave up creating a ledger"):
        await ledgers.create(TEMPLATE)
    assert store.attempts == MAX_METADATA_ATTEMPTS
    assert [i async for i in ledgers.list_ids()] == []
