"""Threads without threads: the simulation's `Threads` (bkaio.journal.threads) and executors.

Production runs the journal's writes and syncs on a writer thread and the storage's flushes,
compactions and reads on executors. Here the very same functions run on the simulation's event
loop: a job waits a simulated delay (drawn from the node's disk model), then runs inline, as one
loop callback. So a job is atomic with respect to everything else in the simulation, a crash
included: a crash lands before a job or after it, never halfway, unless the job itself reaches
an armed crash point (`ProcessCrashed` then ends it where it stands).

`SimSerialWorker` runs its jobs one after the other, in order (the journal's writer thread);
`SimPool` runs up to `workers` at once, each after its own delay, so they may finish out of
order (the reader pool). Both complete `concurrent.futures.Future`s, which `run_in_executor`
and `wrap_future` turn into loop futures as with real threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from bkaio.journal.threads import SerialWorker

T = TypeVar("T")

Delay = Callable[[], float]
_Job = tuple[Callable[..., Any], tuple[Any, ...], "concurrent.futures.Future[Any] | None"]


class ProcessCrashed(BaseException):
    """Raised inside a simulated process's code when it crashes at a crash point: unwinds the
    job it was in. Its incarnation is dead already, so nothing waits for the outcome."""


def _run_job(loop: asyncio.AbstractEventLoop, name: str, job: _Job) -> None:
    function, args, future = job
    if future is not None and not future.set_running_or_notify_cancel():
        return  # Cancelled while it waited, as a thread pool skips it.
    try:
        result = function(*args)
    except ProcessCrashed:
        return
    except BaseException as error:
        if future is not None:
            future.set_exception(error)
            return
        loop.call_exception_handler(
            {"message": f"simulated thread {name}: posted job raised", "exception": error}
        )
        return
    if future is not None:
        future.set_result(result)


class SimSerialWorker:
    """A writer thread: posted and submitted jobs run one at a time, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str, delay: Delay) -> None:
        self._loop = loop
        self.name = name
        self._delay = delay
        self._queue: deque[_Job] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._stopped = False
        self.jobs = 0

    def post(self, function: Callable[..., object], *args: object) -> None:
        if self._stopped:
            raise RuntimeError(f"simulated thread {self.name} is shut down")
        self._queue.append((function, args, None))
        self._kick()

    def submit(self, function: Callable[..., T], *args: object) -> concurrent.futures.Future[T]:
        if self._stopped:
            raise RuntimeError(f"simulated thread {self.name} is shut down")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.append((function, args, future))
        self._kick()
        return future

    def shutdown(self, wait: bool = True) -> None:
        self._stopped = True
        if wait:  # What is queued runs now, as a joined thread would have finished it.
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            while self._queue:
                self._run_next()

    def _kick(self) -> None:
        if self._timer is None and self._queue:
            self._timer = self._loop.call_later(self._delay(), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._run_next()
        self._kick()

    def _run_next(self) -> None:
        self.jobs += 1
        _run_job(self._loop, self.name, self._queue.popleft())


class SimPool(concurrent.futures.Executor):
    """An executor of `workers` simulated threads: each job after its own delay."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, name: str, workers: int, delay: Delay
    ) -> None:
        assert workers >= 1, workers
        self._loop = loop
        self.name = name
        self._workers = workers
        self._delay = delay
        self._running: dict[asyncio.TimerHandle, _Job] = {}
        self._queue: deque[_Job] = deque()
        self._stopped = False
        self.jobs = 0

    def submit(
        self, fn: Callable[..., T], /, *args: object, **kwargs: object
    ) -> concurrent.futures.Future[T]:
        if self._stopped:
            raise RuntimeError(f"simulated pool {self.name} is shut down")
        assert not kwargs, "run_in_executor passes positional arguments only"
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.append((fn, args, future))
        self._start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._stopped = True
        if cancel_futures:
            for _fn, _args, future in self._queue:
                if future is not None:
                    future.cancel()
            self._queue.clear()
        if wait:
            for timer, job in list(self._running.items()):
                timer.cancel()
                del self._running[timer]
                self._run(job)
            while self._queue:
                self._run(self._queue.popleft())

    def _start(self) -> None:
        while self._queue and len(self._running) < self._workers:
            job = self._queue.popleft()
            holder: list[asyncio.TimerHandle] = []
            timer = self._loop.call_later(self._delay(), self._finish, holder)
            holder.append(timer)
            self._running[timer] = job

    def _finish(self, holder: list[asyncio.TimerHandle]) -> None:
        job = self._running.pop(holder[0])
        self._run(job)
        self._start()

    def _run(self, job: _Job) -> None:
        self.jobs += 1
        _run_job(self._loop, self.name, job)


class SimThreads:
    """The `Threads` of one simulated bookie: delays come from `latency(name)` (its disk)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, latency: Callable[[str], float]) -> None:
        self._loop = loop
        self._latency = latency

    def serial(self, name: str) -> SerialWorker:
        return SimSerialWorker(self._loop, name, lambda: self._latency(name))

    def pool(self, name: str, workers: int) -> concurrent.futures.Executor:
        return SimPool(self._loop, name, workers, lambda: self._latency(name))
