"""Load generators against fake systems, on a fake clock: shapes, pacing, error handling and
intended-time latency. Time moves only when a test (or its fake metronome) moves it, so no
assertion depends on how fast a loaded box runs; the two real metronomes are only checked for
never ticking early."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from bkaio.bench import pacer
from bkaio.bench.loads import PACER_TICK_SECONDS, run_closed, run_open, run_serial
from bkaio.bench.pacer import LoopMetronome, TimerfdMetronome, open_metronome

# A millisecond as a binary fraction: sums of it are exact, so counts at a deadline are too.
MS = 1 / 1024


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# Loop iterations between two fake ticks: an ack (one iteration) and the future's callbacks
# (another) of what a tick sent run before the next tick moves the clock.
_ITERATIONS_PER_TICK = 4


class FakeMetronome:
    """Ticks at once, a few loop iterations apart, moving the fake clock to each tick's time."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.period = 0.0
        self.ticks: list[float] = []  # The clock at each tick.
        self._first = 0.0
        self._count = 0  # Ticks due so far.
        self._on_tick: Callable[[], None] | None = None
        self.stopped = asyncio.Event()

    def now(self) -> float:
        return self.clock()

    def start(self, first: float, period: float, on_tick: Callable[[], None]) -> None:
        self._first, self.period, self._on_tick = first, period, on_tick
        asyncio.get_running_loop().call_soon(self._fire, _ITERATIONS_PER_TICK)

    def _fire(self, iterations: int) -> None:
        on_tick = self._on_tick
        if on_tick is None:
            return
        if iterations > 1:
            asyncio.get_running_loop().call_soon(self._fire, iterations - 1)
            return
        # The next tick's time, unless the clock passed it (a stall): the ticks missed meanwhile
        # come as one, now, as a timerfd's do.
        due = self._first + self._count * self.period
        now = self.clock.now = max(self.clock.now, due)
        while self._first + self._count * self.period <= now:
            self._count += 1
        self.ticks.append(now)
        on_tick()
        if self._on_tick is not None:
            asyncio.get_running_loop().call_soon(self._fire, _ITERATIONS_PER_TICK)

    def stop(self) -> None:
        self._on_tick = None
        self.stopped.set()


class FakeSystem:
    """Acks each append in the next loop iteration (a future, like the bkaio client), without
    moving the clock unless `step` says so; `hold` keeps every ack until `release`."""

    def __init__(
        self,
        clock: FakeClock,
        *,
        step: float = 0.0,
        fail_at: int | None = None,
        hold: bool = False,
    ) -> None:
        self.clock = clock
        self.step = step  # The clock moves this much per ack.
        self.fail_at = fail_at
        self.hold = hold
        self.sent = 0
        self.outstanding = 0
        self.max_outstanding = 0
        self.send_times: list[float] = []
        self._held: list[tuple[asyncio.Future[int], int]] = []

    def send(self, payload: bytes) -> asyncio.Future[int]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        entry_id = self.sent
        self.sent += 1
        self.send_times.append(self.clock())
        self.outstanding += 1
        self.max_outstanding = max(self.max_outstanding, self.outstanding)
        if self.hold:
            self._held.append((future, entry_id))
        else:
            loop.call_soon(self._ack, future, entry_id)
        return future

    def release(self) -> None:
        held, self._held = self._held, []
        for future, entry_id in held:
            self._ack(future, entry_id)

    def _ack(self, future: asyncio.Future[int], entry_id: int) -> None:
        self.clock.advance(self.step)
        self.outstanding -= 1
        if entry_id == self.fail_at:
            future.set_exception(RuntimeError(f"entry {entry_id} refused"))
        else:
            future.set_result(entry_id)


def bursts(system: FakeSystem) -> list[int]:
    """How many appends went out at each distinct send time (the first is the start)."""
    counts: dict[float, int] = {}
    for sent_at in system.send_times:
        counts[sent_at] = counts.get(sent_at, 0) + 1
    return list(counts.values())


async def test_serial_keeps_one_append_in_flight() -> None:
    clock = FakeClock()
    system = FakeSystem(clock, step=MS)
    outcome = await run_serial(system.send, b"x", appends=50, clock=clock)
    assert (outcome.appends, outcome.errors, system.max_outstanding) == (50, 0, 1)
    assert outcome.latencies == [MS] * 50


async def test_serial_by_duration_for_warmups() -> None:
    clock = FakeClock()
    system = FakeSystem(clock, step=MS)
    outcome = await run_serial(system.send, b"x", duration_seconds=50 * MS, clock=clock)
    assert outcome.appends == system.sent == 50  # One millisecond each.


async def test_closed_loop_holds_exactly_the_outstanding_window() -> None:
    clock = FakeClock()
    system = FakeSystem(clock, step=MS)
    outcome = await run_closed(
        system.send, b"x", outstanding=8, duration_seconds=100 * MS, clock=clock
    )
    assert system.max_outstanding == 8
    assert outcome.appends == system.sent > 8 + 90  # The window, then one per completion.
    assert system.outstanding == 0  # Drained before returning.


async def test_coroutine_sends_are_wrapped_in_tasks() -> None:
    clock = FakeClock()
    calls = 0

    async def publish(payload: bytes) -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        clock.advance(MS)
        return calls

    outcome = await run_closed(publish, b"x", outstanding=4, duration_seconds=0.05, clock=clock)
    assert outcome.appends == calls > 4 and outcome.errors == 0


async def test_the_first_failure_stops_the_run_and_is_reported() -> None:
    clock = FakeClock()
    system = FakeSystem(clock, step=MS, fail_at=5)
    outcome = await run_closed(system.send, b"x", outstanding=2, duration_seconds=30.0, clock=clock)
    assert outcome.errors == 1
    assert outcome.first_error == "RuntimeError: entry 5 refused"
    assert system.sent < 10  # Stopped at once, not after 30 s.


async def test_open_loop_sends_the_scheduled_count() -> None:
    clock = FakeClock()
    metronome = FakeMetronome(clock)
    system = FakeSystem(clock)
    outcome = await run_open(
        system.send, b"x", rate_per_second=2000, duration_seconds=0.05, metronome=metronome
    )
    assert system.sent == outcome.appends == 100
    assert outcome.offered_per_second == 2000


async def test_open_loop_ticks_once_a_millisecond_and_sends_what_fell_due() -> None:
    """At 5k/s the next append is always due in under a tick: a tick for each would be a
    wake-up per append, stealing CPU from the measured servers. One tick per millisecond sends
    the five that fell due since the last; the schedule does not drift."""
    clock = FakeClock()
    metronome = FakeMetronome(clock)
    system = FakeSystem(clock)
    outcome = await run_open(
        system.send, b"x", rate_per_second=5000, duration_seconds=0.05, metronome=metronome
    )
    assert outcome.appends == 250  # Every append still goes out, in bursts.
    assert metronome.period == PACER_TICK_SECONDS
    assert len(metronome.ticks) == 50
    assert metronome.ticks == pytest.approx([0.001 * k for k in range(1, 51)])
    assert bursts(system) == [1] + [5] * 49 + [4]  # The first at the start.


async def test_open_loop_below_one_per_tick_sends_each_on_its_own_tick() -> None:
    clock = FakeClock()
    metronome = FakeMetronome(clock)
    system = FakeSystem(clock)
    outcome = await run_open(
        system.send, b"x", rate_per_second=500, duration_seconds=0.04, metronome=metronome
    )
    assert outcome.appends == 20
    assert metronome.period == pytest.approx(0.002)
    assert bursts(system) == [1] * 20
    # Each one sent at its intended time and acked in the same instant: no latency at all.
    assert outcome.latencies == pytest.approx([0.0] * 20, abs=1e-12)


async def test_open_loop_latency_counts_from_the_intended_send_time() -> None:
    """A sender stalled for 50 ms must show the stall in the latency of what it sent late."""
    clock = FakeClock()
    metronome = FakeMetronome(clock)
    system = FakeSystem(clock)
    stalled = False

    def stalling_send(payload: bytes) -> Awaitable[Any]:
        nonlocal stalled
        if system.sent == 10 and not stalled:
            stalled = True
            clock.advance(0.05)  # The schedule falls behind by 50 ms.
        return system.send(payload)

    outcome = await run_open(
        stalling_send, b"x", rate_per_second=1000, duration_seconds=0.1, metronome=metronome
    )
    assert outcome.appends == 100
    # The append intended at 10 ms went out at 60 ms; the ones due meanwhile went with it.
    assert max(outcome.latencies) == pytest.approx(0.05)
    assert outcome.latencies[:10] == pytest.approx([0.0] * 10, abs=1e-12)


async def test_open_loop_gives_up_when_the_system_falls_too_far_behind() -> None:
    clock = FakeClock()
    metronome = FakeMetronome(clock)
    system = FakeSystem(clock, hold=True)
    run = asyncio.ensure_future(
        run_open(
            system.send,
            b"x",
            rate_per_second=5000,
            duration_seconds=1.0,
            max_outstanding=20,
            metronome=metronome,
        )
    )
    await metronome.stopped.wait()
    system.release()
    outcome = await run
    assert outcome.overloaded
    assert system.sent == outcome.appends == 20


async def test_each_append_is_timed_from_its_own_start() -> None:
    """Appends in flight together finish together: each latency still starts at its own issue
    (one shared callback finds the start time by the append's future)."""
    clock = FakeClock()
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[int]] = []

    def send(payload: bytes) -> asyncio.Future[int]:
        future: asyncio.Future[int] = loop.create_future()
        futures.append(future)
        return future

    async def finish() -> None:
        await asyncio.sleep(0)
        clock.advance(0.05)
        futures[0].set_result(0)  # The first alone, at 50 ms; its completion issues another.
        await asyncio.sleep(0)
        clock.advance(0.05)
        for future in futures:  # The rest at 100 ms, after the run's deadline (60 ms).
            if not future.done():
                future.set_result(0)

    finisher = asyncio.ensure_future(finish())
    outcome = await run_closed(send, b"x", outstanding=3, duration_seconds=0.06, clock=clock)
    await finisher
    assert outcome.latencies == pytest.approx([0.05, 0.1, 0.1, 0.05])


async def test_a_future_returned_for_two_appends_times_both() -> None:
    clock = FakeClock()
    loop = asyncio.get_running_loop()
    shared: asyncio.Future[int] = loop.create_future()

    def complete() -> None:
        clock.advance(0.02)
        shared.set_result(1)

    loop.call_soon(complete)
    outcome = await run_closed(
        lambda payload: shared, b"x", outstanding=2, duration_seconds=0.01, clock=clock
    )
    assert outcome.appends == 2 and outcome.errors == 0
    assert outcome.latencies == pytest.approx([0.02, 0.02])


# -- The real metronomes: never early (how late depends on the box, so it is not asserted).


async def _ticks_of(metronome: pacer.Metronome, count: int, period: float) -> list[float]:
    """When each of `count` ticks came, against when it was due."""
    lateness: list[float] = []
    done = asyncio.get_running_loop().create_future()
    first = metronome.now() + period

    def tick() -> None:
        lateness.append(metronome.now() - (first + len(lateness) * period))
        if len(lateness) == count:
            metronome.stop()
            done.set_result(None)

    metronome.start(first, period, tick)
    await done
    return lateness


async def test_the_timerfd_metronome_never_ticks_early() -> None:
    metronome = open_metronome()
    assert isinstance(metronome, TimerfdMetronome)  # Linux: timerfd is there.
    lateness = await _ticks_of(metronome, 5, 0.002)
    # Missed ticks come as one, so a late tick may stand for several: never before its time.
    assert all(late >= -1e-6 for late in lateness)
    metronome.stop()  # Twice is fine.


async def test_without_timerfd_the_loop_timers_tick_and_never_early(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pacer, "_libc", lambda: None)
    metronome = open_metronome()
    assert isinstance(metronome, LoopMetronome)
    lateness = await _ticks_of(metronome, 5, 0.002)
    assert all(late >= -1e-6 for late in lateness)


async def test_a_metronome_stopped_from_its_tick_ticks_no_more() -> None:
    metronome = open_metronome()
    ticks = 0
    ticked = asyncio.get_running_loop().create_future()

    def tick() -> None:
        nonlocal ticks
        ticks += 1
        metronome.stop()
        ticked.set_result(None)

    metronome.start(metronome.now(), 0.001, tick)
    await ticked
    await asyncio.sleep(0.01)  # Ten periods: none of them ticks.
    assert ticks == 1


async def test_an_append_that_raises_ends_the_open_loop_with_its_error() -> None:
    clock = FakeClock()
    metronome = FakeMetronome(clock)
    system = FakeSystem(clock)

    def send(payload: bytes) -> Awaitable[Any]:
        if system.sent == 7:
            raise RuntimeError("ledger closed")
        return system.send(payload)

    with pytest.raises(RuntimeError, match="ledger closed"):
        await run_open(send, b"x", rate_per_second=5000, duration_seconds=1.0, metronome=metronome)
    assert metronome.stopped.is_set() and system.sent == 7
