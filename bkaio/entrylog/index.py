"""The entry-location index and ledger state of one disk, in LMDB (see docs/storage.md).

Two named databases in one LMDB environment in the disk's index directory:
    locations   key u64 ledger_id | u64 entry_id (big-endian, so ordered by ledger then entry)
                value u32 log_id | u32 offset | u32 size          (an `EntryLocation`)
    ledgers     key u64 ledger_id
                value u8 fenced | i64 lac | i64 explicit_lac | i64 last_entry_id | master key

A flush commits its locations and the changed ledger states in one write transaction; LMDB's
copy-on-write B+tree makes the commit atomic and durable (`sync=True`), with no log to replay.
Readers use their own read transactions from any thread. Every method blocks.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import lmdb

from bkaio.entry_records import RECORD_HEAD_BYTES
from bkaio.entrylog.entry_log import LOCATION, EntryLocation
from bkaio.entrylog.types import LedgerState, StoredEntry
from bkaio.errors import BookieIOError

_ENTRY_KEY = struct.Struct(">QQ")
_SIZE = struct.Struct(">I")  # The size field of a packed location (at byte 8).
_LEDGER_KEY = struct.Struct(">Q")
_STATE = struct.Struct(">?qqq")
_MAX_ID = (1 << 64) - 1


@dataclass(slots=True)
class IndexScan:
    """Indexed entries of a ledger in id order (`LedgerIndex.scan`)."""

    entry_ids: list[int] = field(default_factory=list)
    locations: list[bytes] = field(default_factory=list)  # Packed `EntryLocation`s.
    payload_bytes: int = 0
    # The first wanted entry not looked at because a limit was reached; None when the scan
    # looked at every indexed entry it was asked for.
    limited_at: int | None = None


def entry_key(ledger_id: int, entry_id: int) -> bytes:
    assert ledger_id >= 0 and entry_id >= 0, (ledger_id, entry_id)
    return _ENTRY_KEY.pack(ledger_id, entry_id)


def encode_state(state: LedgerState) -> bytes:
    return (
        _STATE.pack(state.fenced, state.lac, state.explicit_lac, state.last_entry_id)
        + state.master_key
    )


def decode_state(ledger_id: int, data: bytes) -> LedgerState:
    fenced, lac, explicit_lac, last_entry_id = _STATE.unpack_from(data)
    return LedgerState(
        ledger_id=ledger_id,
        fenced=fenced,
        master_key=bytes(data[_STATE.size :]),
        lac=lac,
        explicit_lac=explicit_lac,
        last_entry_id=last_entry_id,
    )


INDEX_NAME = "index.lmdb"


class LedgerIndex:
    def __init__(self, directory: Path, map_bytes: int, *, readonly: bool = False) -> None:
        """`readonly`: for offline tools (bkaio/bookie/offline.py); it may be opened while the
        bookie runs (LMDB readers of other processes share its lock file) and never writes
        data. It must exist."""
        self.directory = directory
        path = directory / INDEX_NAME
        if readonly and not path.exists():
            raise BookieIOError(f"{directory}: no LMDB index ({INDEX_NAME}) here")
        if not readonly:
            directory.mkdir(parents=True, exist_ok=True)
        try:
            self._env = lmdb.open(
                str(path),
                map_size=map_bytes,
                max_dbs=2,
                subdir=True,
                sync=True,
                metasync=True,
                readonly=readonly,
                readahead=False,  # Random point reads; readahead would only evict cache.
                max_readers=256,
            )
            self._locations = self._env.open_db(b"locations", create=not readonly)
            self._ledgers = self._env.open_db(b"ledgers", create=not readonly)
        except lmdb.Error as error:
            raise BookieIOError(f"{directory}: cannot open the LMDB index: {error}") from error

    def close(self) -> None:
        self._env.close()

    def commit(
        self,
        locations: Iterable[tuple[int, int, EntryLocation]],
        states: Iterable[LedgerState],
    ) -> None:
        """One durable transaction: entry locations plus ledger states."""
        pack_key = _ENTRY_KEY.pack
        pack_location = LOCATION.pack
        try:
            with self._env.begin(write=True) as txn:
                # One C call for every location of the flush, not a `put` per entry.
                txn.cursor(db=self._locations).putmulti(
                    [
                        (pack_key(ledger_id, entry_id), pack_location(*location))
                        for ledger_id, entry_id, location in locations
                    ]
                )
                for state in states:
                    txn.put(
                        _LEDGER_KEY.pack(state.ledger_id), encode_state(state), db=self._ledgers
                    )
        except lmdb.Error as error:
            raise BookieIOError(f"{self.directory}: index commit failed: {error}") from error

    def commit_entries(
        self,
        entries: list[StoredEntry],
        packed_locations: list[bytes],
        states: Iterable[LedgerState],
    ) -> None:
        """`commit` given the entries and their packed locations (`append_synced`'s)."""
        pack_key = _ENTRY_KEY.pack
        keys = [pack_key(entry.ledger_id, entry.entry_id) for entry in entries]
        try:
            with self._env.begin(write=True) as txn:
                txn.cursor(db=self._locations).putmulti(zip(keys, packed_locations, strict=True))
                for state in states:
                    txn.put(
                        _LEDGER_KEY.pack(state.ledger_id), encode_state(state), db=self._ledgers
                    )
        except lmdb.Error as error:
            raise BookieIOError(f"{self.directory}: index commit failed: {error}") from error

    def move_locations(self, moves: Iterable[tuple[int, int, EntryLocation, EntryLocation]]) -> int:
        """Compaction: point entries at their copies, only where they still point at the old
        place (a deletion meanwhile wins). Returns how many moved."""
        moved = 0
        with self._env.begin(write=True) as txn:
            for ledger_id, entry_id, old, new in moves:
                key = entry_key(ledger_id, entry_id)
                current = txn.get(key, db=self._locations)
                if current is not None and EntryLocation.unpack(current) == old:
                    txn.put(key, new.pack(), db=self._locations)
                    moved += 1
        return moved

    def delete_ledger(self, ledger_id: int) -> int:
        """Drop every location and the state of a ledger; returns the entries removed."""
        removed = 0
        with self._env.begin(write=True) as txn:
            cursor = txn.cursor(db=self._locations)
            positioned = cursor.set_range(entry_key(ledger_id, 0))
            while positioned:
                key = cursor.key()  # Empty once the cursor ran off the end.
                if not key or _ENTRY_KEY.unpack(key)[0] != ledger_id:
                    break
                positioned = cursor.delete()  # Deletes, then moves to the next record.
                removed += 1
            txn.delete(_LEDGER_KEY.pack(ledger_id), db=self._ledgers)
        return removed

    def get(self, ledger_id: int, entry_id: int) -> EntryLocation | None:
        with self._env.begin(db=self._locations) as txn:
            value = txn.get(entry_key(ledger_id, entry_id))
        return None if value is None else EntryLocation.unpack(value)

    def get_run(self, ledger_id: int, first_entry_id: int, max_count: int) -> list[EntryLocation]:
        """Locations of consecutive entries from `first_entry_id`, stopping at the first gap."""
        run: list[EntryLocation] = []
        expected = first_entry_id
        with self._env.begin(db=self._locations) as txn:
            cursor = txn.cursor()
            if not cursor.set_key(entry_key(ledger_id, first_entry_id)):
                return run
            for key, value in cursor:
                if len(run) >= max_count or _ENTRY_KEY.unpack(key) != (ledger_id, expected):
                    break
                run.append(EntryLocation.unpack(value))
                expected += 1
        return run

    def scan(
        self,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        stride: int,
        max_count: int,
        max_payload_bytes: int,
    ) -> IndexScan:
        """Indexed entries first, first + stride, ... <= last in order, at most `max_count`,
        and past the first at most `max_payload_bytes` of payload (a record's size less its
        head, RECORD_HEAD_BYTES). One cursor walk over the ledger's keys from `first`."""
        scan = IndexScan()
        if max_count < 1:
            scan.limited_at = first_entry_id
            return scan
        entry_ids = scan.entry_ids
        locations = scan.locations
        unpack_key = _ENTRY_KEY.unpack
        unpack_size = _SIZE.unpack_from
        head_bytes = RECORD_HEAD_BYTES
        payload = 0
        with self._env.begin(db=self._locations) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(entry_key(ledger_id, first_entry_id)):
                return scan
            for key, value in cursor:
                found_ledger, entry_id = unpack_key(key)
                if found_ledger != ledger_id or entry_id > last_entry_id:
                    break
                if stride != 1 and (entry_id - first_entry_id) % stride:
                    continue
                size = unpack_size(value, 8)[0] - head_bytes
                if entry_ids and payload + size > max_payload_bytes:
                    scan.limited_at = entry_id
                    break
                payload += size
                entry_ids.append(entry_id)
                locations.append(value)
                if len(entry_ids) >= max_count:
                    if entry_id + stride <= last_entry_id:
                        scan.limited_at = entry_id + stride
                    break
        scan.payload_bytes = payload
        return scan

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest indexed entry id of the ledger, -1 when none (a floor seek)."""
        with self._env.begin(db=self._locations) as txn:
            cursor = txn.cursor()
            if ledger_id < _MAX_ID and cursor.set_range(_ENTRY_KEY.pack(ledger_id + 1, 0)):
                found = cursor.prev()
            else:
                found = cursor.last()
            if not found:
                return -1
            found_ledger, entry_id = _ENTRY_KEY.unpack(cursor.key())
            return int(entry_id) if found_ledger == ledger_id else -1

    def entry_ids(self, ledger_id: int) -> list[int]:
        ids: list[int] = []
        with self._env.begin(db=self._locations) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(entry_key(ledger_id, 0)):
                return ids
            for key in cursor.iternext(keys=True, values=False):
                found_ledger, entry_id = _ENTRY_KEY.unpack(key)
                if found_ledger != ledger_id:
                    break
                ids.append(entry_id)
        return ids

    def states(self) -> dict[int, LedgerState]:
        found: dict[int, LedgerState] = {}
        with self._env.begin(db=self._ledgers) as txn:
            for key, value in txn.cursor():
                (ledger_id,) = _LEDGER_KEY.unpack(key)
                found[ledger_id] = decode_state(ledger_id, value)
        return found

    def locations_after(
        self, after: tuple[int, int] | None, limit: int
    ) -> list[tuple[int, int, EntryLocation]]:
        """Up to `limit` (ledger_id, entry_id, location) in key order strictly after `after`
        (None: from the start). Each call is its own short read transaction, so a long walk
        (the scrubber's) never pins old pages of a live index."""
        found: list[tuple[int, int, EntryLocation]] = []
        with self._env.begin(db=self._locations) as txn:
            cursor = txn.cursor()
            positioned = cursor.first() if after is None else cursor.set_range(entry_key(*after))
            if positioned and after is not None and cursor.key() == entry_key(*after):
                positioned = cursor.next()
            while positioned and len(found) < limit:
                ledger_id, entry_id = _ENTRY_KEY.unpack(cursor.key())
                found.append((ledger_id, entry_id, EntryLocation.unpack(cursor.value())))
                positioned = cursor.next()
        return found

    def all_locations(self) -> Iterator[tuple[int, int, EntryLocation]]:
        """Every (ledger_id, entry_id, location), in key order, from one read snapshot."""
        with self._env.begin(db=self._locations) as txn:
            for key, value in txn.cursor():
                ledger_id, entry_id = _ENTRY_KEY.unpack(key)
                yield ledger_id, entry_id, EntryLocation.unpack(value)
