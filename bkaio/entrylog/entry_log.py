"""Entry-log files of one disk: append-only, interleaved ledgers, read back by `pread`.

File `<log_id as 8 hex digits>.log`:
    header  b"BKAIOLOG" | u32 format version | u32 log id                 (16 bytes)
    record  u32 body length | u32 crc32c(body) | body
    body    i64 ledger_id | i64 entry_id | i64 lac | i64 length | u32 digest | payload

An entry's location is (log id, record offset, record size): one `pread` reads it whole. The
record checksum catches on-disk corruption; the writer's digest is kept verbatim for readers.
A log is only appended by the flush thread and rolled by size; on open a fresh log is started,
so a tail torn by a crash is never appended to (unindexed bytes are garbage that compaction
drops). Every method here blocks: callers run them on the storage or reader executors.

Writes, syncs and closes of the log being written go through a `Disk` (bkaio.journal.disk: the
process's disk, the one the journal uses, unless a test passes a fake), so fault tests can lose
unsynced entry-log writes, tear them, fail their fsync with EIO or slow them down. Records are
written at the offsets their locations name (pwrite), never at the file position: a write that
failed halfway cannot shift the records written after it.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import crc32c

from bkaio.entrylog.types import StoredEntry
from bkaio.errors import BookieIOError
from bkaio.journal.crash_points import NO_CRASH_POINTS, CrashPoints
from bkaio.journal.disk import OS_DISK, Disk

ENTRY_LOG_SUBDIR = "logs"  # A disk's entry logs live in <ledger dir>/logs.
LOG_MAGIC = b"BKAIOLOG"
LOG_VERSION = 1
LOG_HEADER = struct.Struct(">8sII")
RECORD_PREFIX = struct.Struct(">II")
RECORD_BODY = struct.Struct(">qqqqI")
LOCATION = struct.Struct(">III")
_LOG_NAME = re.compile(r"^([0-9a-f]{8})\.log$")
_MAX_LOG_ID = (1 << 32) - 1


class EntryLocation(NamedTuple):
    """Where an entry's record is. A NamedTuple: a flush builds one per entry, and a tuple is
    built about 4x faster than a frozen dataclass."""

    log_id: int
    offset: int  # Start of the record (its length prefix).
    size: int  # Whole record, prefix included.

    def pack(self) -> bytes:
        return LOCATION.pack(self.log_id, self.offset, self.size)

    @classmethod
    def unpack(cls, data: bytes) -> EntryLocation:
        return cls._make(LOCATION.unpack(data))


def log_file_name(log_id: int) -> str:
    assert 0 <= log_id <= _MAX_LOG_ID, log_id
    return f"{log_id:08x}.log"


def encode_record(entry: StoredEntry) -> bytes:
    payload = entry.payload
    head = RECORD_BODY.pack(entry.ledger_id, entry.entry_id, entry.lac, entry.length, entry.digest)
    # The CRC of head + payload, chained: the payload is copied once, into the record.
    checksum = crc32c.crc32c(payload, crc32c.crc32c(head))
    return b"".join((RECORD_PREFIX.pack(len(head) + len(payload), checksum), head, payload))


def decode_record(record: bytes, *, where: str) -> StoredEntry:
    """Inverse of `encode_record`; raises BookieIOError when the bytes on disk are damaged."""
    if len(record) < RECORD_PREFIX.size + RECORD_BODY.size:
        raise BookieIOError(f"{where}: short entry record ({len(record)} bytes)")
    body_bytes, checksum = RECORD_PREFIX.unpack_from(record)
    body = memoryview(record)[RECORD_PREFIX.size :]
    if body_bytes != len(body) or crc32c.crc32c(body) != checksum:
        raise BookieIOError(f"{where}: entry record fails its checksum (corrupt entry log)")
    ledger_id, entry_id, lac, length, digest = RECORD_BODY.unpack_from(body)
    payload = bytes(body[RECORD_BODY.size :])
    return StoredEntry(ledger_id, entry_id, lac, length, digest, payload)


class _ReadHandle:
    """A read-only descriptor shared by readers; closed when removed and no reader holds it."""

    __slots__ = ("descriptor", "readers", "removed")

    def __init__(self, descriptor: int) -> None:
        self.descriptor = descriptor
        self.readers = 0
        self.removed = False


class EntryLogDirectory:
    """The entry logs of one disk: one current log being appended, the rest sealed."""

    def __init__(
        self,
        directory: Path,
        max_log_bytes: int,
        disk: Disk = OS_DISK,
        crash_points: CrashPoints = NO_CRASH_POINTS,
    ) -> None:
        self.directory = directory
        self._max_log_bytes = max_log_bytes
        self._disk = disk
        self._crash_points = crash_points
        self._lock = threading.Lock()  # Guards _handles and the reader counts.
        self._handles: dict[int, _ReadHandle] = {}
        self._log_ids: set[int] = set()
        self._current_id = -1
        self._current_descriptor = -1
        self._current_bytes = 0
        self._unsynced: dict[int, int] = {}  # log id -> write descriptor awaiting fsync.
        self._sealed_descriptors: list[int] = []  # Rolled logs, closed after their fsync.

    # -- lifecycle -------------------------------------------------------------------------

    def open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for name in os.listdir(self.directory):
            match = _LOG_NAME.match(name)
            if match:
                self._log_ids.add(int(match.group(1), 16))
        self._start_new_log()

    def close(self) -> None:
        """Sync, then close every descriptor; they are closed even when the sync fails."""
        try:
            self.sync()
        finally:
            written = [*self._sealed_descriptors, self._current_descriptor]
            self._sealed_descriptors.clear()
            self._unsynced.clear()
            self._current_descriptor = -1
            for descriptor in written:
                if descriptor >= 0:
                    with contextlib.suppress(OSError):
                        self._disk.close(descriptor)
            with self._lock:
                for handle in self._handles.values():
                    os.close(handle.descriptor)
                self._handles.clear()

    @property
    def current_log_id(self) -> int:
        return self._current_id

    def log_ids(self) -> list[int]:
        return sorted(self._log_ids)

    def file_bytes(self, log_id: int) -> int:
        """Bytes of records in the log (header excluded)."""
        if log_id == self._current_id:
            return self._current_bytes - LOG_HEADER.size
        try:
            return os.stat(self.directory / log_file_name(log_id)).st_size - LOG_HEADER.size
        except FileNotFoundError:
            return 0

    # -- writing (flush thread only) -------------------------------------------------------

    def _start_new_log(self) -> None:
        log_id = (max(self._log_ids) + 1) if self._log_ids else 0
        if log_id > _MAX_LOG_ID:
            raise BookieIOError(f"{self.directory}: entry log ids exhausted")
        path = self.directory / log_file_name(log_id)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as error:
            raise BookieIOError(f"{path}: cannot create entry log: {error}") from error
        try:
            self._write(descriptor, LOG_HEADER.pack(LOG_MAGIC, LOG_VERSION, log_id), 0, log_id)
        except BaseException:
            # Gone again, so the next try can take the same id (O_EXCL would refuse it forever).
            with contextlib.suppress(OSError):
                self._disk.close(descriptor)
            path.unlink(missing_ok=True)
            raise
        # Only now is the old log sealed: had the new one failed, the old stays current.
        if self._current_descriptor >= 0:
            # Sealed: its final fsync happens in the next sync(), before the index commit.
            self._sealed_descriptors.append(self._current_descriptor)
        self._log_ids.add(log_id)
        self._current_id = log_id
        self._current_descriptor = descriptor
        self._current_bytes = LOG_HEADER.size
        self._unsynced[log_id] = descriptor
        _fsync_directory(self.directory)  # The new name must survive a crash too.

    def roll(self) -> None:
        """Seal the current log (if it holds any record) and start a new one."""
        if self._current_bytes > LOG_HEADER.size:
            self._start_new_log()

    def append(self, records: list[bytes]) -> list[EntryLocation]:
        """Append encoded records, rolling by size; durable only after `sync()`."""
        locations: list[EntryLocation] = []
        pending: list[bytes] = []
        pending_bytes = 0
        for record in records:
            size = len(record)
            if self._current_bytes + pending_bytes + size > self._max_log_bytes and (
                self._current_bytes + pending_bytes > LOG_HEADER.size
            ):
                self._write_pending(pending)
                pending, pending_bytes = [], 0
                self._start_new_log()
            offset = self._current_bytes + pending_bytes
            locations.append(EntryLocation(self._current_id, offset, size))
            pending.append(record)
            pending_bytes += size
        self._write_pending(pending)
        return locations

    def append_synced(self, entries: list[StoredEntry], sync_bytes: int = 0) -> list[bytes]:
        """Append `entries` as records (`encode_record`'s) and sync, every `sync_bytes` of
        records (0: once, at the end); returns each one's location, packed (`LOCATION`).

        The flush's path: one loop that encodes each record and places it, without a record
        or location object per entry (`append` + `sync` did the same in three passes). Syncs
        even with no entries, as the flush relies on for logs sealed earlier. On a failure
        (BookieIOError) see `sync`.
        """
        pack_body = RECORD_BODY.pack
        pack_prefix = RECORD_PREFIX.pack
        pack_location = LOCATION.pack
        checksum = crc32c.crc32c
        body_bytes = RECORD_BODY.size
        record_bytes = RECORD_PREFIX.size + body_bytes
        max_log_bytes = self._max_log_bytes
        log_id = self._current_id
        offset = synced_at = self._current_bytes
        parts: list[bytes] = []
        locations: list[bytes] = []
        for entry in entries:
            payload = entry.payload
            size = record_bytes + len(payload)
            if offset + size > max_log_bytes and offset > LOG_HEADER.size:
                self._write_pending(parts)
                parts = []
                self._start_new_log()
                log_id = self._current_id
                offset = synced_at = self._current_bytes
            head = pack_body(entry.ledger_id, entry.entry_id, entry.lac, entry.length, entry.digest)
            # The CRC of head + payload, chained, as `encode_record` computes it.
            parts += (pack_prefix(size - RECORD_PREFIX.size, checksum(payload, checksum(head))),
                      head, payload)  # fmt: skip
            locations.append(pack_location(log_id, offset, size))
            offset += size
            if sync_bytes and offset - synced_at >= sync_bytes:
                self._write_pending(parts)
                parts = []
                self.sync()
                synced_at = offset
        self._write_pending(parts)
        self.sync()
        return locations

    def _write_pending(self, pending: list[bytes]) -> None:
        if not pending:
            return
        data = b"".join(pending)
        self._write(self._current_descriptor, data, self._current_bytes, self._current_id)
        self._current_bytes += len(data)
        self._unsynced[self._current_id] = self._current_descriptor

    def _write(self, descriptor: int, data: bytes, offset: int, log_id: int) -> None:
        try:
            self._disk.write(descriptor, data, offset)
        except OSError as error:
            path = self.directory / log_file_name(log_id)
            raise BookieIOError(f"{path}@{offset}: write failed: {error}") from error

    def sync(self) -> None:
        """fsync every log written since the last sync; closes the sealed ones.

        On a failure (BookieIOError) the logs stay unsynced: the caller must not index what it
        appended since the last sync, and appends again what it still holds."""
        if self._unsynced:
            self._crash_points.reached("entrylog.after_write_before_sync")
        for log_id, descriptor in list(self._unsynced.items()):
            try:
                self._disk.fdatasync(descriptor)
            except OSError as error:
                raise BookieIOError(
                    f"{self.directory / log_file_name(log_id)}: fsync failed: {error}"
                ) from error
            del self._unsynced[log_id]
        while self._sealed_descriptors:
            self._disk.close(self._sealed_descriptors.pop())

    def remove(self, log_id: int) -> int:
        """Delete a sealed log; returns its size. Readers holding it finish first."""
        assert log_id != self._current_id, f"cannot remove the current entry log {log_id}"
        assert log_id not in self._unsynced, log_id
        path = self.directory / log_file_name(log_id)
        try:
            size = os.stat(path).st_size
            os.unlink(path)
        except FileNotFoundError:
            size = 0
        self._log_ids.discard(log_id)
        with self._lock:
            handle = self._handles.pop(log_id, None)
            if handle is not None:
                handle.removed = True
                if handle.readers == 0:
                    os.close(handle.descriptor)
        return size

    # -- reading (any thread) --------------------------------------------------------------

    def read(self, location: EntryLocation) -> StoredEntry | None:
        """The entry at `location`, or None if its log was removed meanwhile (re-look it up)."""
        handle = self._acquire(location.log_id)
        if handle is None:
            return None
        where = f"{self.directory / log_file_name(location.log_id)}@{location.offset}"
        try:
            record = os.pread(handle.descriptor, location.size, location.offset)
        except OSError as error:
            raise BookieIOError(f"{where}: read failed: {error}") from error
        finally:
            self._release(handle)
        if len(record) != location.size:
            raise BookieIOError(f"{where}: short read ({len(record)} of {location.size} bytes)")
        return decode_record(record, where=where)

    def read_records(self, packed_locations: list[bytes]) -> list[bytes | memoryview] | None:
        """The records at `packed_locations` (`LOCATION`s, in order), as they are on disk: the
        buffers whose concatenation they are (READ_ENTRIES sends them as such), or None when
        a log was removed meanwhile (compaction moved its entries: look them up again).

        Records next to each other in one log are read with one `pread` and kept whole; a run
        with small gaps (the other entries of a striped ledger, other ledgers' records) is read
        with one `pread` too and sliced. Nothing is checked here: the reader checks every
        entry's digest, which covers all but the record's checksum.
        """
        parts: list[bytes | memoryview] = []
        spans = _spans(struct.iter_unpack(">III", b"".join(packed_locations)))
        for log_id, start, end, records in spans:
            handle = self._acquire(log_id)
            if handle is None:
                return None
            where = f"{self.directory / log_file_name(log_id)}@{start}"
            try:
                data = os.pread(handle.descriptor, end - start, start)
            except OSError as error:
                raise BookieIOError(f"{where}: read failed: {error}") from error
            finally:
                self._release(handle)
            if len(data) != end - start:
                raise BookieIOError(f"{where}: short read ({len(data)} of {end - start} bytes)")
            if records is None:
                parts.append(data)
            else:
                view = memoryview(data)
                parts += [view[offset - start : offset - start + size] for offset, size in records]
        return parts

    def _acquire(self, log_id: int) -> _ReadHandle | None:
        with self._lock:
            handle = self._handles.get(log_id)
            if handle is None:
                if log_id not in self._log_ids:
                    return None
                try:
                    descriptor = os.open(self.directory / log_file_name(log_id), os.O_RDONLY)
                except FileNotFoundError:
                    return None
                handle = self._handles[log_id] = _ReadHandle(descriptor)
            handle.readers += 1
            return handle

    def _release(self, handle: _ReadHandle) -> None:
        with self._lock:
            handle.readers -= 1
            if handle.removed and handle.readers == 0:
                os.close(handle.descriptor)

    def scan(self, log_id: int) -> list[tuple[EntryLocation, StoredEntry]]:
        """Every whole record of a log, stopping at a torn or corrupt tail (tests and tools)."""
        path = self.directory / log_file_name(log_id)
        data = path.read_bytes()
        found: list[tuple[EntryLocation, StoredEntry]] = []
        offset = LOG_HEADER.size
        while offset + RECORD_PREFIX.size <= len(data):
            (body_bytes, _checksum) = RECORD_PREFIX.unpack_from(data, offset)
            size = RECORD_PREFIX.size + body_bytes
            if body_bytes < RECORD_BODY.size or offset + size > len(data):
                break
            try:
                entry = decode_record(data[offset : offset + size], where=f"{path}@{offset}")
            except BookieIOError:
                break
            found.append((EntryLocation(log_id, offset, size), entry))
            offset += size
        return found


# Records of one log closer than this are read with one `pread`, the bytes between them
# dropped: cheaper than a syscall each (a striped ledger's other entries lie between).
_SPAN_GAP_BYTES = 64 * 1024
# ... but a span stops growing at this size.
_SPAN_MAX_BYTES = 8 * 1024 * 1024

_Span = tuple[int, int, int, list[tuple[int, int]] | None]  # log, start, end, gapped records


def _spans(locations: Iterator[tuple[int, ...]]) -> list[_Span]:
    """Group record locations (log, offset, size; in read order) into spans of one `pread`:
    (log, start, end, None) for records that follow each other exactly, else with the
    (offset, size) of each record to slice out."""
    spans: list[_Span] = []
    log_id = start = end = -1
    records: list[tuple[int, int]] = []
    gapped = False
    for location_log, offset, size in locations:
        if location_log == log_id and offset == end and end - start < _SPAN_MAX_BYTES:
            end += size
            records.append((offset, size))
            continue
        if (
            location_log == log_id
            and end < offset <= end + _SPAN_GAP_BYTES
            and end - start < _SPAN_MAX_BYTES
        ):
            end = offset + size
            records.append((offset, size))
            gapped = True
            continue
        if log_id >= 0:
            spans.append((log_id, start, end, records if gapped else None))
        log_id, start, end = location_log, offset, offset + size
        records = [(offset, size)]
        gapped = False
    if log_id >= 0:
        spans.append((log_id, start, end, records if gapped else None))
    return spans


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        with contextlib.suppress(OSError):
            os.close(descriptor)
