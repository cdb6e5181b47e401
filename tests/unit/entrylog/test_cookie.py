"""Cookies: a fresh bookie stamps every directory; any mismatch refuses to start."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bkaio.entrylog.cookie import COOKIE_FILE, Cookie, read_cookie
from bkaio.errors import CookieMismatchError
from tests.unit.entrylog.conftest import OpenStorage, make_config


def _all_dirs(root: Path) -> list[Path]:
    return [
        root / "journal",
        root / "ledgers0",
        root / "ledgers1",
        root / "index0",
        root / "index1",
    ]


def test_cookie_round_trips_through_bytes() -> None:
    cookie = Cookie(
        bookie_id="10.0.0.1:3181",
        shard_index=1,
        shard_count=4,
        journal_dirs=("/j",),
        ledger_dirs=("/l0", "/l1"),
        index_dirs=("/i0", "/i1"),
        instance_id="abc",
    )
    assert Cookie.from_bytes(cookie.to_bytes()) == cookie
    with pytest.raises(CookieMismatchError, match="unreadable"):
        Cookie.from_bytes(b"{not json")
    with pytest.raises(CookieMismatchError, match="layout version"):
        Cookie.from_bytes(dataclasses.replace(cookie, layout_version=99).to_bytes())


def test_the_cluster_instance_id_is_absent_from_cookies_that_have_none() -> None:
    """Cookies written before they named their cluster read as naming none (""), and a cookie
    naming none is written as they were."""
    cookie = Cookie(
        bookie_id="10.0.0.1:3181",
        shard_index=0,
        shard_count=1,
        journal_dirs=("/j",),
        ledger_dirs=("/l0",),
        index_dirs=("/i0",),
        instance_id="abc",
    )
    assert b"cluster_instance_id" not in cookie.to_bytes()
    assert Cookie.from_bytes(cookie.to_bytes()).cluster_instance_id == ""
    named = dataclasses.replace(cookie, cluster_instance_id="c1")
    assert b'"cluster_instance_id": "c1"' in named.to_bytes()
    assert Cookie.from_bytes(named.to_bytes()) == named
    assert named.mismatches(cookie) == ["cluster_instance_id: expected 'c1', found ''"]


async def test_fresh_dirs_get_one_cookie_each(open_storage: OpenStorage, tmp_path: Path) -> None:
    storage = await open_storage()
    cookies = {read_cookie(directory) for directory in _all_dirs(tmp_path)}
    assert cookies == {storage.cookie}
    assert storage.cookie.shard_count == 1 and len(storage.cookie.instance_id) == 32
    await storage.close()
    reopened = await open_storage()  # Same identity: accepted, same instance id.
    assert reopened.cookie == storage.cookie


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bookie_id": "127.0.0.1:9999"}, "bookie_id"),
        ({"shard_count": 2}, "shard_count"),
        ({"shard_index": 0, "instance_id": "someone-else"}, "instance_id"),
    ],
)
async def test_a_mismatching_cookie_refuses_to_start(
    open_storage: OpenStorage, tmp_path: Path, change: dict[str, object], message: str
) -> None:
    storage = await open_storage()
    await storage.close()
    with pytest.raises(CookieMismatchError, match=message):
        await open_storage(**change)


async def test_a_swapped_directory_set_refuses_to_start(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    storage = await open_storage()
    await storage.close()
    swapped = dataclasses.replace(
        make_config(tmp_path),
        ledger_dirs=(tmp_path / "ledgers1", tmp_path / "ledgers0"),
    )
    with pytest.raises(CookieMismatchError, match="ledger_dirs"):
        await open_storage(swapped)


async def test_missing_cookie_in_a_used_directory_refuses(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    storage = await open_storage()
    await storage.close()
    (tmp_path / "index1" / COOKIE_FILE).unlink()
    with pytest.raises(CookieMismatchError, match="holds data but no COOKIE"):
        await open_storage()


async def test_a_wiped_disk_next_to_stamped_ones_refuses(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    storage = await open_storage()
    await storage.close()
    wiped = tmp_path / "ledgers1"
    for path in sorted(wiped.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    with pytest.raises(CookieMismatchError, match="wiped or replaced"):
        await open_storage()


async def test_data_without_any_cookie_refuses(open_storage: OpenStorage, tmp_path: Path) -> None:
    (tmp_path / "ledgers0").mkdir()
    (tmp_path / "ledgers0" / "00000000.log").write_bytes(b"somebody's data")
    with pytest.raises(CookieMismatchError, match="ledgers0 holds data"):
        await open_storage()
