"""One event loop per Python process, on its own thread, for the connector's synchronous hooks.

Spark calls `partitions()`, `read()`, `write()`, `commit()` synchronously, from planner,
executor and streaming-runner Python workers that live across tasks and queries (the reuse
is on by default). Each such process gets one loop, started on first use on a daemon thread,
and one `BookKeeper` client per metadata URI and client options, cached on that loop: bookie
connections are opened once per worker, not once per task. A thread (not
`loop.run_until_complete`) keeps this working where the caller already runs a loop (a notebook
driver, an async test) and lets the client's background tasks (bookie watch, LAC writes) run
between calls. Nothing here is pickled: only plain options travel between processes.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

from bkaio.ledger_client import BookKeeper

T = TypeVar("T")

_CLOSE_TIMEOUT_SECONDS = 5.0


class Runtime:
    """An event loop on a daemon thread, plus the `BookKeeper` clients opened on it."""

    def __init__(self) -> None:
        self._loop = _new_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="bkaio-spark-loop", daemon=True
        )
        self._thread.start()
        self._clients: dict[tuple[str, tuple[tuple[str, Any], ...]], BookKeeper] = {}
        self._lock: asyncio.Lock | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the loop and wait for its result (from any other thread)."""
        assert threading.current_thread() is not self._thread, "run() called on the loop thread"
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def iterate(self, generator: AsyncIterator[T]) -> Iterator[T]:
        """Drive an async generator from synchronous code, one item per loop round trip.

        When the consumer stops early (a `limit()`), the generator is closed on the loop so
        its `finally` blocks run there.
        """
        try:
            while True:
                try:
                    yield self.run(_anext(generator))
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(generator, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    self.run(aclose())

    async def client(self, metadata_uri: str, options: dict[str, Any]) -> BookKeeper:
        """The process's client for this cluster (connected once, then reused). On the loop."""
        key = (metadata_uri, tuple(sorted(options.items())))
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = await BookKeeper.connect(metadata_uri, **options)
                self._clients[key] = client
            return client

    async def _close_clients(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            with contextlib.suppress(Exception):
                await client.close()

    def close(self) -> None:
        """Close every client and stop the loop (tests call this; worker processes just exit)."""
        if self._loop.is_closed():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close_clients(), self._loop).result(
                _CLOSE_TIMEOUT_SECONDS
            )
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_cancel_others(), self._loop).result(
                _CLOSE_TIMEOUT_SECONDS
            )
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._loop.shutdown_asyncgens(), self._loop).result(
                _CLOSE_TIMEOUT_SECONDS
            )
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_CLOSE_TIMEOUT_SECONDS)
        if not self._thread.is_alive():
            self._loop.close()


async def _anext(generator: AsyncIterator[T]) -> T:
    return await generator.__anext__()


async def _cancel_others() -> None:
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # uvloop is a dependency, but the connector works without it.
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def get_runtime() -> Runtime:
    """This process's runtime, started on first use."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = Runtime()
            atexit.register(shutdown)
        return _runtime


def shutdown() -> None:
    """Close this process's clients and loop (a later `get_runtime()` starts afresh)."""
    global _runtime
    with _runtime_lock:
        runtime, _runtime = _runtime, None
    if runtime is not None:
        runtime.close()
