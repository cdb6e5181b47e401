"""In-memory stand-ins for bookies and the ledger metadata store (unit tests only).

`FakeBookie` keeps the storage semantics a real shard has (master key on first sight, fencing,
RECOVERY_ADD, LAC = max of piggybacked and explicit; long polls answered as the LAC moves, not
on a clock); `FakeBookieOps` implements the client's
`BookieOps` seam on top of a set of them, with knobs to take a bookie down, hang it, hold
its adds until released, or give it a max_entry_bytes. Its batch and fan-out calls
(`add_entries`, `add_entry_many`) apply each add through `add_entry`, so the storage
semantics and the knobs are the same on every path; it records each batch it takes, and a
bookie in `refuse_batches` takes none (False, as the wire pool answers for a connection that
takes no ADD_ENTRIES frames). `FakeLedgerStore` is a CAS store of `LedgerMetadata`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from types import MethodType
from typing import Any

import msgpack

from bkaio.errors import (
    BKTimeoutError,
    BookieUnavailableError,
    DataUnknownError,
    EntryConflictError,
    LedgerFencedError,
    MetadataVersionError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from bkaio.ledger_client.bookie_connection import add_error
from bkaio.ledger_client.types import (
    AddCallback,
    AddFrame,
    EntriesAnswer,
    LacAnswer,
    StoredCopy,
)
from bkaio.meta.bookies import BookieInfo
from bkaio.meta.errors import LedgerExistsError, MetadataOutcomeUnknownError
from bkaio.meta.ledger_metadata import LedgerMetadata
from bkaio.protocol.records import pack_record
from bkaio.status import Status


@dataclass
class _FakeLedger:
    master_key: bytes
    fenced: bool = False
    explicit_lac: int = -1
    entries: dict[int, StoredCopy] = field(default_factory=dict)

    @property
    def lac(self) -> int:
        piggybacked = max((copy.lac for copy in self.entries.values()), default=-1)
        return max(piggybacked, self.explicit_lac)


class FakeBookie:
    """One bookie's ledger storage, in memory."""

    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id
        self.ledgers: dict[int, _FakeLedger] = {}
        self.limbo: set[int] = set()  # Ledgers it may have lost entries of (a reformat).
        # Resolved at the next change of what a long poll waits for (an entry, an explicit LAC,
        # fencing): as a real bookie's long polls are woken, not polling on a clock.
        self._change: asyncio.Future[None] | None = None

    def changed(self) -> None:
        """Wake the long polls: something they wait for may have changed."""
        change, self._change = self._change, None
        if change is not None and not change.done():
            change.set_result(None)

    def next_change(self) -> asyncio.Future[None]:
        """Resolved at the next `changed()` (one future shared by every waiting poll)."""
        if self._change is None:
            self._change = asyncio.get_running_loop().create_future()
        return self._change

    def reformat(self) -> None:
        """Its disks wiped: every ledger it held goes into limbo, its entries are gone."""
        self.limbo |= set(self.ledgers)
        self.ledgers.clear()

    def _ledger(self, ledger_id: int, master_key: bytes) -> _FakeLedger:
        ledger = self.ledgers.setdefault(ledger_id, _FakeLedger(master_key))
        if ledger.master_key != master_key:
            raise UnauthorizedError(f"{self.bookie_id}: wrong master key for ledger {ledger_id}")
        return ledger

    def add(self, ledger_id: int, copy: StoredCopy, master_key: bytes, recovery: bool) -> None:
        if ledger_id in self.limbo and not recovery:
            raise LedgerFencedError(f"{self.bookie_id}: ledger {ledger_id} is in limbo")
        ledger = self._ledger(ledger_id, master_key)
        if ledger.fenced and not recovery:
            raise LedgerFencedError(f"{self.bookie_id}: ledger {ledger_id} is fenced")
        existing = ledger.entries.get(copy.entry_id)
        if existing is not None and existing.payload != copy.payload:
            raise EntryConflictError(f"{self.bookie_id}: entry {copy.entry_id} differs")
        ledger.entries[copy.entry_id] = copy
        self.changed()

    def read(
        self, ledger_id: int, entry_id: int, fence: bool, master_key: bytes | None
    ) -> StoredCopy:
        if fence:
            assert master_key is not None
            self._ledger(ledger_id, master_key).fenced = True
            self.changed()
        ledger = self.ledgers.get(ledger_id)
        copy = None if ledger is None else ledger.entries.get(entry_id)
        if copy is None and ledger_id in self.limbo:
            raise DataUnknownError(f"{self.bookie_id}: ledger {ledger_id} is in limbo")
        if ledger is None:
            raise NoSuchLedgerError(f"{self.bookie_id}: no ledger {ledger_id}")
        if copy is None:
            raise NoSuchEntryError(f"{self.bookie_id}: no entry {entry_id}")
        return copy

    def lac(self, ledger_id: int, fence: bool, master_key: bytes | None) -> LacAnswer:
        if fence:
            assert master_key is not None
            self._ledger(ledger_id, master_key).fenced = True
            self.changed()
        ledger = self.ledgers.get(ledger_id)
        if ledger is None:
            raise NoSuchLedgerError(f"{self.bookie_id}: no ledger {ledger_id}")
        return LacAnswer(ledger.lac, max(ledger.entries, default=-1))

    def corrupt(self, ledger_id: int, entry_id: int) -> None:
        ledger = self.ledgers[ledger_id]
        copy = ledger.entries[entry_id]
        flipped = bytes([copy.payload[0] ^ 0xFF]) + copy.payload[1:]
        ledger.entries[entry_id] = StoredCopy(
            copy.entry_id, copy.lac, copy.length, copy.digest, flipped
        )


class FakeBookieOps:
    """`BookieOps` over FakeBookies, with fault knobs per bookie id."""

    def __init__(self, bookies: list[FakeBookie], *, timeout: float = 0.2) -> None:
        self.bookies = {b.bookie_id: b for b in bookies}
        self.timeout = timeout
        self.down: set[str] = set()  # Fail at once (connection refused).
        self.hung: set[str] = set()  # Never answer: requests time out.
        self.held: dict[str, list[Callable[[], None]]] = {}  # Adds parked until release().
        self.fence_lost: set[str] = set()  # Fencing READ_LAC requests to these are dropped.
        # A bookie's server.max_entry_bytes: a larger add is answered BAD_REQUEST (as the real
        # connection hands that answer on: `add_error`).
        self.max_entry_bytes: dict[str, int] = {}
        self.slow_reads: set[str] = set()  # Reads from these time out.
        self.stalled_reads: set[str] = set()  # Reads from these wait until cancelled.
        self.add_count: dict[str, int] = {}
        self.range_reads: list[tuple[str, int, int]] = []  # (bookie, first entry, entries got).
        self.range_bytes: list[int] = []  # Payload bytes of each range answer, in order.
        self.entry_reads = 0
        self.batches: list[tuple[str, list[int], list[int]]] = []  # bookie, entry ids, frame sizes
        self.refuse_batches: set[str] = set()
        self.closed = False

    def hold(self, bookie_id: str) -> None:
        self.held.setdefault(bookie_id, [])

    def release(self, bookie_id: str) -> None:
        for action in self.held.pop(bookie_id, []):
            action()

    def info(self, bookie_id: str, rack: str = "/default-rack") -> BookieInfo:
        host, port = bookie_id.split(":")
        return BookieInfo(bookie_id=bookie_id, host=host, port=int(port), rack=rack)

    def add_entry(
        self,
        bookie_id: str,
        ledger_id: int,
        entry_id: int,
        *,
        recovery: bool,
        master_key: bytes,
        lac: int,
        length: int,
        digest: int,
        payload: bytes,
        callback: AddCallback,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.add_count[bookie_id] = self.add_count.get(bookie_id, 0) + 1
        if bookie_id in self.down:
            loop.call_soon(callback, BookieUnavailableError(f"{bookie_id} is down"))
            return
        if bookie_id in self.hung:
            loop.call_later(self.timeout, callback, BKTimeoutError(f"{bookie_id} timed out"))
            return
        copy = StoredCopy(entry_id, lac, length, digest, payload)

        def apply() -> None:
            if bookie_id in self.down:
                callback(BookieUnavailableError(f"{bookie_id} is down"))
                return
            if len(payload) > self.max_entry_bytes.get(bookie_id, len(payload)):
                callback(add_error(bookie_id, Status.BAD_REQUEST, ledger_id, entry_id))
                return
            try:
                self.bookies[bookie_id].add(ledger_id, copy, master_key, recovery)
            except Exception as error:
                assert hasattr(error, "retriable"), error
                callback(error)  # type: ignore[arg-type]
            else:
                callback(None)

        if bookie_id in self.held:
            self.held[bookie_id].append(apply)
        else:
            loop.call_soon(apply)

    def add_entry_many(
        self,
        targets: Sequence[tuple[str, Callable[[Any, Any], None]]],
        add: object,
        ledger_id: int,
        entry_id: int,
        recovery: bool,
        master_key: bytes,
        lac: int,
        length: int,
        digest: int,
        payload: bytes,
    ) -> None:
        for bookie_id, handler in targets:
            self.add_entry(
                bookie_id, ledger_id, entry_id, recovery=recovery, master_key=master_key, lac=lac,
                length=length, digest=digest, payload=payload, callback=MethodType(handler, add),
            )  # fmt: skip

    def add_entries(
        self,
        bookie_id: str,
        ledger_id: int,
        recovery: bool,
        master_key: bytes,
        handler: Callable[[Any, Any], None],
        adds: Sequence[Any],
        frames: Sequence[AddFrame],
    ) -> bool:
        if bookie_id in self.refuse_batches:
            return False
        entries = [
            msgpack.unpackb(b"\x95" + packed) for _, _, packed_entries, _ in frames
            for packed in packed_entries
        ]  # fmt: skip
        assert len(entries) == len(adds)
        self.batches.append(
            (
                bookie_id,
                [entry[0] for entry in entries],
                [end - start for start, end, _, _ in frames],
            )
        )
        for add, (entry_id, lac, length, digest, payload) in zip(adds, entries, strict=True):
            self.add_entry(
                bookie_id, ledger_id, entry_id, recovery=recovery, master_key=master_key, lac=lac,
                length=length, digest=digest, payload=payload, callback=MethodType(handler, add),
            )  # fmt: skip
        return True

    def when_writable(self, bookie_id: str, ledger_id: int, callback: Callable[[], None]) -> bool:
        return False  # Every fake bookie reads as fast as it is written to.

    def defer_send(self, send: Callable[[], None]) -> None:
        asyncio.get_running_loop().call_soon(send)

    async def close(self) -> None:
        self.closed = True

    async def _gate(self, bookie_id: str) -> None:
        await asyncio.sleep(0)
        if bookie_id in self.stalled_reads:
            await asyncio.Event().wait()  # A bookie that never answers (no timeout either).
        if bookie_id in self.down:
            raise BookieUnavailableError(f"{bookie_id} is down")
        if bookie_id in self.hung:
            await asyncio.sleep(self.timeout)
            raise BKTimeoutError(f"{bookie_id} timed out")

    async def read_entry(
        self,
        bookie_id: str,
        ledger_id: int,
        entry_id: int,
        *,
        fence: bool = False,
        master_key: bytes | None = None,
    ) -> StoredCopy:
        await self._gate(bookie_id)
        self.entry_reads += 1
        if bookie_id in self.slow_reads:
            await asyncio.sleep(self.timeout)
            raise BKTimeoutError(f"{bookie_id}: read timed out")
        return self.bookies[bookie_id].read(ledger_id, entry_id, fence, master_key)

    async def read_entries(
        self,
        bookie_id: str,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        stride: int = 1,
        max_count: int,
        max_bytes: int,
        previous_lac: int | None = None,
        long_poll_seconds: float = 0.0,
    ) -> EntriesAnswer:
        """Like a bookie's READ_ENTRIES: the wanted entries it holds, as records."""
        await self._gate(bookie_id)
        if bookie_id in self.slow_reads:
            await asyncio.sleep(self.timeout)
            raise BKTimeoutError(f"{bookie_id}: read timed out")
        bookie = self.bookies[bookie_id]
        if previous_lac is not None:

            def answers() -> bool:
                ledger = bookie.ledgers.get(ledger_id)
                return ledger is not None and (ledger.lac > previous_lac or ledger.fenced)

            await _long_poll(bookie, answers, long_poll_seconds)
        ledger = bookie.ledgers.get(ledger_id)
        if ledger is None:
            if previous_lac is not None:
                return EntriesAnswer(-1, first_entry_id, b"")
            raise NoSuchLedgerError(f"{bookie_id}: no ledger {ledger_id}")
        last = last_entry_id if previous_lac is None else min(last_entry_id, ledger.lac)
        parts: list[bytes] = []
        count = size = 0
        next_id = first_entry_id
        while next_id <= last and count < max_count:
            copy = ledger.entries.get(next_id)
            if copy is not None:
                if count and size + len(copy.payload) > max_bytes:
                    break
                parts += pack_record(
                    ledger_id, next_id, copy.lac, copy.length, copy.digest, copy.payload
                )
                count += 1
                size += len(copy.payload)
            next_id += stride
        self.range_reads.append((bookie_id, first_entry_id, count))
        self.range_bytes.append(size)
        return EntriesAnswer(ledger.lac, next_id, b"".join(parts))

    async def read_lac(
        self,
        bookie_id: str,
        ledger_id: int,
        *,
        fence: bool = False,
        master_key: bytes | None = None,
        previous_lac: int | None = None,
        long_poll_seconds: float = 0.0,
    ) -> LacAnswer:
        await self._gate(bookie_id)
        if fence and bookie_id in self.fence_lost:
            await asyncio.sleep(self.timeout)
            raise BKTimeoutError(f"{bookie_id}: fence request lost")
        bookie = self.bookies[bookie_id]
        if previous_lac is None:
            return bookie.lac(ledger_id, fence, master_key)

        def lac() -> LacAnswer:
            try:
                return bookie.lac(ledger_id, False, None)
            except NoSuchLedgerError:
                return LacAnswer(-1, -1)

        await _long_poll(bookie, lambda: lac().lac > previous_lac, long_poll_seconds)
        return lac()

    async def write_lac(self, bookie_id: str, ledger_id: int, master_key: bytes, lac: int) -> None:
        await self._gate(bookie_id)
        bookie = self.bookies[bookie_id]
        ledger = bookie._ledger(ledger_id, master_key)
        ledger.explicit_lac = max(ledger.explicit_lac, lac)
        bookie.changed()


async def _long_poll(bookie: FakeBookie, answers: Callable[[], bool], seconds: float) -> None:
    """Until `answers()` or `seconds` are over, woken by the bookie's changes (a real bookie
    answers a long poll as the LAC moves: two bookies that learn it at once answer at once)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not answers():
        left = deadline - loop.time()
        if left <= 0:
            return
        await asyncio.wait((bookie.next_change(),), timeout=left)


class FakeLedgerStore:
    """Ledger metadata with compare-and-swap on a version counter."""

    def __init__(self) -> None:
        self.records: dict[int, LedgerMetadata] = {}
        self._versions = itertools.count(1)
        self._ids = itertools.count(1)
        self.unknown_outcome_next_update = False  # Apply the next update, then "lose" the reply.
        self.updates = 0

    async def next_id(self) -> int:
        await asyncio.sleep(0)
        return next(self._ids)

    async def create(self, metadata: LedgerMetadata) -> LedgerMetadata:
        """As `LedgerManager.create`: an unassigned id (-1) is allocated, a given one must be
        free."""
        await asyncio.sleep(0)
        if metadata.ledger_id < 0:
            metadata = metadata.replace(ledger_id=next(self._ids))
        if metadata.ledger_id in self.records:
            raise LedgerExistsError(f"ledger {metadata.ledger_id} already exists")
        stored = metadata.with_version(next(self._versions))
        self.records[stored.ledger_id] = stored
        return stored

    async def get(self, ledger_id: int) -> LedgerMetadata:
        await asyncio.sleep(0)
        if ledger_id not in self.records:
            raise NoSuchLedgerError(f"ledger {ledger_id} has no metadata")
        return self.records[ledger_id]

    async def update(self, metadata: LedgerMetadata) -> LedgerMetadata:
        await asyncio.sleep(0)
        current = self.records.get(metadata.ledger_id)
        if current is None:
            raise NoSuchLedgerError(f"ledger {metadata.ledger_id} was deleted")
        if current.version != metadata.version:
            raise MetadataVersionError(
                f"ledger {metadata.ledger_id}: version {metadata.version} != {current.version}"
            )
        stored = metadata.with_version(next(self._versions))
        self.records[metadata.ledger_id] = stored
        self.updates += 1
        if self.unknown_outcome_next_update:
            self.unknown_outcome_next_update = False
            raise MetadataOutcomeUnknownError("connection lost during the update")
        return stored

    async def delete(self, ledger_id: int) -> None:
        await asyncio.sleep(0)
        if self.records.pop(ledger_id, None) is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} has no metadata")

    async def list_ids(self) -> AsyncIterator[int]:
        for ledger_id in sorted(self.records):
            yield ledger_id
