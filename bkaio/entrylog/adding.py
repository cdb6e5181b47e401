"""The add path of ledger storage: `add_entries`, journal groups, write-cache room.

Part of `ShardStorage` (a mixin over `StorageState`, see state.py). The one add entry point of a
shard's storage (docs/storage.md, "Add, flush, checkpoint"; docs/architecture.md): the common
batch is journaled at once and answered with the other batches of its journal group by one
callback once the group is durable and applied; anything else takes one task for the batch.
The one key and fencing check (`_check_key`) and the one write-cache room check (`_reserve`,
and its inlined form on the common path) are here.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from functools import partial
from itertools import repeat
from typing import Any, TypeVar

import structlog

from bkaio.entrylog.state import StorageState, _AddGroup, _check_ids
from bkaio.entrylog.types import AddBatch, StoredEntry
from bkaio.entrylog.write_cache import ENTRY_OVERHEAD_BYTES
from bkaio.errors import (
    BKError,
    BookieIOError,
    EntryConflictError,
    LedgerFencedError,
    TooManyRequestsError,
    UnauthorizedError,
)
from bkaio.supervision import loop_supervisor
from bkaio.wal.records import JournalMark

log = structlog.get_logger(__name__)

_Batch = TypeVar("_Batch", bound=AddBatch)


class StorageAdds(StorageState):
    """The add path of `ShardStorage`."""

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
            and hmac.compare_digest(ledger.master_key, batch.master_key)  # A secret.
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
            self._pending[keys[0]] = entries[0]
            self._pending_durable[keys[0]] = future
        else:
            self._pending.update(zip(keys, entries, strict=True))
            self._pending_durable.update(zip(keys, repeat(future)))

    def _group_durable(self, group: _AddGroup, done: asyncio.Future[JournalMark]) -> None:
        """A group is durable (or failed): apply its adds in order, then answer its batches."""
        if self._groups[group.journal_index] is group:
            self._groups[group.journal_index] = None
        pending = self._pending
        pending_durable = self._pending_durable
        entries = group.entries
        for entry in entries:
            key = (entry.ledger_id, entry.entry_id)
            pending.pop(key, None)
            pending_durable.pop(key, None)
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
            except Exception as crash:  # One caller's failure must not leave others unanswered.
                loop_supervisor().report("add_callback", crash)

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
        except Exception as error:  # A bug: answered as an I/O error, and reported.
            loop_supervisor().report("add", error)
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
        if not hmac.compare_digest(ledger.master_key, master_key):  # Constant time.
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
            durable = self._pending_durable.get((ledger_id, entry_id))
            if durable is not None:
                existing = self._pending[ledger_id, entry_id]
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
            elif durable is not None:
                in_flight.append(durable)
        batch.failures = failures or None
        return fresh, in_flight

    def _any_stored_or_in_flight(self, ledger_id: int, entries: list[StoredEntry]) -> bool:
        """Whether one of `entries` was added (journaled or cached) since `_new_entries` looked.

        Only what can change without an index read: an id at or below the ledger's last entry
        is not stored for that alone (a recovery or a re-replication fills gaps out of order),
        and `_new_entries` already looked it up in the index."""
        pending = self._pending
        for entry in entries:
            entry_id = entry.entry_id
            if (ledger_id, entry_id) in pending or self._cached(ledger_id, entry_id) is not None:
                return True
        return False

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
            except Exception as error:  # The adds must go on whatever the listener does.
                loop_supervisor().report("room_pressure_listener", error)
