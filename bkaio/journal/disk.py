"""The bookie's disk: the few file operations the journal and the entry logs make to write
and sync their data, behind one interface.

Production uses `OS_DISK` (pwrite, fdatasync, close). Fault tests swap in a fake from
`bkaio.testing.disk` that can hold unsynced writes in memory (lost on kill -9, like a power
failure), tear writes, fail fsync with EIO or add latency. A bookie process picks its disk from
the environment once, at the first journal or entry log it opens, and both share it:

    BKAIO_FAULT_DISK=lazy,sync_delay_ms=20,eio_after_syncs=50    (see bkaio.testing.disk)

Only data goes through here: creating files and syncing directories stay plain `os` calls.

`BKAIO_CRASHPOINT=journal.after_write_before_sync:3` exits the process the 3rd time it passes
that point (`crash_point`; the others: journal.after_sync_before_ack,
entrylog.after_write_before_sync, checkpoint.before_rename).
`BKAIO_MUTATION=ack_before_fsync` is a deliberately broken build for the fault suite's own
mutation check: each group is acknowledged after its write and synced only when the next group
comes. Never set these variables in production.
Every method blocks: the journal calls them on its writer thread, the entry logs on the
storage thread.
"""

from __future__ import annotations

import errno
import os
import threading
from typing import Final, Protocol

from bkaio.journal.files import write_all

FAULT_DISK_ENV: Final = "BKAIO_FAULT_DISK"
MUTATION_ENV: Final = "BKAIO_MUTATION"
CRASHPOINT_ENV: Final = "BKAIO_CRASHPOINT"
_crash_passes: dict[str, int] = {}


class Disk(Protocol):
    def write(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Write all of `data` at `offset` (not durable until `fdatasync`)."""

    def fdatasync(self, fd: int) -> None:
        """Make every write to `fd` durable; OSError (EIO, ENOSPC) when it cannot."""

    def close(self, fd: int) -> None:
        """Close a descriptor written through this disk. Never `os.close` one directly: a fake
        keeps unsynced writes by descriptor number, and a reused number would inherit them."""


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


OS_DISK: Final = OsDisk()
_from_environment: Disk | None = None
_from_environment_lock = threading.Lock()  # The journal and the storage thread may race here.


def _write_all_dsync(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    with memoryview(data) as view:
        written = 0
        while written < len(view):
            count = os.pwritev(fd, [view[written:]], offset + written, os.RWF_DSYNC)
            if count <= 0:
                raise OSError(errno.EIO, f"pwritev returned {count}")
            written += count


def crash_points_armed() -> bool:
    """Whether BKAIO_CRASHPOINT was set: code that skips a crash point's place must not then."""
    return bool(_CRASHPOINT_ARMED)


def default_disk() -> Disk:
    """`OS_DISK`, or the fault-injection disk that BKAIO_FAULT_DISK names (one per process)."""
    global _from_environment
    spec = os.environ.get(FAULT_DISK_ENV, "")
    if not spec:
        return OS_DISK
    with _from_environment_lock:
        if _from_environment is None:
            from bkaio.testing.disk import disk_from_spec  # Test-only code, loaded on request.

            _from_environment = disk_from_spec(spec)
        return _from_environment


# Read once: the fault suite sets it in a bookie's environment before the process starts, and
# `os.environ.get` (key encoding, a Python-level Mapping.get) costs a microsecond per call on
# the journal writer's path.
_CRASHPOINT_ARMED = os.environ.get(CRASHPOINT_ENV, "")


def crash_point(name: str) -> None:
    """Named crash point: with BKAIO_CRASHPOINT="<name>:<n>" in the environment the process was
    started with, the process exits (137, as if killed) the n-th time it passes here."""
    armed = _CRASHPOINT_ARMED
    if not armed:
        return
    point, _, count = armed.partition(":")
    if point != name:
        return
    passes = _crash_passes.get(name, 0) + 1
    _crash_passes[name] = passes
    if passes >= int(count or "1"):
        os._exit(137)


def mutation(name: str) -> bool:
    """Whether the deliberately broken behaviour `name` is switched on (fault-suite checks)."""
    return name in os.environ.get(MUTATION_ENV, "").split(",")
