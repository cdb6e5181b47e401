"""OsDisk.write_synced: a journal group's write and sync in one pwritev(RWF_DSYNC) call, with
the two-call fallback where the kernel or file system refuses the flag."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from bkaio.journal.disk import OsDisk
from bkaio.journal.writer import AckAfterSync, JournalFileWriter
from bkaio.testing.crash_points import CrashAt
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
    return JournalFileWriter(
        tmp_path,
        sync=sync,
        sync_function=os.fdatasync,
        preallocator=None,
        write_synced=OsDisk().write_synced,
        **parts,
    )


def test_production_commits_in_one_call_and_anything_injected_through_its_policy(
    tmp_path: Path,
) -> None:
    production = _writer(tmp_path)
    assert production.commit == production._commit and production._write_synced is not None
    assert _writer(tmp_path, sync=False)._write_synced is None  # Nothing to sync at all.
    # A crash point between the write and the sync, or another ack policy, needs the steps
    # one by one: the policy's path, picked at construction.
    for parts in (
        {"crash_points": CrashAt("journal.after_write_before_sync")},
        {"ack_policy": AckBeforeSync()},
        {"ack_policy": AckAfterSync()},  # Not the production object: the general path.
    ):
        writer = _writer(tmp_path, **parts)
        assert writer.commit != writer._commit, parts
