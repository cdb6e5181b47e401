"""Simulated processes: which process a piece of code runs as, and what dies with it.

Every callback, task and timer of the simulation runs in a `contextvars.Context` (asyncio gives
each its own). `PROCESS` holds the `Incarnation` of the simulated process the code belongs to:
code started for a node runs in that node's context, and everything it schedules inherits it.
When the process crashes its incarnation is marked dead and `SimLoop` drops every callback that
still belongs to it: its tasks never run another step, its timers never fire, its thread work
never completes, exactly as if the process had been killed between two instructions.

An incarnation also owns the operating-system resources the real code opened while running as
it (file descriptors, LMDB environments). The kernel releases a dead process's descriptors and
locks; `Incarnation.release` does the same here, so that the restarted node can open (and lock)
its journal directory again. The tracking itself is installed by `guards.sealed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Final, Protocol, TypeVar

T = TypeVar("T")


class _Closable(Protocol):
    def close(self) -> None: ...


class Incarnation:
    """One life of a simulated process, from start to crash or stop."""

    def __init__(self, name: str, number: int) -> None:
        self.name = name
        self.number = number
        self.dead = False
        self.fds: set[int] = set()
        self.closables: list[_Closable] = []  # LMDB environments, opened by C code.
        self.tasks: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()  # SimLoop adds them.
        # Tasks that were running when it died: kept referenced so that the garbage collector
        # never closes their coroutines mid-simulation (that would run their `finally` blocks,
        # which a killed process never does). `SimLoop.bury` closes them at the very end.
        self.remains: list[asyncio.Task[Any]] = []

    def __repr__(self) -> str:
        state = "dead" if self.dead else "alive"
        return f"<{self.name}#{self.number} {state}>"

    def release(self) -> None:
        """The kernel's part of a process exit: close every descriptor it still had."""
        for closable in self.closables:
            with contextlib.suppress(Exception):
                closable.close()
        self.closables.clear()
        for fd in sorted(self.fds):
            _FD_OWNERS.pop(fd, None)
            with contextlib.suppress(OSError):
                _REAL_CLOSE(fd)
        self.fds.clear()


PROCESS: Final[contextvars.ContextVar[Incarnation | None]] = contextvars.ContextVar(
    "bkaio_sim_process", default=None
)

_REAL_CLOSE: Final = os.close
_FD_OWNERS: dict[int, Incarnation] = {}


def track_fd(fd: int) -> None:
    """A descriptor was opened by the code running now: it belongs to that process."""
    owner = PROCESS.get()
    if owner is not None:
        owner.fds.add(fd)
        _FD_OWNERS[fd] = owner


def untrack_fd(fd: int) -> None:
    owner = _FD_OWNERS.pop(fd, None)
    if owner is not None:
        owner.fds.discard(fd)


def track_closable(resource: _Closable) -> None:
    owner = PROCESS.get()
    if owner is not None:
        owner.closables.append(resource)


def current() -> Incarnation | None:
    return PROCESS.get()


def owner_of(context: contextvars.Context | None) -> Incarnation | None:
    """The process `context` runs as (None given: the running code's)."""
    return PROCESS.get() if context is None else context.get(PROCESS)


def outside() -> contextvars.Context:
    """A context that belongs to no simulated process (the nemesis, the metadata cluster)."""
    return contextvars.Context()


def is_dead(context: contextvars.Context) -> bool:
    """True when `context` belongs to a process that died."""
    owner = context.get(PROCESS)
    return owner is not None and owner.dead


class SimProcess:
    """A named process that can be started, crashed and started again.

    `spawn` runs a coroutine as this process (in a copy of its context); `call_soon` and
    `call_later` schedule a callback as it. `kill()` ends the current incarnation; `start()`
    begins a new one. What a subclass keeps across incarnations (a disk) is its own choice.
    """

    def __init__(self, name: str, loop: asyncio.AbstractEventLoop) -> None:
        self.name = name
        self.loop = loop
        self.incarnation: Incarnation | None = None
        self._context: contextvars.Context | None = None
        self._count = 0
        self.graveyard: list[Incarnation] = []

    @property
    def alive(self) -> bool:
        return self.incarnation is not None and not self.incarnation.dead

    def begin(self) -> Incarnation:
        """A new incarnation (the previous one must be dead or never started)."""
        assert not self.alive, f"{self.name} is already running"
        self._count += 1
        incarnation = Incarnation(self.name, self._count)
        context = contextvars.Context()
        context.run(PROCESS.set, incarnation)
        self.incarnation, self._context = incarnation, context
        return incarnation

    def context(self) -> contextvars.Context:
        assert self._context is not None, f"{self.name} was never started"
        return self._context.copy()

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        if not self.alive:
            coro.close()
            raise RuntimeError(f"{self.name} is not running")
        return self.loop.create_task(coro, name=f"{self.name}:{name}", context=self.context())

    def call_soon(self, callback: Callable[..., object], *args: object) -> asyncio.Handle:
        return self.loop.call_soon(callback, *args, context=self.context())

    def call_later(
        self, delay: float, callback: Callable[..., object], *args: object
    ) -> asyncio.TimerHandle:
        return self.loop.call_later(delay, callback, *args, context=self.context())

    def kill(self) -> Incarnation | None:
        """End the current incarnation at once: nothing of it runs again; its descriptors are
        closed. Returns it (None when it was not running)."""
        incarnation = self.incarnation
        if incarnation is None or incarnation.dead:
            return None
        incarnation.dead = True
        incarnation.remains = [task for task in incarnation.tasks if not task.done()]
        incarnation.release()
        self.graveyard.append(incarnation)
        return incarnation
