"""Where the journal's blocking work runs: the `Threads` seam.

A journal writes and syncs on one writer thread (and prepares its next file on another).
Production builds them with `OS_THREADS`, the default wherever `Threads` is taken: a
`WriterThread` for the writer, a `ThreadPoolExecutor` for the rest; it also serves as ledger
storage's `ThreadPools` (bkaio.wal.threads), so a bookie hands one object to both. The
deterministic simulation (bkaio.testing.sim) passes its own, whose workers run the same
functions on its event loop after a simulated delay. Nothing reads one from the environment.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Final, Protocol, TypeVar

from bkaio.journal.writer_thread import WriterThread
from bkaio.wal.threads import OsThreadPools, ThreadPools

T = TypeVar("T")


class SerialWorker(Protocol):
    """Runs calls one at a time, in the order they were posted or submitted."""

    def post(self, function: Callable[..., object], *args: object) -> None:
        """Run `function(*args)` after everything before it; it reports its own outcome."""

    def submit(self, function: Callable[..., T], *args: object) -> concurrent.futures.Future[T]:
        """Like `post`, with a future of the result."""

    def shutdown(self, wait: bool = True) -> None:
        """Stop after the work already posted (with `wait`: until it is done)."""


class Threads(ThreadPools, Protocol):
    def serial(self, name: str) -> SerialWorker:
        """A worker for ordered work (the journal's writer)."""


class OsThreads(OsThreadPools):
    """Production: real threads."""

    def serial(self, name: str) -> SerialWorker:
        return WriterThread(name)


OS_THREADS: Final = OsThreads()
