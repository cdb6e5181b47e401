"""SQLite metadata URIs naming the wrong thing: errors say what is there, and nothing is written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bkaio.errors import ConfigError, MetadataError
from bkaio.meta import open_store
from bkaio.meta.uri import parse_sqlite_uri


def test_a_path_is_read_as_the_file_system_reads_it() -> None:
    # Four slashes are what f"sqlite:///{path}" gives for an absolute path.
    assert parse_sqlite_uri("sqlite:////var/lib//bkaio/meta.db").path == "/var/lib/bkaio/meta.db"
    assert parse_sqlite_uri("sqlite:///var/lib/bkaio/meta.db").path == "/var/lib/bkaio/meta.db"


@pytest.mark.parametrize("create", [False, True])
async def test_a_file_that_is_no_database_is_shown_with_its_path(
    tmp_path: Path, create: bool
) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("not a database\n")
    with pytest.raises(MetadataError) as refused:
        await open_store(f"sqlite:///{junk}", create=create)  # sqlite:////tmp/...
    assert f"{junk}: file is not a database" in str(refused.value)
    assert "//" not in str(refused.value)
    assert junk.read_text() == "not a database\n"


@pytest.mark.parametrize("create", [False, True])
async def test_a_directory_is_said_to_be_one(tmp_path: Path, create: bool) -> None:
    # It was "does not exist" without create, SQLite's "unable to open database file" with.
    with pytest.raises(ConfigError) as refused:
        await open_store(f"sqlite:///{tmp_path}", create=create)
    assert f"{tmp_path} is a directory, not a database file" in str(refused.value)
    assert "does not exist" not in str(refused.value)
    assert os.listdir(tmp_path) == []  # Nothing made in it.
