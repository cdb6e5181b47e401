"""Restarts of ledger storage that stop partway: the checkpoint marks they leave behind."""

from __future__ import annotations

import asyncio
import errno
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from bkaio.entrylog.checkpoint import read_last_mark
from bkaio.errors import BookieIOError
from bkaio.journal import JournalConfig, open_journal
from bkaio.testing.disk import FakeDisk
from bkaio.wal import JournalLike
from tests.fixtures.storage import add_entry, read_entry
from tests.unit.entrylog.conftest import KEY, OpenStorage, make_config, make_entry


async def test_a_restart_stopped_in_the_second_journals_replay_keeps_its_mark(
    open_storage: OpenStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two journals; replay of the first flushes as it goes (its journal is larger than half
    the write cache), and the start stops before the second journal is replayed (a crash, or
    an error in its replay). The checkpoints written meanwhile must keep the second journal's
    mark: reset to nothing, the next start replays that journal from its oldest file and
    brings back a ledger deleted after its records were checkpointed."""
    config = make_config(tmp_path, disks=1, journals=2)
    storage = await open_storage(config)
    deleted, other = 1, 2  # Ledger 1 is journal 1's (ledger id % 2), ledger 2 journal 0's.
    await add_entry(storage, make_entry(deleted, 0), KEY)
    await storage.checkpoint()  # Journal 1's mark passes ledger 1's records...
    await storage.delete_ledger(deleted)  # ...which stay in its current file.
    payload = b"p" * 10_000
    await asyncio.gather(
        *(add_entry(storage, make_entry(other, i, payload=payload), KEY) for i in range(100))
    )
    await storage.close(checkpoint=False)
    (journal1_mark,) = read_last_mark([tmp_path / "ledgers0"], 2)[1:]
    assert journal1_mark is not None

    async def stopping_in_journal1(journal_config: JournalConfig, directory: Path) -> JournalLike:
        journal = await open_journal(journal_config, directory)
        if directory == config.journal.directories[1]:

            def crash(_after: object) -> object:
                raise RuntimeError("stopped before journal 1 was replayed")

            monkeypatch.setattr(journal, "iter_replay", crash)
        return journal

    small = make_config(tmp_path, disks=1, journals=2, write_cache_bytes=256 * 1024)
    with pytest.raises(RuntimeError, match="stopped before"):
        await open_storage(small, journal_factory=stopping_in_journal1)
    marks = read_last_mark([tmp_path / "ledgers0"], 2)
    assert marks[1] is not None and marks[1] >= journal1_mark, marks
    reopened = await open_storage(config)
    assert reopened.ledger_ids() == [other]


@dataclass
class FillsUp(FakeDisk):
    """Writes to files ending in `suffix` fail with ENOSPC once `room_writes` of them worked."""

    suffix: str = ""
    room_writes: int = 0

    def write(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(self.suffix):
            if self.room_writes == 0:
                raise OSError(errno.ENOSPC, "No space left on device (test)")
            self.room_writes -= 1
        super().write(fd, data, offset)


# The entry logs (their header at open, then the first flush of replay) or the checkpoints.
@pytest.mark.parametrize(
    ("suffix", "room_writes", "named"),
    [(".log", 2, "ledgers0/logs/00000001.log"), ("lastMark.tmp", 1, "ledgers0/lastMark")],
)
async def test_a_disk_that_fills_during_replay_stops_the_start_and_loses_nothing(
    open_storage: OpenStorage, tmp_path: Path, suffix: str, room_writes: int, named: str
) -> None:
    """Replay flushes as it goes; a ledger disk that fills after the first of these flushes
    fails the start with an error naming the file, and once there is room again the next
    start has every entry."""
    config = make_config(tmp_path, disks=1)
    storage = await open_storage(config)
    payload = b"p" * 10_000
    entries = [make_entry(3, i, payload=payload) for i in range(100)]
    await asyncio.gather(*(add_entry(storage, entry, KEY) for entry in entries))
    await storage.close(checkpoint=False)
    disk = FillsUp(suffix=suffix, room_writes=room_writes)
    small = make_config(tmp_path, disks=1, write_cache_bytes=256 * 1024)
    # The error names the file: the OS's own names none.
    with pytest.raises(BookieIOError, match=rf"{named}\S*: .*No space left on device"):
        await open_storage(small, entry_log_disk=disk)
    assert disk.room_writes == 0  # It filled after the first flush, not at open.
    reopened = await open_storage(small)
    for entry in entries:
        assert await read_entry(reopened, 3, entry.entry_id) == entry
