"""Ledger storage's background work: flush and checkpoint, releasing journal files, deleting
ledgers, compaction, disk usage.

Part of `ShardStorage` (a mixin over `StorageState`, see state.py). docs/storage.md, "Add,
flush, checkpoint" and "Compaction".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

import structlog

from bkaio.entrylog.checkpoint import write_last_mark
from bkaio.entrylog.entry_log import EntryLocation, encode_record
from bkaio.entrylog.state import FLUSH_JITTER_FRACTION, SLOW_FLUSH_SECONDS, StorageState
from bkaio.entrylog.types import CompactionReport, DiskUsage, LedgerState
from bkaio.entrylog.write_cache import WriteCache
from bkaio.errors import BKError
from bkaio.supervision import Once, loop_supervisor
from bkaio.wal.records import JournalMark

log = structlog.get_logger(__name__)


class StorageMaintenance(StorageState):
    """Flush, checkpoint, deletion, compaction and disk usage of `ShardStorage`."""

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
        """Flush periodically or when asked. A flush that fails (OSError or BookieIOError from
        an entry log, the index or the checkpoint) ends this run: the supervisor reports it,
        `_write_failed` turns the shard read-only, and the next run, after a backoff, flushes
        at once: the probe. The first flush that works makes the shard writable again."""
        while True:
            if self.write_failure is None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._next_flush_delay()):
                        await self._flush_requested.wait()
            self._flush_requested.clear()
            self._check_open()
            async with self._flush_lock:
                await self._checkpoint_locked()  # Not waiting for journal deletions.
            if self.write_failure is not None:
                self._write_recovered()

    def _write_failed(self, error: BaseException) -> None:
        """A flush failed (already reported at ERROR by the supervisor): read-only until one
        works. Acknowledged entries stay readable from the write cache, and the journal is
        not released past what was flushed (its mark is written only after a flush)."""
        log.error("storage_flush_failed", error=f"{type(error).__name__}: {error}")
        # No room will come soon: the bookie reads requests again (reads and fences go on),
        # and waiting adds get TOO_MANY_REQUESTS at the end of their wait.
        self._flush_failing = True
        if self._room_pressure:
            self._set_room_pressure(False)
        if self.write_failure is None:
            self.write_failure = f"{type(error).__name__}: {error}"
            if self.write_failure_listener is not None:
                self.write_failure_listener(True)

    def _write_recovered(self) -> None:
        log.warning("storage_flush_recovered", after=self.write_failure)
        self._flush_failing = False
        self.write_failure = None
        if self.write_failure_listener is not None:
            self.write_failure_listener(False)

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
            self._releaser = loop_supervisor().spawn(
                "journal_release", self._release_loop, Once(), instance=str(id(self))
            )

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
                write_last_mark(directory, marks, self._crash_points, self._disk)

    async def delete_ledger(self, ledger_id: int) -> None:
        """Drop the ledger's entries and state. Space returns at the next compaction."""
        await self.delete_ledgers([ledger_id])

    async def delete_ledgers(
        self,
        ledger_ids: Iterable[int],
        *,
        confirm: Callable[[list[int]], Collection[int]] | None = None,
    ) -> list[int]:
        """Drop several ledgers with one checkpoint (GC); returns those dropped.

        `confirm`, when given, is called after the checkpoint (which waits for the flush lock
        and writes: other tasks run meanwhile, for seconds maybe) with the ledgers about to be
        dropped, and only those it returns are; nothing is awaited between its answer and the
        drop. GC re-checks the lease of its locks there."""
        self._check_open()
        async with self._flush_lock:
            doomed = sorted({i for i in ledger_ids if i in self._ledgers})
            if not doomed:
                return []
            # Checkpoint first, so that a restart does not replay the ledgers back to life.
            await self._checkpoint_locked()
            if confirm is not None:
                confirmed = set(confirm(doomed))
                doomed = [i for i in doomed if i in confirmed]
                if not doomed:
                    return []
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
                total, used, free = self._usage_function(Path(directory))
                # df's Use%: `free` is what an unprivileged process may still write, so root's
                # reserved blocks (ext4 keeps 5%) count neither way and a disk the bookie can
                # no longer write is at 100%. As `used / total` it was full at 95%, before
                # it passed the read-only fraction.
                fraction = used / (used + free) if used + free > 0 else 1.0
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
