"""Between runs: wait until the disks are quiet, so one run's leftovers do not land in the next.

A run leaves the disk busy after it ends: NATS deletes the files of the stream it purged, and on
a file system mounted with online discard (ext4 `-o discard`, usual on cloud disks) the device
then trims them for a few hundred milliseconds; dirty pages of the not-durable peer wait for
writeback. Every journal sync of the next run (whichever system it is) would queue behind that
work. `settle_disks` syncs, then watches /proc/diskstats until no write or discard completes
and none is in flight for a whole window, or a time limit passes. Off Linux it only syncs and
sleeps the window.

Only whole devices count (the names in /sys/block), without loop, ram and zram devices: a
partition's I/O is already in its disk's line.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

QUIET_WINDOW_SECONDS = 0.25  # No write or discard finished, none in flight, this long.
SETTLE_LIMIT_SECONDS = 10.0  # Give up waiting (a background writer that never stops).
POLL_SECONDS = 0.05

_DISKSTATS = Path("/proc/diskstats")
_SYS_BLOCK = Path("/sys/block")
_VIRTUAL_PREFIXES = ("loop", "ram", "zram")

# /proc/diskstats columns (Documentation/admin-guide/iostats.rst), after major, minor, name:
_WRITES_DONE = 4  # Writes completed.
_IN_FLIGHT = 8  # I/Os currently in progress.
_DISCARDS_DONE = 11  # Discards completed (kernels >= 4.18; absent before).


@dataclass(frozen=True, slots=True)
class DiskActivity:
    """Counters summed over the watched devices."""

    writes: int
    discards: int
    in_flight: int

    def quiet_since(self, earlier: DiskActivity) -> bool:
        return (
            self.in_flight == 0
            and self.writes == earlier.writes
            and self.discards == earlier.discards
        )


def parse_diskstats(text: str, devices: frozenset[str]) -> DiskActivity:
    """Sum the activity counters of `devices` from the text of /proc/diskstats."""
    writes = discards = in_flight = 0
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3 + _IN_FLIGHT + 1 or fields[2] not in devices:
            continue
        counters = fields[3:]
        writes += int(counters[_WRITES_DONE])
        in_flight += int(counters[_IN_FLIGHT])
        if len(counters) > _DISCARDS_DONE:
            discards += int(counters[_DISCARDS_DONE])
    return DiskActivity(writes=writes, discards=discards, in_flight=in_flight)


def physical_devices(sys_block: Path = _SYS_BLOCK) -> frozenset[str]:
    try:
        names = os.listdir(sys_block)
    except OSError:
        return frozenset()
    return frozenset(n for n in names if not n.startswith(_VIRTUAL_PREFIXES))


def read_activity(devices: frozenset[str]) -> DiskActivity | None:
    try:
        return parse_diskstats(_DISKSTATS.read_text(), devices)
    except (OSError, ValueError, IndexError):
        return None


async def settle_disks(
    *,
    window_seconds: float = QUIET_WINDOW_SECONDS,
    limit_seconds: float = SETTLE_LIMIT_SECONDS,
) -> float:
    """Sync, then wait for a quiet window (at most `limit_seconds`); returns the seconds spent."""
    started = time.perf_counter()
    await asyncio.get_running_loop().run_in_executor(None, os.sync)
    devices = physical_devices()
    last = read_activity(devices) if devices else None
    if last is None:
        await asyncio.sleep(window_seconds)
        return time.perf_counter() - started
    quiet_from = time.perf_counter()
    deadline = started + limit_seconds
    while True:
        await asyncio.sleep(POLL_SECONDS)
        now = time.perf_counter()
        current = read_activity(devices)
        if current is None:
            break
        if not current.quiet_since(last):
            quiet_from = now
        last = current
        if now - quiet_from >= window_seconds or now >= deadline:
            break
    return time.perf_counter() - started
