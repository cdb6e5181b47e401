"""Long-poll bookkeeping: wake exactly the waiters a LAC satisfies, bounded in number."""

from __future__ import annotations

import asyncio

import pytest

from bkaio.bookie.lac_waiters import LacWaiters
from bkaio.errors import TooManyRequestsError


async def test_notify_wakes_only_satisfied_waiters() -> None:
    loop = asyncio.get_running_loop()
    waiters = LacWaiters(max_waiters=3)
    low, high = loop.create_future(), loop.create_future()
    waiters.add(1, 0, low)
    waiters.add(1, 5, high)
    waiters.notify(1, 3)
    assert low.result() == 3 and not high.done() and len(waiters) == 1
    waiters.notify(2, 100)  # Another ledger.
    assert not high.done()
    waiters.wake_ledger(1, 4)
    assert high.result() == 4 and not waiters


async def test_bound_and_removal() -> None:
    loop = asyncio.get_running_loop()
    waiters = LacWaiters(max_waiters=1)
    first = loop.create_future()
    waiters.add(1, 0, first)
    with pytest.raises(TooManyRequestsError, match="max_long_poll_waiters=1"):
        waiters.add(1, 0, loop.create_future())
    waiters.remove(1, first)
    assert len(waiters) == 0
    waiters.add(1, 0, loop.create_future())
    assert waiters.wake_all() == [1] and len(waiters) == 0


async def test_each_connection_has_its_own_bound() -> None:
    loop = asyncio.get_running_loop()
    waiters = LacWaiters(max_waiters=10, max_per_owner=2)
    greedy, polite = object(), object()
    first, second = loop.create_future(), loop.create_future()
    waiters.add(1, 0, first, greedy)
    waiters.add(2, 0, second, greedy)
    with pytest.raises(TooManyRequestsError, match="max_long_poll_waiters_per_connection=2"):
        waiters.add(3, 0, loop.create_future(), greedy)
    waiters.add(3, 0, loop.create_future(), polite)  # Others still get slots.
    assert waiters.waiting(greedy) == 2 and waiters.waiting(polite) == 1
    waiters.notify(1, 5)  # Answered: its slot is free again.
    assert first.result() == 5 and waiters.waiting(greedy) == 1
    waiters.remove(2, second)
    assert waiters.waiting(greedy) == 0
    waiters.add(4, 0, loop.create_future(), greedy)
    waiters.wake_ledger(4, 1)
    assert waiters.waiting(greedy) == 0 and len(waiters) == 1
    waiters.wake_all()
    assert waiters.waiting(polite) == 0 and not waiters
