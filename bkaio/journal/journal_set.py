"""Several journal directories (disks) used as one: each ledger's records go to one journal.

Routing: ledger L goes to journal `(L // ledger_stride) % len(directories)`. A bookie shard
already owns only the ledgers with `L % shard_count == shard_index`, so a shard passes
`ledger_stride=shard_count`; otherwise every ledger of a shard would land on one journal
whenever the journal count divides the shard count. All records of a ledger (entries,
master key, fence, LAC) stay in one journal, so their order is kept, and recovery replays
each journal on its own: there is no order between journals to restore.

A checkpoint needs one mark per journal: `durable_marks()` before the ledger storage flush,
then `delete_files_before(marks)` after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from bkaio.errors import ConfigError
from bkaio.journal.config import JournalConfig
from bkaio.journal.errors import RecordError
from bkaio.journal.journal import Journal
from bkaio.journal.records import JournalMark, JournalRecord, record_ledger_id
from bkaio.journal.replay import ReplayResult


class JournalSet:
    """One `Journal` per configured directory, routed by ledger id."""

    def __init__(self, journals: Sequence[Journal], *, ledger_stride: int) -> None:
        assert journals and ledger_stride > 0, (journals, ledger_stride)
        self.journals: tuple[Journal, ...] = tuple(journals)
        self._ledger_stride = ledger_stride

    @classmethod
    async def open(
        cls,
        config: JournalConfig,
        *,
        ledger_stride: int = 1,
        sync_function: Callable[[int], None] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> JournalSet:
        if ledger_stride <= 0:
            raise ConfigError(f"journal ledger_stride={ledger_stride} must be positive")
        journals: list[Journal] = []
        try:
            for directory in config.directories:
                journals.append(
                    await Journal.open(
                        config, sync_function=sync_function, loop=loop, directory=directory
                    )
                )
        except BaseException:
            for journal in journals:
                await journal.close()
            raise
        return cls(journals, ledger_stride=ledger_stride)

    def index_for(self, ledger_id: int) -> int:
        return (ledger_id // self._ledger_stride) % len(self.journals)

    def journal_for(self, ledger_id: int) -> Journal:
        return self.journals[self.index_for(ledger_id)]

    def append(self, record: JournalRecord) -> asyncio.Future[JournalMark]:
        """Append to the journal of the record's ledger (a checkpoint has none: use one)."""
        ledger_id = record_ledger_id(record)
        if ledger_id is None:
            raise RecordError(
                f"{record!r} belongs to no ledger: append it to a chosen journal of the set"
            )
        return self.journal_for(ledger_id).append(record)

    async def force_all(self) -> tuple[JournalMark, ...]:
        """Wait until everything appended to any journal so far is durable."""
        return tuple(await asyncio.gather(*(journal.force() for journal in self.journals)))

    def durable_marks(self) -> tuple[JournalMark, ...]:
        return tuple(journal.durable_mark for journal in self.journals)

    def replay(self, after: Sequence[JournalMark | None]) -> list[ReplayResult]:
        """Replay each journal after its own mark. Blocking: run it in an executor."""
        if len(after) != len(self.journals):
            raise ConfigError(
                f"{len(after)} checkpoint marks for {len(self.journals)} journal directories; "
                "the journal directory list changed since the checkpoint"
            )
        return [journal.replay(mark) for journal, mark in zip(self.journals, after, strict=True)]

    async def delete_files_before(self, marks: Sequence[JournalMark]) -> list[str]:
        if len(marks) != len(self.journals):
            raise ConfigError(f"{len(marks)} marks for {len(self.journals)} journals")
        deleted: list[str] = []
        for journal, mark in zip(self.journals, marks, strict=True):
            deleted += [str(path) for path in await journal.delete_files_before(mark)]
        return deleted

    async def close(self) -> None:
        for journal in self.journals:
            await journal.close()
