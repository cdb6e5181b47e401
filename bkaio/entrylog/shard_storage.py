"""`ShardStorage`: the storage engine of one bookie shard (docs/internal-apis.md, docs/storage.md).

Owns the journal of the shard, the write cache, the entry logs and LMDB indexes of every disk,
per-ledger state (master key, fenced, LAC), checkpoints, compaction, cookies and disk usage.
Must not import `protocol` or `meta`.

Add path: check key/fencing/conflict -> reserve write-cache room -> journal the record -> once
the journal says durable, put it in the write cache and advance the ledger's LAC. A flush
(periodic, or when the cache is half full) swaps the cache, appends to entry logs, fsyncs them,
commits the index, writes `lastMark` and lets the journal drop older files. Every blocking call
runs on the storage thread (writes, one at a time) or the reader pool; the journal has its own
writer thread, so storage fsyncs never share it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import shutil
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from itertools import repeat
from pathlib import Path
from typing import Any, Protocol, TypeVar

import structlog

from bkaio.entrylog.checkpoint import AppliedMarks, MarkSlot, read_last_mark, write_last_mark
from bkaio.entrylog.config import StorageConfig
from bkaio.entrylog.cookie import Cookie, expected_cookie, verify_or_stamp
from bkaio.entrylog.entry_log import EntryLocation, EntryLogDirectory, encode_record
from bkaio.entrylog.index import LedgerIndex
from bkaio.entrylog.types import (
    AddBatch,
    CompactionReport,
    DiskUsage,
    LedgerState,
    StoredEntry,
)
from bkaio.entrylog.write_cache import ENTRY_OVERHEAD_BYTES, WriteCache
from bkaio.errors import (
    BKError,
    BookieIOError,
    EntryConflictError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    TooManyRequestsError,
    UnauthorizedError,
)
from bkaio.journal.config import JournalConfig
from bkaio.journal.crash_points import NO_CRASH_POINTS, CrashPoints
from bkaio.journal.disk import OS_DISK, Disk
from bkaio.journal.journal import Journal
from bkaio.journal.records import (
    EntryRecord,
    FenceRecord,
    JournalMark,
    JournalRecord,
    LacRecord,
    MasterKeyRecord,
)
from bkaio.journal.replay import ReplayResult

__all__ = [
    "CompactionReport",
    "DiskUsage",
    "JournalLike",
    "LedgerState",
    "ShardStorage",
    "StorageConfig",
    "StorageStats",
    "StoredEntry",
]

log = structlog.get_logger(__name__)

UsageFunction = Callable[[Path], tuple[int, int, int]]  # shutil.disk_usage: total, used, free.


class JournalLike(Protocol):
    """The part of `bkaio.journal.Journal` storage uses; stand-ins implement all of it."""

    def append(self, record: JournalRecord) -> asyncio.Future[JournalMark]: ...

    def append_entries(
        self, ledger_id: int, entries: Sequence[StoredEntry]
    ) -> tuple[asyncio.Future[JournalMark], int] | None: ...

    async def wait_for_room(self) -> None: ...

    def replay(self, after: JournalMark | None) -> ReplayResult: ...

    async def delete_files_before(self, mark: JournalMark) -> object: ...

    async def close(self) -> None: ...


JournalFactory = Callable[[JournalConfig, Path], Awaitable[JournalLike]]


async def open_journal(config: JournalConfig, directory: Path) -> JournalLike:
    """The real journal of one directory (ledgers go to journal `config.journal_of(ledger_id)`)."""
    return await Journal.open(config, directory=directory)


_Batch = TypeVar("_Batch", bound=AddBatch)


class _AddGroup:
    """Batches appended back to back to one journal group, applied and answered together.

    They share the group's one future (`Journal.append_entries`), so a group costs one future
    callback however many adds it holds. A group is sealed when the journal starts a new one or
    another record (a key, a fence, a LAC) is appended after it, so its adds are contiguous in
    the journal and one applied-marks slot covers them all.
    """

    __slots__ = ("answers", "end", "entries", "future", "journal_index", "size", "slot")

    def __init__(
        self, future: asyncio.Future[JournalMark], journal_index: int, slot: MarkSlot
    ) -> None:
        self.future = future
        self.journal_index = journal_index
        self.slot = slot
        self.entries: list[StoredEntry] = []
        # Per callback, its batches in add order; one callback in a bookie (the server's).
        self.answers: list[tuple[Callable[[list[Any], BKError | None], None], list[Any]]] = []
        self.end = 0  # Offset after the group's last add, in the file of the group's mark.
        self.size = 0  # Write-cache room reserved for its adds.


SLOW_FLUSH_SECONDS = 1.0  # A flush this slow holds adds back behind a full cache: say so.
FLUSH_JITTER_FRACTION = 0.2  # Periodic flushes come 0.8-1.2 intervals apart (`_next_flush_delay`).


@dataclass(slots=True)
class StorageStats:
    """Counters of one shard's storage, updated on the loop thread (exported by the bookie)."""

    flushes: int = 0
    entries_flushed: int = 0
    bytes_flushed: int = 0
    flush_seconds_total: float = 0.0
    max_flush_seconds: float = 0.0
    checkpoints_written: int = 0
    cache_full_waits: int = 0  # Adds that had to wait for a flush.
    cache_full_rejections: int = 0  # Adds refused with TooManyRequestsError.
    replayed_records: int = 0
    compactions: int = 0
    compaction_entries_moved: int = 0
    compaction_bytes_freed: int = 0
    ledgers_deleted: int = 0


@dataclass(slots=True)
class _Ledger:
    """Mutable per-ledger state, event loop only. `LedgerState` is its frozen snapshot."""

    ledger_id: int
    master_key: bytes
    fenced: bool = False
    lac: int = -1
    explicit_lac: int = -1
    last_entry_id: int = -1
    fence_durable: asyncio.Future[JournalMark] | None = None

    def snapshot(self) -> LedgerState:
        return LedgerState(
            ledger_id=self.ledger_id,
            fenced=self.fenced,
            master_key=self.master_key,
            lac=self.lac,
            explicit_lac=self.explicit_lac,
            last_entry_id=self.last_entry_id,
        )

    @classmethod
    def from_state(cls, state: LedgerState) -> _Ledger:
        return cls(
            ledger_id=state.ledger_id,
            master_key=state.master_key,
            fenced=state.fenced,
            lac=state.lac,
            explicit_lac=state.explicit_lac,
            last_entry_id=state.last_entry_id,
        )


class ShardStorage:
    def __init__(
        self,
        config: StorageConfig,
        journals: list[JournalLike],
        cookie: Cookie,
        logs: list[EntryLogDirectory],
        indexes: list[LedgerIndex],
        states: dict[int, LedgerState],
        usage_function: UsageFunction,
        storage_thread: ThreadPoolExecutor,
        reader_pool: ThreadPoolExecutor,
        crash_points: CrashPoints = NO_CRASH_POINTS,
    ) -> None:
        self.config = config
        self.cookie = cookie
        self._journals = journals
        # Per journal, the group adds are joining now (`_AddGroup`), or None.
        self._groups: list[_AddGroup | None] = [None] * len(journals)
        self._journal_count = len(journals)
        self._ledger_stride = config.ledger_stride  # `config.journal_of`, for the add path.
        self._add_tasks: set[asyncio.Task[None]] = set()  # `_add_carefully`, one per batch.
        self._logs = logs
        self._indexes = indexes
        self._usage_function = usage_function
        self._crash_points = crash_points
        self._storage_thread = storage_thread  # Flush, compaction, deletes: one at a time.
        self._reader_pool = reader_pool
        self._loop = asyncio.get_running_loop()
        self._ledgers = {i: _Ledger.from_state(s) for i, s in states.items()}
        self._dirty: set[int] = set()  # Ledgers whose state changed since the last flush.
        self._active = WriteCache()
        self._flushing = WriteCache()
        self._reserved_bytes = 0  # Room promised to adds that are in the journal.
        # Adds waiting for write-cache room, in arrival order: (bytes, granted future). Room a
        # flush frees goes to them first, and the synchronous add paths decline while any
        # wait: else the adds that keep arriving take the room, and a waiting one starves.
        self._room_waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        # Told True when adds start waiting for room and False once none waits: the bookie
        # then stops reading requests, which leaves the CPU to the flush that makes room.
        self.room_pressure_listener: Callable[[bool], None] | None = None
        self._room_pressure = False
        self._flush_failing = False  # The last periodic flush failed (a full or broken disk).
        self._flush_requested = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._marks = [AppliedMarks(None) for _ in journals]  # One per journal directory.
        self._written_marks: list[JournalMark | None] = [None] * len(journals)
        self._pending: dict[tuple[int, int], tuple[StoredEntry, asyncio.Future[JournalMark]]] = {}
        self._flusher: asyncio.Task[None] | None = None
        # Journal files a checkpoint released are deleted by this task, off the flush path
        # (`_release_journal_files`); the marks of the newest checkpoint it has yet to act on.
        self._releaser: asyncio.Task[None] | None = None
        self._release_marks: list[JournalMark | None] | None = None
        self._closed = False
        self.stats = StorageStats()

    # -- opening and closing ---------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        config: StorageConfig,
        *,
        bookie_id: str,
        shard_index: int,
        shard_count: int,
        instance_id: str = "",
        journal_factory: JournalFactory = open_journal,
        usage_function: UsageFunction = shutil.disk_usage,
        entry_log_disk: Disk = OS_DISK,
        crash_points: CrashPoints = NO_CRASH_POINTS,
    ) -> ShardStorage:
        """Check cookies, open indexes and entry logs, replay the journal, checkpoint.

        `entry_log_disk` is what the entry logs write and sync through, `crash_points` where
        the entry logs and checkpoints may stop the process: production defaults, except under
        a test entry point (bkaio.testing.bookie), which passes the journal's disk."""
        loop = asyncio.get_running_loop()
        storage_thread = ThreadPoolExecutor(1, thread_name_prefix="bkaio-storage")
        reader_pool = ThreadPoolExecutor(4, thread_name_prefix="bkaio-storage-read")
        try:
            cookie, logs, indexes, states, marks = await loop.run_in_executor(
                storage_thread,
                _open_disks,
                config,
                expected_cookie(
                    bookie_id=bookie_id,
                    shard_index=shard_index,
                    shard_count=shard_count,
                    journal_dirs=config.journal.directories,
                    ledger_dirs=config.ledger_dirs,
                    index_dirs=config.index_dirs,
                    instance_id=instance_id,
                ),
                entry_log_disk,
                crash_points,
            )
        except BaseException:
            storage_thread.shutdown()
            reader_pool.shutdown()
            raise
        journals: list[JournalLike] = []
        try:
            for directory in config.journal.directories:
                journals.append(await journal_factory(config.journal, directory))
        except BaseException:
            for journal in journals:
                await journal.close()
            await loop.run_in_executor(storage_thread, _close_disks, logs, indexes)
            storage_thread.shutdown()
            reader_pool.shutdown()
            raise
        storage = cls(
            config,
            journals,
            cookie,
            logs,
            indexes,
            states,
            usage_function,
            storage_thread,
            reader_pool,
            crash_points,
        )
        storage._written_marks = list(marks)
        try:
            for journal_index, mark in enumerate(marks):
                await storage._replay(journal_index, mark)
            await storage.checkpoint()
        except BaseException:
            await storage.close()
            raise
        storage._flusher = asyncio.create_task(storage._flush_loop(), name="bkaio-storage-flush")
        return storage

    async def _replay(self, journal_index: int, mark: JournalMark | None) -> None:
        journal = self._journals[journal_index]
        result = await self._loop.run_in_executor(self._reader_pool, journal.replay, mark)
        for corruption in result.corruption:
            log.error(
                "journal_corruption",
                file=str(corruption.file),
                offset=corruption.offset,
                reason=corruption.reason,
            )
        if result.corruption:
            first = result.corruption[0]
            raise BookieIOError(
                f"journal {first.file} is corrupt at offset {first.offset} ({first.reason}) "
                "with valid records after it: acknowledged data may be damaged; refusing to start"
            )
        if result.torn_tail is not None:
            tail = result.torn_tail
            log.warning(
                "journal_torn_tail", file=str(tail.file), offset=tail.offset, reason=tail.reason
            )
        for tail in result.earlier_torn_tails:
            log.info("journal_earlier_torn_tail", file=str(tail.file), offset=tail.offset)
        counts = {"entries": 0, "keys": 0, "fences": 0, "lacs": 0}
        for _mark, record in result.records:
            self._apply_record(record, counts)
        self.stats.replayed_records += len(result.records)
        self._marks[journal_index].advance(result.end_mark)
        log.info(
            "journal_replayed",
            journal=journal_index,
            after=None if mark is None else f"{mark.file_id}:{mark.offset}",
            end=f"{result.end_mark.file_id}:{result.end_mark.offset}",
            **counts,
        )

    def _apply_record(self, record: JournalRecord, counts: dict[str, int]) -> None:
        if isinstance(record, EntryRecord):
            entry = StoredEntry(
                record.ledger_id,
                record.entry_id,
                record.lac,
                record.length,
                record.digest,
                record.payload,
            )
            ledger = self._ledgers.get(entry.ledger_id)
            if ledger is None:  # Its key record precedes the checkpoint; state lost: skip.
                log.warning("replay_entry_without_ledger", ledger_id=entry.ledger_id)
                return
            self._apply_entry(entry)
            counts["entries"] += 1
        elif isinstance(record, MasterKeyRecord):
            if record.ledger_id not in self._ledgers:
                self._ledgers[record.ledger_id] = _Ledger(record.ledger_id, record.master_key)
                self._dirty.add(record.ledger_id)
            counts["keys"] += 1
        elif isinstance(record, FenceRecord):
            ledger = self._ledgers.get(record.ledger_id)
            if ledger is not None:
                ledger.fenced = True
                self._dirty.add(record.ledger_id)
            counts["fences"] += 1
        elif isinstance(record, LacRecord):
            self._apply_lac(record.ledger_id, record.lac)
            counts["lacs"] += 1

    async def close(self, *, checkpoint: bool = True) -> None:
        """Flush and checkpoint, close the journal and every file. Idempotent.

        `checkpoint=False` skips the final flush (a fast stop: the next open replays the
        journal), which is also how tests imitate a crash after the journal acknowledged."""
        if self._closed:
            return
        if self._flusher is not None:
            async with self._flush_lock:  # Never cancel a flush halfway.
                self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        for task in list(self._add_tasks):  # Waiting for room or a read: they fail now.
            task.cancel()
        if self._add_tasks:
            await asyncio.wait(list(self._add_tasks))
        try:
            if self._pending:
                await asyncio.wait([future for _entry, future in self._pending.values()])
            if checkpoint:
                with contextlib.suppress(BKError, OSError):
                    await self.checkpoint()
        finally:
            if self._releaser is not None:  # Deletions in progress finish before the close.
                await asyncio.wait([self._releaser])
            self._closed = True
            try:
                for journal in self._journals:
                    with contextlib.suppress(BKError):
                        await journal.close()
            finally:
                await self._loop.run_in_executor(
                    self._storage_thread, _close_disks, self._logs, self._indexes
                )
                self._storage_thread.shutdown()
                self._reader_pool.shutdown()

    def _check_open(self) -> None:
        if self._closed:
            raise BookieIOError("ledger storage is closed")

    # -- adds --------------------------------------------------------------------------------

    def add_entries(
        self, batch: _Batch, on_durable: Callable[[list[_Batch], BKError | None], None]
    ) -> None:
        """Make `batch` durable; then `on_durable(batches of its journal group, error)`.

        The one add path (`LedgerStorage.add_entries`). The common batch, to a ledger whose key
        storage holds and the batch carries, not fenced (unless a recovery add), every entry
        above the ledger's last one and none in flight, with room in the write cache and nobody
        waiting for it, and room in the journal's filling group, is journaled before this
        returns: no task, no future of its own. Once its group is durable its entries are put
        in the write cache, in journal order, and `on_durable` runs once for every batch of the
        group. Anything else goes to `_add_later`, one task for the batch. Never raises.
        """
        ledger = self._ledgers.get(batch.ledger_id)
        if (
            ledger is not None
            and not self._closed
            and ledger.master_key
            and ledger.master_key == batch.master_key
            and (not ledger.fenced or batch.recovery)
            and not self._room_waiters
        ):
            ledger_id = batch.ledger_id
            entries = batch.entries
            pending = self._pending
            previous = ledger.last_entry_id
            keys: list[tuple[int, int]] = []
            size = 0
            for entry in entries:
                entry_id = entry.entry_id
                key = (ledger_id, entry_id)
                if entry_id <= previous or key in pending:
                    break  # A possible duplicate: `_add_later` looks at it.
                previous = entry_id
                keys.append(key)
                size += len(entry.payload)
            else:
                size += len(entries) * ENTRY_OVERHEAD_BYTES  # cached_bytes of each.
                # `_cached_bytes` and `config.journal_of`, inlined: this runs for every add.
                cached = self._active.bytes + self._flushing.bytes + self._reserved_bytes
                if cached + size <= self.config.write_cache_bytes:
                    journal_index = (
                        0
                        if self._journal_count == 1
                        else (ledger_id // self._ledger_stride) % self._journal_count
                    )
                    try:
                        appended = self._journals[journal_index].append_entries(ledger_id, entries)
                    except BKError:
                        appended = None  # `_add_later` meets the error again and reports it.
                    if appended is not None:
                        self._reserved_bytes += size
                        self._join_group(
                            journal_index, appended, batch, on_durable, entries, keys, size
                        )
                        return
        self._add_later(batch, on_durable)

    def holds_key(self, ledger_id: int) -> bool:
        ledger = self._ledgers.get(ledger_id)
        return ledger is not None and bool(ledger.master_key)

    def _cached_bytes(self) -> int:
        """Write-cache bytes held or promised: the active cache, the flushing one, reserved."""
        return self._active.bytes + self._flushing.bytes + self._reserved_bytes

    def _join_group(
        self,
        journal_index: int,
        appended: tuple[asyncio.Future[JournalMark], int],
        batch: AddBatch,
        on_durable: Callable[[list[Any], BKError | None], None],
        entries: list[StoredEntry],
        keys: list[tuple[int, int]],
        size: int,
    ) -> None:
        """Add a just-journaled batch (`entries`: those of it that were journaled, `keys` theirs)
        to its journal group's `_AddGroup` (opened on the group's first batch)."""
        future, end = appended
        group = self._groups[journal_index]
        if group is None or group.future is not future:
            group = _AddGroup(future, journal_index, self._marks[journal_index].begin())
            self._groups[journal_index] = group
            future.add_done_callback(partial(self._group_durable, group))
        group.entries += entries
        group.end = end
        group.size += size
        answers = group.answers
        if answers and answers[-1][0] == on_durable:  # `==`: a bound method fetched again.
            answers[-1][1].append(batch)
        else:
            answers.append((on_durable, [batch]))
        if len(keys) == 1:
            self._pending[keys[0]] = (entries[0], future)
        else:
            self._pending.update(zip(keys, zip(entries, repeat(future)), strict=True))

    def _group_durable(self, group: _AddGroup, done: asyncio.Future[JournalMark]) -> None:
        """A group is durable (or failed): apply its adds in order, then answer its batches."""
        if self._groups[group.journal_index] is group:
            self._groups[group.journal_index] = None
        pending = self._pending
        entries = group.entries
        for entry in entries:
            pending.pop((entry.ledger_id, entry.entry_id), None)
        self._reserved_bytes -= group.size
        marks = self._marks[group.journal_index]
        error: BKError | None = None
        if done.cancelled():
            error = BookieIOError("the journal closed before the adds were durable")
        else:
            failure = done.exception()
            if failure is not None:
                error = failure if isinstance(failure, BKError) else BookieIOError(repr(failure))
        if error is not None:
            self._room_freed()
            marks.finish(group.slot, None)
        else:
            self._apply_entries(entries)
            marks.finish(group.slot, JournalMark(done.result().file_id, group.end))
        for on_durable, batches in group.answers:
            try:
                on_durable(batches, error)
            except Exception:  # One caller's failure must not leave the others unanswered.
                log.exception("add_callback_failed")

    def _add_later(
        self, batch: _Batch, on_durable: Callable[[list[_Batch], BKError | None], None]
    ) -> None:
        """The batch the common path did not take, in a task of its own (`_add_carefully`)."""
        task = self._loop.create_task(self._add_carefully(batch, on_durable))
        self._add_tasks.add(task)
        task.add_done_callback(self._add_tasks.discard)

    async def _add_carefully(
        self, batch: _Batch, on_durable: Callable[[list[_Batch], BKError | None], None]
    ) -> None:
        try:
            joined = await self._add_checked(batch, on_durable)
        except BKError as error:
            on_durable([batch], error)
        except asyncio.CancelledError:  # Storage is closing under it.
            on_durable([batch], BookieIOError("ledger storage closed before the add"))
            raise
        except Exception as error:
            log.exception("add_failed", ledger_id=batch.ledger_id)
            on_durable([batch], BookieIOError(f"add failed: {error!r}"))
        else:
            if not joined:  # Nothing to journal: every entry was there already.
                on_durable([batch], None)

    async def _add_checked(
        self, batch: AddBatch, on_durable: Callable[[list[Any], BKError | None], None]
    ) -> bool:
        """Check the batch as a whole (key, fencing) and each entry (a re-add of a stored or
        in-flight entry is fine when identical, a conflict when not), wait for write-cache and
        journal room, journal what is new. True once the batch joined a journal group (its
        answer then comes from there); False when there was nothing new to journal."""
        ledger_id = batch.ledger_id
        for entry in batch.entries:
            _check_ids(ledger_id, entry.entry_id)
        journal_index = self.config.journal_of(ledger_id)
        journal = self._journals[journal_index]
        while True:
            self._check_open()
            self._check_key(ledger_id, batch.master_key, batch.recovery)
            fresh, in_flight = await self._new_entries(batch)
            if not fresh:
                if in_flight:  # Identical adds in flight: durable when those are.
                    await asyncio.wait(in_flight)  # wait(), not gather(): never cancels them.
                    for future in in_flight:
                        if future.cancelled() or future.exception() is not None:
                            raise BookieIOError(
                                f"ledger {ledger_id}: the identical add in flight failed"
                            )
                return False
            size = sum(len(entry.payload) for entry in fresh) + len(fresh) * ENTRY_OVERHEAD_BYTES
            await self._reserve(size, ledger_id, fresh[0].entry_id)
            joined = False
            try:
                await journal.wait_for_room()
                # No await from these checks to the append: they see one state.
                self._check_open()
                self._check_key(ledger_id, batch.master_key, batch.recovery)
                if self._any_stored_or_in_flight(ledger_id, fresh):
                    continue  # Added meanwhile by someone else: look again.
                if ledger_id not in self._ledgers:
                    self._create_ledger(ledger_id, batch.master_key)
                appended = journal.append_entries(ledger_id, fresh)
                if appended is None:
                    continue  # The key record filled the group: wait for room again.
                keys = [(ledger_id, entry.entry_id) for entry in fresh]
                self._join_group(journal_index, appended, batch, on_durable, fresh, keys, size)
                joined = True
                return True
            finally:
                if not joined:  # Not journaled: give the cache room back.
                    self._reserved_bytes -= size
                    self._room_freed()

    def _check_key(self, ledger_id: int, master_key: bytes, recovery: bool) -> None:
        """The one key and fencing check of an add (the common path inlines its condition)."""
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            return
        if ledger.master_key != master_key:
            raise UnauthorizedError(
                f"ledger {ledger_id}: add with a master key that differs from the one "
                "recorded at creation"
            )
        if ledger.fenced and not recovery:
            raise LedgerFencedError(
                f"ledger {ledger_id} is fenced: adds refused (only recovery adds are accepted)"
            )

    async def _new_entries(
        self, batch: AddBatch
    ) -> tuple[list[StoredEntry], list[asyncio.Future[JournalMark]]]:
        """The batch's entries not stored or in flight yet, and the futures of the identical
        ones in flight. A different entry under a stored id is a failure of that add alone
        (`batch.failures`); an identical one is accepted as it is."""
        ledger_id = batch.ledger_id
        ledger = self._ledgers.get(ledger_id)
        fresh: list[StoredEntry] = []
        in_flight: list[asyncio.Future[JournalMark]] = []
        failures: dict[int, BKError] = {}
        for index, entry in enumerate(batch.entries):
            entry_id = entry.entry_id
            existing: StoredEntry | None = None
            pending = self._pending.get((ledger_id, entry_id))
            if pending is not None:
                existing = pending[0]
            else:
                existing = self._cached(ledger_id, entry_id)
                if existing is None and ledger is not None and entry_id <= ledger.last_entry_id:
                    existing = await self._read_indexed(ledger_id, entry_id)
            if existing is None:
                fresh.append(entry)
            elif not entry.same_content(existing):
                failures[index] = EntryConflictError(
                    f"ledger {ledger_id}: entry {entry_id} is already stored with digest "
                    f"{existing.digest:#010x}, {len(existing.payload)} bytes; the add carries "
                    f"digest {entry.digest:#010x}, {len(entry.payload)} bytes"
                )
            elif pending is not None:
                in_flight.append(pending[1])
        batch.failures = failures or None
        return fresh, in_flight

    def _any_stored_or_in_flight(self, ledger_id: int, entries: list[StoredEntry]) -> bool:
        ledger = self._ledgers.get(ledger_id)
        last = ledger.last_entry_id if ledger is not None else -1
        pending = self._pending
        for entry in entries:
            entry_id = entry.entry_id
            if (
                entry_id <= last
                or (ledger_id, entry_id) in pending
                or self._cached(ledger_id, entry_id) is not None
            ):
                return True
        return False

    def _create_ledger(self, ledger_id: int, master_key: bytes) -> _Ledger:
        """First sight of a ledger: its key is journaled before anything else of it."""
        ledger = _Ledger(ledger_id, master_key)
        self._append_record(ledger_id, MasterKeyRecord(ledger_id, master_key))
        self._ledgers[ledger_id] = ledger
        self._dirty.add(ledger_id)
        return ledger

    def _append_record(
        self,
        ledger_id: int,
        record: JournalRecord,
        apply: Callable[[asyncio.Future[JournalMark]], bool] | None = None,
    ) -> asyncio.Future[JournalMark]:
        """Journal a record; `apply` runs once it is durable (or failed), in journal order.

        Records whose effect is applied in memory before they are durable (keys, fences,
        LACs) pass no `apply`: their mark counts as applied once durable."""
        journal_index = self.config.journal_of(ledger_id)
        self._groups[journal_index] = None  # Later adds go after this record: a new group.
        marks = self._marks[journal_index]
        slot = marks.begin()
        try:
            future = self._journals[journal_index].append(record)
        except BaseException:
            marks.finish(slot, None)
            raise

        def durable(done: asyncio.Future[JournalMark]) -> None:
            ok = not done.cancelled() and done.exception() is None
            if apply is not None:
                ok = apply(done) and ok
            marks.finish(slot, done.result() if ok else None)

        future.add_done_callback(durable)
        return future

    def _journal_of(self, ledger_id: int) -> JournalLike:
        return self._journals[self.config.journal_of(ledger_id)]

    def _apply_entry(self, entry: StoredEntry) -> None:
        ledger = self._ledgers.get(entry.ledger_id)
        if ledger is None:  # Deleted while the add was in the journal: nothing to keep it for.
            return
        self._active.put(entry)
        self._dirty.add(entry.ledger_id)
        if entry.entry_id > ledger.last_entry_id:
            ledger.last_entry_id = entry.entry_id
        self._raise_lac(ledger, entry.lac)
        if self._active.bytes >= self.config.write_cache_bytes // 2 or self._room_waiters:
            self._flush_requested.set()

    def _apply_entries(self, entries: list[StoredEntry]) -> None:
        """`_apply_entry` for each of a batch's entries, in order, with the lookups hoisted."""
        ledgers = self._ledgers
        cache = self._active
        dirty = self._dirty
        raised: dict[int, int] = {}  # Ledger -> highest LAC of its entries in the batch.
        kept: list[StoredEntry] = []
        for entry in entries:
            ledger_id = entry.ledger_id
            ledger = ledgers.get(ledger_id)
            if ledger is None:  # Deleted while the add was in the journal.
                continue
            kept.append(entry)
            dirty.add(ledger_id)
            if entry.entry_id > ledger.last_entry_id:
                ledger.last_entry_id = entry.entry_id
            if entry.lac > ledger.lac and entry.lac > raised.get(ledger_id, -1):
                raised[ledger_id] = entry.lac
        cache.put_many(kept)
        # Long polls woken once per ledger and batch, with the batch's LAC: a waiter's answer
        # is the ledger's LAC when it is woken, which is this one either way.
        for ledger_id, lac in raised.items():
            self._raise_lac(ledgers[ledger_id], lac)
        if cache.bytes >= self.config.write_cache_bytes // 2 or self._room_waiters:
            self._flush_requested.set()  # Waiting adds need what the flush frees.

    def _apply_lac(self, ledger_id: int, lac: int) -> None:
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            return
        ledger.explicit_lac = max(ledger.explicit_lac, lac)
        self._dirty.add(ledger_id)
        self._raise_lac(ledger, lac)

    def _raise_lac(self, ledger: _Ledger, lac: int) -> None:
        if lac > ledger.lac:
            ledger.lac = lac

    async def _reserve(self, size: int, ledger_id: int, entry_id: int) -> None:
        """Wait for write-cache room, at most `write_cache_max_wait_seconds`; first come,
        first served."""
        limit = self.config.write_cache_bytes
        if (
            not self._room_waiters
            and self._active.bytes + self._flushing.bytes + self._reserved_bytes + size <= limit
        ):
            self._reserved_bytes += size  # The common case: no timer, no wait.
            return
        self.stats.cache_full_waits += 1
        granted: asyncio.Future[None] = self._loop.create_future()
        waiter = (size, granted)
        self._room_waiters.append(waiter)
        self._flush_requested.set()
        if not self._room_pressure and not self._flush_failing:
            self._set_room_pressure(True)
        self._grant_room()  # The cache may be empty: an oversized add then goes alone.
        try:
            async with asyncio.timeout(self.config.write_cache_max_wait_seconds):
                await asyncio.shield(granted)
        except TimeoutError:
            if not granted.done():
                self._room_waiters.remove(waiter)
                self._grant_room()  # Those behind it may fit.
                self.stats.cache_full_rejections += 1
                raise TooManyRequestsError(
                    f"ledger {ledger_id}: entry {entry_id} waited "
                    f"{self.config.write_cache_max_wait_seconds}s for room in the "
                    f"{limit}-byte write cache; flushes are falling behind"
                ) from None
        except asyncio.CancelledError:
            if granted.done():
                self._reserved_bytes -= size  # Granted, but its add will not happen.
            else:
                self._room_waiters.remove(waiter)
            self._grant_room()
            raise
        # Granted: `_grant_room` reserved the bytes for it.

    def _room_freed(self) -> None:
        """Write-cache room came back (a flush ended, a reservation was returned)."""
        if self._room_waiters:
            self._grant_room()

    def _grant_room(self) -> None:
        """Reserve room for the waiting adds, oldest first, while it lasts; one that finds the
        cache empty goes even if larger than the cache (it could never fit otherwise)."""
        waiters = self._room_waiters
        limit = self.config.write_cache_bytes
        while waiters:
            size, granted = waiters[0]
            cached = self._active.bytes + self._flushing.bytes + self._reserved_bytes
            if cached + size > limit and cached > 0:
                return  # The next flush (requested as adds are applied) frees more.
            waiters.popleft()
            self._reserved_bytes += size
            granted.set_result(None)
        if self._room_pressure:
            self._set_room_pressure(False)

    def _set_room_pressure(self, waiting: bool) -> None:
        self._room_pressure = waiting
        listener = self.room_pressure_listener
        if listener is not None:
            try:
                listener(waiting)
            except Exception:  # The adds must go on whatever the listener does.
                log.exception("room_pressure_listener_failed")

    async def fence(self, ledger_id: int, master_key: bytes) -> None:
        """Fence the ledger (creating it if unknown); durable when it returns. Idempotent."""
        self._check_open()
        _check_ids(ledger_id, 0)
        await self._journal_of(ledger_id).wait_for_room()
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            ledger = self._create_ledger(ledger_id, master_key)
        elif ledger.master_key != master_key:
            raise UnauthorizedError(
                f"ledger {ledger_id}: fence with a master key that differs from the recorded one"
            )
        # Adds that passed the fencing check before now must be applied before we answer, so
        # that a recovery reading after the fence sees them.
        earlier = [f for (lid, _e), (_x, f) in self._pending.items() if lid == ledger_id]
        if not ledger.fenced:
            ledger.fenced = True
            self._dirty.add(ledger_id)
            ledger.fence_durable = self._append_record(ledger_id, FenceRecord(ledger_id))
        if ledger.fence_durable is not None:
            await asyncio.shield(ledger.fence_durable)
        if earlier:
            await asyncio.wait(earlier)  # wait(), not gather(): never cancels the adds.

    async def write_lac(self, ledger_id: int, master_key: bytes, lac: int) -> None:
        """Store an explicit LAC (WRITE_LAC); durable when it returns."""
        self._check_open()
        _check_ids(ledger_id, 0)
        await self._journal_of(ledger_id).wait_for_room()
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            ledger = self._create_ledger(ledger_id, master_key)
        elif ledger.master_key != master_key:
            raise UnauthorizedError(
                f"ledger {ledger_id}: write_lac with a master key that differs from the "
                "recorded one"
            )
        self._apply_lac(ledger_id, lac)
        await asyncio.shield(self._append_record(ledger_id, LacRecord(ledger_id, lac)))

    async def force(self, ledger_id: int) -> None:
        """Everything added to the ledger before this call is durable when it returns."""
        self._check_open()
        earlier = [f for (lid, _e), (_x, f) in self._pending.items() if lid == ledger_id]
        if earlier:
            await asyncio.wait(earlier)  # wait(), not gather(): never cancels the adds.

    # -- reads -----------------------------------------------------------------------------

    def ledger_state(self, ledger_id: int) -> LedgerState | None:
        ledger = self._ledgers.get(ledger_id)
        return None if ledger is None else ledger.snapshot()

    def last_add_confirmed(self, ledger_id: int) -> int:
        return self._ledger(ledger_id).lac

    def ledger_ids(self) -> list[int]:
        return sorted(self._ledgers)

    def _ledger(self, ledger_id: int) -> _Ledger:
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} is not stored on this bookie shard")
        return ledger

    def _cached(self, ledger_id: int, entry_id: int) -> StoredEntry | None:
        entry = self._active.get(ledger_id, entry_id)
        return entry if entry is not None else self._flushing.get(ledger_id, entry_id)

    async def _read_indexed(self, ledger_id: int, entry_id: int) -> StoredEntry | None:
        run = await self._loop.run_in_executor(
            self._reader_pool, self._read_run_blocking, ledger_id, entry_id, 1, 1
        )
        return run[0] if run else None

    def _read_run_blocking(
        self, ledger_id: int, first_entry_id: int, max_count: int, max_bytes: int
    ) -> list[StoredEntry]:
        """Consecutive indexed entries from `first_entry_id` (reader pool)."""
        disk = self.config.disk_of(ledger_id)
        index = self._indexes[disk]
        entries: list[StoredEntry] = []
        total_bytes = 0
        for location in index.get_run(ledger_id, first_entry_id, max_count):
            entry_id = first_entry_id + len(entries)
            entry = self._read_location_blocking(ledger_id, entry_id, location)
            if entry is None:
                break
            total_bytes += len(entry.payload)
            if entries and total_bytes > max_bytes:
                break
            entries.append(entry)
        return entries

    def _read_location_blocking(
        self, ledger_id: int, entry_id: int, location: EntryLocation | None
    ) -> StoredEntry | None:
        disk = self.config.disk_of(ledger_id)
        for _attempt in range(3):  # Compaction may move the entry between lookup and read.
            if location is None:
                return None
            entry = self._logs[disk].read(location)
            if entry is not None:
                if (entry.ledger_id, entry.entry_id) != (ledger_id, entry_id):
                    raise BookieIOError(
                        f"{self._logs[disk].directory}: location {location} of ledger "
                        f"{ledger_id} entry {entry_id} holds ledger {entry.ledger_id} entry "
                        f"{entry.entry_id}: index and entry log disagree"
                    )
                return entry
            location = self._indexes[disk].get(ledger_id, entry_id)
        raise BookieIOError(f"ledger {ledger_id}: entry {entry_id} keeps moving under compaction")

    async def read_range(
        self, ledger_id: int, first_entry_id: int, max_count: int, max_bytes: int
    ) -> list[StoredEntry]:
        """Consecutive entries from `first_entry_id` (-1: the last entry stored), stopping at
        the first missing entry, at `max_count`, or before going over `max_bytes` (the first
        entry is always returned). The one read of storage: a single entry is a range of one.
        NoSuchLedgerError for a ledger not stored here; NoSuchEntryError when `first_entry_id`
        itself is missing (never an empty list, unless `max_count` is 0)."""
        self._check_open()
        ledger = self._ledger(ledger_id)
        if first_entry_id == -1:
            first_entry_id = ledger.last_entry_id
            if first_entry_id < 0:
                raise NoSuchEntryError(f"ledger {ledger_id} has no entries on this bookie shard")
        elif first_entry_id < 0:
            raise NoSuchEntryError(f"ledger {ledger_id}: entry id {first_entry_id} is invalid")
        entries: list[StoredEntry] = []
        total_bytes = 0
        next_id = first_entry_id
        while len(entries) < max_count:
            cached = self._cached(ledger_id, next_id)
            if cached is not None:
                batch = [cached]
            else:
                batch = await self._loop.run_in_executor(
                    self._reader_pool,
                    self._read_run_blocking,
                    ledger_id,
                    next_id,
                    max_count - len(entries),
                    max(max_bytes - total_bytes, 1),
                )
                if not batch:
                    break
            for entry in batch:
                if entries and total_bytes + len(entry.payload) > max_bytes:
                    return entries
                entries.append(entry)
                total_bytes += len(entry.payload)
            next_id += len(batch)
        if not entries and max_count > 0:
            raise NoSuchEntryError(
                f"ledger {ledger_id}: entry {first_entry_id} is not stored on this bookie shard "
                f"(last entry {ledger.last_entry_id})"
            )
        return entries

    async def list_entries(self, ledger_id: int) -> list[tuple[int, int]]:
        """The entries of the ledger stored here, as ascending inclusive ranges."""
        self._check_open()
        self._ledger(ledger_id)
        disk = self.config.disk_of(ledger_id)
        indexed = await self._loop.run_in_executor(
            self._reader_pool, self._indexes[disk].entry_ids, ledger_id
        )
        ids = set(indexed)
        ids.update(self._active.entry_ids(ledger_id))
        ids.update(self._flushing.entry_ids(ledger_id))
        return _ranges(sorted(ids))

    # -- flush, checkpoint, delete, compaction --------------------------------------------

    def _next_flush_delay(self) -> float:
        """The periodic flush's interval, spread by +-FLUSH_JITTER_FRACTION at random.

        Bookies started together would otherwise flush together for ever. A flush writes and
        syncs entry logs on the same kind of disk as the journals; when two bookies of a write
        set flush at once, their journal syncs are slow at once, and with Qa = 2 of 3 that is
        what the client waits for. Spread, a flush rarely meets another bookie's.
        """
        spread = FLUSH_JITTER_FRACTION
        return self.config.flush_interval_seconds * random.uniform(1.0 - spread, 1.0 + spread)

    async def _flush_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._next_flush_delay()):
                    await self._flush_requested.wait()
            self._flush_requested.clear()
            try:
                self._check_open()
                async with self._flush_lock:
                    await self._checkpoint_locked()  # Not waiting for journal deletions.
            except BKError as error:
                log.error("storage_flush_failed", error=str(error))
                # No room will come soon: the bookie reads requests again (reads and fences
                # go on), and waiting adds get TOO_MANY_REQUESTS at the end of their wait.
                self._flush_failing = True
                if self._room_pressure:
                    self._set_room_pressure(False)
            else:
                self._flush_failing = False

    async def checkpoint(self) -> None:
        """Flush the write cache to entry logs and indexes, then record the journal mark.

        Returns once the journal files the checkpoint released are deleted too (the periodic
        flush does not wait for that)."""
        self._check_open()
        async with self._flush_lock:
            await self._checkpoint_locked()
        while self._releaser is not None:
            await asyncio.wait([self._releaser])

    async def _checkpoint_locked(self) -> None:
        assert self._flush_lock.locked()
        marks = [applied.applied for applied in self._marks]
        flushing, self._active = self._active, WriteCache()
        self._flushing = flushing
        states = [self._ledgers[i].snapshot() for i in self._dirty if i in self._ledgers]
        dirty, self._dirty = self._dirty, set()
        write_mark = marks != self._written_marks
        started = self._loop.time()
        try:
            if len(flushing) or states or write_mark:
                await self._loop.run_in_executor(
                    self._storage_thread,
                    self._flush_blocking,
                    flushing,
                    states,
                    marks if write_mark else None,
                )
        except BaseException:
            for entry in flushing:  # Keep them readable and flush them next time.
                if self._active.get(entry.ledger_id, entry.entry_id) is None:
                    self._active.put(entry)
            self._dirty |= dirty
            raise
        finally:
            self._flushing = WriteCache()
            self._room_freed()
        self._count_flush(flushing, self._loop.time() - started, write_mark)
        if write_mark:
            self._written_marks = marks
            self._release_journal_files(marks)

    def _release_journal_files(self, marks: list[JournalMark | None]) -> None:
        """Delete the journal files before `marks` (durable in every ledger directory now).

        In a task of its own: freeing a 256 MiB file takes a few hundred ms on purpose (see
        `bkaio.journal.files.delete_gradually`), and flushes must not wait behind it, or adds
        wait for room in the write cache. A newer checkpoint's marks replace older ones.
        """
        self._release_marks = marks
        if self._releaser is None:
            self._releaser = self._loop.create_task(self._release_loop(), name="journal-release")

    async def _release_loop(self) -> None:
        try:
            while self._release_marks is not None:
                marks, self._release_marks = self._release_marks, None
                for journal, mark in zip(self._journals, marks, strict=True):
                    if mark is None:
                        continue
                    try:
                        await journal.delete_files_before(mark)
                    except BKError as error:  # The next checkpoint tries again.
                        log.error("journal_release_failed", error=str(error))
        finally:
            self._releaser = None

    def _count_flush(self, flushing: WriteCache, seconds: float, wrote_mark: bool) -> None:
        stats = self.stats
        stats.flushes += 1
        stats.entries_flushed += len(flushing)
        stats.bytes_flushed += flushing.bytes
        stats.flush_seconds_total += seconds
        stats.max_flush_seconds = max(stats.max_flush_seconds, seconds)
        stats.checkpoints_written += 1 if wrote_mark else 0
        if seconds >= SLOW_FLUSH_SECONDS:
            log.warning(
                "storage_flush_slow",
                flush_ms=round(seconds * 1000, 2),
                entries=len(flushing),
                cache_bytes=flushing.bytes,
            )

    def _flush_blocking(
        self,
        flushing: WriteCache,
        states: list[LedgerState],
        marks: list[JournalMark | None] | None,
    ) -> None:
        """Storage thread: entry logs, fsync, index commit, then lastMark everywhere."""
        disk_count = self.config.disk_count
        states_by_disk: list[list[LedgerState]] = [[] for _ in range(disk_count)]
        for state in states:
            states_by_disk[self.config.disk_of(state.ledger_id)].append(state)
        for disk, entries in enumerate(flushing.sorted_by_disk(disk_count, self.config.disk_of)):
            if not entries and not states_by_disk[disk]:
                continue
            locations = self._logs[disk].append_synced(entries, self.config.flush_sync_bytes)
            self._indexes[disk].commit_entries(entries, locations, states_by_disk[disk])
        if marks is not None:
            for directory in self.config.ledger_dirs:
                write_last_mark(directory, marks, self._crash_points)

    async def delete_ledger(self, ledger_id: int) -> None:
        """Drop the ledger's entries and state. Space returns at the next compaction."""
        await self.delete_ledgers([ledger_id])

    async def delete_ledgers(self, ledger_ids: Iterable[int]) -> list[int]:
        """Drop several ledgers with one checkpoint (GC); returns those that existed."""
        self._check_open()
        async with self._flush_lock:
            doomed = sorted({i for i in ledger_ids if i in self._ledgers})
            if not doomed:
                return []
            # Checkpoint first, so that a restart does not replay the ledgers back to life.
            await self._checkpoint_locked()
            for ledger_id in doomed:
                self._ledgers.pop(ledger_id, None)
                self._dirty.discard(ledger_id)
                self._active.remove_ledger(ledger_id)
            removed = await self._loop.run_in_executor(
                self._storage_thread, self._delete_blocking, doomed
            )
        self.stats.ledgers_deleted += len(doomed)
        log.info("ledgers_deleted", ledger_ids=doomed, index_entries=removed)
        return doomed

    def _delete_blocking(self, ledger_ids: list[int]) -> int:
        return sum(
            self._indexes[self.config.disk_of(ledger_id)].delete_ledger(ledger_id)
            for ledger_id in ledger_ids
        )

    async def compact(self) -> CompactionReport:
        """Rewrite entry logs whose live fraction is below the threshold; delete empty ones."""
        self._check_open()
        async with self._flush_lock:
            await self._checkpoint_locked()
            reports = [
                await self._loop.run_in_executor(self._storage_thread, self._compact_disk, disk)
                for disk in range(self.config.disk_count)
            ]
        report = CompactionReport(
            logs_examined=sum(r.logs_examined for r in reports),
            logs_compacted=sum(r.logs_compacted for r in reports),
            logs_deleted=sum(r.logs_deleted for r in reports),
            entries_moved=sum(r.entries_moved for r in reports),
            bytes_moved=sum(r.bytes_moved for r in reports),
            bytes_freed=sum(r.bytes_freed for r in reports),
        )
        self.stats.compactions += 1
        self.stats.compaction_entries_moved += report.entries_moved
        self.stats.compaction_bytes_freed += report.bytes_freed
        log.info("compaction_done", **dataclasses.asdict(report))
        return report

    def _compact_disk(self, disk: int) -> CompactionReport:
        """Storage thread, flush lock held: copy live entries out of sparse logs, drop them."""
        logs, index = self._logs[disk], self._indexes[disk]
        live: dict[int, list[tuple[int, int, EntryLocation]]] = {}
        for ledger_id, entry_id, location in index.all_locations():
            live.setdefault(location.log_id, []).append((ledger_id, entry_id, location))
        threshold = self.config.compaction_threshold

        def sparse(log_id: int) -> bool:
            total = logs.file_bytes(log_id)
            live_bytes = sum(loc.size for _l, _e, loc in live.get(log_id, ()))
            return total <= 0 or live_bytes < threshold * total

        log_ids = logs.log_ids()
        current = logs.current_log_id
        if logs.file_bytes(current) > 0 and sparse(current):
            logs.roll()  # The current log qualifies too: seal it so it can be rewritten.
        victims = [i for i in log_ids if i != logs.current_log_id and sparse(i)]
        moves: list[tuple[int, int, EntryLocation, EntryLocation]] = []
        bytes_moved = 0
        for log_id in victims:
            survivors = live.get(log_id, [])
            for start in range(0, len(survivors), 1000):  # Bounded memory per copy batch.
                chunk = survivors[start : start + 1000]
                records = []
                for ledger_id, entry_id, location in chunk:
                    entry = self._read_location_blocking(ledger_id, entry_id, location)
                    assert entry is not None, (log_id, location)
                    records.append(encode_record(entry))
                new_locations = logs.append(records)
                for (ledger_id, entry_id, old), new in zip(chunk, new_locations, strict=True):
                    moves.append((ledger_id, entry_id, old, new))
                bytes_moved += sum(len(r) for r in records)
        logs.sync()
        index.move_locations(moves)
        bytes_freed = sum(logs.remove(log_id) for log_id in victims)
        return CompactionReport(
            logs_examined=len(log_ids),
            logs_compacted=sum(1 for i in victims if live.get(i)),
            logs_deleted=sum(1 for i in victims if not live.get(i)),
            entries_moved=len(moves),
            bytes_moved=bytes_moved,
            bytes_freed=bytes_freed,
        )

    # -- disk usage ------------------------------------------------------------------------

    def disk_usage(self) -> list[DiskUsage]:
        """Usage of every journal, ledger and index directory against the thresholds."""
        found: list[DiskUsage] = []
        groups = (
            ("journal", self.config.journal.directories),
            ("ledger", self.config.ledger_dirs),
            ("index", self.config.index_dirs),
        )
        for kind, directories in groups:
            for directory in directories:
                total, used, _free = self._usage_function(Path(directory))
                fraction = used / total if total > 0 else 1.0
                found.append(
                    DiskUsage(
                        path=Path(directory),
                        kind=kind,
                        total_bytes=total,
                        used_bytes=used,
                        fraction=fraction,
                        over_warn=fraction >= self.config.disk_warn_fraction,
                        over_read_only=fraction >= self.config.disk_read_only_fraction,
                    )
                )
        return found

    def is_over_read_only_threshold(self) -> bool:
        """True when any directory is at or over `disk_read_only_fraction`."""
        return any(usage.over_read_only for usage in self.disk_usage())

    def is_over_warn_threshold(self) -> bool:
        return any(usage.over_warn for usage in self.disk_usage())


def _check_ids(ledger_id: int, entry_id: int) -> None:
    if not 0 <= ledger_id < 1 << 63:
        raise NoSuchLedgerError(f"ledger id {ledger_id} is outside [0, 2**63)")
    if not 0 <= entry_id < 1 << 63:
        raise NoSuchEntryError(f"ledger {ledger_id}: entry id {entry_id} is outside [0, 2**63)")


def _ranges(ids: list[int]) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    for entry_id in ids:
        if ranges and ranges[-1][1] == entry_id - 1:
            ranges[-1] = (ranges[-1][0], entry_id)
        else:
            ranges.append((entry_id, entry_id))
    return ranges


def _open_disks(
    config: StorageConfig, expected: Cookie, entry_log_disk: Disk, crash_points: CrashPoints
) -> tuple[
    Cookie,
    list[EntryLogDirectory],
    list[LedgerIndex],
    dict[int, LedgerState],
    list[JournalMark | None],
]:
    """Blocking: cookies, then each disk's entry logs and index, the ledger states, the mark."""
    directories = [
        Path(d) for d in (*config.journal.directories, *config.ledger_dirs, *config.index_dirs)
    ]
    cookie = verify_or_stamp(expected, directories)
    logs: list[EntryLogDirectory] = []
    indexes: list[LedgerIndex] = []
    try:
        for ledger_dir, index_dir in zip(config.ledger_dirs, config.index_dirs, strict=True):
            entry_logs = EntryLogDirectory(
                Path(ledger_dir) / "logs", config.entry_log_max_bytes, entry_log_disk, crash_points
            )
            entry_logs.open()
            logs.append(entry_logs)
            indexes.append(LedgerIndex(Path(index_dir), config.index_map_bytes))
        states: dict[int, LedgerState] = {}
        for index in indexes:
            states.update(index.states())
        marks = read_last_mark(
            [Path(d) for d in config.ledger_dirs], len(config.journal.directories)
        )
    except BaseException:
        _close_disks(logs, indexes)
        raise
    return cookie, logs, indexes, states, marks


def _close_disks(logs: list[EntryLogDirectory], indexes: list[LedgerIndex]) -> None:
    for entry_logs in logs:
        with contextlib.suppress(OSError, BKError):
            entry_logs.close()
    for index in indexes:
        index.close()
