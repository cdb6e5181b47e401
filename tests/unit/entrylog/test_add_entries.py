"""ShardStorage.add_entries: the one add path, for one entry or a frame of them.

The common batch is journaled before the call returns (no task, no future of its own) and
answered with the other batches of its journal group by one callback, once the group is durable
and applied; everything else (a new ledger, a possible duplicate, no room) takes one task for
the batch and is answered the same way. Every outcome goes to the callback: it never raises.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.entrylog.types import AddBatch, StoredEntry
from bkaio.errors import (
    BKError,
    BookieIOError,
    EntryConflictError,
    LedgerFencedError,
    TooManyRequestsError,
    UnauthorizedError,
)
from bkaio.journal import Journal
from bkaio.journal.errors import RecordError
from bkaio.wal import JournalConfig, JournalLike
from tests.fixtures.storage import add_entry, read_entry
from tests.unit.entrylog.conftest import KEY, OTHER_KEY, OpenStorage, make_config, make_entry
from tests.unit.journal.fakes import FailingSync


class Answers:
    """Collects what storage answers: one call per journal group, with its batches."""

    def __init__(self, storage: ShardStorage) -> None:
        self.storage = storage
        self.calls: list[tuple[list[AddBatch], BKError | None]] = []
        self.answered = asyncio.Event()

    def __call__(self, batches: list[AddBatch], error: BKError | None) -> None:
        self.calls.append((list(batches), error))
        self.answered.set()

    def add(
        self, entries: list[StoredEntry], key: bytes = KEY, *, recovery: bool = False
    ) -> AddBatch:
        batch = AddBatch(entries[0].ledger_id, key, recovery, entries)
        self.storage.add_entries(batch, self)
        return batch

    async def outcome(self, batch: AddBatch) -> BKError | None:
        """The error the batch was answered with (None: durable), once it is answered."""
        async with asyncio.timeout(10):
            while True:
                for batches, error in self.calls:
                    if any(answered is batch for answered in batches):
                        return error
                self.answered.clear()
                await self.answered.wait()


async def test_the_common_batch_is_journaled_before_the_call_returns(
    open_storage: OpenStorage,
) -> None:
    storage = await open_storage()
    await add_entry(storage, make_entry(7, 0), KEY)
    answers = Answers(storage)
    batch = answers.add([make_entry(7, i) for i in (1, 2, 3)])
    assert not storage._add_tasks  # No task: journaled already.
    assert await answers.outcome(batch) is None
    assert [await read_entry(storage, 7, i) for i in (1, 2, 3)] == [
        make_entry(7, i) for i in (1, 2, 3)
    ]
    state = storage.ledger_state(7)
    assert state is not None and state.last_entry_id == 3


async def test_a_new_ledger_and_possible_duplicates_take_a_task_and_are_answered(
    open_storage: OpenStorage,
) -> None:
    storage = await open_storage()
    answers = Answers(storage)
    first = answers.add([make_entry(8, 0), make_entry(8, 1)])  # Unknown ledger: its key first.
    assert storage._add_tasks
    assert await answers.outcome(first) is None
    again = answers.add([make_entry(8, 1), make_entry(8, 2)])  # Entry 1 stored: identical.
    assert await answers.outcome(again) is None and again.failures is None
    in_flight = answers.add([make_entry(8, 3)])
    same = answers.add([make_entry(8, 3)])  # The same entry in flight: durable with it.
    assert await answers.outcome(in_flight) is None and await answers.outcome(same) is None
    assert (await storage.list_entries(8)) == [(0, 3)]


async def test_a_conflicting_entry_fails_alone_and_the_rest_of_its_batch_is_stored(
    open_storage: OpenStorage,
) -> None:
    storage = await open_storage()
    await add_entry(storage, make_entry(16, 0), KEY)
    answers = Answers(storage)
    batch = answers.add([make_entry(16, 0, payload=b"other"), make_entry(16, 1)])
    assert await answers.outcome(batch) is None
    assert batch.failures is not None and list(batch.failures) == [0]
    assert isinstance(batch.failures[0], EntryConflictError)
    assert await read_entry(storage, 16, 0) == make_entry(16, 0)
    assert await read_entry(storage, 16, 1) == make_entry(16, 1)


async def test_a_wrong_key_or_a_fenced_ledger_is_answered_and_never_raised(
    open_storage: OpenStorage,
) -> None:
    storage = await open_storage()
    await add_entry(storage, make_entry(9, 0), KEY)
    answers = Answers(storage)
    assert isinstance(
        await answers.outcome(answers.add([make_entry(9, 1)], OTHER_KEY)), UnauthorizedError
    )
    await storage.fence(9, KEY)
    assert isinstance(await answers.outcome(answers.add([make_entry(9, 1)])), LedgerFencedError)
    recovery = answers.add([make_entry(9, 1)], recovery=True)
    assert await answers.outcome(recovery) is None


async def test_a_field_out_of_the_records_range_is_answered_and_changes_nothing(
    open_storage: OpenStorage,
) -> None:
    storage = await open_storage()
    await add_entry(storage, make_entry(14, 0), KEY)
    before = storage.ledger_state(14)
    answers = Answers(storage)
    too_wide = dataclasses.replace(make_entry(14, 1), digest=1 << 40)
    assert isinstance(await answers.outcome(answers.add([too_wide])), RecordError)
    assert storage.ledger_state(14) == before
    assert await answers.outcome(answers.add([make_entry(14, 1)])) is None


async def test_batches_of_one_group_are_applied_then_answered_by_one_call(
    open_storage: OpenStorage,
) -> None:
    storage = await open_storage()
    await add_entry(storage, make_entry(11, 0), KEY)
    seen: list[int] = []
    answers = Answers(storage)

    def on_durable(batches: list[AddBatch], error: BKError | None) -> None:
        state = storage.ledger_state(11)
        assert state is not None
        seen.append(state.last_entry_id)
        answers(batches, error)

    batches = [AddBatch(11, KEY, False, [make_entry(11, i)]) for i in (1, 2, 3)]
    for batch in batches:
        storage.add_entries(batch, on_durable)
    assert await answers.outcome(batches[-1]) is None
    assert answers.calls == [(batches, None)]  # One call, the batches in add order.
    assert seen == [3]  # All three applied before it.


async def test_a_fence_between_adds_of_one_group_waits_for_the_earlier_ones_only(
    open_storage: OpenStorage,
) -> None:
    storage = await open_storage()
    await add_entry(storage, make_entry(12, 0), KEY)
    answers = Answers(storage)
    before = answers.add([make_entry(12, 1), make_entry(12, 2)])
    fence = asyncio.ensure_future(storage.fence(12, KEY))
    await asyncio.sleep(0)  # The fence record is appended now, behind entries 1 and 2.
    refused = answers.add([make_entry(12, 3)])
    after = answers.add([make_entry(12, 3)], recovery=True)
    await fence
    assert any(before in batches for batches, _ in answers.calls)  # Answered before the fence.
    assert isinstance(await answers.outcome(refused), LedgerFencedError)
    state = storage.ledger_state(12)
    assert state is not None and state.fenced and state.last_entry_id >= 2
    assert await answers.outcome(after) is None
    assert await read_entry(storage, 12, 3) == make_entry(12, 3)
    await storage.checkpoint()  # Its mark covers every group: nothing is replayed on reopen.
    await storage.close()
    reopened = await open_storage()
    assert reopened.stats.replayed_records == 0
    assert await read_entry(reopened, 12, 3) == make_entry(12, 3)
    state = reopened.ledger_state(12)
    assert state is not None and state.fenced and state.last_entry_id == 3


async def test_adds_waiting_for_cache_room_are_served_before_later_adds(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    # A bookie under load: a flush frees room while new adds keep arriving. The room goes to
    # the add that waited for it, not to whatever came next (which once kept an add waiting
    # past the client's timeout).
    config = make_config(tmp_path, write_cache_bytes=4000, write_cache_max_wait_seconds=30.0)
    storage = await open_storage(config)
    await add_entry(storage, make_entry(13, 0, payload=b"a" * 1500), KEY)
    await add_entry(storage, make_entry(13, 1, payload=b"b" * 1500), KEY)
    pressure: list[bool] = []
    storage.room_pressure_listener = pressure.append
    answers = Answers(storage)
    waiting = answers.add([make_entry(13, 2, payload=b"c" * 1500)])
    await asyncio.sleep(0)
    assert storage.stats.cache_full_waits == 1
    assert pressure == [True]  # The bookie stops reading requests now.
    small = answers.add([make_entry(13, 3, payload=b"d")])  # Fits, but one waits: behind it.
    assert storage._add_tasks and not answers.calls
    assert await answers.outcome(waiting) is None  # The flush it asked for freed room.
    assert await answers.outcome(small) is None
    assert pressure == [True, False]
    assert [batch for batches, _ in answers.calls for batch in batches] == [waiting, small]
    for entry_id, fill in enumerate(b"abcd"):
        size = 1 if entry_id == 3 else 1500
        assert await read_entry(storage, 13, entry_id) == make_entry(
            13, entry_id, payload=bytes([fill]) * size
        )


async def test_adds_waiting_for_cache_room_are_granted_in_arrival_order(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    config = make_config(tmp_path, write_cache_bytes=4000, write_cache_max_wait_seconds=30.0)
    storage = await open_storage(config)
    await add_entry(storage, make_entry(14, 0, payload=b"a" * 3000), KEY)
    order: list[int] = []

    async def add(entry_id: int, size: int) -> None:
        await add_entry(storage, make_entry(14, entry_id, payload=b"x" * size), KEY)
        order.append(entry_id)

    big = asyncio.ensure_future(add(1, 2500))
    await asyncio.sleep(0)
    small = asyncio.ensure_future(add(2, 10))  # Would fit now, but the big one came first.
    await asyncio.sleep(0)
    assert not big.done() and not small.done()
    await asyncio.wait_for(asyncio.gather(big, small), 10.0)
    assert order == [1, 2]
    assert storage.stats.cache_full_waits == 2


async def test_an_add_that_waited_too_long_for_room_is_refused_and_others_go_on(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    config = make_config(tmp_path, write_cache_bytes=1000, write_cache_max_wait_seconds=0.0)
    storage = await open_storage(config)
    await add_entry(storage, make_entry(15, 0, payload=b"x" * 700), KEY)
    with pytest.raises(TooManyRequestsError, match="write cache"):
        await add_entry(storage, make_entry(15, 1, payload=b"y" * 700), KEY)
    assert storage.stats.cache_full_rejections == 1
    await storage.checkpoint()  # Flushes the cache.
    answers = Answers(storage)
    batch = answers.add([make_entry(15, 1, payload=b"y" * 700)])
    assert not storage._add_tasks  # Nobody is left waiting: journaled at once again.
    assert await answers.outcome(batch) is None


async def test_a_failed_journal_fails_the_adds_through_the_callback(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    """A journal whose fdatasync fails: the group's batches are answered with BookieIOError
    (nothing applied), and every later add too, on either path; nothing is raised."""
    config = make_config(tmp_path)
    config = dataclasses.replace(config, journal=dataclasses.replace(config.journal, sync=True))

    async def failing_journal(journal_config: JournalConfig, directory: Path) -> JournalLike:
        return await Journal.open(
            journal_config, directory=directory, sync_function=FailingSync(fail_on_call=1)
        )

    storage = await open_storage(config, journal_factory=failing_journal)
    answers = Answers(storage)
    first = answers.add([make_entry(17, 0), make_entry(17, 1)])
    assert isinstance(await answers.outcome(first), BookieIOError)
    later = answers.add([make_entry(17, 2)])
    assert isinstance(await answers.outcome(later), BookieIOError)
    state = storage.ledger_state(17)
    assert state is None or state.last_entry_id == -1  # Nothing was applied.


async def test_gaps_below_the_last_entry_are_filled_out_of_order(
    open_storage: OpenStorage,
) -> None:
    """Re-replication and recovery write a ledger's entries in any order: an entry below the
    ledger's last one that is not stored (in the cache or after a flush) is journaled, not
    taken for a duplicate, and answered."""
    storage = await open_storage()
    await add_entry(storage, make_entry(18, 5), KEY)  # Last entry 5 first.
    answers = Answers(storage)
    cached_gap = answers.add([make_entry(18, 2)], recovery=True)
    async with asyncio.timeout(10):
        assert await answers.outcome(cached_gap) is None
    await storage.checkpoint()  # Entry 5 and 2 go to the entry logs and the index.
    flushed_gap = answers.add([make_entry(18, 3), make_entry(18, 4)], recovery=True)
    async with asyncio.timeout(10):
        assert await answers.outcome(flushed_gap) is None
    assert await storage.list_entries(18) == [(2, 5)]
    for entry_id in (2, 3, 4, 5):
        assert await read_entry(storage, 18, entry_id) == make_entry(18, entry_id)
