"""The open loop's metronome: a callback on a fixed schedule, to the microsecond, no drift.

    metronome = open_metronome()                # on the running loop
    metronome.start(first, period, on_tick)     # on_tick() at first, first + period, ...
    metronome.stop()

uvloop's timers (libuv) count whole milliseconds: a sleep "until the next append is due" wakes
anywhere up to a millisecond or more late, and that lateness lands in every append's latency,
which the open loop measures from the intended send time (bkaio's and the peer's alike). On
Linux a periodic timerfd, armed once at an absolute CLOCK_MONOTONIC time and watched by the
event loop, wakes the loop on each period whatever libuv's resolution. Each tick costs the loop
one `read` and the callback: no timer to re-arm, no future and no coroutine to resume per tick
(the pacer sends its burst from the callback). Ticks missed while the loop was busy come as one
(the read returns how many expired): the callback looks at the clock and sends what fell due.

Python 3.11 has no `os.timerfd_*` (3.13 does), so the two calls go through ctypes, once per run.
Where they are missing (not Linux) `open_metronome` falls back to the loop's own timers
(`LoopMetronome`). Tests drive the pacer with a fake metronome and clock (tests/unit/bench).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import time
from collections.abc import Callable
from time import perf_counter
from typing import Protocol

_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC


class Metronome(Protocol):
    """Calls a callback on a fixed schedule on the running loop; `now` is its clock."""

    def now(self) -> float:
        """The clock the schedule is in (perf_counter for the real ones), in seconds."""

    def start(self, first: float, period: float, on_tick: Callable[[], None]) -> None:
        """Call `on_tick()` at `first`, `first + period`, ... until `stop`. A tick that falls
        due while the loop is busy runs late; several missed ticks run once."""

    def stop(self) -> None:
        """No more ticks; releases what `start` took. Safe to call twice, or from a tick."""


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.timerfd_create  # noqa: B018  # Both must exist.
        libc.timerfd_settime  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def _timespec(seconds: float) -> _Timespec:
    whole = int(seconds)
    return _Timespec(whole, int((seconds - whole) * 1e9))


class TimerfdMetronome:
    """A periodic timerfd watched by the loop (Linux)."""

    def __init__(self, libc: ctypes.CDLL, loop: asyncio.AbstractEventLoop) -> None:
        self._libc = libc
        self._loop = loop
        self._fd = -1
        self._on_tick: Callable[[], None] | None = None
        # perf_counter is CLOCK_MONOTONIC on Linux; the offset only guards against a build
        # where it is not (it is measured once, so a difference just shifts every tick).
        self._offset = time.clock_gettime(time.CLOCK_MONOTONIC) - perf_counter()

    def now(self) -> float:
        return perf_counter()

    def start(self, first: float, period: float, on_tick: Callable[[], None]) -> None:
        assert self._fd < 0 and period > 0, "one schedule at a time"
        fd = self._libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            error = ctypes.get_errno()
            raise OSError(error, f"timerfd_create: {os.strerror(error)}")
        # it_value 0 would disarm: a schedule starting now or earlier starts a nanosecond on.
        spec = _Itimerspec(_timespec(period), _timespec(max(first + self._offset, 1e-9)))
        if self._libc.timerfd_settime(fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None):
            error = ctypes.get_errno()
            os.close(fd)
            raise OSError(error, f"timerfd_settime: {os.strerror(error)}")
        self._fd = fd
        self._on_tick = on_tick
        self._loop.add_reader(fd, self._expired)

    def _expired(self) -> None:
        try:
            os.read(self._fd, 8)  # How many periods expired; reading re-arms readiness.
        except BlockingIOError:
            return
        on_tick = self._on_tick
        if on_tick is not None:
            on_tick()

    def stop(self) -> None:
        self._on_tick = None
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            self._loop.remove_reader(fd)
            os.close(fd)


class LoopMetronome:
    """The loop's own timers (not Linux): up to a timer tick late, never early."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._handle: asyncio.TimerHandle | None = None
        self._next = 0.0
        self._period = 0.0
        self._on_tick: Callable[[], None] | None = None

    def now(self) -> float:
        return perf_counter()

    def start(self, first: float, period: float, on_tick: Callable[[], None]) -> None:
        assert self._on_tick is None and period > 0, "one schedule at a time"
        self._next, self._period, self._on_tick = first, period, on_tick
        self._arm()

    def _arm(self) -> None:
        delay = self._next - perf_counter()
        self._handle = self._loop.call_at(self._loop.time() + max(delay, 0.0), self._expired)

    def _expired(self) -> None:
        on_tick = self._on_tick
        if on_tick is None:
            return
        now = perf_counter()
        if now < self._next:  # A coarse timer fired early: wait for the rest.
            self._arm()
            return
        missed = int((now - self._next) / self._period)
        self._next += (missed + 1) * self._period
        self._arm()
        on_tick()

    def stop(self) -> None:
        self._on_tick = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def open_metronome() -> Metronome:
    """A metronome on the running loop: a timerfd where there is one, else the loop's timers."""
    loop = asyncio.get_running_loop()
    libc = _libc()
    if libc is None:
        return LoopMetronome(loop)
    return TimerfdMetronome(libc, loop)
