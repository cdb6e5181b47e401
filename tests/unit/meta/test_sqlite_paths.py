"""SQLite metadata URIs naming the wrong thing: errors say what is there, and nothing is written."""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from bkaio.cli.main import main
from bkaio.errors import ConfigError, MetadataError
from bkaio.meta import initialise_cluster_at, open_metadata, open_store
from bkaio.meta.cluster import ClusterNotInitialisedError
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


async def test_an_empty_file_is_refused_unless_creating_and_left_as_it_was(tmp_path: Path) -> None:
    # Opening without create (every command but initnewcluster, metaformat, standalone) wrote the
    # bkaio schema into any file it was pointed at (36 KiB, WAL mode), and said only "no cluster".
    empty = tmp_path / "some.file"
    empty.write_bytes(b"")
    with pytest.raises(ClusterNotInitialisedError) as refused:
        await open_store(f"sqlite:///{empty}", create=False)
    assert f"{empty} is not a bkaio metadata database (no schema)" in str(refused.value)
    assert "initnewcluster" in str(refused.value)
    assert empty.read_bytes() == b""
    assert os.listdir(tmp_path) == ["some.file"]
    # Creating a cluster may make the empty file a database; then it opens without create.
    await initialise_cluster_at(f"sqlite:///{empty}")
    metadata = await open_metadata(f"sqlite:///{empty}")
    await metadata.close()


def test_a_read_only_command_on_an_empty_file_changes_nothing(tmp_path: Path) -> None:
    empty = tmp_path / "some.file"
    empty.write_bytes(b"")
    code = main(["shell", "listledgers", "--metadata", f"sqlite:///{empty}"])
    assert code == 1
    assert empty.read_bytes() == b""


@pytest.mark.parametrize("create", [False, True])
async def test_another_programs_database_is_refused_and_left_as_it_was(
    tmp_path: Path, create: bool
) -> None:
    other = tmp_path / "app.db"
    with closing(sqlite3.connect(other)) as conn, conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('keep me')")
    before = other.read_bytes()
    with pytest.raises(ConfigError) as refused:
        await open_store(f"sqlite:///{other}", create=create)
    assert f"{other} is not a bkaio metadata database (it holds notes)" in str(refused.value)
    assert other.read_bytes() == before  # No bkaio tables, still not in WAL mode.
    assert os.listdir(tmp_path) == ["app.db"]


async def test_a_file_where_the_directory_should_be_is_named(tmp_path: Path) -> None:
    # It was a bare FileExistsError: "[Errno 17] File exists: '.../notes.txt'".
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me\n")
    with pytest.raises(ConfigError) as refused:
        await open_store(f"sqlite:///{notes}/meta.db", create=True)
    message = str(refused.value)
    assert f"cannot make the directory of {notes}/meta.db: File exists: {notes}; " in message
    assert notes.read_text() == "keep me\n"
