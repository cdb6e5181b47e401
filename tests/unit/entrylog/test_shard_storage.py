"""ShardStorage semantics over several tmp disks, with the real journal and LMDB."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
import structlog

from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.entrylog.state import FLUSH_JITTER_FRACTION
from bkaio.errors import (
    EntryConflictError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    TooManyRequestsError,
    UnauthorizedError,
)
from bkaio.journal import Journal, JournalConfig, open_journal
from bkaio.journal.files import SUFFIX
from bkaio.journal.records import JournalMark
from tests.fixtures.storage import add_entry, read_entry
from tests.unit.entrylog.conftest import KEY, OTHER_KEY, OpenStorage, make_config, make_entry

LEDGERS = (3, 4, 5, 10)  # Spread over disks by ledger_id % disks.


async def _fill(storage: ShardStorage, ledgers: tuple[int, ...], count: int) -> None:
    await asyncio.gather(
        *(add_entry(storage, make_entry(lid, e), KEY) for lid in ledgers for e in range(count))
    )


async def _check_all(storage: ShardStorage, ledgers: tuple[int, ...], count: int) -> None:
    for ledger_id in ledgers:
        for entry_id in range(count):
            assert await read_entry(storage, ledger_id, entry_id) == make_entry(ledger_id, entry_id)


@pytest.mark.parametrize("disks", [2, 3])
async def test_entries_read_back_from_cache_and_after_flush(
    open_storage: OpenStorage, tmp_path: Path, disks: int
) -> None:
    storage = await open_storage(make_config(tmp_path, disks=disks))
    await _fill(storage, LEDGERS, 20)
    await _check_all(storage, LEDGERS, 20)  # From the write cache.
    await storage.checkpoint()
    await _check_all(storage, LEDGERS, 20)  # From entry logs through the index.
    for disk in range(disks):  # Every disk got its share, in its own directories.
        assert list((tmp_path / f"ledgers{disk}" / "logs").glob("*.log"))
        assert (tmp_path / f"index{disk}" / "index.lmdb").exists()
        assert (tmp_path / f"ledgers{disk}" / "lastMark").exists()
    assert storage.ledger_ids() == sorted(LEDGERS)


async def test_read_last_entry_range_and_list(open_storage: OpenStorage) -> None:
    storage = await open_storage()
    for entry_id in (*range(0, 5), *range(7, 10)):
        await add_entry(storage, make_entry(1, entry_id), KEY)
    await storage.checkpoint()
    await add_entry(storage, make_entry(1, 10), KEY)  # This one stays in the cache.
    assert (await read_entry(storage, 1, -1)).entry_id == 10
    assert await storage.list_entries(1) == [(0, 4), (7, 10)]
    found = await storage.read_range(1, 0, 100, 1 << 20)
    assert [e.entry_id for e in found] == [0, 1, 2, 3, 4]  # Stops at the first gap.
    found = await storage.read_range(1, 7, 100, 1 << 20)
    assert [e.entry_id for e in found] == [7, 8, 9, 10]  # Index, then write cache.
    assert len(await storage.read_range(1, 0, 2, 1 << 20)) == 2
    assert len(await storage.read_range(1, 0, 100, 250)) == 2  # 100-byte payloads.
    assert len(await storage.read_range(1, 0, 100, 1)) == 1  # Always at least one.
    with pytest.raises(NoSuchEntryError):
        await storage.read_range(1, 5, 10, 1 << 20)


async def test_missing_ledger_and_entry(open_storage: OpenStorage) -> None:
    storage = await open_storage()
    with pytest.raises(NoSuchLedgerError):
        await read_entry(storage, 99, 0)
    with pytest.raises(NoSuchLedgerError):
        storage.last_add_confirmed(99)
    with pytest.raises(NoSuchLedgerError):
        await storage.list_entries(99)
    assert storage.ledger_state(99) is None
    await storage.fence(99, KEY)  # A fence creates the ledger, with no entries.
    with pytest.raises(NoSuchEntryError):
        await read_entry(storage, 99, -1)
    await add_entry(storage, make_entry(7, 0), KEY)
    with pytest.raises(NoSuchEntryError, match="entry 1 is not stored"):
        await read_entry(storage, 7, 1)
    await storage.checkpoint()
    with pytest.raises(NoSuchEntryError):
        await read_entry(storage, 7, 1)


async def test_master_key_and_fencing(open_storage: OpenStorage) -> None:
    storage = await open_storage()
    await add_entry(storage, make_entry(2, 0), KEY)
    with pytest.raises(UnauthorizedError):
        await add_entry(storage, make_entry(2, 1), OTHER_KEY)
    with pytest.raises(UnauthorizedError):
        await storage.fence(2, OTHER_KEY)
    with pytest.raises(UnauthorizedError):
        await storage.write_lac(2, OTHER_KEY, 0)
    await storage.fence(2, KEY)
    await storage.fence(2, KEY)  # Idempotent.
    with pytest.raises(LedgerFencedError):
        await add_entry(storage, make_entry(2, 1), KEY)
    await add_entry(storage, make_entry(2, 1), KEY, recovery=True)
    state = storage.ledger_state(2)
    assert state is not None and state.fenced and state.master_key == KEY
    assert state.last_entry_id == 1


async def test_conflicting_and_identical_re_adds(open_storage: OpenStorage) -> None:
    storage = await open_storage()
    await add_entry(storage, make_entry(3, 0), KEY)
    await add_entry(storage, make_entry(3, 0), KEY)  # Identical: fine.
    with pytest.raises(EntryConflictError):
        await add_entry(storage, make_entry(3, 0, payload=b"other"), KEY)
    await storage.checkpoint()
    await add_entry(storage, make_entry(3, 0), KEY, recovery=True)
    with pytest.raises(EntryConflictError):
        await add_entry(storage, make_entry(3, 0, payload=b"other"), KEY)
    # Two concurrent adds of one id with different payloads: exactly one wins.
    results = await asyncio.gather(
        add_entry(storage, make_entry(3, 1), KEY),
        add_entry(storage, make_entry(3, 1, payload=b"other"), KEY),
        return_exceptions=True,
    )
    assert results[0] is None and isinstance(results[1], EntryConflictError)
    assert await read_entry(storage, 3, 1) == make_entry(3, 1)


async def test_lac_piggyback_and_explicit(open_storage: OpenStorage) -> None:
    # Long polls wait in the server (bkaio/bookie/lac_waiters.py), not in storage.
    storage = await open_storage()
    await add_entry(storage, make_entry(4, 0, lac=-1), KEY)
    assert storage.last_add_confirmed(4) == -1
    await add_entry(storage, make_entry(4, 1, lac=0), KEY)
    assert storage.last_add_confirmed(4) == 0
    await add_entry(storage, make_entry(4, 2, lac=-1), KEY)  # LAC never goes back.
    assert storage.last_add_confirmed(4) == 0
    await storage.write_lac(4, KEY, 2)
    assert storage.last_add_confirmed(4) == 2
    await storage.fence(4, KEY)
    assert storage.last_add_confirmed(4) == 2


async def test_an_explicit_lac_costs_no_journal_group_of_its_own(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    """WRITE_LAC's LAC is applied at once and journaled lazily: it goes with the next add's
    group (no write and sync of its own), and replay restores it."""
    journals: list[Journal] = []

    async def keep_journal(config: JournalConfig, directory: Path) -> Journal:
        journals.append(await open_journal(config, directory))
        return journals[-1]

    config = make_config(tmp_path)
    config = dataclasses.replace(
        config, journal=dataclasses.replace(config.journal, lazy_record_delay_ms=10_000)
    )
    storage = await open_storage(config, journal_factory=keep_journal)
    await add_entry(storage, make_entry(4, 0, lac=-1), KEY)
    stats = journals[0].metrics
    groups, records = stats.groups, stats.records
    await storage.write_lac(4, KEY, 0)
    assert storage.last_add_confirmed(4) == 0
    for _ in range(5):
        await asyncio.sleep(0)
    assert (stats.groups, stats.records) == (groups, records)
    await add_entry(storage, make_entry(4, 1, lac=-1), KEY)
    assert (stats.groups, stats.records) == (groups + 1, records + 2)
    await storage.close(checkpoint=False)  # Only the journal holds the LAC now.
    reopened = await open_storage(config)
    assert reopened.last_add_confirmed(4) == 0


async def test_delete_ledger(open_storage: OpenStorage, tmp_path: Path) -> None:
    storage = await open_storage()
    await _fill(storage, (6, 8), 10)
    await storage.checkpoint()
    await add_entry(storage, make_entry(6, 10), KEY)  # One in the cache too.
    await storage.delete_ledger(6)
    await storage.delete_ledger(6)  # Idempotent.
    with pytest.raises(NoSuchLedgerError):
        await read_entry(storage, 6, 0)
    assert storage.ledger_ids() == [8]
    await storage.close(checkpoint=False)
    reopened = await open_storage()  # Replay must not bring it back.
    assert reopened.ledger_ids() == [8]
    await _check_all(reopened, (8,), 10)


async def test_delete_ledgers_drops_only_what_confirm_returns_after_the_checkpoint(
    open_storage: OpenStorage,
) -> None:
    """GC's last look at the lease of its locks comes after the checkpoint the delete starts
    with (the flush lock waited for, the cache written), just before the drop."""
    storage = await open_storage()
    await _fill(storage, (6, 7, 8), 10)
    asked: list[tuple[list[int], int]] = []

    def confirm(ledger_ids: list[int]) -> list[int]:
        asked.append((list(ledger_ids), storage.stats.entries_flushed))
        return [6, 8]

    assert await storage.delete_ledgers([6, 7, 8, 9], confirm=confirm) == [6, 8]
    assert asked == [([6, 7, 8], 30)]  # The ones it has, once their entries were flushed.
    assert storage.ledger_ids() == [7]
    await _check_all(storage, (7,), 10)
    assert await storage.delete_ledgers([7], confirm=lambda _: []) == []
    assert storage.ledger_ids() == [7]
    await storage.close()


async def test_compaction_frees_space_and_keeps_live_entries(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    config = make_config(tmp_path, disks=2, entry_log_max_bytes=4096, compaction_threshold=0.9)
    storage = await open_storage(config)
    live, dead = (11, 13), (21, 23)  # All on disk 1, interleaved in the same entry logs.
    for entry_id in range(40):
        for ledger_id in (*live, *dead):
            await add_entry(storage, make_entry(ledger_id, entry_id), KEY)
        if entry_id % 10 == 9:
            await storage.checkpoint()
    logs_dir = tmp_path / "ledgers1" / "logs"
    before = sum(p.stat().st_size for p in logs_dir.glob("*.log"))
    files_before = {p.name for p in logs_dir.glob("*.log")}
    for ledger_id in dead:
        await storage.delete_ledger(ledger_id)
    report = await storage.compact()
    after = sum(p.stat().st_size for p in logs_dir.glob("*.log"))
    assert report.logs_compacted > 0 and report.bytes_freed > 0
    assert after < before * 0.65  # Half the entries were deleted.
    assert files_before - {p.name for p in logs_dir.glob("*.log")}  # Old files are gone.
    await _check_all(storage, live, 40)
    await storage.close()
    reopened = await open_storage(config)
    await _check_all(reopened, live, 40)
    assert await reopened.list_entries(11) == [(0, 39)]


async def test_reopen_keeps_entries_fences_keys_and_lacs(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    storage = await open_storage()
    await _fill(storage, LEDGERS, 5)
    await storage.fence(3, KEY)
    await storage.write_lac(4, KEY, 4)
    await storage.close()
    reopened = await open_storage()
    await _check_all(reopened, LEDGERS, 5)
    _assert_state_restored(reopened)


@pytest.mark.parametrize("journals", [1, 2])
async def test_replay_after_unclean_stop(
    open_storage: OpenStorage, tmp_path: Path, journals: int
) -> None:
    """No final flush: everything comes back from the journal(s)."""
    config = make_config(tmp_path, journals=journals)
    storage = await open_storage(config)
    await _fill(storage, LEDGERS, 3)
    await storage.checkpoint()  # Part of it in entry logs, the rest only in the journal.
    await _fill(storage, LEDGERS, 5)
    await storage.fence(3, KEY)
    await storage.write_lac(4, KEY, 4)
    await storage.close(checkpoint=False)
    reopened = await open_storage(config)
    await _check_all(reopened, LEDGERS, 5)
    _assert_state_restored(reopened)
    # After replay a checkpoint ran: a second unclean stop loses nothing either.
    await reopened.close(checkpoint=False)
    again = await open_storage(config)
    await _check_all(again, LEDGERS, 5)
    _assert_state_restored(again)


async def test_replay_of_a_journal_larger_than_the_write_cache_flushes_as_it_goes(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    """Replay streams: the write cache is flushed whenever it is half full, as for adds."""
    storage = await open_storage(make_config(tmp_path))
    payload = b"p" * 10_000
    entries = [make_entry(3, i, payload=payload) for i in range(200)]  # ~2 MB of journal.
    await asyncio.gather(*(add_entry(storage, entry, KEY) for entry in entries))
    await storage.close(checkpoint=False)
    small = make_config(tmp_path, write_cache_bytes=256 * 1024)
    reopened = await open_storage(small)
    assert reopened.stats.replayed_records == 201  # The key record and 200 entries.
    assert reopened.stats.flushes >= 8  # ~2 MB through a 256 KiB cache flushed at half.
    for entry in entries:
        assert await read_entry(reopened, 3, entry.entry_id) == entry


def _assert_state_restored(storage: ShardStorage) -> None:
    fenced = storage.ledger_state(3)
    assert fenced is not None and fenced.fenced and fenced.master_key == KEY
    assert fenced.last_entry_id == 4
    with_lac = storage.ledger_state(4)
    assert with_lac is not None and with_lac.explicit_lac == 4 and with_lac.lac == 4
    assert storage.last_add_confirmed(5) == 3  # Piggybacked LAC of entry 4.


async def test_write_cache_full_refuses_after_the_wait(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    config = make_config(tmp_path, write_cache_bytes=1000, write_cache_max_wait_seconds=0.0)
    storage = await open_storage(config)
    await add_entry(storage, make_entry(1, 0, payload=b"x" * 700), KEY)
    with pytest.raises(TooManyRequestsError, match="write cache"):
        await add_entry(storage, make_entry(1, 1, payload=b"y" * 700), KEY)


async def test_a_full_cache_is_flushed_for_waiting_adds(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    config = make_config(tmp_path, write_cache_bytes=4000, write_cache_max_wait_seconds=30.0)
    storage = await open_storage(config)
    await _fill(storage, (1, 2), 50)  # ~23 KB through a 4 KB cache.
    await _check_all(storage, (1, 2), 50)


async def test_periodic_flush_writes_a_checkpoint(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    storage = await open_storage(make_config(tmp_path, flush_interval_seconds=0.01))
    mark_file = tmp_path / "ledgers0" / "lastMark"
    first = mark_file.read_bytes()
    await add_entry(storage, make_entry(2, 0), KEY)
    for _ in range(500):
        if mark_file.read_bytes() != first:
            break
        await asyncio.sleep(0.01)
    assert mark_file.read_bytes() != first


async def test_periodic_flush_intervals_are_spread(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    """Bookies started together must not flush together for ever: each wait is drawn anew
    within +-FLUSH_JITTER_FRACTION of the configured interval."""
    storage = await open_storage(make_config(tmp_path, flush_interval_seconds=2.0))
    delays = [storage._next_flush_delay() for _ in range(200)]
    spread = FLUSH_JITTER_FRACTION * 2.0
    assert all(2.0 - spread <= delay <= 2.0 + spread for delay in delays)
    assert len(set(delays)) > 100  # Drawn each time, not one fixed offset.
    assert min(delays) < 1.9 and max(delays) > 2.1


async def test_disk_usage_thresholds(open_storage: OpenStorage, tmp_path: Path) -> None:
    used = {"fraction": 0.5}

    def usage(path: Path) -> tuple[int, int, int]:
        total = 1000
        taken = int(total * used["fraction"])
        return total, taken, total - taken

    storage = await open_storage(usage_function=usage)
    entries = storage.disk_usage()
    assert len(entries) == 1 + 2 + 2  # Journal, ledger and index directories.
    assert {e.kind for e in entries} == {"journal", "ledger", "index"}
    assert not storage.is_over_read_only_threshold()
    used["fraction"] = 0.92
    assert storage.is_over_warn_threshold() and not storage.is_over_read_only_threshold()
    used["fraction"] = 0.96
    assert storage.is_over_read_only_threshold()
    assert all(e.fraction == pytest.approx(0.96) for e in storage.disk_usage())


async def test_closed_storage_refuses(open_storage: OpenStorage) -> None:
    storage = await open_storage()
    await storage.close()
    await storage.close()
    with pytest.raises(Exception, match="closed"):
        await add_entry(storage, make_entry(1, 0), KEY)


async def test_a_torn_journal_tail_is_a_warning_and_loses_nothing_acknowledged(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    storage = await open_storage()
    await _fill(storage, LEDGERS, 3)
    await storage.close(checkpoint=False)
    journal_file = max((tmp_path / "journal").glob(f"*{SUFFIX}"))
    torn = b"\x00\x00\x01\x00\x00\x00\x00\x10\x01partial"  # A record cut mid-write.
    journal_file.write_bytes(journal_file.read_bytes() + torn)
    with structlog.testing.capture_logs() as logs:
        reopened = await open_storage()
    assert any(event["event"] == "journal_torn_tail" for event in logs), logs
    await _check_all(reopened, LEDGERS, 3)


async def test_flushes_do_not_wait_for_journal_files_being_deleted(
    open_storage: OpenStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleting a released journal file is slow on purpose (delete_gradually): meanwhile the
    flush lock is free, and an explicit checkpoint returns only once the deletion is done."""
    storage = await open_storage()
    journal = storage._journals[0]
    real_delete = journal.delete_files_before
    gate = asyncio.Event()
    started = asyncio.Event()

    async def slow_delete(mark: JournalMark) -> object:
        started.set()
        await gate.wait()
        return await real_delete(mark)

    monkeypatch.setattr(journal, "delete_files_before", slow_delete)
    await add_entry(storage, make_entry(21, 0), KEY)
    first = asyncio.ensure_future(storage.checkpoint())
    async with asyncio.timeout(5):
        await started.wait()
    assert not first.done()  # Waiting for the deletion...
    await add_entry(storage, make_entry(21, 1), KEY)
    async with asyncio.timeout(5), storage._flush_lock:  # ...but not holding the flush lock.
        await storage._checkpoint_locked()
    assert not first.done()
    gate.set()
    async with asyncio.timeout(5):
        await first
    assert storage._releaser is None
