"""Journal files: deletion after a checkpoint, preallocation of the next file, journal sets."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import MutableMapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import structlog

from bkaio.errors import ConfigError
from bkaio.journal import (
    EntryRecord,
    Journal,
    JournalConfig,
    JournalError,
    JournalMark,
)
from bkaio.journal.files import HEADER_BYTES, delete_gradually, file_name, list_file_ids
from bkaio.journal.writer import Group, JournalFileWriter, Preallocator
from bkaio.testing.disk import FakeDisk


def entry(entry_id: int, ledger_id: int = 1) -> EntryRecord:
    return EntryRecord(ledger_id, entry_id, entry_id - 1, entry_id, 0, bytes(300))


@pytest.fixture
def config(tmp_path: Path) -> JournalConfig:
    return JournalConfig(
        directories=(tmp_path / "journal",), max_file_bytes=4096, max_group_bytes=1024, sync=False
    )


async def test_delete_files_before_keeps_the_mark_file_and_later(config: JournalConfig) -> None:
    journal = await Journal.open(config)
    try:
        marks = [await journal.append(entry(i)) for i in range(60)]
        directory = config.directories[0]
        all_ids = list_file_ids(directory)
        assert len(all_ids) >= 5
        checkpoint = next(mark for mark in marks if mark.file_id == all_ids[2])

        deleted = await journal.delete_files_before(checkpoint)

        assert deleted == [directory / file_name(file_id) for file_id in all_ids[:2]]
        assert list_file_ids(directory) == all_ids[2:]
        # Everything after the checkpoint still replays after a restart.
        await journal.close()
        journal = await Journal.open(config)
        result = journal.replay(checkpoint)
        later_marks = [mark for mark in marks if mark > checkpoint]
        assert [mark for mark, _record in result.records] == later_marks
    finally:
        await journal.close()


async def test_delete_files_before_never_deletes_the_current_file(config: JournalConfig) -> None:
    journal = await Journal.open(config)
    try:
        for i in range(30):
            await journal.append(entry(i))
        current = journal.current_file_id
        deleted = await journal.delete_files_before(journal.durable_mark)
        assert list_file_ids(config.directories[0]) == [current]
        assert len(deleted) == current - 1
        assert await journal.delete_files_before(journal.durable_mark) == []
        assert (await journal.append(entry(99))).file_id >= current
    finally:
        await journal.close()


async def test_delete_files_before_refuses_a_mark_that_is_not_durable(
    config: JournalConfig,
) -> None:
    journal = await Journal.open(config)
    try:
        future_mark = JournalMark(journal.durable_mark.file_id + 1, HEADER_BYTES)
        with pytest.raises(JournalError, match="beyond the durable mark"):
            await journal.delete_files_before(future_mark)
    finally:
        await journal.close()


async def test_preallocated_next_file_is_used_and_replays_cleanly(
    config: JournalConfig,
) -> None:
    config = replace(config, preallocate_next_file=True, max_file_bytes=8192)
    journal = await Journal.open(config)
    try:
        marks = []
        for i in range(80):
            marks.append(await journal.append(entry(i)))
            if i % 10 == 0:
                await asyncio.sleep(0.01)  # Let the background preparation finish sometimes.
    finally:
        await journal.close()
    directory = config.directories[0]
    assert not list(directory.glob("*.prealloc")), "close removes unused preparations"
    reopened = await Journal.open(config)
    try:
        result = reopened.replay(None)
    finally:
        await reopened.close()
    assert [mark for mark, _record in result.records] == marks
    assert result.corruption == []
    for tail in [*result.earlier_torn_tails, *([result.torn_tail] if result.torn_tail else [])]:
        assert "zeros" in tail.reason  # Only the unused, preallocated end of a file.


def test_the_writer_switches_to_a_prepared_file(tmp_path: Path) -> None:
    preallocator = Preallocator(tmp_path, 64 * 1024, sync=False)
    writer = JournalFileWriter(tmp_path, sync=False, preallocator=preallocator)
    try:
        writer.open_new(1)  # Nothing prepared yet: created fresh; file 2 is being prepared.
        assert (tmp_path / file_name(1)).stat().st_size == HEADER_BYTES
        preallocator.prepare(2)  # Replace the job with one we can wait for.
        preallocator._jobs[2][0].result(timeout=30)
        data = bytearray(b"x" * 100)
        group = Group(data, 2, HEADER_BYTES, True, [HEADER_BYTES + 100], [], "queue_empty")
        writer.commit(group)
        assert (tmp_path / file_name(2)).stat().st_size == 64 * 1024  # Written in place.
    finally:
        writer.close()
        preallocator.shutdown()
    assert not list(tmp_path.glob("*.prealloc"))


@dataclass
class NoRoomForPreparations(FakeDisk):
    """The file system fills up under the journal's preparations: their writes from offset
    `fail_from` on fail with ENOSPC (the journal's own files still have room)."""

    fail_from: int = HEADER_BYTES

    def write(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        if offset >= self.fail_from and os.readlink(f"/proc/self/fd/{fd}").endswith(".prealloc"):
            raise OSError(errno.ENOSPC, "No space left on device (test)")
        super().write(fd, data, offset)


def _preallocation_failures(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [line for line in logs if line["event"] == "journal_preallocation_failed"]


def test_a_failed_preparation_is_told_removed_and_the_roll_creates_the_file(
    tmp_path: Path,
) -> None:
    # The first zero chunk fits, the next does not: a partial file of 256 KiB is left to remove.
    disk = NoRoomForPreparations(fail_from=HEADER_BYTES + 256 * 1024)
    preallocator = Preallocator(tmp_path, 1024 * 1024, sync=True, disk=disk)
    writer = JournalFileWriter(tmp_path, sync=True, preallocator=preallocator, disk=disk)
    with structlog.testing.capture_logs() as logs:
        try:
            writer.open_new(1)  # File 2's preparation starts: it runs out of room.
            error = preallocator._jobs[2][0].exception(timeout=30)
            assert isinstance(error, OSError) and error.errno == errno.ENOSPC
            assert not list(tmp_path.glob("*.prealloc"))  # Its partial file is gone.
            group = Group(
                bytearray(b"x" * 100), 2, HEADER_BYTES, True, [HEADER_BYTES + 100], [], ""
            )
            writer.commit(group)  # Rolls to a file created the ordinary way.
            assert (tmp_path / file_name(2)).stat().st_size == HEADER_BYTES + 100
        finally:
            writer.close()
            preallocator.shutdown()  # Waits for file 3's preparation (and its report).
    assert not list(tmp_path.glob("*.prealloc"))
    failures = _preallocation_failures(logs)
    assert failures and failures[0]["file_id"] == 2, logs
    assert {line["log_level"] for line in failures} == {"warning"}
    assert "No space left on device" in failures[0]["error"]
    assert preallocator.failures == len(failures)


class BrokenPreparations(FakeDisk):
    """A bug (not a disk error) in writing the journal's preparations."""

    def write(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".prealloc"):
            raise RuntimeError("a bug in preparing")
        super().write(fd, data, offset)


def test_a_preparation_failing_with_a_bug_is_logged_at_error(tmp_path: Path) -> None:
    disk = BrokenPreparations()
    preallocator = Preallocator(tmp_path, 1024 * 1024, sync=True, disk=disk)
    with structlog.testing.capture_logs() as logs:
        preallocator.prepare(2)
        assert isinstance(preallocator._jobs[2][0].exception(timeout=30), RuntimeError)
        preallocator.shutdown()  # Waits for the preparation's thread (and so its report).
    (failure,) = _preallocation_failures(logs)
    assert failure["log_level"] == "error" and "a bug in preparing" in failure["error"]
    assert not list(tmp_path.glob("*.prealloc"))


async def test_a_journal_whose_preparations_fail_rolls_and_commits(
    config: JournalConfig,
) -> None:
    config = replace(config, preallocate_next_file=True, max_file_bytes=8192, sync=True)
    disk = NoRoomForPreparations()
    with structlog.testing.capture_logs() as logs:
        journal = await Journal.open(config, disk=disk)
        try:
            preallocator = journal._preallocator
            assert preallocator is not None
            for _ in range(3000):  # ~30 s: a bound for a hung test, not a timing claim.
                if preallocator.failures:
                    break
                await asyncio.sleep(0.01)
            marks = [await journal.append(entry(i)) for i in range(60)]
        finally:
            await journal.close()
    directory = config.directories[0]
    assert len({mark.file_id for mark in marks}) >= 3  # Rolled to fresh files.
    assert not list(directory.glob("*.prealloc"))
    assert _preallocation_failures(logs)[0]["file_id"] == 2
    reopened = await Journal.open(config)
    try:
        result = reopened.replay(None)
    finally:
        await reopened.close()
    assert [mark for mark, _record in result.records] == marks
    assert result.corruption == []


async def test_journal_open_needs_a_directory_when_there_are_several(tmp_path: Path) -> None:
    config = JournalConfig(directories=(tmp_path / "a", tmp_path / "b"), sync=False)
    with pytest.raises(ConfigError, match="pass directory="):
        await Journal.open(config)
    journal = await Journal.open(config, directory=tmp_path / "b")
    await journal.close()


def test_delete_gradually_frees_the_file_from_the_end_in_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "00000001.jnl"
    path.write_bytes(b"h" * HEADER_BYTES + b"r" * 100_000)
    sizes: list[int] = []
    real_ftruncate = os.ftruncate

    def recording_ftruncate(fd: int, length: int) -> None:
        sizes.append(length)
        real_ftruncate(fd, length)

    monkeypatch.setattr(os, "ftruncate", recording_ftruncate)
    delete_gradually(path, sync=True, step_bytes=16_384, pause_seconds=0)
    assert not path.exists()
    total = HEADER_BYTES + 100_000
    assert sizes == [total - 16_384 * n for n in range(1, len(sizes) + 1)]
    assert len(sizes) == 6 and sizes[-1] > HEADER_BYTES  # The header stays until the unlink.


def test_delete_gradually_of_a_missing_or_small_file(tmp_path: Path) -> None:
    delete_gradually(tmp_path / "gone.jnl", sync=False)  # Nothing to do, no error.
    small = tmp_path / "00000002.jnl"
    small.write_bytes(b"h" * HEADER_BYTES)
    delete_gradually(small, sync=False, pause_seconds=0)
    assert not small.exists()
