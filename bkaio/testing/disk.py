"""Fault-injecting disks for the `Disk` interface of the journal and the entry logs
(bkaio.journal.disk). Tests only.

`FakeDisk` wraps the real file operations and can
- hold unsynced writes in memory (`lazy`): they reach the file only at fdatasync, so kill -9 of
  the process loses exactly what a power failure would lose; `crash()` does the same in-process;
- tear a write on `crash()` (`tear`): a prefix of the oldest unsynced write reaches the file;
- fail fsync with EIO after N successful syncs (`eio_after_syncs`), and keep failing; the
  unsynced writes are dropped, as the kernel drops dirty pages after a failed writeback;
  `eio_file_suffix` aims that at some files only (`.log`: the entry logs, not the journal's
  `.jnl` files), and `heal()` makes syncs work again (a test's replaced device);
- add latency to every sync or write (`sync_delay`, `write_delay`);
- report the usage fraction written in a file (`usage_file`) instead of the measured one, so a
  test can make a bookie see a full disk and then a free one again;
- fail writes and syncs while a file exists (`fault_file`): it holds an errno name, optionally
  a file-name suffix the fault is aimed at and `write` or `sync` (both by default), e.g.
  `ENOSPC .log` (entry logs full), `EIO lastMark.tmp sync` (checkpoints), `EIO .jnl sync` (the
  journal's fsync), `ENOSPC .prealloc` (the journal's preparation of its next file). A test
  process writes it into a running bookie and removes it to heal.

The journal commits a group with `write_synced`, here this disk's write then its sync: the
journal's production commit path runs under every fault above.
With `journal.preallocate_next_file` on, the preparation of the next journal file writes and
syncs through this disk too, from its own thread: its syncs count toward `eio_after_syncs`
(aim the fault with `eio_file_suffix` to keep the count deterministic), a failed one makes the
disk fail from then on like any other, and `crash()` drops a preparation's unsynced zeros.
The option is off by default and no fault test turns it on.

A bookie gets one from its test entry point's `--disk` option (bkaio.testing.bookie), a spec
that `disk_from_spec` reads; the shard's journal, entry logs and disk checks share it:

    --disk lazy,sync_delay_ms=20,eio_after_syncs=100,write_delay_ms=0,tear
    --disk lazy,eio_after_syncs=0,eio_file_suffix=.log      (entry-log syncs fail)
    --disk usage_file=/tmp/t/disk_usage                     (the file holds e.g. 0.99)
    --disk fault_file=/tmp/t/disk_fault                     (the file holds e.g. ENOSPC .log)
"""

from __future__ import annotations

import errno
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bkaio.errors import ConfigError
from bkaio.journal.disk import OS_DISK, DiskSpace, write_all


@dataclass
class FakeDiskStats:
    writes: int = 0
    syncs: int = 0
    failed_syncs: int = 0
    dropped_bytes: int = 0


@dataclass
class FakeDisk:
    lazy: bool = False
    tear: bool = False
    sync_delay: float = 0.0
    write_delay: float = 0.0
    eio_after_syncs: int | None = None
    eio_file_suffix: str = ""  # Empty: EIO may hit any file.
    # While this file exists and holds a number in [0, 1], every directory is that full.
    usage_file: Path | None = None
    # While this file exists: "ERRNO [SUFFIX] [write|sync]" makes those calls fail.
    fault_file: Path | None = None
    stats: FakeDiskStats = field(default_factory=FakeDiskStats)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, list[tuple[int, bytes]]] = {}
        self._crashed = False
        self._failed = False
        self._targeted_syncs = 0  # Successful syncs of files that EIO may hit.

    # ----------------------------------------------------------------- Disk

    def write(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        if self.write_delay:
            time.sleep(self.write_delay)
        fault = self._file_fault(fd, "write")
        if fault is not None:
            raise fault
        with self._lock:
            self.stats.writes += 1
            if self._crashed:
                return
            if self.lazy:
                self._pending.setdefault(fd, []).append((offset, bytes(data)))
                return
        write_all(fd, data, offset)

    def fdatasync(self, fd: int) -> None:
        if self.sync_delay:
            time.sleep(self.sync_delay)
        targeted = self._eio_may_hit(fd)
        fault = self._file_fault(fd, "sync")
        with self._lock:
            if self._crashed:
                return
            if fault is not None:  # The kernel drops the dirty pages of a failed writeback.
                self.stats.failed_syncs += 1
                dropped = self._pending.pop(fd, [])
                self.stats.dropped_bytes += sum(len(data) for _, data in dropped)
                raise fault
            if targeted and (
                self._failed
                or (
                    self.eio_after_syncs is not None
                    and self._targeted_syncs >= self.eio_after_syncs
                )
            ):
                self._failed = True
                self.stats.failed_syncs += 1
                dropped = self._pending.pop(fd, [])
                self.stats.dropped_bytes += sum(len(data) for _, data in dropped)
                raise OSError(errno.EIO, "injected fsync failure (FakeDisk)")
            for offset, data in self._pending.pop(fd, []):
                write_all(fd, data, offset)
            self.stats.syncs += 1
            self._targeted_syncs += 1 if targeted else 0
        os.fdatasync(fd)

    def write_synced(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        """The journal's commit: this disk's write, then its sync, with their faults and
        delays (a full disk fails the write, EIO the sync; lazy data is synced on return)."""
        self.write(fd, data, offset)
        self.fdatasync(fd)

    def _eio_may_hit(self, fd: int) -> bool:
        if not self.eio_file_suffix:
            return True
        return _path_of(fd).endswith(self.eio_file_suffix)

    def _file_fault(self, fd: int, call: str) -> OSError | None:
        """The error `fault_file` asks `call` ("write" or "sync") on `fd` to fail with."""
        if self.fault_file is None:
            return None
        try:
            words = self.fault_file.read_text().split()
        except FileNotFoundError:
            return None
        if not words:
            return None
        name, rest = words[0], words[1:]
        calls = {word for word in rest if word in ("write", "sync")} or {"write", "sync"}
        suffixes = [word for word in rest if word not in ("write", "sync")]
        if call not in calls or (suffixes and not _path_of(fd).endswith(suffixes[0])):
            return None
        code = getattr(errno, name, None)
        if not isinstance(code, int):
            raise OSError(errno.EINVAL, f"{self.fault_file}: {name!r} is no errno name")
        return OSError(code, f"injected {name} on {call} (FakeDisk {self.fault_file})")

    def close(self, fd: int) -> None:
        with self._lock:
            pending = self._pending.pop(fd, [])
            if not self._crashed:  # A clean close: the page cache keeps them.
                for offset, data in pending:
                    write_all(fd, data, offset)
        os.close(fd)

    def usage(self, path: Path) -> DiskSpace:
        measured = OS_DISK.usage(path)
        fraction = self._reported_fraction()
        if fraction is None:
            return measured
        used = round(measured.total * fraction)
        return DiskSpace(measured.total, used, measured.total - used)

    def _reported_fraction(self) -> float | None:
        if self.usage_file is None:
            return None
        try:
            text = self.usage_file.read_text().strip()
        except FileNotFoundError:
            return None
        try:
            value = float(text)
        except ValueError:
            raise OSError(f"{self.usage_file}: not a usage fraction: {text[:40]!r}") from None
        return min(max(value, 0.0), 1.0)

    # ----------------------------------------------------------------- faults

    def crash(self) -> int:
        """Power failure: unsynced writes are gone (a torn prefix of one may land with `tear`);
        everything after this is ignored. Returns the bytes dropped."""
        with self._lock:
            self._crashed = True
            dropped = 0
            for fd, writes in self._pending.items():
                for position, (offset, data) in enumerate(writes):
                    if self.tear and position == 0 and len(data) > 1:
                        keep = len(data) // 2
                        write_all(fd, data[:keep], offset)
                        dropped += len(data) - keep
                    else:
                        dropped += len(data)
            self._pending.clear()
            self.stats.dropped_bytes += dropped
            return dropped

    def heal(self) -> None:
        """Syncs work again from now on (what was dropped by a failed sync stays lost)."""
        with self._lock:
            self._failed = False
            self.eio_after_syncs = None

    @property
    def unsynced_bytes(self) -> int:
        with self._lock:
            return sum(len(d) for writes in self._pending.values() for _, d in writes)


def _path_of(fd: int) -> str:
    """The descriptor's path, as the kernel knows it (Linux); "" when unknown."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def disk_from_spec(spec: str) -> FakeDisk:
    """Parse a disk spec: comma-separated flags (`lazy`, `tear`) and `name=value` options
    (`sync_delay_ms`, `write_delay_ms`, `eio_after_syncs`, `eio_file_suffix`, `usage_file`,
    `fault_file`)."""
    disk = FakeDisk()
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        name, _, value = item.partition("=")
        try:
            if name == "lazy" and not value:
                disk.lazy = True
            elif name == "tear" and not value:
                disk.tear = True
            elif name == "sync_delay_ms":
                disk.sync_delay = float(value) / 1000
            elif name == "write_delay_ms":
                disk.write_delay = float(value) / 1000
            elif name == "eio_after_syncs":
                disk.eio_after_syncs = int(value)
            elif name == "eio_file_suffix" and value:
                disk.eio_file_suffix = value
            elif name == "usage_file" and value:
                disk.usage_file = Path(value)
            elif name == "fault_file" and value:
                disk.fault_file = Path(value)
            else:
                raise ValueError("unknown option")
        except ValueError as error:
            raise ConfigError(
                f"disk spec {spec!r}: bad item {item!r} ({error}); expected lazy, tear, "
                "sync_delay_ms=N, write_delay_ms=N, eio_after_syncs=N, eio_file_suffix=S, "
                "usage_file=PATH, fault_file=PATH"
            ) from None
    return disk
