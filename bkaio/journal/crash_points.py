"""Named crash points: the places in the storage pipeline where a fault test may end the process.

The journal, the entry logs and the checkpoint call `crash_points.reached(name)` at each of
`CRASH_POINTS`, with the `CrashPoints` object they were constructed with. Production passes
`NO_CRASH_POINTS` (the default everywhere), which does nothing and says so with `armed = False`,
so that the journal's writer picks its commit path once, at construction, without a call per
group. Only a test entry point arms one (`python -m bkaio.testing.bookie --crash-point
journal.after_write_before_sync:3`, bkaio.testing.crash_points); nothing reads one from the
environment.
"""

from __future__ import annotations

from typing import Final, Protocol

CRASH_POINTS: Final = (
    "journal.after_write_before_sync",  # A group written, its fdatasync not started.
    "journal.after_sync_before_ack",  # A group synced, not acknowledged yet.
    "entrylog.after_write_before_sync",  # A flush's entry-log writes done, their sync not.
    "checkpoint.before_rename",  # A new lastMark synced aside, not yet in place.
)


class CrashPoints(Protocol):
    @property
    def armed(self) -> bool:
        """False when `reached` never does anything: a hot path may then skip its calls."""

    def reached(self, name: str) -> None:
        """The calling thread is at crash point `name` (one of `CRASH_POINTS`)."""


class NoCrashPoints:
    """Production: no crash point ever fires."""

    armed: Final = False

    def reached(self, name: str) -> None:
        del name


NO_CRASH_POINTS: Final = NoCrashPoints()
