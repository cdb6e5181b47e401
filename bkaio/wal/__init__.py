"""The write-ahead log as ledger storage sees it: the narrow interface between `bkaio.entrylog`
and `bkaio.journal`, in a neutral place below both.

`JournalLike` is what ledger storage asks of a journal; `bkaio.journal.Journal` implements it,
and the bookie (or a test) hands storage a factory of them. The records, marks and replay
results travel between the two (`records`), and the journal's configuration is part of the
storage configuration (`config`). Nothing here imports either package.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

from bkaio.wal.config import JournalConfig
from bkaio.wal.records import (
    CheckpointRecord,
    Corruption,
    EntryRecord,
    FenceRecord,
    JournalEntry,
    JournalMark,
    JournalRecord,
    LacRecord,
    MasterKeyRecord,
    ReplayResult,
    TornTail,
)

__all__ = [
    "CheckpointRecord",
    "Corruption",
    "EntryRecord",
    "FenceRecord",
    "JournalConfig",
    "JournalEntry",
    "JournalFactory",
    "JournalLike",
    "JournalMark",
    "JournalRecord",
    "LacRecord",
    "MasterKeyRecord",
    "ReplayReader",
    "ReplayResult",
    "TornTail",
]


class ReplayReader(Protocol):
    """A journal's records after a mark, read in bounded batches (each `next()` of `batches`
    blocks: run it in an executor), and how the reading ended so far."""

    end_mark: JournalMark
    torn_tail: TornTail | None
    earlier_torn_tails: list[TornTail]
    corruption: list[Corruption]

    def batches(self, max_bytes: int) -> Iterator[list[tuple[JournalMark, JournalRecord]]]: ...


class JournalLike(Protocol):
    """The journal of one directory as ledger storage uses it; stand-ins implement all of it."""

    def append(self, record: JournalRecord, *, lazy: bool = False) -> asyncio.Future[JournalMark]:
        """Queue a record (a key, a fence, a LAC); the future: its mark once durable. A `lazy`
        record causes no group of its own: it goes with the next one (or after a delay)."""
        ...

    def append_entries(
        self, ledger_id: int, entries: Sequence[JournalEntry]
    ) -> tuple[asyncio.Future[JournalMark], int] | None:
        """Append entries of one ledger to the filling group (the add path): the group's shared
        future and the offset after them; None, appending nothing, at a bound."""
        ...

    async def wait_for_room(self) -> None:
        """Return once the filling group can take a record."""
        ...

    def iter_replay(self, after: JournalMark | None) -> ReplayReader:
        """The records after `after`, streamed: a journal of any size replays in bounded
        memory (bkaio/entrylog/shard_storage.py `_replay`)."""
        ...

    async def delete_files_before(self, mark: JournalMark) -> object: ...

    async def close(self) -> None: ...


# Opens the journal of one of `config.directories` (ledger storage opens one per directory).
JournalFactory = Callable[[JournalConfig, Path], Awaitable[JournalLike]]
