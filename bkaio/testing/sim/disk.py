"""The simulated disk of one machine: the `Disk` seam (bkaio.journal.disk) with a crash model.

The real code opens its files by path in the machine's directory (journal files, entry logs,
the LMDB index, cookies, the checkpoint mark): those are real files on a tmpfs. What goes
through the `Disk` seam — the journal's and the entry logs' writes and syncs, which decide what
an acknowledgement promises — is held here:

- `write` keeps the bytes in memory, per file (by inode, so a close or another descriptor does
  not change what is unsynced), like a page cache that has not written back;
- `fdatasync` puts the file's pending writes into the real file (durable from then on), or
  fails with EIO when the fault model says so, dropping them as Linux drops dirty pages after
  a failed writeback;
- `crash(power_loss=True)` (the machine loses power) drops every pending write, or with `tear`
  lets a seeded prefix of the oldest one per file reach the disk; `crash(power_loss=False)`
  (only the process died) keeps them: the kernel writes the page cache back anyway;
- latency is not spent here (every method runs inline as part of a simulated thread's job):
  `latency(kind)` is what the node's simulated threads wait before each job.

Writes that bypass the seam (file headers, the checkpoint mark, cookies, LMDB commits) are
written and synced in the same blocking call, which the simulation runs as one atomic job, so a
crash finds them either complete or not started (docs/faults.md, "Crash model").
"""

from __future__ import annotations

import errno
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from bkaio.journal.disk import DiskSpace, write_all


@dataclass
class DiskModel:
    """How one machine's disk behaves (seconds; `None`: never)."""

    sync_latency: tuple[float, float] = (0.0002, 0.003)
    slow_sync: float = 0.0  # Chance of a stall ...
    slow_sync_latency: tuple[float, float] = (0.05, 0.5)  # ... this long.
    read_latency: tuple[float, float] = (0.00005, 0.0005)
    tear: bool = False  # A power loss may leave a prefix of the oldest unsynced write.
    # fdatasync fails with EIO after this many successful syncs of files ending so ...
    fail_syncs_after: int | None = None
    fail_suffix: str = ""  # "" any file, ".jnl" the journal, ".log" the entry logs.
    total_bytes: int = 1 << 30


@dataclass
class DiskStats:
    writes: int = 0
    syncs: int = 0
    failed_syncs: int = 0
    dropped_bytes: int = 0
    torn_writes: int = 0
    crashes: int = 0


@dataclass
class _File:
    path: str
    pending: list[tuple[int, bytes]] = field(default_factory=list)


class SimDisk:
    """Implements `bkaio.journal.disk.Disk` for one simulated machine."""

    def __init__(self, root: Path, rng: random.Random, model: DiskModel) -> None:
        self.root = root
        self.rng = rng
        self.model = model
        self.stats = DiskStats()
        self._files: dict[tuple[int, int], _File] = {}  # By (device, inode).
        self._by_fd: dict[int, tuple[int, int]] = {}
        self._good_syncs = 0
        self.failing = False  # Set once syncs started failing; `repair` clears it.

    # ----------------------------------------------------------------- the Disk interface

    def write(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        self.stats.writes += 1
        self._file(fd).pending.append((offset, bytes(data)))

    def fdatasync(self, fd: int) -> None:
        file = self._file(fd)
        if self._sync_fails(file.path):
            self.stats.failed_syncs += 1
            self.stats.dropped_bytes += sum(len(data) for _, data in file.pending)
            file.pending.clear()
            raise OSError(errno.EIO, "injected fsync failure (simulated disk)")
        for offset, data in file.pending:
            write_all(fd, data, offset)
        file.pending.clear()
        self.stats.syncs += 1

    def write_synced(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        """The journal's commit: held, then the file's pending writes land (or the sync fails)."""
        self.write(fd, data, offset)
        self.fdatasync(fd)

    def close(self, fd: int) -> None:
        self._by_fd.pop(fd, None)
        os.close(fd)

    def usage(self, path: Path) -> DiskSpace:
        del path
        total = self.model.total_bytes
        used = total // 100
        return DiskSpace(total, used, total - used)

    # ----------------------------------------------------------------- the model

    def latency(self, kind: str) -> float:
        """How long a simulated thread's job of `kind` takes before it runs."""
        model = self.model
        if kind == "read":
            return self.rng.uniform(*model.read_latency)
        if model.slow_sync and self.rng.random() < model.slow_sync:
            return self.rng.uniform(*model.slow_sync_latency)
        return self.rng.uniform(*model.sync_latency)

    def _sync_fails(self, path: str) -> bool:
        model = self.model
        if model.fail_suffix and not path.endswith(model.fail_suffix):
            return False
        if self.failing:
            return True
        if model.fail_syncs_after is not None and self._good_syncs >= model.fail_syncs_after:
            self.failing = True
            return True
        self._good_syncs += 1
        return False

    def fail_syncs(self, after: int, suffix: str = "") -> None:
        """From now: `after` more syncs (of files ending in `suffix`, "" any) work, then every
        one fails until `repair`."""
        self.model.fail_suffix = suffix
        self.model.fail_syncs_after = self._good_syncs + after

    def repair(self) -> None:
        """Syncs work again (the machine rebooted with the device back)."""
        self.failing = False
        self.model.fail_syncs_after = None

    def crash(self, *, power_loss: bool) -> int:
        """The machine crashed (`power_loss`) or only its process did. Returns bytes lost."""
        self.stats.crashes += 1
        lost = 0
        for file in self._files.values():
            if not file.pending:
                continue
            if not power_loss:
                self._land(file.path, file.pending)
            else:
                first_offset, first = file.pending[0]
                if self.model.tear and len(first) > 1 and self.rng.random() < 0.5:
                    keep = self.rng.randrange(1, len(first))
                    self._land(file.path, [(first_offset, first[:keep])])
                    self.stats.torn_writes += 1
                    lost += len(first) - keep
                    lost += sum(len(data) for _, data in file.pending[1:])
                else:
                    lost += sum(len(data) for _, data in file.pending)
            file.pending.clear()
        self._files.clear()
        self._by_fd.clear()
        self.stats.dropped_bytes += lost
        return lost

    @property
    def unsynced_bytes(self) -> int:
        return sum(len(data) for file in self._files.values() for _, data in file.pending)

    # ----------------------------------------------------------------- helpers

    def _file(self, fd: int) -> _File:
        key = self._by_fd.get(fd)
        if key is None:
            status = os.fstat(fd)
            key = (status.st_dev, status.st_ino)
            self._by_fd[fd] = key
            path = os.readlink(f"/proc/self/fd/{fd}")
            known = self._files.get(key)
            if known is None or known.path != path:  # New, or a deleted file's inode reused.
                self._files[key] = _File(path)
        return self._files[key]

    @staticmethod
    def _land(path: str, writes: list[tuple[int, bytes]]) -> None:
        """Write `writes` into the file at `path` (if it still exists): they reached the disk."""
        try:
            fd = os.open(path, os.O_WRONLY)
        except FileNotFoundError:
            return
        try:
            for offset, data in writes:
                write_all(fd, data, offset)
        finally:
            os.close(fd)
