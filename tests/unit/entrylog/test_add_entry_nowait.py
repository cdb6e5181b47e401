"""ShardStorage.add_entry_nowait: the bookie's add fast path takes only the plain case."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from bkaio.entrylog.shard_storage import StoredEntry
from bkaio.errors import LedgerFencedError, TooManyRequestsError, UnauthorizedError
from tests.unit.entrylog.conftest import KEY, OTHER_KEY, OpenStorage, make_config, make_entry


async def test_known_ledger_next_entry_is_journaled_and_applied(open_storage: OpenStorage) -> None:
    storage = await open_storage()
    await storage.add_entry(make_entry(7, 0), KEY)
    future = storage.add_entry_nowait(make_entry(7, 1), KEY)
    assert future is not None
    await future
    assert await storage.read_entry(7, 1) == make_entry(7, 1)
    state = storage.ledger_state(7)
    assert state is not None and state.last_entry_id == 1


async def test_cases_left_to_the_async_path(open_storage: OpenStorage) -> None:
    storage = await open_storage()
    assert storage.add_entry_nowait(make_entry(8, 0), KEY) is None  # Unknown ledger.
    assert storage.ledger_state(8) is None  # ... and nothing changed.
    await storage.add_entry(make_entry(8, 0), KEY)
    assert storage.add_entry_nowait(make_entry(8, 0), KEY) is None  # At the last entry.
    first = storage.add_entry_nowait(make_entry(8, 1), KEY)
    assert first is not None
    assert storage.add_entry_nowait(make_entry(8, 1), KEY) is None  # Same entry in flight.
    await first
    await storage.add_entry(make_entry(8, 1), KEY)  # The async path accepts the duplicate.


async def test_wrong_key_and_fenced_ledger_raise(open_storage: OpenStorage) -> None:
    storage = await open_storage()
    await storage.add_entry(make_entry(9, 0), KEY)
    with pytest.raises(UnauthorizedError):
        storage.add_entry_nowait(make_entry(9, 1), OTHER_KEY)
    await storage.fence(9, KEY)
    with pytest.raises(LedgerFencedError):
        storage.add_entry_nowait(make_entry(9, 1), KEY)
    future = storage.add_entry_nowait(make_entry(9, 1), KEY, recovery=True)
    assert future is not None
    await future


async def test_a_full_write_cache_is_left_to_the_async_path(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    storage = await open_storage(make_config(tmp_path, write_cache_bytes=4096))
    await storage.add_entry(make_entry(10, 0), KEY)
    big = make_entry(10, 1, payload=b"x" * 8192)
    assert storage.add_entry_nowait(big, KEY) is None


async def test_adds_of_one_group_are_applied_before_any_of_them_is_answered(
    open_storage: OpenStorage,
) -> None:
    storage = await open_storage()
    await storage.add_entry(make_entry(11, 0), KEY)
    seen: list[int] = []

    def answered(_done: object) -> None:
        state = storage.ledger_state(11)
        assert state is not None
        seen.append(state.last_entry_id)

    futures = [
        storage.add_entry_nowait(make_entry(11, i), KEY, on_done=answered) for i in (1, 2, 3)
    ]
    assert futures[0] is not None and all(future is futures[0] for future in futures)
    await futures[0]
    assert seen == [3, 3, 3]  # All three applied before the first answer.
    for entry_id in (1, 2, 3):
        assert await storage.read_entry(11, entry_id) == make_entry(11, entry_id)


async def test_a_fence_between_adds_of_one_group_waits_for_the_earlier_ones_only(
    open_storage: OpenStorage,
) -> None:
    storage = await open_storage()
    await storage.add_entry(make_entry(12, 0), KEY)
    before = [storage.add_entry_nowait(make_entry(12, i), KEY) for i in (1, 2)]
    fence = asyncio.ensure_future(storage.fence(12, KEY))
    await asyncio.sleep(0)  # The fence record is appended now, behind entries 1 and 2.
    with pytest.raises(LedgerFencedError):
        storage.add_entry_nowait(make_entry(12, 3), KEY)
    after = storage.add_entry_nowait(make_entry(12, 3), KEY, recovery=True)
    assert after is not None
    await fence
    assert all(future is not None and future.done() for future in before)
    state = storage.ledger_state(12)
    assert state is not None and state.fenced and state.last_entry_id >= 2
    await after
    assert await storage.read_entry(12, 3) == make_entry(12, 3)
    await storage.checkpoint()  # Its mark covers every batch: nothing is replayed on reopen.
    await storage.close()
    reopened = await open_storage()
    assert reopened.stats.replayed_records == 0
    assert await reopened.read_entry(12, 3) == make_entry(12, 3)
    state = reopened.ledger_state(12)
    assert state is not None and state.fenced and state.last_entry_id == 3


def _fields(entry: StoredEntry) -> tuple[int, int, int, int, int, bytes]:
    return (entry.ledger_id, entry.entry_id, entry.lac, entry.length, entry.digest, entry.payload)


async def test_add_entry_fields_answers_a_group_with_one_call_after_applying_it(
    open_storage: OpenStorage,
) -> None:
    storage = await open_storage()
    await storage.add_entry(make_entry(13, 0), KEY)
    calls: list[tuple[list[Any], int]] = []

    def on_answers(_done: object, answers: list[Any]) -> None:
        state = storage.ledger_state(13)
        assert state is not None
        calls.append((list(answers), state.last_entry_id))

    futures = [
        storage.add_entry_fields(*_fields(make_entry(13, i)), KEY, on_answers, f"answer {i}")
        for i in (1, 2, 3)
    ]
    assert futures[0] is not None and all(future is futures[0] for future in futures)
    await futures[0]
    await asyncio.sleep(0)
    assert calls == [(["answer 1", "answer 2", "answer 3"], 3)]
    for entry_id in (1, 2, 3):
        assert await storage.read_entry(13, entry_id) == make_entry(13, entry_id)


async def test_add_entry_fields_never_raises_and_changes_nothing_when_it_declines(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    storage = await open_storage(make_config(tmp_path, write_cache_bytes=4096))
    await storage.add_entry(make_entry(14, 0), KEY)

    def declined(entry: StoredEntry, key: bytes = KEY) -> bool:
        before = storage.ledger_state(entry.ledger_id)
        result = storage.add_entry_fields(*_fields(entry), key, lambda *_: None, None)
        return result is None and storage.ledger_state(entry.ledger_id) == before

    assert declined(make_entry(15, 0))  # Unknown ledger.
    assert declined(make_entry(14, 0))  # At the last entry.
    assert declined(make_entry(14, 1), OTHER_KEY)  # Wrong key: the full path raises.
    assert declined(make_entry(14, 1, payload=b"x" * 8192))  # No room in the write cache.
    too_wide = dataclasses.replace(make_entry(14, 1), digest=1 << 40)
    assert declined(too_wide)  # A field out of the journal record's range.
    first = storage.add_entry_fields(*_fields(make_entry(14, 1)), KEY, lambda *_: None, None)
    assert first is not None
    assert declined(make_entry(14, 1))  # The same entry in flight.
    await first
    await storage.fence(14, KEY)
    assert declined(make_entry(14, 2))  # Fenced: only recovery adds, on the full path.


async def test_adds_waiting_for_cache_room_are_served_before_later_synchronous_adds(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    # A bookie under load: a flush frees room while new adds keep arriving. The room goes to
    # the add that waited for it, not to the synchronous path of whatever came next (which
    # once kept an add waiting past the client's timeout).
    config = make_config(tmp_path, write_cache_bytes=4000, write_cache_max_wait_seconds=30.0)
    storage = await open_storage(config)
    await storage.add_entry(make_entry(13, 0, payload=b"a" * 1500), KEY)
    await storage.add_entry(make_entry(13, 1, payload=b"b" * 1500), KEY)
    pressure: list[bool] = []
    storage.room_pressure_listener = pressure.append
    waiting = asyncio.ensure_future(storage.add_entry(make_entry(13, 2, payload=b"c" * 1500), KEY))
    await asyncio.sleep(0)
    assert not waiting.done() and storage.stats.cache_full_waits == 1
    assert pressure == [True]  # The bookie stops reading requests now.
    small = make_entry(13, 3, payload=b"d")  # Fits the cache's remaining room.
    assert storage.add_entry_nowait(small, KEY) is None  # Declined: an add waits for room.
    await asyncio.wait_for(waiting, 10.0)  # The flush it asked for freed room.
    assert pressure == [True, False]
    future = storage.add_entry_nowait(small, KEY)
    assert future is not None
    await future
    for entry_id, fill in enumerate(b"abcd"):
        size = 1 if entry_id == 3 else 1500
        assert await storage.read_entry(13, entry_id) == make_entry(
            13, entry_id, payload=bytes([fill]) * size
        )


async def test_adds_waiting_for_cache_room_are_granted_in_arrival_order(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    config = make_config(tmp_path, write_cache_bytes=4000, write_cache_max_wait_seconds=30.0)
    storage = await open_storage(config)
    await storage.add_entry(make_entry(14, 0, payload=b"a" * 3000), KEY)
    order: list[int] = []

    async def add(entry_id: int, size: int) -> None:
        await storage.add_entry(make_entry(14, entry_id, payload=b"x" * size), KEY)
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
    await storage.add_entry(make_entry(15, 0, payload=b"x" * 700), KEY)
    with pytest.raises(TooManyRequestsError, match="write cache"):
        await storage.add_entry(make_entry(15, 1, payload=b"y" * 700), KEY)
    assert storage.stats.cache_full_rejections == 1
    await storage.checkpoint()  # Flushes the cache.
    future = storage.add_entry_nowait(make_entry(15, 1, payload=b"y" * 700), KEY)
    assert future is not None  # Nobody is left waiting: the synchronous path is open again.
    await future
