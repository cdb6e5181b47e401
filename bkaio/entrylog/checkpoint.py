"""Checkpoint marks: which journal position ledger storage holds everything up to.

`lastMark` in every ledger directory: u32 count | count x (u64 file_id | u64 offset) | u32
crc32c of the bytes before it; one mark per journal directory. Replaced atomically (temp file,
fsync, rename, fsync the directory). On open the highest readable mark per journal wins;
replay of that journal starts after it.

`AppliedMarks` answers "up to which journal mark has every record been applied to the write
cache or ledger state?". Appends resolve (and are applied) in any order relative to the
flush, so the checkpoint may only claim the contiguous prefix of applied appends: claiming the
journal's durable mark instead would skip records that were durable but not applied yet.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections import deque
from pathlib import Path

import crc32c

from bkaio.entrylog.cookie import fsync_directory
from bkaio.errors import BookieIOError
from bkaio.journal.crash_points import NO_CRASH_POINTS, CrashPoints
from bkaio.journal.disk import OS_DISK, Disk
from bkaio.wal.records import JournalMark

LAST_MARK_FILE = "lastMark"
_COUNT = struct.Struct(">I")
_MARK = struct.Struct(">QQ")
_CRC = struct.Struct(">I")
_NO_MARK = JournalMark(0, 0)  # "Before the first file": replay everything.


def encode_marks(marks: list[JournalMark | None]) -> bytes:
    """One mark per journal directory, in `journal.directories` order."""
    body = _COUNT.pack(len(marks)) + b"".join(
        _MARK.pack(m.file_id, m.offset) for m in (mark or _NO_MARK for mark in marks)
    )
    return body + _CRC.pack(crc32c.crc32c(body))


def decode_marks(data: bytes) -> list[JournalMark] | None:
    """None for a torn or damaged file (a crash mid-replace leaves the old file, not this)."""
    if len(data) < _COUNT.size + _CRC.size:
        return None
    (count,) = _COUNT.unpack_from(data)
    if len(data) != _COUNT.size + count * _MARK.size + _CRC.size:
        return None
    body = data[: -_CRC.size]
    (checksum,) = _CRC.unpack_from(data, len(body))
    if crc32c.crc32c(body) != checksum:
        return None
    return [
        JournalMark(*_MARK.unpack_from(body, _COUNT.size + i * _MARK.size)) for i in range(count)
    ]


def write_last_mark(
    directory: Path,
    marks: list[JournalMark | None],
    crash_points: CrashPoints = NO_CRASH_POINTS,
    disk: Disk = OS_DISK,
) -> None:
    """Blocking: atomically replace `directory/lastMark` and make it durable.

    Its bytes are written and synced through `disk`, like the entry logs' (a fault test's
    disk can fail a checkpoint); creating, renaming and the directory sync are plain calls.
    Raises BookieIOError naming the file: the OS's own error names none, and a full or broken
    disk must be told apart from the other ledger directories."""
    temporary = directory / (LAST_MARK_FILE + ".tmp")
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            disk.write(descriptor, encode_marks(marks), 0)
            disk.fdatasync(descriptor)
        finally:
            disk.close(descriptor)
        crash_points.reached("checkpoint.before_rename")
        os.replace(temporary, directory / LAST_MARK_FILE)
        fsync_directory(directory)
    except OSError as error:
        raise BookieIOError(f"{directory / LAST_MARK_FILE}: checkpoint failed: {error}") from error


def read_last_mark(directories: list[Path], journal_count: int) -> list[JournalMark | None]:
    """Blocking: per journal, the highest valid mark found in any of the directories."""
    best: list[JournalMark | None] = [None] * journal_count
    for directory in directories:
        data = b""
        with contextlib.suppress(FileNotFoundError):
            data = (directory / LAST_MARK_FILE).read_bytes()
        marks = decode_marks(data) if data else None
        if marks is None or len(marks) != journal_count:
            continue  # Torn, or written for another journal set (the cookie guards that).
        for i, mark in enumerate(marks):
            current = best[i]
            if mark != _NO_MARK and (current is None or mark > current):
                best[i] = mark
    return best


class MarkSlot:
    __slots__ = ("done", "mark")

    def __init__(self) -> None:
        self.done = False
        self.mark: JournalMark | None = None


class AppliedMarks:
    """The contiguous prefix of journal appends that have been applied (event loop only).

    `begin()` is called right where `journal.append` is called, so slots are in journal order;
    `finish(slot, mark)` once the record is applied (mark None: the append failed).
    """

    def __init__(self, start: JournalMark | None) -> None:
        self.applied = start
        self._slots: deque[MarkSlot] = deque()

    def begin(self) -> MarkSlot:
        slot = MarkSlot()
        self._slots.append(slot)
        return slot

    def finish(self, slot: MarkSlot, mark: JournalMark | None) -> None:
        assert not slot.done, "a journal append finished twice"
        slot.done = True
        slot.mark = mark
        while self._slots and self._slots[0].done:
            finished = self._slots.popleft()
            if finished.mark is not None and (self.applied is None or finished.mark > self.applied):
                self.applied = finished.mark

    def advance(self, mark: JournalMark) -> None:
        """Replay applied everything up to `mark` directly."""
        assert not self._slots, "advance() is for replay, before any append"
        if self.applied is None or mark > self.applied:
            self.applied = mark

    @property
    def in_flight(self) -> int:
        return len(self._slots)
