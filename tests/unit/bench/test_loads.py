"""Load generators against Fake systems: shapes, error handling, and intended-time latency."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable
from typing import Any

import pytest

from bkaio.bench.loads import PACER_TICK_SECONDS, run_closed, run_open, run_serial
from bkaio.bench.pacer import PunctualSleeper


class FakeSystem:
    """Acks each append after `delay_seconds` (a future, like the bkaio client), tracking load."""

    def __init__(self, delay_seconds: float = 0.0, fail_at: int | None = None) -> None:
        self.delay_seconds = delay_seconds
        self.fail_at = fail_at
        self.sent = 0
        self.outstanding = 0
        self.max_outstanding = 0

    def send(self, payload: bytes) -> asyncio.Future[int]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        entry_id = self.sent
        self.sent += 1
        self.outstanding += 1
        self.max_outstanding = max(self.max_outstanding, self.outstanding)

        def ack() -> None:
            self.outstanding -= 1
            if entry_id == self.fail_at:
                future.set_exception(RuntimeError(f"entry {entry_id} refused"))
            else:
                future.set_result(entry_id)

        loop.call_later(self.delay_seconds, ack)
        return future


async def test_serial_keeps_one_append_in_flight() -> None:
    system = FakeSystem()
    outcome = await run_serial(system.send, b"x", appends=50)
    assert (outcome.appends, outcome.errors, system.max_outstanding) == (50, 0, 1)
    assert all(latency >= 0 for latency in outcome.latencies)


async def test_serial_by_duration_for_warmups() -> None:
    system = FakeSystem(delay_seconds=0.001)
    outcome = await run_serial(system.send, b"x", duration_seconds=0.05)
    assert outcome.appends == system.sent > 0


async def test_closed_loop_holds_exactly_the_outstanding_window() -> None:
    system = FakeSystem(delay_seconds=0.002)
    outcome = await run_closed(system.send, b"x", outstanding=8, duration_seconds=0.1)
    assert system.max_outstanding == 8
    assert outcome.appends == system.sent > 8
    assert system.outstanding == 0  # Drained before returning.


async def test_coroutine_sends_are_wrapped_in_tasks() -> None:
    calls = 0

    async def publish(payload: bytes) -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        return calls

    outcome = await run_closed(publish, b"x", outstanding=4, duration_seconds=0.05)
    assert outcome.appends == calls > 4 and outcome.errors == 0


async def test_the_first_failure_stops_the_run_and_is_reported() -> None:
    system = FakeSystem(fail_at=5)
    outcome = await run_closed(system.send, b"x", outstanding=2, duration_seconds=30.0)
    assert outcome.errors == 1
    assert outcome.first_error == "RuntimeError: entry 5 refused"
    assert system.sent < 10  # Stopped at once, not after 30 s.


async def test_open_loop_sends_the_scheduled_count() -> None:
    system = FakeSystem(delay_seconds=0.001)
    outcome = await run_open(system.send, b"x", rate_per_second=2000, duration_seconds=0.05)
    assert system.sent == outcome.appends == 100
    assert outcome.offered_per_second == 2000


def _record_wake_targets(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The times the open loop asks its punctual sleeper to wake at, in order."""
    targets: list[float] = []
    real_sleep_until = PunctualSleeper.sleep_until

    async def recording_sleep_until(self: PunctualSleeper, when: float) -> None:
        targets.append(when)
        await real_sleep_until(self, when)

    monkeypatch.setattr(PunctualSleeper, "sleep_until", recording_sleep_until)
    return targets


async def test_open_loop_wakes_at_most_once_a_tick_between_bursts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At 5k/s the next append is always due in under a tick: waking for each would be a busy
    loop stealing CPU from the measured servers. Wake-up targets are a tick apart, no drift."""
    targets = _record_wake_targets(monkeypatch)
    system = FakeSystem(delay_seconds=0.001)
    outcome = await run_open(system.send, b"x", rate_per_second=5000, duration_seconds=0.05)
    assert outcome.appends == 250  # Every append still goes out, in bursts.
    gaps = [later - earlier for earlier, later in itertools.pairwise(targets)]
    assert gaps and min(gaps) >= PACER_TICK_SECONDS * 0.999
    assert len(targets) <= 60  # About one wake-up per tick, not one per append.


async def test_open_loop_at_one_append_per_tick_wakes_for_each_on_its_schedule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    targets = _record_wake_targets(monkeypatch)
    system = FakeSystem()
    outcome = await run_open(system.send, b"x", rate_per_second=500, duration_seconds=0.04)
    assert outcome.appends == 20
    gaps = [later - earlier for earlier, later in itertools.pairwise(targets)]
    assert all(abs(gap - 0.002) < 1e-9 for gap in gaps)  # The schedule itself: no drift.


async def test_without_timerfd_the_open_loop_sleeps_whole_ticks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Off Linux: asyncio.sleep, never below a tick (under uvloop shorter is `call_soon`)."""
    monkeypatch.setattr(PunctualSleeper, "open", classmethod(lambda cls: None))
    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def recording_sleep(delay: float) -> None:
        delays.append(delay)
        await real_sleep(delay)

    monkeypatch.setattr(asyncio, "sleep", recording_sleep)  # The module loads.py uses.
    system = FakeSystem(delay_seconds=0.001)
    outcome = await run_open(system.send, b"x", rate_per_second=5000, duration_seconds=0.05)
    assert outcome.appends == 250
    assert delays and min(delays) >= PACER_TICK_SECONDS
    assert len(delays) <= 60


async def test_punctual_sleeper_never_wakes_early() -> None:
    sleeper = PunctualSleeper.open()
    assert sleeper is not None  # Linux: timerfd is there.
    try:
        for delay in (0.0, 0.0003, 0.0017, 0.004):
            when = time.perf_counter() + delay
            await sleeper.sleep_until(when)
            assert time.perf_counter() >= when
    finally:
        sleeper.close()


async def test_open_loop_latency_counts_from_the_intended_send_time() -> None:
    """A sender stalled for 50 ms must show the stall in the latency of what it sent late."""
    system = FakeSystem()
    stalled = False

    def stalling_send(payload: bytes) -> Awaitable[Any]:
        nonlocal stalled
        if not stalled:
            stalled = True
            time.sleep(0.05)  # Blocks the loop on purpose: the schedule falls behind.
        return system.send(payload)

    outcome = await run_open(stalling_send, b"x", rate_per_second=1000, duration_seconds=0.1)
    assert outcome.appends == 100
    assert max(outcome.latencies) >= 0.045  # The first appends: intended before the stall.


async def test_open_loop_gives_up_when_the_system_falls_too_far_behind() -> None:
    system = FakeSystem(delay_seconds=0.05)
    outcome = await run_open(
        system.send, b"x", rate_per_second=5000, duration_seconds=1.0, max_outstanding=20
    )
    assert outcome.overloaded
    assert system.sent == 20
    assert outcome.appends == 20


async def test_each_append_is_timed_from_its_own_start() -> None:
    """Appends in flight together finish together: each latency still starts at its own issue
    (one shared callback finds the start time by the append's future)."""
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[int]] = []

    def send(payload: bytes) -> asyncio.Future[int]:
        future: asyncio.Future[int] = loop.create_future()
        futures.append(future)
        return future

    async def finish_all_after(delay: float) -> None:
        await asyncio.sleep(delay)
        for future in futures:
            if not future.done():
                future.set_result(0)

    loop.call_later(0.05, lambda: futures[0].set_result(0))  # The first alone, after 50 ms.
    finisher = asyncio.create_task(finish_all_after(0.1))
    outcome = await run_closed(send, b"x", outstanding=3, duration_seconds=0.06)
    await finisher
    first, *rest = outcome.latencies
    assert 0.045 <= first < 0.09  # Issued at 0, done at 50 ms.
    # The two others issued at 0 as well, done at 100 ms; the one the first completion issued
    # (at 50 ms) is done at 100 ms too, so its latency is about 50 ms, not 100.
    assert sorted(round(latency, 2) >= 0.09 for latency in rest) == [False, True, True]


async def test_a_future_returned_for_two_appends_times_both() -> None:
    loop = asyncio.get_running_loop()
    shared: asyncio.Future[int] = loop.create_future()
    loop.call_later(0.02, shared.set_result, 1)
    outcome = await run_closed(lambda payload: shared, b"x", outstanding=2, duration_seconds=0.01)
    assert outcome.appends == 2 and outcome.errors == 0
    assert all(0.015 <= latency < 0.5 for latency in outcome.latencies)
