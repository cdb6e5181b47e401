"""One journal directory as an open journal holds it: opening it, reading it back, deleting files.

Opening (`open_directory`) builds the writer side of a journal (the writer thread, the file
writer, its preallocator and zero-filler), then, on the writer thread, locks the directory,
drops prepared files a previous process left, lists the journal files that are there and
starts a new file after them. `JournalDirectory` keeps the lock and that list: it reads those
files back (`reader`), deletes the files a checkpoint released (`delete_before`), and gives
the lock up when the journal closes (`unlock`).

None of this is on the append path: `Journal` (journal.py) calls it to open, replay, release
files at a checkpoint and close.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import structlog

from bkaio.errors import BookieIOError, ConfigError
from bkaio.journal.config import JournalConfig
from bkaio.journal.crash_points import CrashPoints
from bkaio.journal.disk import OS_DISK, Disk, SyncFunctionDisk
from bkaio.journal.files import (
    delete_gradually,
    file_name,
    list_file_ids,
    lock_directory,
    remove_stale_preallocated,
    sync_directory,
)
from bkaio.journal.records import JournalMark
from bkaio.journal.replay import JournalReader
from bkaio.journal.threads import SerialWorker, Threads
from bkaio.journal.writer import JournalAckPolicy, JournalFileWriter, Preallocator
from bkaio.journal.zero_fill import ZeroFiller

log = structlog.get_logger(__name__)


class JournalDirectory:
    """The files of one locked journal directory: those found at open, and their deletion."""

    def __init__(
        self,
        path: Path,
        *,
        loop: asyncio.AbstractEventLoop,
        lock_fd: int,
        recovered_file_ids: list[int],
        sync: bool,
    ) -> None:
        self._path = path
        self._loop = loop
        self._lock_fd = lock_fd
        self._recovered_file_ids = recovered_file_ids
        self._sync = sync
        self._log = log.bind(journal_dir=str(path))

    @property
    def path(self) -> Path:
        return self._path

    @property
    def recovered_file_count(self) -> int:
        """How many files were there when the journal opened (and are not deleted since)."""
        return len(self._recovered_file_ids)

    def reader(self, after: JournalMark | None) -> JournalReader:
        """Records after `after` in the files that existed at open, one by one. Blocking."""
        return JournalReader(self._path, list(self._recovered_file_ids), after)

    async def delete_before(self, keep_from: int, mark: JournalMark) -> list[Path]:
        """Delete the files with ids below `keep_from` (a checkpoint at `mark` released them);
        return their paths. The file I/O runs in the default executor."""
        directory, sync = self._path, self._sync

        def delete() -> list[Path]:
            deleted: list[Path] = []
            for file_id in list_file_ids(directory):
                if file_id < keep_from:
                    path = directory / file_name(file_id)
                    delete_gradually(path, sync=sync)  # A discard storm would stall syncs.
                    deleted.append(path)
            if deleted and sync:
                sync_directory(directory)
            return deleted

        try:
            deleted = await self._loop.run_in_executor(None, delete)
        except OSError as error:
            raise BookieIOError(
                f"journal {self._path}: deleting files before {mark}: {error}"
            ) from error
        self._recovered_file_ids = [i for i in self._recovered_file_ids if i >= keep_from]
        if deleted:
            self._log.info("journal_files_deleted", files=len(deleted), before_file_id=keep_from)
        return deleted

    def unlock(self) -> None:
        """Give up the directory's lock (on the writer thread, after its last file closed)."""
        os.close(self._lock_fd)


class OpenedDirectory(NamedTuple):
    """What `open_directory` hands `Journal`: the directory and the writer side, started."""

    files: JournalDirectory
    executor: SerialWorker  # The writer thread.
    writer: JournalFileWriter
    preallocator: Preallocator | None
    first_file_id: int  # The new file appends go to.


def choose_directory(config: JournalConfig, directory: Path | None) -> Path:
    """`directory`, checked to be one of `config.directories`; or the only one of them."""
    if directory is None:
        if len(config.directories) != 1:
            raise ConfigError(
                f"journal.directories has {len(config.directories)} entries: pass "
                "directory= to Journal.open (one journal per directory)"
            )
        return config.directories[0]
    if directory not in config.directories:
        raise ConfigError(f"{directory} is not one of journal.directories")
    return directory


async def open_directory(
    config: JournalConfig,
    directory: Path,
    *,
    sync_function: Callable[[int], None] | None,
    loop: asyncio.AbstractEventLoop,
    disk: Disk,
    crash_points: CrashPoints,
    ack_policy: JournalAckPolicy,
    threads: Threads,
) -> OpenedDirectory:
    """Lock `directory` (creating it if needed) and start a new file after the existing ones,
    on a new writer thread (the arguments are `Journal.open`'s)."""
    executor = threads.serial("journal-writer")
    preallocator = (
        Preallocator(
            directory,
            config.max_file_bytes,
            sync=config.sync,
            disk=disk,
            executor=threads.pool("journal-prealloc", 1),
        )
        if config.preallocate_next_file
        else None
    )
    # A test's sync function takes the disk's fdatasync's place; commits go the same way.
    commit_disk = disk if sync_function is None else SyncFunctionDisk(disk, sync_function)
    # The zero-filler only with the real disk: it writes and syncs the current file itself
    # (plain os calls on its own descriptor, from its own thread), behind the Disk and Threads
    # seams, which only the real disk's semantics make safe. A fake's faults and crashes would
    # miss those writes, and the simulation refuses real threads; through FakeDisk instead it
    # would be wrong: that holds unsynced writes per descriptor, so zeros the filler wrote
    # before a record could land at the filler's sync on top of it (the kernel's page cache
    # keeps them in order). With a test's sync function there is no real sync to speed up.
    zero_filler = (
        ZeroFiller(config.preallocate_ahead_bytes, config.max_file_bytes)
        if config.preallocate_ahead_bytes and config.sync and commit_disk is OS_DISK
        else None
    )
    writer = JournalFileWriter(
        directory,
        sync=config.sync,
        preallocator=preallocator,
        disk=commit_disk,
        zero_filler=zero_filler,
        crash_points=crash_points,
        ack_policy=ack_policy,
    )

    def set_up() -> tuple[int, list[int], int]:
        lock_fd = lock_directory(directory)
        try:
            remove_stale_preallocated(directory)
            file_ids = list_file_ids(directory)
            first_file_id = (file_ids[-1] if file_ids else 0) + 1
            writer.open_new(first_file_id)
        except BaseException:
            os.close(lock_fd)
            raise
        return lock_fd, file_ids, first_file_id

    try:
        lock_fd, file_ids, first_file_id = await asyncio.wrap_future(executor.submit(set_up))
    except BaseException as error:
        executor.shutdown(wait=False)
        if zero_filler is not None:
            await loop.run_in_executor(None, zero_filler.shutdown)
        if preallocator is not None:
            await loop.run_in_executor(None, preallocator.shutdown)
        if isinstance(error, OSError):
            raise BookieIOError(f"journal directory {directory}: cannot open: {error}") from error
        raise
    files = JournalDirectory(
        directory, loop=loop, lock_fd=lock_fd, recovered_file_ids=file_ids, sync=config.sync
    )
    return OpenedDirectory(files, executor, writer, preallocator, first_file_id)
