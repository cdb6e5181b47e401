"""Disk.write_synced, the journal's commit: on the real disk a group's write and sync in one
pwritev(RWF_DSYNC) call, with the two-call fallback where the kernel or file system refuses the
flag; on the fault suite's disks their write and sync, on the same commit path."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bkaio.journal import EntryRecord, Journal, JournalConfig, JournalReader
from bkaio.journal.disk import OsDisk
from bkaio.journal.files import list_file_ids
from bkaio.journal.writer import AckAfterSync, JournalFileWriter
from bkaio.testing.crash_points import CrashAt
from bkaio.testing.disk import FakeDisk
from bkaio.testing.mutations import AckBeforeSync


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


def test_write_synced_writes_everything_at_the_offset(tmp_path: Path) -> None:
    fd = _open(tmp_path / "f")
    try:
        os.pwrite(fd, b"\0" * 64, 0)
        OsDisk().write_synced(fd, bytearray(b"abc"), 10)
        OsDisk().write_synced(fd, memoryview(b"xyz" * 1000), 13)
        assert os.pread(fd, 3013, 10) == b"abc" + b"xyz" * 1000
    finally:
        os.close(fd)


def test_a_refused_flag_falls_back_to_write_and_fdatasync_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def refusing_pwritev(*args: Any) -> int:
        calls.append("pwritev")
        raise OSError(errno.EOPNOTSUPP, "RWF_DSYNC not supported here")

    real_fdatasync = os.fdatasync

    def counting_fdatasync(fd: int) -> None:
        calls.append("fdatasync")
        real_fdatasync(fd)

    monkeypatch.setattr(os, "pwritev", refusing_pwritev)
    monkeypatch.setattr(os, "fdatasync", counting_fdatasync)
    disk = OsDisk()
    fd = _open(tmp_path / "f")
    try:
        disk.write_synced(fd, b"first", 0)
        disk.write_synced(fd, b"second", 5)
        assert os.pread(fd, 11, 0) == b"firstsecond"
    finally:
        os.close(fd)
    assert calls == ["pwritev", "fdatasync", "fdatasync"]  # Asked once, then never again.


def test_other_write_errors_are_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_pwritev(*args: Any) -> int:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "pwritev", failing_pwritev)
    fd = _open(tmp_path / "f")
    try:
        with pytest.raises(OSError) as raised:
            OsDisk().write_synced(fd, b"data", 0)
        assert raised.value.errno == errno.EIO
    finally:
        os.close(fd)


def _writer(tmp_path: Path, *, sync: bool = True, **parts: Any) -> JournalFileWriter:
    return JournalFileWriter(tmp_path, sync=sync, preallocator=None, **parts)


def test_production_commits_in_one_call_and_anything_injected_through_its_policy(
    tmp_path: Path,
) -> None:
    production = _writer(tmp_path)
    assert production.commit == production._commit
    # A crash point between the write and the sync, or another ack policy, needs the steps
    # one by one: the policy's path, picked at construction.
    for parts in (
        {"crash_points": CrashAt("journal.after_write_before_sync")},
        {"ack_policy": AckBeforeSync()},
        {"ack_policy": AckAfterSync()},  # Not the production object: the general path.
    ):
        writer = _writer(tmp_path, **parts)
        assert writer.commit != writer._commit, parts


@dataclass
class RecordingDisk(FakeDisk):
    """A fault-suite disk that notes which of its calls the journal makes."""

    calls: list[str] = field(default_factory=list)

    def write(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        self.calls.append("write")
        super().write(fd, data, offset)

    def fdatasync(self, fd: int) -> None:
        self.calls.append("fdatasync")
        super().fdatasync(fd)

    def write_synced(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        self.calls.append("write_synced")
        super().write_synced(fd, data, offset)


def _entry(entry_id: int) -> EntryRecord:
    return EntryRecord(1, entry_id, entry_id - 1, entry_id, 0, b"x" * 64)


@pytest.mark.parametrize("lazy", [False, True])
async def test_a_fault_disk_runs_the_production_commit_path(tmp_path: Path, lazy: bool) -> None:
    """The fault suite's disks commit a group as production does: `_commit`, one
    `write_synced` per group (on the real disk one pwritev(RWF_DSYNC))."""
    disk = RecordingDisk(lazy=lazy)
    journal = await Journal.open(JournalConfig(directories=(tmp_path / "j",)), disk=disk)
    try:
        assert journal._writer.commit == journal._writer._commit
        for entry_id in range(3):
            await journal.append(_entry(entry_id))
    finally:
        await journal.close()
    # write_synced is the fake's write then its sync, each noted after it.
    assert disk.calls == ["write_synced", "write", "fdatasync"] * 3
    assert disk.unsynced_bytes == 0 and disk.crash() == 0  # Durable when acknowledged.
    reader = JournalReader(tmp_path / "j", list_file_ids(tmp_path / "j"), None)
    replayed = [record.entry_id for _mark, record in reader if isinstance(record, EntryRecord)]
    assert replayed == [0, 1, 2]


async def test_a_test_sync_function_takes_the_sync_s_place_on_the_same_path(
    tmp_path: Path,
) -> None:
    disk = RecordingDisk(lazy=True)
    synced: list[int] = []

    def sync(fd: int) -> None:
        synced.append(fd)
        disk.fdatasync(fd)

    journal = await Journal.open(
        JournalConfig(directories=(tmp_path / "j",)), disk=disk, sync_function=sync
    )
    try:
        await journal.append(_entry(0))
        assert journal._writer.commit == journal._writer._commit
    finally:
        await journal.close()
    assert disk.calls == ["write", "fdatasync"] and len(synced) == 1
