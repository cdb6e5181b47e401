"""The read path of ledger storage: `read_range` (a single entry is a range of one),
`read_records` (READ_ENTRIES: records as on disk, record_reads.py) and `list_entries`, from the
write caches, else the index and entry logs on the reader pool.

Part of `ShardStorage` (a mixin over `StorageState`, see state.py).
"""

from __future__ import annotations

from bkaio.entrylog.entry_log import EntryLocation, EntryLogDirectory, log_file_name
from bkaio.entrylog.index import LedgerIndex
from bkaio.entrylog.record_reads import RecordRun, read_records
from bkaio.entrylog.state import StorageState
from bkaio.entrylog.types import StoredEntry
from bkaio.errors import BookieIOError, NoSuchEntryError


def entry_ranges(ids: list[int]) -> list[tuple[int, int]]:
    """Ascending entry ids as ascending inclusive ranges (LIST_ENTRIES' answer)."""
    ranges: list[tuple[int, int]] = []
    for entry_id in ids:
        if ranges and ranges[-1][1] == entry_id - 1:
            ranges[-1] = (ranges[-1][0], entry_id)
        else:
            ranges.append((entry_id, entry_id))
    return ranges


class StorageReads(StorageState):
    """The read path of `ShardStorage`."""

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
        logs = self._logs[disk]
        for _attempt in range(3):  # Compaction may move the entry between lookup and read.
            if location is None:
                return None
            entry = logs.read(location)
            if entry is not None:
                if (entry.ledger_id, entry.entry_id) != (ledger_id, entry_id):
                    raise BookieIOError(
                        f"{logs.directory}: location {location} of ledger "
                        f"{ledger_id} entry {entry_id} holds ledger {entry.ledger_id} entry "
                        f"{entry.entry_id}: index and entry log disagree"
                    )
                return entry
            moved = self._indexes[disk].get(ledger_id, entry_id)
            if moved == location:  # Compaction repoints the index before it removes a log.
                raise BookieIOError(
                    f"{logs.directory / log_file_name(location.log_id)}: entry log missing; "
                    f"the index has ledger {ledger_id} entry {entry_id} in it"
                )
            location = moved
        raise BookieIOError(f"ledger {ledger_id}: entry {entry_id} keeps moving under compaction")

    async def read_records(
        self,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        stride: int,
        max_count: int,
        max_bytes: int,
        *,
        journaling_up_to: int = -1,
    ) -> RecordRun:
        """The entries first, first + stride, ... <= last stored here, as entry records read
        from disk as they are (record_reads.py); at most `max_count` and, but for the first,
        `max_bytes` of payload. NoSuchLedgerError for a ledger not here.

        Entries up to `journaling_up_to` that were added here and are still being journaled
        come too, from memory: a long poll passes the LAC it answers with, which says an ack
        quorum holds them durably (BookKeeper's bookie serves them from its write cache,
        which it fills before the journal syncs). Otherwise only entries durable here."""
        self._check_open()
        self._ledger(ledger_id)
        disk = self.config.disk_of(ledger_id)
        cached = [
            found
            for cache in (self._active, self._flushing)
            if (found := cache.entries_of(ledger_id))
        ]
        last_journaling = min(last_entry_id, journaling_up_to)
        if last_journaling >= first_entry_id and self._pending:
            # At most max_count lookups: the entries past them would not fit the answer.
            last_journaling = min(last_journaling, first_entry_id + (max_count - 1) * stride)
            journaling = self._journaling_entries(
                ledger_id, range(first_entry_id, last_journaling + 1, stride)
            )
            if journaling:
                cached.append(journaling)
        return await read_records(
            self._loop, self._reader_pool, self._indexes[disk], self._logs[disk],
            cached, ledger_id, first_entry_id, last_entry_id, stride, max_count, max_bytes,
        )  # fmt: skip

    def _journaling_entries(self, ledger_id: int, entry_ids: range) -> dict[int, StoredEntry]:
        """The ledger's entries among `entry_ids` that were added here and are still being
        journaled (not durable here yet), by id. The caller bounds the range (each id is
        looked up) and calls only when some add is pending."""
        pending = self._pending
        found: dict[int, StoredEntry] = {}
        for entry_id in entry_ids:
            journaling = pending.get((ledger_id, entry_id))
            if journaling is not None:
                found[entry_id] = journaling
        return found

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
        return entry_ranges(sorted(ids))

    def disk_readers(self) -> list[tuple[LedgerIndex, EntryLogDirectory]]:
        """Each disk's index and entry logs, for the consistency scrubber
        (bkaio/bookie/scrubber.py): reads only, from any thread."""
        return list(zip(self._indexes, self._logs, strict=True))
