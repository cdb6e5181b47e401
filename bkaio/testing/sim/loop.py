"""A seeded, virtual-time asyncio event loop (deterministic simulation, reference/faults.md A4).

`SimLoop` is a stock `SelectorEventLoop` whose clock is virtual: when every task waits, the
selector does not block, it moves the clock straight to the next timer. No real I/O may happen
on it (the simulated network and metadata are in-memory); a run where nothing is scheduled and
nothing is ready is a deadlock and raises `SimDeadlockError`. Same seed, same code, same
PYTHONHASHSEED: the same schedule, to the callback.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class SimDeadlockError(RuntimeError):
    """Every task waits for something that no timer or callback will ever bring."""


class _VirtualSelector(selectors.BaseSelector):
    """Knows the loop's self-pipe (registered at start) and never waits: it advances time."""

    def __init__(self) -> None:
        self._keys: dict[int, selectors.SelectorKey] = {}
        self.clock = 0.0

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise SimDeadlockError("simulation deadlock: no timer and nothing ready")
        self.clock += max(0.0, timeout)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class SimLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual = _VirtualSelector()
        super().__init__(self._virtual)

    def time(self) -> float:
        return self._virtual.clock


def run_simulation(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on a fresh SimLoop; the loop is closed afterwards."""
    loop = SimLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        finally:
            loop.close()
