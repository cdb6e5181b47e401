"""The bookie's disk: the few file operations the journal and the entry logs make to write
and sync their data, and the usage figure of a directory, behind one interface.

Production uses `OS_DISK` (pwrite, fdatasync, close, statvfs), the default wherever a `Disk` is
taken. Nothing reads a disk from the environment: fault tests give a bookie another one through
its test entry point (`python -m bkaio.testing.bookie --disk lazy,...`, bkaio.testing.disk), which
hands the same object to the shard's journal and entry logs. It can hold unsynced writes in
memory (lost on kill -9, like a power failure), tear writes, fail fsync with EIO, add latency or
report a full disk.

Only data goes through here: creating files and syncing directories stay plain `os` calls.
Every method blocks: the journal calls them on its writer thread (and its preallocation
thread), the entry logs on the storage thread, the disk check on an executor thread.

A journal commit is one `write_synced` call on every disk, the real one and the fakes alike,
so the fault suite and the simulation run the commit path that ships; each disk gives it its
own meaning (the real one a single `pwritev(RWF_DSYNC)`, a lazy fake its write then its sync).
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Final, NamedTuple, Protocol


class DiskSpace(NamedTuple):
    """Bytes of the file system holding a directory (the fields of `shutil.disk_usage`)."""

    total: int
    used: int
    free: int


class Disk(Protocol):
    def write(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Write all of `data` at `offset` (not durable until `fdatasync`)."""

    def fdatasync(self, fd: int) -> None:
        """Make every write to `fd` durable; OSError (EIO, ENOSPC) when it cannot."""

    def write_synced(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Write all of `data` at `offset` and make it durable before returning, as `write`
        then `fdatasync` do; OSError when either part fails (the data is then not durable)."""

    def close(self, fd: int) -> None:
        """Close a descriptor written through this disk. Never `os.close` one directly: a fake
        keeps unsynced writes by descriptor number, and a reused number would inherit them."""

    def usage(self, path: Path) -> DiskSpace:
        """Total, used and free bytes of the file system holding `path` (OSError if gone)."""


class OsDisk:
    """The real thing."""

    def __init__(self) -> None:
        # pwritev's RWF_DSYNC (Linux >= 4.7): until a file system refuses it.
        self._dsync_writes = hasattr(os, "RWF_DSYNC")

    def write(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        write_all(fd, data, offset)

    def write_synced(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        """`write` then `fdatasync`, as one `pwritev(..., RWF_DSYNC)` where the kernel has it.

        The same guarantee (the written data, and what it takes to read it back, is durable
        on return) in one system call, so the journal's writer thread gives up and retakes the
        GIL once per group instead of twice: every retake may wait for the event loop.
        """
        if self._dsync_writes:
            try:
                _write_all_dsync(fd, data, offset)
                return
            except OSError as error:
                if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                self._dsync_writes = False  # Refused: the two calls from now on.
        write_all(fd, data, offset)
        os.fdatasync(fd)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def usage(self, path: Path) -> DiskSpace:
        return DiskSpace(*shutil.disk_usage(path))


OS_DISK: Final = OsDisk()


class SyncFunctionDisk:
    """`disk` with `sync_function` in place of its fdatasync: how `Journal.open`'s
    `sync_function` seam (tests count, hold back or fail syncs with it) reaches the writer,
    which then commits through `write_synced` as it does on every disk."""

    def __init__(self, disk: Disk, sync_function: Callable[[int], None]) -> None:
        self._disk = disk
        self._sync_function = sync_function

    def write(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        self._disk.write(fd, data, offset)

    def fdatasync(self, fd: int) -> None:
        self._sync_function(fd)

    def write_synced(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        self._disk.write(fd, data, offset)
        self._sync_function(fd)

    def close(self, fd: int) -> None:
        self._disk.close(fd)

    def usage(self, path: Path) -> DiskSpace:
        return self._disk.usage(path)


def _write_all_dsync(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    with memoryview(data) as view:
        written = 0
        while written < len(view):
            count = os.pwritev(fd, [view[written:]], offset + written, os.RWF_DSYNC)
            if count <= 0:
                raise OSError(errno.EIO, f"pwritev returned {count}")
            written += count


def write_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """pwrite `data` at `offset`, looping on short writes."""
    with memoryview(data) as view:
        written = 0
        while written < len(view):
            count = os.pwrite(fd, view[written:], offset + written)
            if count <= 0:
                raise OSError(errno.EIO, f"pwrite returned {count}")
            written += count
