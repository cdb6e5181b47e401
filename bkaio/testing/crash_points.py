"""An armed crash point for fault tests: the process exits (137, as if killed with SIGKILL) the
n-th time it reaches the named point (bkaio.journal.crash_points lists them).

A bookie gets one from its test entry point's `--crash-point NAME:N` option
(bkaio.testing.bookie); unit tests may pass `CrashAt` to a journal or to storage directly.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Final

from bkaio.errors import ConfigError
from bkaio.journal.crash_points import CRASH_POINTS

KILLED_EXIT_CODE: Final = 137  # What a shell reports for a process killed by SIGKILL.


class CrashAt:
    """Ends the process the `passes`-th time any thread reaches `point`."""

    armed: Final = True

    def __init__(
        self, point: str, passes: int = 1, *, exit: Callable[[int], object] = os._exit
    ) -> None:
        if point not in CRASH_POINTS:
            raise ConfigError(f"unknown crash point {point!r}; known: {', '.join(CRASH_POINTS)}")
        if passes < 1:
            raise ConfigError(f"crash point {point}: passes={passes} must be at least 1")
        self.point = point
        self.passes = passes
        self._exit = exit  # Unit tests record the exit instead of taking it.
        self._reached = 0
        self._lock = threading.Lock()  # Journal writer threads and the storage thread.

    def reached(self, name: str) -> None:
        if name != self.point:
            return
        with self._lock:
            self._reached += 1
            due = self._reached >= self.passes
        if due:
            self._exit(KILLED_EXIT_CODE)

    @classmethod
    def from_spec(cls, spec: str) -> CrashAt:
        """`NAME` or `NAME:N` (the n-th pass; the first by default)."""
        point, _, count = spec.partition(":")
        try:
            passes = int(count) if count else 1
        except ValueError:
            raise ConfigError(
                f"crash point {spec!r}: {count!r} is not a number of passes"
            ) from None
        return cls(point, passes)
