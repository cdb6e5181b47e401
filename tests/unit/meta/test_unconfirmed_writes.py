"""LedgerManager resolves a CAS whose outcome the store could not confirm by re-reading."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bkaio.errors import MetadataVersionError
from bkaio.meta import Lease, LedgerIdGenerator, LedgerManager, LedgerMetadata
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.sqlite_driver import SqliteMetadataStore

TEMPLATE = LedgerMetadata(
    ensemble_size=2, write_quorum=2, ack_quorum=1, ensembles=((0, ("a:1", "b:1")),)
)


class UnconfirmedWriteSqliteStore(SqliteMetadataStore):
    """Loses the answer of the next ledger CAS: after applying it (`applied`) or before."""

    applied = True
    armed = False
    interloper: bytes | None = None  # Written by "another client" before the answer is lost.

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_version: int, lease: Lease | None = None
    ) -> int:
        if not (self.armed and key.startswith("/ledgers/")):
            return await super().compare_and_swap(
                key, value, expected_version=expected_version, lease=lease
            )
        self.armed = False
        if self.applied:
            await super().compare_and_swap(key, value, expected_version=expected_version)
        if self.interloper is not None:
            await self.put(key, self.interloper)
        raise MetadataOutcomeUnknownError(f"lost the answer for {key}")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[UnconfirmedWriteSqliteStore]:
    opened = await UnconfirmedWriteSqliteStore.open(f"sqlite://{tmp_path}/meta.db")
    yield opened
    await opened.close()


@pytest.mark.parametrize("applied", [True, False])
async def test_create_and_update_survive_a_lost_answer(
    store: UnconfirmedWriteSqliteStore, applied: bool
) -> None:
    ledgers = LedgerManager(store, LedgerIdGenerator(store))
    store.applied, store.armed = applied, True
    created = await ledgers.create(TEMPLATE)
    assert await ledgers.get(created.ledger_id) == created

    store.armed = True
    closed = await ledgers.update(created.closed(last_entry_id=3, length=40))
    assert await ledgers.get(created.ledger_id) == closed


async def test_a_lost_answer_with_another_writer_in_between_is_a_lost_race(
    store: UnconfirmedWriteSqliteStore,
) -> None:
    ledgers = LedgerManager(store, LedgerIdGenerator(store))
    created = await ledgers.create(TEMPLATE)
    store.armed = True
    store.interloper = b"someone else's metadata"
    with pytest.raises(MetadataVersionError):
        await ledgers.update(created.closed(last_entry_id=3, length=40))
