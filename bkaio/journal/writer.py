"""The journal's disk side: the file being written, and the preparation of the next one.

`JournalFileWriter` is confined to the journal's single writer thread: only that thread
writes, syncs or rolls the current file. `Preallocator` owns a second thread that prepares
the *next* file (header and zeros, synced) aside, under another name; it never touches the
current file, so its fdatasync never covers a region the commit path is writing.

`JournalAckPolicy` says what must be durable before a group is acknowledged. Production uses
`ACK_AFTER_SYNC`, the journal's promise: the group itself. The fault suite's mutation check
injects a broken one (bkaio.testing.mutations) through the test entry point, to prove that its
checker catches a bookie that acknowledges before the fsync.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

import structlog

from bkaio.journal.crash_points import NO_CRASH_POINTS, CrashPoints
from bkaio.journal.disk import OS_DISK, Disk
from bkaio.journal.files import (
    HEADER_BYTES,
    create_file,
    install_preallocated,
    preallocate_file,
)
from bkaio.journal.records import JournalMark
from bkaio.journal.zero_fill import ZeroFiller

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class Group:
    """One group commit: records back to back, written at `start_offset` of `file_id`."""

    data: bytearray
    file_id: int
    start_offset: int
    new_file: bool  # Roll to `file_id` (a new file) before writing.
    ends: list[int]  # Offset just after each record: its JournalMark.
    # Touched only on the loop thread. One per record; None for a record on `shared` instead.
    waiters: list[asyncio.Future[JournalMark] | None]
    trigger: str
    # Resolved with the mark after the group's last record (`Journal.append_entries`).
    shared: asyncio.Future[JournalMark] | None = None


class Preallocator:
    """Prepares the next journal file in the background (header, zeros, fdatasync).

    A preparation that fails (ENOSPC, EIO) is logged as a WARNING when it fails and counted in
    `failures`; it removes its partial file, and the roll then creates the file the ordinary
    way, as when a preparation is not ready (a full or failing disk shows there next).
    """

    def __init__(
        self,
        directory: Path,
        size_bytes: int,
        *,
        sync: bool,
        disk: Disk = OS_DISK,
        executor: concurrent.futures.Executor | None = None,
    ) -> None:
        self._directory = directory
        self._size_bytes = size_bytes
        self._sync = sync
        self._disk = disk
        # One thread of its own (the simulation passes its executor: bkaio.journal.threads).
        self._executor = executor or concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="journal-prealloc"
        )
        self._jobs: dict[int, tuple[concurrent.futures.Future[Path | None], list[bool]]] = {}
        self.failures = 0  # Preparations that raised (counted as each ends; tests read it).

    def prepare(self, file_id: int) -> None:
        stop = [False]
        job = self._executor.submit(
            preallocate_file,
            self._directory,
            file_id,
            self._size_bytes,
            sync=self._sync,
            stop=stop,
            disk=self._disk,
        )
        # Told when it ends, taken or not: a preparation dropped as not ready may fail later.
        job.add_done_callback(functools.partial(self._report_failure, file_id))
        self._jobs[file_id] = (job, stop)

    def _report_failure(self, file_id: int, job: concurrent.futures.Future[Path | None]) -> None:
        if job.cancelled():
            return
        error = job.exception()
        if error is None:
            return
        self.failures += 1
        # The disk refusing (ENOSPC, EIO) is the operator's to see; the journal goes on with
        # files created as it rolls. Anything else is a bug: at ERROR, with its traceback.
        # (This runs on the preparation's thread, where the loop's supervisor cannot be told.)
        report = log.warning if isinstance(error, OSError) else log.error
        report(
            "journal_preallocation_failed",
            journal_dir=str(self._directory),
            file_id=file_id,
            error=str(error) or repr(error),
            failures=self.failures,
            exc_info=None if isinstance(error, OSError) else error,
        )

    def take(self, file_id: int) -> Path | None:
        """The prepared file for `file_id` if it is ready now; never waits for it. None when it
        is not ready or failed (`_report_failure` told): the caller creates the file."""
        entry = self._jobs.pop(file_id, None)
        if entry is None:
            return None
        job, stop = entry
        if job.done() and job.exception() is None:
            return job.result()
        stop[0] = True  # Not ready: drop it rather than wait; the commit path never waits.
        return None

    def shutdown(self) -> None:
        """Stop and remove unfinished preparations; wait for the thread (blocking)."""
        for job, stop in self._jobs.values():
            stop[0] = True
            job.cancel()
        self._executor.shutdown(wait=True)
        for job, _stop in self._jobs.values():
            if job.done() and not job.cancelled() and job.exception() is None:
                path = job.result()
                if path is not None:
                    path.unlink(missing_ok=True)
        self._jobs.clear()


class JournalAckPolicy(Protocol):
    """What a group's commit makes durable before the group is acknowledged."""

    def commit(self, writer: JournalFileWriter, group: Group) -> float:
        """Write `group` with `writer.write_group` and sync with `writer.sync_current` as this
        policy promises; the group is acknowledged when this returns. The seconds synced."""


class AckAfterSync:
    """The journal's promise: a group is acknowledged only after its own fdatasync returned."""

    def commit(self, writer: JournalFileWriter, group: Group) -> float:
        writer.write_group(group)
        return writer.sync_current()


ACK_AFTER_SYNC: Final = AckAfterSync()


class JournalFileWriter:
    """The current journal file. Every method runs on the journal's writer thread.

    `commit(group)` writes and syncs one group. Production (`ACK_AFTER_SYNC`, no crash point
    armed) commits with `_commit`, chosen here once: no policy call per group, and one disk
    call per group (`Disk.write_synced`, one system call on the real disk), whatever the disk:
    the fault suite's and the simulation's disks run this path too. A test's ack policy or
    armed crash points get the same steps one by one (`write_group`, `sync_current`), crash
    points between.
    """

    def __init__(
        self,
        directory: Path,
        *,
        sync: bool,
        preallocator: Preallocator | None,
        disk: Disk = OS_DISK,
        zero_filler: ZeroFiller | None = None,
        crash_points: CrashPoints = NO_CRASH_POINTS,
        ack_policy: JournalAckPolicy = ACK_AFTER_SYNC,
    ) -> None:
        self._directory = directory
        self._sync = sync
        self._preallocator = preallocator
        self._disk = disk
        self._zero_filler = zero_filler
        self._fd: int | None = None
        self._file_id = 0
        self._end = 0  # Offset after the last group written to the current file.
        self._crash_points = crash_points
        self.commit: Callable[[Group], float] = (
            self._commit
            if ack_policy is ACK_AFTER_SYNC and not crash_points.armed
            else functools.partial(ack_policy.commit, self)
        )

    def open_new(self, file_id: int) -> None:
        """Start writing `file_id`: a prepared file if one is ready, else a fresh one."""
        assert file_id > self._file_id, (file_id, self._file_id)
        self.close_current()
        prepared = self._preallocator.take(file_id) if self._preallocator else None
        if prepared is not None:
            self._fd = install_preallocated(self._directory, prepared, file_id, sync=self._sync)
        else:
            self._fd = create_file(self._directory, file_id, sync=self._sync)
        self._file_id = file_id
        self._end = HEADER_BYTES
        if self._zero_filler is not None:
            self._zero_filler.start_file(
                self._fd, HEADER_BYTES, already_zeroed=prepared is not None
            )
        if self._preallocator is not None:
            self._preallocator.prepare(file_id + 1)

    def _commit(self, group: Group) -> float:
        """Production: write the group and sync it once; return the seconds the sync took."""
        fd = self._start_group(group)
        if not self._sync:  # UNSAFE mode (journal.sync = false): the page cache is not flushed.
            self._disk.write(fd, group.data, group.start_offset)
            self._end = max(self._end, group.start_offset + len(group.data))
            return 0.0
        started = time.perf_counter()
        self._disk.write_synced(fd, group.data, group.start_offset)
        self._end = max(self._end, group.start_offset + len(group.data))
        return time.perf_counter() - started  # Write and sync together.

    def write_group(self, group: Group) -> None:
        """Write the group (rolling to its file first), not synced: for ack policies."""
        fd = self._start_group(group)
        self._disk.write(fd, group.data, group.start_offset)
        self._end = max(self._end, group.start_offset + len(group.data))
        self._crash_points.reached("journal.after_write_before_sync")

    def sync_current(self) -> float:
        """fdatasync the current file (nothing with `sync` off): for ack policies. Seconds."""
        if not self._sync or self._fd is None:
            return 0.0
        started = time.perf_counter()
        self._disk.fdatasync(self._fd)
        self._crash_points.reached("journal.after_sync_before_ack")
        return time.perf_counter() - started

    def _start_group(self, group: Group) -> int:
        """Roll to the group's file if it starts one, zero-fill ahead; the descriptor."""
        if group.new_file:
            self.open_new(group.file_id)
        fd = self._fd
        assert fd is not None and group.file_id == self._file_id, (group, self._file_id)
        if self._zero_filler is not None:
            self._zero_filler.before_write(group.start_offset, group.start_offset + len(group.data))
        return fd

    def close_current(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            if self._zero_filler is not None:
                # The zeros past the last record go: a clean end instead of a zero tail that
                # replay would report (they are harmless if this does not reach the disk).
                self._zero_filler.stop_current()
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, self._end)
            self._disk.close(fd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.close_current()
        if self._zero_filler is not None:
            self._zero_filler.shutdown()
