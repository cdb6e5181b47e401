"""One journal directory's group commit: appends, the writer thread's groups, roll-over, failure.

The loop side (this module) builds the next group in a bytearray and hands whole groups to one
writer thread, which writes a group, calls `sync_function` once, and wakes the loop once per
group (`call_soon_threadsafe`). Appends that arrive while a sync is in flight form the next
group, so groups grow with load and a lone append on an idle journal commits at once.

A group is handed to the writer (BookKeeper's group-commit triggers, docs/storage.md): when it
reaches `max_group_bytes` or `max_group_entries`; when the writer is free and the loop has
appended everything of this iteration ("queue empty"); and, with `adaptive_wait_us`, a group of
two records or more that finds the writer free waits for the next append, at most that long
(`_hold`). Such a group comes from a burst (an ADD_ENTRIES frame, a client's loop iteration): the
next burst then shares its write, its sync and its answers, which at moderate rates halves the
fixed costs per append. A single record (a serial writer, or 1k/s) never waits, and a wait that
caught nothing (the client was waiting for this answer) turns waiting off for
`_HOLD_BACKOFF_GROUPS` groups, so a closed loop does not pay for it again and again.
A lazy record (a WRITE_LAC's LAC) is no trigger: it goes with the next group something else
causes, or once `lazy_record_delay_ms` has passed, so a LAC push costs no write and sync of its own.

Limits: at most two groups exist (one being written, one filling), and the filling one is
bounded by `max_group_bytes` (plus the one record that crossed it) and `max_group_entries`
(plus the one batch of `append_entries` that crossed it).
Past a bound `append` raises `JournalFullError` and `append_entries` returns None;
`await wait_for_room()` first, or use `append_and_wait`. A write or sync error fails the whole
group with `BookieIOError`, and the journal stops: it never acknowledges a later record.

This module must not import `protocol` or `meta`. It holds the one state machine of the
append path (the filling group, the hand-off to the writer thread, the failure) in one class.
Around it: opening the directory, replay and file deletion (directory.py), waiting for room
(room.py, a mixin of `Journal`), the counters (stats.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from itertools import repeat
from pathlib import Path
from typing import Final

import structlog

from bkaio.errors import BKError, BookieIOError
from bkaio.journal.config import JournalConfig
from bkaio.journal.crash_points import NO_CRASH_POINTS, CrashPoints
from bkaio.journal.directory import OpenedDirectory, choose_directory, open_directory
from bkaio.journal.disk import OS_DISK, Disk
from bkaio.journal.errors import JournalError, JournalFullError, RecordError
from bkaio.journal.files import HEADER_BYTES, file_name
from bkaio.journal.records import (
    RECORD_HEADER,
    RECORD_HEADER_BYTES,
    JournalEntry,
    JournalMark,
    JournalRecord,
    encode_entry_head,
    encode_record,
)
from bkaio.journal.replay import JournalReader
from bkaio.journal.room import GroupRoom
from bkaio.journal.stats import JournalStats
from bkaio.journal.threads import OS_THREADS, Threads
from bkaio.journal.writer import ACK_AFTER_SYNC, Group, JournalAckPolicy
from bkaio.wal.records import ReplayResult

log = structlog.get_logger(__name__)

SLOW_SYNC_SECONDS: Final = 0.05  # A sync this slow stalls every add behind it: say so.
# A group waits for the next append only when it holds at least this many records (a burst).
_HOLD_MIN_RECORDS: Final = 2
# After a wait that caught nothing, this many groups go at once (then waiting is tried again).
_HOLD_BACKOFF_GROUPS: Final = 256


class Journal(GroupRoom):
    """The write-ahead journal of one directory. Create with `await Journal.open(...)`."""

    def __init__(
        self,
        *,
        config: JournalConfig,
        loop: asyncio.AbstractEventLoop,
        opened: OpenedDirectory,
    ) -> None:
        self._files = opened.files
        self._directory = opened.files.path
        self._config = config
        self._loop = loop
        self._executor = opened.executor
        self._writer = opened.writer
        self._preallocator = opened.preallocator
        self._log = log.bind(journal_dir=str(self._directory))
        first_file_id = opened.first_file_id
        self.metrics = JournalStats()
        # Position after the last appended byte, and after the last durable one.
        self._tail_file_id = first_file_id
        self._tail_offset = HEADER_BYTES
        self._durable = JournalMark(first_file_id, HEADER_BYTES)
        # The group being filled.
        self._data = bytearray()
        self._ends: list[int] = []
        # One per record; None for a record that waits on the group's shared future instead.
        self._waiters: list[asyncio.Future[JournalMark] | None] = []
        self._shared: asyncio.Future[JournalMark] | None = None
        self._group_file_id = first_file_id
        self._group_start = HEADER_BYTES
        self._group_new_file = False
        # Hand-off state.
        self._writing = False
        self._handoff_scheduled = False
        self._hold_seconds = config.adaptive_wait_us / 1e6
        self._hold_timer: asyncio.TimerHandle | None = None  # The filling group waits (`_hold`).
        self._hold_backoff = 0  # Groups still to go at once after a fruitless wait.
        # Lazy records (`append(..., lazy=True)`) wait for a group an eager record causes.
        self._lazy_seconds = config.lazy_record_delay_ms / 1000
        self._group_eager = False  # The filling group holds a record that must go soon.
        self._lazy_timer: asyncio.TimerHandle | None = None  # A lazy-only group's deadline.
        self._force_waiters: list[tuple[JournalMark, asyncio.Future[JournalMark]]] = []
        # Appenders waiting for a group with room (room.py).
        self._room_waiters = deque()
        self._room_wakes = 0
        self._requeued = 0
        self._batch_broken = False
        self._record_bytes_estimate = 1024
        self._failure: BKError | None = None
        # Told once when a write or sync fails and the journal stops: its owner (a shard
        # worker) can no longer promise durability and ends the process (bkaio/supervision.py).
        self.on_failure: Callable[[BKError], None] | None = None
        self._closing = False
        self._closed = False

    @classmethod
    async def open(
        cls,
        config: JournalConfig,
        *,
        sync_function: Callable[[int], None] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        directory: Path | None = None,
        disk: Disk = OS_DISK,
        crash_points: CrashPoints = NO_CRASH_POINTS,
        ack_policy: JournalAckPolicy = ACK_AFTER_SYNC,
        threads: Threads = OS_THREADS,
    ) -> Journal:
        """Open (creating if needed) and lock one journal directory; start a new file in it.

        Does not replay: call `replay` (in an executor) for the files that were there. New
        appends go to a new file after every existing one. `directory` picks one of
        `config.directories`; it may be omitted when there is only one.
        `disk`, `crash_points` and `ack_policy` keep their production defaults except under a
        test entry point (bkaio.journal.disk, bkaio.journal.crash_points, JournalAckPolicy);
        `threads` (the writer's thread) except in the simulation (bkaio.journal.threads).
        """
        directory = choose_directory(config, directory)
        loop = loop if loop is not None else asyncio.get_running_loop()
        opened = await open_directory(
            config,
            directory,
            sync_function=sync_function,
            loop=loop,
            disk=disk,
            crash_points=crash_points,
            ack_policy=ack_policy,
            threads=threads,
        )
        journal = cls(config=config, loop=loop, opened=opened)
        journal._log.info(
            "journal_opened",
            file_id=opened.first_file_id,
            existing_files=opened.files.recovered_file_count,
            sync=config.sync,
        )
        return journal

    # -- Reading back -------------------------------------------------------------------

    def iter_replay(self, after: JournalMark | None) -> JournalReader:
        """Records after `after` in the files that existed at open, one by one. Blocking.

        Iterate it in an executor; afterwards its `end_mark`, `torn_tail`,
        `earlier_torn_tails` and `corruption` describe how replay ended.
        """
        return self._files.reader(after)

    def replay(self, after: JournalMark | None) -> ReplayResult:
        """Every record after `after`, in order, with how replay ended. Blocking."""
        return self.iter_replay(after).result()

    # -- Appending ------------------------------------------------------------------------

    def append(self, record: JournalRecord, *, lazy: bool = False) -> asyncio.Future[JournalMark]:
        """Queue `record`; the future resolves to the mark after it once it is durable.

        For keys, fences, LACs and tests; ledger storage journals entries with
        `append_entries`, which costs no future and no record object per entry.

        `lazy`: the record need not be durable soon (a WRITE_LAC's LAC, whose loss in a crash
        only lowers this bookie's LAC to a lower bound): it causes no group of its own, but goes
        with the next group an eager record or entry causes, or after `lazy_record_delay_ms`
        when none comes (at once when that is 0)."""
        return self._enqueue(encode_record(record), lazy)

    def append_entries(
        self, ledger_id: int, entries: Sequence[JournalEntry]
    ) -> tuple[asyncio.Future[JournalMark], int] | None:
        """Append ENTRY records of one ledger, in order, to the filling group: the add path.

        Every entry appended this way to one group shares one future, resolved with the mark
        after the group's last record (or failed with the group): one future and one loop
        callback per group, however many entries it holds. Returns that future and the offset
        just after the last of these records, in the file of that mark.

        Returns None, having appended nothing, when the filling group is at one of its bounds:
        `await wait_for_room()`, then call again with no await in between, and it appends. A
        batch may cross a bound, as one record may cross the byte bound (so the group holds at
        most one batch more than `max_group_entries`). Raises the journal's failure
        (BookieIOError) or JournalError once it failed or is closing, and RecordError, having
        appended nothing, when a field does not fit a record.
        """
        if self._failure is not None or self._closing:
            self._check_usable()
        data = self._data
        ends = self._ends
        config = self._config
        if len(data) >= config.max_group_bytes or len(ends) >= config.max_group_entries:
            return None  # `_has_room`, inlined: this runs for every add.
        if not ends:
            self._start_group()
        data_before = len(data)
        ends_before = len(ends)
        offset = self._tail_offset
        try:
            for entry in entries:
                payload = entry.payload
                head = encode_entry_head(
                    ledger_id, entry.entry_id, entry.lac, entry.length, entry.digest, payload
                )
                data += head
                data += payload
                offset += len(head) + len(payload)
                ends.append(offset)
        except BaseException:
            del data[data_before:]
            del ends[ends_before:]
            raise
        self._tail_offset = offset
        self._group_eager = True
        appended = len(ends) - ends_before
        if appended == 1:
            self._waiters.append(None)
        else:
            self._waiters += repeat(None, appended)
        if not self._writing:
            if not self._handoff_scheduled:
                self._handoff_scheduled = True
                self._loop.call_soon(self._hand_off)
            elif self._hold_timer is not None:
                self._end_hold()
        shared = self._shared
        if shared is None:
            shared = self._shared = self._loop.create_future()
        return shared, offset

    def append_encoded(self, data: bytes) -> asyncio.Future[JournalMark]:
        """Queue one record already encoded by `encode_record` / `encode_entry`."""
        if len(data) < RECORD_HEADER_BYTES or (
            RECORD_HEADER.unpack_from(data)[1] != len(data) - RECORD_HEADER_BYTES
        ):
            raise RecordError(
                f"journal {self._directory}: {len(data)} bytes are not one encoded record"
            )
        return self._enqueue(data)

    def _enqueue(self, data: bytes, lazy: bool = False) -> asyncio.Future[JournalMark]:
        """Add one encoded record to the filling group (`append`, `append_encoded`).

        Raises JournalFullError when the group is at a bound (await `wait_for_room`), and the
        journal's failure (BookieIOError) or JournalError once it failed or closed.
        """
        if self._failure is not None or self._closing:
            self._check_usable()
        if not self._has_room():
            raise JournalFullError(
                f"journal {self._directory}: next group holds {len(self._ends)} records, "
                f"{len(self._data)} bytes (bounds {self._config.max_group_entries} records, "
                f"{self._config.max_group_bytes} bytes); await wait_for_room()"
            )
        if not self._ends:
            self._start_group()
        self._data += data
        self._tail_offset += len(data)
        self._ends.append(self._tail_offset)
        waiter: asyncio.Future[JournalMark] = self._loop.create_future()
        self._waiters.append(waiter)
        if lazy and not self._group_eager and self._lazy_seconds > 0.0:
            if self._lazy_timer is None:
                self._lazy_timer = self._loop.call_later(self._lazy_seconds, self._lazy_due)
            return waiter
        self._group_eager = True
        if not self._writing:
            if not self._handoff_scheduled:
                self._handoff_scheduled = True
                # Not a timer: every append of this loop iteration joins the group first.
                self._loop.call_soon(self._hand_off)
            elif self._hold_timer is not None:
                self._end_hold()
        return waiter

    async def append_and_wait(self, record: JournalRecord) -> JournalMark:
        """Wait for room, append `record`, and return its mark once it is durable."""
        data = encode_record(record)
        await self.wait_for_room()
        return await self.append_encoded(data)

    def force(self) -> asyncio.Future[JournalMark]:
        """A future that resolves when everything appended so far is durable."""
        self._check_usable(closing_ok=True)
        target = JournalMark(self._tail_file_id, self._tail_offset)
        waiter: asyncio.Future[JournalMark] = self._loop.create_future()
        if self._durable >= target:
            waiter.set_result(self._durable)
        else:
            self._force_waiters.append((target, waiter))
            if self._ends and not self._group_eager:  # Only lazy records fill: they go now.
                if self._lazy_timer is not None:
                    self._lazy_timer.cancel()
                self._lazy_due()
        return waiter

    @property
    def durable_mark(self) -> JournalMark:
        """Everything before this position is on disk (synced, unless sync=False)."""
        return self._durable

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def current_file_id(self) -> int:
        """The file new records go to (the last one; it is never deleted)."""
        return self._tail_file_id

    @property
    def failure(self) -> BKError | None:
        """Why the journal stopped, or None while it works."""
        return self._failure

    def _check_usable(self, *, closing_ok: bool = False) -> None:
        if self._failure is not None:
            raise _copy_error(self._failure)
        if self._closed:
            raise JournalError(f"journal {self._directory} is closed")
        if self._closing and not closing_ok:
            raise JournalError(f"journal {self._directory} is closing")

    def _start_group(self) -> None:
        """Place a new group: in the current file, or at the start of the next one."""
        self._group_new_file = self._tail_offset >= self._config.max_file_bytes
        if self._group_new_file:
            self._tail_file_id += 1
            self._tail_offset = HEADER_BYTES
        self._group_file_id = self._tail_file_id
        self._group_start = self._tail_offset

    # -- Group commit ---------------------------------------------------------------------

    def _hand_off(self, waited: bool = False, timed_out: bool = False) -> None:
        """Give the filling group to the writer thread, if it is free and there is one.

        `waited`: the group waited already (`_hold`), or must not (close, a group that formed
        while the writer was busy); `timed_out`: its wait ran out."""
        self._handoff_scheduled = False
        self._hold_timer = None
        if self._writing or self._failure is not None or not self._ends:
            return
        if not waited and self._hold_seconds > 0.0 and len(self._ends) >= _HOLD_MIN_RECORDS:
            if self._hold_backoff > 0:
                self._hold_backoff -= 1
            elif self._has_room():
                self._hold()
                return
        group = Group(
            data=self._data,
            file_id=self._group_file_id,
            start_offset=self._group_start,
            new_file=self._group_new_file,
            ends=self._ends,
            waiters=self._waiters,
            trigger=self._trigger(timed_out),
            shared=self._shared,
        )
        self._data, self._ends, self._waiters, self._shared = bytearray(), [], [], None
        self._group_eager = False
        if self._lazy_timer is not None:  # Its lazy records leave with this group.
            self._lazy_timer.cancel()
            self._lazy_timer = None
        self._writing = True
        self._executor.post(self._commit_on_writer_thread, group)
        if self._room_waiters:
            self._record_bytes_estimate = max(len(group.data) // len(group.ends), 1)
            self._wake_room_waiters()

    def _hold(self) -> None:
        """Let the filling group (a burst, the writer free) wait for the next append, at most
        `adaptive_wait_us`: the next append ends the wait (`_end_hold`), else the timer."""
        self._handoff_scheduled = True
        self.metrics.holds += 1
        self._hold_timer = self._loop.call_later(self._hold_seconds, self._hold_expired)

    def _end_hold(self) -> None:
        """An append joined a waiting group: it goes once this loop iteration's appends are in
        (or at once when full: waiting longer gains nothing)."""
        timer = self._hold_timer
        assert timer is not None
        timer.cancel()
        self._hold_timer = None
        self._loop.call_soon(self._hand_off, True)

    def _hold_expired(self) -> None:
        """Nothing came while the group waited (a writer waiting for this answer, say): the
        next groups go at once, and waiting is tried again after them."""
        self.metrics.holds_fruitless += 1
        self._hold_backoff = _HOLD_BACKOFF_GROUPS
        self._hand_off(waited=True, timed_out=True)

    def _lazy_due(self) -> None:
        """The filling group, lazy records only, is due (their delay ran out, or a force):
        it goes like any group, now or when the writer is free."""
        self._lazy_timer = None
        if not self._ends or self._failure is not None:
            return
        self._group_eager = True
        if not self._writing and not self._handoff_scheduled:
            self._hand_off(waited=True, timed_out=True)

    def _trigger(self, timed_out: bool) -> str:
        """Why the group goes now (BookKeeper's triggers), counted."""
        stats = self.metrics
        if len(self._data) >= self._config.max_group_bytes:
            stats.trigger_bytes += 1
            return "bytes"
        if len(self._ends) >= self._config.max_group_entries:
            stats.trigger_entries += 1
            return "entries"
        if timed_out:
            stats.trigger_wait += 1
            return "wait"
        stats.trigger_queue_empty += 1
        return "queue_empty"

    def _commit_on_writer_thread(self, group: Group) -> None:
        """Runs on the writer thread: write, sync once, wake the loop once."""
        error: BaseException | None = None
        sync_seconds = 0.0
        try:
            sync_seconds = self._writer.commit(group)
        except BaseException as caught:  # Reported to the loop; this thread must not die silently.
            error = caught
        with contextlib.suppress(RuntimeError):  # A closed loop: nobody is left to tell.
            self._loop.call_soon_threadsafe(self._on_group_done, group, sync_seconds, error)

    def _on_group_done(
        self, group: Group, sync_seconds: float, error: BaseException | None
    ) -> None:
        self._writing = False
        if error is not None:
            self._fail(group, error)
            return
        self.metrics.count_group(group, sync_seconds, synced=self._config.sync)
        self._durable = JournalMark(group.file_id, group.ends[-1])
        if self._ends and self._group_eager and not self._handoff_scheduled:
            # Keep the disk busy before waking anyone; a group that formed during a sync has
            # waited already. (Lazy records alone wait for company or their delay.)
            self._hand_off(waited=True)
        file_id = group.file_id
        # The shared future first: its callbacks (the adds' apply and answer) then run before
        # those of a later fence or LAC record of the same group, in journal order as before.
        shared = group.shared
        if shared is not None and not shared.done():
            shared.set_result(self._durable)
        for end, waiter in zip(group.ends, group.waiters, strict=True):
            if waiter is not None and not waiter.done():  # Its appender may have been cancelled.
                waiter.set_result(JournalMark(file_id, end))
        if self._force_waiters:
            self._resolve_force_waiters()
        if group.new_file:
            self._log.info("journal_rolled", file_id=file_id)
        if sync_seconds >= SLOW_SYNC_SECONDS:
            self._log.warning(
                "journal_fsync_slow",
                fsync_ms=round(sync_seconds * 1000, 2),
                group_records=len(group.ends),
                group_bytes=len(group.data),
            )

    def _resolve_force_waiters(self) -> None:
        durable = self._durable
        still_waiting = []
        for target, waiter in self._force_waiters:
            if target <= durable:
                if not waiter.done():
                    waiter.set_result(durable)
            else:
                still_waiting.append((target, waiter))
        self._force_waiters = still_waiting

    def _fail(self, group: Group, error: BaseException) -> None:
        """Stop for good: fail this group, the filling one and every waiter."""
        failure = BookieIOError(
            f"journal {self._directory}: writing {len(group.ends)} records "
            f"({len(group.data)} bytes) to {file_name(group.file_id)} at offset "
            f"{group.start_offset} failed: {error!r}; the journal has stopped"
        )
        self._failure = failure
        self._log.error("journal_failed", error=repr(error), group_records=len(group.ends))
        waiters = [*group.waiters, group.shared, *self._waiters, self._shared]
        waiters += [waiter for _target, waiter in self._force_waiters]
        self._data, self._ends, self._waiters, self._force_waiters = bytearray(), [], [], []
        self._shared = None
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        for waiter in waiters:
            if waiter is not None and not waiter.done():
                waiter.set_exception(_copy_error(failure))
        self._wake_all_room_waiters()
        if self.on_failure is not None:
            self.on_failure(failure)

    # -- Checkpoints and shutdown ---------------------------------------------------------

    async def delete_files_before(self, mark: JournalMark) -> list[Path]:
        """Delete the files wholly before `mark` (ids below its file's); return their paths.

        `mark` must be durable (<= durable_mark): a checkpoint of ledger storage. The file
        holding the mark, any later file and the file being written are always kept.
        """
        if mark > self._durable:
            raise JournalError(
                f"journal {self._directory}: mark {mark.file_id}:{mark.offset} is beyond the "
                f"durable mark {self._durable.file_id}:{self._durable.offset}; only a durable "
                "checkpoint may release journal files"
            )
        keep_from = min(mark.file_id, self._tail_file_id)
        return await self._files.delete_before(keep_from, mark)

    async def close(self) -> None:
        """Write and sync what is queued, then stop the threads and release the directory."""
        if self._closed or self._closing:
            return
        self._closing = True
        if self._failure is None and self._ends:
            if self._hold_timer is not None:
                self._hold_timer.cancel()
                self._hold_timer = None
                self._handoff_scheduled = False
            if not self._writing and not self._handoff_scheduled:
                self._hand_off(waited=True)
        if self._failure is None:
            try:
                await self.force()
            except BKError as error:
                self._log.warning("journal_close_flush_failed", error=str(error))
        assert not self._writing, "a group is still on the writer thread"
        if self._preallocator is not None:
            await self._loop.run_in_executor(None, self._preallocator.shutdown)
        await asyncio.wrap_future(self._executor.submit(self._release_files))
        self._executor.shutdown(wait=False)
        self._closed = True
        self._log.info(
            "journal_closed", durable_mark=f"{self._durable.file_id}:{self._durable.offset}"
        )

    def _release_files(self) -> None:
        """On the writer thread: close the current file, then give up the directory lock."""
        self._writer.close()
        self._files.unlock()


def _copy_error(error: BKError) -> BKError:
    """A fresh exception per waiter, so tracebacks do not pile up on one shared object."""
    return type(error)(*error.args)


async def open_journal(config: JournalConfig, directory: Path) -> Journal:
    """The journal of one of `config.directories`: the `JournalFactory` (bkaio/wal) a bookie
    hands its ledger storage."""
    return await Journal.open(config, directory=directory)
