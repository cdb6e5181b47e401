"""Reading a journal directory back: records after a mark, torn tails, mid-file corruption.

Blocking (file I/O): run it in an executor. Files are memory-mapped, so a huge journal is
streamed through the page cache rather than read into the heap: `JournalReader` yields records
one by one, or in batches of a bounded size (`batches`), and hands the pages it has read back
to the kernel as it goes, so that replaying a journal of any size holds a bounded amount of it
in the process (benchmarks/replay_memory_bench.py measures it).

What stops a file, and how it is reported:
- the file ends exactly after a record: a clean end;
- the rest of the file is zeros (preallocated space, or a torn write the kernel zero-filled),
  a partial record, or a bad record with nothing valid after it: a `TornTail`. A crash
  mid-commit leaves exactly this, and those records were never acknowledged;
- a bad record followed by a valid one: a `Corruption` (bit rot or a lost write inside synced
  data). Replay resumes at the next valid record; the caller decides whether to go on.
"""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Final

from bkaio.journal.errors import JournalFormatError, RecordError
from bkaio.journal.files import HEADER_BYTES, file_name, header_problem
from bkaio.journal.records import (
    JournalMark,
    JournalRecord,
    RecordKind,
    check_record,
    decode_record,
)
from bkaio.wal.records import Corruption, ReplayResult, TornTail

# A record header has a length below 2**25 (top byte 0 or 1) and a known kind: finding these
# with one C-level regex scan keeps the search for the next valid record fast even in
# hundreds of MiB of junk. Zero-width lookahead so that candidates may overlap.
_CANDIDATE: Final = re.compile(
    b"(?=[\\x00\\x01][\\x00-\\xff]{3}[\\x%02x-\\x%02x])" % (min(RecordKind), max(RecordKind)),
    re.DOTALL,
)
_NON_ZERO: Final = re.compile(b"[^\\x00]")
# Read pages of a mapped file are dropped from the process (MADV_DONTNEED; the page cache keeps
# them) every this many bytes: resident mapped pages count in RSS like heap does.
RELEASE_PAGES_BYTES: Final = 32 * 1024 * 1024


# A candidate's header (its length and kind, 5 bytes) starts before the end of a scan window
# but may end after it: each window is searched this much further.
_CANDIDATE_BYTES: Final = 5


def find_next_record(buffer: memoryview, start: int, mapped: mmap.mmap | None = None) -> int | None:
    """Offset of the first valid record at or after `start`, or None.

    With `mapped` (the mapping `buffer` views), the bytes are searched a window of
    RELEASE_PAGES_BYTES at a time and each window's pages handed back once searched: the
    stretch searched can be the rest of a file of preallocated zeros, or junk."""
    window = RELEASE_PAGES_BYTES
    position = start + 4  # Candidates are found by their length field, 4 bytes in.
    released = start
    while position < len(buffer):
        window_end = min(position + window, len(buffer))
        search_end = min(window_end + _CANDIDATE_BYTES, len(buffer))
        for match in _CANDIDATE.finditer(buffer, position, search_end):
            if match.start() >= window_end:
                break  # The next window's.
            offset = match.start() - 4
            try:
                check_record(buffer, offset)
            except RecordError:
                continue
            return offset
        position = window_end
        if mapped is not None:
            released = _release_pages(mapped, released, position)
    return None


def is_all_zeros(buffer: memoryview, start: int, mapped: mmap.mmap | None = None) -> bool:
    """Whether `buffer` holds only zeros from `start`; with `mapped`, handing the pages back
    as `find_next_record` does."""
    released = position = start
    while position < len(buffer):
        window_end = min(position + RELEASE_PAGES_BYTES, len(buffer))
        if _NON_ZERO.search(buffer, position, window_end) is not None:
            return False
        position = window_end
        if mapped is not None:
            released = _release_pages(mapped, released, position)
    return True


class JournalReader:
    """Iterates the records of one journal directory after a mark, in order.

    `file_ids` are the files to read (ascending; normally those that existed when the journal
    opened). After iteration, `end_mark`, `torn_tail`, `earlier_torn_tails` and `corruption`
    describe how it ended. Raises JournalFormatError for a file this version cannot read, or
    when the file holding `after` is missing (records after the mark would be lost).
    """

    def __init__(self, directory: Path, file_ids: list[int], after: JournalMark | None) -> None:
        assert file_ids == sorted(set(file_ids)), file_ids
        if after is not None and after.file_id == 0:
            after = None  # 0:0 is "before the first file", as end_mark reports it when empty.
        self._directory = directory
        self._after = after
        self._file_ids = file_ids
        self.end_mark = after if after is not None else JournalMark(0, 0)
        self.torn_tail: TornTail | None = None
        self.earlier_torn_tails: list[TornTail] = []
        self.corruption: list[Corruption] = []

    def _files_to_read(self) -> list[tuple[int, int]]:
        """(file id, start offset) pairs after the mark."""
        after = self._after
        if after is None:
            return [(file_id, HEADER_BYTES) for file_id in self._file_ids]
        if after.file_id not in self._file_ids:
            if not self._file_ids or after.file_id > self._file_ids[-1]:
                return []  # The mark is in a file written after these: nothing to replay.
            raise JournalFormatError(
                f"journal {self._directory}: file {file_name(after.file_id)} holding mark "
                f"{after.file_id}:{after.offset} is missing; records after it would be lost"
            )
        return [
            (file_id, max(after.offset, HEADER_BYTES) if file_id == after.file_id else HEADER_BYTES)
            for file_id in self._file_ids
            if file_id >= after.file_id
        ]

    def __iter__(self) -> Iterator[tuple[JournalMark, JournalRecord]]:
        tails: list[TornTail] = []
        files = self._files_to_read()
        for file_id, start in files:
            tail = yield from self._read_file(file_id, start)
            if tail is not None:
                tails.append(tail)
        if tails and tails[-1].file == self._directory / file_name(files[-1][0]):
            self.torn_tail = tails.pop()
        self.earlier_torn_tails = tails

    def _read_file(
        self, file_id: int, start: int
    ) -> Generator[tuple[JournalMark, JournalRecord], None, TornTail | None]:
        """Yield the records of one file from `start`; return its torn tail, if any."""
        path = self._directory / file_name(file_id)
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            header = file.read(HEADER_BYTES)
            problem = header_problem(path, header, file_id)
            if size <= HEADER_BYTES:
                return None if problem is None else TornTail(path, 0, problem)
            if start > size:
                raise JournalFormatError(
                    f"{path}: mark offset {start} is beyond the file's {size} bytes; "
                    "the journal was truncated"
                )
            with (
                mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped,
                memoryview(mapped) as view,
            ):
                offset = start
                if problem is not None:  # A torn creation: only junk can follow, or corruption.
                    offset, tail = self._skip_bad_data(path, mapped, view, 0, problem)
                    if tail is not None:
                        return tail
                released = 0  # Pages before this offset were handed back to the kernel.
                while offset < size:
                    if offset - released >= RELEASE_PAGES_BYTES:
                        released = _release_pages(mapped, released, offset)
                    try:
                        record, end = decode_record(view, offset)
                    except RecordError as error:
                        offset, tail = self._skip_bad_data(path, mapped, view, offset, str(error))
                        if tail is not None:
                            return tail
                        continue
                    assert end > offset, (end, offset)
                    self.end_mark = JournalMark(file_id, end)
                    yield self.end_mark, record
                    offset = end
        return None

    def _skip_bad_data(
        self, path: Path, mapped: mmap.mmap, view: memoryview, offset: int, reason: str
    ) -> tuple[int, TornTail | None]:
        """After a bad record at `offset`: the next valid record's offset, or the torn tail."""
        resume = find_next_record(view, offset + 1, mapped)
        if resume is None:
            if is_all_zeros(view, offset, mapped):
                reason = f"zeros from here to the end of the file ({reason})"
            return len(view), TornTail(path, offset, reason)
        self.corruption.append(Corruption(path, offset, f"{reason}; next valid record at {resume}"))
        return resume, None

    def batches(self, max_bytes: int) -> Iterator[list[tuple[JournalMark, JournalRecord]]]:
        """The records in lists of about `max_bytes` of journal (at least one record each).

        Each `next()` is one blocking read: a caller on an event loop runs each in an executor
        and applies a batch before it asks for the next, so memory holds one batch at a time.
        `corruption` is up to date after every batch (a caller stops at the first).
        """
        batch: list[tuple[JournalMark, JournalRecord]] = []
        start = self.end_mark
        for mark, record in self:
            batch.append((mark, record))
            if mark.file_id != start.file_id or mark.offset - start.offset >= max_bytes:
                yield batch
                batch, start = [], mark
        if batch:
            yield batch

    def result(self) -> ReplayResult:
        """Read everything into memory (small journals, tests) and describe the end.

        A bookie replays with `batches()`: this holds the whole journal in the heap."""
        records = list(self)
        return ReplayResult(
            records=records,
            end_mark=self.end_mark,
            torn_tail=self.torn_tail,
            corruption=self.corruption,
            earlier_torn_tails=self.earlier_torn_tails,
        )


def _release_pages(mapped: mmap.mmap, start: int, end: int) -> int:
    """Drop the mapped pages in [start, end) from the process; the new start (page-aligned)."""
    page = mmap.PAGESIZE
    first = start - start % page
    last = end - end % page
    if last > first:
        mapped.madvise(mmap.MADV_DONTNEED, first, last - first)
    return last
