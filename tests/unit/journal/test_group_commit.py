"""Group commit: many appends per sync, bounded groups, roll-over, failures, close."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from bkaio.errors import BookieIOError
from bkaio.journal import (
    EntryRecord,
    FenceRecord,
    Journal,
    JournalConfig,
    JournalError,
    JournalFullError,
    JournalMark,
    JournalRecord,
    RecordError,
    encode_record,
)
from bkaio.journal.files import HEADER_BYTES
from tests.unit.journal.fakes import FailingSync, FakeCountingSync, FakeGatedSync


def entry(entry_id: int, payload_bytes: int = 100, ledger_id: int = 1) -> EntryRecord:
    return EntryRecord(ledger_id, entry_id, entry_id - 1, entry_id, 0, bytes(payload_bytes))


def record_bytes(payload_bytes: int) -> int:
    return len(encode_record(entry(0, payload_bytes)))


@pytest.fixture
def config(tmp_path: Path) -> JournalConfig:
    return JournalConfig(directories=(tmp_path / "journal",))


async def hold_first_sync(journal: Journal, sync: FakeGatedSync) -> asyncio.Future[JournalMark]:
    """Append one record and return once its sync is in flight (and held)."""
    first = journal.append(FenceRecord(ledger_id=99))
    assert await asyncio.to_thread(sync.entered.wait, 30)
    return first


async def test_concurrent_appends_while_a_sync_is_in_flight_share_one_sync(
    config: JournalConfig,
) -> None:
    sync = FakeGatedSync()
    journal = await Journal.open(config, sync_function=sync)
    try:
        first = await hold_first_sync(journal, sync)

        async def producer(entry_id: int) -> JournalMark:
            return await journal.append(entry(entry_id))

        producers = [asyncio.create_task(producer(i)) for i in range(500)]
        await asyncio.sleep(0)  # Every producer appends before the gate opens.
        sync.release()
        marks = await asyncio.gather(*producers)
        await first
        assert sync.calls == 2
        assert journal.metrics.groups == 2
        assert journal.metrics.max_group_records == 500
        assert sorted(marks) == marks and len(set(marks)) == 500
        assert journal.durable_mark == marks[-1]
    finally:
        await journal.close()


async def test_groups_respect_the_entry_bound(config: JournalConfig) -> None:
    sync = FakeGatedSync()
    journal = await Journal.open(replace(config, max_group_entries=100), sync_function=sync)
    try:
        first = await hold_first_sync(journal, sync)
        appends = [asyncio.create_task(journal.append_and_wait(entry(i))) for i in range(350)]
        await asyncio.sleep(0)
        sync.release()
        marks = await asyncio.gather(*appends)
        await first
        assert journal.metrics.records == 351
        assert journal.metrics.max_group_records == 100
        assert journal.metrics.trigger_entries >= 3
        assert marks == sorted(marks)
    finally:
        await journal.close()


async def test_groups_respect_the_byte_bound(config: JournalConfig) -> None:
    sync = FakeGatedSync()
    one_record = record_bytes(1000)
    journal = await Journal.open(replace(config, max_group_bytes=4096), sync_function=sync)
    try:
        first = await hold_first_sync(journal, sync)
        appends = [asyncio.create_task(journal.append_and_wait(entry(i, 1000))) for i in range(40)]
        await asyncio.sleep(0)
        sync.release()
        await asyncio.gather(*appends, first)
        group_sizes = [b - a for a, b in zip(sync.sizes, sync.sizes[1:], strict=False)]
        assert group_sizes, sync.sizes
        # A group takes records while it is under the bound: at most one record crosses it.
        assert max(group_sizes) < 4096 + one_record
        assert journal.metrics.trigger_bytes >= 1
        assert journal.metrics.max_group_bytes < 4096 + one_record
    finally:
        await journal.close()


async def test_a_full_group_refuses_until_there_is_room(config: JournalConfig) -> None:
    sync = FakeGatedSync()
    journal = await Journal.open(replace(config, max_group_entries=2), sync_function=sync)
    try:
        first = await hold_first_sync(journal, sync)
        second, third = journal.append(entry(1)), journal.append(entry(2))
        with pytest.raises(JournalFullError, match="wait_for_room"):
            journal.append(entry(3))
        waiting = asyncio.create_task(journal.wait_for_room())
        await asyncio.sleep(0)
        assert not waiting.done()
        sync.release()
        await waiting
        fourth = journal.append(entry(3))
        await asyncio.gather(first, second, third, fourth)
    finally:
        await journal.close()


async def test_a_lone_append_on_an_idle_journal_commits_at_once(config: JournalConfig) -> None:
    sync = FakeCountingSync()
    journal = await Journal.open(config, sync_function=sync)
    try:
        for i in range(5):
            mark = await journal.append(entry(i))
            assert journal.durable_mark == mark
        assert sync.calls == 5
        assert journal.metrics.trigger_queue_empty == 5
    finally:
        await journal.close()


async def test_marks_are_positions_after_each_record(config: JournalConfig) -> None:
    journal = await Journal.open(config, sync_function=FakeCountingSync())
    try:
        records: list[JournalRecord] = [entry(0, 10), FenceRecord(1), entry(1, 50)]
        marks = await asyncio.gather(*(journal.append(record) for record in records))
        offset = HEADER_BYTES
        for record, mark in zip(records, marks, strict=True):
            offset += len(encode_record(record))
            assert mark == JournalMark(journal.current_file_id, offset)
    finally:
        await journal.close()


async def test_force_resolves_after_everything_before_it(config: JournalConfig) -> None:
    sync = FakeGatedSync()
    journal = await Journal.open(config, sync_function=sync)
    try:
        first = await hold_first_sync(journal, sync)
        later = journal.append(entry(1))
        forced = journal.force()
        await asyncio.sleep(0)
        assert not forced.done()
        sync.release()
        assert await forced == await later
        await first
        assert await journal.force() == journal.durable_mark  # Nothing pending: at once.
    finally:
        await journal.close()


async def test_roll_over_at_max_file_bytes(config: JournalConfig) -> None:
    config = replace(config, max_file_bytes=4096, max_group_bytes=1024, sync=False)
    journal = await Journal.open(config)
    marks = [await journal.append(entry(i, 200)) for i in range(60)]
    await journal.close()
    file_ids = sorted({mark.file_id for mark in marks})
    assert len(file_ids) > 3 and file_ids == list(range(file_ids[0], file_ids[-1] + 1))
    assert journal.metrics.rolls == len(file_ids) - 1
    for path in (config.directories[0]).glob("*.jnl"):
        assert path.stat().st_size < 4096 + 1024 + record_bytes(200)

    reopened = await Journal.open(config)
    try:
        result = reopened.replay(None)
        assert [mark for mark, _record in result.records] == marks
        assert result.torn_tail is None and result.corruption == []
        assert reopened.current_file_id == file_ids[-1] + 1
    finally:
        await reopened.close()


async def test_a_failing_sync_fails_the_whole_group_and_stops_the_journal(
    config: JournalConfig,
) -> None:
    sync = FailingSync(fail_on_call=2)
    journal = await Journal.open(config, sync_function=sync)
    try:
        await journal.append(entry(0))
        group = [journal.append(entry(i)) for i in range(1, 11)]
        results = await asyncio.gather(*group, return_exceptions=True)
        assert all(isinstance(result, BookieIOError) for result in results), results
        assert "injected fdatasync failure" in str(results[0])
        assert isinstance(journal.failure, BookieIOError)
        with pytest.raises(BookieIOError):
            journal.append(entry(11))
        with pytest.raises(BookieIOError):
            journal.force()
        with pytest.raises(BookieIOError):
            await journal.wait_for_room()
        assert journal.metrics.groups == 1
        assert sync.calls == 2  # Nothing was written or synced after the failure.
    finally:
        await journal.close()


async def test_a_failure_also_fails_the_group_that_was_filling(config: JournalConfig) -> None:
    class GatedFailingSync(FakeGatedSync):
        def __call__(self, fd: int) -> None:
            super().__call__(fd)
            raise OSError(5, "injected EIO")

    sync = GatedFailingSync()
    journal = await Journal.open(config, sync_function=sync)
    try:
        first = await hold_first_sync(journal, sync)
        filling = [journal.append(entry(i)) for i in range(5)]
        forced = journal.force()
        sync.release()
        results = await asyncio.gather(first, forced, *filling, return_exceptions=True)
        assert all(isinstance(result, BookieIOError) for result in results), results
        assert sync.calls == 1
    finally:
        await journal.close()


async def test_close_flushes_what_is_queued(config: JournalConfig) -> None:
    journal = await Journal.open(config, sync_function=FakeCountingSync())
    pending = [journal.append(entry(i)) for i in range(10)]
    await journal.close()
    assert all(future.done() and future.exception() is None for future in pending)
    with pytest.raises(JournalError, match="closed"):
        journal.append(entry(10))
    reopened = await Journal.open(config)
    try:
        assert len(reopened.replay(None).records) == 10
    finally:
        await reopened.close()


async def test_a_cancelled_append_is_still_written(config: JournalConfig) -> None:
    journal = await Journal.open(config, sync_function=FakeCountingSync())
    cancelled = journal.append(entry(0))
    cancelled.cancel()
    await journal.append(entry(1))
    await journal.close()
    reopened = await Journal.open(config)
    try:
        assert len(reopened.replay(None).records) == 2
    finally:
        await reopened.close()


async def test_append_encoded_refuses_bytes_that_are_not_one_record(config: JournalConfig) -> None:
    journal = await Journal.open(config, sync_function=FakeCountingSync())
    try:
        with pytest.raises(RecordError, match="not one encoded record"):
            journal.append_encoded(b"junk")
        with pytest.raises(RecordError, match="not one encoded record"):
            journal.append_encoded(encode_record(entry(0)) * 2)
        mark = await journal.append_encoded(encode_record(entry(0)))
        assert mark == journal.durable_mark
    finally:
        await journal.close()


@pytest.fixture
def hour_long_wait(config: JournalConfig, monkeypatch: pytest.MonkeyPatch) -> JournalConfig:
    """A wait that no loaded box runs out: only an append, a full group or close ends it."""
    monkeypatch.setattr("bkaio.wal.config.MAX_ADAPTIVE_WAIT_US", 3_600_000_000)
    return replace(config, adaptive_wait_us=3_600_000_000)


async def _iterations(count: int = 5) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def test_a_burst_waits_for_the_next_append_and_shares_its_sync(
    hour_long_wait: JournalConfig,
) -> None:
    sync = FakeCountingSync()
    journal = await Journal.open(hour_long_wait, sync_function=sync)
    try:
        burst = journal.append_entries(1, [_entry(0), _entry(1)])
        assert burst is not None
        await _iterations()
        assert (journal.metrics.holds, sync.calls) == (1, 0)  # Waiting, the writer free.
        following = journal.append_entries(1, [_entry(2)])
        assert following is not None and following[0] is burst[0]  # The same group.
        assert await burst[0] == journal.durable_mark
        stats = journal.metrics
        assert (sync.calls, stats.groups, stats.max_group_records) == (1, 1, 3)
        assert (stats.trigger_queue_empty, stats.trigger_wait, stats.holds_fruitless) == (1, 0, 0)
    finally:
        await journal.close()


async def test_a_single_record_never_waits(hour_long_wait: JournalConfig) -> None:
    """A serial writer (or 1k/s) sends one entry at a time: it must not wait for a next one
    that only its answer would bring."""
    journal = await Journal.open(hour_long_wait, sync_function=FakeCountingSync())
    try:
        for entry_id in range(3):
            appended = journal.append_entries(1, [_entry(entry_id)])
            assert appended is not None
            await appended[0]
        await journal.append(FenceRecord(ledger_id=1))
        assert (journal.metrics.holds, journal.metrics.groups) == (0, 4)
    finally:
        await journal.close()


async def test_a_group_formed_during_a_sync_does_not_wait(hour_long_wait: JournalConfig) -> None:
    sync = FakeGatedSync()
    journal = await Journal.open(hour_long_wait, sync_function=sync)
    try:
        first = await hold_first_sync(journal, sync)
        during = journal.append_entries(1, [_entry(i) for i in range(5)])
        assert during is not None
        sync.release()
        await first
        await during[0]  # Handed to the writer as soon as it was free: no wait.
        assert journal.metrics.holds == 0
    finally:
        await journal.close()


async def test_a_wait_that_catches_nothing_commits_and_pauses_waiting(
    config: JournalConfig,
) -> None:
    sync = FakeCountingSync()
    journal = await Journal.open(replace(config, adaptive_wait_us=1000), sync_function=sync)
    try:
        burst = journal.append_entries(1, [_entry(0), _entry(1)])
        assert burst is not None
        await burst[0]  # Nobody appends: the wait runs out, and the group goes.
        stats = journal.metrics
        assert (stats.holds, stats.holds_fruitless, stats.trigger_wait) == (1, 1, 1)
        again = journal.append_entries(1, [_entry(2), _entry(3)])
        assert again is not None
        await again[0]
        assert stats.holds == 1  # Waiting is off for a while after a fruitless wait.
    finally:
        await journal.close()


async def test_close_commits_a_waiting_group(hour_long_wait: JournalConfig) -> None:
    journal = await Journal.open(hour_long_wait, sync_function=FakeCountingSync())
    burst = journal.append_entries(1, [_entry(0), _entry(1)])
    assert burst is not None
    await _iterations()
    assert journal.metrics.holds == 1
    await journal.close()
    assert await burst[0] == journal.durable_mark


async def test_adaptive_wait_still_commits_everything(config: JournalConfig) -> None:
    journal = await Journal.open(
        replace(config, adaptive_wait_us=2000), sync_function=FakeCountingSync()
    )
    try:
        for i in range(5):
            await journal.append(entry(i))
        await asyncio.gather(*(journal.append(entry(i)) for i in range(5, 50)))
        stats = journal.metrics
        assert stats.records == 50
        triggers = (
            stats.trigger_bytes + stats.trigger_entries + stats.trigger_queue_empty
        ) + stats.trigger_wait
        assert triggers == stats.groups
    finally:
        await journal.close()


async def test_a_directory_has_one_journal_at_a_time(config: JournalConfig) -> None:
    journal = await Journal.open(config, sync_function=FakeCountingSync())
    try:
        with pytest.raises(JournalError, match="in use"):
            await Journal.open(config)
    finally:
        await journal.close()
    again = await Journal.open(config)  # The lock went with close().
    await again.close()


async def test_shared_appends_of_one_group_wait_on_one_future_resolved_at_its_end(
    config: JournalConfig,
) -> None:
    sync = FakeGatedSync()
    journal = await Journal.open(config, sync_function=sync)
    try:
        first = await hold_first_sync(journal, sync)
        shared = [journal.append_entries(1, [_entry(i)]) for i in range(5)]
        alone = journal.append(FenceRecord(ledger_id=1))  # Its own future, same group.
        assert all(appended is not None for appended in shared)
        futures = {id(appended[0]) for appended in shared if appended is not None}
        assert len(futures) == 1
        ends = [appended[1] for appended in shared if appended is not None]
        assert ends == sorted(ends) and len(set(ends)) == 5
        sync.release()
        await first
        assert shared[0] is not None
        group_mark = await shared[0][0]
        assert group_mark == journal.durable_mark == await alone
        assert group_mark.offset > ends[-1]  # The group ends after the fence record.
        appended = journal.append_entries(1, [_entry(5)])
        assert appended is not None
        later = appended[0]
        assert later is not shared[0][0]  # A new group, a new future.
        assert (await later) == journal.durable_mark
    finally:
        await journal.close()


async def test_a_failed_group_fails_its_shared_future(config: JournalConfig) -> None:
    journal = await Journal.open(config, sync_function=FailingSync(fail_on_call=1))
    try:
        appended = journal.append_entries(1, [_entry(0)])
        assert appended is not None
        with pytest.raises(BookieIOError):
            await appended[0]
        with pytest.raises(BookieIOError):
            journal.append_entries(1, [_entry(1)])
    finally:
        await journal.close()


def _entry(entry_id: int, payload: bytes = bytes(10)) -> EntryRecord:
    return EntryRecord(1, entry_id, entry_id - 1, (entry_id + 1) * len(payload), 0, payload)


async def test_a_batch_of_entries_shares_the_group_and_may_cross_the_entry_bound(
    config: JournalConfig,
) -> None:
    """`append_entries` takes a whole batch while the group has room (crossing the bound by
    that batch, as one record crosses the byte bound), and None at the bound: nothing is
    appended then; after `wait_for_room` the same call appends."""
    sync = FakeGatedSync()
    journal = await Journal.open(replace(config, max_group_entries=4), sync_function=sync)
    try:
        first = await hold_first_sync(journal, sync)
        crossing = journal.append_entries(1, [_entry(i) for i in range(3)])
        assert crossing is not None
        more = journal.append_entries(1, [_entry(i) for i in range(3, 6)])  # 3 + 3 > 4.
        assert more is not None and more[0] is crossing[0] and more[1] > crossing[1]
        assert journal.append_entries(1, [_entry(6)]) is None  # At the bound: nothing taken.
        sync.release()
        await first
        await journal.wait_for_room()
        after = journal.append_entries(1, [_entry(6)])
        assert after is not None and after[0] is not crossing[0]
        assert await crossing[0] < await after[0]
    finally:
        await journal.close()
    reopened = await Journal.open(config)
    try:
        replayed = reopened.replay(None).records
        assert [r.entry_id for _m, r in replayed if isinstance(r, EntryRecord)] == list(range(7))
    finally:
        await reopened.close()


async def test_a_batch_with_a_field_out_of_range_appends_nothing(config: JournalConfig) -> None:
    journal = await Journal.open(config, sync_function=FakeCountingSync())
    try:
        bad = EntryRecord(1, 1, 0, -5, 0, b"x")  # A negative length does not fit a record.
        with pytest.raises(RecordError):
            journal.append_entries(1, [_entry(0), bad])
        appended = journal.append_entries(1, [_entry(0)])
        assert appended is not None
        await appended[0]
    finally:
        await journal.close()
    reopened = await Journal.open(config)
    try:
        entries = [r for _m, r in reopened.replay(None).records if isinstance(r, EntryRecord)]
        assert [r.entry_id for r in entries] == [0]
    finally:
        await reopened.close()
