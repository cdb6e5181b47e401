"""Replay's scans past a bad record (a tail of zeros or junk, a damaged stretch) hand the pages
they read back to the kernel as they go, as the reading of records does: a preallocated tail
can be a whole file of zeros, and resident mapped pages count in the process's memory."""

from __future__ import annotations

import mmap
import random
from pathlib import Path

import pytest

from bkaio.journal import EntryRecord, JournalReader
from bkaio.journal import replay as replay_module
from bkaio.journal.files import encode_header, file_name
from bkaio.journal.records import encode_record

WINDOW = 64 * 1024
TAIL = 1024 * 1024
RECORDS = [EntryRecord(1, i, i - 1, 10 * (i + 1), i, b"payload %d" % i) for i in range(5)]


def _journal(tmp_path: Path, *parts: bytes) -> Path:
    directory = tmp_path / "journal"
    directory.mkdir()
    (directory / file_name(1)).write_bytes(b"".join((encode_header(1), *parts)))
    return directory


@pytest.fixture
def released(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The [start, end) ranges handed back, with a 64 KiB release step."""
    ranges: list[tuple[int, int]] = []
    release = replay_module._release_pages

    def recording(mapped: mmap.mmap, start: int, end: int) -> int:
        ranges.append((start, end))
        return release(mapped, start, end)

    monkeypatch.setattr(replay_module, "RELEASE_PAGES_BYTES", WINDOW)
    monkeypatch.setattr(replay_module, "_release_pages", recording)
    return ranges


def _handed_back(ranges: list[tuple[int, int]]) -> int:
    return max((end for _start, end in ranges), default=0)


@pytest.mark.parametrize("tail", ["zeros", "junk"])
def test_a_long_bad_tail_is_scanned_a_window_at_a_time(
    tmp_path: Path, released: list[tuple[int, int]], tail: str
) -> None:
    records = b"".join(encode_record(record) for record in RECORDS)
    junk = bytes(TAIL) if tail == "zeros" else random.Random(7).randbytes(TAIL)
    reader = JournalReader(_journal(tmp_path, records, junk), [1], None)
    assert [record for _mark, record in reader] == RECORDS
    assert reader.torn_tail is not None and reader.corruption == []
    assert _handed_back(released) >= TAIL - 2 * WINDOW  # All but the last window or so.


def test_a_long_damaged_stretch_before_a_valid_record_is_scanned_a_window_at_a_time(
    tmp_path: Path, released: list[tuple[int, int]]
) -> None:
    first, *rest = (encode_record(record) for record in RECORDS)
    damaged = random.Random(8).randbytes(TAIL)
    reader = JournalReader(_journal(tmp_path, first, damaged, *rest), [1], None)
    assert [record for _mark, record in reader] == RECORDS
    (corruption,) = reader.corruption
    start = len(encode_header(1)) + len(first)
    assert corruption.offset == start
    # Handed back window by window while the search went on, not at once after it.
    during = [(begin, end) for begin, end in released if end <= start + TAIL]
    assert len(during) >= TAIL // WINDOW - 2, released
