"""`Lease.wait_confirmed`: what a holder awaits before acting on what its lease guards where the
store does not check the lease. True at once while the store certainly holds the lease; after a
stall past the TTL, the late refresh's answer (True when the store confirms it, False when it
says the lease is gone or does not answer); False after a TTL and one attempt timeout when
nothing settles the doubt (no keep-alive running)."""

from __future__ import annotations

import asyncio
import random

import pytest

from bkaio.testing.sim.loop import SimLoop
from tests.unit.meta.test_lease_late_refresh import (
    LIVENESS,
    TTL,
    FakeStoreLease,
    _running,
    _stall_loop,
)


async def test_a_lease_the_store_certainly_holds_is_confirmed_at_once() -> None:
    lease = FakeStoreLease()
    await _running(lease)
    calls = lease.calls
    assert await lease.wait_confirmed()
    assert lease.calls == calls  # No refresh was waited for.
    await lease.stop_keep_alive()


async def test_after_a_stall_it_waits_for_the_late_refresh_the_store_confirms() -> None:
    lease = FakeStoreLease()
    await _running(lease)
    calls = lease.calls
    _stall_loop(3 * TTL)
    assert lease.in_doubt
    assert await asyncio.wait_for(lease.wait_confirmed(), LIVENESS)
    # Woken by the late refresh itself: not by the bound (a second after, dozens of refreshes
    # later), nor by a later refresh.
    assert lease.calls == calls + 1
    assert not lease.in_doubt and not lease.lost
    await lease.stop_keep_alive()


@pytest.mark.parametrize("answer", ["expired", "refuse"])
async def test_after_a_stall_it_says_no_once_the_store_drops_or_ignores_it(answer: str) -> None:
    lease = FakeStoreLease()
    await _running(lease)
    lease.answer = answer
    _stall_loop(3 * TTL)
    calls = lease.calls
    waiters = [asyncio.ensure_future(lease.wait_confirmed()) for _ in range(2)]
    assert await asyncio.wait_for(asyncio.gather(*waiters), LIVENESS) == [False, False]
    assert lease.lost and lease.calls == calls + 1  # Told when the late refresh failed.


def test_a_doubt_nothing_settles_ends_in_no_after_a_ttl_and_an_attempt_timeout() -> None:
    """No keep-alive runs (its holder stopped it, or it is stuck): the wait does not last for
    ever; the holder is told not to act. On the simulator's loop: virtual time only."""

    async def main() -> tuple[bool, bool, bool, float]:
        loop = asyncio.get_running_loop()
        lease = FakeStoreLease()
        await asyncio.sleep(2 * TTL)
        started = loop.time()
        confirmed = await lease.wait_confirmed()
        return confirmed, lease.lost, lease.in_doubt, loop.time() - started

    loop = SimLoop(random.Random(0))
    try:
        confirmed, lost, in_doubt, waited = loop.run_until_complete(main())
    finally:
        loop.close()
    assert not confirmed and not lost and in_doubt
    assert waited == pytest.approx(TTL + 1.0, abs=0.01)  # A TTL and one attempt timeout.


@pytest.mark.parametrize("interval", [0.0, -TTL, float("nan"), 0.75 * TTL, TTL, 3 * TTL])
async def test_a_keep_alive_interval_beyond_half_the_ttl_is_refused(interval: float) -> None:
    """The bound above counts on the keep-alive coming round within a TTL: an interval past it
    (or one a restart after a failed refresh would double past it) is refused, not started."""
    lease = FakeStoreLease()
    with pytest.raises(
        ValueError, match=r"lease 9: keep-alive interval .* at most half the lease's TTL \(0\.1 s\)"
    ):
        lease.start_keep_alive(interval_seconds=interval)
    assert lease.calls == 0
    lease.start_keep_alive(interval_seconds=TTL / 2)  # At most half the TTL: kept alive.
    await asyncio.wait_for(lease.confirmed.wait(), LIVENESS)
    await lease.stop_keep_alive()
