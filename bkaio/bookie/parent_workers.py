"""The bookie parent's shard worker processes: start one per shard, wait until ready, stop them.

`ShardWorkers` is the part of `BookieParent` (a mixin over `ParentState`, parent_state.py) that
starts each worker with `WORKER_COMMAND` (`python -m bkaio.bookie.worker --config F --shard i
--instance-id X`; the test entry point `python -m bkaio.testing.bookie` passes its own), keeps a
`WorkerHandle` for each (worker_handle.py) whose control channel runs under the supervisor (a
channel that fails stops the bookie), waits at most `WORKER_START_TIMEOUT_SECONDS` until every
shard is ready, turns what a worker reports (a shard's read-only mode, a task that failed for
good) into the bookie's mode and health, and stops the workers: SIGTERM, then SIGKILL for one
still running `server.drain_timeout_seconds` + 10 s later. It also names the bookie's processes
for the process_* metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from functools import partial
from typing import Final

from bkaio.errors import BKError
from bkaio.supervision import Fatal

from .parent_state import ParentState
from .worker_handle import WorkerHandle

WORKER_START_TIMEOUT_SECONDS = 120.0  # Journal replay of a large journal can take a while.
# How a shard worker is started; `--config`, `--shard` and `--instance-id` follow.
WORKER_COMMAND: Final = (sys.executable, "-m", "bkaio.bookie.worker")


def disable_grpc_fork_handlers() -> None:
    """Turn off gRPC's fork support in this process (and its children) unless the environment
    already sets it: call before anything imports gRPC (the etcd client does, when the metadata
    opens), which reads GRPC_ENABLE_FORK_SUPPORT then.

    uvloop runs Python's at-fork hooks around the fork+exec of each shard worker, so gRPC's fork
    handlers ran at every spawn; with the etcd client's threads busy they skipped and printed
    `fork_posix.cc:71] Other threads are currently calling into gRPC, skipping fork() handlers`,
    a line that is not JSON, on the bookie's stderr. The handlers only serve a child that goes on
    using gRPC without exec; every process a bookie starts execs at once."""
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


class ShardWorkers(ParentState):
    """The worker processes of `BookieParent` (a mixin: the parent's state, these methods)."""

    def _process_ids(self) -> list[tuple[str, int]]:
        """This bookie's processes for process_* metrics: the parent and each live worker."""
        processes = [("parent", os.getpid())]
        for worker in self.workers:
            if worker.process.returncode is None:
                processes.append((f"shard-{worker.shard_index}", worker.process.pid))
        return processes

    async def _spawn_workers(self, instance_ids: list[str]) -> None:
        assert self.config.source is not None
        for shard_index in range(self.config.shard_count):
            process = await asyncio.create_subprocess_exec(
                *self.worker_command,
                "--config",
                str(self.config.source),
                "--shard",
                str(shard_index),
                "--instance-id",
                instance_ids[shard_index],
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            worker = WorkerHandle(shard_index, process)
            worker.on_read_only = self._on_worker_read_only
            worker.on_fatal = partial(self._on_worker_fatal, shard_index)
            # Without its control channel the parent can neither stop nor ask the worker.
            worker.reader = self.supervisor.spawn(
                "worker_control", worker.read_events, Fatal(), instance=str(shard_index)
            )
            self.workers.append(worker)

    def _on_worker_read_only(self) -> None:
        self._mode_changed.set()

    def _on_worker_fatal(self, shard_index: int, task: str, error: str) -> None:
        self.mark_unhealthy(f"shard {shard_index}: {task}: {error}")

    async def _wait_ready(self) -> bool:
        readies = asyncio.gather(*(w.ready for w in self.workers))
        try:
            async with asyncio.timeout(WORKER_START_TIMEOUT_SECONDS):
                started = await self._until_stop_or(readies)
        except (BKError, TimeoutError) as error:
            self.log.error("shard_start_failed", error=str(error) or "timed out")
            await self._stop_workers()
            return False
        if not started:
            await self._stop_workers()
            return False
        return True

    async def _stop_workers(self) -> list[int | None]:
        for worker in self.workers:
            if worker.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signal.SIGTERM)
        grace = self.config.server.drain_timeout_seconds + 10.0
        codes: list[int | None] = []
        for worker in self.workers:
            try:
                async with asyncio.timeout(grace):
                    codes.append(await worker.process.wait())
            except TimeoutError:
                self.log.error("shard_worker_kill", shard=worker.shard_index)
                with contextlib.suppress(ProcessLookupError):
                    worker.process.kill()
                codes.append(await worker.process.wait())
            if worker.reader is not None:
                worker.reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker.reader
        return codes
