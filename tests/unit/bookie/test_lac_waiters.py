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
