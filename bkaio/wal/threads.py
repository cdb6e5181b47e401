"""Where ledger storage's blocking work runs: the `ThreadPools` seam (below storage and journal).

Ledger storage flushes, compacts and deletes on one storage thread and reads on a small pool.
Production builds them with `OS_THREAD_POOLS`, the default wherever `ThreadPools` is taken:
`ThreadPoolExecutor`s. The journal's `Threads` (bkaio.journal.threads) adds its writer thread to
this. The deterministic simulation (bkaio.testing.sim) passes its own, whose workers run the
same functions on its event loop after a simulated delay, so one seed fixes the order of
everything. Nothing reads one from the environment.
"""

from __future__ import annotations

import concurrent.futures
from typing import Final, Protocol


class ThreadPools(Protocol):
    def pool(self, name: str, workers: int) -> concurrent.futures.Executor:
        """An executor with up to `workers` calls at a time (for `loop.run_in_executor`)."""


class OsThreadPools:
    """Production: real threads."""

    def pool(self, name: str, workers: int) -> concurrent.futures.Executor:
        return concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix=name)


OS_THREAD_POOLS: Final = OsThreadPools()
