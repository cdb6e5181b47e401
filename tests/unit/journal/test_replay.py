"""Replay: after a mark, torn tails at every offset, zeros, mid-file corruption."""

from __future__ import annotations

import asyncio
import mmap
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from bkaio.journal import (
    EntryRecord,
    FenceRecord,
    Journal,
    JournalConfig,
    JournalFormatError,
    JournalMark,
    JournalReader,
    JournalRecord,
    LacRecord,
    MasterKeyRecord,
    ReplayResult,
)
from bkaio.journal import replay as replay_module
from bkaio.journal.files import HEADER_BYTES, file_name

RECORDS: list[JournalRecord] = [
    MasterKeyRecord(1, b"key"),
    EntryRecord(1, 0, -1, 10, 111, b"first....."),
    EntryRecord(1, 1, 0, 20, 222, b"second...."),
    LacRecord(1, 1),
    EntryRecord(1, 2, 1, 30, 333, b"third....."),
    FenceRecord(1),
    EntryRecord(1, 3, 2, 40, 444, b"last entry"),
]


@pytest.fixture
def config(tmp_path: Path) -> JournalConfig:
    return JournalConfig(directories=(tmp_path / "journal",), sync=False)


async def write_journal(config: JournalConfig) -> tuple[Path, list[JournalMark]]:
    """One closed journal file holding RECORDS; its path and the marks after each record."""
    journal = await Journal.open(config)
    marks = [await journal.append(record) for record in RECORDS]
    await journal.close()
    return config.directories[0] / file_name(marks[0].file_id), marks


def read(directory: Path, file_ids: list[int], after: JournalMark | None = None) -> ReplayResult:
    return JournalReader(directory, file_ids, after).result()


def place(tmp_path: Path, name: str, content: bytes) -> Path:
    """A fresh directory holding only journal file 1 with `content`."""
    directory = tmp_path / name
    directory.mkdir()
    (directory / file_name(1)).write_bytes(content)
    return directory


async def test_replay_returns_every_record_with_its_mark(config: JournalConfig) -> None:
    _path, marks = await write_journal(config)
    journal = await Journal.open(config)
    try:
        result = journal.replay(None)
    finally:
        await journal.close()
    assert result.records == list(zip(marks, RECORDS, strict=True))
    assert result.end_mark == marks[-1]
    assert result.torn_tail is None and result.corruption == [] and result.earlier_torn_tails == []


async def test_replay_after_a_mark(config: JournalConfig) -> None:
    _path, marks = await write_journal(config)
    journal = await Journal.open(config)
    try:
        for index, mark in enumerate(marks):
            result = journal.replay(mark)
            assert [record for _mark, record in result.records] == RECORDS[index + 1 :]
            assert result.end_mark == marks[-1]
        # A mark in the file written since open: nothing recovered comes after it.
        assert journal.replay(journal.durable_mark).records == []
        # 0:0 means "from the start".
        assert len(journal.replay(JournalMark(0, 0)).records) == len(RECORDS)
    finally:
        await journal.close()


async def test_iter_replay_streams_records(config: JournalConfig) -> None:
    _path, marks = await write_journal(config)
    journal = await Journal.open(config)
    try:
        reader = journal.iter_replay(marks[2])
        streamed = list(reader)
        assert [mark for mark, _record in streamed] == marks[3:]
        assert reader.end_mark == marks[-1] and reader.torn_tail is None
    finally:
        await journal.close()


async def _write_many(config: JournalConfig, count: int, size: int) -> list[JournalMark]:
    journal = await Journal.open(config)
    try:
        records = [
            EntryRecord(7, i, i - 1, (i + 1) * size, i, bytes([i % 251]) * size)
            for i in range(count)
        ]
        return list(await asyncio.gather(*(journal.append(record) for record in records)))
    finally:
        await journal.close()


async def test_batches_are_bounded_and_cover_every_record(config: JournalConfig) -> None:
    marks = await _write_many(config, 300, 1000)
    directory = config.directories[0]
    file_ids = sorted({mark.file_id for mark in marks})
    everything = list(JournalReader(directory, file_ids, None))
    reader = JournalReader(directory, file_ids, None)
    batches = list(reader.batches(max_bytes=10_000))
    assert [item for batch in batches for item in batch] == everything
    assert len(batches) > 20
    previous = JournalMark(file_ids[0], HEADER_BYTES)
    for batch in batches:
        first, last = batch[0][0], batch[-1][0]
        assert first.file_id == last.file_id
        assert last.offset - previous.offset <= 10_000 + 1100  # The bound plus one record.
        previous = last
    assert reader.end_mark == marks[-1]


async def test_read_pages_are_handed_back_as_replay_goes(
    config: JournalConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    marks = await _write_many(config, 200, 4000)
    released: list[tuple[int, int]] = []
    release = replay_module._release_pages

    def recording(mapped: mmap.mmap, start: int, end: int) -> int:
        released.append((start, end))
        return release(mapped, start, end)

    monkeypatch.setattr(replay_module, "RELEASE_PAGES_BYTES", 64 * 1024)
    monkeypatch.setattr(replay_module, "_release_pages", recording)
    file_ids = sorted({mark.file_id for mark in marks})
    records = list(JournalReader(config.directories[0], file_ids, None))
    assert len(records) == 200
    assert len(released) >= 10  # 800 KB read, handed back every 64 KiB.
    for (start, _end), (_previous_start, previous_end) in zip(released[1:], released, strict=False):
        assert start == previous_end - previous_end % mmap.PAGESIZE


async def test_a_torn_last_record_at_every_offset_ends_replay_cleanly(
    config: JournalConfig, tmp_path: Path
) -> None:
    path, marks = await write_journal(config)
    content = path.read_bytes()
    last_start, last_end = marks[-2].offset, marks[-1].offset
    assert last_end == len(content)
    assert read(place(tmp_path, "boundary", content[:last_start]), [1]).torn_tail is None
    for cut in range(last_start + 1, last_end):
        directory = place(tmp_path, f"cut-{cut}", content[:cut])
        result = read(directory, [1])
        assert [record for _mark, record in result.records] == RECORDS[:-1], cut
        assert result.torn_tail is not None, cut
        assert result.torn_tail.offset == last_start, cut
        assert result.corruption == [], cut
        assert result.end_mark == marks[-2]
        shutil.rmtree(directory)


async def test_a_torn_tail_is_reported_through_the_journal_and_later_files_continue(
    config: JournalConfig,
) -> None:
    path, marks = await write_journal(config)
    content = path.read_bytes()
    path.write_bytes(content[: marks[-1].offset - 3])

    journal = await Journal.open(config)
    try:
        result = journal.replay(None)
        assert result.torn_tail is not None
        assert (result.torn_tail.file, result.torn_tail.offset) == (path, marks[-2].offset)
        more = await journal.append(FenceRecord(2))
    finally:
        await journal.close()

    reopened = await Journal.open(config)
    try:
        result = reopened.replay(None)
    finally:
        await reopened.close()
    assert [mark for mark, _record in result.records] == [*marks[:-1], more]
    assert result.torn_tail is None and result.corruption == []
    assert [(tail.file, tail.offset) for tail in result.earlier_torn_tails] == [
        (path, marks[-2].offset)
    ]


async def test_preallocation_zeros_at_the_tail(config: JournalConfig, tmp_path: Path) -> None:
    path, marks = await write_journal(config)
    content = path.read_bytes()

    zero_tail = read(place(tmp_path, "zeros", content + bytes(10_000)), [1])
    assert [record for _mark, record in zero_tail.records] == RECORDS
    assert zero_tail.torn_tail is not None
    assert zero_tail.torn_tail.offset == len(content)
    assert "zeros" in zero_tail.torn_tail.reason
    assert zero_tail.corruption == []

    # A torn write into preallocated space: half a record, then zeros.
    half = content[: marks[-2].offset + 12] + bytes(10_000)
    torn = read(place(tmp_path, "half", half), [1])
    assert [record for _mark, record in torn.records] == RECORDS[:-1]
    assert torn.torn_tail is not None and torn.torn_tail.offset == marks[-2].offset
    assert torn.corruption == []


async def test_a_bad_checksum_in_the_last_record_is_a_torn_tail(
    config: JournalConfig, tmp_path: Path
) -> None:
    path, marks = await write_journal(config)
    damaged = bytearray(path.read_bytes())
    damaged[-1] ^= 0xFF
    result = read(place(tmp_path, "bad-crc", bytes(damaged)), [1])
    assert [record for _mark, record in result.records] == RECORDS[:-1]
    assert result.torn_tail is not None and result.torn_tail.offset == marks[-2].offset
    assert "checksum" in result.torn_tail.reason
    assert result.corruption == []


@pytest.mark.parametrize("damaged_byte", [0, 5, 8, 20], ids=["crc", "length", "kind", "body"])
async def test_mid_file_corruption_is_reported_with_its_offset(
    config: JournalConfig, tmp_path: Path, damaged_byte: int
) -> None:
    path, marks = await write_journal(config)
    damaged = bytearray(path.read_bytes())
    bad_index = 2  # RECORDS[2] starts where RECORDS[1] ends.
    bad_offset = marks[bad_index - 1].offset
    damaged[bad_offset + damaged_byte] ^= 0x01
    result = read(place(tmp_path, "mid", bytes(damaged)), [1])
    assert [record for _mark, record in result.records] == [
        record for index, record in enumerate(RECORDS) if index != bad_index
    ]
    assert [(c.file.name, c.offset) for c in result.corruption] == [(file_name(1), bad_offset)]
    assert f"next valid record at {marks[bad_index].offset}" in result.corruption[0].reason
    assert result.torn_tail is None


async def test_corruption_before_a_mark_is_not_read(config: JournalConfig, tmp_path: Path) -> None:
    path, marks = await write_journal(config)
    damaged = bytearray(path.read_bytes())
    damaged[HEADER_BYTES + 12] ^= 0x01
    result = read(place(tmp_path, "before-mark", bytes(damaged)), [1], after=marks[2])
    assert [record for _mark, record in result.records] == RECORDS[3:]
    assert result.corruption == []


def test_an_empty_or_zero_header_file_is_a_torn_tail(tmp_path: Path) -> None:
    for name, content in [("empty", b""), ("short", b"BK"), ("zeros", bytes(4096))]:
        result = read(place(tmp_path, name, content), [1])
        assert result.records == []
        assert result.torn_tail is not None and result.torn_tail.offset == 0, name


def test_a_foreign_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(JournalFormatError, match="magic"):
        read(place(tmp_path, "foreign", b"NOTAJOURNALFILE!" * 4), [1])


async def test_a_file_with_another_id_in_its_header_is_refused(
    config: JournalConfig, tmp_path: Path
) -> None:
    path, _marks = await write_journal(config)
    directory = tmp_path / "renamed"
    directory.mkdir()
    shutil.copy(path, directory / file_name(5))
    with pytest.raises(JournalFormatError, match="file id"):
        read(directory, [5])


async def test_a_missing_mark_file_is_refused(config: JournalConfig) -> None:
    _path, marks = await write_journal(config)
    journal = await Journal.open(replace(config, max_file_bytes=4096, max_group_bytes=64))
    await journal.append(FenceRecord(1))
    await journal.close()
    directory = config.directories[0]
    (directory / file_name(1)).unlink()
    with pytest.raises(JournalFormatError, match="missing"):
        read(directory, [2], after=marks[3])
