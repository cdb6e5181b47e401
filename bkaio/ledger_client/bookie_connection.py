"""`BookieConnection`: one pipelined connection to one bookie shard (the wire side of the client).

An `asyncio.Protocol`: requests are pipelined and matched to responses by request id; frames
produced during one loop iteration are encoded into one buffer and written with one `write` (a
`call_soon` flush); the first frame on every connection is HELLO. A lost connection fails every
request in flight with BookieUnavailableError; the next request after a backoff (doubling up to
a cap, reset by a successful HELLO) reconnects. Each request has a deadline, checked by one
periodic timer per connection (no timer per request); an expired request fails with
BKTimeoutError and the connection stays up. Requests with the same timeout sent in one loop
iteration share one deadline record (their ids are consecutive), stamped when the batch is
flushed: no clock read and no record per request, and no request expires before its own timeout.
`BookiePool` (pool.py) holds one per (bookie, shard).

Ledger L of a bookie with S shards lives on shard L % S, port = bookie port + shard.
Imports the codec (`bkaio.protocol`) and errors; never the metadata store. A little over 600
lines: one class whose hot paths (send, deliver, expire) read best next to each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from itertools import repeat
from types import MethodType
from typing import Any, Protocol, TypeVar, cast

import structlog

from bkaio.backoff import Backoff
from bkaio.errors import (
    BKError,
    BKTimeoutError,
    BookieUnavailableError,
    ProtocolError,
    error_for_status,
)
from bkaio.ledger_client.tls_diagnosis import explain_connect_error, explain_refusal
from bkaio.ledger_client.types import ClientConfig
from bkaio.protocol import (
    I64_MAX,
    PROTOCOL_VERSION,
    READ_ENTRIES_FEATURE,
    AddEntriesResponse,
    AddEntryResponse,
    ErrorResponse,
    Flag,
    FrameDecoder,
    FrameEncoder,
    HelloResponse,
    Op,
    Response,
    Status,
    decode_response,
)
from bkaio.supervision import loop_supervisor, spawn_job

log = structlog.get_logger(__name__)

ResponseCallback = Callable[[Response | BKError], None]
# A waiter gets the response (or the error) itself, except an ADD_ENTRY's: its `AddCallback`
# gets None for OK or the error the status maps to (no wrapper closure per add and bookie).
Waiter = Callable[[Any], None]
_T = TypeVar("_T")

# Deadline checks run this often while requests are in flight: a timeout fires at most this
# late. Requests with the same timeout expire in the order they were sent, so each timeout
# value has a deque of [deadline, first request id, last request id] records popped from the
# front: a tick costs the number of expired requests, not a pass over everything in flight.
_DEADLINE_TICK_SECONDS = 0.05
# The transport's write buffer: past the high mark it pauses writing, and ledgers that write
# to this bookie hold new appends (`when_writable`) until it is under the low mark. Far above
# one loop iteration's batches (~100 KiB at 30k appends/s), so only a bookie that really
# falls behind holds anyone back, and briefly.
_WRITE_BUFFER_HIGH_BYTES = 4 * 1024 * 1024
_WRITE_BUFFER_LOW_BYTES = 2 * 1024 * 1024
_DEADLINE, _FIRST_ID, _LAST_ID = 0, 1, 2  # The fields of one deadline record (a list).
_ADD_FLAGS = int(Flag.NONE)
_RECOVERY_ADD_FLAGS = int(Flag.RECOVERY_ADD)
_OP_ADD_ENTRY = int(Op.ADD_ENTRY)
_ADD_ENTRY_FIELDS = 8  # ledger, entry, flags, master key, LAC, length, digest, payload.
_OP_ADD_ENTRIES = int(Op.ADD_ENTRIES)
# The HELLO feature of a bookie that takes ADD_ENTRIES frames and may answer with them.
ADD_ENTRIES_FEATURE = "add_entries"
_STATUS_OK = Status.OK
_STATUS_OK_INT = int(Status.OK)
# For ints, `(a | b) >> _I64_BITS == 0` means 0 <= a <= I64_MAX and 0 <= b <= I64_MAX.
_I64_BITS = I64_MAX.bit_length()


class BookieAddress(Protocol):
    """Where a bookie listens (bkaio.meta.BookieInfo satisfies it)."""

    @property
    def bookie_id(self) -> str: ...

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def shard_count(self) -> int: ...


class BookieConnection(asyncio.Protocol):
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
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self.bookie_id = bookie_id
        self._host = host
        self._port = port
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
            self._loop.call_soon(callback, error)
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
            self._loop.call_soon(callback, error)
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
            self._loop.call_soon(callback, error)
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
        """Fail the queued adds `request_ids` soon with `error` (their frame was refused)."""
        for request_id in request_ids:
            callback = self._waiters.pop(request_id, None)
            if callback is not None:
                self._loop.call_soon(callback, type(error)(str(error)))

    async def wait_ready(self) -> None:
        """Return once the bookie answered this connection's HELLO (so `reads_entries` and
        `batches_adds` say what it takes), connecting first if needed; BookieUnavailableError
        (or the HELLO's error) when that fails."""
        if self._hello_answered:
            return
        waiter: asyncio.Future[None] = self._loop.create_future()

        def failed(error: BKError) -> None:
            if not waiter.done():
                waiter.set_exception(error)

        if self._ready_to_send(failed):
            self._ready_waiters.append(waiter)
        await waiter

    def _wake_ready_waiters(self, error: BKError | None) -> None:
        waiters, self._ready_waiters = self._ready_waiters, []
        for waiter in waiters:
            if waiter.done():
                continue
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(type(error)(str(error)))

    def _ready_to_send(self, callback: Waiter) -> bool:
        """False (with `callback` failed soon) when no request can be queued now."""
        if self._closed:
            self._loop.call_soon(callback, BookieUnavailableError(f"{self._label}: client closed"))
            return False
        if self._transport is None and self._connect_task is None:
            now = self._loop.time()
            if now < self._retry_at:
                self._loop.call_soon(
                    callback,
                    BookieUnavailableError(
                        f"{self._label} is unreachable ({self._last_failure}); next attempt "
                        f"in {self._retry_at - now:.2f}s"
                    ),
                )
                return False
            self._start_connecting()
        return True

    def _queued(self, request_id: int, callback: Waiter, timeout: float) -> None:
        self._waiters[request_id] = callback
        if timeout == self._batch_timeout:
            self._batch[_LAST_ID] = request_id  # type: ignore[index]  # Set with the timeout.
        else:
            self._add_deadline(request_id, timeout)
        if self._connected and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _add_deadline(self, request_id: int, timeout: float, *, batch: bool = True) -> None:
        """A deadline record for `request_id`; later requests with the same timeout join it
        until the next flush when `batch` and connected (the flush is then scheduled)."""
        self._close_batch()
        record = [self._loop.time() + timeout, request_id, request_id]
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
            record[_DEADLINE] = self._loop.time() + cast(float, self._batch_timeout)
            self._batch = None
            self._batch_timeout = None

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

    # ----------------------------------------------------------------- connecting

    def _start_connecting(self) -> None:
        self._decoder = FrameDecoder(self._config.max_frame_bytes)
        self._connect_task = spawn_job(
            f"connect-{self.bookie_id}-{self._shard_index}",
            self._connect,
            kind="bookie_connect",
            on_failure=self._connect_crashed,
        )

    async def _connect(self) -> None:
        try:
            async with asyncio.timeout(self._config.connect_timeout):
                await self._loop.create_connection(
                    lambda: self,
                    self._host,
                    self._port,
                    ssl=self._tls,
                    server_hostname=self._host if self._tls is not None else None,
                )
        except (OSError, TimeoutError) as error:
            self._connect_task = None
            message = explain_connect_error(self._label, error, tls=self._tls is not None)
            self._connection_failed(BookieUnavailableError(message))
            return
        self._connect_task = None

    def _connect_crashed(self, error: BaseException) -> None:
        """`_connect` raised what no connection attempt should (a bug): this attempt fails."""
        self._connect_task = None
        self._connection_failed(
            BookieUnavailableError(f"cannot connect to {self._label}: {error!r}")
        )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; both have what we use.
        tcp_transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._closed:
            tcp_transport.abort()
            return
        self._transport = tcp_transport
        tcp_transport.set_write_buffer_limits(_WRITE_BUFFER_HIGH_BYTES, _WRITE_BUFFER_LOW_BYTES)
        self._connected = True
        # HELLO goes first; the requests queued while connecting follow it in the same write.
        queued = self._encoder.take()
        self._hello_request_id = self._next_request_id
        self._next_request_id += 1
        self._waiters[self._hello_request_id] = self._hello_done
        # A record of its own: the requests queued while connecting keep theirs.
        self._add_deadline(self._hello_request_id, self._config.connect_timeout, batch=False)
        self._encoder.add(
            [
                Op.HELLO,
                self._hello_request_id,
                PROTOCOL_VERSION,
                self._config.client_id,
                self._config.auth_token,
            ]
        )
        tcp_transport.write(self._encoder.take() + queued)

    def _hello_done(self, result: Response | BKError) -> None:
        if isinstance(result, BKError):
            return  # The connection is already failing every waiter.
        assert isinstance(result, HelloResponse)
        if result.status is not Status.OK:
            hint = (
                ": the bookie wants another auth token (auth_token= of BookKeeper.connect, "
                "BKAIO_AUTH_TOKEN for the command line)"
                if result.status is Status.UNAUTHORIZED
                else ""
            )
            self._abort(error_for_status(result.status, f"{self._label} refused HELLO{hint}"))
        elif result.shard_index != self._shard_index:
            self._abort(
                ProtocolError(
                    f"{self._label}: connected to shard {result.shard_index} of "
                    f"{result.bookie_id}, expected shard {self._shard_index}"
                )
            )
        else:
            self._reconnect.reset()
            self.batches_adds = ADD_ENTRIES_FEATURE in result.features and self._connected
            self.reads_entries = READ_ENTRIES_FEATURE in result.features and self._connected
            self._hello_answered = self._connected
            self._wake_ready_waiters(None)

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
                    error_for_status(
                        response.status,
                        f"bookie {self.bookie_id}: add of ledger {response.ledger_id} entry "
                        f"{response.entry_id} failed with {response.status.name}",
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
                waiter(
                    error_for_status(
                        status,
                        f"bookie {self.bookie_id}: add of ledger {response.ledger_id} entry "
                        f"{response.entry_id + request_id - first} failed with {status.name}",
                    )
                )

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._connected = False
        self._paused = False
        if self._hello_request_id in self._waiters and not self._closed:
            # Closed before answering HELLO: often a TLS mismatch, which is worth telling.
            # Requests sent meanwhile queue behind this job, as behind a connect.
            self._connect_task = spawn_job(
                f"diagnose-{self.bookie_id}-{self._shard_index}",
                partial(self._diagnose_refusal, exc),
                kind="connection_diagnosis",
                on_failure=lambda error: self._refusal_told(
                    f"bookie {self._label} closed the connection before answering HELLO"
                ),
            )
            return
        reason = f"lost connection to {self._label}" + (f": {exc!r}" if exc else "")
        self._connection_failed(BookieUnavailableError(reason))

    async def _diagnose_refusal(self, exc: Exception | None) -> None:
        message = await explain_refusal(
            self._label,
            self._host,
            self._port,
            exc,
            tls=self._tls is not None,
            timeout_seconds=self._config.connect_timeout,
        )
        self._refusal_told(message)

    def _refusal_told(self, message: str) -> None:
        self._connect_task = None
        if not self._closed:
            self._connection_failed(BookieUnavailableError(message))

    def _connection_failed(self, error: BKError) -> None:
        self._last_failure = str(error)
        self.batches_adds = False
        self.reads_entries = False
        self._hello_answered = False
        self._wake_ready_waiters(error)
        self._paused = False
        if self._writable_waiters:  # After the waiters below failed.
            self._loop.call_soon(self._wake_writable_waiters)
        self._retry_at = self._loop.time() + self._reconnect.next_delay()
        self._encoder.take()
        waiters, self._waiters = self._waiters, {}
        self._clear_deadlines()
        if waiters:
            log.info("bookie_connection_failed", bookie=self._label, error=str(error))
        for callback in waiters.values():
            callback(type(error)(str(error)))

    def _abort(self, error: BKError) -> None:
        transport = self._transport
        self._transport = None
        self._connected = False
        if transport is not None:
            transport.abort()
        self._connection_failed(error)

    # ----------------------------------------------------------------- deadlines

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

    async def close(self) -> None:
        """Close the connection; requests in flight fail with BookieUnavailableError."""
        self._closed = True
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        task = self._connect_task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._connect_task = None
        if self._transport is not None:
            self._transport.close()
            self._transport = None
            self._connected = False
        self._connection_failed(BookieUnavailableError(f"{self._label}: client closed"))
