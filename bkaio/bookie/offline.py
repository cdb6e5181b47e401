"""What a bookie's directories hold, read without the bookie: the offline admin tools.

    last_marks(config)                       `bkaio bookie lastmark`, GET .../last_log_mark
    list_files(config, kinds)                `bkaio bookie listfilesondisc`, .../list_disk_file
    read_journal(path)                       `bkaio bookie readjournal`
    read_entry_log(path, ...)                `bkaio bookie readentrylog`
    check_consistency(config)                `bkaio bookie localconsistencycheck`

Every function blocks (file I/O) and only reads, so it is safe while the bookie runs (the
answers are then a moment's picture). Shard i's directories come from the configuration
(`<dir>/shard-<i>`, bkaio/config/bookie_config.py); a journal is named by its file id or file
name, an entry log by its id or file name plus the shard and disk holding it, or either by a path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bkaio.config import BookieConfig
from bkaio.entrylog.checkpoint import read_last_mark
from bkaio.entrylog.consistency import ConsistencyReport, FileEntryReader, check_disk
from bkaio.entrylog.entry_log import ENTRY_LOG_SUBDIR
from bkaio.entrylog.index import INDEX_NAME, LedgerIndex
from bkaio.entrylog.log_reader import LogRecord, iter_log_records, log_path, parse_log_name
from bkaio.entrylog.types import StoredEntry
from bkaio.errors import ConfigError
from bkaio.journal.files import HEADER_BYTES as JOURNAL_HEADER_BYTES
from bkaio.journal.files import SUFFIX as JOURNAL_SUFFIX
from bkaio.journal.files import file_name as journal_file_name
from bkaio.journal.files import header_problem
from bkaio.journal.records import (
    CheckpointRecord,
    EntryRecord,
    FenceRecord,
    JournalRecord,
    LacRecord,
    MasterKeyRecord,
)
from bkaio.journal.replay import JournalReader
from bkaio.protocol.digest import verify_entry_digest

FILE_KINDS = ("journal", "entrylog", "index")


@dataclass(frozen=True, slots=True)
class LastMark:
    """Where shard `shard`'s ledger storage holds everything of one journal up to."""

    shard: int
    journal_dir: str
    file_id: int | None  # None: no checkpoint yet (a restart replays the whole journal).
    offset: int | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "journal_dir": self.journal_dir,
            "file_id": self.file_id,
            "file": None if self.file_id is None else journal_file_name(self.file_id),
            "offset": self.offset,
        }


def _check_shard(config: BookieConfig, shard: int) -> None:
    if not 0 <= shard < config.shard_count:
        last = config.shard_count - 1
        raise ConfigError(f"shard {shard} does not exist: {config.bookie_id} has shards 0..{last}")


def last_marks(config: BookieConfig) -> list[LastMark]:
    """Every shard's checkpoint mark per journal, from the `lastMark` files of its ledger dirs."""
    found: list[LastMark] = []
    for shard, storage in enumerate(config.storage):
        journals = storage.journal.directories
        marks = read_last_mark([Path(d) for d in storage.ledger_dirs], len(journals))
        for directory, mark in zip(journals, marks, strict=True):
            found.append(
                LastMark(
                    shard,
                    str(directory),
                    None if mark is None else mark.file_id,
                    None if mark is None else mark.offset,
                )
            )
    return found


@dataclass(frozen=True, slots=True)
class DiskFile:
    kind: str  # One of FILE_KINDS.
    shard: int
    path: str
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "shard": self.shard, "path": self.path, "bytes": self.bytes}


def _files_in(directory: Path, suffix: str | None) -> list[Path]:
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    return [
        directory / name
        for name in names
        if (suffix is None or name.endswith(suffix)) and (directory / name).is_file()
    ]


def list_files(config: BookieConfig, kinds: tuple[str, ...] = FILE_KINDS) -> list[DiskFile]:
    """Journal files, entry logs and index files of every shard, with their sizes."""
    unknown = set(kinds) - set(FILE_KINDS)
    if unknown:
        raise ConfigError(f"file kinds {sorted(unknown)} unknown; known: {', '.join(FILE_KINDS)}")
    found: list[DiskFile] = []
    for shard, storage in enumerate(config.storage):
        places: list[tuple[str, Path, str | None]] = []
        if "journal" in kinds:
            places += [("journal", Path(d), JOURNAL_SUFFIX) for d in storage.journal.directories]
        if "entrylog" in kinds:
            logs = [Path(d) / ENTRY_LOG_SUBDIR for d in storage.ledger_dirs]
            places += [("entrylog", d, ".log") for d in logs]
        if "index" in kinds:
            places += [("index", Path(d) / INDEX_NAME, None) for d in storage.index_dirs]
        for kind, directory, suffix in places:
            for path in _files_in(directory, suffix):
                size = path.stat().st_size
                found.append(DiskFile(kind, shard, str(path), size))
    return found


# -- journals -------------------------------------------------------------------------------


def journal_path(config: BookieConfig, name: str, *, shard: int = 0, journal: int = 0) -> Path:
    """The journal file `name` (a path, a file name, or a file id in decimal) of a shard."""
    as_path = Path(name)
    if as_path.is_absolute() or os.sep in name:
        return as_path
    _check_shard(config, shard)
    directories = config.storage[shard].journal.directories
    if not 0 <= journal < len(directories):
        raise ConfigError(
            f"journal {journal} does not exist: shard {shard} has {len(directories)} journal(s)"
        )
    if name.isdigit():
        file_id = int(name)
        if not 0 < file_id < 1 << 64:
            raise ConfigError(f"journal file id {file_id} is out of range")
        name = journal_file_name(file_id)
    return Path(directories[journal]) / name


def _journal_file_id(path: Path) -> int:
    stem = path.name.removesuffix(JOURNAL_SUFFIX)
    if not path.name.endswith(JOURNAL_SUFFIX) or len(stem) != 16:
        raise ConfigError(f"{path}: not a journal file name (16 hex digits{JOURNAL_SUFFIX})")
    try:
        return int(stem, 16)
    except ValueError:
        raise ConfigError(f"{path}: not a journal file name") from None


def describe_journal_record(record: JournalRecord, *, payload: bool) -> dict[str, Any]:
    """A journal record as plain data; master keys are never shown, only their length."""
    if isinstance(record, EntryRecord):
        return {"kind": "entry", **describe_entry(record, payload=payload)}
    if isinstance(record, MasterKeyRecord):
        return {
            "kind": "master_key",
            "ledger_id": record.ledger_id,
            "key_bytes": len(record.master_key),
        }
    if isinstance(record, FenceRecord):
        return {"kind": "fence", "ledger_id": record.ledger_id}
    if isinstance(record, LacRecord):
        return {"kind": "lac", "ledger_id": record.ledger_id, "lac": record.lac}
    assert isinstance(record, CheckpointRecord), record
    return {"kind": "checkpoint", "file_id": record.mark.file_id, "offset": record.mark.offset}


@dataclass(slots=True)
class JournalEnd:
    """How a journal file ended, filled in once `read_journal` is exhausted."""

    records: int = 0
    zeros_from: int | None = None  # Zeros after the last record: preallocated, never written.
    torn_tail: str | None = None  # Anything else unreadable at the end: where and why.
    corruption: list[str] | None = None  # Bad records with good ones after them.

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.records,
            "zeros_from": self.zeros_from,
            "torn_tail": self.torn_tail,
            "corruption": self.corruption,
        }


def read_journal(path: Path, end: JournalEnd, *, payload: bool = False) -> Iterator[dict[str, Any]]:
    """Every record of one journal file with its byte offset; `end` says how the file ended.
    The file is checked now (ConfigError, JournalFormatError), its records read as asked for."""
    if not path.is_file():
        raise ConfigError(f"journal file {path} does not exist")
    file_id = _journal_file_id(path)
    with open(path, "rb") as file:
        header_problem(path, file.read(JOURNAL_HEADER_BYTES), file_id)
    return _journal_records(JournalReader(path.parent, [file_id], None), end, payload)


def _journal_records(
    reader: JournalReader, end: JournalEnd, payload: bool
) -> Iterator[dict[str, Any]]:
    start = JOURNAL_HEADER_BYTES
    for mark, record in reader:
        shown = describe_journal_record(record, payload=payload)
        yield {"offset": start, "end": mark.offset, **shown}
        start = mark.offset
        end.records += 1
    tail = reader.torn_tail
    if tail is not None and tail.reason.startswith("zeros from here"):
        end.zeros_from = tail.offset
    elif tail is not None:
        end.torn_tail = f"offset {tail.offset}: {tail.reason}"
    end.corruption = [f"offset {c.offset}: {c.reason}" for c in reader.corruption]


# -- entry logs -----------------------------------------------------------------------------


def entry_log_path(config: BookieConfig, name: str, *, shard: int = 0, disk: int = 0) -> Path:
    """The entry log `name` (a path, `0000000a.log`, or an id in decimal) on a shard's disk."""
    as_path = Path(name)
    if as_path.is_absolute() or os.sep in name:
        return as_path
    _check_shard(config, shard)
    ledger_dirs = config.storage[shard].ledger_dirs
    if not 0 <= disk < len(ledger_dirs):
        raise ConfigError(f"disk {disk} does not exist: shard {shard} has {len(ledger_dirs)}")
    log_id = parse_log_name(name)
    if log_id is None or not 0 <= log_id < 1 << 32:
        raise ConfigError(f"{name!r} is not an entry log (an id, or 8 hex digits + .log)")
    return log_path(Path(ledger_dirs[disk]) / ENTRY_LOG_SUBDIR, log_id)


def describe_entry(entry: StoredEntry | EntryRecord, *, payload: bool) -> dict[str, Any]:
    """An entry (from an entry log or a journal) as plain data; its payload only if asked."""
    shown: dict[str, Any] = {
        "ledger_id": entry.ledger_id,
        "entry_id": entry.entry_id,
        "lac": entry.lac,
        "length": entry.length,
        "digest": entry.digest,
        "payload_bytes": len(entry.payload),
    }
    if payload:
        shown["payload"] = entry.payload
    return shown


def read_entry_log(
    path: Path,
    *,
    ledger_id: int | None = None,
    entry_id: int | None = None,
    start: int | None = None,
    end: int | None = None,
    payload: bool = False,
) -> Iterator[dict[str, Any]]:
    """Records of one entry log (optionally of one ledger or entry, or in a byte range).
    The file is checked now (ConfigError, BookieIOError), its records read as asked for."""
    if not path.is_file():
        raise ConfigError(f"entry log {path} does not exist")
    records = iter_log_records(path, start=start, end=end)
    return _entries(records, ledger_id, entry_id, payload)


def _entries(
    records: Iterator[LogRecord], ledger_id: int | None, entry_id: int | None, payload: bool
) -> Iterator[dict[str, Any]]:
    for record in records:
        entry = record.entry
        if entry is None:
            yield {"offset": record.offset, "size": record.size, "problem": record.problem}
            continue
        if ledger_id is not None and entry.ledger_id != ledger_id:
            continue
        if entry_id is not None and entry.entry_id != entry_id:
            continue
        shown = describe_entry(entry, payload=payload)
        yield {"offset": record.offset, "size": record.size, **shown}


# -- consistency ----------------------------------------------------------------------------


def entry_digest_ok(entry: StoredEntry) -> bool:
    """The writer's digest still matches the stored entry (consistency check and scrubber)."""
    return verify_entry_digest(
        entry.ledger_id, entry.entry_id, entry.lac, entry.length, entry.payload, entry.digest
    )


def check_consistency(config: BookieConfig, *, shard: int | None = None) -> ConsistencyReport:
    """Every indexed entry of every shard (or of `shard`), read back and verified."""
    if shard is not None:
        _check_shard(config, shard)
    report = ConsistencyReport()
    for index_shard, storage in enumerate(config.storage):
        if shard is not None and index_shard != shard:
            continue
        for ledger_dir, index_dir in zip(storage.ledger_dirs, storage.index_dirs, strict=True):
            if not (Path(index_dir) / INDEX_NAME).exists():
                continue  # A disk that never stored anything.
            index = LedgerIndex(Path(index_dir), storage.index_map_bytes, readonly=True)
            try:
                reader = FileEntryReader(Path(ledger_dir) / ENTRY_LOG_SUBDIR)
                check_disk(index, reader, report, digest_ok=entry_digest_ok)
            finally:
                index.close()
    return report
