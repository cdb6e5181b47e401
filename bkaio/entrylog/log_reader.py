"""Reading entry-log files outside the storage engine: offline tools and the consistency check.

    for record in iter_log_records(path):            # `bkaio bookie readentrylog`
        record.offset, record.size, record.entry or record.problem
    entry = read_record_at(path, location)           # one record, by its index location

Blocking file I/O, never writes. The file is memory-mapped and walked record by record (a 256
MiB log is never read into the heap). A record whose checksum fails is reported and skipped by
its length prefix; a length that runs past the end of the file (a torn tail) ends the walk.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bkaio.entrylog.entry_log import (
    LOG_HEADER,
    LOG_MAGIC,
    RECORD_BODY,
    RECORD_PREFIX,
    EntryLocation,
    decode_record,
    log_file_name,
)
from bkaio.entrylog.types import StoredEntry
from bkaio.errors import BookieIOError


@dataclass(frozen=True, slots=True)
class LogRecord:
    offset: int  # Of the record's length prefix.
    size: int  # Whole record, prefix included.
    entry: StoredEntry | None  # None when the record is damaged (see `problem`).
    problem: str | None = None


def log_path(directory: Path, log_id: int) -> Path:
    return directory / log_file_name(log_id)


def parse_log_name(text: str) -> int | None:
    """The log id of `8 hex digits.log` (or of the bare hex or decimal id), None otherwise."""
    stem = text.removesuffix(".log")
    if text.endswith(".log"):
        try:
            return int(stem, 16)
        except ValueError:
            return None
    return int(stem) if stem.isdigit() else None


def log_header(path: Path) -> tuple[int, int]:
    """(format version, log id) from the file's header; BookieIOError if it is not a log."""
    with open(path, "rb") as file:
        header = file.read(LOG_HEADER.size)
    if len(header) < LOG_HEADER.size:
        raise BookieIOError(f"{path}: {len(header)}-byte file is shorter than an entry-log header")
    magic, version, log_id = LOG_HEADER.unpack(header)
    if magic != LOG_MAGIC:
        raise BookieIOError(f"{path}: not a bkaio entry log (magic {magic!r})")
    return version, log_id


def iter_log_records(
    path: Path, *, start: int | None = None, end: int | None = None
) -> Iterator[LogRecord]:
    """Every record of the log at `path` whose offset is in [start, end) (default: all).
    The header is checked now (BookieIOError), the records are read as they are asked for."""
    log_header(path)
    return _records(path, start, end)


def _records(path: Path, start: int | None, end: int | None) -> Iterator[LogRecord]:
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size <= LOG_HEADER.size:
            return
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            offset = LOG_HEADER.size
            stop = size if end is None else min(end, size)
            while offset + RECORD_PREFIX.size <= stop:
                (body_bytes, _checksum) = RECORD_PREFIX.unpack_from(mapped, offset)
                record_size = RECORD_PREFIX.size + body_bytes
                if body_bytes < RECORD_BODY.size or offset + record_size > size:
                    left = size - offset
                    problem = f"torn tail: the record runs past the end ({left} bytes left)"
                    yield LogRecord(offset, left, None, problem)
                    return
                if start is None or offset >= start:
                    record = mapped[offset : offset + record_size]
                    try:
                        entry = decode_record(record, where=f"{path}@{offset}")
                    except BookieIOError as error:
                        yield LogRecord(offset, record_size, None, str(error))
                    else:
                        yield LogRecord(offset, record_size, entry)
                offset += record_size


def read_record_at(path: Path, location: EntryLocation) -> StoredEntry:
    """The entry at `location` in the log at `path`. FileNotFoundError if the log is gone;
    BookieIOError if the bytes there are short or damaged."""
    where = f"{path}@{location.offset}"
    with open(path, "rb") as file:
        record = os.pread(file.fileno(), location.size, location.offset)
    if len(record) != location.size:
        raise BookieIOError(f"{where}: short read ({len(record)} of {location.size} bytes)")
    return decode_record(record, where=where)
