"""The state of one shard's ledger storage, shared by the modules `ShardStorage` is made of.

`ShardStorage` (shard_storage.py: opening, replay, fencing, LACs, ledger state, closing) is
assembled from one part per responsibility, each a mixin over `StorageState`: the add path
(adding.py), reads (reading.py), flush, checkpoint, deletion, compaction and disk usage
(maintenance.py). `StorageState` names the attributes they share and the methods one part calls
in another; the attributes are set by `ShardStorage.__init__`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bkaio.entrylog.checkpoint import AppliedMarks, MarkSlot
from bkaio.entrylog.config import StorageConfig
from bkaio.entrylog.cookie import Cookie
from bkaio.entrylog.entry_log import EntryLocation, EntryLogDirectory
from bkaio.entrylog.index import LedgerIndex
from bkaio.entrylog.types import LedgerState, StoredEntry
from bkaio.entrylog.write_cache import WriteCache
from bkaio.errors import BKError, NoSuchEntryError, NoSuchLedgerError
from bkaio.journal.crash_points import CrashPoints
from bkaio.journal.disk import Disk
from bkaio.wal import JournalLike
from bkaio.wal.records import JournalMark, JournalRecord

UsageFunction = Callable[[Path], tuple[int, int, int]]  # shutil.disk_usage: total, used, free.

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


def _check_ids(ledger_id: int, entry_id: int) -> None:
    if not 0 <= ledger_id < 1 << 63:
        raise NoSuchLedgerError(f"ledger id {ledger_id} is outside [0, 2**63)")
    if not 0 <= entry_id < 1 << 63:
        raise NoSuchEntryError(f"ledger {ledger_id}: entry id {entry_id} is outside [0, 2**63)")


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


class StorageState:
    """What the parts of `ShardStorage` share (set by `ShardStorage.__init__`)."""

    config: StorageConfig
    cookie: Cookie
    stats: StorageStats
    room_pressure_listener: Callable[[bool], None] | None
    write_failure: str | None
    write_failure_listener: Callable[[bool], None] | None
    _journals: list[JournalLike]
    _groups: list[_AddGroup | None]
    _journal_count: int
    _ledger_stride: int
    _add_tasks: set[asyncio.Task[None]]
    _logs: list[EntryLogDirectory]
    _indexes: list[LedgerIndex]
    _usage_function: UsageFunction
    _crash_points: CrashPoints
    _disk: Disk
    _storage_thread: Executor
    _reader_pool: Executor
    _loop: asyncio.AbstractEventLoop
    _ledgers: dict[int, _Ledger]
    _dirty: set[int]
    _active: WriteCache
    _flushing: WriteCache
    _reserved_bytes: int
    _room_waiters: deque[tuple[int, asyncio.Future[None]]]
    _room_pressure: bool
    _flush_failing: bool
    _flush_requested: asyncio.Event
    _flush_lock: asyncio.Lock
    _marks: list[AppliedMarks]
    _written_marks: list[JournalMark | None]
    # Adds in the journal, not durable here yet, by (ledger id, entry id): the entry (a re-add
    # is checked against it, a long poll may answer with it) and its journal group's future
    # (fences, forces and close wait for it). Two dicts filled and emptied together rather than
    # one of pairs: the add path then builds no object per entry.
    _pending: dict[tuple[int, int], StoredEntry]
    _pending_durable: dict[tuple[int, int], asyncio.Future[JournalMark]]
    _flusher: asyncio.Task[None] | None
    _releaser: asyncio.Task[None] | None
    _release_marks: list[JournalMark | None] | None
    _closed: bool

    # Methods one part calls in another (defined by `ShardStorage` or one of its parts).
    def _check_open(self) -> None:
        raise NotImplementedError

    def _ledger(self, ledger_id: int) -> _Ledger:
        raise NotImplementedError

    def _cached(self, ledger_id: int, entry_id: int) -> StoredEntry | None:
        raise NotImplementedError

    def _create_ledger(self, ledger_id: int, master_key: bytes) -> _Ledger:
        raise NotImplementedError

    def _append_record(
        self,
        ledger_id: int,
        record: JournalRecord,
        apply: Callable[[asyncio.Future[JournalMark]], bool] | None = None,
    ) -> asyncio.Future[JournalMark]:
        raise NotImplementedError

    def _apply_entries(self, entries: list[StoredEntry]) -> None:
        raise NotImplementedError

    def _room_freed(self) -> None:
        raise NotImplementedError

    def _set_room_pressure(self, waiting: bool) -> None:
        raise NotImplementedError

    async def _read_indexed(self, ledger_id: int, entry_id: int) -> StoredEntry | None:
        raise NotImplementedError

    def _read_location_blocking(
        self, ledger_id: int, entry_id: int, location: EntryLocation | None
    ) -> StoredEntry | None:
        raise NotImplementedError

    async def checkpoint(self) -> None:
        raise NotImplementedError
