"""Zero-filling the current journal file ahead of the writer (real files, real fdatasync)."""

from __future__ import annotations

import asyncio
import os
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from bkaio.errors import ConfigError
from bkaio.journal import EntryRecord, Journal, JournalConfig
from bkaio.journal.files import HEADER_BYTES, file_name, list_file_ids
from bkaio.journal.replay import JournalReader
from bkaio.journal.zero_fill import CHUNK_BYTES, ZeroFiller

AHEAD = 2 * CHUNK_BYTES


def entry(entry_id: int, payload_bytes: int = 1000) -> EntryRecord:
    payload = entry_id.to_bytes(8, "little") * (payload_bytes // 8)
    return EntryRecord(1, entry_id, entry_id - 1, entry_id, 0, payload)


def config_of(tmp_path: Path, **changes: object) -> JournalConfig:
    base = JournalConfig(directories=(tmp_path / "journal",), preallocate_ahead_bytes=AHEAD)
    return replace(base, **changes)  # type: ignore[arg-type]


def replayed(directory: Path) -> list[EntryRecord]:
    reader = JournalReader(directory, list_file_ids(directory), None)
    records = [record for _mark, record in reader]
    assert reader.corruption == []
    return records  # type: ignore[return-value]


async def wait_for_size(path: Path, size: int) -> None:
    for _ in range(3000):  # A bound for a hung test, not a timing claim.
        if os.stat(path).st_size >= size:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} never reached {size} bytes")


async def test_the_current_file_is_zeroed_ahead_and_cut_back_on_close(tmp_path: Path) -> None:
    config = config_of(tmp_path)
    journal = await Journal.open(config)
    path = config.directories[0] / file_name(journal.current_file_id)
    await wait_for_size(path, HEADER_BYTES + AHEAD)  # Before the first commit.
    marks = [await journal.append(entry(i)) for i in range(10)]
    data = path.read_bytes()
    assert len(data) >= HEADER_BYTES + AHEAD > marks[-1].offset
    assert set(data[marks[-1].offset :]) == {0}  # Zeros after the last record, never junk.
    await journal.close()
    assert os.stat(path).st_size == marks[-1].offset  # A clean end for the next replay.
    assert replayed(config.directories[0]) == [entry(i) for i in range(10)]


async def test_commits_racing_the_filler_keep_every_record(tmp_path: Path) -> None:
    # Small files and a filler barely ahead: the writer keeps running into it and over rolls.
    config = config_of(tmp_path, max_file_bytes=3 * CHUNK_BYTES, max_group_bytes=64 * 1024)
    journal = await Journal.open(config)
    records = [entry(i, payload_bytes=8 * (i % 700 + 1)) for i in range(3000)]
    for start in range(0, len(records), 50):
        await asyncio.gather(*(journal.append_and_wait(r) for r in records[start : start + 50]))
    await journal.close()
    directory = config.directories[0]
    assert len(list_file_ids(directory)) > 3
    assert replayed(directory) == records


async def test_a_crash_leaves_zeros_that_replay_reads_as_the_end(tmp_path: Path) -> None:
    config = config_of(tmp_path)
    journal = await Journal.open(config)
    path = config.directories[0] / file_name(journal.current_file_id)
    await wait_for_size(path, HEADER_BYTES + AHEAD)
    for i in range(5):
        await journal.append(entry(i))
    reader = JournalReader(config.directories[0], list_file_ids(config.directories[0]), None)
    assert [record for _mark, record in reader] == [entry(i) for i in range(5)]
    assert reader.torn_tail is not None and "zeros" in reader.torn_tail.reason
    assert reader.corruption == []
    await journal.close()


def test_the_writer_waits_for_a_chunk_the_filler_is_writing_there(tmp_path: Path) -> None:
    path = tmp_path / "file"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    filler = ZeroFiller(CHUNK_BYTES, 16 * CHUNK_BYTES)
    try:
        filler.start_file(fd, 0)
        # Whatever the filler got to first, data written after `before_write` stays.
        for offset in range(0, 8 * CHUNK_BYTES, 4096):
            filler.before_write(offset, offset + 4096)
            os.pwrite(fd, b"\x07" * 4096, offset)
        filler.stop_current()
        with path.open("rb") as file:
            data = file.read(8 * CHUNK_BYTES)
        assert data == b"\x07" * (8 * CHUNK_BYTES)
    finally:
        filler.shutdown()
        os.close(fd)
    assert not [t for t in threading.enumerate() if t.name.startswith("journal-zero-fill")]


def test_the_ahead_distance_is_checked() -> None:
    with pytest.raises(ConfigError, match="preallocate_ahead_bytes"):
        JournalConfig(directories=(Path("/tmp/j"),), preallocate_ahead_bytes=1000)
    JournalConfig(directories=(Path("/tmp/j"),), preallocate_ahead_bytes=0)  # Off.
