"""The local consistency check: every indexed entry read back and verified.

For each location in a disk's index (in key order, a bounded batch at a time) the record is read
from its entry log and must: be there (its log exists and holds the whole record), pass the
record checksum, be the entry the index says (same ledger and entry id), and, when the caller
gives `digest_ok`, match the writer's digest (bkaio.protocol.digest; this package cannot import
the protocol). BookKeeper's `localconsistencycheck` and its background scrubber
(`localScrubPeriod`) make the same walk; here `bkaio bookie localconsistencycheck` runs it
offline over the directories and the bookie's scrubber (bkaio/bookie/scrubber.py) online, rate
limited, through the live storage's readers. Blocking: run batches on a thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from bkaio.entrylog.entry_log import EntryLocation
from bkaio.entrylog.index import LedgerIndex
from bkaio.entrylog.log_reader import log_path, read_record_at
from bkaio.entrylog.types import StoredEntry
from bkaio.errors import BookieIOError

DigestCheck = Callable[[StoredEntry], bool]
MAX_PROBLEMS_KEPT = 1000  # Per report: a disk full of damage must not fill memory.
_MOVE_RETRIES = 3  # Compaction may move an entry between the index read and the log read.


class EntryReader(Protocol):
    """Reads the record at a location: None when its log is gone (removed by compaction, or
    missing); BookieIOError when the bytes there are damaged."""

    def read(self, location: EntryLocation) -> StoredEntry | None: ...


class FileEntryReader:
    """An `EntryReader` over an entry-log directory's files (offline: the bookie may run)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def read(self, location: EntryLocation) -> StoredEntry | None:
        try:
            return read_record_at(log_path(self.directory, location.log_id), location)
        except FileNotFoundError:
            return None


@dataclass(frozen=True, slots=True)
class EntryProblem:
    ledger_id: int
    entry_id: int
    log_id: int
    offset: int
    problem: str

    def to_dict(self) -> dict[str, object]:
        return {
            "ledger_id": self.ledger_id,
            "entry_id": self.entry_id,
            "log_id": self.log_id,
            "offset": self.offset,
            "problem": self.problem,
        }


@dataclass(slots=True)
class BatchResult:
    checked: int = 0
    bytes: int = 0
    entries_by_ledger: dict[int, int] = field(default_factory=dict)
    problems: list[EntryProblem] = field(default_factory=list)
    last_key: tuple[int, int] | None = None  # Resume after this key; None with `done`.
    done: bool = False


def check_batch(
    index: LedgerIndex,
    reader: EntryReader,
    *,
    after: tuple[int, int] | None,
    limit: int,
    digest_ok: DigestCheck | None = None,
) -> BatchResult:
    """Verify up to `limit` indexed entries after key `after` (None: from the first)."""
    assert limit > 0, limit
    locations = index.locations_after(after, limit)
    result = BatchResult(last_key=after, done=len(locations) < limit)
    for ledger_id, entry_id, location in locations:
        result.last_key = (ledger_id, entry_id)
        outcome = _check_one(index, reader, ledger_id, entry_id, location, digest_ok)
        if outcome is None:
            continue  # Deleted while we looked: nothing to verify.
        if isinstance(outcome, EntryProblem):
            result.problems.append(outcome)
        else:
            result.bytes += outcome
        result.checked += 1
        result.entries_by_ledger[ledger_id] = result.entries_by_ledger.get(ledger_id, 0) + 1
    if result.done:
        result.last_key = None
    return result


def _check_one(
    index: LedgerIndex,
    reader: EntryReader,
    ledger_id: int,
    entry_id: int,
    location: EntryLocation,
    digest_ok: DigestCheck | None,
) -> EntryProblem | int | None:
    """The entry's payload size when it is sound, its problem, or None if it was deleted."""
    current: EntryLocation | None = location
    for _attempt in range(_MOVE_RETRIES):
        if current is None:
            return None
        try:
            entry = reader.read(current)
        except BookieIOError as error:
            return _problem(ledger_id, entry_id, current, str(error))
        except OSError as error:
            return _problem(ledger_id, entry_id, current, f"entry log unreadable: {error}")
        if entry is not None:
            if (entry.ledger_id, entry.entry_id) != (ledger_id, entry_id):
                return _problem(
                    ledger_id,
                    entry_id,
                    current,
                    f"the index points at ledger {entry.ledger_id} entry {entry.entry_id}",
                )
            if digest_ok is not None and not digest_ok(entry):
                return _problem(
                    ledger_id, entry_id, current, "payload does not match the writer's digest"
                )
            return len(entry.payload)
        moved = index.get(ledger_id, entry_id)
        if moved == current:
            return _problem(
                ledger_id, entry_id, current, f"entry log {current.log_id:08x}.log is missing"
            )
        current = moved
    return _problem(ledger_id, entry_id, location, "keeps moving under compaction; not checked")


def _problem(ledger_id: int, entry_id: int, location: EntryLocation, text: str) -> EntryProblem:
    return EntryProblem(ledger_id, entry_id, location.log_id, location.offset, text)


@dataclass(slots=True)
class LedgerReport:
    ledger_id: int
    entries: int = 0
    problems: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "ledger_id": self.ledger_id,
            "entries": self.entries,
            "problems": self.problems,
            "ok": self.problems == 0,
        }


@dataclass(slots=True)
class ConsistencyReport:
    """Totals and per-ledger results of a check over one or more disks."""

    entries: int = 0
    bytes: int = 0
    ledgers: dict[int, LedgerReport] = field(default_factory=dict)
    problems: list[EntryProblem] = field(default_factory=list)  # The first MAX_PROBLEMS_KEPT.
    problem_count: int = 0

    def add(self, batch: BatchResult) -> None:
        self.entries += batch.checked
        self.bytes += batch.bytes
        for ledger_id, count in batch.entries_by_ledger.items():
            self._ledger(ledger_id).entries += count
        for problem in batch.problems:
            self._ledger(problem.ledger_id).problems += 1
            self.problem_count += 1
            if len(self.problems) < MAX_PROBLEMS_KEPT:
                self.problems.append(problem)

    def _ledger(self, ledger_id: int) -> LedgerReport:
        report = self.ledgers.get(ledger_id)
        if report is None:
            report = self.ledgers[ledger_id] = LedgerReport(ledger_id)
        return report

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    def to_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "entries": self.entries,
            "bytes": self.bytes,
            "problem_count": self.problem_count,
            "ledgers": [self.ledgers[i].to_dict() for i in sorted(self.ledgers)],
            "problems": [p.to_dict() for p in self.problems],
        }


def check_disk(
    index: LedgerIndex,
    reader: EntryReader,
    report: ConsistencyReport,
    *,
    digest_ok: DigestCheck | None = None,
    batch_entries: int = 1000,
) -> None:
    """Every indexed entry of one disk, added to `report` (offline: no rate limit)."""
    after: tuple[int, int] | None = None
    while True:
        batch = check_batch(index, reader, after=after, limit=batch_entries, digest_ok=digest_ok)
        report.add(batch)
        if batch.done:
            return
        after = batch.last_key
