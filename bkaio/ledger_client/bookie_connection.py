"""`BookieConnection`: one pipelined connection to one bookie shard (the wire side of the client).

An `asyncio.Protocol`: requests are pipelined and matched to responses by request id; frames
produced during one loop iteration are encoded into one buffer and written with one `write` (a
`call_soon` flush). Here: the send paths (one request, prepacked adds, ADD_ENTRIES batches), the
answers (the ADD_ENTRY / ADD_ENTRIES OKs checked without building a response object), and flow
control (`when_writable`). Assembled from two mixins: `ConnectionLifecycle`
(connection_lifecycle.py: connecting, HELLO, failure and backoff, closing) and
`RequestsInFlight` (requests_in_flight.py: the waiters and their deadline records). The add
send and answer paths stay here, whole, with the code they touch per add inline.
`BookiePool` (pool.py) holds one per (bookie, shard).

Ledger L of a bookie with S shards lives on shard L % S, port = bookie port + shard.
Imports the codec (`bkaio.protocol`) and errors; never the metadata store.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from itertools import repeat
from types import MethodType
from typing import Any, TypeVar

from bkaio.backoff import Backoff
from bkaio.errors import BKError, ProtocolError, error_for_status
from bkaio.ledger_client.connection_lifecycle import BookieAddress, ConnectionLifecycle
from bkaio.ledger_client.errors import RequestRefusedError
from bkaio.ledger_client.requests_in_flight import _LAST_ID, ResponseCallback, Waiter
from bkaio.ledger_client.types import ClientConfig
from bkaio.protocol import (
    I64_MAX,
    AddEntriesResponse,
    AddEntryResponse,
    ErrorResponse,
    Flag,
    FrameDecoder,
    FrameEncoder,
    Op,
    Response,
    Status,
    decode_response,
)
from bkaio.supervision import loop_supervisor

_T = TypeVar("_T")

_ADD_FLAGS = int(Flag.NONE)
_RECOVERY_ADD_FLAGS = int(Flag.RECOVERY_ADD)
_OP_ADD_ENTRY = int(Op.ADD_ENTRY)
_ADD_ENTRY_FIELDS = 8  # ledger, entry, flags, master key, LAC, length, digest, payload.
_OP_ADD_ENTRIES = int(Op.ADD_ENTRIES)
_STATUS_OK = Status.OK
_STATUS_BAD_REQUEST = Status.BAD_REQUEST
_STATUS_OK_INT = int(Status.OK)
# For ints, `(a | b) >> _I64_BITS == 0` means 0 <= a <= I64_MAX and 0 <= b <= I64_MAX.
_I64_BITS = I64_MAX.bit_length()


def add_error(bookie_id: str, status: Status, ledger_id: int, entry_id: int) -> BKError:
    """The error of an add that `bookie_id` answered with `status` (not OK)."""
    message = f"bookie {bookie_id}: add of ledger {ledger_id} entry {entry_id} failed"
    if status is _STATUS_BAD_REQUEST:  # The add itself: the next bookie would refuse it too.
        return RequestRefusedError(
            f"{message} with BAD_REQUEST: it refuses the add itself (an entry above its "
            "server.max_entry_bytes, or a malformed request)"
        )
    return error_for_status(status, f"{message} with {status.name}")


class BookieConnection(ConnectionLifecycle):
    """One TCP connection to one bookie shard. Pipelined; responses come in any order."""

    def __init__(
        self,
        *,
        bookie_id: str,
        host: str,
        port: int,
        shard_index: int,
        config: ClientConfig,
        tls: ssl.SSLContext | None = None,
        resolve: Callable[[str], BookieAddress | None] | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self.bookie_id = bookie_id
        self._host = host
        self._port = port
        # Where the bookie is registered now, asked before each connect (`_relocate`): one
        # restarted under the same id at another host or port is reached there. None: the
        # address given is the only one.
        self._resolve = resolve
        self._shard_index = shard_index
        self._config = config
        self._tls = tls
        self._label = f"{bookie_id} shard {shard_index} ({host}:{port})"
        self._next_request_id = 1  # Request ids are drawn in order, several at once for a batch.
        self._waiters: dict[int, Waiter] = {}
        self._deadlines: dict[float, deque[list[Any]]] = {}  # timeout -> records in send order
        # The record that requests with `_batch_timeout` join until the next flush; None when
        # there is none (while not connected every request gets a record of its own).
        self._batch: list[Any] | None = None
        self._batch_timeout: float | None = None
        self._encoder = FrameEncoder(config.max_frame_bytes)
        self._decoder = FrameDecoder(config.max_frame_bytes)
        self._transport: asyncio.Transport | None = None
        self._connect_task: asyncio.Task[None] | None = None
        self._connected = False
        self._paused = False
        self._flush_scheduled = False
        self._tick: asyncio.TimerHandle | None = None
        self._retry_at = 0.0
        self._reconnect = Backoff(config.reconnect_backoff_min, config.reconnect_backoff_max)
        self._last_failure = ""  # Why the connection last failed (told while backing off).
        self._hello_request_id = 0
        self._closed = False
        # Adds go out as ADD_ENTRIES frames: the bookie said so in its HELLO answer. False
        # until then, and again once the connection is gone.
        self.batches_adds = False
        # The bookie takes READ_ENTRIES (range and stride reads): its HELLO answer said so.
        self.reads_entries = False
        # The HELLO answer came (features known); `wait_ready` callers wait for it.
        self._hello_answered = False
        self._ready_waiters: list[asyncio.Future[None]] = []
        # `when_writable` callbacks: run once the transport takes writes again (or the
        # connection is gone), so that a ledger held back by this slow bookie goes on.
        self._writable_waiters: list[Callable[[], None]] = []

    # ----------------------------------------------------------------- sending

    def send(
        self, op: Op, fields: tuple[Any, ...], callback: ResponseCallback, timeout: float
    ) -> None:
        """Queue one request; `callback` later gets the response or the error (never inline)."""
        self.send_body([op, 0, *fields], callback, timeout)

    def send_body(self, body: list[Any], callback: Waiter, timeout: float) -> None:
        """Queue one request given as its body with a placeholder request id at index 1.

        The hot path of `send` (one list per request, nothing else). For an ADD_ENTRY body,
        `callback` is an `AddCallback`: None once the bookie answered OK, else the error.
        """
        if not self._ready_to_send(callback):
            return
        request_id = self._next_request_id
        self._next_request_id = request_id + 1
        body[1] = request_id
        try:
            self._encoder.add(body)
        except BKError as error:  # An oversized frame: the bookie would refuse it anyway.
            self._loop.call_soon(callback, RequestRefusedError(str(error)))
            return
        self._queued(request_id, callback, timeout)

    def send_prepacked(
        self, op: int, field_count: int, packed: bytes, callback: Waiter, timeout: float
    ) -> None:
        """`send_body` for a request whose fields after the request id are already packed
        (`FrameEncoder.pack_fields`): an add goes to several bookies, packed once.

        The hot path of every add, so `_queued` is written out inline here.
        """
        # Connected and open: `_ready_to_send` would say yes without side effects.
        if (self._closed or not self._connected) and not self._ready_to_send(callback):
            return
        request_id = self._next_request_id
        self._next_request_id = request_id + 1
        try:
            self._encoder.add_prepacked(op, request_id, field_count, packed)
        except BKError as error:
            self._loop.call_soon(callback, RequestRefusedError(str(error)))
            return
        self._waiters[request_id] = callback
        if timeout == self._batch_timeout:
            self._batch[_LAST_ID] = request_id  # type: ignore[index]  # Set with the timeout.
        else:
            self._add_deadline(request_id, timeout)
        if not self._flush_scheduled and self._connected:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def send_add_to_entries(
        self,
        ledger_id: int,
        flags: int,
        master_key: bytes,
        packed_entry: bytes,
        callback: Waiter,
        timeout: float,
    ) -> None:
        """`send_prepacked` for an add to a bookie that takes ADD_ENTRIES (`batches_adds`,
        so connected and open): the add joins this loop iteration's frame of its ledger.

        `packed_entry` is `FrameEncoder.pack_fields([entry_id, lac, length, digest, payload])`.
        The add keeps a request id, a waiter and a deadline of its own, as with ADD_ENTRY.
        """
        request_id = self._next_request_id
        self._next_request_id = request_id + 1
        try:
            self._encoder.add_to_entries(request_id, ledger_id, flags, master_key, packed_entry)
        except BKError as error:
            self._loop.call_soon(callback, RequestRefusedError(str(error)))
            return
        self._queued(request_id, callback, timeout)

    def send_adds(
        self,
        ledger_id: int,
        flags: int,
        master_key: bytes,
        handler: Callable[[_T, BKError | None], None],
        adds: Sequence[_T],
        frames: Sequence[tuple[int, int, list[bytes], int]],
        timeout: float,
    ) -> None:
        """Send `adds` of one ledger as the ADD_ENTRIES `frames` (connected, `batches_adds`).

        Each frame is (first index, end index, packed entries, their bytes) over `adds`; each
        add gets a request id of its own, in order, and `handler(add, None | error)` answers
        it, as with `send_add_to_entries`. The per-add work (waiters, request ids) is done in
        C loops: this is the path of every append of a ledger whose write set is the whole
        ensemble.
        """
        count = len(adds)
        first = self._next_request_id
        self._next_request_id = first + count
        waiters = self._waiters
        callbacks = map(MethodType, repeat(handler), adds)
        waiters.update(zip(range(first, first + count), callbacks, strict=True))
        if timeout == self._batch_timeout:
            self._batch[_LAST_ID] = first + count - 1  # type: ignore[index]
        else:
            self._add_deadline(first, timeout)
            self._deadlines[timeout][-1][_LAST_ID] = first + count - 1  # The record just made.
        encoder = self._encoder
        room = encoder.entries_room(master_key)
        for start, end, packed_entries, entry_bytes in frames:
            if entry_bytes <= room:
                try:
                    encoder.add_entries_frame(
                        first + start, ledger_id, flags, master_key, packed_entries, entry_bytes
                    )
                except BKError as error:  # Not expected: the frame fits by its size.
                    self._fail_adds(range(first + start, first + end), error)
                continue
            # A frame above this client's max_frame_bytes: the entries one by one, which cuts
            # it into frames that fit, and refuses (only) an entry too large for any frame.
            for request_id, packed_entry in zip(
                range(first + start, first + end), packed_entries, strict=True
            ):
                try:
                    encoder.add_to_entries(request_id, ledger_id, flags, master_key, packed_entry)
                except BKError as error:
                    self._fail_adds(range(request_id, request_id + 1), error)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _fail_adds(self, request_ids: range, error: BKError) -> None:
        """Fail the queued adds `request_ids` soon: `error` refused their frame."""
        for request_id in request_ids:
            callback = self._waiters.pop(request_id, None)
            if callback is not None:
                self._loop.call_soon(callback, RequestRefusedError(str(error)))

    def _queued(self, request_id: int, callback: Waiter, timeout: float) -> None:
        self._waiters[request_id] = callback
        if timeout == self._batch_timeout:
            self._batch[_LAST_ID] = request_id  # type: ignore[index]  # Set with the timeout.
        else:
            self._add_deadline(request_id, timeout)
        if self._connected and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._batch is not None:
            self._close_batch()
        transport = self._transport
        if transport is None or not self._connected or self._paused or not len(self._encoder):
            return
        # One vectored write of the frames' buffers: joining them first would copy the batch.
        transport.writelines(self._encoder.take_parts())

    def flush_now(self) -> None:
        """Write what is queued now rather than at the scheduled flush (which then finds
        nothing): the end of `BookiePool.defer_send`'s batch."""
        if self._flush_scheduled:
            self._flush()

    def pause_writing(self) -> None:
        self._paused = True  # Frames wait in the encoder; adds are bounded per ledger handle.

    def resume_writing(self) -> None:
        self._paused = False
        self._flush()
        if not self._paused:
            self._wake_writable_waiters()

    def when_writable(self, callback: Callable[[], None]) -> bool:
        """False when the transport takes writes now; else True, and `callback()` runs once
        it does again or the connection fails (the bookie reads too slowly: its requests
        pile up here, and whoever sends them should wait, as with BookKeeper's channel
        writability)."""
        if not self._paused:
            return False
        self._writable_waiters.append(callback)
        return True

    def _wake_writable_waiters(self) -> None:
        waiters, self._writable_waiters = self._writable_waiters, []
        for callback in waiters:
            try:
                callback()
            except Exception as error:  # One ledger's failure must not keep the others waiting.
                loop_supervisor().report("writable_callback", error)

    # ----------------------------------------------------------------- answers

    def data_received(self, data: bytes) -> None:
        try:
            bodies = self._decoder.feed(data)
            waiters = self._waiters
            for body in bodies:
                # Most answers are ADD_ENTRY OKs (three per append): checked like the decoder
                # does, but without building a response object: five ints (no bools, no
                # floats), ledger and entry id in 0..I64_MAX; a request id found in `waiters`
                # is one this connection assigned, so it is in range. Any other body, an
                # unknown request id included, takes the decoder's path.
                if len(body) == 5:
                    op, request_id, status, ledger_id, entry_id = body
                    if (
                        status == _STATUS_OK_INT
                        and op == _OP_ADD_ENTRY
                        and type(op) is type(status) is type(request_id) is int
                        and type(ledger_id) is type(entry_id) is int
                        and not (ledger_id | entry_id) >> _I64_BITS
                        and (waiter := waiters.pop(request_id, None)) is not None
                    ):
                        waiter(None)
                        continue
                elif len(body) == 6:
                    # The OK answer to `count` adds of ADD_ENTRIES frames (request ids and
                    # entry ids consecutive from the given ones), checked the same way.
                    op, request_id, status, ledger_id, entry_id, count = body
                    if (
                        status == _STATUS_OK_INT
                        and op == _OP_ADD_ENTRIES
                        and type(op) is type(status) is type(request_id) is int
                        and type(ledger_id) is type(entry_id) is type(count) is int
                        and not (ledger_id | entry_id) >> _I64_BITS
                        and 0 < count <= len(waiters)
                        and request_id in waiters
                    ):
                        pop = waiters.pop
                        for answered_id in range(request_id, request_id + count):
                            waiter = pop(answered_id, None)
                            if waiter is not None:  # None: it timed out already.
                                waiter(None)
                        continue
                self._deliver(decode_response(body))
        except ProtocolError as error:
            self._abort(ProtocolError(f"{self._label}: {error}"))

    def _deliver(self, response: Response) -> None:
        if type(response) is AddEntriesResponse:
            self._deliver_adds(response)
            return
        waiter = self._waiters.pop(response.request_id, None)
        if waiter is None:
            return  # It timed out already.
        if type(response) is AddEntryResponse:
            if response.status is _STATUS_OK:
                waiter(None)
            else:
                waiter(
                    add_error(
                        self.bookie_id, response.status, response.ledger_id, response.entry_id
                    )
                )
        elif isinstance(response, ErrorResponse):
            waiter(ProtocolError(f"{self._label} could not decode a request: {response.message}"))
        else:
            waiter(response)

    def _deliver_adds(self, response: AddEntriesResponse) -> None:
        """One answer for several adds: each waiter gets None for OK, else the error."""
        waiters = self._waiters
        first = response.request_id
        end = first + response.count
        # A count beyond the waiters (from a broken bookie) must not make a long loop.
        answered = (
            range(first, end)
            if response.count <= len(waiters)
            else sorted(request_id for request_id in waiters if first <= request_id < end)
        )
        status = response.status
        for request_id in answered:
            waiter = waiters.pop(request_id, None)
            if waiter is None:
                continue  # It timed out already.
            if status is _STATUS_OK:
                waiter(None)
            else:
                entry_id = response.entry_id + request_id - first
                waiter(add_error(self.bookie_id, status, response.ledger_id, entry_id))
