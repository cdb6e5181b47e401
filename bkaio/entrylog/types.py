"""Value types of ledger storage, shared by its modules and re-exported by `shard_storage`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bkaio.entries import AddBatch, StoredEntry

__all__ = [
    "AddBatch",
    "CompactionReport",
    "DiskUsage",
    "LedgerState",
    "StoredEntry",
]


@dataclass(frozen=True, slots=True)
class LedgerState:
    ledger_id: int
    fenced: bool
    master_key: bytes
    lac: int  # Max of every piggybacked LAC and explicit LAC stored; -1 when none.
    explicit_lac: int  # Last WRITE_LAC value; -1 when none.
    last_entry_id: int  # Highest entry id stored; -1 when none.


@dataclass(frozen=True, slots=True)
class DiskUsage:
    path: Path
    kind: str  # "journal", "ledger" or "index".
    total_bytes: int
    used_bytes: int
    fraction: float  # used / (used + free): df's Use%, 1.0 once the bookie cannot write.
    over_warn: bool
    over_read_only: bool


@dataclass(frozen=True, slots=True)
class CompactionReport:
    logs_examined: int
    logs_compacted: int  # Rewritten: live entries copied out, then the file removed.
    logs_deleted: int  # Removed without copying: nothing live left in them.
    entries_moved: int
    bytes_moved: int
    bytes_freed: int  # File bytes returned to the filesystem.
