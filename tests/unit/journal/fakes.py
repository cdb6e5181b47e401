"""Stand-ins for `os.fdatasync` that count, hold back or fail syncs."""

from __future__ import annotations

import errno
import os
import threading


class FakeCountingSync:
    """Counts syncs and remembers the file size at each one (so group sizes can be checked)."""

    def __init__(self, *, really_sync: bool = False) -> None:
        self.calls = 0
        self.sizes: list[int] = []
        self._really_sync = really_sync

    def __call__(self, fd: int) -> None:
        self.calls += 1
        self.sizes.append(os.fstat(fd).st_size)
        if self._really_sync:
            os.fdatasync(fd)


class FakeGatedSync(FakeCountingSync):
    """The first sync blocks until `release()`: everything appended meanwhile piles up."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self._gate = threading.Event()

    def release(self) -> None:
        self._gate.set()

    def __call__(self, fd: int) -> None:
        if self.calls == 0:
            self.entered.set()
            # Bounded, so that a broken test fails instead of hanging the writer thread.
            assert self._gate.wait(timeout=30), "FakeGatedSync was never released"
        super().__call__(fd)


class FailingSync(FakeCountingSync):
    """Sync number `fail_on_call` (1-based) and every later one fail with EIO, like a dead disk."""

    def __init__(self, fail_on_call: int) -> None:
        super().__init__()
        self._fail_on_call = fail_on_call

    def __call__(self, fd: int) -> None:
        super().__call__(fd)
        if self.calls >= self._fail_on_call:
            raise OSError(errno.EIO, "injected fdatasync failure")
