"""Lazy records (a WRITE_LAC's LAC): no group of their own; they go with the next group, after
their delay, on force or on close."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from bkaio.errors import ConfigError
from bkaio.journal import EntryRecord, Journal, JournalConfig, LacRecord
from bkaio.wal.config import MAX_LAZY_RECORD_DELAY_MS
from tests.unit.journal.fakes import FakeCountingSync, FakeGatedSync

HOUR_MS = 3_600_000


def _entry(entry_id: int) -> EntryRecord:
    return EntryRecord(1, entry_id, entry_id - 1, entry_id, 0, bytes(10))


async def _iterations(count: int = 5) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


@pytest.fixture
def hour_long_delay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JournalConfig:
    """A delay no loaded box runs out: only other records, force or close send a lazy one."""
    monkeypatch.setattr("bkaio.wal.config.MAX_LAZY_RECORD_DELAY_MS", HOUR_MS)
    return JournalConfig(directories=(tmp_path / "journal",), lazy_record_delay_ms=HOUR_MS)


async def test_a_lazy_record_waits_for_the_next_group_and_shares_its_sync(
    hour_long_delay: JournalConfig,
) -> None:
    sync = FakeCountingSync()
    journal = await Journal.open(hour_long_delay, sync_function=sync)
    try:
        lac = journal.append(LacRecord(ledger_id=1, lac=4), lazy=True)
        await _iterations()
        assert (sync.calls, journal.metrics.groups, lac.done()) == (0, 0, False)
        appended = journal.append_entries(1, [_entry(5)])
        assert appended is not None
        shared, _end = appended
        assert await shared == journal.durable_mark
        assert await lac < journal.durable_mark  # Written first, in the same group.
        assert (sync.calls, journal.metrics.groups, journal.metrics.max_group_records) == (1, 1, 2)
    finally:
        await journal.close()


async def test_lazy_records_formed_during_a_sync_do_not_make_a_group_after_it(
    hour_long_delay: JournalConfig,
) -> None:
    sync = FakeGatedSync()
    journal = await Journal.open(hour_long_delay, sync_function=sync)
    try:
        first = journal.append(_entry(0))
        assert await asyncio.to_thread(sync.entered.wait, 30)
        lac = journal.append(LacRecord(ledger_id=1, lac=0), lazy=True)
        sync.release()
        await first
        await _iterations()
        assert (sync.calls, lac.done()) == (1, False)
        forced = journal.force()  # A force waits for nothing: the lazy record goes now.
        assert await forced == await lac == journal.durable_mark
        assert (sync.calls, journal.metrics.groups) == (2, 2)
    finally:
        await journal.close()


async def test_a_lazy_record_alone_goes_after_its_delay(tmp_path: Path) -> None:
    config = JournalConfig(directories=(tmp_path / "journal",), lazy_record_delay_ms=1)
    sync = FakeCountingSync()
    journal = await Journal.open(config, sync_function=sync)
    try:
        mark = await journal.append(LacRecord(ledger_id=1, lac=0), lazy=True)
        assert mark == journal.durable_mark
        assert (sync.calls, journal.metrics.trigger_wait) == (1, 1)
    finally:
        await journal.close()


async def test_close_writes_a_waiting_lazy_record(hour_long_delay: JournalConfig) -> None:
    sync = FakeCountingSync()
    journal = await Journal.open(hour_long_delay, sync_function=sync)
    lac = journal.append(LacRecord(ledger_id=1, lac=0), lazy=True)
    await _iterations()
    assert not lac.done()
    await journal.close()
    assert await lac == journal.durable_mark
    assert sync.calls == 1


async def test_a_delay_of_zero_commits_lazy_records_at_once(tmp_path: Path) -> None:
    config = JournalConfig(directories=(tmp_path / "journal",), lazy_record_delay_ms=0)
    sync = FakeCountingSync()
    journal = await Journal.open(config, sync_function=sync)
    try:
        await journal.append(LacRecord(ledger_id=1, lac=0), lazy=True)
        assert (sync.calls, journal.metrics.trigger_queue_empty) == (1, 1)
    finally:
        await journal.close()


@pytest.mark.parametrize("delay_ms", [-1, MAX_LAZY_RECORD_DELAY_MS + 1])
def test_a_delay_out_of_range_is_refused(tmp_path: Path, delay_ms: int) -> None:
    config = JournalConfig(directories=(tmp_path / "journal",))
    with pytest.raises(ConfigError, match="lazy_record_delay_ms"):
        replace(config, lazy_record_delay_ms=delay_ms)
