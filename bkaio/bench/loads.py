"""Load generators of `bkaio bench`: serial, closed-loop and open-loop appends to any system.

A system is reduced to `send(payload)`, which starts one append and returns an awaitable of its
acknowledgement. When `send` returns a future (the bkaio client's `append` does) it is used as
is: no Task per append. A coroutine (nats-py's `publish`) is wrapped in a Task, which is what
that client costs anyway. Completion is one done-callback, bound once per run, that looks up
the append's own start time by its future and records `now - start` in a list: the harness
adds a clock read, a dict insert and pop and a `list.append` per append to the client's CPU,
and no closure or Event call.

The open loop sends on a fixed schedule whatever the replies do, and measures from the intended
send time (not the actual one), so a stalled sender or a full queue shows up as latency
instead of silently lowering the offered rate (coordinated omission). It is paced by a
`Metronome` (bkaio/bench/pacer.py): one callback per tick sends what fell due, with no timer,
future or coroutine per tick or per append. The first failed append stops a run: numbers with
failures in them are not comparable.

Every load reads time from one clock (`perf_counter`, or the metronome's own): tests pass a fake
metronome whose clock they move, so no test depends on how fast the box runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from time import perf_counter
from typing import Any

from bkaio.bench.pacer import Metronome, open_metronome

Send = Callable[[bytes], Awaitable[Any]]

# Open loop: the shortest time between bursts. Waking for every append at 5k/s (every 0.2 ms)
# would cost the client a wake-up per append and take CPU from the servers being measured
# (measured: +45-50 % server CPU per append, no better p99; docs/performance.md). So the pacer
# ticks at most once a millisecond and sends everything that fell due since the last tick;
# each append's latency still counts from its own intended send time, so that lateness is
# measured, not hidden. Below 1000 appends/s each append gets its own tick.
PACER_TICK_SECONDS = 0.001
# Open loop: past this many appends in flight the system is overloaded; stop rather than let
# memory grow without bound. 20 s at 5 k/s is 100 k; a healthy run has at most a few hundred.
DEFAULT_MAX_OUTSTANDING = 50_000


@dataclass(slots=True)
class LoadOutcome:
    """What a load generator saw: exact latencies (seconds) of every successful append."""

    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""
    elapsed_seconds: float = 0.0
    offered_per_second: float | None = None
    overloaded: bool = False

    @property
    def appends(self) -> int:
        return len(self.latencies)


class _Tracker:
    """Starts appends and counts completions; wakes `idle` when nothing is outstanding."""

    def __init__(
        self, send: Send, payload: bytes, clock: Callable[[], float] = perf_counter
    ) -> None:
        self.send = send
        self.clock = clock
        self.payload = payload
        self.outcome = LoadOutcome()
        self.outstanding = 0
        self.stopped = False  # Set by the first error: issue nothing more.
        self.idle = asyncio.Event()
        self.idle.set()
        # Called with the completion time (the next append's start in a closed loop).
        self.on_success: Callable[[float], None] | None = None
        self.began = 0.0  # When the open loop's schedule starts (perf_counter).
        # Each outstanding append's own start (or intended send) time, by its future: one
        # bound callback serves every append instead of a closure per append.
        self._started: dict[asyncio.Future[Any], float] = {}
        self._on_done = self._done
        self._record = self.outcome.latencies.append
        self._future_type = type(asyncio.get_running_loop().create_future())

    def issue(self, started: float) -> None:
        awaitable = self.send(self.payload)
        if type(awaitable) is self._future_type or asyncio.isfuture(awaitable):
            future = awaitable
        else:
            future = asyncio.ensure_future(awaitable)
        if self.outstanding == 0:
            self.idle.clear()  # Only on the way out of idle: not an Event call per append.
        self.outstanding += 1
        if future in self._started:  # The same future for two appends: time each on its own.
            future.add_done_callback(partial(self._done_at, started))
            return
        self._started[future] = started
        future.add_done_callback(self._on_done)

    def _done(self, future: asyncio.Future[Any]) -> None:
        now = self.clock()
        started = self._started.pop(future)
        self.outstanding -= 1
        try:
            error = future.exception()  # One call for both checks: cancelled raises here.
        except asyncio.CancelledError:
            self._fail("cancelled")
        else:
            if error is not None:
                self._fail(f"{type(error).__name__}: {error}")
            else:
                self._record(now - started)
                if self.on_success is not None and not self.stopped:
                    self.on_success(now)
        if self.outstanding == 0:
            self.idle.set()

    def _done_at(self, started: float, future: asyncio.Future[Any]) -> None:
        """`_done` for a future that another append's callback already popped."""
        self._started[future] = started
        self._done(future)

    def _fail(self, reason: str) -> None:
        self.outcome.errors += 1
        if not self.outcome.first_error:
            self.outcome.first_error = reason
        self.stopped = True


async def run_serial(
    send: Send,
    payload: bytes,
    *,
    appends: int = 0,
    duration_seconds: float = 0.0,
    clock: Callable[[], float] = perf_counter,
) -> LoadOutcome:
    """One append at a time: `appends` of them, or as many as fit in `duration_seconds`."""
    assert appends > 0 or duration_seconds > 0, "serial needs appends or a duration"
    tracker = _Tracker(send, payload, clock)
    began = clock()
    deadline = began + duration_seconds if duration_seconds else float("inf")
    issued = 0
    while not tracker.stopped:
        if (appends and issued >= appends) or clock() >= deadline:
            break
        tracker.issue(clock())
        issued += 1
        await tracker.idle.wait()
    tracker.outcome.elapsed_seconds = clock() - began
    return tracker.outcome


async def run_closed(
    send: Send,
    payload: bytes,
    *,
    outstanding: int,
    duration_seconds: float,
    clock: Callable[[], float] = perf_counter,
) -> LoadOutcome:
    """`outstanding` appends always in flight; each completion sends the next until the end."""
    assert outstanding > 0 and duration_seconds > 0
    tracker = _Tracker(send, payload, clock)
    began = clock()
    deadline = began + duration_seconds

    def next_append(now: float) -> None:
        if now < deadline:
            tracker.issue(now)

    tracker.on_success = next_append
    for _ in range(outstanding):
        tracker.issue(clock())
    await tracker.idle.wait()
    tracker.outcome.elapsed_seconds = clock() - began
    return tracker.outcome


async def run_open(
    send: Send,
    payload: bytes,
    *,
    rate_per_second: float,
    duration_seconds: float,
    max_outstanding: int = DEFAULT_MAX_OUTSTANDING,
    metronome: Metronome | None = None,
) -> LoadOutcome:
    """Appends at a fixed rate; latency from each append's intended send time.

    `metronome` paces it (default: `open_metronome()`); its clock times the appends too."""
    assert rate_per_second > 0 and duration_seconds > 0
    metronome = metronome if metronome is not None else open_metronome()
    tracker = _Tracker(send, payload, metronome.now)
    tracker.outcome.offered_per_second = rate_per_second
    total = max(1, round(rate_per_second * duration_seconds))
    pacer = _Pacer(tracker, metronome, rate_per_second, total, max_outstanding)
    try:
        await pacer.run()
    finally:
        metronome.stop()
    await tracker.idle.wait()
    tracker.outcome.elapsed_seconds = metronome.now() - tracker.began
    return tracker.outcome


class _Pacer:
    """Sends the open loop's appends from the metronome's ticks: at each, every append whose
    intended time has come, each timed from that time."""

    def __init__(
        self,
        tracker: _Tracker,
        metronome: Metronome,
        rate_per_second: float,
        total: int,
        max_outstanding: int,
    ) -> None:
        self._tracker = tracker
        self._metronome = metronome
        self._rate = rate_per_second
        self._interval = 1.0 / rate_per_second
        self._total = total
        self._max_outstanding = max_outstanding
        self._sent = 0
        self._finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def run(self) -> None:
        tracker = self._tracker
        began = tracker.began = self._metronome.now()
        self._tick()  # The first append is due at once.
        if not self._finished.done():
            period = max(self._interval, PACER_TICK_SECONDS)
            self._metronome.start(began + period, period, self._tick)
        await self._finished

    def _tick(self) -> None:
        tracker = self._tracker
        began = tracker.began
        interval = self._interval
        sent = self._sent
        # The epsilon: a tick exactly at an append's time counts it due despite rounding.
        due = min(self._total, int((self._metronome.now() - began) * self._rate + 1e-6) + 1)
        try:
            while sent < due and not tracker.stopped:
                if tracker.outstanding >= self._max_outstanding:
                    tracker.outcome.overloaded = True
                    tracker.stopped = True
                    break
                tracker.issue(began + sent * interval)  # The intended time, not now.
                sent += 1
        except Exception as error:  # `send` raised: the run ends with it, as in a coroutine.
            self._metronome.stop()
            if not self._finished.done():
                self._finished.set_exception(error)
            return
        finally:
            self._sent = sent
        if (sent >= self._total or tracker.stopped) and not self._finished.done():
            self._metronome.stop()
            self._finished.set_result(None)
