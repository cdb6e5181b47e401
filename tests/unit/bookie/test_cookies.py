"""The cookie check a bookie's start makes (bkaio/bookie/cookies.py): cookies name the cluster
they were stamped in, so a bookie never joins a re-created cluster with the old one's data; and a
directory the start cannot use is an error naming the setting that places it (SQLite metadata)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from bkaio.bookie.cookies import (
    check_cookies,
    decode_cookie_copy,
    encode_cookie_copy,
    shard_directories,
)
from bkaio.config import BookieConfig, build_bookie_config
from bkaio.entrylog.cookie import Cookie, read_cookie, write_cookie
from bkaio.errors import ConfigError, CookieMismatchError
from bkaio.meta import Metadata, open_metadata, open_store
from bkaio.meta.cluster import initialise_cluster
from bkaio.meta.cluster_admin import format_cluster


def config_of(tmp_path: Path, *, journal: Path | None = None) -> BookieConfig:
    return build_bookie_config(
        {
            "bookie": {"host": "127.0.0.1", "port": 45181, "shards": 2},
            "metadata": {"uri": f"sqlite:///{tmp_path / 'meta.db'}"},
            "storage": {
                "journal_dirs": [str(journal or tmp_path / "data" / "journal")],
                "ledger_dirs": [str(tmp_path / "data" / "ledgers")],
            },
        },
        env={},
    )


async def open_cluster(uri: str, *, recreate: bool = False) -> Metadata:
    """Open the cluster at `uri`, first creating it (or, `recreate`, wiping it and creating a new
    one, as `bkaio shell metaformat --force` does)."""
    store = await open_store(uri)
    try:
        if recreate:
            await format_cluster(store, force=True)
        else:
            await initialise_cluster(store)
    finally:
        await store.close()
    return await open_metadata(uri)


@pytest.fixture
async def metadata(tmp_path: Path) -> AsyncIterator[Metadata]:
    opened = await open_cluster(f"sqlite:///{tmp_path / 'meta.db'}")
    yield opened
    await opened.close()


async def start_check(config: BookieConfig, metadata: Metadata) -> list[Cookie]:
    return await check_cookies(config, metadata.cookies, cluster_instance_id=metadata.instance_id)


def directory_cookies(config: BookieConfig) -> list[Cookie | None]:
    return [read_cookie(d) for s in config.storage for d in shard_directories(s)]


def make_legacy(config: BookieConfig) -> None:
    """Rewrite every directory's cookie as bkaio wrote it before cookies named their cluster."""
    for storage in config.storage:
        for directory in shard_directories(storage):
            cookie = read_cookie(directory)
            assert cookie is not None
            write_cookie(directory, replace(cookie, cluster_instance_id=""))


async def test_cookies_name_the_cluster_they_were_stamped_in(
    tmp_path: Path, metadata: Metadata
) -> None:
    config = config_of(tmp_path)
    cookies = await start_check(config, metadata)
    assert {c.cluster_instance_id for c in cookies} == {metadata.instance_id}
    assert {c.cluster_instance_id for c in directory_cookies(config) if c} == {metadata.instance_id}
    copy = await metadata.cookies.get(config.bookie_id)
    assert copy is not None
    assert decode_cookie_copy(copy.data, "copy") == cookies
    assert await start_check(config, metadata) == cookies  # A restart.


async def test_a_recreated_cluster_is_refused(tmp_path: Path, metadata: Metadata) -> None:
    """The reproduction: a bookie stamped in one cluster, the cluster re-created (metaformat),
    the bookie started on its old directories: it must not join (the new cluster hands out the
    old one's ledger ids again)."""
    config = config_of(tmp_path)
    await start_check(config, metadata)
    old_cluster = metadata.instance_id
    await metadata.close()
    recreated = await open_cluster(config.metadata.uri, recreate=True)
    try:
        assert recreated.instance_id != old_cluster
        with pytest.raises(CookieMismatchError) as refused:
            await start_check(config, recreated)
        message = str(refused.value)
        assert old_cluster in message and recreated.instance_id in message
        assert "bkaio bookie format --force" in message
        assert await recreated.cookies.get(config.bookie_id) is None  # Nothing published.

        # What the message says to do (`bkaio bookie format --force`: wipe, drop the copy).
        for storage in config.storage:
            for directory in shard_directories(storage):
                (directory / "COOKIE").unlink()
        cookies = await start_check(config, recreated)
        assert {c.cluster_instance_id for c in cookies} == {recreated.instance_id}
    finally:
        await recreated.close()


async def test_old_cookies_keep_working_next_to_this_clusters_copy(
    tmp_path: Path, metadata: Metadata
) -> None:
    """Cookies stamped before they named their cluster: the copy in this cluster's metadata
    shows they are its own."""
    config = config_of(tmp_path)
    await start_check(config, metadata)
    make_legacy(config)
    copy = await metadata.cookies.get(config.bookie_id)
    assert copy is not None
    legacy = [replace(c, cluster_instance_id="") for c in decode_cookie_copy(copy.data, "copy")]
    await metadata.cookies.put(
        config.bookie_id, encode_cookie_copy(legacy), expected_version=copy.version
    )
    assert await start_check(config, metadata) == legacy


async def test_old_cookies_without_a_copy_are_refused(tmp_path: Path, metadata: Metadata) -> None:
    """BookKeeper's rule for stamped directories whose bookie has no cookie in metadata: they
    may be a re-created cluster's old data, and nothing tells."""
    config = config_of(tmp_path)
    await start_check(config, metadata)
    make_legacy(config)
    await metadata.cookies.delete(config.bookie_id)
    with pytest.raises(CookieMismatchError, match="names no cluster instance") as refused:
        await start_check(config, metadata)
    assert metadata.instance_id in str(refused.value)
    assert "bkaio bookie format --force" in str(refused.value)


async def test_a_start_that_died_before_publishing_is_adopted(
    tmp_path: Path, metadata: Metadata
) -> None:
    """Stamped in this cluster, no copy: the start that stamped them died before publishing."""
    config = config_of(tmp_path)
    cookies = await start_check(config, metadata)
    await metadata.cookies.delete(config.bookie_id)
    assert await start_check(config, metadata) == cookies
    assert await metadata.cookies.get(config.bookie_id) is not None


async def test_a_copy_naming_another_cluster_is_refused(tmp_path: Path, metadata: Metadata) -> None:
    config = config_of(tmp_path)
    await start_check(config, metadata)
    copy = await metadata.cookies.get(config.bookie_id)
    assert copy is not None
    foreign = [
        replace(c, cluster_instance_id="elsewhere") for c in decode_cookie_copy(copy.data, "copy")
    ]
    await metadata.cookies.put(
        config.bookie_id, encode_cookie_copy(foreign), expected_version=copy.version
    )
    with pytest.raises(CookieMismatchError, match="cluster instance elsewhere"):
        await start_check(config, metadata)


async def test_a_journal_dir_under_a_file_names_the_setting(
    tmp_path: Path, metadata: Metadata
) -> None:
    """An OSError while checking the directories: a ConfigError naming the setting and the
    path (the bookie exits 2), not an OSError (which it took for a dead worker: exit 1)."""
    (tmp_path / "file").write_bytes(b"")
    config = config_of(tmp_path, journal=tmp_path / "file" / "journal")
    with pytest.raises(ConfigError) as refused:
        await start_check(config, metadata)
    assert str(refused.value).startswith("storage.journal_dirs: ")
    assert str(tmp_path / "file" / "journal") in str(refused.value)
    assert await metadata.cookies.get(config.bookie_id) is None


async def test_a_ledger_dir_that_is_a_file_names_the_setting(
    tmp_path: Path, metadata: Metadata
) -> None:
    config = config_of(tmp_path)
    ledger_dir = config.storage[1].ledger_dirs[0]
    ledger_dir.parent.mkdir(parents=True)
    ledger_dir.write_bytes(b"")
    with pytest.raises(ConfigError) as refused:
        await start_check(config, metadata)
    assert str(refused.value).startswith(f"storage.ledger_dirs: cannot use {ledger_dir}: ")
