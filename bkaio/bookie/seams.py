"""The parts a shard's storage is built with that a fault test may replace.

    StorageSeams(disk=..., crash_points=..., journal_ack=..., threads=...)

Production builds every shard with `PRODUCTION_SEAMS`: the real disk (`OS_DISK`), no crash
point, the journal's promise (acknowledge after fsync) and real threads (`OS_THREADS`). Only
the test entry point (`python -m bkaio.testing.bookie`, which starts its shard workers through
`python -m bkaio.testing.bookie.worker`) builds others, from its command-line options; the same
`Disk` object then serves the shard's journal, entry logs and disk-usage checks. The
deterministic simulation (bkaio.testing.sim) also replaces the threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from bkaio.journal.crash_points import NO_CRASH_POINTS, CrashPoints
from bkaio.journal.disk import OS_DISK, Disk
from bkaio.journal.threads import OS_THREADS, Threads
from bkaio.journal.writer import ACK_AFTER_SYNC, JournalAckPolicy


@dataclass(frozen=True, slots=True)
class StorageSeams:
    disk: Disk = OS_DISK
    crash_points: CrashPoints = NO_CRASH_POINTS
    journal_ack: JournalAckPolicy = ACK_AFTER_SYNC
    threads: Threads = OS_THREADS


PRODUCTION_SEAMS: Final = StorageSeams()
