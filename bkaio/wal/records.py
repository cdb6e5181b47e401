"""The records of the write-ahead log and where they sit: what ledger storage and the journal
agree on, with neither importing the other (docs/architecture.md).

The journal (`bkaio.journal`) writes these records and gives them back on replay; ledger storage
(`bkaio.entrylog`) asks for them and applies them. Their byte format is the journal's
(`bkaio.journal.records`). Pure data: no files, no asyncio.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True, slots=True, order=True)
class JournalMark:
    """A position in the journal: byte `offset` in file `file_id`. Marks order like positions."""

    file_id: int
    offset: int


class JournalEntry(Protocol):
    """An entry as `Journal.append_entries` reads it (ledger storage's `StoredEntry`)."""

    @property
    def entry_id(self) -> int: ...
    @property
    def lac(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def digest(self) -> int: ...
    @property
    def payload(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class EntryRecord:
    ledger_id: int
    entry_id: int
    lac: int  # The writer's piggybacked LAC.
    length: int  # Ledger length after this entry.
    digest: int  # CRC32C as the writer computed it; stored, not checked, by the journal.
    payload: bytes


@dataclass(frozen=True, slots=True)
class MasterKeyRecord:
    ledger_id: int
    master_key: bytes


@dataclass(frozen=True, slots=True)
class FenceRecord:
    ledger_id: int


@dataclass(frozen=True, slots=True)
class LacRecord:
    """An explicit LAC (WRITE_LAC)."""

    ledger_id: int
    lac: int


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    """Informational: ledger storage held everything up to `mark` when this was written."""

    mark: JournalMark


JournalRecord = EntryRecord | MasterKeyRecord | FenceRecord | LacRecord | CheckpointRecord


@dataclass(frozen=True, slots=True)
class TornTail:
    """Where a journal file stops being readable, and why. Records from here were never acked."""

    file: Path
    offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class Corruption:
    """A bad record with valid records after it: data that was once synced is damaged."""

    file: Path
    offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class ReplayResult:
    records: list[tuple[JournalMark, JournalRecord]]  # Mark = position just after the record.
    end_mark: JournalMark  # After the last replayed record; `after` (or 0:0) when none.
    torn_tail: TornTail | None  # Of the last file replayed: where the crash cut it.
    corruption: list[Corruption]
    # Tails of earlier files: left by earlier crashes (a restarted journal writes a new file)
    # or zeros after the last record of a preallocated file. Expected, listed for operators.
    earlier_torn_tails: list[TornTail] = field(default_factory=list)
