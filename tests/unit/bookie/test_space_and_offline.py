"""The one definition of a bookie's space, and the offline readers of its directories."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bkaio.bookie.offline import (
    JournalEnd,
    check_consistency,
    entry_log_path,
    journal_path,
    last_marks,
    list_files,
    read_entry_log,
    read_journal,
)
from bkaio.bookie.space import directory_space, ledger_directories, measure_space
from bkaio.config import BookieConfig, build_bookie_config
from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.entrylog.types import StoredEntry
from bkaio.errors import BookieIOError, ConfigError
from bkaio.journal import open_journal
from bkaio.protocol.digest import entry_digest, master_key
from tests.fixtures.storage import add_entry


def test_a_filesystem_counts_once_however_many_directories_it_holds(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    one = measure_space([tmp_path / "a"])
    both = measure_space([tmp_path / "a", tmp_path / "b" / "not-yet"])
    assert both.filesystems == one.filesystems == 1
    assert both.total_bytes == one.total_bytes
    stats = os.statvfs(tmp_path)
    assert one.total_bytes == stats.f_blocks * stats.f_frsize
    absent = directory_space(tmp_path / "x" / "y")
    assert not absent.exists and absent.total_bytes == one.total_bytes


def config_of(tmp_path: Path, shards: int = 2) -> BookieConfig:
    return build_bookie_config(
        {
            "bookie": {"host": "127.0.0.1", "port": 45181, "shards": shards},
            "metadata": {"uri": f"sqlite:///{tmp_path / 'meta.db'}"},
            "storage": {
                "journal_dirs": [str(tmp_path / "journal")],
                "ledger_dirs": [str(tmp_path / "ledgers")],
            },
            "journal": {"sync": False},
        },
        env={},
    )


def test_ledger_directories_cover_every_shard(tmp_path: Path) -> None:
    directories = ledger_directories(config_of(tmp_path, shards=3))
    assert len(directories) == 3 and all("shard-" in str(d) for d in directories)


def _entry(ledger_id: int, entry_id: int) -> StoredEntry:
    payload = f"payload {ledger_id}:{entry_id}".encode()
    length = (entry_id + 1) * len(payload)
    digest = entry_digest(ledger_id, entry_id, entry_id - 1, length, payload)
    return StoredEntry(ledger_id, entry_id, entry_id - 1, length, digest, payload)


async def _write(config: BookieConfig) -> None:
    for shard, storage_config in enumerate(config.storage):
        storage = await ShardStorage.open(
            storage_config,
            bookie_id=config.bookie_id,
            shard_index=shard,
            shard_count=2,
            journal_factory=open_journal,
        )
        try:
            for ledger_id in (2, 3, 4):
                if ledger_id % 2 == shard:
                    for entry_id in range(5):
                        await add_entry(
                            storage, _entry(ledger_id, entry_id), master_key(b"", ledger_id)
                        )
        finally:
            await storage.close()


async def test_offline_readers_see_what_storage_wrote(tmp_path: Path) -> None:
    config = config_of(tmp_path)
    await _write(config)
    marks = last_marks(config)
    assert [m.shard for m in marks] == [0, 1] and all(m.file_id for m in marks)
    files = list_files(config)
    assert {f.kind for f in files} == {"journal", "entrylog", "index"}
    assert {f.kind for f in list_files(config, ("entrylog",))} == {"entrylog"}
    with pytest.raises(ConfigError):
        list_files(config, ("bogus",))

    end = JournalEnd()
    records = list(read_journal(journal_path(config, "1", shard=0), end, payload=True))
    entries = [r for r in records if r["kind"] == "entry"]
    assert {r["ledger_id"] for r in entries} == {2, 4} and len(entries) == 10
    assert entries[0]["payload"] == b"payload 2:0" and end.records == len(records)
    assert all("master_key" not in r for r in records)  # Keys are never shown.
    assert records[0]["offset"] == 32 and records[1]["offset"] == records[0]["end"]

    log = entry_log_path(config, "0", shard=1)
    from_log = list(read_entry_log(log, ledger_id=3))
    assert [r["entry_id"] for r in from_log] == [0, 1, 2, 3, 4]
    assert [r["entry_id"] for r in read_entry_log(log, ledger_id=3, entry_id=2)] == [2]
    later = list(read_entry_log(log, start=from_log[2]["offset"]))
    assert [r["entry_id"] for r in later] == [2, 3, 4]

    report = check_consistency(config)
    assert report.ok and sorted(report.ledgers) == [2, 3, 4] and report.entries == 15
    assert sorted(check_consistency(config, shard=1).ledgers) == [3]


def test_bad_names_are_refused(tmp_path: Path) -> None:
    config = config_of(tmp_path)
    with pytest.raises(ConfigError, match="shard 2"):
        journal_path(config, "1", shard=2)
    with pytest.raises(ConfigError):
        entry_log_path(config, "zz.log")
    with pytest.raises(ConfigError, match="does not exist"):
        read_journal(journal_path(config, "7"), JournalEnd())
    not_a_log = tmp_path / "x.log"
    not_a_log.write_bytes(b"hello, this is not an entry log at all")
    with pytest.raises(BookieIOError, match="not a bkaio entry log"):
        read_entry_log(not_a_log)
