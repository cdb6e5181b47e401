"""`ConnectionLifecycle`: how a `BookieConnection` connects, says HELLO, fails and closes.

The first frame on every connection is HELLO; the requests queued while connecting follow it
in the same write, and its answer says which features the bookie takes (`batches_adds`,
`reads_entries`; `wait_ready` waits for it). A refused HELLO, or one from another shard, aborts
the connection. A lost connection fails every request in flight with BookieUnavailableError
(a connection closed before answering HELLO is diagnosed first: often a TLS mismatch, told in
words naming the setting); the next request after a backoff (doubling up to a cap, reset by a
successful HELLO) reconnects, and during the backoff requests fail at once.

A mixin of `BookieConnection` (bookie_connection.py): the `asyncio.Protocol` callbacks of the
connection's life (`connection_made`, `connection_lost`), with the connection's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable
from functools import partial
from typing import Protocol, cast

import structlog

from bkaio.backoff import Backoff
from bkaio.errors import (
    BKError,
    BookieUnavailableError,
    ProtocolError,
    error_for_status,
)
from bkaio.ledger_client.requests_in_flight import RequestsInFlight, Waiter
from bkaio.ledger_client.tls_diagnosis import explain_connect_error, explain_refusal
from bkaio.ledger_client.types import ClientConfig
from bkaio.protocol import (
    PROTOCOL_VERSION,
    READ_ENTRIES_FEATURE,
    FrameDecoder,
    FrameEncoder,
    HelloResponse,
    Op,
    Response,
    Status,
)
from bkaio.supervision import spawn_job

log = structlog.get_logger(__name__)

# The transport's write buffer: past the high mark it pauses writing, and ledgers that write
# to this bookie hold new appends (`when_writable`) until it is under the low mark. Far above
# one loop iteration's batches (~100 KiB at 30k appends/s), so only a bookie that really
# falls behind holds anyone back, and briefly.
_WRITE_BUFFER_HIGH_BYTES = 4 * 1024 * 1024
_WRITE_BUFFER_LOW_BYTES = 2 * 1024 * 1024
# The HELLO feature of a bookie that takes ADD_ENTRIES frames and may answer with them.
ADD_ENTRIES_FEATURE = "add_entries"


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


class ConnectionLifecycle(RequestsInFlight, asyncio.Protocol):
    """Connecting, HELLO, failure and backoff, closing (a mixin of `BookieConnection`)."""

    # Set by `BookieConnection.__init__`.
    bookie_id: str
    _host: str
    _port: int
    _shard_index: int
    _config: ClientConfig
    _tls: ssl.SSLContext | None
    _resolve: Callable[[str], BookieAddress | None] | None
    _next_request_id: int
    _encoder: FrameEncoder
    _decoder: FrameDecoder
    _transport: asyncio.Transport | None
    _connect_task: asyncio.Task[None] | None
    _paused: bool
    _retry_at: float
    _reconnect: Backoff
    _last_failure: str
    _closed: bool
    batches_adds: bool
    reads_entries: bool
    _hello_answered: bool
    _ready_waiters: list[asyncio.Future[None]]
    _writable_waiters: list[Callable[[], None]]

    # ----------------------------------------------------------------- connecting

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

    def _start_connecting(self) -> None:
        self._relocate()
        self._decoder = FrameDecoder(self._config.max_frame_bytes)
        self._connect_task = spawn_job(
            f"connect-{self.bookie_id}-{self._shard_index}",
            self._connect,
            kind="bookie_connect",
            on_failure=self._connect_crashed,
        )

    def _relocate(self) -> None:
        """Connect where the registry says the bookie is now: a bookie restarted under the same
        id at another host or port (as BookKeeper's clients resolve a bookie id per connect).
        Not registered now (down, or only in old ledgers): the last address known."""
        address = None if self._resolve is None else self._resolve(self.bookie_id)
        if address is None:
            return
        host, port = address.host, address.port + self._shard_index
        if (host, port) != (self._host, self._port):
            log.info(
                "bookie_address_changed",
                bookie=self.bookie_id,
                shard=self._shard_index,
                old=f"{self._host}:{self._port}",
                new=f"{host}:{port}",
            )
            self._host = host
            self._port = port
            self._label = f"{self.bookie_id} shard {self._shard_index} ({host}:{port})"

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

    # ----------------------------------------------------------------- failing and closing

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

    # Provided by `BookieConnection`.
    def _wake_writable_waiters(self) -> None:
        raise NotImplementedError
