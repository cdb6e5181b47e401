"""`ShardStorage.read_records` (READ_ENTRIES): entries from the write cache, from entry logs
through the index, and both; strides, gaps, limits, reads during a flush and after
compaction. Every answer is checked the way a client checks it (`scan_records`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bkaio.entrylog.entry_log import encode_record
from bkaio.entrylog.shard_storage import ShardStorage, StoredEntry
from bkaio.errors import NoSuchLedgerError
from bkaio.protocol.digest import entry_digest
from bkaio.protocol.records import scan_records
from tests.fixtures.storage import add_entry
from tests.unit.entrylog.conftest import KEY, OpenStorage, make_config, payload_of

BIG = 1 << 30


def entry(ledger_id: int, entry_id: int, size: int = 100) -> StoredEntry:
    data = payload_of(ledger_id, entry_id, size)
    length = (entry_id + 1) * size
    digest = entry_digest(ledger_id, entry_id, entry_id - 1, length, data)
    return StoredEntry(ledger_id, entry_id, entry_id - 1, length, digest, data)


async def add(storage: ShardStorage, ledger_id: int, entry_ids: range | list[int]) -> None:
    await asyncio.gather(*(add_entry(storage, entry(ledger_id, e), KEY) for e in entry_ids))


async def read(
    storage: ShardStorage,
    ledger_id: int,
    first: int,
    last: int,
    stride: int = 1,
    max_count: int = BIG,
    max_bytes: int = BIG,
) -> tuple[list[int], int]:
    """(entry ids found, next_entry_id), each record checked as a client checks it."""
    run = await storage.read_records(ledger_id, first, last, stride, max_count, max_bytes)
    scan = scan_records(b"".join(run.parts), ledger_id, first, stride, last)
    assert scan.problem is None and scan.corrupt == []
    assert scan.payloads == [entry(ledger_id, e).payload for e in scan.entry_ids]
    assert run.count == len(scan.entry_ids)
    assert run.payload_bytes == sum(map(len, scan.payloads))
    return scan.entry_ids, run.next_entry_id


@pytest.mark.parametrize("where", ["cache", "logs", "both"])
async def test_ranges_and_strides_from_everywhere(open_storage: OpenStorage, where: str) -> None:
    storage = await open_storage()
    await add(storage, 1, range(0, 60))
    if where != "cache":
        await storage.checkpoint()
    if where == "both":
        await add(storage, 1, range(60, 100))
    last = 59 if where != "both" else 99
    assert await read(storage, 1, 0, last) == (list(range(last + 1)), last + 1)
    assert await read(storage, 1, 3, last, stride=5) == (list(range(3, last + 1, 5)), last + 1)
    assert await read(storage, 1, 50, 70) == (list(range(50, min(last, 70) + 1)), 71)
    assert await read(storage, 1, 200, 300) == ([], 301)


async def test_disk_records_are_sent_as_the_entry_log_holds_them(
    open_storage: OpenStorage,
) -> None:
    storage = await open_storage()
    await add(storage, 1, range(10))
    await storage.checkpoint()
    run = await storage.read_records(1, 0, 9, 1, BIG, BIG)
    assert len(run.parts) == 1  # One pread for the run of ten.
    assert bytes(run.parts[0]) == b"".join(encode_record(entry(1, e)) for e in range(10))
    striped = await storage.read_records(1, 1, 9, 3, BIG, BIG)  # 1, 4, 7: one read, sliced.
    assert [bytes(p) for p in striped.parts] == [encode_record(entry(1, e)) for e in (1, 4, 7)]


async def test_entries_missing_here_are_left_out(open_storage: OpenStorage) -> None:
    storage = await open_storage()
    await add(storage, 1, [0, 1, 2, 5, 6, 9])  # Qa < Qw: a bookie may miss some.
    await storage.checkpoint()
    await add(storage, 1, [11, 14])
    assert await read(storage, 1, 0, 14) == ([0, 1, 2, 5, 6, 9, 11, 14], 15)
    assert await read(storage, 1, 1, 14, stride=2) == ([1, 5, 9, 11], 15)


@pytest.mark.parametrize("flushed", [False, True])
async def test_limits_cut_the_answer_and_say_where(
    open_storage: OpenStorage, flushed: bool
) -> None:
    storage = await open_storage()
    await add(storage, 1, range(30))
    if flushed:
        await storage.checkpoint()
    assert await read(storage, 1, 0, 29, max_count=7) == (list(range(7)), 7)
    assert await read(storage, 1, 0, 29, max_bytes=450) == (list(range(4)), 4)  # 100 B each.
    assert await read(storage, 1, 2, 29, stride=3, max_count=2) == ([2, 5], 8)
    assert await read(storage, 1, 0, 29, max_bytes=1) == ([0], 1)  # The first always fits.


async def test_a_read_across_the_flush_boundary_keeps_the_limits(
    open_storage: OpenStorage,
) -> None:
    storage = await open_storage()
    await add(storage, 1, range(20))
    await storage.checkpoint()
    await add(storage, 1, range(20, 40))
    assert await read(storage, 1, 15, 39, max_count=10) == (list(range(15, 25)), 25)
    assert await read(storage, 1, 15, 39, max_bytes=750) == (list(range(15, 22)), 22)
    await add_entry(storage, entry(1, 42), KEY)
    await add_entry(storage, entry(1, 45), KEY)
    assert await read(storage, 1, 30, 50) == ([*range(30, 40), 42, 45], 51)


async def test_reads_during_flushes_miss_nothing(open_storage: OpenStorage) -> None:
    storage = await open_storage()
    for round_ in range(5):
        await add(storage, 1, range(round_ * 50, round_ * 50 + 50))
        last = round_ * 50 + 49
        flush = asyncio.ensure_future(storage.checkpoint())
        reads = [asyncio.ensure_future(read(storage, 1, 0, last)) for _ in range(5)]
        await flush
        for done in await asyncio.gather(*reads):
            assert done == (list(range(last + 1)), last + 1)


async def test_reads_after_compaction_find_the_moved_entries(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    config = make_config(tmp_path, disks=1, entry_log_max_bytes=4096, compaction_threshold=0.9)
    storage = await open_storage(config)
    for entry_id in range(40):
        for ledger_id in (2, 3):
            await add_entry(storage, entry(ledger_id, entry_id), KEY)
        if entry_id % 10 == 9:
            await storage.checkpoint()
    await storage.delete_ledger(3)
    assert (await storage.compact()).logs_compacted > 0
    assert await read(storage, 2, 0, 39) == (list(range(40)), 40)
    assert await read(storage, 2, 0, 39, stride=4) == (list(range(0, 40, 4)), 40)


async def test_an_unknown_ledger_is_no_such_ledger(open_storage: OpenStorage) -> None:
    storage = await open_storage()
    with pytest.raises(NoSuchLedgerError):
        await storage.read_records(77, 0, 10, 1, 10, BIG)
