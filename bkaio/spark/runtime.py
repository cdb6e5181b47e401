"""One event loop per Python process, on its own thread, for the connector's synchronous hooks.

Spark calls `partitions()`, `read()`, `write()`, `commit()` synchronously, from planner,
executor and streaming-runner Python workers that live across tasks and queries (the reuse
is on by default). Each such process gets one loop, started on first use on a daemon thread,
and one `BookKeeper` client per metadata URI and client options, cached on that loop: bookie
connections are opened once per worker, not once per task. The cache keeps the `MAX_CLIENTS`
used last: a worker serving queries with ever new `bkaio.client.*` options (a token renewed
per job) would otherwise keep every client, its connections and background tasks, for ever.
An evicted client is closed once the last call using it is done. A thread (not
`loop.run_until_complete`) keeps this working where the caller already runs a loop (a notebook
driver, an async test) and lets the client's background tasks (bookie watch, LAC writes) run
between calls. Nothing here is pickled: only plain options travel between processes.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import inspect
import threading
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

import structlog

from bkaio.errors import BKError
from bkaio.ledger_client import BookKeeper
from bkaio.security.tokens import redact_uri
from bkaio.supervision import loop_supervisor, task_failures_counter

log = structlog.get_logger(__name__)

T = TypeVar("T")

_CLOSE_TIMEOUT_SECONDS = 5.0
_LOOP_TASK = "spark_loop"  # Its label in bkaio_task_failures_total when the thread dies.
# How often `run()` looks whether the loop's thread is still there while it waits. A call has no
# deadline of its own (a streaming read long-polls; the client's request timeouts bound each
# bookie request), so a dead loop is noticed by looking, not by a timeout.
_LIVENESS_CHECK_SECONDS = 1.0
# Clients (distinct metadata URI and client options) a worker keeps connected. A worker runs one
# task at a time, and a query uses one client: a few cover the queries a worker alternates
# between; beyond, the one used longest ago goes.
MAX_CLIENTS = 4

_ClientKey = tuple[str, tuple[tuple[str, Any], ...]]


class ClientLease:
    """One use of a cached client (`Runtime.lease`): hand it back with `Runtime.release`."""

    def __init__(self, key: _ClientKey, bk: BookKeeper) -> None:
        self.key = key
        self.bk = bk
        self.users = 0  # Leases out on this client (shared by every lease of it).
        self.evicted = False
        self.closed = False


class LoopStoppedError(BKError):
    """The connector's event loop thread of this Python worker is not running (it died of an
    uncaught BaseException, or the runtime was closed): nothing can run on it any more."""


class Runtime:
    """An event loop on a daemon thread, plus the `BookKeeper` clients opened on it."""

    def __init__(self) -> None:
        self._loop = _new_loop()
        # First thing on the loop: what reaches its exception handler (a callback that raised, a
        # future nobody awaited) is logged at ERROR and counted, as in a bookie or a client.
        self._loop.call_soon(_install_loop_exception_handler)
        self._died_of: BaseException | None = None
        self._thread = threading.Thread(target=self._run_loop, name="bkaio-spark-loop", daemon=True)
        self._thread.start()
        # Most recently used last. An evicted client still in use waits in `_evicted`.
        self._clients: OrderedDict[_ClientKey, ClientLease] = OrderedDict()
        self._evicted: list[ClientLease] = []
        self._lock: asyncio.Lock | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def _run_loop(self) -> None:
        try:
            self._loop.run_forever()
        except BaseException as error:  # A SystemExit from a callback: say so, `run()` raises.
            self._died_of = error
            task_failures_counter().labels(task=_LOOP_TASK).inc()
            log.error(
                "spark_loop_died",
                task=_LOOP_TASK,
                error=f"{type(error).__name__}: {error}",
                exc_info=error,
            )

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the loop and wait for its result (from any other thread).

        LoopStoppedError when the loop's thread is gone, before or while waiting: a call on a
        loop that no longer runs would otherwise wait for ever."""
        assert threading.current_thread() is not self._thread, "run() called on the loop thread"
        if not self._thread.is_alive():
            coroutine.close()  # Never started: nothing to clean up, no "never awaited" warning.
            raise self._stopped()
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        while not future.done():
            concurrent.futures.wait((future,), timeout=_LIVENESS_CHECK_SECONDS)
            if not future.done() and not self._thread.is_alive():
                future.cancel()
                if inspect.getcoroutinestate(coroutine) == inspect.CORO_CREATED:
                    coroutine.close()  # Queued behind what ended the loop: never started.
                raise self._stopped()
        return future.result()

    def _stopped(self) -> LoopStoppedError:
        error = LoopStoppedError(
            f"the bkaio connector's event loop thread ({self._thread.name}) is not running"
            + ("" if self._died_of is None else f": it died of {type(self._died_of).__name__}")
            + "; this Python worker cannot run bkaio calls any more"
        )
        error.__cause__ = self._died_of
        return error

    def iterate(self, generator: AsyncGenerator[T, None]) -> Iterator[T]:
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
            try:
                self.run(generator.aclose())
            except Exception as error:  # The read is over either way; its clean-up failed.
                log.warning(
                    "spark_read_close_failed",
                    error=f"{type(error).__name__}: {error}",
                    exc_info=True,
                )

    @contextlib.asynccontextmanager
    async def client(self, metadata_uri: str, options: dict[str, Any]) -> AsyncIterator[BookKeeper]:
        """The process's client for this cluster and options, for the `async with` block (on
        the loop): connected once, then reused while it stays among the `MAX_CLIENTS` used
        last."""
        lease = await self.lease(metadata_uri, options)
        try:
            yield lease.bk
        finally:
            await self.release(lease)

    async def lease(self, metadata_uri: str, options: dict[str, Any]) -> ClientLease:
        """`client` for a use that spans several `run()` calls (a sink task): `release` it."""
        key = (metadata_uri, tuple(sorted(options.items())))
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            entry = self._clients.get(key)
            if entry is None:
                entry = ClientLease(key, await BookKeeper.connect(metadata_uri, **options))
                self._clients[key] = entry
            else:
                self._clients.move_to_end(key)
            entry.users += 1
            evicted = []
            while len(self._clients) > MAX_CLIENTS:
                _, old = self._clients.popitem(last=False)
                old.evicted = True
                evicted.append(old)
                log.info("spark_client_evicted", metadata=redact_uri(old.key[0]), in_use=old.users)
        for old in evicted:
            if old.users > 0:
                self._evicted.append(old)  # Closed by its last release.
            else:
                await self._close_client(old)
        return entry

    async def release(self, lease: ClientLease) -> None:
        """A use of `lease` is over; an evicted client closes with its last use."""
        assert lease.users > 0, lease.key
        lease.users -= 1
        if lease.evicted and lease.users == 0:
            with contextlib.suppress(ValueError):
                self._evicted.remove(lease)
            await self._close_client(lease)

    async def _close_client(self, entry: ClientLease) -> None:
        if entry.closed:
            return
        entry.closed = True
        try:
            await entry.bk.close()
        except Exception as error:  # Logged; the process's other clients are unaffected.
            log.warning(
                "spark_client_close_failed",
                metadata=redact_uri(entry.key[0]),
                error=f"{type(error).__name__}: {error}",
                exc_info=True,
            )

    async def _close_clients(self) -> None:
        entries = [*self._clients.values(), *self._evicted]
        self._clients, self._evicted = OrderedDict(), []
        for entry in entries:  # Shutting down: each is closed, whatever the others do.
            await self._close_client(entry)

    def close(self) -> None:
        """Close every client and stop the loop (tests call this; worker processes just exit).

        Each step may fail or run out of time (the process is going away; a bookie may be gone):
        that is logged at WARNING and the next step runs."""
        if self._loop.is_closed():
            return
        if not self._thread.is_alive():  # Died (logged then): nothing can run on it.
            log.warning("spark_runtime_close_skipped", reason="the loop thread is not running")
            self._loop.close()
            return
        self._close_step("close clients", self._close_clients())
        self._close_step("cancel tasks", _cancel_others())
        self._close_step("close async generators", self._loop.shutdown_asyncgens())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_CLOSE_TIMEOUT_SECONDS)
        if self._thread.is_alive():
            log.warning(
                "spark_runtime_close_step_failed",
                step="stop the loop",
                error=f"the loop thread did not end within {_CLOSE_TIMEOUT_SECONDS} s",
            )
        else:
            self._loop.close()

    def _close_step(self, step: str, coroutine: Coroutine[Any, Any, None]) -> None:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            future.result(_CLOSE_TIMEOUT_SECONDS)
        except Exception as error:  # Including running out of time: logged, then the next step.
            future.cancel()
            log.warning(
                "spark_runtime_close_step_failed",
                step=step,
                error=f"{type(error).__name__}: {error}",
                exc_info=True,
            )


def _install_loop_exception_handler() -> None:
    loop_supervisor().install_loop_exception_handler()


async def _anext(generator: AsyncGenerator[T, None]) -> T:
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
