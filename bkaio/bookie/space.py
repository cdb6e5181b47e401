"""A bookie's disk space: the one definition every report uses.

    space = measure_space(ledger_directories(config))     # blocking: run it on a thread

A bookie's space is that of the filesystems holding its ledger directories (every shard's),
each filesystem counted once however many directories it holds (BookKeeper's
`getTotalFreeSpace`/`getTotalDiskSpace`). `free_bytes` is what the bookie can still write (the
blocks available to an unprivileged process, `statvfs` f_bavail, as `df` "Avail" and
`shutil.disk_usage().free` show),
`total_bytes` the filesystems' size. GET_BOOKIE_INFO on the wire, `GET /api/v1/bookie/info`,
`list_bookie_info`, `bkaio bookie info`, `bkaio shell bookieinfo` and `listbookies` all report
these two numbers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from bkaio.config import BookieConfig
from bkaio.journal.disk import OS_DISK, DiskSpace


@dataclass(frozen=True, slots=True)
class BookieSpace:
    total_bytes: int
    free_bytes: int
    filesystems: int  # Distinct filesystems the directories are on.

    def to_dict(self) -> dict[str, int]:
        return {
            "total_bytes": self.total_bytes,
            "free_bytes": self.free_bytes,
            "filesystems": self.filesystems,
        }


@dataclass(frozen=True, slots=True)
class DirectorySpace:
    path: Path
    exists: bool
    device: int  # st_dev of the filesystem holding it (of its nearest existing parent).
    total_bytes: int
    free_bytes: int


def ledger_directories(config: BookieConfig) -> list[Path]:
    """Every shard's ledger directories (where entry logs grow), in shard order."""
    return [Path(d) for storage in config.storage for d in storage.ledger_dirs]


UsageFunction = Callable[[Path], DiskSpace]


def directory_space(directory: Path, usage: UsageFunction = OS_DISK.usage) -> DirectorySpace:
    """The filesystem figures of `directory` (of its nearest existing parent if it is absent).
    `usage` is the shard's `Disk.usage` (bkaio/journal/disk.py; fault tests fake a full disk)."""
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    space = usage(probe)
    return DirectorySpace(
        path=directory,
        exists=probe == directory,
        device=os.stat(probe).st_dev,
        total_bytes=space.total,
        free_bytes=space.free,
    )


def measure_space(directories: Iterable[Path], usage: UsageFunction = OS_DISK.usage) -> BookieSpace:
    """Sum over the distinct filesystems holding `directories` (blocking: statvfs)."""
    by_device: dict[int, DirectorySpace] = {}
    for directory in directories:
        space = directory_space(directory, usage)
        by_device.setdefault(space.device, space)
    return BookieSpace(
        total_bytes=sum(s.total_bytes for s in by_device.values()),
        free_bytes=sum(s.free_bytes for s in by_device.values()),
        filesystems=len(by_device),
    )
