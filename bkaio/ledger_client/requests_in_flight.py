"""`RequestsInFlight`: a `BookieConnection`'s requests in flight and their deadlines.

Every request sent on a connection has a waiter (the callback that gets its answer) under its
request id, and a deadline. Deadlines are checked by one periodic timer per connection (no timer
per request); an expired request fails with BKTimeoutError and the connection stays up, except
for an unanswered HELLO, which aborts it. Requests with the same timeout sent in one loop
iteration share one deadline record (their ids are consecutive), stamped when the batch is
flushed: no clock read and no record per request, and no request expires before its own timeout.

A mixin of `BookieConnection` (bookie_connection.py): the connection's state, this module's
methods; the send path there opens and extends the records directly (`_LAST_ID`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from bkaio.errors import BKError, BKTimeoutError
from bkaio.protocol import Response

ResponseCallback = Callable[[Response | BKError], None]
# A waiter gets the response (or the error) itself, except an ADD_ENTRY's: its `AddCallback`
# gets None for OK or the error the status maps to (no wrapper closure per add and bookie).
Waiter = Callable[[Any], None]

# Deadline checks run this often while requests are in flight: a timeout fires at most this
# late. Requests with the same timeout expire in the order they were sent, so each timeout
# value has a deque of [deadline, first request id, last request id] records popped from the
# front: a tick costs the number of expired requests, not a pass over everything in flight.
_DEADLINE_TICK_SECONDS = 0.05
_DEADLINE, _FIRST_ID, _LAST_ID = 0, 1, 2  # The fields of one deadline record (a list).
# Added to every deadline so that no request expires before its timeout has passed on the
# precise monotonic clock: uvloop's loop.time() counts whole milliseconds of libuv's cached
# (possibly coarse, 1 ms) clock, so "now" can read up to about 2 ms behind time.monotonic().
_LOOP_CLOCK_SLACK_SECONDS = 0.002


class RequestsInFlight:
    """The waiters and deadline records of one connection (a mixin of `BookieConnection`)."""

    # Set by `BookieConnection.__init__`.
    _loop: asyncio.AbstractEventLoop
    _label: str
    _waiters: dict[int, Waiter]
    _deadlines: dict[float, deque[list[Any]]]
    _batch: list[Any] | None
    _batch_timeout: float | None
    _tick: asyncio.TimerHandle | None
    _connected: bool
    _hello_request_id: int

    def _add_deadline(self, request_id: int, timeout: float, *, batch: bool = True) -> None:
        """A deadline record for `request_id`; later requests with the same timeout join it
        until the next flush when `batch` and connected (the flush is then scheduled)."""
        self._close_batch()
        record = [self._loop.time() + timeout + _LOOP_CLOCK_SLACK_SECONDS, request_id, request_id]
        queue = self._deadlines.get(timeout)
        if queue is None:
            queue = self._deadlines[timeout] = deque()
        queue.append(record)
        if batch and self._connected:
            self._batch = record
            self._batch_timeout = timeout
        if self._tick is None:
            self._tick = self._loop.call_later(_DEADLINE_TICK_SECONDS, self._expire)

    def _close_batch(self) -> None:
        """Stop adding requests to the open deadline record, stamping it now + timeout: its
        requests were queued since the record opened, so none expires early."""
        record = self._batch
        if record is not None:
            timeout = cast(float, self._batch_timeout)
            record[_DEADLINE] = self._loop.time() + timeout + _LOOP_CLOCK_SLACK_SECONDS
            self._batch = None
            self._batch_timeout = None

    def _expire(self) -> None:
        self._tick = None
        self._close_batch()  # Its requests' deadlines are not before the stamp it gets now.
        waiters = self._waiters
        if not waiters:
            self._clear_deadlines()
            return
        now = self._loop.time()
        expired: list[int] = []
        contains = waiters.__contains__
        for timeout, queue in list(self._deadlines.items()):
            # Answered requests stay in their records until the deadline: skipped here.
            while queue and queue[0][_DEADLINE] <= now:
                _, first_id, last_id = queue.popleft()
                expired.extend(filter(contains, range(first_id, last_id + 1)))
            if not queue:
                del self._deadlines[timeout]
        expired.sort()
        for request_id in expired:
            callback = waiters.pop(request_id, None)
            if callback is None:
                continue  # Failed meanwhile by a callback of an earlier expiry.
            if request_id == self._hello_request_id:
                self._abort(BKTimeoutError(f"{self._label}: no HELLO reply"))
                break
            callback(BKTimeoutError(f"{self._label}: request {request_id} timed out"))
        if self._waiters:
            self._tick = self._loop.call_later(_DEADLINE_TICK_SECONDS, self._expire)
        else:
            self._clear_deadlines()

    def _clear_deadlines(self) -> None:
        self._deadlines.clear()
        self._batch = None
        self._batch_timeout = None

    # Provided by `ConnectionLifecycle` (connection_lifecycle.py).
    def _abort(self, error: BKError) -> None:
        raise NotImplementedError
