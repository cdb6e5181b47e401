"""FakeDisk under the real journal: lost unsynced writes, torn writes, EIO, a faked usage; the
ack-before-fsync mutation and an armed crash point passed to the journal as parts."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from bkaio.errors import BookieIOError, ConfigError
from bkaio.journal import EntryRecord, Journal, JournalConfig, JournalReader
from bkaio.journal.crash_points import CRASH_POINTS
from bkaio.journal.files import list_file_ids
from bkaio.journal.writer import ACK_AFTER_SYNC
from bkaio.testing.crash_points import KILLED_EXIT_CODE, CrashAt
from bkaio.testing.disk import FakeDisk, disk_from_spec
from bkaio.testing.mutations import AckBeforeSync, journal_mutation


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


async def test_ack_before_fsync_mutation_loses_acked_records(tmp_path: Path) -> None:
    disk = FakeDisk(lazy=True)
    journal = await Journal.open(
        JournalConfig(directories=(tmp_path / "j",)), disk=disk, ack_policy=AckBeforeSync()
    )
    await journal.append(_entry(0))
    await journal.append(_entry(1))  # Acknowledged, but its sync waits for the next group.
    disk.crash()
    await journal.close()
    assert _replayed(tmp_path / "j") == [0]


async def test_the_production_ack_policy_keeps_every_acked_record(tmp_path: Path) -> None:
    """The same steps as the mutation's, with the production policy on the injected path."""
    disk = FakeDisk(lazy=True)
    crash_points = CrashAt("checkpoint.before_rename", exit=lambda code: None)  # Never here.
    journal = await Journal.open(
        JournalConfig(directories=(tmp_path / "j",)),
        disk=disk,
        crash_points=crash_points,
        ack_policy=ACK_AFTER_SYNC,
    )
    assert journal._writer.commit != journal._writer._commit  # Policy path, not production's.
    await journal.append(_entry(0))
    await journal.append(_entry(1))
    disk.crash()
    await journal.close()
    assert _replayed(tmp_path / "j") == [0, 1]


async def test_a_crash_point_ends_the_process_between_write_and_sync(tmp_path: Path) -> None:
    exits: list[int] = []

    def record_exit(code: int) -> None:
        exits.append(code)
        disk.crash()  # What the exit would do to the unsynced writes.

    disk = FakeDisk(lazy=True)
    crash_points = CrashAt("journal.after_write_before_sync", 2, exit=record_exit)
    journal = await Journal.open(
        JournalConfig(directories=(tmp_path / "j",)), disk=disk, crash_points=crash_points
    )
    await journal.append(_entry(0))
    assert exits == []
    await journal.append(_entry(1))  # The second pass: "exits" before this group's sync.
    assert exits == [KILLED_EXIT_CODE]
    await journal.close()
    assert _replayed(tmp_path / "j") == [0]


def test_crash_point_and_mutation_specs() -> None:
    armed = CrashAt.from_spec("entrylog.after_write_before_sync:3")
    assert (armed.point, armed.passes, armed.armed) == ("entrylog.after_write_before_sync", 3, True)
    assert CrashAt.from_spec("checkpoint.before_rename").passes == 1
    assert set(CRASH_POINTS) >= {armed.point}
    with pytest.raises(ConfigError, match="unknown crash point"):
        CrashAt.from_spec("journal.somewhere:2")
    with pytest.raises(ConfigError, match="not a number"):
        CrashAt.from_spec("checkpoint.before_rename:x")
    with pytest.raises(ConfigError, match="at least 1"):
        CrashAt.from_spec("checkpoint.before_rename:0")
    assert isinstance(journal_mutation("ack_before_fsync"), AckBeforeSync)
    with pytest.raises(ConfigError, match="unknown bookie mutation"):
        journal_mutation("no_fence_on_recovery_reads")  # A client's, not a bookie's.


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
    assert disk_from_spec("usage_file=/tmp/u").usage_file == Path("/tmp/u")
    for bad in ("lazy,fast=1", "usage_file=", "eio_after_syncs=x", "lazy=1"):
        with pytest.raises(ConfigError, match="bad item"):
            disk_from_spec(bad)


def test_usage_file_makes_the_disk_report_that_fraction(tmp_path: Path) -> None:
    usage_file = tmp_path / "usage"
    disk = FakeDisk(usage_file=usage_file)
    measured = disk.usage(tmp_path)  # No file yet: the real figure.
    assert measured.total > 0 and measured.used + measured.free <= measured.total
    usage_file.write_text("0.99\n")
    full = disk.usage(tmp_path)
    assert full.total == measured.total and full.used / full.total == pytest.approx(0.99)
    usage_file.write_text("7")  # Clamped to [0, 1].
    assert disk.usage(tmp_path).free == 0
    usage_file.write_text("full")
    with pytest.raises(OSError, match="not a usage fraction"):
        disk.usage(tmp_path)


def test_write_synced_is_the_disk_s_write_then_its_sync(tmp_path: Path) -> None:
    """The journal's commit call keeps each fault's meaning: lazy data is synced on return,
    EIO fails it and drops the data, a full disk fails the write before any sync."""
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    lazy = FakeDisk(lazy=True)
    lazy.write_synced(fd, b"a" * 10, 0)
    assert lazy.unsynced_bytes == 0 and lazy.crash() == 0  # A power failure keeps it.
    lazy.close(fd)
    assert path.read_bytes() == b"a" * 10

    fd = os.open(path, os.O_RDWR)
    failing = FakeDisk(lazy=True, eio_after_syncs=0)
    with pytest.raises(OSError) as raised:
        failing.write_synced(fd, b"b" * 10, 10)
    assert raised.value.errno == errno.EIO and failing.stats.dropped_bytes == 10

    fault_file = tmp_path / "fault"
    fault_file.write_text("ENOSPC write")
    full = FakeDisk(fault_file=fault_file)
    with pytest.raises(OSError) as raised:
        full.write_synced(fd, b"c" * 10, 10)
    assert raised.value.errno == errno.ENOSPC and full.stats.syncs == 0
    full.close(fd)
    assert path.read_bytes() == b"a" * 10
