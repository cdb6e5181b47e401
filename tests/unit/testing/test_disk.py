"""FakeDisk under the real journal: lost unsynced writes, torn writes, EIO, the mutation flag."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bkaio.errors import BookieIOError, ConfigError
from bkaio.journal import EntryRecord, Journal, JournalConfig, JournalReader
from bkaio.journal.disk import MUTATION_ENV
from bkaio.journal.files import list_file_ids
from bkaio.testing.disk import FakeDisk, disk_from_spec


def _entry(entry_id: int) -> EntryRecord:
    return EntryRecord(1, entry_id, entry_id - 1, entry_id, 0, b"x" * 64)


def _replayed(directory: Path) -> list[int]:
    reader = JournalReader(directory, list_file_ids(directory), None)
    return [record.entry_id for _mark, record in reader if isinstance(record, EntryRecord)]


async def test_synced_records_survive_a_crash_and_unsynced_ones_do_not(tmp_path: Path) -> None:
    disk = FakeDisk(lazy=True)
    config = JournalConfig(directories=(tmp_path / "j",))
    journal = await Journal.open(config, disk=disk)
    await asyncio.gather(*(journal.append(_entry(i)) for i in range(20)))
    # Written but never synced: what a power failure takes.
    await asyncio.to_thread(disk.write, journal._writer._fd, b"\x01" * 100, 10_000)  # type: ignore[arg-type]
    assert disk.unsynced_bytes == 100
    assert disk.crash() == 100
    await journal.close()
    assert _replayed(tmp_path / "j") == list(range(20))


async def test_ack_before_fsync_mutation_loses_acked_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MUTATION_ENV, "ack_before_fsync")
    disk = FakeDisk(lazy=True)
    journal = await Journal.open(JournalConfig(directories=(tmp_path / "j",)), disk=disk)
    await journal.append(_entry(0))  # Acknowledged, but its sync waits for the next group.
    disk.crash()
    await journal.close()
    assert _replayed(tmp_path / "j") == []


async def test_fsync_eio_fails_the_batch_and_stops_the_journal(tmp_path: Path) -> None:
    disk = FakeDisk(lazy=True, eio_after_syncs=1)
    journal = await Journal.open(JournalConfig(directories=(tmp_path / "j",)), disk=disk)
    await journal.append(_entry(0))
    with pytest.raises(BookieIOError, match="injected fsync failure"):
        await journal.append(_entry(1))
    with pytest.raises(BookieIOError):
        await journal.append(_entry(2))
    await journal.close()
    assert _replayed(tmp_path / "j") == [0]
    assert disk.stats.failed_syncs >= 1


def test_torn_write_lands_half(tmp_path: Path) -> None:
    import os

    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    disk = FakeDisk(lazy=True, tear=True)
    disk.write(fd, b"a" * 10, 0)
    disk.fdatasync(fd)
    disk.write(fd, b"b" * 10, 10)
    disk.crash()
    disk.close(fd)
    assert path.read_bytes() == b"a" * 10 + b"b" * 5


def test_spec_parsing() -> None:
    disk = disk_from_spec("lazy, sync_delay_ms=20,eio_after_syncs=3,tear")
    assert disk.lazy and disk.tear and disk.sync_delay == 0.02 and disk.eio_after_syncs == 3
    with pytest.raises(ConfigError, match="bad item"):
        disk_from_spec("lazy,fast=1")
