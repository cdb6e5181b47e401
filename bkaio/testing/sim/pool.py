"""Many seeds on a few cores: workers that fork a fresh process per seed.

A `Worker` is a process forked from the runner once everything is imported; it prepares what
every seed needs (the machines' configurations, in its own directory), freezes its heap
(`gc.freeze`), and then, for each seed it is sent, forks a child that runs that one seed
(`runner.child_main`) and exits. So every seed starts from the same interpreter state, whether it
is the first or the ten-thousandth of a run, or run alone with `make sim SEED=...`: the failing
seed of a long run replays exactly. A child that hangs is killed after `timeout` seconds.

Messages are length-prefixed pickles on pipes: runner -> worker `(seed, scenario, mutation)`,
worker -> runner `("started", seed, pid)` then the child's `SimOutcome` (or the worker's own
outcome when the child died without one).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import select
import shutil
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from bkaio.testing.sim.nodes import warm_up
from bkaio.testing.sim.runner import (
    SimOutcome,
    child_main,
    receive_message,
    scratch_directory,
    send_message,
)

Job = tuple[int, str | None, str | None]  # seed, scenario, mutation
_PARENT_ENDS: set[int] = set()  # The runner's ends of every worker's pipes.
_LIVE: list[Worker] = []  # Closed at exit too (a run stopped by a signal leaves no directory).


@atexit.register
def _close_live_workers() -> None:
    for worker in list(_LIVE):
        if worker.parent == os.getpid():
            worker.kill()


class Worker:
    def __init__(self) -> None:
        self.root = scratch_directory()
        jobs_read, self._jobs = os.pipe()
        self.results, results_write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:  # Never back into the runner's code: this process only ever exits.
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                for fd in (self._jobs, self.results, *_PARENT_ENDS):  # Only its own pipes stay.
                    os.close(fd)
                _worker_main(jobs_read, results_write, self.root)
            finally:
                os._exit(1)
        _PARENT_ENDS.update((self._jobs, self.results))
        self.parent = os.getpid()
        _LIVE.append(self)
        os.close(jobs_read)
        os.close(results_write)
        self.job: Job | None = None
        self.child = 0
        self.started = 0.0

    def submit(self, job: Job) -> None:
        self.job, self.child, self.started = job, 0, time.monotonic()
        send_message(self._jobs, job)

    def kill(self) -> None:
        """Stop its seed's process (and wait until it is gone: it writes in our directory),
        then close it."""
        if self.child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, signal.SIGKILL)
                for _ in range(500):
                    os.kill(self.child, 0)  # ProcessLookupError once it is reaped.
                    time.sleep(0.01)
            self.child = 0
        self.close()

    def close(self) -> None:
        if self in _LIVE:
            _LIVE.remove(self)
        _PARENT_ENDS.difference_update((self._jobs, self.results))
        with contextlib.suppress(OSError):
            os.close(self._jobs)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        with contextlib.suppress(OSError):
            os.close(self.results)
        shutil.rmtree(self.root, ignore_errors=True)


def _worker_main(jobs: int, results: int, root: Path) -> NoReturn:
    warm_up(root)
    gc.collect()
    gc.freeze()  # Each child starts from this heap: same seed, same addresses, same schedule.
    while True:
        job = receive_message(jobs)
        if job is None:
            os._exit(0)
        seed, scenario, mutation = job
        pid = os.fork()
        if pid == 0:
            os.close(jobs)
            send_message(results, ("started", seed, os.getpid()))
            child_main(results, seed, scenario, mutation, root)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            problem = f"the seed's process died (wait status {status})"
            send_message(results, SimOutcome(seed, scenario or "?", mutation, problem=problem))


def run_seeds(jobs: Iterable[Job], *, workers: int, timeout: float = 300.0) -> Iterator[SimOutcome]:
    """Run `jobs` on `workers` worker processes; yields outcomes as they finish (any order)."""
    pending = iter(jobs)
    pool = [Worker() for _ in range(max(1, workers))]
    idle = list(pool)
    busy: dict[int, Worker] = {}
    try:
        while True:
            while idle:
                job = next(pending, None)
                if job is None:
                    break
                worker = idle.pop()
                worker.submit(job)
                busy[worker.results] = worker
            if not busy:
                return
            ready, _, _ = select.select(list(busy), [], [], 1.0)
            for fd in ready:
                worker = busy[fd]
                message = receive_message(fd)
                if isinstance(message, tuple) and message[0] == "started":
                    worker.child = message[2]
                    continue
                if message is None:
                    raise RuntimeError(f"simulation worker {worker.pid} ended unexpectedly")
                assert isinstance(message, SimOutcome), message
                del busy[fd]
                idle.append(worker)
                yield message
            now = time.monotonic()
            for worker in busy.values():
                if worker.child and now - worker.started > timeout:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(worker.child, signal.SIGKILL)
                    worker.child = 0
    finally:
        for worker in pool:
            worker.kill()


@dataclass
class MutationSearch:
    mutation: str
    caught: SimOutcome | None  # The lowest seed that caught it, if any did.
    seeds_run: int
    outcomes: list[SimOutcome]


def search_mutation(
    mutation: str, first: int, limit: int, *, scenario: str | None = None, workers: int
) -> MutationSearch:
    """Run seeds first.. with `mutation` until one catches it, at most `limit`: the checker
    finds a broken guarantee in its history. A seed failing otherwise (a bookie that refuses to
    start on a journal the mutation cut short behind its checkpoint) proves the checker nothing,
    and the search goes on."""
    caught: list[SimOutcome] = []
    outcomes: list[SimOutcome] = []

    def jobs() -> Iterator[Job]:
        for seed in range(first, first + limit):
            if caught:
                return
            yield seed, scenario, mutation

    for outcome in run_seeds(jobs(), workers=workers):
        outcomes.append(outcome)
        if outcome.failed and outcome.result.kinds():
            caught.append(outcome)
    lowest = min(caught, key=lambda o: o.seed) if caught else None
    return MutationSearch(mutation, lowest, len(outcomes), outcomes)
