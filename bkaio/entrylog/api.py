"""`LedgerStorage`: what a shard's request handling may ask of its storage.

`ShardStorage` implements it, and so does every stand-in of a test, in full. The add path is
one method, `add_entries`, for one entry or a frame of them; reads are `read_range` (a single
entry is a range of one, the last one `read_range(ledger, -1, 1, ...)`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from bkaio.entrylog.record_reads import RecordRun
from bkaio.entrylog.types import AddBatch, DiskUsage, LedgerState, StoredEntry
from bkaio.errors import BKError

__all__ = ["AddsDone", "LedgerStorage"]

_Batch = TypeVar("_Batch", bound=AddBatch)

# Storage's answer for the batches of one journal group, in the order they were added: None
# when every add is durable (but the ones in a batch's `failures`), else the group's error.
AddsDone = Callable[[list[_Batch], BKError | None], None]


class LedgerStorage(Protocol):
    """One shard's ledger storage, as its request handling uses it. Event loop only."""

    # Told True when adds start waiting for write-cache room, and False once none waits.
    room_pressure_listener: Callable[[bool], None] | None

    def add_entries(
        self, batch: _Batch, on_durable: Callable[[list[_Batch], BKError | None], None]
    ) -> None:
        """Make `batch` durable, then call `on_durable` with it (and the other batches of its
        journal group). Never raises: every outcome goes to `on_durable`, at most once per
        batch, in journal order; possibly before this returns (a refused batch)."""
        ...

    def holds_key(self, ledger_id: int) -> bool:
        """Whether storage holds the ledger's master key (it then checks adds against it)."""
        ...

    async def fence(self, ledger_id: int, master_key: bytes) -> None: ...

    async def write_lac(self, ledger_id: int, master_key: bytes, lac: int) -> None: ...

    async def force(self, ledger_id: int) -> None: ...

    async def read_range(
        self, ledger_id: int, first_entry_id: int, max_count: int, max_bytes: int
    ) -> list[StoredEntry]:
        """Consecutive entries from `first_entry_id` (-1: the last one stored), at most
        `max_count` and, but for the first, `max_bytes`; NoSuchEntryError when there is none."""
        ...

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
        """Entries first, first + stride, ... <= last stored here, as entry records (as on
        disk): at most `max_count` and, but for the first, `max_bytes` of payload; the run says
        where it stopped looking. Entries <= `journaling_up_to` still being journaled here come
        too (a long poll's LAC covers them). NoSuchLedgerError for a ledger not here."""
        ...

    def ledger_state(self, ledger_id: int) -> LedgerState | None: ...

    def last_add_confirmed(self, ledger_id: int) -> int: ...

    async def list_entries(self, ledger_id: int) -> list[tuple[int, int]]: ...

    def disk_usage(self) -> list[DiskUsage]: ...

    async def close(self) -> None: ...
