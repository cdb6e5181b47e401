"""The entry log behind the injectable `Disk` (bkaio.journal.disk): FakeDisk faults under the real
entry logs and ShardStorage. What must hold: a failed entry-log fsync fails the checkpoint and
loses nothing (the entries stay in the write cache and in the journal, the mark stays put); a
power failure before the entry-log sync loses nothing acknowledged (journal replay from the
mark); latency changes nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import structlog

from bkaio.entrylog.checkpoint import read_last_mark
from bkaio.entrylog.config import StorageConfig
from bkaio.entrylog.entry_log import EntryLogDirectory, encode_record
from bkaio.entrylog.shard_storage import ShardStorage, StoredEntry
from bkaio.errors import BookieIOError, ConfigError
from bkaio.journal.config import JournalConfig
from bkaio.journal.disk import OS_DISK, Disk
from bkaio.journal.files import list_file_ids
from bkaio.journal.journal import Journal
from bkaio.journal.records import JournalMark
from bkaio.testing.disk import FakeDisk, disk_from_spec
from bkaio.wal import JournalFactory, JournalLike
from tests.fixtures.storage import add_entry, read_entry
from tests.unit.entrylog.conftest import KEY, OpenStorage, make_config, make_entry

LEDGERS = (3, 4, 5, 10)  # Both disks of make_config (ledger_id % 2).


def _entry_log_path(fd: int) -> bool:
    return os.readlink(f"/proc/self/fd/{fd}").endswith(".log")


@dataclass
class PowerFailsAtEntryLogSync(FakeDisk):
    """Once `armed`, the first entry-log fsync is a power failure: every unsynced write is gone
    (or torn, with `tear`), and the sync raises, since the process would have died right here."""

    armed: bool = False

    def fdatasync(self, fd: int) -> None:
        if self.armed and _entry_log_path(fd):
            self.crash()
            raise OSError(errno.EIO, "power failure before the entry-log sync (test)")
        super().fdatasync(fd)


@dataclass
class ShortWriteDisk(FakeDisk):
    """Once `armed`, the next write lands half and then fails with ENOSPC (a short write)."""

    armed: bool = False

    def write(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        if self.armed:
            self.armed = False
            super().write(fd, bytes(data)[: len(data) // 2], offset)
            raise OSError(errno.ENOSPC, "No space left on device (test)")
        super().write(fd, data, offset)


def _journal_on(disk: Disk) -> JournalFactory:
    async def open_journal(config: JournalConfig, directory: Path) -> JournalLike:
        return await Journal.open(config, directory=directory, disk=disk)

    return open_journal


def _synced_journal(config: StorageConfig) -> StorageConfig:
    """The conftest journal skips fdatasync for speed; a lost-write test needs it."""
    return dataclasses.replace(config, journal=dataclasses.replace(config.journal, sync=True))


async def _add(storage: ShardStorage, entry_ids: range) -> list[StoredEntry]:
    entries = [make_entry(ledger_id, e) for ledger_id in LEDGERS for e in entry_ids]
    await asyncio.gather(*(add_entry(storage, entry, KEY) for entry in entries))
    return entries


async def _assert_read_back(storage: ShardStorage, entries: list[StoredEntry]) -> None:
    for entry in entries:
        assert await read_entry(storage, entry.ledger_id, entry.entry_id) == entry


def _marks(config: StorageConfig) -> list[JournalMark | None]:
    return read_last_mark([Path(d) for d in config.ledger_dirs], len(config.journal.directories))


async def _wait_until(condition: Callable[[], bool]) -> None:
    for _ in range(3000):  # ~30 s: a bound for a hung test, not a timing claim.
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


# -- the entry log alone ---------------------------------------------------------------------


def test_entry_log_files_are_the_same_through_a_fake_disk(tmp_path: Path) -> None:
    """Same bytes on disk through OS_DISK and a lazy FakeDisk; the lazy one holds them until
    the sync."""
    records = [encode_record(make_entry(1, i, payload=bytes([i]) * 150)) for i in range(20)]
    disk = FakeDisk(lazy=True)
    for directory, chosen in ((tmp_path / "os", OS_DISK), (tmp_path / "fake", disk)):
        logs = EntryLogDirectory(directory, max_log_bytes=1024, disk=chosen)
        logs.open()
        logs.append(records)
        if chosen is disk:
            assert disk.unsynced_bytes > sum(len(r) for r in records)  # Records and headers.
            assert all(path.stat().st_size == 0 for path in directory.iterdir())
        logs.sync()
        logs.close()
    assert disk.unsynced_bytes == 0 and disk.stats.syncs > 1  # Rolled: several logs synced.
    names = sorted(p.name for p in (tmp_path / "os").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "fake").iterdir()) and len(names) > 1
    for name in names:
        assert (tmp_path / "os" / name).read_bytes() == (tmp_path / "fake" / name).read_bytes()


def test_a_failed_write_does_not_shift_later_records(tmp_path: Path) -> None:
    """Records go where their locations say, even after a write that failed halfway."""
    disk = ShortWriteDisk()
    logs = EntryLogDirectory(tmp_path, max_log_bytes=1 << 20, disk=disk)
    logs.open()
    try:
        lost = make_entry(1, 0, payload=b"l" * 300)
        disk.armed = True
        with pytest.raises(BookieIOError, match="write failed"):
            logs.append([encode_record(lost)])
        entries = [make_entry(1, i, payload=bytes([i]) * 100) for i in range(5)]
        locations = logs.append([encode_record(e) for e in entries])
        logs.sync()
        assert [logs.read(location) for location in locations] == entries
        assert [entry for _loc, entry in logs.scan(locations[0].log_id)] == entries
    finally:
        logs.close()


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_close_after_a_failed_sync_still_closes_every_descriptor(tmp_path: Path) -> None:
    before = _open_descriptors()
    disk = FakeDisk(lazy=True, eio_after_syncs=1, eio_file_suffix=".log")
    logs = EntryLogDirectory(tmp_path, max_log_bytes=1024, disk=disk)
    logs.open()
    first = logs.append([encode_record(make_entry(1, 0))])
    logs.sync()
    assert logs.read(first[0]) == make_entry(1, 0)  # A read handle is open too.
    logs.append([encode_record(make_entry(1, i, payload=b"p" * 300)) for i in range(1, 9)])
    with pytest.raises(BookieIOError, match="injected fsync failure"):
        logs.close()
    assert _open_descriptors() == before
    assert disk.unsynced_bytes == 0


# -- the fake disk's targeting and healing ----------------------------------------------------


def test_eio_can_target_entry_logs_only_and_heal(tmp_path: Path) -> None:
    disk = disk_from_spec("lazy,eio_after_syncs=0,eio_file_suffix=.log")
    assert disk.eio_file_suffix == ".log"
    journal_fd = os.open(tmp_path / "a.jnl", os.O_WRONLY | os.O_CREAT)
    log_fd = os.open(tmp_path / "a.log", os.O_WRONLY | os.O_CREAT)
    try:
        disk.write(journal_fd, b"j", 0)
        disk.fdatasync(journal_fd)  # Not a target: syncs.
        disk.write(log_fd, b"lost", 0)
        with pytest.raises(OSError, match="injected fsync failure"):
            disk.fdatasync(log_fd)
        disk.write(journal_fd, b"k", 1)
        disk.fdatasync(journal_fd)
        disk.heal()
        disk.write(log_fd, b"kept", 4)
        disk.fdatasync(log_fd)
    finally:
        disk.close(journal_fd)
        disk.close(log_fd)
    assert (tmp_path / "a.jnl").read_bytes() == b"jk"
    assert (tmp_path / "a.log").read_bytes() == b"\0\0\0\0kept"  # The failed write stays lost.
    assert disk.stats.failed_syncs == 1 and disk.stats.dropped_bytes == 4
    with pytest.raises(ConfigError, match="bad item"):
        disk_from_spec("eio_file_suffix=")


# -- ShardStorage: (a) EIO on the entry-log sync ----------------------------------------------


@pytest.mark.parametrize("healthy_syncs", [0, 1])  # 1: the first disk's log syncs, not the 2nd.
@pytest.mark.parametrize("then", ["heal", "restart"])
async def test_entry_log_fsync_eio_fails_the_checkpoint_and_loses_nothing(
    open_storage: OpenStorage, tmp_path: Path, healthy_syncs: int, then: str
) -> None:
    config = make_config(tmp_path)
    disk = FakeDisk(lazy=True, eio_after_syncs=healthy_syncs, eio_file_suffix=".log")
    storage = await open_storage(config, entry_log_disk=disk)
    mark_before = _marks(config)
    checkpoints_before = storage.stats.checkpoints_written
    journal_files = list_file_ids(config.journal.directories[0])
    entries = await _add(storage, range(20))

    with pytest.raises(BookieIOError, match="injected fsync failure"):
        await storage.checkpoint()

    assert disk.stats.failed_syncs == 1 and disk.stats.dropped_bytes > 0
    assert _marks(config) == mark_before  # The journal must still replay these entries.
    assert storage.stats.checkpoints_written == checkpoints_before
    assert set(journal_files) <= set(list_file_ids(config.journal.directories[0]))
    await _assert_read_back(storage, entries)  # From the write cache.
    if then == "heal":
        disk.heal()
        await storage.checkpoint()
        assert _marks(config) != mark_before
        await _assert_read_back(storage, entries)  # From the entry logs now.
        await storage.close()
    else:
        await storage.close()  # Its final checkpoint fails too: the next open replays.
    reopened = await open_storage(config, entry_log_disk=OS_DISK)
    await _assert_read_back(reopened, entries)


async def test_a_failed_checkpoint_at_close_is_logged_and_loses_nothing(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    config = make_config(tmp_path)
    disk = FakeDisk(lazy=True, eio_after_syncs=0, eio_file_suffix=".log")
    storage = await open_storage(config, entry_log_disk=disk)
    mark_before = _marks(config)
    entries = await _add(storage, range(10))
    with structlog.testing.capture_logs() as logs:
        await storage.close()  # Its final checkpoint fails: still closed, the failure seen.
    (failed,) = [e for e in logs if e["event"] == "storage_close_checkpoint_failed"]
    assert failed["log_level"] == "warning" and "injected fsync failure" in failed["error"]
    assert _marks(config) == mark_before
    reopened = await open_storage(config, entry_log_disk=OS_DISK)
    await _assert_read_back(reopened, entries)  # Replayed from the journal.


@pytest.mark.parametrize("failing_sync", [None, 3])  # 3: a middle chunk's sync fails.
async def test_a_flush_syncs_the_entry_logs_in_chunks(
    open_storage: OpenStorage, tmp_path: Path, failing_sync: int | None
) -> None:
    # 80 entries of ~150 bytes on 2 disks: about 6 KB per disk, 1 KB per chunk.
    config = make_config(tmp_path, flush_sync_bytes=1024)
    disk = FakeDisk(lazy=True, eio_after_syncs=failing_sync, eio_file_suffix=".log")
    storage = await open_storage(config, entry_log_disk=disk)
    mark_before = _marks(config)
    entries = await _add(storage, range(20))
    syncs_before = disk.stats.syncs
    if failing_sync is None:
        await storage.checkpoint()
        assert disk.stats.syncs - syncs_before >= 10  # At least 5 chunks per disk.
        assert disk.unsynced_bytes == 0
    else:
        with pytest.raises(BookieIOError, match="injected fsync failure"):
            await storage.checkpoint()
        assert _marks(config) == mark_before  # Synced chunks are not indexed: replay them.
        await _assert_read_back(storage, entries)
        disk.heal()
        await storage.checkpoint()  # Appends the entries again; the first copies are garbage.
        assert _marks(config) != mark_before
    await _assert_read_back(storage, entries)
    await storage.close()
    reopened = await open_storage(config, entry_log_disk=OS_DISK)
    await _assert_read_back(reopened, entries)


async def test_a_failing_periodic_flush_is_logged_and_retried(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    config = make_config(tmp_path, flush_interval_seconds=0.01)
    disk = FakeDisk(lazy=True, eio_after_syncs=0, eio_file_suffix=".log")
    storage = await open_storage(config, entry_log_disk=disk)
    mark_before = _marks(config)
    with structlog.testing.capture_logs() as logs:
        entries = await _add(storage, range(10))
        await _wait_until(lambda: any(e["event"] == "storage_flush_failed" for e in logs))
    failure = next(event for event in logs if event["event"] == "storage_flush_failed")
    assert "injected fsync failure" in failure["error"], failure
    assert _marks(config) == mark_before
    disk.heal()  # The flush loop keeps trying; the next flush goes through.
    await _wait_until(lambda: _marks(config) != mark_before)
    await storage.close(checkpoint=False)
    reopened = await open_storage(config)
    await _assert_read_back(reopened, entries)


# -- ShardStorage: (b) power failure before the entry-log sync --------------------------------


@pytest.mark.parametrize("tear", [False, True])
async def test_lost_unsynced_entry_log_writes_come_back_from_the_journal(
    open_storage: OpenStorage, tmp_path: Path, tear: bool
) -> None:
    config = _synced_journal(make_config(tmp_path, entry_log_max_bytes=2048))
    disk = PowerFailsAtEntryLogSync(lazy=True, tear=tear)  # Journal and entry logs alike.
    storage = await open_storage(config, entry_log_disk=disk, journal_factory=_journal_on(disk))
    flushed = await _add(storage, range(15))
    await storage.checkpoint()  # These reach the entry logs, the index and the mark.
    journaled = await _add(storage, range(15, 30))  # Acknowledged: synced in the journal only.
    assert disk.unsynced_bytes == 0

    disk.armed = True
    with pytest.raises(BookieIOError, match="power failure"):
        await storage.checkpoint()
    assert disk.stats.dropped_bytes > 0  # The flush had appended them; the crash took them.
    await storage.close(checkpoint=False)  # The crashed disk ignores whatever close writes.
    if not tear:  # A torn write may leave whole (unindexed) records behind; otherwise none.
        assert not _entries_in_logs(config) & {(e.ledger_id, e.entry_id) for e in journaled}

    reopened = await open_storage(config, entry_log_disk=OS_DISK)
    await _assert_read_back(reopened, flushed + journaled)
    await reopened.compact()  # Torn or orphaned log bytes are garbage, never entries.
    await _assert_read_back(reopened, flushed + journaled)


def _entries_in_logs(config: StorageConfig) -> set[tuple[int, int]]:
    """(ledger, entry) of every whole record in the entry-log files, indexed or not."""
    found: set[tuple[int, int]] = set()
    for ledger_dir in config.ledger_dirs:
        directory = Path(ledger_dir) / "logs"
        reader = EntryLogDirectory(directory, 1 << 20, disk=OS_DISK)  # Not opened: scan only.
        for path in directory.glob("*.log"):
            found.update((e.ledger_id, e.entry_id) for _loc, e in reader.scan(int(path.stem, 16)))
    return found


# -- ShardStorage: (c) latency ----------------------------------------------------------------


async def test_slow_writes_and_syncs_change_nothing(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    config = _synced_journal(
        make_config(tmp_path, flush_interval_seconds=0.01, entry_log_max_bytes=4096)
    )
    entry_log_disk = FakeDisk(sync_delay=0.003, write_delay=0.001)
    journal_disk = FakeDisk(sync_delay=0.002)
    storage = await open_storage(
        config, entry_log_disk=entry_log_disk, journal_factory=_journal_on(journal_disk)
    )
    entries = await _add(storage, range(40))  # Periodic flushes run while adds go on.
    await storage.checkpoint()
    await storage.delete_ledger(LEDGERS[0])
    await storage.compact()
    survivors = [e for e in entries if e.ledger_id != LEDGERS[0]]
    await _assert_read_back(storage, survivors)
    assert entry_log_disk.stats.syncs > 0 and entry_log_disk.stats.writes > 0
    await storage.close()
    reopened = await open_storage(config)
    await _assert_read_back(reopened, survivors)


class RecordingCrashPoints:
    """Armed, but only records where it was reached (a unit test must not exit)."""

    armed = True

    def __init__(self) -> None:
        self.reached_points: list[str] = []

    def reached(self, name: str) -> None:
        self.reached_points.append(name)


async def test_storage_passes_its_crash_points_to_entry_logs_and_checkpoints(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    """The seam reaches the storage thread's crash points: a flush that writes entry logs
    passes the entry-log one before their sync and the checkpoint one before its rename."""
    crash_points = RecordingCrashPoints()
    storage = await open_storage(crash_points=crash_points)
    opened = list(crash_points.reached_points)  # Open checkpoints once, with nothing written.
    assert "entrylog.after_write_before_sync" not in opened
    await _add(storage, range(5))
    await storage.checkpoint()
    flushed = crash_points.reached_points[len(opened) :]
    assert flushed.index("entrylog.after_write_before_sync") < flushed.index(
        "checkpoint.before_rename"
    ), flushed
    assert flushed.count("checkpoint.before_rename") == len(make_config(tmp_path).ledger_dirs)
