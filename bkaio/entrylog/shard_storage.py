"""`ShardStorage`: the storage engine of one bookie shard (docs/internal-apis.md, docs/storage.md).

Owns the journal of the shard, the write cache, the entry logs and LMDB indexes of every disk,
per-ledger state (master key, fenced, LAC), checkpoints, compaction, cookies and disk usage.
Must not import `protocol` or `meta`.

Made of one part per responsibility (mixins over `StorageState`, state.py): this module opens,
replays and closes storage and keeps per-ledger state (keys, fences, LACs); adding.py is the add
path (`add_entries`: check key/fencing/conflict -> reserve write-cache room -> journal -> once
the journal group is durable, put its entries in the write cache and advance the LACs);
reading.py the reads; maintenance.py the flush (periodic, or when the cache is half full: swap
the cache, append to entry logs, fsync them, commit the index, write `lastMark`, let the journal
drop older files), deletion, compaction and disk usage. Every blocking call runs on the storage
thread (writes, one at a time) or the reader pool; the journal has its own writer thread, so
storage fsyncs never share it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import shutil
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path

import structlog

from bkaio.entrylog.adding import StorageAdds
from bkaio.entrylog.checkpoint import AppliedMarks, read_last_mark
from bkaio.entrylog.config import StorageConfig
from bkaio.entrylog.cookie import Cookie, expected_cookie, verify_or_stamp
from bkaio.entrylog.entry_log import ENTRY_LOG_SUBDIR, EntryLogDirectory
from bkaio.entrylog.index import LedgerIndex
from bkaio.entrylog.maintenance import StorageMaintenance
from bkaio.entrylog.reading import StorageReads
from bkaio.entrylog.state import (
    StorageStats,
    UsageFunction,
    _AddGroup,
    _check_ids,
    _Ledger,
)
from bkaio.entrylog.types import (
    CompactionReport,
    DiskUsage,
    LedgerState,
    StoredEntry,
)
from bkaio.entrylog.write_cache import WriteCache
from bkaio.errors import (
    BKError,
    BookieIOError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from bkaio.journal.crash_points import NO_CRASH_POINTS, CrashPoints
from bkaio.journal.disk import OS_DISK, Disk
from bkaio.supervision import Degrade, loop_supervisor
from bkaio.wal import JournalFactory, JournalLike
from bkaio.wal.records import (
    Corruption,
    EntryRecord,
    FenceRecord,
    JournalMark,
    JournalRecord,
    LacRecord,
    MasterKeyRecord,
)
from bkaio.wal.threads import OS_THREAD_POOLS, ThreadPools

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


class ShardStorage(StorageAdds, StorageReads, StorageMaintenance):
    """One shard's ledger storage; `LedgerStorage` (api.py) is what its request handling uses."""

    def __init__(
        self,
        config: StorageConfig,
        journals: list[JournalLike],
        cookie: Cookie,
        logs: list[EntryLogDirectory],
        indexes: list[LedgerIndex],
        states: dict[int, LedgerState],
        usage_function: UsageFunction,
        storage_thread: Executor,
        reader_pool: Executor,
        crash_points: CrashPoints = NO_CRASH_POINTS,
        disk: Disk = OS_DISK,
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
        self._disk = disk  # The checkpoint's lastMark goes through it, as the entry logs do.
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
        # Why flushes fail (an entry log, index or checkpoint write: ENOSPC, EIO, EROFS), None
        # while they work. Told to `write_failure_listener` (True/False) as it changes: the
        # bookie is read-only meanwhile (BookKeeper's failed ledger directory).
        self.write_failure: str | None = None
        self.write_failure_listener: Callable[[bool], None] | None = None
        self._flush_requested = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._marks = [AppliedMarks(None) for _ in journals]  # One per journal directory.
        self._written_marks: list[JournalMark | None] = [None] * len(journals)
        self._pending: dict[tuple[int, int], StoredEntry] = {}
        self._pending_durable: dict[tuple[int, int], asyncio.Future[JournalMark]] = {}
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
        journal_factory: JournalFactory,  # bkaio.journal.open_journal in a bookie.
        usage_function: UsageFunction = shutil.disk_usage,
        entry_log_disk: Disk = OS_DISK,
        crash_points: CrashPoints = NO_CRASH_POINTS,
        threads: ThreadPools = OS_THREAD_POOLS,
    ) -> ShardStorage:
        """Check cookies, open indexes and entry logs, replay the journal, checkpoint.

        `entry_log_disk` is what the entry logs write and sync through, `crash_points` where
        the entry logs and checkpoints may stop the process: production defaults, except under
        a test entry point (bkaio.testing.bookie), which passes the journal's disk. `threads`
        gives the storage thread and the reader pool (the simulation passes its own)."""
        loop = asyncio.get_running_loop()
        storage_thread = threads.pool("bkaio-storage", 1)
        reader_pool = threads.pool("bkaio-storage-read", 4)
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
            entry_log_disk,
        )
        storage._written_marks = list(marks)
        # Applied up to its mark already: a checkpoint during an earlier journal's replay (or
        # the close of a start that failed) writes every journal's mark, and one reset to
        # nothing would replay that journal from its oldest file, deleted ledgers included.
        storage._marks = [AppliedMarks(mark) for mark in marks]
        try:
            for journal_index, mark in enumerate(marks):
                await storage._replay(journal_index, mark)
            await storage.checkpoint()
        except BaseException:
            await storage.close()
            raise
        # Under the loop's supervisor (the shard worker's): a flush that fails is reported, the
        # shard turns read-only (`_write_failed`), and the loop runs again after a backoff.
        storage._flusher = loop_supervisor().spawn(
            "storage_flush",
            storage._flush_loop,
            Degrade(storage._write_failed, initial_delay_seconds=0.2, max_delay_seconds=5.0),
            instance=f"shard-{shard_index}",
        )
        return storage

    async def _replay(self, journal_index: int, mark: JournalMark | None) -> None:
        """Apply the journal's records after `mark`, a bounded batch at a time.

        Memory stays bounded whatever the journal's size: the reader holds one batch, and the
        write cache is flushed (and the mark of what is applied checkpointed) whenever it is
        half full, as it is for adds. A corruption stops replay before anything after it is
        applied, and the bookie refuses to start.
        """
        journal = self._journals[journal_index]
        reader = journal.iter_replay(mark)
        # Batches well under the cache, so that flushing at half of it keeps it bounded.
        batches = reader.batches(min(REPLAY_BATCH_BYTES, self.config.write_cache_bytes // 4))
        counts = {"entries": 0, "keys": 0, "fences": 0, "lacs": 0}
        while True:
            batch = await self._loop.run_in_executor(self._reader_pool, next, batches, None)
            if reader.corruption:
                _refuse_corrupt_journal(reader.corruption)
            if batch is None:
                break
            for _mark, record in batch:
                self._apply_record(record, counts)
            self.stats.replayed_records += len(batch)
            self._marks[journal_index].advance(batch[-1][0])
            if self._active.bytes >= self.config.write_cache_bytes // 2:
                async with self._flush_lock:
                    await self._checkpoint_locked()
        if reader.torn_tail is not None:
            tail = reader.torn_tail
            log.warning(
                "journal_torn_tail", file=str(tail.file), offset=tail.offset, reason=tail.reason
            )
        for tail in reader.earlier_torn_tails:
            log.info("journal_earlier_torn_tail", file=str(tail.file), offset=tail.offset)
        self._marks[journal_index].advance(reader.end_mark)
        log.info(
            "journal_replayed",
            journal=journal_index,
            after=None if mark is None else f"{mark.file_id}:{mark.offset}",
            end=f"{reader.end_mark.file_id}:{reader.end_mark.offset}",
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
                await asyncio.wait(list(self._pending_durable.values()))
            if checkpoint:
                try:
                    await self.checkpoint()
                except (BKError, OSError) as error:
                    # Nothing is lost (the next open replays the journal from the last mark),
                    # but a disk that fails the last flush must not pass unseen.
                    log.warning(
                        "storage_close_checkpoint_failed",
                        error=f"{type(error).__name__}: {error}",
                    )
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
        *,
        lazy: bool = False,
    ) -> asyncio.Future[JournalMark]:
        """Journal a record; `apply` runs once it is durable (or failed), in journal order.

        Records whose effect is applied in memory before they are durable (keys, fences,
        LACs) pass no `apply`: their mark counts as applied once durable. `lazy`: the
        journal's lazy record (no group of its own), for a record nobody waits for."""
        journal_index = self.config.journal_of(ledger_id)
        self._groups[journal_index] = None  # Later adds go after this record: a new group.
        marks = self._marks[journal_index]
        slot = marks.begin()
        try:
            future = self._journals[journal_index].append(record, lazy=lazy)
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

        # Granted: `_grant_room` reserved the bytes for it.

    async def fence(self, ledger_id: int, master_key: bytes) -> None:
        """Fence the ledger (creating it if unknown); durable when it returns. Idempotent."""
        self._check_open()
        _check_ids(ledger_id, 0)
        await self._journal_of(ledger_id).wait_for_room()
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            ledger = self._create_ledger(ledger_id, master_key)
        elif not hmac.compare_digest(ledger.master_key, master_key):  # A secret.
            raise UnauthorizedError(
                f"ledger {ledger_id}: fence with a master key that differs from the recorded one"
            )
        # Adds that passed the fencing check before now must be applied before we answer, so
        # that a recovery reading after the fence sees them.
        earlier = [f for (lid, _e), f in self._pending_durable.items() if lid == ledger_id]
        if not ledger.fenced:
            ledger.fenced = True
            self._dirty.add(ledger_id)
            ledger.fence_durable = self._append_record(ledger_id, FenceRecord(ledger_id))
        if ledger.fence_durable is not None:
            await asyncio.shield(ledger.fence_durable)
        if earlier:
            await asyncio.wait(earlier)  # wait(), not gather(): never cancels the adds.

    async def write_lac(self, ledger_id: int, master_key: bytes, lac: int) -> None:
        """Store an explicit LAC (WRITE_LAC): applied when it returns, journaled lazily.

        The record goes with the journal's next group (or after `lazy_record_delay_ms`), so a
        LAC push costs no write and sync of its own; BookKeeper syncs it before answering. A
        crash before then only lowers this bookie's LAC to an earlier one, a lower bound as
        every bookie's LAC is: readers keep the highest they saw, and recovery reads past it."""
        self._check_open()
        _check_ids(ledger_id, 0)
        await self._journal_of(ledger_id).wait_for_room()
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            ledger = self._create_ledger(ledger_id, master_key)
        elif not hmac.compare_digest(ledger.master_key, master_key):  # A secret.
            raise UnauthorizedError(
                f"ledger {ledger_id}: write_lac with a master key that differs from the "
                "recorded one"
            )
        self._apply_lac(ledger_id, lac)
        self._append_record(ledger_id, LacRecord(ledger_id, lac), lazy=True)

    async def force(self, ledger_id: int) -> None:
        """Everything added to the ledger before this call is durable when it returns."""
        self._check_open()
        earlier = [f for (lid, _e), f in self._pending_durable.items() if lid == ledger_id]
        if earlier:
            await asyncio.wait(earlier)  # wait(), not gather(): never cancels the adds.

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
                Path(ledger_dir) / ENTRY_LOG_SUBDIR,
                config.entry_log_max_bytes,
                entry_log_disk,
                crash_points,
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


# Replay reads the journal in batches of at most this much (less for a small write cache).
REPLAY_BATCH_BYTES = 4 * 1024 * 1024


def _refuse_corrupt_journal(corruption: list[Corruption]) -> None:
    for damage in corruption:
        log.error(
            "journal_corruption", file=str(damage.file), offset=damage.offset, reason=damage.reason
        )
    first = corruption[0]
    raise BookieIOError(
        f"journal {first.file} is corrupt at offset {first.offset} ({first.reason}) "
        "with valid records after it: acknowledged data may be damaged; refusing to start"
    )
