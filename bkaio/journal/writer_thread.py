"""The journal's one writer thread, with a hand-off cheaper than `ThreadPoolExecutor.submit`.

Every group commit is handed from the event loop to the thread that writes and fdatasyncs it.
`ThreadPoolExecutor.submit` builds a `Future`, a work item and takes two locks for that, about
a tenth of a bookie's event-loop time per entry at low batch sizes. `post` puts one tuple on a
`SimpleQueue` (C, lock-free for the putter) instead; the group reports back to the loop itself
(`call_soon_threadsafe`), so nothing needs the future. `submit` stays for the rare calls that
want a result (open, close) and runs on the same thread, in order with the posted work.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

log = structlog.get_logger(__name__)

T = TypeVar("T")
_STOP = object()


class WriterThread:
    """One worker thread running posted calls in order.

    A daemon thread: a process that exits without closing its journal (a crash, as far as the
    journal knows) must not hang on it. Work still queued then was never acknowledged.
    """

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopped = False
        self._thread.start()

    def post(self, function: Callable[..., object], *args: object) -> None:
        """Run `function(*args)` on the thread, after everything posted before it.

        The function must report its own outcome: an exception it lets escape is only logged.
        """
        if self._stopped:
            raise RuntimeError("writer thread is shut down")
        self._queue.put((function, args, None))

    def submit(self, function: Callable[..., T], *args: object) -> concurrent.futures.Future[T]:
        """Like `post`, but with a future of the result (for calls outside the hot path)."""
        if self._stopped:
            raise RuntimeError("writer thread is shut down")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put((function, args, future))
        return future

    def shutdown(self, wait: bool = True) -> None:
        """Stop after the work already posted; with `wait`, until the thread has ended."""
        if not self._stopped:
            self._stopped = True
            self._queue.put(_STOP)
        if wait and threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        get = self._queue.get
        while True:
            item = get()
            if item is _STOP:
                return
            function, args, future = item
            if future is None:
                try:
                    function(*args)
                except BaseException:  # The posted function should have reported it.
                    log.exception("journal_writer_task_crashed", function=repr(function))
                continue
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = function(*args)
            except BaseException as error:
                future.set_exception(error)
            else:
                future.set_result(result)
