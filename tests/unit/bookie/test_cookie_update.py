"""updatecookie: a stopped bookie re-stamped after an id or directory change, with the checks
that keep a wrong disk, a running bookie or another bookie's id out (SQLite metadata)."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bkaio.bookie.cookie_update import BookieRunningError, update_bookie_id, update_directories
from bkaio.bookie.cookies import check_cookies
from bkaio.config import BookieConfig, build_bookie_config
from bkaio.entrylog.cookie import read_cookie, write_cookie
from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.errors import CookieMismatchError
from bkaio.journal import open_journal
from bkaio.journal.files import lock_directory
from bkaio.meta import BookieInfo, Metadata, open_metadata, open_store
from bkaio.meta.cluster import initialise_cluster
from tests.fixtures.storage import add_entry
from tests.unit.entrylog.conftest import KEY, make_entry

OLD_ID = "127.0.0.1:45181"


def config_of(tmp_path: Path, root: Path, *, disks: int = 1, **bookie: Any) -> BookieConfig:
    return build_bookie_config(
        {
            "bookie": {"host": "127.0.0.1", "port": 45181, "shards": 2, **bookie},
            "metadata": {"uri": f"sqlite:///{tmp_path / 'meta.db'}"},
            "storage": {
                "journal_dirs": [str(root / "journal")],
                "ledger_dirs": [str(root / f"ledgers{i}") for i in range(disks)],
            },
        },
        env={},
    )


@pytest.fixture
async def metadata(tmp_path: Path) -> AsyncIterator[Metadata]:
    uri = f"sqlite:///{tmp_path / 'meta.db'}"
    store = await open_store(uri)
    try:
        await initialise_cluster(store)
    finally:
        await store.close()
    opened = await open_metadata(uri)
    yield opened
    await opened.close()


async def start_check(config: BookieConfig, metadata: Metadata) -> None:
    """The cookie check a bookie's start makes."""
    await check_cookies(config, metadata.cookies, cluster_instance_id=metadata.instance_id)


def stamps(config: BookieConfig) -> set[str]:
    return {
        cookie.bookie_id
        for storage in config.storage
        for directory in (*storage.journal.directories, *storage.ledger_dirs, *storage.index_dirs)
        if (cookie := read_cookie(Path(directory))) is not None
    }


async def test_a_new_bookie_id_moves_the_cookies(tmp_path: Path, metadata: Metadata) -> None:
    old = config_of(tmp_path, tmp_path / "data")
    await start_check(old, metadata)  # What the bookie's first start does.
    new = config_of(tmp_path, tmp_path / "data", bookie_id="renamed:45181")
    with pytest.raises(CookieMismatchError):
        await start_check(new, metadata)  # Why the update is needed.
    report = await update_bookie_id(new, metadata, OLD_ID)
    assert report.directories_stamped == 2 * 3 and report.metadata_updated
    assert stamps(new) == {"renamed:45181"}
    assert await metadata.cookies.get(OLD_ID) is None
    await start_check(new, metadata)  # The bookie starts again.
    again = await update_bookie_id(new, metadata, OLD_ID)
    assert again.already_done and again.directories_stamped == 0


async def test_an_interrupted_id_update_is_finished(tmp_path: Path, metadata: Metadata) -> None:
    old = config_of(tmp_path, tmp_path / "data")
    await start_check(old, metadata)
    new = config_of(tmp_path, tmp_path / "data", bookie_id="renamed:45181")
    journal = Path(new.storage[0].journal.directories[0])
    cookie = read_cookie(journal)
    assert cookie is not None
    write_cookie(journal, replace(cookie, bookie_id="renamed:45181"))  # Stopped mid-way.
    report = await update_bookie_id(new, metadata, OLD_ID)
    assert report.directories_stamped == 2 * 3 - 1
    await start_check(new, metadata)


async def test_id_update_refusals(tmp_path: Path, metadata: Metadata) -> None:
    old = config_of(tmp_path, tmp_path / "data")
    await start_check(old, metadata)
    new = config_of(tmp_path, tmp_path / "data", bookie_id="renamed:45181")
    with pytest.raises(CookieMismatchError, match="already resolves"):
        await update_bookie_id(old, metadata, OLD_ID)
    with pytest.raises(CookieMismatchError, match="no cookie for"):
        await update_bookie_id(new, metadata, "never:1")
    registration = await metadata.bookies.register(BookieInfo.for_address("127.0.0.1", 45181), 30)
    with pytest.raises(BookieRunningError, match="registered"):
        await update_bookie_id(new, metadata, OLD_ID)
    await registration.deregister()
    lock = lock_directory(Path(new.storage[1].journal.directories[0]))
    try:
        with pytest.raises(BookieRunningError, match="stop the bookie"):
            await update_bookie_id(new, metadata, OLD_ID)
    finally:
        os.close(lock)
    await metadata.cookies.put(
        "renamed:45181", b'{"shard_count": 0, "shards": []}', expected_version=0
    )
    with pytest.raises(CookieMismatchError, match="another bookie"):
        await update_bookie_id(new, metadata, OLD_ID)
    assert stamps(new) == {OLD_ID}  # Nothing was written by any refusal.


async def _store_ledgers(config: BookieConfig, ledgers: range) -> None:
    for shard, storage_config in enumerate(config.storage):
        storage = await ShardStorage.open(
            storage_config,
            journal_factory=open_journal,
            bookie_id=config.bookie_id,
            shard_index=shard,
            shard_count=config.shard_count,
        )
        try:
            for ledger_id in ledgers:
                if config.shard_of(ledger_id) == shard:
                    await add_entry(storage, make_entry(ledger_id, 0), KEY)
        finally:
            await storage.close()


async def test_moved_directories_are_restamped(tmp_path: Path, metadata: Metadata) -> None:
    old = config_of(tmp_path, tmp_path / "data", disks=2)
    await start_check(old, metadata)
    await _store_ledgers(old, range(1, 9))
    shutil.move(tmp_path / "data", tmp_path / "moved")
    moved = config_of(tmp_path, tmp_path / "moved", disks=2)
    with pytest.raises(CookieMismatchError):
        await start_check(moved, metadata)
    report = await update_directories(moved, metadata)
    assert report.directories_stamped == 2 * 5 and report.metadata_updated
    await start_check(moved, metadata)
    assert (await update_directories(moved, metadata)).already_done


async def test_reordered_or_missing_disks_are_refused(tmp_path: Path, metadata: Metadata) -> None:
    old = config_of(tmp_path, tmp_path / "data", disks=2)
    await start_check(old, metadata)
    await _store_ledgers(old, range(1, 9))
    swapped = tmp_path / "swapped"
    shutil.copytree(tmp_path / "data", swapped)
    (swapped / "ledgers0").rename(swapped / "tmp")
    (swapped / "ledgers1").rename(swapped / "ledgers0")
    (swapped / "tmp").rename(swapped / "ledgers1")
    with pytest.raises(CookieMismatchError, match="another order"):
        await update_directories(config_of(tmp_path, swapped, disks=2), metadata)
    fewer = config_of(tmp_path, tmp_path / "data", disks=1)
    with pytest.raises(CookieMismatchError):
        await update_directories(fewer, metadata)
    wiped = tmp_path / "wiped"
    shutil.copytree(tmp_path / "data", wiped)
    shutil.rmtree(wiped / "ledgers1")
    with pytest.raises(CookieMismatchError, match="holds no cookie"):
        await update_directories(config_of(tmp_path, wiped, disks=2), metadata)
    assert (await metadata.cookies.get(OLD_ID)) is not None


def cluster_ids(config: BookieConfig) -> set[str]:
    return {
        cookie.cluster_instance_id
        for storage in config.storage
        for directory in (*storage.journal.directories, *storage.ledger_dirs, *storage.index_dirs)
        if (cookie := read_cookie(Path(directory))) is not None
    }


async def test_updates_keep_the_cluster_the_cookies_name(
    tmp_path: Path, metadata: Metadata
) -> None:
    """A cookie names the cluster it was stamped in: a new id or moved directories keep it (and
    the bookie, which checks it, starts after each)."""
    old = config_of(tmp_path, tmp_path / "data")
    await start_check(old, metadata)
    assert cluster_ids(old) == {metadata.instance_id}
    renamed = config_of(tmp_path, tmp_path / "data", bookie_id="renamed:45181")
    await update_bookie_id(renamed, metadata, OLD_ID)
    assert cluster_ids(renamed) == {metadata.instance_id}
    await start_check(renamed, metadata)
    shutil.move(tmp_path / "data", tmp_path / "moved")
    moved = config_of(tmp_path, tmp_path / "moved", bookie_id="renamed:45181")
    report = await update_directories(moved, metadata)
    assert report.directories_stamped == 2 * 3
    assert cluster_ids(moved) == {metadata.instance_id}
    await start_check(moved, metadata)
