"""Punctual sleeps for the open-loop load generator: wake at an absolute time, to the microsecond.

uvloop's timers (libuv) count whole milliseconds: a sleep "until the next append is due" wakes
anywhere up to a millisecond or more late, and that lateness lands in every append's latency,
which the open loop measures from the intended send time (bkaio's and the peer's alike). On
Linux a timerfd armed at the absolute CLOCK_MONOTONIC time and watched by the event loop wakes
the loop when it expires, whatever libuv's resolution: the sender then goes out on time. The
number of wake-ups does not change (the caller still sleeps at least one tick between bursts).

Python 3.11 has no `os.timerfd_*` (3.13 does), so the two calls go through ctypes. Where they
are missing (not Linux) `PunctualSleeper.open` returns None and callers keep `asyncio.sleep`.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import time
from time import perf_counter

_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC


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


class PunctualSleeper:
    """One timerfd on the running loop; `sleep_until(t)` returns at `t` (a perf_counter time)."""

    def __init__(self, libc: ctypes.CDLL, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        self._libc = libc
        self._fd = fd
        self._loop = loop
        self._waiter: asyncio.Future[None] | None = None
        self._spec = _Itimerspec()
        # perf_counter is CLOCK_MONOTONIC on Linux; the offset only guards against a build
        # where it is not (it is measured once, so a difference just shifts every wake-up).
        self._offset = time.clock_gettime(time.CLOCK_MONOTONIC) - perf_counter()
        loop.add_reader(fd, self._expired)

    @classmethod
    def open(cls) -> PunctualSleeper | None:
        """A sleeper on the running loop, or None where timerfd is not available."""
        libc = _libc()
        if libc is None:
            return None
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            return None
        return cls(libc, fd, asyncio.get_running_loop())

    async def sleep_until(self, when: float) -> None:
        """Return once perf_counter() >= `when` (at once if it already is)."""
        if when <= perf_counter():
            await asyncio.sleep(0)
            return
        target = when + self._offset
        seconds = int(target)
        self._spec.it_value.tv_sec = seconds
        self._spec.it_value.tv_nsec = int((target - seconds) * 1e9)
        while perf_counter() < when:  # A stale readiness (an earlier arming) wakes too early.
            if self._libc.timerfd_settime(
                self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None
            ):
                error = ctypes.get_errno()
                raise OSError(error, f"timerfd_settime: {os.strerror(error)}")
            waiter = self._waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    def _expired(self) -> None:
        try:
            os.read(self._fd, 8)  # The expiration count; reading it re-arms readiness.
        except BlockingIOError:
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
