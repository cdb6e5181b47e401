"""Range reads of one ledger as entry records (READ_ENTRIES), without a Python object per entry
where the entries are on disk.

The entries wanted are first, first + stride, ... <= last. Those in the entry logs are found
with one index walk (`LedgerIndex.scan`) and read with one `pread` per run of records
(`EntryLogDirectory.read_records`), both on the reader pool, and sent as read: the answer's
records are the entry logs' own bytes. Those still in the write caches (not yet flushed) are
packed from the cached entries, as are those a long poll may take while they are still being
journaled. The caches are taken before the index walk: an entry a flush moves from a cache to
the index meanwhile is still in the cache object taken (caches are swapped, never emptied), so
no entry present when the read started is missed.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from dataclasses import dataclass, field

from bkaio.entry_records import RECORD_HEAD_BYTES, pack_record
from bkaio.entrylog.entry_log import EntryLogDirectory
from bkaio.entrylog.index import IndexScan, LedgerIndex
from bkaio.entrylog.types import StoredEntry
from bkaio.errors import BookieIOError

# A read whose entry logs keep vanishing under compaction gives up after this many tries.
_ATTEMPTS = 3


@dataclass(slots=True)
class RecordRun:
    """Entry records of one ledger, in entry order, as the buffers to send."""

    parts: list[bytes | memoryview] = field(default_factory=list)
    count: int = 0
    payload_bytes: int = 0
    next_entry_id: int = 0  # The first wanted entry not looked at (past `last`: all were).

    def fits(self, payload_bytes: int, max_count: int, max_bytes: int) -> bool:
        """Whether one more entry of `payload_bytes` stays within the limits (the first always
        does)."""
        return self.count < max_count and (
            not self.count or self.payload_bytes + payload_bytes <= max_bytes
        )

    def add_cached(self, entry: StoredEntry) -> None:
        """Append a cached entry, packed as a record."""
        self.parts += pack_record(
            entry.ledger_id, entry.entry_id, entry.lac, entry.length, entry.digest, entry.payload
        )
        self.count += 1
        self.payload_bytes += len(entry.payload)


async def read_records(
    loop: asyncio.AbstractEventLoop,
    pool: Executor,
    index: LedgerIndex,
    logs: EntryLogDirectory,
    cached: list[dict[int, StoredEntry]],
    ledger_id: int,
    first_entry_id: int,
    last_entry_id: int,
    stride: int,
    max_count: int,
    max_bytes: int,
) -> RecordRun:
    """The wanted entries stored here (see the module docstring): at most `max_count`, and
    past the first at most `max_bytes` of payload. `cached`: the ledger's entries by id in
    each write cache (`WriteCache.entries_of`) and any held in memory otherwise (entries being
    journaled, for a long poll). Runs on the event loop (the caches are the loop's); the disk
    work goes to `pool`."""
    if cached:
        recent = _from_cache_alone(
            cached, first_entry_id, last_entry_id, stride, max_count, max_bytes
        )
        if recent is not None:
            recent.next_entry_id = min(recent.next_entry_id, last_entry_id + 1)
            return recent
    previous: list[bytes] | None = None
    for _attempt in range(_ATTEMPTS):
        scan, parts = await loop.run_in_executor(
            pool,
            _read_indexed,
            index,
            logs,
            ledger_id,
            first_entry_id,
            last_entry_id,
            stride,
            max_count,
            max_bytes,
        )
        if parts is not None:
            break
        if scan.locations == previous:  # Compaction repoints the index before it removes a log.
            raise BookieIOError(
                f"ledger {ledger_id}: entries {first_entry_id}..{last_entry_id}: an entry log "
                f"in {logs.directory} that the index points into is missing"
            )
        previous = scan.locations
    else:
        raise BookieIOError(
            f"ledger {ledger_id}: the entry logs of entries {first_entry_id}..{last_entry_id} "
            f"keep moving under compaction"
        )
    if not cached:
        run = RecordRun(parts, len(scan.entry_ids), scan.payload_bytes)
        run.next_entry_id = scan.limited_at if scan.limited_at is not None else last_entry_id + 1
    else:
        run = _merge(scan, parts, cached, first_entry_id, last_entry_id, stride, max_count,
                     max_bytes)  # fmt: skip
    run.next_entry_id = min(run.next_entry_id, last_entry_id + 1)
    return run


def _from_cache_alone(
    cached: list[dict[int, StoredEntry]],
    first_entry_id: int,
    last_entry_id: int,
    stride: int,
    max_count: int,
    max_bytes: int,
) -> RecordRun | None:
    """The answer when the caches hold every wanted entry up to a limit (a tail's long poll
    asks for the newest entries): no index walk, no trip to the reader pool. None when one
    is missing from the caches (it may be indexed, or not stored here)."""
    run = RecordRun()
    entry_id = first_entry_id
    while entry_id <= last_entry_id:
        entry = _cached(cached, entry_id)
        if entry is None:
            return None
        if not run.fits(len(entry.payload), max_count, max_bytes):
            break
        run.add_cached(entry)
        entry_id += stride
    run.next_entry_id = entry_id
    return run


def _read_indexed(
    index: LedgerIndex,
    logs: EntryLogDirectory,
    ledger_id: int,
    first_entry_id: int,
    last_entry_id: int,
    stride: int,
    max_count: int,
    max_bytes: int,
) -> tuple[IndexScan, list[bytes | memoryview] | None]:
    """Reader pool: the index walk and the reads of what it found."""
    scan = index.scan(ledger_id, first_entry_id, last_entry_id, stride, max_count, max_bytes)
    if not scan.locations:
        return scan, []
    return scan, logs.read_records(scan.locations)


def _merge(
    scan: IndexScan,
    parts: list[bytes | memoryview],
    cached: list[dict[int, StoredEntry]],
    first_entry_id: int,
    last_entry_id: int,
    stride: int,
    max_count: int,
    max_bytes: int,
) -> RecordRun:
    """The indexed records with the cached entries in their places, within the limits.

    Entries the index walk found in one unbroken stride keep their read buffers whole; only
    the ids around them (gaps, and the rest past the walk) are looked up in the caches.
    """
    run = RecordRun()
    ids = scan.entry_ids
    whole = bool(ids) and ids[-1] - ids[0] == (len(ids) - 1) * stride
    stop = scan.limited_at if scan.limited_at is not None else last_entry_id + stride
    next_id = first_entry_id

    def take_cached(until: int) -> bool:
        """Cached entries next_id, next_id + stride, ... < until; False at a limit."""
        nonlocal next_id
        while next_id < until and next_id <= last_entry_id:
            entry = _cached(cached, next_id)
            if entry is not None:
                if not run.fits(len(entry.payload), max_count, max_bytes):
                    return False
                run.add_cached(entry)
            next_id += stride
        return True

    if whole:
        # The ids before the walk's first, then the walk's records as one block.
        if not take_cached(ids[0]):
            run.next_entry_id = next_id
            return run
        if run.count + len(ids) <= max_count and (
            not run.count or run.payload_bytes + scan.payload_bytes <= max_bytes
        ):
            run.parts += parts
            run.count += len(ids)
            run.payload_bytes += scan.payload_bytes
            next_id = ids[-1] + stride
        else:
            run.next_entry_id = next_id
            return run
    else:
        # Record by record (`parts` may hold runs of several records: split them per entry).
        records = _per_record(parts, len(ids))
        for entry_id, record in zip(ids, records, strict=True):
            if not take_cached(entry_id):
                run.next_entry_id = next_id
                return run
            size = len(record) - RECORD_HEAD_BYTES
            if not run.fits(size, max_count, max_bytes):
                run.next_entry_id = entry_id
                return run
            run.parts.append(record)
            run.count += 1
            run.payload_bytes += size
            next_id = entry_id + stride
    take_cached(stop)
    run.next_entry_id = next_id
    return run


def _cached(cached: list[dict[int, StoredEntry]], entry_id: int) -> StoredEntry | None:
    for entries in cached:
        entry = entries.get(entry_id)
        if entry is not None:
            return entry
    return None


def _per_record(parts: list[bytes | memoryview], count: int) -> list[memoryview]:
    """`count` records as one buffer each (a part may hold several records back to back)."""
    records: list[memoryview] = []
    for part in parts:
        view = memoryview(part)
        offset = 0
        while offset < len(view):
            size = 8 + int.from_bytes(view[offset : offset + 4], "big")
            records.append(view[offset : offset + size])
            offset += size
    if len(records) != count:
        raise BookieIOError(f"{count} records expected, {len(records)} read: damaged entry log")
    return records
