"""The local consistency check over real storage: sound entries pass, every kind of damage is
found and reported against its ledger, online (live readers) and offline (files)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import crc32c

from bkaio.entrylog.consistency import (
    ConsistencyReport,
    FileEntryReader,
    check_batch,
    check_disk,
)
from bkaio.entrylog.index import LedgerIndex
from bkaio.entrylog.log_reader import iter_log_records, log_path
from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.entrylog.types import StoredEntry
from tests.fixtures.storage import add_entry
from tests.unit.entrylog.conftest import KEY, OpenStorage, make_config, make_entry

LEDGERS = (3, 4, 5, 10)
ENTRIES = 20


def crc_ok(entry: StoredEntry) -> bool:
    """The digest make_entry computes (crc32c of the payload)."""
    return crc32c.crc32c(entry.payload) == entry.digest


async def _filled(open_storage: OpenStorage, tmp_path: Path) -> ShardStorage:
    storage = await open_storage(make_config(tmp_path, disks=2))
    await asyncio.gather(
        *(add_entry(storage, make_entry(lid, e), KEY) for lid in LEDGERS for e in range(ENTRIES))
    )
    await storage.checkpoint()
    return storage


def _check_live(storage: ShardStorage) -> ConsistencyReport:
    report = ConsistencyReport()
    for index, logs in storage.disk_readers():
        check_disk(index, logs, report, digest_ok=crc_ok, batch_entries=7)
    return report


async def test_sound_storage_passes_with_a_row_per_ledger(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    storage = await _filled(open_storage, tmp_path)
    report = await asyncio.to_thread(_check_live, storage)
    assert report.ok and report.entries == len(LEDGERS) * ENTRIES
    assert sorted(report.ledgers) == list(LEDGERS)
    assert all(row.entries == ENTRIES and row.problems == 0 for row in report.ledgers.values())
    assert report.to_dict()["ok"] is True


def _flip_payload_byte(tmp_path: Path, disk: int, ledger_id: int, entry_id: int) -> None:
    path = log_path(tmp_path / f"ledgers{disk}" / "logs", 0)
    for record in iter_log_records(path):
        entry = record.entry
        if entry is not None and (entry.ledger_id, entry.entry_id) == (ledger_id, entry_id):
            with open(path, "r+b") as file:
                position = record.offset + record.size - 1
                file.seek(position)
                byte = file.read(1)
                file.seek(position)
                file.write(bytes([byte[0] ^ 0xFF]))
            return
    raise AssertionError(f"ledger {ledger_id} entry {entry_id} not in {path}")


async def test_a_damaged_record_is_reported_against_its_ledger(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    storage = await _filled(open_storage, tmp_path)
    disk = storage.config.disk_of(4)
    _flip_payload_byte(tmp_path, disk, 4, 7)
    report = await asyncio.to_thread(_check_live, storage)
    assert not report.ok and report.problem_count == 1
    (problem,) = report.problems
    assert (problem.ledger_id, problem.entry_id) == (4, 7)
    assert "checksum" in problem.problem
    assert report.ledgers[4].problems == 1 and report.ledgers[4].entries == ENTRIES
    assert all(report.ledgers[i].problems == 0 for i in LEDGERS if i != 4)


async def test_a_missing_entry_log_and_a_bad_digest_are_reported(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    storage = await _filled(open_storage, tmp_path)
    gone_disk = storage.config.disk_of(3)
    os.unlink(log_path(tmp_path / f"ledgers{gone_disk}" / "logs", 0))

    def digest_ok(entry: StoredEntry) -> bool:
        return not (entry.ledger_id == 4 and entry.entry_id == 2)

    report = ConsistencyReport()
    for index, logs in storage.disk_readers():
        await asyncio.to_thread(check_disk, index, logs, report, digest_ok=digest_ok)
    missing = [p for p in report.problems if "missing" in p.problem]
    assert {p.ledger_id for p in missing} == {
        i for i in LEDGERS if storage.config.disk_of(i) == gone_disk
    }
    digest = [p for p in report.problems if "digest" in p.problem]
    assert [(p.ledger_id, p.entry_id) for p in digest] == [(4, 2)]


async def test_offline_check_reads_the_files_of_a_closed_storage(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    storage = await _filled(open_storage, tmp_path)
    await storage.close()
    _flip_payload_byte(tmp_path, storage.config.disk_of(10), 10, 0)
    report = ConsistencyReport()
    for disk in range(2):
        index = LedgerIndex(tmp_path / f"index{disk}", 1 << 26, readonly=True)
        try:
            reader = FileEntryReader(tmp_path / f"ledgers{disk}" / "logs")
            check_disk(index, reader, report, digest_ok=crc_ok)
        finally:
            index.close()
    assert report.entries == len(LEDGERS) * ENTRIES
    assert [(p.ledger_id, p.entry_id) for p in report.problems] == [(10, 0)]


async def test_batches_resume_after_the_last_key(open_storage: OpenStorage, tmp_path: Path) -> None:
    storage = await _filled(open_storage, tmp_path)
    disk = storage.config.disk_of(3)
    index, logs = storage.disk_readers()[disk]
    counts: dict[int, int] = {}
    batches = 0
    after = None
    while True:
        batch = check_batch(index, logs, after=after, limit=6)
        batches += 1
        for ledger_id, count in batch.entries_by_ledger.items():
            counts[ledger_id] = counts.get(ledger_id, 0) + count
        if batch.done:
            break
        after = batch.last_key
    on_disk = [i for i in LEDGERS if storage.config.disk_of(i) == disk]
    assert counts == dict.fromkeys(on_disk, ENTRIES)
    assert batches == len(on_disk) * ENTRIES // 6 + 1
