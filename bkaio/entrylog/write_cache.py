"""The in-memory write cache: entries durable in the journal but not yet in an entry log.

Pure data structure, used only on the event loop. Two exist at a time: the active cache that
adds go into and the one a flush is writing out (swapped, then dropped once the index commit is
durable). Reads look in both before the index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from bkaio.entrylog.types import StoredEntry

# Per-entry bookkeeping beyond the payload (dict slots, the dataclass, ints); keeps the byte
# bound honest for small entries.
ENTRY_OVERHEAD_BYTES = 128


def cached_bytes(entry: StoredEntry) -> int:
    return len(entry.payload) + ENTRY_OVERHEAD_BYTES


class WriteCache:
    __slots__ = ("_by_ledger", "bytes", "entries")

    def __init__(self) -> None:
        self._by_ledger: dict[int, dict[int, StoredEntry]] = {}
        self.bytes = 0
        self.entries = 0

    def put(self, entry: StoredEntry) -> None:
        ledger = self._by_ledger.setdefault(entry.ledger_id, {})
        previous = ledger.get(entry.entry_id)
        if previous is not None:
            self.bytes -= cached_bytes(previous)
            self.entries -= 1
        ledger[entry.entry_id] = entry
        self.bytes += cached_bytes(entry)
        self.entries += 1

    def put_many(self, entries: list[StoredEntry]) -> None:
        """`put` of each entry, in order (the add path's batches)."""
        by_ledger = self._by_ledger
        added_bytes = 0
        added = 0
        for entry in entries:
            ledger = by_ledger.get(entry.ledger_id)
            if ledger is None:
                ledger = by_ledger[entry.ledger_id] = {}
            previous = ledger.get(entry.entry_id)
            if previous is not None:
                added_bytes -= cached_bytes(previous)
                added -= 1
            ledger[entry.entry_id] = entry
            added_bytes += len(entry.payload) + ENTRY_OVERHEAD_BYTES
            added += 1
        self.bytes += added_bytes
        self.entries += added

    def get(self, ledger_id: int, entry_id: int) -> StoredEntry | None:
        ledger = self._by_ledger.get(ledger_id)
        return None if ledger is None else ledger.get(entry_id)

    def entries_of(self, ledger_id: int) -> dict[int, StoredEntry] | None:
        """The ledger's cached entries by entry id (None when there are none); do not change."""
        return self._by_ledger.get(ledger_id)

    def entry_ids(self, ledger_id: int) -> list[int]:
        return list(self._by_ledger.get(ledger_id, ()))

    def remove_ledger(self, ledger_id: int) -> int:
        ledger = self._by_ledger.pop(ledger_id, None)
        if ledger is None:
            return 0
        for entry in ledger.values():
            self.bytes -= cached_bytes(entry)
        self.entries -= len(ledger)
        return len(ledger)

    def sorted_by_disk(
        self, disk_count: int, disk_of: Callable[[int], int]
    ) -> list[list[StoredEntry]]:
        """Entries grouped per disk (`disk_of(ledger_id)`), each sorted by (ledger, entry)."""
        disks: list[list[StoredEntry]] = [[] for _ in range(disk_count)]
        for ledger_id in sorted(self._by_ledger):
            ledger = self._by_ledger[ledger_id]
            disks[disk_of(ledger_id)].extend(ledger[e] for e in sorted(ledger))
        return disks

    def __iter__(self) -> Iterator[StoredEntry]:
        for ledger in self._by_ledger.values():
            yield from ledger.values()

    def __len__(self) -> int:
        return self.entries
