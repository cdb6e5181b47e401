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
instead of silently lowering the offered rate (coordinated omission). The first failed append
stops a run: numbers with failures in them are not comparable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from time import perf_counter
from typing import Any

from bkaio.bench.pacer import PunctualSleeper

Send = Callable[[bytes], Awaitable[Any]]

# Open loop: the shortest sleep between bursts. uvloop rounds a timer's delay to whole
# milliseconds and turns anything under 0.5 ms into `call_soon`: sleeping "until the next
# append is due" at 5k/s (every 0.2 ms) would spin the client's loop, burning a core that the
# servers being measured need. So the pacer sleeps at least one timer tick and then sends
# everything that fell due meanwhile; each append's latency still counts from its own
# intended send time, so that lateness is measured, not hidden.
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

    def __init__(self, send: Send, payload: bytes) -> None:
        self.send = send
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
        now = perf_counter()
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
    send: Send, payload: bytes, *, appends: int = 0, duration_seconds: float = 0.0
) -> LoadOutcome:
    """One append at a time: `appends` of them, or as many as fit in `duration_seconds`."""
    assert appends > 0 or duration_seconds > 0, "serial needs appends or a duration"
    tracker = _Tracker(send, payload)
    began = perf_counter()
    deadline = began + duration_seconds if duration_seconds else float("inf")
    issued = 0
    while not tracker.stopped:
        if (appends and issued >= appends) or perf_counter() >= deadline:
            break
        tracker.issue(perf_counter())
        issued += 1
        await tracker.idle.wait()
    tracker.outcome.elapsed_seconds = perf_counter() - began
    return tracker.outcome


async def run_closed(
    send: Send, payload: bytes, *, outstanding: int, duration_seconds: float
) -> LoadOutcome:
    """`outstanding` appends always in flight; each completion sends the next until the end."""
    assert outstanding > 0 and duration_seconds > 0
    tracker = _Tracker(send, payload)
    began = perf_counter()
    deadline = began + duration_seconds

    def next_append(now: float) -> None:
        if now < deadline:
            tracker.issue(now)

    tracker.on_success = next_append
    for _ in range(outstanding):
        tracker.issue(perf_counter())
    await tracker.idle.wait()
    tracker.outcome.elapsed_seconds = perf_counter() - began
    return tracker.outcome


async def run_open(
    send: Send,
    payload: bytes,
    *,
    rate_per_second: float,
    duration_seconds: float,
    max_outstanding: int = DEFAULT_MAX_OUTSTANDING,
) -> LoadOutcome:
    """Appends at a fixed rate; latency from each append's intended send time."""
    assert rate_per_second > 0 and duration_seconds > 0
    tracker = _Tracker(send, payload)
    tracker.outcome.offered_per_second = rate_per_second
    total = max(1, round(rate_per_second * duration_seconds))
    sleeper = PunctualSleeper.open()  # None off Linux: asyncio.sleep's coarse timers then.
    try:
        await _pace(tracker, sleeper, rate_per_second, total, max_outstanding)
    finally:
        if sleeper is not None:
            sleeper.close()
    await tracker.idle.wait()
    tracker.outcome.elapsed_seconds = perf_counter() - tracker.began
    return tracker.outcome


async def _pace(
    tracker: _Tracker,
    sleeper: PunctualSleeper | None,
    rate_per_second: float,
    total: int,
    max_outstanding: int,
) -> None:
    interval = 1.0 / rate_per_second
    began = tracker.began = perf_counter()
    woke = began  # The last wake-up's target time.
    sent = 0
    while sent < total and not tracker.stopped:
        due = min(total, int((perf_counter() - began) * rate_per_second) + 1)
        while sent < due:
            if tracker.outstanding >= max_outstanding:
                tracker.outcome.overloaded = True
                tracker.stopped = True
                break
            tracker.issue(began + sent * interval)  # The intended time, not now.
            sent += 1
        if sent >= total:
            break
        # Wake-ups at least a tick apart (no busy loop at high rates: what falls due meanwhile
        # goes out in the next burst, each append still timed from its own intended time),
        # counted from the previous target so they do not drift; on time at low rates.
        woke = max(began + sent * interval, woke + PACER_TICK_SECONDS)
        if sleeper is not None:
            await sleeper.sleep_until(woke)
        else:  # libuv's timers count whole milliseconds: up to a tick late.
            await asyncio.sleep(max(PACER_TICK_SECONDS, woke - perf_counter()))
