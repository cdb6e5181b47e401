"""The limbo set on disk (bkaio/bookie/limbo.py) and where a start persists it: before the
cookie copy is published, so a crash in between keeps the ledgers in limbo."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bkaio.bookie.cookies import check_cookies
from bkaio.bookie.limbo import (
    LimboFileError,
    LimboLedgers,
    LimboRecord,
    enter_limbo,
    limbo_path,
    load_limbo,
    read_limbo,
)
from bkaio.config import BookieConfig, build_bookie_config
from bkaio.entrylog.cookie import Cookie
from bkaio.meta import open_metadata


def _config(tmp_path: Path, shards: int = 2) -> BookieConfig:
    return build_bookie_config(
        {
            "bookie": {"host": "127.0.0.1", "port": 4181, "shards": shards},
            "storage": {
                "journal_dirs": [str(tmp_path / "journal")],
                "ledger_dirs": [str(tmp_path / "ledgers")],
            },
        },
        env={},
    )


def test_ledgers_go_to_their_shards_and_merge_with_what_is_there(tmp_path: Path) -> None:
    config = _config(tmp_path)
    for index in range(2):
        limbo_path(config, index).parent.mkdir(parents=True)
    assert enter_limbo(config, [1, 2, 3], "reformat") == {0: 1, 1: 2}
    first = load_limbo(config)
    assert first[0].ledgers == {2} and first[1].ledgers == {1, 3}
    assert enter_limbo(config, [4, 5], "again") == {0: 2, 1: 3}
    merged = load_limbo(config)
    assert merged[0].ledgers == {2, 4} and merged[1].ledgers == {1, 3, 5}
    # The first entry keeps its time and reason: how long the bookie has been in limbo.
    assert merged[0].entered_at == first[0].entered_at and merged[0].reason == "reformat"


def test_no_ledgers_writes_no_file(tmp_path: Path) -> None:
    config = _config(tmp_path, shards=1)
    limbo_path(config, 0).parent.mkdir(parents=True)
    assert enter_limbo(config, [], "fresh bookie") == {0: 0}
    assert not limbo_path(config, 0).exists() and load_limbo(config) == {}


@pytest.mark.parametrize(
    "content",
    [b"", b"not json", b'{"layout_version": 1}', b'{"layout_version": 7, "ledgers": []}'],
)
def test_an_unreadable_file_is_refused_not_forgotten(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "LIMBO"
    path.write_bytes(content)
    with pytest.raises(LimboFileError, match="unreadable limbo file"):
        read_limbo(path)


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe", b"[]", b'{"layout_version": 1, "ledgers": 5, "entered_at": 1, "reason": ""}',
     b"[" * 100_000],
)  # fmt: skip
def test_a_corrupt_file_is_refused_with_what_to_do(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "LIMBO"
    path.write_bytes(content)
    with pytest.raises(LimboFileError) as refused:
        read_limbo(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: unreadable limbo file") and "\n" not in message
    assert "bkaio bookie format --force" in message


def _make_unreadable(path: Path, how: str) -> None:
    if how == "a directory":
        path.mkdir()
    elif how == "a symlink loop":
        path.symlink_to(path.name)
    else:
        path.write_bytes(LimboRecord(frozenset({7}), 100.0, "reformat").to_bytes())
        path.chmod(0)


UNREADABLE = ["a directory", "a symlink loop", "permission denied"]


def _skip_unless_unreadable(path: Path, how: str) -> None:
    if how == "permission denied" and os.access(path, os.R_OK):
        pytest.skip("running as root: a mode-0 file stays readable")


@pytest.mark.parametrize("how", UNREADABLE)
def test_a_file_that_cannot_be_read_is_a_limbo_file_error_naming_it(
    tmp_path: Path, how: str
) -> None:
    """Not an OSError with a traceback: the start turns a LimboFileError into one line and
    exit 2 (tests/integration/bookie/test_limbo_server.py)."""
    config = _config(tmp_path, shards=1)
    path = limbo_path(config, 0)
    path.parent.mkdir(parents=True)
    _make_unreadable(path, how)
    _skip_unless_unreadable(path, how)
    for read in (lambda: read_limbo(path), lambda: load_limbo(config)):
        with pytest.raises(LimboFileError, match="unreadable limbo file") as refused:
            read()
        assert str(refused.value).startswith(f"{path}: ")
    with pytest.raises(LimboFileError, match="unreadable limbo file"):
        LimboLedgers.load(path)
    with pytest.raises(LimboFileError, match="unreadable limbo file"):
        enter_limbo(config, [3], "reformat")


def test_a_file_that_cannot_be_written_is_a_limbo_file_error_naming_it(tmp_path: Path) -> None:
    config = _config(tmp_path, shards=1)
    path = limbo_path(config, 0)
    path.parent.mkdir(parents=True)
    path.with_name(path.name + ".tmp").mkdir()  # Where the new file is written first.
    with pytest.raises(LimboFileError, match="cannot write the limbo file") as refused:
        enter_limbo(config, [3], "reformat")
    assert str(refused.value).startswith(f"{path}: ")
    assert not path.exists()


async def test_clearing_persists_and_the_last_one_removes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "LIMBO"
    path.write_bytes(LimboRecord(frozenset({7, 9}), 100.0, "reformat").to_bytes())
    limbo = LimboLedgers.load(path)
    assert 7 in limbo and 9 in limbo and 8 not in limbo
    assert await limbo.clear(7)
    assert not await limbo.clear(7)  # Already out.
    on_disk = read_limbo(path)
    assert on_disk is not None and on_disk.ledgers == {9} and on_disk.entered_at == 100.0
    assert LimboLedgers.load(path).ids == {9}  # What a restarted shard would see.
    assert await limbo.clear(9)
    assert not path.exists() and limbo.ids == set()
    assert limbo.summary() == {"ledgers": 0, "entered_at": None, "reason": None}


async def test_limbo_is_persisted_before_the_cookie_copy_is_published(
    tmp_path: Path, sqlite_metadata_uri: str
) -> None:
    """A start that dies after stamping the directories but before publishing the copy finds
    no copy again next time, and runs the hook again (the limbo set is never skipped)."""
    config = _config(tmp_path, shards=1)
    meta = await open_metadata(sqlite_metadata_uri)
    calls: list[list[Cookie]] = []

    async def crash(cookies: list[Cookie]) -> None:
        calls.append(cookies)
        raise RuntimeError("power cut")

    try:
        with pytest.raises(RuntimeError):
            await check_cookies(config, meta.cookies, crash, cluster_instance_id=meta.instance_id)
        assert await meta.cookies.get(config.bookie_id) is None

        async def persist(cookies: list[Cookie]) -> None:
            calls.append(cookies)
            enter_limbo(config, [3], "reformat")

        cookies = await check_cookies(
            config, meta.cookies, persist, cluster_instance_id=meta.instance_id
        )
        assert [c.instance_id for c in calls[1]] == [c.instance_id for c in cookies]
        assert calls[0][0].instance_id == cookies[0].instance_id  # Stamped once, the first time.
        assert await meta.cookies.get(config.bookie_id) is not None
        assert load_limbo(config)[0].ledgers == {3}
        # Published: a normal restart.
        await check_cookies(config, meta.cookies, crash, cluster_instance_id=meta.instance_id)
        assert len(calls) == 2
    finally:
        await meta.close()
